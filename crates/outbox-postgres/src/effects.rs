//! Remote effects on PostgreSQL: the durable work-item table, the enqueue on the consumer's
//! transaction, the operator functions, and [`PgStore`] as the core's [`WorkItemStore`], so the
//! core's [`Executor`](outbox_core::effect::Executor) runs on it.
//!
//! The provider-facing contract ([`outbox_core::RemoteEffect`]) and the executor live in
//! [`outbox_core::effect`]; read its module docs first for the path of one effect and the
//! guarantees.
//!
//! * **Enqueue** ([`PgEffects::enqueue`]) in the consumer's own inbox transaction: one work item
//!   with a stable idempotency key ([`idempotency_key`]), so a rolled-back consumer leaves no
//!   item and a redelivered event maps to the same key (`AlreadyPresent`). The same key with a
//!   different payload is a loud [`EffectsError::KeyConflict`], never a silent second item.
//! * **Claims** take due items with `FOR UPDATE SKIP LOCKED`, set a fresh `lease_token` from the
//!   schema's sequence and `lease_until = now() + lease`; records are fenced by
//!   `WHERE id = .. AND lease_token = .. AND state = ..`.
//! * Operators see the backlog with [`PgEffects::stats`] / [`PgEffects::list`] and settle parked
//!   items with [`PgEffects::resolve`]. Old `succeeded` items are deleted by the elected
//!   maintainer ([`outbox_core::maintenance::MaintenanceConfig::work_items_keep`]).

use std::sync::Arc;
use std::time::Duration;

use outbox_core::effect::{
    ClaimPurpose, ClaimedWorkItem, WorkItemClaimParams, WorkItemRecordParams, WorkItemStore,
    WorkItemUpdate, metric,
};
pub use outbox_core::effect::{EffectsStats, NewWorkItem, WorkItemState, idempotency_key};
pub use outbox_core::operator::{Resolution, WorkItemRow};
use outbox_core::{LeaseToken, StoreError, WorkItem};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};
use tracing::warn;

use crate::error::store_error;
use crate::permission::{Component, PermissionDenied, pool_role};
use crate::schema::Schema;
use crate::store::PgStore;

/// Why an effects operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EffectsError {
    /// Connection or SQL failure. The failed statement changed nothing; retry later. Inside a
    /// caller's transaction, PostgreSQL has aborted that transaction: roll it back.
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// The `work_items` table (or the schema) does not exist: run the migrations
    /// ([`crate::migrate()`]) of this release first.
    #[error("work-item table missing, run the migrations: {detail}")]
    NotMigrated {
        /// The database's message.
        detail: String,
    },
    /// The idempotency key is already used by a work item with a different kind or payload: a
    /// bug or a key collision in the consumer. Nothing was written; the caller's transaction
    /// should roll back so that the event is not acknowledged as handled.
    #[error(
        "idempotency key `{key}` already names work item {existing_id} (kind `{existing_kind}`) with a different payload"
    )]
    KeyConflict {
        /// The key.
        key: String,
        /// The item that holds the key.
        existing_id: i64,
        /// Its kind.
        existing_kind: String,
    },
    /// An argument (a work-item field or a state filter) is out of range; `name` names it.
    #[error("invalid `{name}`: {reason}")]
    InvalidArgument {
        /// The argument or field.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// [`PgEffects::resolve`] does not apply to an item in this state (only `unknown` items can
    /// be settled by hand, and `unknown` or `failed` ones resent). Nothing was changed.
    #[error("work item {id} is `{state}`: {resolution} is not allowed from this state")]
    NotResolvable {
        /// The item.
        id: i64,
        /// Its current state.
        state: String,
        /// The resolution that was refused.
        resolution: &'static str,
    },
    /// No work item has this id.
    #[error("work item {id} does not exist")]
    NotFound {
        /// The id.
        id: i64,
    },
    /// The connected role lacks a grant for this operation (SQLSTATE 42501): the message
    /// names the component whose grants it needs.
    #[error("{0}")]
    PermissionDenied(PermissionDenied),
}

