//! The operator's reads and actions, in one place: the CLI's `status`, `dead-letters`,
//! `conflicts`, `consumer-dead-letters`, `effects status|list|resolve|reconcile`, `audit` and
//! `trace` read and act through [`Admin`], and so does the web console (`outbox-console`), so
//! the two never disagree about a number or about what an action does.
//!
//! Every read here is one statement through the table's indexes or its partial indexes of
//! open rows, except where a method says otherwise; nothing here holds a lock beyond its own
//! statement. Every action runs in one transaction with its audit record ([`AuditEntry`],
//! schema version 8): the change and its record commit together, and a refused action leaves
//! neither (it is logged under `outbox::audit`).
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), outbox_postgres::admin::AdminError> {
//! use outbox_postgres::admin::{Actor, Admin, DeadLetterSelection};
//! use outbox_postgres::{PgStore, PgStoreConfig};
//! let admin = Admin::new(PgStore::new(pool, PgStoreConfig::default()));
//! let overview = admin.overview().await?;
//! if overview.dead_letters > 0 {
//!     let me = Actor::new("alice", "runbook")?;
//!     let requeued = admin
//!         .requeue_dead_letters(&DeadLetterSelection::All, &me, "broker limit raised")
//!         .await?;
//!     println!("requeued {requeued}");
//! }
//! # Ok(()) }
//! ```

mod audit;
mod dead_letters;
mod pauses;
mod processes;
mod replay;
mod trace;

use chrono::{DateTime, Utc};
use outbox_core::{EventId, OutboxStats, OutboxStore, StoreError, StoreErrorKind};
use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection, Postgres, Row, Transaction};

pub use audit::{Actor, AuditEntry};
pub use dead_letters::{
    ConsumerDeadLetterDetail, ConsumerDeadLetterGroup, ConsumerDeadLetterGroups,
    ConsumerDeadLetterView, ConsumerSelection, DeadLetterDetail, DeadLetterFilter, DeadLetterGroup,
    DeadLetterGroups, DeadLetterSelection, DeadLetterView, Discarded, GROUP_SCAN, PayloadView,
};
pub(crate) use pauses::CONSUMER_PAUSED;
pub use pauses::{Pause, PauseTarget};
pub use processes::{ConsumerView, Instance, MINUTES, RouteView, Routes};
pub use replay::{
    MAX_RANGE_AGGREGATES, MAX_RANGE_EVENTS, RangePlan, RangeSelection, ReplayPlan, ReplaySelection,
};
pub use trace::{
    AggregateTrace, ConsumerProgress, DiscardedEvent, EventTrace, InboxRecord, TracedEvent,
};

use crate::effects::{EffectsError, EffectsStats, Resolution, WorkItemRow};
use crate::roles::{Component, PermissionDenied, pool_role};
use crate::store::{OnPublish, PgStore, stats_from_row};

/// Open consumer dead letters (not resolved; requeued ones count until the consumer settles
/// them), as `outbox status` has always counted them.
const COUNT_CONSUMER_DEAD: &str =
    "SELECT count(*) FROM {s}.consumer_dead_letters WHERE state <> 'resolved'";

/// A conflict's columns as [`conflict_view`] reads them (`c` the conflict, `a` its
/// resolution's audit record).
const CONFLICT_COLUMNS: &str = "c.id, c.consumer_name, c.event_id, c.stored_sha256, \
    c.received_sha256, c.aggregate_type, c.aggregate_id, c.aggregate_version, c.event_type, \
    c.occurrences, c.first_seen, c.last_seen, c.resolved_at, a.actor, a.reason";

/// Inbox conflicts, newest first, of one event id (`$1`) or all (`NULL`), the open ones only
/// when `$3`.
const LIST_CONFLICTS: &str = "FROM {s}.inbox_conflicts c \
    LEFT JOIN {s}.audit a ON a.id = c.resolved_audit_id \
    WHERE ($1::uuid IS NULL OR c.event_id = $1) AND (NOT $3 OR c.resolved_at IS NULL) \
    ORDER BY c.id DESC LIMIT $2";

/// The open conflicts among the ids `$1`, locked for their resolution.
const LOCK_OPEN_CONFLICTS: &str = "SELECT id FROM {s}.inbox_conflicts \
    WHERE id = ANY($1) AND resolved_at IS NULL FOR UPDATE";

/// How many of the ids `$1` are conflicts at all.
const COUNT_CONFLICTS_OF: &str = "SELECT count(*) FROM {s}.inbox_conflicts WHERE id = ANY($1)";

/// Resolves the open conflicts among the ids `$1` under the audit record `$2`.
const RESOLVE_CONFLICTS: &str = "UPDATE {s}.inbox_conflicts \
    SET resolved_at = now(), resolved_audit_id = $2 WHERE id = ANY($1) AND resolved_at IS NULL";

/// One conflict's received payload, and the first payload where this database still holds the
/// producer's row with the first fingerprint (mark mode, or not yet published).
const CONFLICT_PAYLOADS: &str = "SELECT c.payload, \
    (SELECT e.payload FROM {s}.events e WHERE e.event_id = c.event_id \
       AND e.payload_sha256 = c.stored_sha256) \
    FROM {s}.inbox_conflicts c WHERE c.id = $1";

/// A work item's state.
const WORK_ITEM_STATE: &str = "SELECT state FROM {s}.work_items WHERE id = $1";

/// "Reconcile now": an unknown outcome's next lookup is due at once.
const RECONCILE_NOW: &str = "UPDATE {s}.work_items SET next_attempt_at = now(), \
    updated_at = now() WHERE id = $1 AND state = 'unknown'";

/// The outbox numbers of [`Admin::overview_counting`] with [`Counting::UpTo`], each count
/// stopped at `$1` rows: the pending rows through the table's order, the retrying and dead
/// ones through their partial indexes (migration 7), in-flight rows from the leases. `{published}`
/// counts kept published rows in mark mode (their index), and is 0 in delete mode.
const BOUNDED_STATS: &str = "SELECT \
      (SELECT count(*) FROM (SELECT 1 FROM {s}.events WHERE state = 'pending' LIMIT $1) c), \
      (SELECT EXTRACT(EPOCH FROM now() - e.created_at)::float8 FROM {s}.events e \
         WHERE e.state = 'pending' ORDER BY e.id LIMIT 1), \
      (SELECT count(*) FROM (SELECT 1 FROM {s}.leases l JOIN {s}.events f \
         ON f.aggregate_type = l.aggregate_type AND f.aggregate_id = l.aggregate_id \
         WHERE l.lease_until > now() AND f.state = 'pending' LIMIT $1) c), \
      (SELECT count(*) FROM (SELECT 1 FROM {s}.events \
         WHERE state = 'pending' AND attempts > 0 LIMIT $1) c), \
      (SELECT count(*) FROM (SELECT 1 FROM {s}.events WHERE state = 'dead' LIMIT $1) c), \
      {published}";

/// Failed work items, counted up to `$1`.
const COUNT_FAILED_ITEMS: &str =
    "SELECT count(*) FROM (SELECT 1 FROM {s}.work_items WHERE state = 'failed' LIMIT $1) c";

/// The largest page of dead letters one call returns.
pub const MAX_LIST: i64 = 10_000;

/// How [`Admin::overview_counting`] counts the outbox's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// Every row: one pass over the table, which takes seconds at millions of pending rows
    /// (2 s at 10 million here). What `outbox status` does.
    Exact,
    /// Each count stops at this many rows, so that the overview costs milliseconds at any
    /// backlog size; a count equal to the bound means "at least". What the console does.
    UpTo(i64),
}

/// What went wrong in an [`Admin`] call.
#[derive(Debug, thiserror::Error)]
#[error("{operation}: {message}")]
pub struct AdminError {
    /// What was being done (`overview`, `dead letters`, `requeue`, ...).
    pub operation: &'static str,
    /// The class of the failure, for a caller that maps it (the console to an HTTP status).
    pub kind: AdminErrorKind,
    /// The database's or the store's message.
    pub message: String,
}

/// The class of an [`AdminError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminErrorKind {
    /// The database could not be reached; retry later.
    Unavailable,
    /// The connected role lacks a grant (the message names it); a read-only operator role
    /// trying an action gets this.
    PermissionDenied,
    /// The schema is missing or at another version: run `outbox migrate`.
    Schema,
    /// The request itself is invalid (a page size out of range, an unknown state name).
    InvalidRequest,
    /// What the request names does not exist (a work item id).
    NotFound,
    /// The row's state does not allow the action (a work item that is not `unknown` settled
    /// by hand); nothing was changed.
    Refused,
    /// Anything else the database reported.
    Other,
}

impl AdminError {
    fn store(operation: &'static str, e: StoreError) -> Self {
        let kind = match e.kind() {
            StoreErrorKind::Unavailable => AdminErrorKind::Unavailable,
            StoreErrorKind::PermissionDenied => AdminErrorKind::PermissionDenied,
            StoreErrorKind::Schema => AdminErrorKind::Schema,
            _ => AdminErrorKind::Other,
        };
        Self {
            operation,
            kind,
            message: e.to_string(),
        }
    }

