//! Least privilege: one database role per component, each with exactly the grants the SQL of
//! that component needs, and nothing on the tables it has no business with.
//!
//! | component | runs | may |
//! |---|---|---|
//! | [`Component::Migrator`] | `outbox migrate`, the grants below | owns the schema and every table in it |
//! | [`Component::Producer`] | [`crate::PgOutbox`] (and plain-SQL producers) | insert producer columns of `events`; versions; request idempotency |
//! | [`Component::Relay`] | `outbox relay`, [`crate::PgStore`] as the relay's store | read `events`, write its delivery columns, delete published rows; leases |
//! | [`Component::Consumer`] | [`crate::PgConsumer`], [`crate::PgInbox`], [`crate::PgEffects::enqueue`] | inbox tables, consumer dead letters, insert work items; read pauses; its heartbeat and effects per minute |
//! | [`Component::Executor`] | `outbox effects run`, [`crate::PgExecutor`] | read work items, write their execution columns |
//! | [`Component::Maintainer`] | `outbox cleanup` | delete old inbox identities, settled work items, old published rows (mark mode, raising the replay horizon in `retention_marks`), expired leases |
//! | [`Component::Reader`] | `outbox status`, `… list`, `trace`, `audit`, the console's reads | read everything the CLI shows; no payloads of events, conflicts or consumer dead letters |
//! | [`Component::Operator`] | `dead-letters requeue|discard`, `consumer-dead-letters requeue|discard`, `replay`, `pause|resume`, `conflicts resolve`, `effects resolve`, the console's actions | the reader's reads plus those changes, each with its `audit` row; the payloads and headers of dead letters and conflicts, to judge them |
//!
//! Every table and sequence the migrations create has one entry in `OBJECTS` below, with an
//! explicit decision for every component (an empty list is the decision "nothing"). A table a
//! later migration adds is one more entry; the integration test
//! `every_object_in_the_schema_has_a_grant_decision` fails until it exists.
//!
//! Two scripts come out of a [`RolePlan`]:
//!
//! * the **grants** ([`RolePlan::grant_script`], [`RolePlan::apply_grants`]), run by the
//!   migrator after every `outbox migrate`: each named role first loses every privilege in the
//!   schema, then gets exactly its components' grants, in one transaction. Re-running is
//!   harmless, and a release that narrows a grant takes it away.
//! * the **bootstrap** ([`RolePlan::bootstrap_script`], [`RolePlan::apply_bootstrap`]), run once
//!   by a superuser: missing roles are created `NOLOGIN`, the schema is created for (or handed
//!   to) the migrator together with every object already in it, and every role may `CONNECT`.
//!
//! A role that lacks a grant is told so ([`PermissionDenied`]), naming the role and the
//! component whose grants it needs; [`check_privileges`] lists exactly what is missing.

use std::collections::BTreeMap;
use std::fmt;

use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use crate::error::MigrateError;
use crate::migrate::{check_schema, current_version};
pub use crate::permission::{Component, PermissionDenied, pool_role};
use crate::schema::Schema;

// ---------------------------------------------------------------------------------------------
// The decisions

/// The columns a privilege covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cols {
    /// The whole table (table-level privilege).
    All,
    /// Only these columns (column-level privilege).
    Only(&'static [&'static str]),
}

/// One privilege on one table or sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Privilege {
    Select(Cols),
    Insert(Cols),
    Update(Cols),
    Delete,
    /// On a sequence: `nextval`.
    Usage,
}

use Cols::{All, Only};
use Privilege::{Delete, Insert, Select, Update, Usage};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Table,
    Sequence,
}

impl Kind {
    fn keyword(self) -> &'static str {
        match self {
            Self::Table => "TABLE",
            Self::Sequence => "SEQUENCE",
        }
    }
}

/// What every component may do on one object. Every field must be written: an empty list is
/// the decision "nothing". The operator's list is *in addition to* the reader's.
#[derive(Debug)]
struct Decision {
    name: &'static str,
    kind: Kind,
    producer: &'static [Privilege],
    relay: &'static [Privilege],
    consumer: &'static [Privilege],
    executor: &'static [Privilege],
    maintainer: &'static [Privilege],
    reader: &'static [Privilege],
    operator: &'static [Privilege],
}

const NONE: &[Privilege] = &[];