impl EffectsError {
    /// Whether trying again later may succeed (database errors); the others need a fix.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Database(_))
    }
}

impl EffectsError {
    /// `e`, naming the role (when known) and the `component` whose grants the statement
    /// needs if the database refused it for lack of a privilege.
    fn denied(e: sqlx::Error, role: Option<String>, component: Component) -> Self {
        match Self::from(e) {
            Self::PermissionDenied(p) => Self::PermissionDenied(PermissionDenied {
                role,
                component: Some(component),
                ..p
            }),
            other => other,
        }
    }
}

impl From<sqlx::Error> for EffectsError {
    fn from(e: sqlx::Error) -> Self {
        if let Some(p) = PermissionDenied::from_sqlx(&e, None, None) {
            return Self::PermissionDenied(p);
        }
        // 42P01 undefined_table, 3F000 invalid_schema_name.
        if let Some(db) = e.as_database_error()
            && matches!(db.code().as_deref(), Some("42P01" | "3F000"))
        {
            return Self::NotMigrated {
                detail: db.message().to_owned(),
            };
        }
        Self::Database(e)
    }
}

/// What [`PgEffects::enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// A new work item was written (visible to executors once the caller commits).
    Inserted {
        /// Its id.
        id: i64,
    },
    /// An item with this key and the same kind and payload already exists (a redelivery):
    /// nothing was written.
    AlreadyPresent {
        /// The existing item's id.
        id: i64,
    },
}

const ROW_COLUMNS: &str = "id, kind, idempotency_key, payload, payload_sha256, event_id, \
    consumer_name, state, attempts, lookups, lease_token, lease_until, next_attempt_at, \
    unknown_since, reference, last_error, created_at, updated_at, resolved_at";

/// Columns of a claimed item, read by `claimed_from_row`.
const CLAIM_RETURNING: &str = "RETURNING w.id, w.kind, w.idempotency_key, w.payload, \
    w.event_id, w.attempts, w.lookups, w.created_at, w.lease_token";

const INSERT: &str = "INSERT INTO {s}.work_items (kind, idempotency_key, payload, event_id, \
    consumer_name) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (idempotency_key) DO NOTHING \
    RETURNING id";

const SELECT_BY_KEY: &str = "SELECT id, kind, kind = $2 AND payload_sha256 = \
    sha256(jsonb_send($3::jsonb)) FROM {s}.work_items WHERE idempotency_key = $1";

const STATS: &str = "SELECT count(*) FILTER (WHERE state = 'pending'), \
    count(*) FILTER (WHERE state = 'in_progress'), count(*) FILTER (WHERE state = 'unknown'), \
    count(*) FILTER (WHERE state = 'succeeded'), count(*) FILTER (WHERE state = 'failed'), \
    extract(epoch FROM now() - min(unknown_since) FILTER (WHERE state = 'unknown'))::float8, \
    extract(epoch FROM now() - min(created_at) FILTER (WHERE state = 'pending'))::float8 \
    FROM {s}.work_items WHERE ($1::text IS NULL OR kind = $1)";

/// The open part of [`STATS`], one subquery per state so that each reads only its partial
/// index: cheap however many settled items the table keeps.
const BACKLOG: &str = "SELECT \
    (SELECT count(*) FROM {s}.work_items WHERE state = 'pending' AND ($1::text IS NULL OR kind = $1)), \
    (SELECT count(*) FROM {s}.work_items WHERE state = 'in_progress' AND ($1::text IS NULL OR kind = $1)), \
    (SELECT count(*) FROM {s}.work_items WHERE state = 'unknown' AND ($1::text IS NULL OR kind = $1)), \
    (SELECT extract(epoch FROM now() - min(unknown_since))::float8 FROM {s}.work_items \
        WHERE state = 'unknown' AND ($1::text IS NULL OR kind = $1)), \
    (SELECT extract(epoch FROM now() - min(created_at))::float8 FROM {s}.work_items \
        WHERE state = 'pending' AND ($1::text IS NULL OR kind = $1))";