    fn sqlx(operation: &'static str, e: sqlx::Error) -> Self {
        let kind = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_) => AdminErrorKind::Unavailable,
            // Shutting down, starting up, too many connections, connection failures.
            sqlx::Error::Database(d)
                if matches!(
                    d.code().as_deref(),
                    Some("57P01" | "57P02" | "57P03" | "53300")
                ) || d.code().is_some_and(|c| c.starts_with("08")) =>
            {
                AdminErrorKind::Unavailable
            }
            sqlx::Error::Database(d) if d.code().as_deref() == Some("42501") => {
                AdminErrorKind::PermissionDenied
            }
            sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => {
                AdminErrorKind::Schema
            }
            _ => AdminErrorKind::Other,
        };
        Self {
            operation,
            kind,
            message: e.to_string(),
        }
    }

    fn effects(operation: &'static str, e: EffectsError) -> Self {
        match e {
            EffectsError::Database(e) => Self::sqlx(operation, e),
            EffectsError::NotMigrated { .. } => Self {
                operation,
                kind: AdminErrorKind::Schema,
                message: e.to_string(),
            },
            EffectsError::PermissionDenied(_) => Self {
                operation,
                kind: AdminErrorKind::PermissionDenied,
                message: e.to_string(),
            },
            EffectsError::InvalidArgument { .. } => Self {
                operation,
                kind: AdminErrorKind::InvalidRequest,
                message: e.to_string(),
            },
            EffectsError::NotFound { .. } => Self {
                operation,
                kind: AdminErrorKind::NotFound,
                message: e.to_string(),
            },
            EffectsError::NotResolvable { .. } => Self {
                operation,
                kind: AdminErrorKind::Refused,
                message: e.to_string(),
            },
            other => Self {
                operation,
                kind: AdminErrorKind::Other,
                message: other.to_string(),
            },
        }
    }
}

/// The numbers of `outbox status` and of the console's overview.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overview {
    /// The schema read.
    pub schema: String,
    /// `null` when every count is exact; else the bound each outbox count stopped at (a count
    /// equal to it means at least that many; [`Counting::UpTo`]).
    pub counted_up_to: Option<i64>,
    /// Outbox rows not yet published and not dead (in flight and retrying included).
    pub pending: i64,
    /// Age of the oldest pending row by the database clock, seconds (0 when none).
    pub oldest_pending_age_seconds: f64,
    /// Pending rows under a live lease.
    pub in_flight: i64,
    /// Pending rows that failed at least once.
    pub retrying: i64,
    /// Outbox dead letters (each blocks its aggregate until requeued).
    pub dead_letters: i64,
    /// Rows kept as published (mark mode; 0 in delete mode).
    pub published_retained: i64,
    /// Inbox conflicts recorded (same event id, different payload).
    pub inbox_conflicts: i64,
    /// Consumer dead letters not resolved.
    pub consumer_dead_letters: i64,
    /// Remote effects by state.
    pub work_items: WorkItems,
}

/// Remote effects (work items) by state, in an [`Overview`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkItems {
    /// Not started, or due for a retry.
    pub pending: i64,
    /// Claimed by an executor right now.
    pub in_progress: i64,
    /// Sent, outcome unknown: waiting for reconciliation.
    pub unknown: i64,
    /// Age of the oldest unknown outcome, seconds (0 when none).
    pub oldest_unknown_age_seconds: f64,
    /// Failed for good.
    pub failed: i64,
}

/// An inbox conflict as the operator sees it: the same event id arrived at a consumer with
/// another payload than the first time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConflictView {
    /// The conflict's id.
    pub id: i64,
    /// The consumer that saw it.
    pub consumer_name: String,
    /// The event id.
    pub event_id: EventId,
    /// SHA-256 of the payload recorded first, hex.
    pub stored_sha256: String,
    /// SHA-256 of the conflicting payload, hex.
    pub received_sha256: String,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Aggregate version.
    pub aggregate_version: i64,
    /// Event type.
    pub event_type: String,
    /// How often this exact conflicting payload arrived.
    pub occurrences: i32,
    /// First seen.
    pub first_seen: DateTime<Utc>,
    /// Last seen.
    pub last_seen: DateTime<Utc>,
    /// When an operator resolved it ([`Admin::resolve_conflicts`]); `None` while open. The
    /// same conflicting payload arriving again reopens it.
    pub resolved_at: Option<DateTime<Utc>>,
    /// Who resolved it (the audit record's actor).
    pub resolved_by: Option<String>,
    /// Why (the audit record's reason).
    pub resolution_reason: Option<String>,
}

/// What [`Admin::resolve_conflicts`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConflictsResolved {
    /// Conflicts resolved by this call (ids already resolved are not counted).
    pub resolved: u64,
    /// The audit record (written even when every id was resolved already).
    pub audit_id: i64,
}

/// A conflict with its payloads, as far as this database holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConflictDetail {
    /// The conflict.
    #[serde(flatten)]
    pub conflict: ConflictView,
    /// The conflicting payload, as received.
    pub received_payload: PayloadView,
    /// The first payload (the one the consumer applied), when this database still holds the
    /// producer's row with that fingerprint; the inbox keeps only the fingerprint.
    pub first_payload: Option<PayloadView>,
}

/// The operator's reads and actions on one outbox schema (see the module docs).
#[derive(Debug, Clone)]
pub struct Admin {
    store: PgStore,
}

impl Admin {
    /// Reads and acts through `store` (its pool's role decides what is allowed: the operator
    /// role acts, the read-only role only reads).
    pub fn new(store: PgStore) -> Self {
        Self { store }
    }

    /// The store read and acted on.
    pub fn store(&self) -> &PgStore {
        &self.store
    }

    /// Checks that the database answers and the schema is at this release's version (a
    /// readiness probe).
    ///
    /// # Errors
    /// [`AdminError`] of kind `Unavailable`, `Schema` or `PermissionDenied`.
    pub async fn ready(&self) -> Result<(), AdminError> {
        self.store
            .check()
            .await
            .map_err(|e| AdminError::store("readiness", e))
    }

    /// The overview numbers, every count exact ([`Counting::Exact`]): the outbox counts are
    /// [`OutboxStore::stats`], one pass over the table (about 2 s at 10 million pending rows
    /// here); the rest reads partial indexes of open rows.
    ///
    /// # Errors
    /// [`AdminError`]: the database is unreachable, the role cannot read, or the schema is
    /// missing.
    pub async fn overview(&self) -> Result<Overview, AdminError> {
        self.overview_counting(Counting::Exact).await
    }