/// Every table and sequence of the schema (identity sequences need no grant: inserting into an
/// identity column does not check the sequence's privileges), one decision each.
const OBJECTS: &[Decision] = &[
    // Every component checks the schema version at startup (`check_schema`).
    Decision {
        name: "schema_migrations",
        kind: Kind::Table,
        producer: &[Select(All)],
        relay: &[Select(All)],
        consumer: &[Select(All)],
        executor: &[Select(All)],
        maintainer: &[Select(All)],
        reader: &[Select(All)],
        operator: NONE,
    },
    Decision {
        name: "events",
        kind: Kind::Table,
        // The producer columns only: no reading, no delivery state, no created_at.
        producer: &[Insert(Only(&[
            "event_id",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "event_type",
            "schema_version",
            "content_type",
            "payload",
            "headers",
            "destination",
            "partition_key",
        ]))],
        // The claim reads whole rows and locks them; settling writes the delivery columns and
        // deletes published rows. Never an insert, never a payload change.
        relay: &[
            Select(All),
            Update(Only(&[
                "state",
                "attempts",
                "available_at",
                "last_error",
                "published_at",
            ])),
            Delete,
        ],
        consumer: NONE,
        executor: NONE,
        // Mark mode's retention deletes published rows by ctid, reading only what picks them
        // (never a payload). DELETE is table-wide in PostgreSQL: the statement, not the grant,
        // keeps it to published rows.
        // `created_at` raises the replay horizon (`retention_marks`).
        maintainer: &[
            Select(Only(&["ctid", "state", "published_at", "created_at"])),
            Delete,
        ],
        // Everything but the payload and the headers.
        reader: &[Select(Only(&[
            "id",
            "event_id",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "event_type",
            "schema_version",
            "content_type",
            "payload_sha256",
            "destination",
            "partition_key",
            "created_at",
            "state",
            "attempts",
            "available_at",
            "last_error",
            "published_at",
        ]))],
        // dead-letters requeue; replay; discard (a delete of dead rows, copied whole into
        // discarded_events); the payload and headers of a dead letter, to judge it.
        operator: &[
            Select(Only(&["payload", "headers"])),
            Update(Only(&["state", "attempts", "available_at"])),
            Delete,
        ],
    },
    Decision {
        name: "lease_token_seq",
        kind: Kind::Sequence,
        producer: NONE,
        relay: &[Usage],
        consumer: NONE,
        executor: &[Usage],
        maintainer: NONE,
        reader: NONE,
        operator: NONE,
    },
    Decision {
        name: "leases",
        kind: Kind::Table,
        producer: NONE,
        relay: &[
            Select(All),
            Insert(Only(&[
                "aggregate_type",
                "aggregate_id",
                "token",
                "lease_until",
                "head_id",
                "owner",
            ])),
            Update(Only(&[
                "token",
                "lease_until",
                "head_id",
                "takeovers",
                "owner",
                "orphaned_at",
                "takeover_ms",
            ])),
            Delete,
        ],
        consumer: NONE,
        executor: NONE,
        // Reaping deletes by ctid.
        maintainer: &[Select(Only(&["ctid", "lease_until", "takeovers"])), Delete],
        reader: &[Select(All)],
        operator: NONE,
    },
    Decision {
        name: "lease_owner_seq",
        kind: Kind::Sequence,
        producer: NONE,
        relay: &[Usage],
        consumer: NONE,
        executor: NONE,
        maintainer: NONE,
        reader: NONE,
        operator: NONE,
    },
    Decision {
        name: "lease_owners",
        kind: Kind::Table,
        producer: NONE,
        // A relay's live session registers its owner, and sweeps the owners that are gone.
        relay: &[Select(All), Insert(Only(&["owner", "pid"])), Delete],
        consumer: NONE,
        executor: NONE,
        maintainer: NONE,
        reader: &[Select(All)],
        operator: NONE,
    },
    Decision {
        name: "aggregate_versions",
        kind: Kind::Table,
        producer: &[
            Select(All),
            Insert(Only(&["aggregate_type", "aggregate_id", "last_version"])),
            Update(Only(&["last_version"])),
        ],
        relay: NONE,
        consumer: NONE,
        executor: NONE,
        maintainer: NONE,
        reader: NONE,
        operator: NONE,
    },
    Decision {
        name: "idempotency_keys",
        kind: Kind::Table,
        producer: &[
            Select(Only(&["scope", "key", "request_sha256", "response"])),
            Insert(Only(&["scope", "key", "request_sha256"])),
            Update(Only(&["response", "completed_at"])),
        ],
        relay: NONE,
        consumer: NONE,
        executor: NONE,
        maintainer: NONE,
        reader: NONE,
        operator: NONE,
    },
    Decision {
        name: "inbox",
        kind: Kind::Table,
        producer: NONE,
        relay: NONE,
        consumer: &[
            Select(All),
            Insert(Only(&[
                "consumer_name",
                "event_id",
                "payload_sha256",
                "aggregate_type",
                "aggregate_id",
                "aggregate_version",
                "event_type",
            ])),
            Update(Only(&["outcome"])),
        ],
        executor: NONE,
        // Retention deletes by ctid and age; it never reads the identities.
        maintainer: &[Select(Only(&["ctid", "received_at"])), Delete],
        // Tracing an event to each consumer's record of it (ids and fingerprints, no payload).
        reader: &[Select(All)],
        operator: NONE,
    },
    Decision {
        name: "inbox_conflicts",
        kind: Kind::Table,
        producer: NONE,
        relay: NONE,
        consumer: &[
            Select(All),
            Insert(Only(&[
                "consumer_name",
                "event_id",
                "stored_sha256",
                "received_sha256",
                "aggregate_type",
                "aggregate_id",
                "aggregate_version",
                "event_type",
                "payload",
            ])),
            // A new occurrence reopens a resolved conflict (schema 11).
            Update(Only(&[
                "occurrences",
                "last_seen",
                "resolved_at",
                "resolved_audit_id",
            ])),
        ],
        executor: NONE,
        maintainer: NONE,
        // Everything but the conflicting payload.
        reader: &[Select(Only(&[
            "id",
            "consumer_name",
            "event_id",
            "stored_sha256",
            "received_sha256",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "event_type",
            "occurrences",
            "first_seen",
            "last_seen",
            "resolved_at",
            "resolved_audit_id",
        ]))],
        // The conflicting payload, to compare it with the first one; resolving a conflict.
        operator: &[
            Select(Only(&["payload"])),
            Update(Only(&["resolved_at", "resolved_audit_id"])),
        ],
    },
    Decision {
        name: "inbox_aggregates",
        kind: Kind::Table,
        producer: NONE,
        relay: NONE,
        consumer: &[
            Select(All),
            Insert(Only(&[
                "consumer_name",
                "aggregate_type",
                "aggregate_id",
                "last_version",
            ])),
            Update(Only(&["last_version"])),
        ],
        executor: NONE,
        maintainer: NONE,
        // Tracing an aggregate: each consumer's last applied version.
        reader: &[Select(All)],
        operator: NONE,
    },
    Decision {
        name: "consumer_dead_letters",
        kind: Kind::Table,
        producer: NONE,
        relay: NONE,
        consumer: &[
            Select(All),
            Insert(Only(&[
                "consumer_name",
                "event_id",
                "aggregate_type",
                "aggregate_id",
                "aggregate_version",
                "event_type",
                "content_type",
                "payload",
                "headers",
                "error",
                "attempts",
                "header_names",
                "header_values",
                "content_type_bytes",
                "broker_metadata",
            ])),
            Update(Only(&["state", "error", "attempts", "updated_at"])),
        ],
        executor: NONE,
        maintainer: NONE,
        // Everything but the payload and the headers.
        reader: &[Select(Only(&[
            "id",
            "consumer_name",
            "event_id",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "event_type",
            "content_type",
            "error",
            "attempts",
            "state",
            "created_at",
            "updated_at",
        ]))],
        // consumer-dead-letters requeue and discard (state 'resolved'); the payload and headers
        // of a dead letter, to judge it.
        operator: &[
            Select(Only(&["payload", "headers"])),
            Update(Only(&["state", "updated_at"])),
        ],
    },
    Decision {
        name: "work_items",
        kind: Kind::Table,
        producer: NONE,
        relay: NONE,
        // Enqueue in the inbox transaction, and the key lookup of a redelivery; never another
        // item's payload.
        consumer: &[
            Select(Only(&["id", "kind", "idempotency_key", "payload_sha256"])),
            Insert(Only(&[
                "kind",
                "idempotency_key",
                "payload",
                "event_id",
                "consumer_name",
            ])),
        ],
        // Claims read whole items (the provider needs the payload) and write the execution
        // columns; never the kind, key or payload, never an insert or delete.
        executor: &[
            Select(All),
            Update(Only(&[
                "state",
                "attempts",
                "lookups",
                "lease_token",
                "lease_until",
                "next_attempt_at",
                "unknown_since",
                "reference",
                "last_error",
                "updated_at",
                "resolved_at",
            ])),
        ],
        // The purge locks the rows it deletes (FOR UPDATE SKIP LOCKED), and PostgreSQL lets
        // only a role with UPDATE on some column lock a row: `updated_at` is that column.
        maintainer: &[
            Select(Only(&["id", "state", "resolved_at"])),
            Update(Only(&["updated_at"])),
            Delete,
        ],
        // `effects list` shows whole items.
        reader: &[Select(All)],
        // effects resolve
        operator: &[Update(Only(&[
            "state",
            "reference",
            "last_error",
            "lease_token",
            "lease_until",
            "next_attempt_at",
            "unknown_since",
            "resolved_at",
            "updated_at",
        ]))],
    },
    Decision {
        name: "audit",
        kind: Kind::Table,
        producer: NONE,
        relay: NONE,
        consumer: NONE,
        executor: NONE,
        maintainer: NONE,
        reader: &[Select(All)],
        // Each action's record, in its transaction. Never `at` or `db_role` (the database
        // writes them), never an update or a delete.
        operator: &[Insert(Only(&[
            "actor",
            "via",
            "credential",
            "action",
            "selection",
            "reason",
            "affected",
        ]))],
    },
    Decision {
        name: "discarded_events",
        kind: Kind::Table,
        producer: NONE,
        relay: NONE,
        consumer: NONE,
        executor: NONE,
        maintainer: NONE,
        // Everything but the payload and the headers, as for `events`.
        reader: &[Select(Only(&[
            "event_id",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "event_type",
            "schema_version",
            "content_type",
            "destination",
            "partition_key",
            "created_at",
            "attempts",
            "last_error",
            "discarded_at",
            "audit_id",
        ]))],
        // discard: the copy of each row, naming the discard's audit record (the statement that
        // writes both, in one transaction); never `discarded_at`, which the database writes.
        operator: &[Insert(Only(&[
            "event_id",
            "aggregate_type",
            "aggregate_id",
            "aggregate_version",
            "event_type",
            "schema_version",
            "content_type",
            "payload",
            "headers",
            "destination",
            "partition_key",
            "created_at",
            "attempts",
            "last_error",
            "audit_id",
        ]))],
    },
    // Heartbeats (`crate::heartbeat`): each running process upserts its own row; a relay also
    // its publishes per route, and it alone deletes old rows (a day; activity two hours).
    Decision {
        name: "instances",
        kind: Kind::Table,
        producer: NONE,
        relay: &[Select(All), Insert(All), Update(Only(BEAT_COLUMNS)), Delete],
        consumer: BEAT,
        executor: BEAT,
        maintainer: NONE,
        reader: &[Select(All)],
        operator: NONE,
    },
    Decision {
        name: "activity",
        kind: Kind::Table,
        producer: NONE,
        relay: &[Select(All), Insert(All), Update(Only(&["count"])), Delete],
        // Its effects per minute (`Heartbeat::with_consumer`), never a delete.
        consumer: &[Select(All), Insert(All), Update(Only(&["count"]))],
        executor: NONE,
        maintainer: NONE,
        reader: &[Select(All)],
        operator: NONE,
    },
    // Pauses (migration 10): the relay's claim reads the paused routes, a consumer asks
    // whether it is paused; `outbox pause` and `resume` write them with their audit record.
    Decision {
        name: "pauses",
        kind: Kind::Table,
        producer: NONE,
        relay: &[Select(All)],
        consumer: &[Select(All)],
        executor: NONE,
        maintainer: NONE,
        reader: &[Select(All)],
        operator: &[Insert(Only(&["kind", "name", "audit_id"])), Delete],
    },
    Decision {
        name: "retention_marks",
        kind: Kind::Table,
        producer: NONE,
        relay: NONE,
        consumer: NONE,
        executor: NONE,
        // Raised by the published-row purge in its own statement.
        maintainer: &[Select(All), Insert(All), Update(Only(&["through"]))],
        // The replay horizon, read by a replay and shown by the console.
        reader: &[Select(All)],
        operator: NONE,
    },
];