const LIST: &str = "SELECT {cols} FROM {s}.work_items WHERE ($1::text IS NULL OR state = $1) \
    ORDER BY id LIMIT $2";

const SELECT_STATE: &str = "SELECT state FROM {s}.work_items WHERE id = $1";

const RESOLVE_SUCCEEDED: &str = "UPDATE {s}.work_items SET state = 'succeeded', \
    reference = $2, lease_token = NULL, lease_until = NULL, resolved_at = now(), \
    updated_at = now() WHERE id = $1 AND state = 'unknown' RETURNING {cols}";

const RESOLVE_FAILED: &str = "UPDATE {s}.work_items SET state = 'failed', last_error = $2, \
    lease_token = NULL, lease_until = NULL, resolved_at = now(), updated_at = now() \
    WHERE id = $1 AND state = 'unknown' RETURNING {cols}";

const RESOLVE_RESEND: &str = "UPDATE {s}.work_items SET state = 'pending', \
    last_error = 'resend requested by an operator', next_attempt_at = now(), \
    unknown_since = NULL, lease_token = NULL, lease_until = NULL, resolved_at = NULL, \
    updated_at = now() WHERE id = $1 AND state IN ('unknown', 'failed') RETURNING {cols}";

const CLAIM_CALLS: &str = "UPDATE {s}.work_items w SET state = 'in_progress', \
    attempts = w.attempts + 1, lease_token = nextval('{s}.lease_token_seq'), \
    lease_until = now() + make_interval(secs => $3), updated_at = now() \
    FROM (SELECT id FROM {s}.work_items WHERE kind = $1 AND state = 'pending' \
          AND next_attempt_at <= now() ORDER BY next_attempt_at, id LIMIT $2 \
          FOR UPDATE SKIP LOCKED) c \
    WHERE w.id = c.id {returning}";

const CLAIM_LOOKUPS: &str = "UPDATE {s}.work_items w SET \
    lease_token = nextval('{s}.lease_token_seq'), \
    lease_until = now() + make_interval(secs => $3), updated_at = now() \
    FROM (SELECT id FROM {s}.work_items WHERE kind = $1 AND state = 'unknown' \
          AND next_attempt_at <= now() AND (lease_until IS NULL OR lease_until < now()) \
          ORDER BY next_attempt_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) c \
    WHERE w.id = c.id {returning}";

const EXPIRE: &str = "UPDATE {s}.work_items SET state = 'unknown', unknown_since = now(), \
    next_attempt_at = now() + make_interval(secs => $2), lease_token = NULL, \
    lease_until = NULL, last_error = $3, updated_at = now() \
    WHERE kind = $1 AND state = 'in_progress' AND lease_until < now() RETURNING id";

/// Fenced writes of a call or lookup result: `$1` id, `$2` lease token, `$3` the state the
/// lease was taken in, `$4` reference or reason, `$5` lookups to add, `$6` delay in seconds.
const FENCE: &str = "WHERE id = $1 AND lease_token = $2 AND state = $3";

const SET_SUCCEEDED: &str = "UPDATE {s}.work_items SET state = 'succeeded', reference = $4, \
    lookups = lookups + $5, lease_token = NULL, lease_until = NULL, unknown_since = NULL, \
    resolved_at = now(), updated_at = now() {fence}";

const SET_FAILED: &str = "UPDATE {s}.work_items SET state = 'failed', last_error = $4, \
    lookups = lookups + $5, lease_token = NULL, lease_until = NULL, unknown_since = NULL, \
    resolved_at = now(), updated_at = now() {fence}";

const SET_PENDING: &str = "UPDATE {s}.work_items SET state = 'pending', last_error = $4, \
    lookups = lookups + $5, next_attempt_at = now() + make_interval(secs => $6), \
    lease_token = NULL, lease_until = NULL, unknown_since = NULL, updated_at = now() {fence}";

