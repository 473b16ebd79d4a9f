//! Who is connected and what it may do: the toolkit's [`Component`]s (each connects under a role
//! of its own, `crate::roles`), the refusal of a statement for lack of a grant
//! ([`PermissionDenied`]), and the role a pool connects as. The errors of every module name
//! the component whose grants a refused statement needs, so this sits below them all.

use std::fmt;
use std::str::FromStr;

use sqlx::PgPool;

/// A part of the toolkit that connects to the database under its own role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Component {
    /// Owns the schema and its tables: `outbox migrate`, and the grants of the others.
    Migrator,
    /// Writes intents in the application's transaction: [`crate::PgOutbox`].
    Producer,
    /// Claims, publishes and settles outbox rows: `outbox relay`.
    Relay,
    /// Records deliveries in the inbox with their effect: [`crate::PgConsumer`].
    Consumer,
    /// Drives work items against the provider: `outbox effects run`.
    Executor,
    /// Retention: `outbox cleanup`.
    Maintainer,
    /// Read-only operator: `outbox status`, every `list` and `groups`, `trace`, `audit`, the
    /// console's reads (no payloads).
    Reader,
    /// Operator: the reader's reads, payloads of dead letters and conflicts, and the actions
    /// (requeue, discard, replay, resolve, reconcile), each with its audit record.
    Operator,
}

impl Component {
    /// Every component, in the order of the scripts.
    pub const ALL: [Component; 8] = [
        Self::Migrator,
        Self::Producer,
        Self::Relay,
        Self::Consumer,
        Self::Executor,
        Self::Maintainer,
        Self::Reader,
        Self::Operator,
    ];

    /// The name used in flags, messages and default role names (`relay`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Migrator => "migrator",
            Self::Producer => "producer",
            Self::Relay => "relay",
            Self::Consumer => "consumer",
            Self::Executor => "executor",
            Self::Maintainer => "maintainer",
            Self::Reader => "reader",
            Self::Operator => "operator",
        }
    }

    /// What the component runs, for the scripts' comments.
    pub fn purpose(self) -> &'static str {
        match self {
            Self::Migrator => {
                "owns the schema and its tables; runs `outbox migrate` and these grants"
            }
            Self::Producer => {
                "PgOutbox::enqueue, next_aggregate_version, request idempotency, plain-SQL producers"
            }
            Self::Relay => {
                "`outbox relay`: claim (skipping paused routes), publish, settle, LISTEN wake-ups, lease reaping, heartbeat"
            }
            Self::Consumer => {
                "PgConsumer / PgInbox: inbox, conflicts, ordering guard, consumer dead letters, work-item enqueue, pause check, heartbeat"
            }
            Self::Executor => "`outbox effects run`: claim, call, record work items",
            Self::Maintainer => {
                "`outbox cleanup`: inbox retention, settled work items, published rows (mark mode), expired relay leases"
            }
            Self::Reader => {
                "`outbox status`, `dead-letters list|groups`, `conflicts list`, `consumer-dead-letters list|groups`, `effects status|list`, `trace`, `audit`, the console's reads"
            }
            Self::Operator => {
                "the reader's reads plus payloads of dead letters and conflicts, `dead-letters requeue|discard`, `consumer-dead-letters requeue|discard`, `replay`, `pause|resume`, `conflicts resolve`, `effects resolve|reconcile`, each audited"
            }
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Component {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|c| c.as_str()).collect();
                format!("unknown component `{s}`: use one of {}", names.join(", "))
            })
    }
}

/// A statement refused for lack of a privilege (SQLSTATE 42501), with the role and the
/// component whose grants it needs when they are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionDenied {
    /// What the database said, e.g. `permission denied for table events`.
    pub detail: String,
    /// The refused role.
    pub role: Option<String>,
    /// The component whose grants the statement needs.
    pub component: Option<Component>,
}

impl fmt::Display for PermissionDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = match &self.role {
            Some(r) => format!("role `{r}`"),
            None => "the connected role".to_owned(),
        };
        match self.component {
            Some(Component::Migrator) => write!(
                f,
                "{} ({who} is not the migrator of this schema: run `outbox roles apply --bootstrap --migrator ROLE` as a superuser to hand the schema to the role that migrates)",
                self.detail
            ),
            Some(c) => write!(
                f,
                "{} ({who} needs the {c} grants: run `outbox roles apply` as the migrator)",
                self.detail
            ),
            None => write!(
                f,
                "{} ({who} needs the grants of its component: run `outbox roles apply` as the migrator; `outbox roles check --component NAME` lists what is missing)",
                self.detail
            ),
        }
    }
}

impl std::error::Error for PermissionDenied {}

impl PermissionDenied {
    /// `Some` when `e` is SQLSTATE 42501 (insufficient privilege): the database's message with
    /// the role (when known) and the component whose grants the statement needs. `None` for any
    /// other error.
    pub fn from_sqlx(
        e: &sqlx::Error,
        role: Option<&str>,
        component: Option<Component>,
    ) -> Option<Self> {
        let db = e.as_database_error()?;
        (db.code().as_deref() == Some("42501")).then(|| Self {
            detail: db.message().to_owned(),
            role: role.map(str::to_owned),
            component,
        })
    }
}

/// The role `pool` connects as, without a round trip (the URL's user).
pub fn pool_role(pool: &PgPool) -> String {
    pool.connect_options().get_username().to_owned()
}