/// What a heartbeat changes in its own row.
const BEAT_COLUMNS: &[&str] = &["heartbeat_at", "stats", "stopped_at"];
/// A consumer's or an executor's heartbeat: its own row, nothing else.
const BEAT: &[Privilege] = &[Select(All), Insert(All), Update(Only(BEAT_COLUMNS))];

impl Decision {
    fn of(&self, component: Component) -> Vec<Privilege> {
        match component {
            Component::Migrator => Vec::new(),
            Component::Producer => self.producer.to_vec(),
            Component::Relay => self.relay.to_vec(),
            Component::Consumer => self.consumer.to_vec(),
            Component::Executor => self.executor.to_vec(),
            Component::Maintainer => self.maintainer.to_vec(),
            Component::Reader => self.reader.to_vec(),
            Component::Operator => [self.reader, self.operator].concat(),
        }
    }
}

/// The names of every table and sequence the grants cover (the schema's objects at
/// [`crate::migrate::current_version`], identity sequences excepted).
pub fn covered_objects() -> impl Iterator<Item = &'static str> {
    OBJECTS.iter().map(|o| o.name)
}

// ---------------------------------------------------------------------------------------------
// Merging privileges (a role may serve several components)

/// Columns of one privilege kind after merging: none, some (in first-seen order), or all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Merged {
    #[default]
    No,
    Some(Vec<&'static str>),
    Table,
}