const SET_UNKNOWN: &str = "UPDATE {s}.work_items SET state = 'unknown', last_error = $4, \
    lookups = lookups + $5, next_attempt_at = now() + make_interval(secs => $6), \
    unknown_since = coalesce(unknown_since, now()), lease_token = NULL, lease_until = NULL, \
    updated_at = now() {fence}";

/// The statements, rendered once for a schema.
#[derive(Debug)]
struct Statements {
    insert: Arc<str>,
    select_by_key: Arc<str>,
    stats: Arc<str>,
    backlog: Arc<str>,
    list: Arc<str>,
    select_state: Arc<str>,
    resolve_succeeded: Arc<str>,
    resolve_failed: Arc<str>,
    resolve_resend: Arc<str>,
    claim_calls: Arc<str>,
    claim_lookups: Arc<str>,
    expire: Arc<str>,
    set_succeeded: Arc<str>,
    set_failed: Arc<str>,
    set_pending: Arc<str>,
    set_unknown: Arc<str>,
}

impl Statements {
    fn new(schema: &Schema) -> Self {
        let r = |t: &str| {
            schema.render(
                &t.replace("{cols}", ROW_COLUMNS)
                    .replace("{returning}", CLAIM_RETURNING)
                    .replace("{fence}", FENCE),
            )
        };
        Self {
            insert: r(INSERT),
            select_by_key: r(SELECT_BY_KEY),
            stats: r(STATS),
            backlog: r(BACKLOG),
            list: r(LIST),
            select_state: r(SELECT_STATE),
            resolve_succeeded: r(RESOLVE_SUCCEEDED),
            resolve_failed: r(RESOLVE_FAILED),
            resolve_resend: r(RESOLVE_RESEND),
            claim_calls: r(CLAIM_CALLS),
            claim_lookups: r(CLAIM_LOOKUPS),
            expire: r(EXPIRE),
            set_succeeded: r(SET_SUCCEEDED),
            set_failed: r(SET_FAILED),
            set_pending: r(SET_PENDING),
            set_unknown: r(SET_UNKNOWN),
        }
    }
}

pub(crate) fn row_to_item(r: &PgRow) -> Result<WorkItemRow, sqlx::Error> {
    Ok(WorkItemRow {
        id: r.try_get("id")?,
        kind: r.try_get("kind")?,
        idempotency_key: r.try_get("idempotency_key")?,
        payload: r.try_get("payload")?,
        payload_sha256: r.try_get("payload_sha256")?,
        event_id: r.try_get("event_id")?,
        consumer_name: r.try_get("consumer_name")?,
        state: r.try_get("state")?,
        attempts: r.try_get("attempts")?,
        lookups: r.try_get("lookups")?,
        lease_token: r.try_get("lease_token")?,
        lease_until: r.try_get("lease_until")?,
        next_attempt_at: r.try_get("next_attempt_at")?,
        unknown_since: r.try_get("unknown_since")?,
        reference: r.try_get("reference")?,
        last_error: r.try_get("last_error")?,
        created_at: r.try_get("created_at")?,
        updated_at: r.try_get("updated_at")?,
        resolved_at: r.try_get("resolved_at")?,
    })
}

fn age(seconds: Option<f64>) -> Option<Duration> {
    seconds.map(|s| Duration::from_secs_f64(s.max(0.0)))
}

/// The work-item store: enqueue on the caller's transaction, and the operator functions.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgEffects {
    schema: Schema,
    sql: Arc<Statements>,
}

