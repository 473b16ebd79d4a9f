//! The operator's reads and actions, in one place: `outbox status` and `outbox dead-letters`
//! read and act through [`Admin`], and so does the web console (`outbox-console`), so the two
//! never disagree about a number or about what an action does.
//!
//! Every read here is one statement through the table's indexes or its partial indexes of
//! open rows, except where a method says otherwise; nothing here holds a lock beyond its own
//! statement. Actions are the store's own (a requeue is [`OutboxStore::dead_letter_requeue`], which
//! also wakes the relays); this module adds no second way of doing them.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), outbox_postgres::admin::AdminError> {
//! use outbox_postgres::admin::{Admin, Requeue};
//! use outbox_postgres::{PgStore, PgStoreConfig};
//! let admin = Admin::new(PgStore::new(pool, PgStoreConfig::default()));
//! let overview = admin.overview().await?;
//! if overview.dead_letters > 0 {
//!     let requeued = admin.requeue_dead_letters(Requeue::All).await?;
//!     println!("requeued {requeued}");
//! }
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use outbox_core::consumer::ConsumerDeadLetter;
use outbox_core::{
    DeadLetter, DeadLetterListParams, EventId, OutboxStats, OutboxStore, RequeueParams, StoreError,
    StoreErrorKind,
};
use serde::Serialize;
use sqlx::AssertSqlSafe;

use crate::effects::{EffectsError, EffectsStats, Resolution, WorkItemRow};
use crate::roles::{Component, PermissionDenied, pool_role};
use crate::store::{OnPublish, PgStore, stats_from_row};

/// Open consumer dead letters (not resolved; requeued ones count until the consumer settles
/// them), as `outbox status` has always counted them.
const COUNT_CONSUMER_DEAD: &str =
    "SELECT count(*) FROM {s}.consumer_dead_letters WHERE state <> 'resolved'";

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
}

/// Which outbox dead letters to requeue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    /// These event ids (ids that are not dead letters are skipped, and not counted).
    Ids(Vec<EventId>),
    /// Every dead letter.
    All,
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

    /// Outbox dead letters, oldest first, at most `limit` (1 to [`MAX_LIST`]).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// database's failure.
    pub async fn dead_letters(&self, limit: i64) -> Result<Vec<DeadLetter>, AdminError> {
        check_limit("dead letters", limit)?;
        self.store
            .dead_letter_list(DeadLetterListParams { limit })
            .await
            .map_err(|e| AdminError::store("dead letters", e))
    }

    /// Requeues outbox dead letters under their own event ids (the relay publishes them again,
    /// then the events of their aggregates that waited behind them). Returns how many were
    /// requeued.
    ///
    /// # Errors
    /// [`AdminError`] of kind `PermissionDenied` when the role may only read; otherwise the
    /// database's failure (nothing was requeued).
    pub async fn requeue_dead_letters(&self, which: Requeue) -> Result<u64, AdminError> {
        let params = RequeueParams {
            event_ids: match which {
                Requeue::Ids(ids) => Some(ids),
                Requeue::All => None,
            },
        };
        self.store
            .dead_letter_requeue(params)
            .await
            .map_err(|e| AdminError::store("requeue", e))
    }

    /// Inbox conflicts, newest first, at most `limit` (1 to [`MAX_LIST`]).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// database's failure.
    pub async fn conflicts(&self, limit: i64) -> Result<Vec<ConflictView>, AdminError> {
        check_limit("conflicts", limit)?;
        let list = self
            .store
            .inbox()
            .conflicts(self.store.pool(), limit)
            .await
            .map_err(|e| AdminError::sqlx("conflicts", e))?;
        Ok(list
            .into_iter()
            .map(|c| ConflictView {
                consumer_name: c.consumer_name,
                event_id: c.event_id,
                stored_sha256: c.stored.to_hex(),
                received_sha256: c.received.to_hex(),
                aggregate_type: c.aggregate_type,
                aggregate_id: c.aggregate_id,
                aggregate_version: c.aggregate_version,
                event_type: c.event_type,
                occurrences: c.occurrences,
                first_seen: c.first_seen,
                last_seen: c.last_seen,
            })
            .collect())
    }

    /// Consumer dead letters not resolved, oldest first, of `consumer` or of all consumers,
    /// at most `limit` (1 to [`MAX_LIST`]).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// database's failure.
    pub async fn consumer_dead_letters(
        &self,
        consumer: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ConsumerDeadLetter>, AdminError> {
        check_limit("consumer dead letters", limit)?;
        crate::consumer::consumer_dead_letter_list(
            self.store.pool(),
            self.store.schema(),
            consumer,
            limit,
        )
        .await
        .map_err(|e| AdminError::sqlx("consumer dead letters", e))
    }

    /// Marks consumer dead letters (these ids, or every open one) of `consumer` (or of every
    /// consumer) for their consumer to apply again through its inbox. Returns how many.
    ///
    /// # Errors
    /// [`AdminError`] of kind `PermissionDenied` (naming the operator grants) when the role may
    /// only read; otherwise the database's failure (nothing was requeued).
    pub async fn requeue_consumer_dead_letters(
        &self,
        consumer: Option<&str>,
        ids: Option<&[i64]>,
    ) -> Result<u64, AdminError> {
        crate::consumer::consumer_dead_letter_requeue(
            self.store.pool(),
            self.store.schema(),
            consumer,
            ids,
        )
        .await
        .map_err(|e| {
            let pool = self.store.pool();
            match PermissionDenied::from_sqlx(&e, Some(&pool_role(pool)), Some(Component::Operator))
            {
                Some(denied) => AdminError {
                    operation: "requeue consumer dead letters",
                    kind: AdminErrorKind::PermissionDenied,
                    message: denied.to_string(),
                },
                None => AdminError::sqlx("requeue consumer dead letters", e),
            }
        })
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

    /// Settles a work item by hand, or sends it again ([`Resolution`]); returns the row as it
    /// is now.
    ///
    /// # Errors
    /// [`AdminError`] of kind `NotFound` (no such item), `Refused` (its state does not allow
    /// this resolution; nothing changed), `PermissionDenied` (the role may only read), or the
    /// database's failure.
    pub async fn resolve_work_item(
        &self,
        id: i64,
        resolution: Resolution,
    ) -> Result<WorkItemRow, AdminError> {
        self.store
            .effects()
            .resolve(self.store.pool(), id, resolution)
            .await
            .map_err(|e| AdminError::effects("resolve work item", e))
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