impl Merged {
    fn add(&mut self, cols: Cols) {
        match (cols, &mut *self) {
            (_, Merged::Table) => {}
            (All, _) => *self = Merged::Table,
            (Only(c), Merged::No) => *self = Merged::Some(c.to_vec()),
            (Only(c), Merged::Some(have)) => {
                for col in c {
                    if !have.contains(col) {
                        have.push(col);
                    }
                }
            }
        }
    }

    /// `SELECT` or `SELECT (a, b)`.
    fn render(&self, keyword: &str) -> Option<String> {
        match self {
            Merged::No => None,
            Merged::Table => Some(keyword.to_owned()),
            Merged::Some(c) => Some(format!("{keyword} ({})", c.join(", "))),
        }
    }
}

/// Everything one role may do on one object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Access {
    select: Merged,
    insert: Merged,
    update: Merged,
    delete: bool,
    usage: bool,
}

impl Access {
    fn add(&mut self, p: Privilege) {
        match p {
            Select(c) => self.select.add(c),
            Insert(c) => self.insert.add(c),
            Update(c) => self.update.add(c),
            Delete => self.delete = true,
            Usage => self.usage = true,
        }
    }

    fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `SELECT, UPDATE (state), DELETE`.
    fn render(&self) -> String {
        [
            self.select.render("SELECT"),
            self.insert.render("INSERT"),
            self.update.render("UPDATE"),
            self.delete.then(|| "DELETE".to_owned()),
            self.usage.then(|| "USAGE".to_owned()),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// What `components` may do, per object, in `OBJECTS` order (objects with nothing left out).
fn access_of(components: &[Component]) -> Vec<(&'static Decision, Access)> {
    OBJECTS
        .iter()
        .filter_map(|o| {
            let mut access = Access::default();
            for c in components {
                for p in o.of(*c) {
                    access.add(p);
                }
            }
            (!access.is_empty()).then_some((o, access))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Role names and the plan

/// A validated role name. Letters, digits, `_`, `.`, `@` and `-` (so cloud IAM names such as
/// `relay@project.iam` fit), 1 to 63 bytes; never `public`, `none` or a `pg_` name. Always
/// written quoted, so case is kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoleName(String);

impl RoleName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`RolesError::InvalidRole`] naming the rule it breaks.
    pub fn new(name: &str) -> Result<Self, RolesError> {
        let bad = |reason: &str| {
            Err(RolesError::InvalidRole {
                name: name.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if name.is_empty() || name.len() > 63 {
            return bad("use 1 to 63 bytes");
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-'))
        {
            return bad("use ASCII letters, digits, `_`, `.`, `@` and `-` only");
        }
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("pg_") {
            return bad("`pg_` names are reserved by PostgreSQL");
        }
        if matches!(
            lower.as_str(),
            "public" | "none" | "current_user" | "current_role" | "session_user"
        ) {
            return bad("this name means something else to GRANT");
        }
        Ok(Self(name.to_owned()))
    }

    /// `<schema>_<component>`, the default name of a component's role.
    ///
    /// # Errors
    /// [`RolesError::InvalidRole`] when the result is longer than 63 bytes.
    pub fn default_for(schema: &Schema, component: Component) -> Result<Self, RolesError> {
        Self::new(&format!("{schema}_{component}"))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `"name"`.
    fn quoted(&self) -> String {
        crate::schema::quote_ident(&self.0)
    }
}

impl fmt::Display for RoleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which role serves which component in one schema; renders and applies the scripts.
///
/// ```
/// use outbox_postgres::roles::{Component, RoleName, RolePlan};
/// use outbox_postgres::Schema;
///
/// let plan = RolePlan::new(Schema::new("outbox").unwrap())
///     .with_role(Component::Relay, RoleName::new("relay_svc").unwrap());
/// assert!(plan.grant_script().contains(
///     "GRANT USAGE ON SEQUENCE \"outbox\".\"lease_token_seq\" TO \"relay_svc\";"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolePlan {
    schema: Schema,
    roles: BTreeMap<Component, RoleName>,
}

impl RolePlan {
    /// A plan for `schema` with no roles yet.
    pub fn new(schema: Schema) -> Self {
        Self {
            schema,
            roles: BTreeMap::new(),
        }
    }

    /// Every component with its default role name `<schema>_<component>`.
    ///
    /// # Errors
    /// [`RolesError::InvalidRole`] when the schema name is too long for the defaults (name
    /// the roles with [`RolePlan::with_role`]).
    pub fn with_defaults(schema: Schema) -> Result<Self, RolesError> {
        let mut plan = Self::new(schema);
        for c in Component::ALL {
            let name = RoleName::default_for(&plan.schema, c)?;
            plan.roles.insert(c, name);
        }
        Ok(plan)
    }

    /// Sets the role of `component` (replacing one set before).
    #[must_use]
    pub fn with_role(mut self, component: Component, role: RoleName) -> Self {
        self.roles.insert(component, role);
        self
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The role of `component`, if the plan has one.
    pub fn role(&self, component: Component) -> Option<&RoleName> {
        self.roles.get(&component)
    }

    /// Each role that gets grants, with the components it serves (the migrator excepted: it
    /// owns the objects and gets none).
    /// In component order.
    fn grantees(&self) -> Vec<(&RoleName, Vec<Component>)> {
        let mut by_role: Vec<(&RoleName, Vec<Component>)> = Vec::new();
        for (c, r) in &self.roles {
            if *c == Component::Migrator {
                continue;
            }
            match by_role.iter_mut().find(|(have, _)| *have == r) {
                Some((_, components)) => components.push(*c),
                None => by_role.push((r, vec![*c])),
            }
        }
        by_role
    }

    /// Refuses a role that is both the migrator and a component: the owner has every privilege
    /// on its objects, so the component could not be limited.
    fn validate_grants(&self) -> Result<(), RolesError> {
        if let Some(m) = self.roles.get(&Component::Migrator)
            && let Some((c, _)) = self
                .roles
                .iter()
                .find(|(c, r)| **c != Component::Migrator && *r == m)
        {
            return Err(RolesError::OwnerAsComponent {
                role: m.to_string(),
                component: *c,
            });
        }
        Ok(())
    }

    /// The grant statements, in order, without transaction control.
    pub fn grant_statements(&self) -> Vec<String> {
        let s = self.schema.quoted();
        let grantees = self.grantees();
        if grantees.is_empty() {
            return Vec::new();
        }
        let all: Vec<String> = grantees.iter().map(|(r, _)| r.quoted()).collect();
        let all = all.join(", ");
        let mut out = vec![
            format!(
                "SELECT pg_advisory_xact_lock(hashtextextended('outbox.migrate.{}', 0))",
                self.schema
            ),
            format!("REVOKE ALL ON SCHEMA {s} FROM {all}"),
            format!("REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {all}"),
            format!("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {all}"),
        ];
        for (role, components) in grantees {
            let r = role.quoted();
            out.push(format!("GRANT USAGE ON SCHEMA {s} TO {r}"));
            for (o, access) in access_of(&components) {
                out.push(format!(
                    "GRANT {} ON {} {s}.\"{}\" TO {r}",
                    access.render(),
                    o.kind.keyword(),
                    o.name
                ));
            }
        }
        out
    }

    /// The grants as a script for `psql`: one transaction, with comments.
    pub fn grant_script(&self) -> String {
        let mut text = format!(
            "-- Least-privilege grants on schema \"{}\" (schema version {}).\n\
             -- Run as the migrator after every `outbox migrate`. Idempotent: each role below\n\
             -- first loses every privilege in the schema, then gets exactly these.\n\
             BEGIN;\n",
            self.schema,
            current_version()
        );
        let statements = self.grant_statements();
        let grantees = self.grantees();
        let mut roles = grantees.iter().peekable();
        for st in statements {
            // A comment before the first statement of each role.
            if let Some((role, components)) = roles.peek()
                && st.starts_with("GRANT USAGE ON SCHEMA")
                && st.ends_with(&format!(" TO {}", role.quoted()))
            {
                text.push('\n');
                for c in components.iter() {
                    text.push_str(&format!("-- {c} ({role}): {}\n", c.purpose()));
                }
                roles.next();
            }
            text.push_str(&st);
            text.push_str(";\n");
        }
        text.push_str("COMMIT;\n");
        text
    }

    /// The bootstrap statements, in order, without transaction control.
    ///
    /// # Errors
    /// [`RolesError::NoMigrator`] when the plan has no migrator role.
    pub fn bootstrap_statements(&self) -> Result<Vec<String>, RolesError> {
        let migrator = self
            .roles
            .get(&Component::Migrator)
            .ok_or(RolesError::NoMigrator)?;
        self.validate_grants()?;
        let s = self.schema.quoted();
        let schema_literal = format!("'{}'", self.schema);
        let m = migrator.quoted();
        let mut roles: Vec<&RoleName> = Vec::new();
        for r in self.roles.values() {
            if !roles.contains(&r) {
                roles.push(r);
            }
        }
        let mut out = Vec::new();
        for r in &roles {
            out.push(format!(
                "DO $outbox$ BEGIN\n\
                 \x20 IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{r}') THEN\n\
                 \x20   CREATE ROLE {} NOLOGIN;\n\
                 \x20 END IF;\n\
                 END $outbox$",
                r.quoted()
            ));
        }
        out.push(format!("CREATE SCHEMA IF NOT EXISTS {s} AUTHORIZATION {m}"));
        out.push(format!("ALTER SCHEMA {s} OWNER TO {m}"));
        out.push(format!(
            "DO $outbox$ DECLARE o record; BEGIN\n\
             \x20 FOR o IN SELECT c.relname, c.relkind FROM pg_catalog.pg_class c\n\
             \x20     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace\n\
             \x20     WHERE n.nspname = {schema_literal} AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')\n\
             \x20       AND c.relowner <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = '{migrator}')\n\
             \x20       AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_class'::regclass\n\
             \x20                       AND d.objid = c.oid AND d.deptype IN ('a', 'i'))\n\
             \x20 LOOP\n\
             \x20   EXECUTE format('ALTER %s %I.%I OWNER TO %I',\n\
             \x20     CASE o.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'\n\
             \x20       WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END, {schema_literal}, o.relname, '{migrator}');\n\
             \x20 END LOOP;\n\
             END $outbox$"
        ));
        let list: Vec<String> = roles.iter().map(|r| r.quoted()).collect();
        out.push(format!(
            "DO $outbox$ BEGIN\n\
             \x20 EXECUTE format('GRANT CONNECT ON DATABASE %I TO {}', current_database());\n\
             END $outbox$",
            list.join(", ")
        ));
        Ok(out)
    }

    /// The bootstrap as a script for `psql`: one transaction, with comments.
    ///
    /// # Errors
    /// [`RolesError::NoMigrator`] when the plan has no migrator role.
    pub fn bootstrap_script(&self) -> Result<String, RolesError> {
        let mut text = format!(
            "-- One-time set-up of schema \"{}\", run as a superuser: missing roles are created\n\
             -- NOLOGIN (make your login roles members), the schema and every object in it belong\n\
             -- to the migrator, every role may connect. Idempotent.\n\
             BEGIN;\n",
            self.schema
        );
        for st in self.bootstrap_statements()? {
            if st.starts_with("CREATE SCHEMA") {
                text.push_str(
                    "-- The schema belongs to the migrator: it alone creates and changes tables.\n",
                );
            } else if st.starts_with("DO $outbox$ DECLARE") {
                text.push_str(
                    "-- Objects created by another role (an install migrated as a superuser) move to\n\
                     -- the migrator; identity and serial sequences follow their tables.\n",
                );
            }
            text.push_str(&st);
            text.push_str(";\n");
        }
        text.push_str("COMMIT;\n");
        Ok(text)
    }

    /// Applies the grants in one transaction, under the migration lock. Run it as the
    /// migrator (the owner of the schema's objects) after every `outbox migrate`.
    ///
    /// # Transactions, locks
    /// One transaction holding the advisory lock `outbox migrate` takes, so grants never
    /// interleave with a migration. Each named role first loses every privilege in the schema,
    /// then gets exactly its components' grants; before the commit, every grant is verified.
    ///
    /// # Errors
    /// * [`RolesError::Schema`]: the schema is not at this release's version (migrate first).
    /// * [`RolesError::UnknownRoles`]: a named role does not exist (create it, or run the
    ///   bootstrap).
    /// * [`RolesError::NotOwner`]: the connected role does not own every object (run as the
    ///   migrator, or bootstrap as a superuser to hand the objects to the migrator).
    /// * [`RolesError::OwnerAsComponent`]: a component's role owns objects in the schema or is
    ///   a superuser, so no grant could limit it.
    /// * [`RolesError::Missing`]: a grant did not take (nothing is committed then).
    /// * [`RolesError::Database`].
    pub async fn apply_grants(&self, pool: &PgPool) -> Result<ApplyReport, RolesError> {
        self.validate_grants()?;
        check_schema(pool, &self.schema).await?;
        let grantees = self.grantees();
        let mut tx = pool.begin().await?;
        let names: Vec<String> = grantees.iter().map(|(r, _)| r.to_string()).collect();
        self.refuse_unknown(&mut tx, &names).await?;
        // GRANT by anyone but the owner is only a warning ("no privileges were granted").
        refuse_not_owner(&mut tx, &self.schema).await?;
        for (role, components) in &grantees {
            let owns_or_super: bool = sqlx::query_scalar(
                "SELECT r.rolsuper OR EXISTS (SELECT FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $2 AND pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE')) \
                 OR EXISTS (SELECT FROM pg_catalog.pg_namespace n WHERE n.nspname = $2 \
                 AND pg_catalog.pg_has_role(r.oid, n.nspowner, 'USAGE')) \
                 FROM pg_catalog.pg_roles r WHERE r.rolname = $1",
            )
            .bind(role.as_str())
            .bind(self.schema.as_str())
            .fetch_one(&mut *tx)
            .await?;
            if owns_or_super {
                return Err(RolesError::OwnerAsComponent {
                    role: role.to_string(),
                    component: components[0],
                });
            }
        }
        let statements = self.grant_statements();
        for st in &statements {
            sqlx::raw_sql(AssertSqlSafe(st.clone()))
                .execute(&mut *tx)
                .await?;
        }
        for (role, components) in &grantees {
            for c in components {
                let missing = missing_privileges(&mut tx, &self.schema, role.as_str(), *c).await?;
                if !missing.is_empty() {
                    return Err(RolesError::Missing {
                        role: role.to_string(),
                        component: *c,
                        missing,
                    });
                }
            }
        }
        tx.commit().await?;
        Ok(ApplyReport {
            roles: grantees
                .into_iter()
                .map(|(r, c)| (r.to_string(), c))
                .collect(),
            statements: statements.len(),
        })
    }

    /// Runs the bootstrap in one transaction. Run it once, as a superuser (or a role with
    /// CREATEROLE that may act as the migrator and create schemas).
    ///
    /// # Errors
    /// * [`RolesError::NoMigrator`], [`RolesError::OwnerAsComponent`]: the plan is incomplete
    ///   or names the migrator for a component.
    /// * [`RolesError::BootstrapDenied`]: the connected role may not create roles or schemas.
    /// * [`RolesError::Database`].
    pub async fn apply_bootstrap(&self, pool: &PgPool) -> Result<BootstrapReport, RolesError> {
        let statements = self.bootstrap_statements()?;
        let mut tx = pool.begin().await?;
        let names: Vec<String> = self.roles.values().map(|r| r.to_string()).collect();
        let existing: Vec<String> = sqlx::query_scalar(
            "SELECT rolname::text FROM pg_catalog.pg_roles WHERE rolname = ANY($1)",
        )
        .bind(&names)
        .fetch_all(&mut *tx)
        .await?;
        let mut created: Vec<String> = names
            .into_iter()
            .filter(|n| !existing.contains(n))
            .collect();
        created.sort();
        created.dedup();
        for st in statements {
            if let Err(e) = sqlx::raw_sql(AssertSqlSafe(st)).execute(&mut *tx).await {
                return Err(match PermissionDenied::from_sqlx(&e, None, None) {
                    Some(p) => RolesError::BootstrapDenied {
                        role: pool_role(pool),
                        detail: p.detail,
                    },
                    None => RolesError::Database(e),
                });
            }
        }
        tx.commit().await?;
        Ok(BootstrapReport { created })
    }

    async fn refuse_unknown(
        &self,
        conn: &mut PgConnection,
        names: &[String],
    ) -> Result<(), RolesError> {
        let existing: Vec<String> = sqlx::query_scalar(
            "SELECT rolname::text FROM pg_catalog.pg_roles WHERE rolname = ANY($1)",
        )
        .bind(names)
        .fetch_all(conn)
        .await?;
        let unknown: Vec<(Component, String)> = self
            .roles
            .iter()
            .filter(|(c, r)| **c != Component::Migrator && !existing.contains(&r.0))
            .map(|(c, r)| (*c, r.to_string()))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(RolesError::UnknownRoles { roles: unknown })
        }
    }
}

/// What [`RolePlan::apply_grants`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    /// Each role that got grants, with its components.
    pub roles: Vec<(String, Vec<Component>)>,
    /// Statements run.
    pub statements: usize,
}

/// What [`RolePlan::apply_bootstrap`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapReport {
    /// Roles that did not exist and were created `NOLOGIN`.
    pub created: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// Checking and reporting

/// Lists what `role` lacks of `component`'s grants in `schema`, each as the GRANT fragment that
/// would add it (`UPDATE (state) ON TABLE "outbox"."events"`).
async fn missing_privileges(
    conn: &mut PgConnection,
    schema: &Schema,
    role: &str,
    component: Component,
) -> Result<Vec<String>, sqlx::Error> {
    if component == Component::Migrator {
        return Ok(Vec::new());
    }
    let s = schema.quoted();
    // Objects by OID: resolving a name would itself need USAGE on the schema.
    let oids: Vec<(String, i64)> = sqlx::query_as(
        "SELECT c.relname::text, c.oid::int8 FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = ANY($2)",
    )
    .bind(schema.as_str())
    .bind(covered_objects().collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    // (description, check, column); a column-level privilege is checked column by column and
    // reported with the missing columns only.
    let mut checks: Vec<(String, String, Option<&'static str>)> = vec![(
        format!("USAGE ON SCHEMA {s}"),
        format!("has_schema_privilege($1, '{}', 'USAGE')", schema.as_str()),
        None,
    )];
    for (o, access) in access_of(&[component]) {
        let on = format!("ON {} {s}.\"{}\"", o.kind.keyword(), o.name);
        let Some((_, oid)) = oids.iter().find(|(name, _)| name == o.name) else {
            return Err(sqlx::Error::Protocol(format!(
                "{} {s}.{} does not exist: run `outbox migrate`",
                o.kind.keyword().to_lowercase(),
                o.name
            )));
        };
        let object = format!("{oid}::oid");
        for (keyword, merged) in [
            ("SELECT", &access.select),
            ("INSERT", &access.insert),
            ("UPDATE", &access.update),
        ] {
            match merged {
                Merged::No => {}
                Merged::Table => checks.push((
                    format!("{keyword} {on}"),
                    format!("has_table_privilege($1, {object}, '{keyword}')"),
                    None,
                )),
                Merged::Some(cols) => {
                    for col in cols {
                        checks.push((
                            format!("{keyword} ({{}}) {on}"),
                            format!("has_column_privilege($1, {object}, '{col}', '{keyword}')"),
                            Some(col),
                        ));
                    }
                }
            }
        }
        if access.delete {
            checks.push((
                format!("DELETE {on}"),
                format!("has_table_privilege($1, {object}, 'DELETE')"),
                None,
            ));
        }
        if access.usage {
            checks.push((
                format!("USAGE {on}"),
                format!("has_sequence_privilege($1, {object}, 'USAGE')"),
                None,
            ));
        }
    }
    let sql = format!(
        "SELECT ARRAY[{}]",
        checks
            .iter()
            .map(|(_, c, _)| c.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let held: Vec<bool> = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(role)
        .fetch_one(&mut *conn)
        .await?;
    // Group missing columns under their privilege, keeping the order of the checks.
    let mut missing: Vec<(String, Vec<&str>)> = Vec::new();
    for ((what, _, col), ok) in checks.iter().zip(held) {
        if ok {
            continue;
        }
        match (col, missing.iter_mut().find(|(w, _)| w == what)) {
            (Some(c), Some((_, cols))) => cols.push(c),
            (Some(c), None) => missing.push((what.clone(), vec![c])),
            (None, _) => missing.push((what.clone(), Vec::new())),
        }
    }
    Ok(missing
        .into_iter()
        .map(|(what, cols)| {
            if cols.is_empty() {
                what
            } else {
                what.replacen("{}", &cols.join(", "), 1)
            }
        })
        .collect())
}

/// Refuses when the connected role cannot act as the owner of the schema and of every object
/// the grants cover.
async fn refuse_not_owner(conn: &mut PgConnection, schema: &Schema) -> Result<(), RolesError> {
    let not_owned: Vec<String> = sqlx::query_scalar(
        "SELECT 'schema ' || n.nspname::text FROM pg_catalog.pg_namespace n \
         WHERE n.nspname = $1 AND NOT pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE') \
         UNION ALL \
         (SELECT c.relname::text FROM pg_catalog.pg_class c \
          JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = $1 AND c.relname = ANY($2) \
          AND NOT pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') ORDER BY 1)",
    )
    .bind(schema.as_str())
    .bind(covered_objects().collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    if not_owned.is_empty() {
        return Ok(());
    }
    let role: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut *conn)
        .await?;
    Err(RolesError::NotOwner {
        role,
        schema: schema.to_string(),
        objects: not_owned,
    })
}

/// Checks that the connected role holds every grant `component` needs in `schema` (for the
/// migrator: owns the schema and its objects), and that the schema is at this release's
/// version. Components call it at startup to fail at once, naming what is missing, rather than
/// at their first statement.
///
/// # Errors
/// * [`RolesError::Missing`]: the role lacks grants; the error lists each one.
/// * [`RolesError::NotOwner`]: checking the migrator, the role does not own everything.
/// * [`RolesError::Schema`]: [`crate::check_schema`] failed (including its
///   [`MigrateError::PermissionDenied`]).
/// * [`RolesError::Database`].
pub async fn check_privileges(
    pool: &PgPool,
    schema: &Schema,
    component: Component,
) -> Result<(), RolesError> {
    // The version first (a missing table cannot be checked), unless the role cannot even
    // read it: then the list below says exactly what it lacks.
    let version = match check_schema(pool, schema).await {
        Err(e) if !matches!(e, MigrateError::PermissionDenied(_)) => return Err(e.into()),
        other => other,
    };
    let mut conn = pool.acquire().await?;
    if component == Component::Migrator {
        refuse_not_owner(&mut conn, schema).await?;
        return Ok(version?);
    }
    let role: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut *conn)
        .await?;
    let missing = missing_privileges(&mut conn, schema, &role, component).await?;
    if !missing.is_empty() {
        return Err(RolesError::Missing {
            role,
            component,
            missing,
        });
    }
    version?;
    Ok(())
}

/// Why a role operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RolesError {
    /// A role name was refused.
    #[error("invalid role name `{name}`: {reason}")]
    InvalidRole {
        /// The name.
        name: String,
        /// The rule it breaks.
        reason: String,
    },
    /// The bootstrap needs a migrator role.
    #[error("the bootstrap needs the migrator's role (--migrator)")]
    NoMigrator,
    /// A component's role owns objects in the schema (or is the migrator, or a superuser): its
    /// privileges cannot be limited.
    #[error(
        "role `{role}` cannot be the {component} role: it owns the schema's objects or is a superuser, and no grant limits an owner; use a role of its own"
    )]
    OwnerAsComponent {
        /// The role.
        role: String,
        /// The component it was named for.
        component: Component,
    },
    /// Named roles do not exist.
    #[error(
        "role(s) not found: {}; create them (`outbox roles apply --bootstrap` as a superuser creates them NOLOGIN) or name existing ones",
        .roles.iter().map(|(c, r)| format!("`{r}` ({c})")).collect::<Vec<_>>().join(", ")
    )]
    UnknownRoles {
        /// Component and role name of each missing role.
        roles: Vec<(Component, String)>,
    },
    /// The connected role does not own the schema's objects, so its GRANTs would not take.
    #[error(
        "role `{role}` does not own {} in schema `{schema}`: run `outbox roles apply` as the migrator, or `outbox roles apply --bootstrap` as a superuser to hand the objects to the migrator",
        .objects.join(", ")
    )]
    NotOwner {
        /// The connected role.
        role: String,
        /// The schema.
        schema: String,
        /// Objects it does not own.
        objects: Vec<String>,
    },
    /// A role lacks grants of its component.
    #[error("{}", PermissionDenied {
        detail: format!("permission denied: role `{role}` lacks {}", .missing.join(", ")),
        role: Some(.role.clone()),
        component: Some(*.component),
    })]
    Missing {
        /// The role.
        role: String,
        /// Its component.
        component: Component,
        /// Each missing grant as a GRANT fragment.
        missing: Vec<String>,
    },
    /// The bootstrap was refused: it creates roles and schemas and hands objects over.
    #[error(
        "{detail} (role `{role}` cannot run the bootstrap: run `outbox roles apply --bootstrap` as a superuser, or as a role with CREATEROLE that is a member of the migrator and may create schemas)"
    )]
    BootstrapDenied {
        /// The connected role.
        role: String,
        /// What the database said.
        detail: String,
    },
    /// The schema is missing, at another version, or unreadable for this role.
    #[error(transparent)]
    Schema(#[from] MigrateError),
    /// Database error.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> RolePlan {
        RolePlan::with_defaults(Schema::default()).unwrap()
    }

    #[test]
    fn role_names_are_checked() {
        for good in ["outbox_relay", "Relay-2", "svc@project.iam", "a"] {
            assert!(RoleName::new(good).is_ok(), "{good} refused");
        }
        for bad in [
            "",
            "public",
            "PUBLIC",
            "none",
            "current_user",
            "pg_read_all_data",
            "a\"b",
            "a b",
            "a;b",
            "a'b",
            "a$b",
            &"x".repeat(64),
        ] {
            assert!(RoleName::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_decision_names_each_column_once() {
        for o in OBJECTS {
            for c in Component::ALL {
                for p in o.of(c) {
                    if let Select(Only(cols)) | Insert(Only(cols)) | Update(Only(cols)) = p {
                        let mut sorted = cols.to_vec();
                        sorted.sort_unstable();
                        sorted.dedup();
                        assert_eq!(sorted.len(), cols.len(), "{} {c}: {cols:?}", o.name);
                    }
                    if o.kind == Kind::Sequence {
                        assert_eq!(p, Usage, "{} {c}", o.name);
                    } else {
                        assert_ne!(p, Usage, "{} {c}", o.name);
                    }
                }
            }
        }
    }

    #[test]
    fn the_relay_never_inserts_events_nor_touches_consumer_tables() {
        let relay = access_of(&[Component::Relay]);
        let on = |name: &str| relay.iter().find(|(o, _)| o.name == name).map(|(_, a)| a);
        assert_eq!(on("events").unwrap().insert, Merged::No);
        for t in [
            "inbox",
            "inbox_conflicts",
            "inbox_aggregates",
            "consumer_dead_letters",
            "work_items",
            "aggregate_versions",
            "idempotency_keys",
        ] {
            assert!(on(t).is_none(), "relay has access to {t}");
        }
    }

    #[test]
    fn the_operator_is_the_reader_plus_writes() {
        let reader = access_of(&[Component::Reader]);
        let operator = access_of(&[Component::Operator]);
        // The operator reads at least what the reader reads (and payloads of dead letters).
        for (o, r) in &reader {
            let (_, op) = operator.iter().find(|(p, _)| p.name == o.name).unwrap();
            let covers = match (&op.select, &r.select) {
                (_, Merged::No) | (Merged::Table, _) => true,
                (Merged::Some(op), Merged::Some(r)) => r.iter().all(|c| op.contains(c)),
                _ => false,
            };
            assert!(
                covers,
                "{}: {:?} does not cover {:?}",
                o.name, op.select, r.select
            );
        }
        assert!(
            reader
                .iter()
                .all(|(_, a)| a.insert == Merged::No && a.update == Merged::No && !a.delete)
        );
    }

    #[test]
    fn a_shared_role_gets_the_union_in_one_statement_per_object() {
        let r = RoleName::new("svc").unwrap();
        let plan = RolePlan::new(Schema::default())
            .with_role(Component::Reader, r.clone())
            .with_role(Component::Operator, r);
        let grants: Vec<String> = plan
            .grant_statements()
            .into_iter()
            .filter(|s| s.contains("\"outbox\".\"events\""))
            .collect();
        assert_eq!(grants.len(), 1, "{grants:?}");
        assert!(
            grants[0].starts_with("GRANT SELECT (id, event_id,")
                && grants[0].contains("UPDATE (state, attempts, available_at)"),
            "{}",
            grants[0]
        );
    }

    #[test]
    fn the_migrator_gets_no_grants_and_cannot_double_as_a_component() {
        let p = plan();
        assert!(
            !p.grant_statements()
                .iter()
                .any(|s| s.contains("\"outbox_migrator\""))
        );
        let m = RoleName::new("outbox_migrator").unwrap();
        let bad = plan().with_role(Component::Relay, m);
        assert!(matches!(
            bad.bootstrap_statements(),
            Err(RolesError::OwnerAsComponent {
                component: Component::Relay,
                ..
            })
        ));
    }

    #[test]
    fn missing_grants_read_as_permission_denied_with_role_and_component() {
        let e = RolesError::Missing {
            role: "svc".into(),
            component: Component::Relay,
            missing: vec!["USAGE ON SCHEMA \"outbox\"".into()],
        };
        assert_eq!(
            e.to_string(),
            "permission denied: role `svc` lacks USAGE ON SCHEMA \"outbox\" (role `svc` needs the relay grants: run `outbox roles apply` as the migrator)"
        );
    }

    #[test]
    fn components_parse_by_name() {
        for c in Component::ALL {
            assert_eq!(c.as_str().parse::<Component>().unwrap(), c);
        }
        assert!("admin".parse::<Component>().is_err());
    }
}