impl PgEffects {
    /// The store for the (migrated) `schema`.
    pub fn new(schema: Schema) -> Self {
        let sql = Arc::new(Statements::new(&schema));
        Self { schema, sql }
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Writes `item` on `conn`, meant to be the consumer's open inbox transaction
    /// (`&mut *tx`), so the item exists exactly when the consumer's commit does.
    ///
    /// A key that already exists with the same kind and payload (compared by the SHA-256 of
    /// the canonical jsonb form, so key order and spacing do not matter) is a redelivery:
    /// [`EnqueueOutcome::AlreadyPresent`], nothing written.
    ///
    /// # Transactions and locks
    /// The insert is `ON CONFLICT DO NOTHING`: while another open transaction holds an
    /// uncommitted item with the same key, this call waits for it to finish.
    ///
    /// # Errors
    /// * [`EffectsError::KeyConflict`]: the key names an item with another kind or payload
    ///   (also counted in [`metric::KEY_CONFLICTS`]). Roll back.
    /// * [`EffectsError::InvalidArgument`]: empty or oversized kind or key.
    /// * [`EffectsError::PermissionDenied`]: the role lacks the consumer grants.
    /// * [`EffectsError::NotMigrated`], [`EffectsError::Database`]: the transaction is aborted.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        item: &NewWorkItem,
    ) -> Result<EnqueueOutcome, EffectsError> {
        item.validate().map_err(|e| EffectsError::InvalidArgument {
            name: e.field,
            reason: e.reason,
        })?;
        let inserted: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.sql.insert)))
            .bind(&item.kind)
            .bind(&item.idempotency_key)
            .bind(&item.payload)
            .bind(item.event_id)
            .bind(item.consumer_name.as_deref())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| EffectsError::denied(e, None, Component::Consumer))?;
        if let Some(id) = inserted {
            return Ok(EnqueueOutcome::Inserted { id });
        }
        let (id, existing_kind, same): (i64, String, bool) =
            sqlx::query_as(AssertSqlSafe(Arc::clone(&self.sql.select_by_key)))
                .bind(&item.idempotency_key)
                .bind(&item.kind)
                .bind(&item.payload)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| EffectsError::denied(e, None, Component::Consumer))?;
        if same {
            Ok(EnqueueOutcome::AlreadyPresent { id })
        } else {
            metrics::counter!(metric::KEY_CONFLICTS, "kind" => item.kind.clone()).increment(1);
            warn!(
                key = %item.idempotency_key,
                existing_id = id,
                "work-item idempotency key reused with a different payload"
            );
            Err(EffectsError::KeyConflict {
                key: item.idempotency_key.clone(),
                existing_id: id,
                existing_kind,
            })
        }
    }

    /// Counts per state and the oldest unknown / pending ages, for `kind` or for all kinds.
    /// Counting the settled states reads the whole table; the executor's gauges use the cheap
    /// [`Self::backlog`] instead.
    ///
    /// # Errors
    /// [`EffectsError::PermissionDenied`] (the role lacks the reader grants),
    /// [`EffectsError::NotMigrated`] or [`EffectsError::Database`].
    pub async fn stats(
        &self,
        pool: &PgPool,
        kind: Option<&str>,
    ) -> Result<EffectsStats, EffectsError> {
        let r = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.stats)))
            .bind(kind)
            .fetch_one(pool)
            .await
            .map_err(|e| EffectsError::denied(e, Some(pool_role(pool)), Component::Reader))?;
        Ok(EffectsStats {
            pending: r.try_get(0)?,
            in_progress: r.try_get(1)?,
            unknown: r.try_get(2)?,
            succeeded: r.try_get(3)?,
            failed: r.try_get(4)?,
            oldest_unknown_age: age(r.try_get(5)?),
            oldest_pending_age: age(r.try_get(6)?),
        })
    }

    /// The open states only (pending, in progress, unknown, with the oldest unknown and pending
    /// ages); `succeeded` and `failed` are 0. Reads only the partial indexes of open items, so
    /// its cost does not grow with the settled history. The executor refreshes its gauges from
    /// this.
    ///
    /// # Errors
    /// [`EffectsError::NotMigrated`] or [`EffectsError::Database`].
    pub async fn backlog(
        &self,
        pool: &PgPool,
        kind: Option<&str>,
    ) -> Result<EffectsStats, EffectsError> {
        let r = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.backlog)))
            .bind(kind)
            .fetch_one(pool)
            .await?;
        Ok(stats_from_backlog(&r)?)
    }

    /// Lists up to `limit` items, oldest first, optionally only those in `state` (a
    /// [`WorkItemState`] name).
    ///
    /// # Errors
    /// [`EffectsError::InvalidArgument`] for an unknown state name or a negative limit;
    /// [`EffectsError::PermissionDenied`] (the role lacks the reader grants),
    /// [`EffectsError::NotMigrated`] or [`EffectsError::Database`].
    pub async fn list(
        &self,
        pool: &PgPool,
        state: Option<&str>,
        limit: i64,
    ) -> Result<Vec<WorkItemRow>, EffectsError> {
        if let Some(s) = state
            && WorkItemState::parse(s).is_none()
        {
            let names: Vec<&str> = WorkItemState::ALL.iter().map(|s| s.as_str()).collect();
            return Err(EffectsError::InvalidArgument {
                name: "state",
                reason: format!("`{s}` is not one of {}", names.join(", ")),
            });
        }
        if limit < 0 {
            return Err(EffectsError::InvalidArgument {
                name: "limit",
                reason: "must not be negative".to_owned(),
            });
        }
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.list)))
            .bind(state)
            .bind(limit)
            .fetch_all(pool)
            .await
            .map_err(|e| EffectsError::denied(e, Some(pool_role(pool)), Component::Reader))?;
        Ok(rows.iter().map(row_to_item).collect::<Result<_, _>>()?)
    }

    /// Settles item `id` by hand and returns it as it is now. `Succeeded` and `Failed` apply
    /// only to `unknown` items; `Resend` to `unknown` and `failed` ones (the next call uses the
    /// same key). Clearing the lease fences off a lookup in flight: its answer is dropped.
    ///
    /// Resend keeps `attempts`; since the not-sent limit counts all attempts, a resent item
    /// that had reached it fails again on its next `NotSent` answer.
    ///
    /// # Errors
    /// * [`EffectsError::NotFound`]: no item `id`.
    /// * [`EffectsError::NotResolvable`]: the item is in a state this resolution does not
    ///   apply to (e.g. `pending`, `in_progress`, or already `succeeded`); nothing changed.
    /// * [`EffectsError::PermissionDenied`]: the role lacks the operator grants.
    /// * [`EffectsError::NotMigrated`] or [`EffectsError::Database`].
    pub async fn resolve(
        &self,
        pool: &PgPool,
        id: i64,
        resolution: Resolution,
    ) -> Result<WorkItemRow, EffectsError> {
        let mut conn = pool.acquire().await?;
        self.resolve_in(&mut conn, &pool_role(pool), id, resolution)
            .await
    }

    /// [`resolve`](Self::resolve) on `conn` (an operator's transaction), `role` being the
    /// role it acts as, for a missing grant's message.
    pub(crate) async fn resolve_in(
        &self,
        conn: &mut sqlx::PgConnection,
        role: &str,
        id: i64,
        resolution: Resolution,
    ) -> Result<WorkItemRow, EffectsError> {
        let query = match &resolution {
            Resolution::Succeeded { reference } => {
                sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.resolve_succeeded)))
                    .bind(id)
                    .bind(reference.clone())
            }
            Resolution::Failed { reason } => {
                sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.resolve_failed)))
                    .bind(id)
                    .bind(reason.clone())
            }
            Resolution::Resend => {
                sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.resolve_resend))).bind(id)
            }
        };
        let row = query
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| EffectsError::denied(e, Some(role.to_owned()), Component::Operator))?;
        if let Some(row) = row {
            return Ok(row_to_item(&row)?);
        }
        let state: Option<String> =
            sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.sql.select_state)))
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?;
        match state {
            None => Err(EffectsError::NotFound { id }),
            Some(state) => Err(EffectsError::NotResolvable {
                id,
                state,
                resolution: resolution.name(),
            }),
        }
    }
}