    /// The overview numbers, the outbox's counted as `counting` says.
    ///
    /// # Errors
    /// [`AdminError`]: the database is unreachable, the role cannot read, the schema is
    /// missing, or (`InvalidRequest`) a bound below 1.
    pub async fn overview_counting(&self, counting: Counting) -> Result<Overview, AdminError> {
        let pool = self.store.pool();
        let schema = self.store.schema();
        let (s, counted_up_to) = match counting {
            Counting::Exact => (
                self.store
                    .stats()
                    .await
                    .map_err(|e| AdminError::store("overview", e))?,
                None,
            ),
            Counting::UpTo(bound) if bound >= 1 => (self.bounded_stats(bound).await?, Some(bound)),
            Counting::UpTo(bound) => {
                return Err(AdminError {
                    operation: "overview",
                    kind: AdminErrorKind::InvalidRequest,
                    message: format!("a count bound must be at least 1, not {bound}"),
                });
            }
        };
        let inbox_conflicts = self
            .store
            .inbox()
            .conflict_count(pool)
            .await
            .map_err(|e| AdminError::sqlx("overview: inbox conflicts", e))?;
        let consumer_dead_letters: i64 =
            sqlx::query_scalar(AssertSqlSafe(schema.render(COUNT_CONSUMER_DEAD)))
                .fetch_one(pool)
                .await
                .map_err(|e| AdminError::sqlx("overview: consumer dead letters", e))?;
        let effects = match counting {
            Counting::Exact => self.store.effects().stats(pool, None).await,
            // The open states through their partial indexes; the failed ones counted up to
            // the bound (the settled history is never read whole).
            Counting::UpTo(bound) => match self.store.effects().backlog(pool, None).await {
                Ok(mut open) => {
                    let failed =
                        sqlx::query_scalar(AssertSqlSafe(schema.render(COUNT_FAILED_ITEMS)))
                            .bind(bound)
                            .fetch_one(pool)
                            .await
                            .map_err(|e| AdminError::sqlx("overview: work items", e))?;
                    open.failed = failed;
                    Ok(open)
                }
                Err(e) => Err(e),
            },
        }
        .map_err(|e| AdminError::effects("overview: work items", e))?;
        Ok(Overview {
            schema: schema.as_str().to_owned(),
            counted_up_to,
            pending: s.pending,
            oldest_pending_age_seconds: s.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64()),
            in_flight: s.in_flight,
            retrying: s.retrying,
            dead_letters: s.dead,
            published_retained: s.published_retained,
            inbox_conflicts,
            consumer_dead_letters,
            work_items: WorkItems {
                pending: effects.pending,
                in_progress: effects.in_progress,
                unknown: effects.unknown,
                oldest_unknown_age_seconds: effects
                    .oldest_unknown_age
                    .map_or(0.0, |d| d.as_secs_f64()),
                failed: effects.failed,
            },
        })
    }

    async fn bounded_stats(&self, bound: i64) -> Result<OutboxStats, AdminError> {
        let published = match self.store.config().on_publish {
            OnPublish::Delete => "0::int8",
            OnPublish::Mark => {
                "(SELECT count(*) FROM (SELECT 1 FROM {s}.events WHERE state = 'published' LIMIT $1) c)"
            }
        };
        let sql = self
            .store
            .schema()
            .render(&BOUNDED_STATS.replace("{published}", published));
        let r = sqlx::query(AssertSqlSafe(sql))
            .bind(bound)
            .fetch_one(self.store.pool())
            .await
            .map_err(|e| AdminError::sqlx("overview", e))?;
        stats_from_row(&r).map_err(|e| AdminError::sqlx("overview", e))
    }

    /// Outbox dead letters matching `filter`, oldest first, at most `limit` (1 to
    /// [`MAX_LIST`]).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// database's failure.
    pub async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<DeadLetterView>, AdminError> {
        check_limit("dead letters", limit)?;
        let selection = DeadLetterSelection::Matching(filter.clone());
        let sql = self.render(&dead_letters::outbox_sql(
            dead_letters::OUTBOX_LIST,
            &selection,
        ));
        selection
            .bind(sqlx::query(AssertSqlSafe(sql)))
            .bind(limit)
            .fetch_all(self.store.pool())
            .await
            .map_err(|e| AdminError::sqlx("dead letters", e))?
            .iter()
            .map(dead_letters::view)
            .collect::<Result<_, _>>()
            .map_err(|e| AdminError::sqlx("dead letters", e))
    }

    /// The reason groups of the outbox dead letters matching `filter`, largest first (see
    /// [`dead_letters`](self::dead_letters) for what a reason is). Reads at most
    /// [`GROUP_SCAN`] dead letters.
    ///
    /// # Errors
    /// [`AdminError`]: the database's failure.
    pub async fn dead_letter_groups(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<DeadLetterGroups, AdminError> {
        let selection = DeadLetterSelection::Matching(filter.clone());
        let sql = self.render(&dead_letters::outbox_sql(
            dead_letters::OUTBOX_GROUPS,
            &selection,
        ));
        let groups: Vec<DeadLetterGroup> = selection
            .bind(sqlx::query(AssertSqlSafe(sql)))
            .bind(GROUP_SCAN)
            .fetch_all(self.store.pool())
            .await
            .map_err(|e| AdminError::sqlx("dead letter groups", e))?
            .iter()
            .map(dead_letters::group)
            .collect::<Result<_, _>>()
            .map_err(|e| AdminError::sqlx("dead letter groups", e))?;
        let read: i64 = groups.iter().map(|g| g.count).sum();
        Ok(DeadLetterGroups {
            groups,
            complete: read < GROUP_SCAN,
        })
    }

    /// One outbox dead letter whole: its row, payload and headers. Reading a payload needs the
    /// operator role (the read-only role never reads payloads).
    ///
    /// # Errors
    /// [`AdminError`] of kind `NotFound` when `event_id` is not a dead letter,
    /// `PermissionDenied` under a role that may not read payloads, or the database's failure.
    pub async fn dead_letter(&self, event_id: EventId) -> Result<DeadLetterDetail, AdminError> {
        const OP: &str = "dead letter";
        let mut list = self
            .dead_letter_rows(&DeadLetterSelection::Ids(vec![event_id]))
            .await?;
        let Some(dead_letter) = list.pop() else {
            return Err(not_found(
                OP,
                format!("{event_id} is not an outbox dead letter"),
            ));
        };
        let row = sqlx::query(AssertSqlSafe(self.render(dead_letters::OUTBOX_DETAIL)))
            .bind(event_id)
            .fetch_optional(self.store.pool())
            .await
            .map_err(|e| self.action_error(OP, e))?
            .ok_or_else(|| not_found(OP, format!("{event_id} is not an outbox dead letter")))?;
        let decode = || -> Result<DeadLetterDetail, sqlx::Error> {
            Ok(DeadLetterDetail {
                dead_letter,
                payload: PayloadView::of(row.try_get(0)?),
                headers: row.try_get(1)?,
                partition_key: row.try_get(2)?,
            })
        };
        decode().map_err(|e| AdminError::sqlx(OP, e))
    }

    async fn dead_letter_rows(
        &self,
        selection: &DeadLetterSelection,
    ) -> Result<Vec<DeadLetterView>, AdminError> {
        let sql = self.render(&dead_letters::outbox_sql(
            dead_letters::OUTBOX_LIST,
            selection,
        ));
        selection
            .bind(sqlx::query(AssertSqlSafe(sql)))
            .bind(MAX_LIST)
            .fetch_all(self.store.pool())
            .await
            .map_err(|e| AdminError::sqlx("dead letter", e))?
            .iter()
            .map(dead_letters::view)
            .collect::<Result<_, _>>()
            .map_err(|e| AdminError::sqlx("dead letter", e))
    }

    /// Requeues the outbox dead letters `which` selects under their own event ids (the relay
    /// publishes them again, then the events of their aggregates that waited behind them), in
    /// one statement with its audit record, and wakes the relays. Returns how many.
    ///
    /// # Errors
    /// [`AdminError`] of kind `PermissionDenied` when the role may not act; otherwise the
    /// database's failure. Nothing was requeued or recorded then.
    pub async fn requeue_dead_letters(
        &self,
        which: &DeadLetterSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<u64, AdminError> {
        const OP: &str = "requeue dead letters";
        let selection = which.to_json();
        let mut tx = self.begin(OP, actor, &selection, reason).await?;
        let sql = self.render(&dead_letters::outbox_sql(
            dead_letters::OUTBOX_REQUEUE,
            which,
        ));
        let result = match which
            .bind(sqlx::query(AssertSqlSafe(sql)))
            .execute(&mut *tx)
            .await
        {
            Ok(r) if r.rows_affected() > 0 => {
                // Delivered at commit: relays move the requeued events (and the ones parked
                // behind them) at once.
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(self.store.schema().wakeup_channel())
                    .bind(crate::schema::RESCAN)
                    .execute(&mut *tx)
                    .await
                    .map(|_| r.rows_affected())
            }
            Ok(r) => Ok(r.rows_affected()),
            Err(e) => Err(e),
        }
        .map_err(|e| self.action_error(OP, e));
        self.finish(tx, OP, actor, &selection, reason, result).await
    }

    /// Discards the outbox dead letters `which` selects: they will never be published. Each
    /// is copied whole into `discarded_events` with the id of the audit record that names
    /// the actor and `reason`, and removed from the outbox, in one statement; the events of
    /// their aggregates that waited behind them then move on.
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` without a reason, `PermissionDenied` when the
    /// role may not act; otherwise the database's failure. Nothing was discarded or recorded
    /// then.
    pub async fn discard_dead_letters(
        &self,
        which: &DeadLetterSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<Discarded, AdminError> {
        const OP: &str = "discard dead letters";
        require_reason(OP, reason)?;
        let selection = which.to_json();
        let sql = self.render(&dead_letters::outbox_sql(
            dead_letters::OUTBOX_DISCARD,
            which,
        ));
        let mut conn = self
            .store
            .pool()
            .begin()
            .await
            .map_err(|e| AdminError::sqlx(OP, e))?;
        let result = which
            .bind(sqlx::query(AssertSqlSafe(sql)))
            .bind(actor.name())
            .bind(actor.via())
            .bind(actor.credential())
            .bind(&selection)
            .bind(reason)
            .fetch_one(&mut *conn)
            .await
            .and_then(|r| {
                Ok(Discarded {
                    discarded: u64::try_from(r.try_get::<i64, _>(0)?).unwrap_or(0),
                    audit_id: r.try_get(1)?,
                })
            })
            .map_err(|e| self.action_error(OP, e));
        // The events that waited behind the discarded ones may be claimed now, wherever they
        // lie: the relays' next claims read from the table's start.
        let result = match result {
            Ok(d) if d.discarded > 0 => sqlx::query("SELECT pg_notify($1, $2)")
                .bind(self.store.schema().wakeup_channel())
                .bind(crate::schema::RESCAN)
                .execute(&mut *conn)
                .await
                .map(|_| d)
                .map_err(|e| self.action_error(OP, e)),
            other => other,
        };
        let result = match result {
            Ok(d) => conn
                .commit()
                .await
                .map(|()| d)
                .map_err(|e| AdminError::sqlx(OP, e)),
            Err(e) => Err(e),
        };
        audit::log(
            actor,
            OP,
            &selection,
            reason,
            result.as_ref().map(|d| d.discarded),
        );
        result
    }

    /// Inbox conflicts, newest first, of `event_id` or of every event, the open ones only
    /// when `open_only`, at most `limit` (1 to [`MAX_LIST`]).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// database's failure.
    pub async fn conflicts(
        &self,
        event_id: Option<EventId>,
        open_only: bool,
        limit: i64,
    ) -> Result<Vec<ConflictView>, AdminError> {
        check_limit("conflicts", limit)?;
        trace::rows(
            self.store.pool(),
            self.store.schema(),
            &format!("SELECT {CONFLICT_COLUMNS} {LIST_CONFLICTS}"),
            |q| q.bind(event_id).bind(limit).bind(open_only),
            conflict_view,
        )
        .await
        .map_err(|e| AdminError::sqlx("conflicts", e))
    }

    /// Resolves the inbox conflicts `ids` (1 to [`MAX_LIST`] of them): an operator looked at
    /// each and dealt with its cause. Nothing is applied or undone: the consumer's effect stays
    /// the first payload's, and a conflict only leaves the open list (the overview's count, the
    /// console's list, `outbox conflicts list --open`), with the audit record naming the actor
    /// and `reason`. Ids already resolved are left as they are (not counted). The conflicting
    /// payload arriving again reopens a conflict, whoever sends it: a producer re-sending, the
    /// broker redelivering a message whose acknowledgement was lost, or, under
    /// `ConflictPolicy::Hold`, the held message coming back after each hold delay (resolve a
    /// held conflict after discarding or acknowledging that message, or it reopens at once).
    ///
    /// What "dealt with" means is the service's business: a producer that re-used an event id
    /// for another payload fixed, or the second payload's change booked by hand. The library
    /// never applies the conflicting payload: the consumer's inbox holds one effect per event
    /// id (G5), and a second effect under the same id would be the double effect the inbox
    /// exists to prevent.
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` (no ids, too many, or no reason), `NotFound`
    /// (none of the ids is a conflict), `PermissionDenied` when the role may only read;
    /// otherwise the database's failure. Nothing changed then.
    pub async fn resolve_conflicts(
        &self,
        ids: &[i64],
        actor: &Actor,
        reason: &str,
    ) -> Result<ConflictsResolved, AdminError> {
        const OP: &str = "resolve conflicts";
        let selection = serde_json::json!({ "conflicts": ids });
        let fail = |e: AdminError| {
            audit::log(actor, OP, &selection, reason, Err(&e));
            e
        };
        if ids.is_empty() || ids.len() > usize::try_from(MAX_LIST).unwrap_or(usize::MAX) {
            return Err(fail(AdminError {
                operation: OP,
                kind: AdminErrorKind::InvalidRequest,
                message: format!("give 1 to {MAX_LIST} conflict ids, not {}", ids.len()),
            }));
        }
        require_reason(OP, reason).map_err(fail)?;
        let mut tx = self.begin(OP, actor, &selection, reason).await?;
        let err = |e| fail(self.action_error(OP, e));
        let open: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(self.render(LOCK_OPEN_CONFLICTS)))
            .bind(ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        if open.is_empty() {
            let known: i64 = sqlx::query_scalar(AssertSqlSafe(self.render(COUNT_CONFLICTS_OF)))
                .bind(ids)
                .fetch_one(&mut *tx)
                .await
                .map_err(err)?;
            if known == 0 {
                return Err(fail(not_found(
                    OP,
                    format!("none of the ids {ids:?} is an inbox conflict"),
                )));
            }
        }
        // Recorded even when every id was resolved already: every action is in the audit.
        let resolved = u64::try_from(open.len()).unwrap_or(u64::MAX);
        let audit_id = audit::record(
            &mut tx,
            self.store.schema(),
            actor,
            OP,
            &selection,
            reason,
            resolved,
        )
        .await
        .map_err(err)?;
        sqlx::query(AssertSqlSafe(self.render(RESOLVE_CONFLICTS)))
            .bind(&open)
            .bind(audit_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit()
            .await
            .map_err(|e| fail(AdminError::sqlx(OP, e)))?;
        audit::log(actor, OP, &selection, reason, Ok(resolved));
        Ok(ConflictsResolved { resolved, audit_id })
    }

    /// One conflict with its payloads: the conflicting one, and the first one where this
    /// database still holds it. Needs the operator role (payloads).
    ///
    /// # Errors
    /// [`AdminError`] of kind `NotFound` (no such conflict), `PermissionDenied` under a role
    /// that may not read payloads, or the database's failure.
    pub async fn conflict(&self, id: i64) -> Result<ConflictDetail, AdminError> {
        const OP: &str = "conflict";
        let conflict = trace::rows(
            self.store.pool(),
            self.store.schema(),
            &format!(
                "SELECT {CONFLICT_COLUMNS} FROM {{s}}.inbox_conflicts c \
                 LEFT JOIN {{s}}.audit a ON a.id = c.resolved_audit_id WHERE c.id = $1"
            ),
            |q| q.bind(id),
            conflict_view,
        )
        .await
        .map_err(|e| AdminError::sqlx(OP, e))?
        .pop()
        .ok_or_else(|| not_found(OP, format!("no conflict {id}")))?;
        let row = sqlx::query(AssertSqlSafe(self.render(CONFLICT_PAYLOADS)))
            .bind(id)
            .fetch_one(self.store.pool())
            .await
            .map_err(|e| self.action_error(OP, e))?;
        let decode = || -> Result<ConflictDetail, sqlx::Error> {
            Ok(ConflictDetail {
                conflict,
                received_payload: PayloadView::of(row.try_get(0)?),
                first_payload: row.try_get::<Option<Vec<u8>>, _>(1)?.map(PayloadView::of),
            })
        };
        decode().map_err(|e| AdminError::sqlx(OP, e))
    }

    /// Consumer dead letters not resolved that `which` selects, oldest first, at most `limit`
    /// (1 to [`MAX_LIST`]).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// database's failure.
    pub async fn consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        limit: i64,
    ) -> Result<Vec<ConsumerDeadLetterView>, AdminError> {
        check_limit("consumer dead letters", limit)?;
        let sql = dead_letters::consumer_sql(dead_letters::CONSUMER_LIST_SQL, which, OPEN_STATES);
        which
            .bind(sqlx::query(AssertSqlSafe(self.render(&sql))))
            .bind(limit)
            .fetch_all(self.store.pool())
            .await
            .map_err(|e| AdminError::sqlx("consumer dead letters", e))?
            .iter()
            .map(dead_letters::consumer_view)
            .collect::<Result<_, _>>()
            .map_err(|e| AdminError::sqlx("consumer dead letters", e))
    }

    /// The (consumer, reason) groups of the consumer dead letters not resolved that `which`
    /// selects, largest first; reads at most [`GROUP_SCAN`] of them.
    ///
    /// # Errors
    /// [`AdminError`]: the database's failure.
    pub async fn consumer_dead_letter_groups(
        &self,
        which: &ConsumerSelection,
    ) -> Result<ConsumerDeadLetterGroups, AdminError> {
        let sql = dead_letters::consumer_sql(dead_letters::CONSUMER_GROUPS_SQL, which, OPEN_STATES);
        let groups: Vec<ConsumerDeadLetterGroup> = which
            .bind(sqlx::query(AssertSqlSafe(self.render(&sql))))
            .bind(GROUP_SCAN)
            .fetch_all(self.store.pool())
            .await
            .map_err(|e| AdminError::sqlx("consumer dead letter groups", e))?
            .iter()
            .map(dead_letters::consumer_group)
            .collect::<Result<_, _>>()
            .map_err(|e| AdminError::sqlx("consumer dead letter groups", e))?;
        let read: i64 = groups.iter().map(|g| g.count).sum();
        Ok(ConsumerDeadLetterGroups {
            groups,
            complete: read < GROUP_SCAN,
        })
    }

    /// One consumer dead letter whole, with the payload and headers as received. Needs the
    /// operator role (payloads).
    ///
    /// # Errors
    /// [`AdminError`] of kind `NotFound`, `PermissionDenied`, or the database's failure.
    pub async fn consumer_dead_letter(
        &self,
        id: i64,
    ) -> Result<ConsumerDeadLetterDetail, AdminError> {
        const OP: &str = "consumer dead letter";
        let which = ConsumerSelection {
            ids: Some(vec![id]),
            ..ConsumerSelection::default()
        };
        let sql = dead_letters::consumer_sql(
            dead_letters::CONSUMER_LIST_SQL,
            &which,
            "'dead', 'requeued', 'resolved'",
        );
        let dead_letter = which
            .bind(sqlx::query(AssertSqlSafe(self.render(&sql))))
            .bind(1_i64)
            .fetch_optional(self.store.pool())
            .await
            .map_err(|e| AdminError::sqlx(OP, e))?
            .as_ref()
            .map(dead_letters::consumer_view)
            .transpose()
            .map_err(|e| AdminError::sqlx(OP, e))?
            .ok_or_else(|| not_found(OP, format!("no consumer dead letter {id}")))?;
        let row = sqlx::query(AssertSqlSafe(
            self.render(dead_letters::CONSUMER_DETAIL_SQL),
        ))
        .bind(id)
        .fetch_one(self.store.pool())
        .await
        .map_err(|e| self.action_error(OP, e))?;
        let decode = || -> Result<ConsumerDeadLetterDetail, sqlx::Error> {
            Ok(ConsumerDeadLetterDetail {
                dead_letter,
                payload: PayloadView::of(row.try_get(0)?),
                headers: row.try_get(1)?,
                content_type: row.try_get(2)?,
            })
        };
        decode().map_err(|e| AdminError::sqlx(OP, e))
    }

    /// Marks the consumer dead letters `which` selects (in state `dead`) for their consumer to
    /// apply again through its inbox, with the audit record. Returns how many.
    ///
    /// # Errors
    /// [`AdminError`] of kind `PermissionDenied` (naming the operator grants) when the role may
    /// only read; otherwise the database's failure (nothing was requeued).
    pub async fn requeue_consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<u64, AdminError> {
        self.consumer_action(
            "requeue consumer dead letters",
            dead_letters::CONSUMER_REQUEUE_SQL,
            which,
            actor,
            reason,
        )
        .await
    }

    /// Gives up the consumer dead letters `which` selects (in state `dead`): they become
    /// `resolved` and are never applied; the audit record keeps the actor and `reason`.
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` without a reason, `PermissionDenied` when the
    /// role may only read; otherwise the database's failure (nothing changed).
    pub async fn discard_consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<u64, AdminError> {
        const OP: &str = "discard consumer dead letters";
        require_reason(OP, reason)?;
        self.consumer_action(OP, dead_letters::CONSUMER_DISCARD_SQL, which, actor, reason)
            .await
    }

    async fn consumer_action(
        &self,
        operation: &'static str,
        template: &str,
        which: &ConsumerSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<u64, AdminError> {
        let selection = serde_json::to_value(which).unwrap_or_default();
        let mut tx = self.begin(operation, actor, &selection, reason).await?;
        let sql = self.render(&dead_letters::consumer_sql(template, which, "'dead'"));
        let result = which
            .bind(sqlx::query(AssertSqlSafe(sql)))
            .execute(&mut *tx)
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| self.action_error(operation, e));
        self.finish(tx, operation, actor, &selection, reason, result)
            .await
    }

    /// Remote effects by state (all of them, settled ones included: this reads the whole
    /// work-item table), for `kind` or for every kind.
    ///
    /// # Errors
    /// [`AdminError`]: the database's failure, or the table missing.
    pub async fn work_item_stats(&self, kind: Option<&str>) -> Result<EffectsStats, AdminError> {
        self.store
            .effects()
            .stats(self.store.pool(), kind)
            .await
            .map_err(|e| AdminError::effects("work items", e))
    }

    /// Work items, in `state` or in every state, at most `limit` (1 to [`MAX_LIST`]).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for an unknown state or a `limit` out of range;
    /// otherwise the database's failure.
    pub async fn work_items(
        &self,
        state: Option<&str>,
        limit: i64,
    ) -> Result<Vec<WorkItemRow>, AdminError> {
        check_limit("work items", limit)?;
        self.store
            .effects()
            .list(self.store.pool(), state, limit)
            .await
            .map_err(|e| AdminError::effects("work items", e))
    }

    /// Settles a work item by hand, or sends it again ([`Resolution`]), with the audit record;
    /// returns the row as it is now.
    ///
    /// # Errors
    /// [`AdminError`] of kind `NotFound` (no such item), `Refused` (its state does not allow
    /// this resolution; nothing changed), `PermissionDenied` (the role may only read), or the
    /// database's failure.
    pub async fn resolve_work_item(
        &self,
        id: i64,
        resolution: Resolution,
        actor: &Actor,
        reason: &str,
    ) -> Result<WorkItemRow, AdminError> {
        const OP: &str = "resolve work item";
        let selection = serde_json::json!({ "work_item": id, "resolution": resolution.name() });
        let mut tx = self.begin(OP, actor, &selection, reason).await?;
        let result = self
            .store
            .effects()
            .resolve_in(&mut tx, &pool_role(self.store.pool()), id, resolution)
            .await
            .map(|row| (1, row))
            .map_err(|e| AdminError::effects(OP, e));
        let result = match result {
            Ok((n, row)) => Ok((n, Some(row))),
            Err(e) => Err(e),
        };
        self.finish_with(tx, OP, actor, &selection, reason, result)
            .await
            .map(|row| row.expect("a resolved work item"))
    }

    /// "Reconcile now": the next lookup of a work item whose outcome is unknown is due at once
    /// (a running executor looks it up on its next claim), with the audit record.
    ///
    /// # Errors
    /// [`AdminError`] of kind `NotFound` (no such item), `Refused` when its outcome is not
    /// `unknown`, `PermissionDenied` (the role may only read), or the database's failure.
    pub async fn reconcile_work_item(
        &self,
        id: i64,
        actor: &Actor,
        reason: &str,
    ) -> Result<(), AdminError> {
        const OP: &str = "reconcile work item";
        let selection = serde_json::json!({ "work_item": id });
        let mut tx = self.begin(OP, actor, &selection, reason).await?;
        let result = match sqlx::query(AssertSqlSafe(self.render(RECONCILE_NOW)))
            .bind(id)
            .execute(&mut *tx)
            .await
        {
            Ok(r) if r.rows_affected() == 1 => Ok(1),
            Ok(_) => {
                let state: Result<Option<String>, _> =
                    sqlx::query_scalar(AssertSqlSafe(self.render(WORK_ITEM_STATE)))
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await;
                Err(match state {
                    Ok(None) => not_found(OP, format!("no work item {id}")),
                    Ok(Some(state)) => AdminError {
                        operation: OP,
                        kind: AdminErrorKind::Refused,
                        message: format!(
                            "work item {id} is {state}: only an unknown outcome is reconciled"
                        ),
                    },
                    Err(e) => self.action_error(OP, e),
                })
            }
            Err(e) => Err(self.action_error(OP, e)),
        };
        self.finish(tx, OP, actor, &selection, reason, result)
            .await
            .map(|_| ())
    }

    /// The audit records, newest first, older than record `before` when given, at most
    /// `limit` (1 to [`MAX_LIST`]).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// database's failure.
    pub async fn audit(
        &self,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AuditEntry>, AdminError> {
        check_limit("audit", limit)?;
        audit::list(self.store.pool(), self.store.schema(), before, limit)
            .await
            .map_err(|e| AdminError::sqlx("audit", e))
    }

    /// Everything this database holds of `event_id` ([`EventTrace`]; see the `trace` docs of
    /// its fields).
    ///
    /// # Errors
    /// [`AdminError`]: the database's failure.
    pub async fn trace_event(&self, event_id: EventId) -> Result<EventTrace, AdminError> {
        let (pool, schema) = (self.store.pool(), self.store.schema());
        let err = |e| AdminError::sqlx("trace", e);
        let bind = |q: trace::Query| q.bind(event_id);
        Ok(EventTrace {
            event_id,
            outbox: trace::rows(pool, schema, trace::EVENT, bind, trace::traced_event)
                .await
                .map_err(err)?
                .pop(),
            discarded: trace::rows(pool, schema, trace::DISCARDED, bind, trace::discarded)
                .await
                .map_err(err)?
                .pop(),
            inbox: trace::rows(
                pool,
                schema,
                &trace::inbox_of_event(),
                bind,
                trace::inbox_record,
            )
            .await
            .map_err(err)?,
            conflicts: self.conflicts(Some(event_id), false, MAX_LIST).await?,
            consumer_dead_letters: trace::rows(
                pool,
                schema,
                trace::CONSUMER_DEAD_OF_EVENT,
                bind,
                crate::consumer::dead_letter_from_row,
            )
            .await
            .map_err(err)?,
            work_items: trace::rows(
                pool,
                schema,
                trace::WORK_ITEMS_OF_EVENT,
                bind,
                crate::effects::row_to_item,
            )
            .await
            .map_err(err)?,
            audit: audit::of_event(pool, schema, event_id).await.map_err(err)?,
        })
    }

    /// Everything this database holds of one aggregate's events: the outbox's rows (lowest
    /// version first, at most `limit`, 1 to [`MAX_LIST`]), the discarded ones, and each
    /// consumer's last applied version.
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// database's failure.
    pub async fn trace_aggregate(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        limit: i64,
    ) -> Result<AggregateTrace, AdminError> {
        check_limit("trace", limit)?;
        let (pool, schema) = (self.store.pool(), self.store.schema());
        let err = |e| AdminError::sqlx("trace", e);
        let (t, i) = (aggregate_type.to_owned(), aggregate_id.to_owned());
        Ok(AggregateTrace {
            outbox: trace::rows(
                pool,
                schema,
                trace::AGGREGATE_EVENTS,
                |q| q.bind(t.clone()).bind(i.clone()).bind(limit),
                trace::traced_event,
            )
            .await
            .map_err(err)?,
            discarded: trace::rows(
                pool,
                schema,
                trace::AGGREGATE_DISCARDED,
                |q| q.bind(t.clone()).bind(i.clone()).bind(limit),
                trace::discarded,
            )
            .await
            .map_err(err)?,
            consumers: trace::rows(
                pool,
                schema,
                &trace::inbox_of_aggregate(),
                |q| q.bind(t.clone()).bind(i.clone()),
                trace::progress,
            )
            .await
            .map_err(err)?,
            aggregate_type: t,
            aggregate_id: i,
        })
    }

    /// Replays one aggregate's published events with their original ids ([`ReplaySelection`];
    /// see the [`replay`](self::replay) rules): with `dry_run`, only says how many rows it would
    /// take; otherwise makes them pending again, with the audit record, and wakes the relays.
    /// `expect_events` (the dry run's count) refuses the replay when the count changed.
    ///
    /// # Errors
    /// [`AdminError`] of kind `Refused` in delete mode (the outbox keeps no published rows),
    /// beyond the replay horizon, while a relay holds the aggregate or a CDC relay runs, or
    /// when the count changed (nothing changed; the message says why), `NotFound` when nothing
    /// of the aggregate is held, `InvalidRequest` for a version below 1 or no reason,
    /// `PermissionDenied` when the role may not act; otherwise the database's failure.
    pub async fn replay(
        &self,
        which: &ReplaySelection,
        dry_run: bool,
        expect_events: Option<i64>,
        actor: &Actor,
        reason: &str,
    ) -> Result<ReplayPlan, AdminError> {
        const OP: &str = "replay";
        let selection = serde_json::to_value(which).unwrap_or_default();
        // A refusal changes nothing and writes no record; it is logged.
        let fail = |e: AdminError| {
            audit::log(actor, OP, &selection, reason, Err(&e));
            e
        };
        let refuse = |kind, message: String| {
            fail(AdminError {
                operation: OP,
                kind,
                message,
            })
        };
        if let Err((kind, message)) = self.replay_allowed(dry_run, reason) {
            return Err(refuse(kind, message));
        }
        let (t, i) = (&which.aggregate_type, &which.aggregate_id);
        let from = which.from_version.unwrap_or(1);
        if from < 1 {
            return Err(refuse(
                AdminErrorKind::InvalidRequest,
                format!("versions start at 1, not {from}"),
            ));
        }
        let mut tx = self.begin(OP, actor, &selection, reason).await?;
        let q = |sql: &str| {
            sqlx::query(AssertSqlSafe(self.render(sql)))
                .bind(t.clone())
                .bind(i.clone())
        };
        let err = |e| fail(self.action_error(OP, e));
        q(replay::LOCK).execute(&mut *tx).await.map_err(err)?;
        let leased: bool = q(replay::LEASED)
            .fetch_one(&mut *tx)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(err)?;
        if leased {
            return Err(refuse(
                AdminErrorKind::Refused,
                format!(
                    "a relay holds {t}/{i} right now (it may be publishing a later version): \
                     retry once it settled, in a few seconds"
                ),
            ));
        }
        if let Some(message) = self.replay_cdc_refusal(&mut tx).await.map_err(err)? {
            return Err(refuse(AdminErrorKind::Refused, message));
        }
        let r = q(replay::PLAN)
            .bind(from)
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
        let decode = || -> Result<(ReplayPlan, i64), sqlx::Error> {
            Ok((
                ReplayPlan {
                    events: r.try_get(0)?,
                    lowest_version_held: r.try_get(1)?,
                    newest_version_held: r.try_get(2)?,
                    first_published_at: r.try_get(4)?,
                    dry_run,
                },
                r.try_get(3)?,
            ))
        };
        let (plan, held_from) = decode().map_err(|e| fail(AdminError::sqlx(OP, e)))?;
        let (Some(lowest), Some(newest)) = (plan.lowest_version_held, plan.newest_version_held)
        else {
            return Err(fail(not_found(
                OP,
                format!(
                    "nothing of {t}/{i} is held by the outbox (never written here, or deleted by retention)"
                ),
            )));
        };
        if lowest > from {
            return Err(refuse(
                AdminErrorKind::Refused,
                format!(
                    "beyond the replay horizon: {t}/{i} versions below {lowest} are no longer held \
                     (retention or a discard removed them); replay from version {lowest}, or from \
                     the broker's retention"
                ),
            ));
        }
        if from <= newest && held_from != newest - from + 1 {
            return Err(refuse(
                AdminErrorKind::Refused,
                format!(
                    "beyond the replay horizon: versions {from} to {newest} of {t}/{i} are not all \
                     held ({held_from} of {}; retention or a discard removed some)",
                    newest - from + 1
                ),
            ));
        }
        if let Some(message) = count_changed(expect_events, plan.events) {
            return Err(refuse(AdminErrorKind::Refused, message));
        }
        if dry_run {
            // Nothing changed and nothing to record.
            let _ = tx.rollback().await;
            return Ok(plan);
        }
        let changed = q(replay::REPLAY).bind(from).execute(&mut *tx).await;
        let result = self.replayed(&mut tx, OP, changed, plan.events).await;
        let n = self
            .finish(tx, OP, actor, &selection, reason, result)
            .await?;
        Ok(ReplayPlan {
            events: i64::try_from(n).unwrap_or(i64::MAX),
            ..plan
        })
    }

    /// Replays the published events written in a time range with their original ids
    /// ([`RangeSelection`]; see the [`replay`](self::replay) rules: each aggregate is extended
    /// to its newest version, and the range must start after the replay horizon). With
    /// `dry_run`, only says what it would take; otherwise makes those rows pending again, with
    /// the audit record, and wakes the relays. `expect_events` (the dry run's count) refuses the
    /// replay when the count changed.
    ///
    /// # Errors
    /// [`AdminError`] of kind `Refused` in delete mode, for a range that starts at or before
    /// the replay horizon, when an aggregate's versions are not all held, while a relay holds
    /// one of the aggregates or a CDC relay runs, when the range is too big
    /// ([`MAX_RANGE_AGGREGATES`], [`MAX_RANGE_EVENTS`]) or when the count changed (nothing
    /// changed; the message says why), `NotFound` when nothing published was written in the
    /// range, `InvalidRequest` for an empty range or no reason, `PermissionDenied` when the
    /// role may not act; otherwise the database's failure.
    pub async fn replay_range(
        &self,
        which: &RangeSelection,
        dry_run: bool,
        expect_events: Option<i64>,
        actor: &Actor,
        reason: &str,
    ) -> Result<RangePlan, AdminError> {
        const OP: &str = "replay range";
        let selection = serde_json::to_value(which).unwrap_or_default();
        let fail = |e: AdminError| {
            audit::log(actor, OP, &selection, reason, Err(&e));
            e
        };
        let refuse = |kind, message: String| {
            fail(AdminError {
                operation: OP,
                kind,
                message,
            })
        };
        if let Err((kind, message)) = self.replay_allowed(dry_run, reason) {
            return Err(refuse(kind, message));
        }
        if which.created_after >= which.created_before {
            return Err(refuse(
                AdminErrorKind::InvalidRequest,
                format!(
                    "an empty range: created_after {} is not before created_before {}",
                    which.created_after.to_rfc3339(),
                    which.created_before.to_rfc3339()
                ),
            ));
        }
        let mut tx = self.begin(OP, actor, &selection, reason).await?;
        let err = |e| fail(self.action_error(OP, e));
        let horizon: Option<DateTime<Utc>> =
            sqlx::query_scalar(AssertSqlSafe(self.render(replay::HORIZON)))
                .fetch_optional(&mut *tx)
                .await
                .map_err(err)?;
        if let Some(h) = horizon
            && which.created_after <= h
        {
            return Err(refuse(
                AdminErrorKind::Refused,
                format!(
                    "beyond the replay horizon: retention deleted events published up to {}; a \
                     range must start after it (or replay from the broker's retention)",
                    h.to_rfc3339()
                ),
            ));
        }
        let rows = sqlx::query(AssertSqlSafe(self.render(replay::RANGE_AGGREGATES)))
            .bind(which.created_after)
            .bind(which.created_before)
            .bind(which.aggregate_type.as_deref())
            .bind(which.destination.as_deref())
            .bind(replay::MAX_RANGE_AGGREGATES + 1)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        if rows.is_empty() {
            return Err(fail(not_found(
                OP,
                "no published event was written in the range (with the filter given)".into(),
            )));
        }
        let mut types = Vec::with_capacity(rows.len());
        let mut ids = Vec::with_capacity(rows.len());
        let mut froms = Vec::with_capacity(rows.len());
        let mut in_range = 0i64;
        for r in &rows {
            let decoded = (|| -> Result<(), sqlx::Error> {
                types.push(r.try_get::<String, _>(0)?);
                ids.push(r.try_get::<String, _>(1)?);
                froms.push(r.try_get::<i64, _>(2)?);
                in_range += r.try_get::<i64, _>(3)?;
                Ok(())
            })();
            decoded.map_err(|e| fail(AdminError::sqlx(OP, e)))?;
        }
        let aggregates = i64::try_from(rows.len()).unwrap_or(i64::MAX);
        let too_big = |events: i64| {
            refuse(
                AdminErrorKind::Refused,
                format!(
                    "the range takes {events} event(s) of {} aggregate(s), later versions \
                     included: more than one replay takes ({} events, {} aggregates); split it \
                     into shorter ranges",
                    if aggregates > replay::MAX_RANGE_AGGREGATES {
                        format!("more than {}", replay::MAX_RANGE_AGGREGATES)
                    } else {
                        aggregates.to_string()
                    },
                    replay::MAX_RANGE_EVENTS,
                    replay::MAX_RANGE_AGGREGATES
                ),
            )
        };
        if aggregates > replay::MAX_RANGE_AGGREGATES || in_range > replay::MAX_RANGE_EVENTS {
            return Err(too_big(in_range));
        }
        let q = |sql: String| {
            sqlx::query(AssertSqlSafe(self.render(&sql)))
                .bind(types.clone())
                .bind(ids.clone())
                .bind(froms.clone())
        };
        q(replay::range_lock())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        if let Some(held) = q(replay::range_leased())
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?
        {
            let (t, i): (String, String) = (
                held.try_get(0).unwrap_or_default(),
                held.try_get(1).unwrap_or_default(),
            );
            return Err(refuse(
                AdminErrorKind::Refused,
                format!(
                    "a relay holds {t}/{i} right now (it may be publishing a later version): \
                     retry once it settled, in a few seconds"
                ),
            ));
        }
        if let Some(message) = self.replay_cdc_refusal(&mut tx).await.map_err(err)? {
            return Err(refuse(AdminErrorKind::Refused, message));
        }
        let r = q(replay::range_plan())
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
        let (events, gap): (i64, Option<String>) = (|| Ok((r.try_get(0)?, r.try_get(1)?)))()
            .map_err(|e: sqlx::Error| fail(AdminError::sqlx(OP, e)))?;
        if let Some(aggregate) = gap {
            return Err(refuse(
                AdminErrorKind::Refused,
                format!(
                    "beyond the replay horizon: the versions of {aggregate} from its first one in \
                     the range to its newest are not all held (retention or a discard removed \
                     some); replay it alone from a version still held"
                ),
            ));
        }
        if events > replay::MAX_RANGE_EVENTS {
            return Err(too_big(events));
        }
        let plan = RangePlan {
            events,
            in_range,
            aggregates,
            horizon,
            dry_run,
        };
        if let Some(message) = count_changed(expect_events, plan.events) {
            return Err(refuse(AdminErrorKind::Refused, message));
        }
        if dry_run {
            let _ = tx.rollback().await;
            return Ok(plan);
        }
        let changed = q(replay::range_replay()).execute(&mut *tx).await;
        let result = self.replayed(&mut tx, OP, changed, plan.events).await;
        let n = self
            .finish(tx, OP, actor, &selection, reason, result)
            .await?;
        Ok(RangePlan {
            events: i64::try_from(n).unwrap_or(i64::MAX),
            ..plan
        })
    }

    /// Whether a replay may run at all: mark mode, and a reason unless it is a dry run. The
    /// refusal's kind and message otherwise.
    fn replay_allowed(&self, dry_run: bool, reason: &str) -> Result<(), (AdminErrorKind, String)> {
        if self.store.config().on_publish == OnPublish::Delete {
            return Err((
                AdminErrorKind::Refused,
                "the outbox keeps no published events (relay.on_publish = \"delete\"): nothing \
                 can be replayed from it; replay from the broker's retention, or run in mark mode"
                    .into(),
            ));
        }
        if !dry_run && reason.trim().is_empty() {
            return Err((
                AdminErrorKind::InvalidRequest,
                "a replay needs a reason (it is kept in the audit record)".into(),
            ));
        }
        Ok(())
    }

    /// The refusal of a replay while a CDC relay runs, if one does.
    async fn replay_cdc_refusal(
        &self,
        tx: &mut Transaction<'static, Postgres>,
    ) -> Result<Option<String>, sqlx::Error> {
        let cdc: bool = sqlx::query_scalar(AssertSqlSafe(self.render(replay::CDC_RUNNING)))
            .fetch_one(&mut **tx)
            .await?;
        Ok(cdc.then(|| {
            "a CDC relay is running: it streams inserts only, so it would not see the replayed \
             rows and could publish a newer version ahead of them. Stop it and run the polling \
             relay for the replay (docs/guide/src/relay.md, \"CDC relay\")"
                .to_owned()
        }))
    }

    /// A replay's update done: exactly the `planned` rows changed wakes the relays (at commit);
    /// any other count refuses it (the caller rolls back).
    async fn replayed(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        operation: &'static str,
        changed: Result<sqlx::postgres::PgQueryResult, sqlx::Error>,
        planned: i64,
    ) -> Result<u64, AdminError> {
        match changed {
            Ok(r) if i64::try_from(r.rows_affected()) == Ok(planned) => {
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(self.store.schema().wakeup_channel())
                    .bind(crate::schema::RESCAN)
                    .execute(&mut **tx)
                    .await
                    .map(|_| r.rows_affected())
                    .map_err(|e| self.action_error(operation, e))
            }
            Ok(r) => Err(AdminError {
                operation,
                kind: AdminErrorKind::Refused,
                message: format!(
                    "{} row(s) changed where {planned} were planned (retention deleted some \
                     meanwhile): nothing was replayed; dry-run again",
                    r.rows_affected()
                ),
            }),
            Err(e) => Err(self.action_error(operation, e)),
        }
    }

    /// The processes that run a heartbeat (relays, consumers, executors), with their status:
    /// up, late, gone or stopped (`crate::heartbeat`). At most 1,000, by kind and name.
    ///
    /// # Errors
    /// [`AdminError`]: the database's failure.
    pub async fn instances(&self) -> Result<Vec<Instance>, AdminError> {
        trace::rows(
            self.store.pool(),
            self.store.schema(),
            processes::INSTANCES,
            |q| q,
            processes::instance,
        )
        .await
        .map_err(|e| AdminError::sqlx("instances", e))
    }

    /// Per route (the rows' destination, or their aggregate type): pending rows and the oldest
    /// one's age among the oldest `bound` pending rows, dead letters among the oldest `bound`,
    /// and the publishes per minute of the last [`MINUTES`] minutes from the relays'
    /// heartbeats. Two reads through the table's order and the dead rows' index, and one of
    /// the activity table: milliseconds at any backlog.
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for a bound below 1; otherwise the database's
    /// failure.
    pub async fn routes(&self, bound: i64) -> Result<Routes, AdminError> {
        const OP: &str = "routes";
        if bound < 1 {
            return Err(AdminError {
                operation: OP,
                kind: AdminErrorKind::InvalidRequest,
                message: format!("a count bound must be at least 1, not {bound}"),
            });
        }
        let counts = sqlx::query(AssertSqlSafe(
            self.render(&processes::ROUTES.replace("{key}", &crate::sql::route_key(""))),
        ))
        .bind(bound)
        .fetch_all(self.store.pool())
        .await
        .map_err(|e| AdminError::sqlx(OP, e))?;
        let rates = self
            .rates("publish")
            .await
            .map_err(|e| AdminError::sqlx(OP, e))?;
        processes::routes(&counts, &rates, bound).map_err(|e| AdminError::sqlx(OP, e))
    }

    /// Per consumer: its processes up, its lag and the effects it committed per minute over
    /// the last [`MINUTES`] minutes, as its engines report them through their heartbeats
    /// (`crate::heartbeat::Heartbeat::with_consumer`), whether it is paused, its open dead
    /// letters and its conflicts. At most 1,000 consumers, by name.
    ///
    /// # Errors
    /// [`AdminError`]: the database's failure.
    pub async fn consumers(&self) -> Result<Vec<ConsumerView>, AdminError> {
        const OP: &str = "consumers";
        let rows = sqlx::query(AssertSqlSafe(self.render(processes::CONSUMERS)))
            .fetch_all(self.store.pool())
            .await
            .map_err(|e| AdminError::sqlx(OP, e))?;
        let rates = self
            .rates("consume")
            .await
            .map_err(|e| AdminError::sqlx(OP, e))?;
        processes::consumers(&rows, &rates).map_err(|e| AdminError::sqlx(OP, e))
    }

    /// The `kind` activity of the last [`MINUTES`] minutes.
    async fn rates(&self, kind: &str) -> Result<Vec<sqlx::postgres::PgRow>, sqlx::Error> {
        sqlx::query(AssertSqlSafe(self.render(processes::RATES)))
            .bind(i32::try_from(MINUTES).unwrap_or(15))
            .bind(kind)
            .fetch_all(self.store.pool())
            .await
    }

    /// Every pause in force (routes, then consumers), with who paused it and why.
    ///
    /// # Errors
    /// [`AdminError`]: the database's failure.
    pub async fn pauses(&self) -> Result<Vec<Pause>, AdminError> {
        trace::rows(
            self.store.pool(),
            self.store.schema(),
            pauses::LIST,
            |q| q,
            pauses::pause,
        )
        .await
        .map_err(|e| AdminError::sqlx("pauses", e))
    }

    /// Pauses a route or a consumer ([`PauseTarget`]: what each stops, and when),
    /// with the audit record, whose id the pause keeps.
    ///
    /// A route is refused while a CDC relay runs (a heartbeat of `outbox relay --mode cdc`
    /// less than six intervals old): that relay streams the log and does not read pauses, so
    /// the pause would not hold. Stop it, pause, and publish with the polling relay meanwhile.
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` (a malformed route key, or no reason), `Refused`
    /// (paused already, or a CDC relay runs; nothing changed), `PermissionDenied` (the role may
    /// only read), or the database's failure.
    pub async fn pause(
        &self,
        target: &PauseTarget,
        actor: &Actor,
        reason: &str,
    ) -> Result<Pause, AdminError> {
        const OP: &str = "pause";
        let selection = serde_json::to_value(target).unwrap_or_default();
        let fail = |e: AdminError| {
            audit::log(actor, OP, &selection, reason, Err(&e));
            e
        };
        target.check(OP).map_err(fail)?;
        if reason.trim().is_empty() {
            return Err(fail(AdminError {
                operation: OP,
                kind: AdminErrorKind::InvalidRequest,
                message: "a pause needs a reason (it is kept in the audit record and shown with \
                          the pause)"
                    .into(),
            }));
        }
        let mut tx = self.begin(OP, actor, &selection, reason).await?;
        let err = |e| fail(self.action_error(OP, e));
        if matches!(target, PauseTarget::Route(_)) {
            let cdc: bool = sqlx::query_scalar(AssertSqlSafe(self.render(replay::CDC_RUNNING)))
                .fetch_one(&mut *tx)
                .await
                .map_err(err)?;
            if cdc {
                return Err(fail(AdminError {
                    operation: OP,
                    kind: AdminErrorKind::Refused,
                    message: "a CDC relay is running: it streams the log and does not read \
                              pauses, so the route would not stop; stop it first (the polling \
                              relay honours pauses)"
                        .into(),
                }));
            }
        }
        let audit_id = audit::record(
            &mut tx,
            self.store.schema(),
            actor,
            OP,
            &selection,
            reason,
            1,
        )
        .await
        .map_err(err)?;
        let inserted = sqlx::query(AssertSqlSafe(self.render(pauses::INSERT)))
            .bind(target.kind())
            .bind(target.name())
            .bind(audit_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
        if inserted == 0 {
            return Err(fail(AdminError {
                operation: OP,
                kind: AdminErrorKind::Refused,
                message: format!("{} {} is paused already", target.kind(), target.name()),
            }));
        }
        let paused_at = sqlx::query_scalar(AssertSqlSafe(
            self.render("SELECT paused_at FROM {s}.pauses WHERE kind = $1 AND name = $2"),
        ))
        .bind(target.kind())
        .bind(target.name())
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit()
            .await
            .map_err(|e| fail(AdminError::sqlx(OP, e)))?;
        audit::log(actor, OP, &selection, reason, Ok(1));
        Ok(Pause {
            kind: target.kind().to_owned(),
            name: target.name().to_owned(),
            paused_at,
            audit_id,
            actor: Some(actor.name().to_owned()),
            reason: Some(reason.to_owned()),
        })
    }

    /// Resumes a paused route or consumer, with the audit record. A resumed route wakes the
    /// relays at once (their wake-up channel, at commit).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` (a malformed route key), `NotFound` (it is not
    /// paused), `PermissionDenied` (the role may only read), or the database's failure.
    pub async fn resume(
        &self,
        target: &PauseTarget,
        actor: &Actor,
        reason: &str,
    ) -> Result<(), AdminError> {
        const OP: &str = "resume";
        let selection = serde_json::to_value(target).unwrap_or_default();
        if let Err(e) = target.check(OP) {
            audit::log(actor, OP, &selection, reason, Err(&e));
            return Err(e);
        }
        let mut tx = self.begin(OP, actor, &selection, reason).await?;
        let result = match sqlx::query(AssertSqlSafe(self.render(pauses::DELETE)))
            .bind(target.kind())
            .bind(target.name())
            .execute(&mut *tx)
            .await
        {
            Ok(r) if r.rows_affected() == 0 => Err(not_found(
                OP,
                format!("{} {} is not paused", target.kind(), target.name()),
            )),
            Ok(r) => sqlx::query("SELECT pg_notify($1, $2)")
                .bind(self.store.schema().wakeup_channel())
                .bind(crate::schema::RESCAN)
                .execute(&mut *tx)
                .await
                .map(|_| r.rows_affected())
                .map_err(|e| self.action_error(OP, e)),
            Err(e) => Err(self.action_error(OP, e)),
        };
        self.finish(tx, OP, actor, &selection, reason, result)
            .await
            .map(|_| ())
    }

    fn render(&self, template: &str) -> std::sync::Arc<str> {
        self.store.schema().render(template)
    }

    /// An action's error: a missing grant names the operator role's grants.
    fn action_error(&self, operation: &'static str, e: sqlx::Error) -> AdminError {
        let pool = self.store.pool();
        match PermissionDenied::from_sqlx(&e, Some(&pool_role(pool)), Some(Component::Operator)) {
            Some(denied) => AdminError {
                operation,
                kind: AdminErrorKind::PermissionDenied,
                message: denied.to_string(),
            },
            None => AdminError::sqlx(operation, e),
        }
    }

    /// The transaction of an action; a failure to begin it is logged as the action's.
    async fn begin(
        &self,
        operation: &'static str,
        actor: &Actor,
        selection: &serde_json::Value,
        reason: &str,
    ) -> Result<Transaction<'static, Postgres>, AdminError> {
        self.store.pool().begin().await.map_err(|e| {
            let e = AdminError::sqlx(operation, e);
            audit::log(actor, operation, selection, reason, Err(&e));
            e
        })
    }

    /// Ends an action: on success records it and commits, on failure rolls back; logs the
    /// outcome either way. Returns the rows changed.
    async fn finish(
        &self,
        tx: Transaction<'static, Postgres>,
        operation: &'static str,
        actor: &Actor,
        selection: &serde_json::Value,
        reason: &str,
        result: Result<u64, AdminError>,
    ) -> Result<u64, AdminError> {
        self.finish_with(
            tx,
            operation,
            actor,
            selection,
            reason,
            result.map(|n| (n, n)),
        )
        .await
    }

    async fn finish_with<T>(
        &self,
        mut tx: Transaction<'static, Postgres>,
        operation: &'static str,
        actor: &Actor,
        selection: &serde_json::Value,
        reason: &str,
        result: Result<(u64, T), AdminError>,
    ) -> Result<T, AdminError> {
        let result = match result {
            Ok((n, value)) => {
                let recorded = record_and_commit(
                    &mut tx,
                    self.store.schema(),
                    actor,
                    operation,
                    selection,
                    reason,
                    n,
                )
                .await;
                match recorded {
                    Ok(()) => tx
                        .commit()
                        .await
                        .map(|()| (n, value))
                        .map_err(|e| AdminError::sqlx(operation, e)),
                    Err(e) => Err(self.action_error(operation, e)),
                }
            }
            Err(e) => Err(e),
        };
        audit::log(
            actor,
            operation,
            selection,
            reason,
            result.as_ref().map(|(n, _)| *n),
        );
        result.map(|(_, value)| value)
    }
}

/// Consumer dead-letter states a list shows: not resolved.
const OPEN_STATES: &str = "'dead', 'requeued'";

async fn record_and_commit(
    conn: &mut PgConnection,
    schema: &crate::schema::Schema,
    actor: &Actor,
    operation: &str,
    selection: &serde_json::Value,
    reason: &str,
    affected: u64,
) -> Result<(), sqlx::Error> {
    audit::record(conn, schema, actor, operation, selection, reason, affected)
        .await
        .map(|_| ())
}

fn conflict_view(r: &sqlx::postgres::PgRow) -> Result<ConflictView, sqlx::Error> {
    Ok(ConflictView {
        id: r.try_get(0)?,
        consumer_name: r.try_get(1)?,
        event_id: r.try_get(2)?,
        stored_sha256: hex::encode(r.try_get::<Vec<u8>, _>(3)?),
        received_sha256: hex::encode(r.try_get::<Vec<u8>, _>(4)?),
        aggregate_type: r.try_get(5)?,
        aggregate_id: r.try_get(6)?,
        aggregate_version: r.try_get(7)?,
        event_type: r.try_get(8)?,
        occurrences: r.try_get(9)?,
        first_seen: r.try_get(10)?,
        last_seen: r.try_get(11)?,
        resolved_at: r.try_get(12)?,
        resolved_by: r.try_get(13)?,
        resolution_reason: r.try_get(14)?,
    })
}

/// The refusal of a replay whose count is no longer the dry run's `expected`.
fn count_changed(expected: Option<i64>, events: i64) -> Option<String> {
    expected.filter(|e| *e != events).map(|expected| {
        format!("the replay would now take {events} event(s), not the {expected} expected: dry-run again")
    })
}

fn not_found(operation: &'static str, message: String) -> AdminError {
    AdminError {
        operation,
        kind: AdminErrorKind::NotFound,
        message,
    }
}

fn require_reason(operation: &'static str, reason: &str) -> Result<(), AdminError> {
    if reason.trim().is_empty() {
        Err(AdminError {
            operation,
            kind: AdminErrorKind::InvalidRequest,
            message: format!("{operation} needs a reason (it is kept in the audit record)"),
        })
    } else {
        Ok(())
    }
}

fn check_limit(operation: &'static str, limit: i64) -> Result<(), AdminError> {
    if (1..=MAX_LIST).contains(&limit) {
        Ok(())
    } else {
        Err(AdminError {
            operation,
            kind: AdminErrorKind::InvalidRequest,
            message: format!("limit must be between 1 and {MAX_LIST}, not {limit}"),
        })
    }
}