fn claimed_from_row(r: &PgRow) -> Result<ClaimedWorkItem, sqlx::Error> {
    Ok(ClaimedWorkItem {
        item: WorkItem {
            id: r.try_get("id")?,
            kind: r.try_get("kind")?,
            idempotency_key: r.try_get("idempotency_key")?,
            payload: r.try_get("payload")?,
            event_id: r.try_get("event_id")?,
            attempts: r.try_get("attempts")?,
            created_at: r.try_get("created_at")?,
        },
        lookups: r.try_get("lookups")?,
        token: LeaseToken(r.try_get("lease_token")?),
    })
}

fn stats_from_backlog(r: &PgRow) -> Result<EffectsStats, sqlx::Error> {
    Ok(EffectsStats {
        pending: r.try_get(0)?,
        in_progress: r.try_get(1)?,
        unknown: r.try_get(2)?,
        succeeded: 0,
        failed: 0,
        oldest_unknown_age: age(r.try_get(3)?),
        oldest_pending_age: age(r.try_get(4)?),
    })
}

impl WorkItemStore for PgStore {
    async fn work_item_expire<'a>(
        &'a self,
        kind: &'a str,
        reconcile_after: Duration,
        reason: &'a str,
    ) -> Result<Vec<i64>, StoreError> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.effects().sql.expire)))
            .bind(kind)
            .bind(reconcile_after.as_secs_f64())
            .bind(reason)
            .fetch_all(self.pool())
            .await
            .map_err(self.err(Component::Executor, "work items: expire leases"))
    }

    async fn work_item_claim<'a>(
        &'a self,
        params: WorkItemClaimParams<'a>,
    ) -> Result<Vec<ClaimedWorkItem>, StoreError> {
        let sql = match params.purpose {
            ClaimPurpose::Call => &self.effects().sql.claim_calls,
            ClaimPurpose::Lookup => &self.effects().sql.claim_lookups,
        };
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(sql)))
            .bind(params.kind)
            .bind(i64::try_from(params.limit).unwrap_or(i64::MAX))
            .bind(params.lease.as_secs_f64())
            .fetch_all(self.pool())
            .await
            .map_err(self.err(Component::Executor, "work items: claim"))?;
        rows.iter()
            .map(claimed_from_row)
            .collect::<Result<_, _>>()
            .map_err(|e| store_error("work items: claim: decoding", e))
    }

    async fn work_item_record<'a>(
        &'a self,
        params: WorkItemRecordParams<'a>,
    ) -> Result<bool, StoreError> {
        let sql = &self.effects().sql;
        let (statement, text, delay) = match params.update {
            WorkItemUpdate::Succeeded { reference } => (&sql.set_succeeded, reference, None),
            WorkItemUpdate::Failed { reason } => (&sql.set_failed, reason, None),
            WorkItemUpdate::Pending { reason, delay } => (&sql.set_pending, reason, Some(*delay)),
            WorkItemUpdate::Unknown { reason, delay } => (&sql.set_unknown, reason, Some(*delay)),
        };
        let mut query = sqlx::query(AssertSqlSafe(Arc::clone(statement)))
            .bind(params.id)
            .bind(params.token.0)
            .bind(params.claimed_in.as_str())
            .bind(text.as_str())
            .bind(params.lookups_add);
        if let Some(delay) = delay {
            query = query.bind(delay.as_secs_f64());
        }
        let done = query
            .execute(self.pool())
            .await
            .map_err(self.err(Component::Executor, "work items: record"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn work_item_backlog<'a>(
        &'a self,
        kind: Option<&'a str>,
    ) -> Result<EffectsStats, StoreError> {
        let r = sqlx::query(AssertSqlSafe(Arc::clone(&self.effects().sql.backlog)))
            .bind(kind)
            .fetch_one(self.pool())
            .await
            .map_err(self.err(Component::Executor, "work items: backlog"))?;
        stats_from_backlog(&r).map_err(|e| store_error("work items: backlog: decoding", e))
    }
}
