//! Remote effects on PostgreSQL: the durable work-item table, the executor that calls the
//! provider, and reconciliation of unknown outcomes.
//!
//! The provider-facing contract ([`RemoteEffect`], [`CallOutcome`], [`LookupOutcome`]) lives in
//! [`outbox_core::effect`]; read its module docs first. This module is the store and the engine.
//!
//! # The path of one effect
//!
//! 1. **Enqueue** ([`PgEffects::enqueue`]) in the consumer's own inbox transaction: one work item
//!    with a stable idempotency key ([`idempotency_key`]), so a rolled-back consumer leaves no
//!    item and a redelivered event maps to the same key (`AlreadyPresent`). The same key with a
//!    different payload is a loud [`EffectsError::KeyConflict`], never a silent second item.
//! 2. **Claim**: an [`Executor`] takes due `pending` items of its kind (`FOR UPDATE SKIP
//!    LOCKED`), sets them `in_progress` with `attempts + 1`, a fresh `lease_token` and
//!    `lease_until = now() + lease`.
//! 3. **Call** the provider under `call_timeout`; a timeout is [`CallOutcome::Unknown`]. Calls of
//!    one batch run concurrently (up to `concurrency`); each item is recorded as soon as its own
//!    call returns.
//! 4. **Record**, fenced by the lease token (`WHERE id = .. AND lease_token = .. AND state =
//!    'in_progress'`): `Succeeded` → `succeeded` with the provider's reference; `Failed` →
//!    `failed`; `NotSent` → back to `pending` with `retry_backoff` (or `failed` once `attempts`
//!    reaches `max_not_sent_attempts`); `Unknown` → `unknown`, to be looked up after
//!    `reconcile_after`. A record that changes no row means the lease was lost (the item was
//!    declared unknown or resolved meanwhile): it is logged, counted
//!    ([`metric::LEASE_LOST`]) and changes nothing.
//! 5. **Expired leases**: an item still `in_progress` after `lease_until` belongs to an executor
//!    that died (or stalled) between claim and record, possibly *after* the provider acted. It
//!    goes to `unknown`, never back to `pending`: a blind retry could pay twice.
//! 6. **Reconciliation**: due `unknown` items are leased (state stays `unknown`, the lease
//!    columns keep two executors from asking about one item at once) and looked up by key:
//!    `Succeeded` / `Failed` settle the item; `NotFound` sends it back to `pending` for a new
//!    call **with the same key** when [`ExecutorConfig::resend_when_not_found`] is set, or parks
//!    it in `unknown` for an operator otherwise; `Unknown` asks again later (`lookup_backoff`).
//!
//! Operators see the backlog with [`PgEffects::stats`] / [`PgEffects::list`] and settle parked
//! items with [`PgEffects::resolve`].
//!
//! # Guarantees and their limits
//!
//! * One work item per idempotency key, written atomically with the consumer's inbox row (G5).
//! * An item whose outcome is not known is never called again without a lookup first. A second
//!   call happens only after the provider said it has no record of the key (and resend is on),
//!   after a provable `NotSent`, or by an operator's [`Resolution::Resend`]; every call carries
//!   the same key.
//! * Exactly one remote effect is **not** promised (G10): it holds when the provider honours the
//!   idempotency key or answers lookups truthfully. Without either, a crash between call and
//!   record can cause a second effect; with them, reconciliation settles it to one.
//! * A database outage loses nothing: errors are logged, the executor backs off and carries on,
//!   and every item stays in its table row. A call whose result could not be recorded leaves the
//!   item `in_progress` until its lease expires, and then it is `unknown`.
//!
//! # Crash points
//!
//! [`CRASH_AFTER_CALL`] (the provider answered, nothing recorded) and [`CRASH_AFTER_RECORD`]
//! (the answer is recorded), for the crash-matrix tests (see [`outbox_core::crash`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt;
use outbox_core::crash;
use outbox_core::relay::Backoff;
use outbox_core::{CallOutcome, LookupOutcome, RemoteEffect, WorkItem};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use uuid::Uuid;

use crate::schema::Schema;

/// Crash point: the provider answered a call and the executor has not recorded the answer.
pub const CRASH_AFTER_CALL: &str = "effects.after_call";
/// Crash point: the answer of a call is recorded.
pub const CRASH_AFTER_RECORD: &str = "effects.after_record";

/// The minimum slack [`ExecutorConfig::lease`] must leave after the longest wait for a call.
pub const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// `last_error` of an item whose executor lease expired before the call was recorded.
pub const LEASE_EXPIRED_REASON: &str = "executor lease expired: outcome unknown";
/// `last_error` of an item the provider has no record of while resend is disabled.
pub const PARKED_REASON: &str = "provider has no record; resend disabled: resolve by hand";

/// Metric names. Every metric carries the label `kind`.
pub mod metric {
    /// Gauge: items in `unknown` (the reconciliation backlog).
    pub const UNKNOWN: &str = "outbox_effects_unknown";
    /// Gauge: age in seconds of the oldest `unknown` item (0 when there is none).
    pub const OLDEST_UNKNOWN_AGE: &str = "outbox_effects_oldest_unknown_age_seconds";
    /// Gauge: items in `pending`.
    pub const PENDING: &str = "outbox_effects_pending";
    /// Gauge: items in `in_progress`.
    pub const IN_PROGRESS: &str = "outbox_effects_in_progress";
    /// Counter: provider calls, label `outcome` = `succeeded` | `failed` | `not_sent` |
    /// `unknown` (a timeout counts as `unknown`).
    pub const CALLS: &str = "outbox_effects_calls_total";
    /// Counter: lookups of unknown items, label `result` = `succeeded` | `failed` | `resent` |
    /// `parked` | `unknown`.
    pub const RECONCILED: &str = "outbox_effects_reconciled_total";
    /// Counter: records refused because the executor's lease was lost.
    pub const LEASE_LOST: &str = "outbox_effects_lease_lost_total";
    /// Counter: enqueues refused because the key exists with a different payload.
    pub const KEY_CONFLICTS: &str = "outbox_effects_key_conflicts_total";
}

/// The values of the `state` column.
pub mod state {
    /// Waiting for a call (new, not sent, or resent).
    pub const PENDING: &str = "pending";
    /// Claimed by an executor that is calling the provider.
    pub const IN_PROGRESS: &str = "in_progress";
    /// Done; `reference` holds the provider's reference. Terminal.
    pub const SUCCEEDED: &str = "succeeded";
    /// Refused by the provider or given up; `last_error` says why. Terminal (an operator may
    /// resend).
    pub const FAILED: &str = "failed";
    /// Outcome not known; reconciliation or an operator settles it.
    pub const UNKNOWN: &str = "unknown";
    /// Every state.
    pub const ALL: [&str; 5] = [PENDING, IN_PROGRESS, SUCCEEDED, FAILED, UNKNOWN];
}

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
    /// An [`ExecutorConfig`] value is out of range; `key` names the field.
    #[error("invalid effects executor config `{key}`: {reason}")]
    InvalidConfig {
        /// The field, e.g. `lease`.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
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
}

impl EffectsError {
    /// Whether trying again later may succeed (database errors); the others need a fix.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Database(_))
    }
}

impl From<sqlx::Error> for EffectsError {
    fn from(e: sqlx::Error) -> Self {
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

/// The stable idempotency key of the work of `kind` that `consumer_name` does for `event_id`:
/// `"{kind}:{consumer_name}:{event_id}"`. A redelivered event yields the same key.
pub fn idempotency_key(kind: &str, consumer_name: &str, event_id: Uuid) -> String {
    format!("{kind}:{consumer_name}:{event_id}")
}

/// A work item to enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewWorkItem {
    /// The kind of effect (`payout`); one executor serves one kind. 1 to 255 bytes.
    pub kind: String,
    /// Sent to the provider with every call and lookup. 1 to 1024 bytes.
    pub idempotency_key: String,
    /// What to do.
    pub payload: serde_json::Value,
    /// The event that caused the work.
    pub event_id: Option<Uuid>,
    /// The consumer that wrote the item.
    pub consumer_name: Option<String>,
}

impl NewWorkItem {
    /// The item for the work of `kind` that `consumer_name` does for `event_id`, keyed with
    /// [`idempotency_key`].
    pub fn for_event(
        kind: impl Into<String>,
        consumer_name: impl Into<String>,
        event_id: Uuid,
        payload: serde_json::Value,
    ) -> Self {
        let kind = kind.into();
        let consumer_name = consumer_name.into();
        Self {
            idempotency_key: idempotency_key(&kind, &consumer_name, event_id),
            kind,
            payload,
            event_id: Some(event_id),
            consumer_name: Some(consumer_name),
        }
    }

    fn validate(&self) -> Result<(), EffectsError> {
        let bad = |name, reason: &str| {
            Err(EffectsError::InvalidArgument {
                name,
                reason: reason.to_owned(),
            })
        };
        if self.kind.is_empty() || self.kind.len() > 255 {
            return bad("kind", "must be 1 to 255 bytes");
        }
        if self.idempotency_key.is_empty() || self.idempotency_key.len() > 1024 {
            return bad("idempotency_key", "must be 1 to 1024 bytes");
        }
        Ok(())
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

/// Counts per state, for one kind or all, with the ages operators alert on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EffectsStats {
    /// Items waiting for a call.
    pub pending: i64,
    /// Items being called.
    pub in_progress: i64,
    /// The reconciliation backlog.
    pub unknown: i64,
    /// Settled as done.
    pub succeeded: i64,
    /// Settled as failed.
    pub failed: i64,
    /// How long the oldest `unknown` item has been unknown; `None` without unknown items.
    pub oldest_unknown_age: Option<Duration>,
    /// How long ago the oldest `pending` item was enqueued; `None` without pending items.
    pub oldest_pending_age: Option<Duration>,
}

/// One work item with every column an operator needs.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkItemRow {
    /// Row id.
    pub id: i64,
    /// Kind of effect.
    pub kind: String,
    /// The key sent to the provider.
    pub idempotency_key: String,
    /// What to do.
    pub payload: serde_json::Value,
    /// SHA-256 of the payload's canonical jsonb form.
    pub payload_sha256: Vec<u8>,
    /// The event that caused the work.
    pub event_id: Option<Uuid>,
    /// The consumer that wrote it.
    pub consumer_name: Option<String>,
    /// One of [`state::ALL`].
    pub state: String,
    /// Calls made so far.
    pub attempts: i32,
    /// Lookups made so far.
    pub lookups: i32,
    /// Token of the current lease (call or lookup), if any.
    pub lease_token: Option<i64>,
    /// End of the current lease, if any.
    pub lease_until: Option<DateTime<Utc>>,
    /// When the next call (pending) or lookup (unknown) is due.
    pub next_attempt_at: DateTime<Utc>,
    /// Since when the outcome is unknown (set while `unknown`).
    pub unknown_since: Option<DateTime<Utc>>,
    /// The provider's reference, once succeeded.
    pub reference: Option<String>,
    /// The latest error or reason.
    pub last_error: Option<String>,
    /// Enqueued at.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it reached `succeeded` or `failed`.
    pub resolved_at: Option<DateTime<Utc>>,
}

/// An operator's decision about a work item ([`PgEffects::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The operator confirmed with the provider that the effect happened. Only from `unknown`.
    Succeeded {
        /// The provider's reference.
        reference: String,
    },
    /// The operator confirmed that it did not happen and must not. Only from `unknown`.
    Failed {
        /// Why.
        reason: String,
    },
    /// Call the provider again, with the same key. From `unknown` (the operator knows the
    /// provider has no record) or `failed`.
    Resend,
}

impl Resolution {
    fn name(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "succeeded",
            Self::Failed { .. } => "failed",
            Self::Resend => "resend",
        }
    }
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
        let s = format!("\"{}\"", schema.as_str());
        let r = |t: &str| -> Arc<str> {
            t.replace("{cols}", ROW_COLUMNS)
                .replace("{returning}", CLAIM_RETURNING)
                .replace("{fence}", FENCE)
                .replace("{s}", &s)
                .into()
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

fn row_to_item(r: &PgRow) -> Result<WorkItemRow, sqlx::Error> {
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
    /// * [`EffectsError::NotMigrated`], [`EffectsError::Database`]: the transaction is aborted.
    pub async fn enqueue(
        &self,
        conn: &mut PgConnection,
        item: &NewWorkItem,
    ) -> Result<EnqueueOutcome, EffectsError> {
        item.validate()?;
        let inserted: Option<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.sql.insert)))
            .bind(&item.kind)
            .bind(&item.idempotency_key)
            .bind(&item.payload)
            .bind(item.event_id)
            .bind(item.consumer_name.as_deref())
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(id) = inserted {
            return Ok(EnqueueOutcome::Inserted { id });
        }
        let (id, existing_kind, same): (i64, String, bool) =
            sqlx::query_as(AssertSqlSafe(Arc::clone(&self.sql.select_by_key)))
                .bind(&item.idempotency_key)
                .bind(&item.kind)
                .bind(&item.payload)
                .fetch_one(&mut *conn)
                .await?;
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
    /// [`EffectsError::NotMigrated`] or [`EffectsError::Database`].
    pub async fn stats(
        &self,
        pool: &PgPool,
        kind: Option<&str>,
    ) -> Result<EffectsStats, EffectsError> {
        let r = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.stats)))
            .bind(kind)
            .fetch_one(pool)
            .await?;
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

    /// Lists up to `limit` items, oldest first, optionally only those in `state` (one of
    /// [`state::ALL`]).
    ///
    /// # Errors
    /// [`EffectsError::InvalidArgument`] for an unknown state name or a negative limit;
    /// [`EffectsError::NotMigrated`] or [`EffectsError::Database`].
    pub async fn list(
        &self,
        pool: &PgPool,
        state: Option<&str>,
        limit: i64,
    ) -> Result<Vec<WorkItemRow>, EffectsError> {
        if let Some(s) = state
            && !state::ALL.contains(&s)
        {
            return Err(EffectsError::InvalidArgument {
                name: "state",
                reason: format!("`{s}` is not one of {}", state::ALL.join(", ")),
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
            .await?;
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
    /// * [`EffectsError::NotMigrated`] or [`EffectsError::Database`].
    pub async fn resolve(
        &self,
        pool: &PgPool,
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
        if let Some(row) = query.fetch_optional(pool).await? {
            return Ok(row_to_item(&row)?);
        }
        let state: Option<String> =
            sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.sql.select_state)))
                .bind(id)
                .fetch_optional(pool)
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

/// Deletes up to `batch_size` `succeeded` work items resolved more than `keep` ago, oldest
/// first. Returns how many. Items in any other state (`pending`, `in_progress`, `unknown`, and
/// `failed`, which may still be resent by an operator) are never deleted.
///
/// Deleting a settled item is safe for deduplication: its event's inbox identity (kept for the
/// replay horizon, see [`crate::InboxRetention`]) is what prevents a second work item. Keep
/// items as long as your audit needs the provider's references. Usually run by the elected
/// [`crate::InboxMaintainer`] ([`crate::InboxMaintainer::with_work_item_retention`]).
///
/// # Errors
/// [`sqlx::Error`].
pub async fn purge_succeeded(
    conn: &mut PgConnection,
    schema: &Schema,
    keep: Duration,
    batch_size: i64,
) -> Result<u64, sqlx::Error> {
    let s = format!("\"{}\"", schema.as_str());
    let sql = format!(
        "DELETE FROM {s}.work_items WHERE id IN (SELECT id FROM {s}.work_items \
         WHERE state = 'succeeded' AND resolved_at < now() - $1 * interval '1 millisecond' \
         ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)"
    );
    Ok(sqlx::query(AssertSqlSafe(sql))
        .bind(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
        .bind(batch_size)
        .execute(conn)
        .await?
        .rows_affected())
}

/// Settings of an [`Executor`]. Build with [`ExecutorConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// The kind of work items this executor serves.
    pub kind: String,
    /// Items claimed per pass (calls and lookups each). Default 16.
    pub batch_size: usize,
    /// Calls (or lookups) in flight at once within a batch. Default 8.
    pub concurrency: usize,
    /// How long a claim (or a lookup lease) lasts. It must cover the slowest call of a batch:
    /// `ceil(batch_size / concurrency) * call_timeout` plus [`LEASE_MARGIN`]. Default 30 s.
    pub lease: Duration,
    /// Timeout of one provider call or lookup; a timed-out call is `Unknown`. Default 10 s.
    pub call_timeout: Duration,
    /// Sleep between passes that found nothing to do. Default 200 ms.
    pub poll_interval: Duration,
    /// Minimum age of an `unknown` item before its first lookup, so that a request still in
    /// flight at the provider can land. Default 2 s.
    pub reconcile_after: Duration,
    /// Delay between lookups that answered `Unknown`: exponential from 1 s to 60 s (with
    /// jitter). A parked item is looked up again every `lookup_backoff.max`.
    pub lookup_backoff: Backoff,
    /// Delay before calling again after `NotSent`: exponential from 1 s to 60 s (with jitter).
    pub retry_backoff: Backoff,
    /// After this many attempts, a `NotSent` answer makes the item `failed`. Default 20.
    pub max_not_sent_attempts: i32,
    /// What a lookup answering `NotFound` leads to. `true` (default): the item goes back to
    /// `pending` and is called again **with the same key**. Safe only if the provider
    /// deduplicates by idempotency key (or a `NotFound` is authoritative): a provider that
    /// answers `NotFound` for a request it is still processing would otherwise act twice.
    /// `false`: the item stays `unknown` with `last_error` = [`PARKED_REASON`] for an operator
    /// ([`PgEffects::resolve`]).
    pub resend_when_not_found: bool,
    /// How often the gauges are refreshed from [`PgEffects::stats`] when nothing changes.
    /// Default 5 s.
    pub stats_interval: Duration,
}

impl ExecutorConfig {
    /// The defaults for `kind`.
    pub fn new(kind: impl Into<String>) -> Self {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        Self {
            kind: kind.into(),
            batch_size: 16,
            concurrency: 8,
            lease: Duration::from_secs(30),
            call_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(200),
            reconcile_after: Duration::from_secs(2),
            lookup_backoff: backoff,
            retry_backoff: backoff,
            max_not_sent_attempts: 20,
            resend_when_not_found: true,
            stats_interval: Duration::from_secs(5),
        }
    }

    /// Checks every value.
    ///
    /// # Errors
    /// [`EffectsError::InvalidConfig`] naming the first bad field: an empty kind, a zero size,
    /// count or duration, a backoff whose `max` is below its `base`, or a `lease` that does not
    /// exceed `ceil(batch_size / concurrency) * call_timeout + LEASE_MARGIN` (claimed items
    /// wait for a free call slot under their lease).
    pub fn validate(&self) -> Result<(), EffectsError> {
        let bad = |key, reason: String| Err(EffectsError::InvalidConfig { key, reason });
        if self.kind.is_empty() || self.kind.len() > 255 {
            return bad("kind", "must be 1 to 255 bytes".to_owned());
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return bad("batch_size", "must be 1 to 10000".to_owned());
        }
        if self.concurrency == 0 {
            return bad("concurrency", "must be greater than 0".to_owned());
        }
        for (key, d) in [
            ("call_timeout", self.call_timeout),
            ("poll_interval", self.poll_interval),
            ("reconcile_after", self.reconcile_after),
            ("stats_interval", self.stats_interval),
        ] {
            if d.is_zero() {
                return bad(key, "must be greater than 0".to_owned());
            }
        }
        for (key, b) in [
            ("lookup_backoff", &self.lookup_backoff),
            ("retry_backoff", &self.retry_backoff),
        ] {
            if b.base.is_zero() || b.max < b.base {
                return bad(key, "base must be > 0 and max >= base".to_owned());
            }
        }
        if self.max_not_sent_attempts < 1 {
            return bad("max_not_sent_attempts", "must be at least 1".to_owned());
        }
        let waves = self.batch_size.div_ceil(self.concurrency) as u32;
        let needed = self
            .call_timeout
            .checked_mul(waves)
            .and_then(|d| d.checked_add(LEASE_MARGIN));
        match needed {
            Some(needed) if self.lease > needed => Ok(()),
            _ => bad(
                "lease",
                format!(
                    "{:?} must exceed ceil(batch_size / concurrency) * call_timeout + {:?} = \
                     {waves} * {:?} + {:?}",
                    self.lease, LEASE_MARGIN, self.call_timeout, LEASE_MARGIN
                ),
            ),
        }
    }
}

/// What one [`Executor::run_once`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    /// `in_progress` items with an expired lease moved to `unknown`.
    pub expired: usize,
    /// Items claimed and called.
    pub called: usize,
    /// Calls answered `Succeeded`.
    pub succeeded: usize,
    /// Calls answered `Failed` (or `NotSent` past the limit).
    pub failed: usize,
    /// Calls answered `NotSent` and scheduled again.
    pub not_sent: usize,
    /// Calls answered `Unknown` or timed out.
    pub unknown: usize,
    /// Unknown items looked up.
    pub looked_up: usize,
    /// Lookups that found the effect done.
    pub reconciled_succeeded: usize,
    /// Lookups that found the effect refused.
    pub reconciled_failed: usize,
    /// Lookups answered `NotFound` that sent the item back to `pending`.
    pub resent: usize,
    /// Lookups answered `NotFound` that parked the item (resend disabled).
    pub parked: usize,
    /// Lookups without an answer.
    pub still_unknown: usize,
    /// Results not recorded because the lease was lost.
    pub lease_lost: usize,
    /// Results not recorded because of a database error (the lease expiry settles them).
    pub record_errors: usize,
}

impl TickReport {
    /// Whether the pass changed any item.
    pub fn changed(&self) -> bool {
        self.expired + self.called + self.looked_up > 0
    }
}

/// A claimed item with the token that fences its writes.
struct Claimed {
    item: WorkItem,
    lookups: i32,
    token: i64,
}

fn claimed_from_row(r: &PgRow) -> Result<Claimed, sqlx::Error> {
    Ok(Claimed {
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
        token: r.try_get("lease_token")?,
    })
}

/// What happened to one claimed item.
enum Settled {
    Recorded(&'static str),
    LeaseLost,
    Error,
}

/// A fenced write: which statement, with what.
struct Write<'a> {
    sql: &'a Arc<str>,
    text: Option<String>,
    lookups: i32,
    /// `$6`, for the statements that schedule a next attempt.
    delay: Option<Duration>,
}

/// Claims work items of one kind, calls the provider, records the answers, and reconciles
/// unknown outcomes. See the [module docs](self) for the guarantees. Several executors (in one
/// or many processes) may serve the same kind; they coordinate through row locks and leases.
pub struct Executor<P: RemoteEffect> {
    pool: PgPool,
    effects: PgEffects,
    provider: P,
    config: ExecutorConfig,
}

impl<P: RemoteEffect> std::fmt::Debug for Executor<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("schema", &self.effects.schema)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<P: RemoteEffect> Executor<P> {
    /// An executor for `config.kind` in the (migrated) `schema`.
    ///
    /// # Errors
    /// [`EffectsError::InvalidConfig`] from [`ExecutorConfig::validate`].
    pub fn new(
        pool: PgPool,
        schema: Schema,
        provider: P,
        config: ExecutorConfig,
    ) -> Result<Self, EffectsError> {
        config.validate()?;
        Ok(Self {
            pool,
            effects: PgEffects::new(schema),
            provider,
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    /// The provider.
    pub fn provider(&self) -> &P {
        &self.provider
    }

    /// One pass: expired leases to `unknown`, then one batch of calls (claimed, called
    /// concurrently, each recorded as soon as it returns), then one batch of lookups. Used by
    /// [`Executor::run`], and by tests.
    ///
    /// # Errors
    /// [`EffectsError::Database`] / [`EffectsError::NotMigrated`] when a sweep or claim fails.
    /// A failed *record* is not an error of the pass: it is logged and counted in
    /// [`TickReport::record_errors`], and the item's lease expiry makes it `unknown`.
    pub async fn run_once(&self) -> Result<TickReport, EffectsError> {
        let mut report = TickReport {
            expired: self.expire_leases().await?,
            ..TickReport::default()
        };
        self.call_pass(&mut report).await?;
        self.reconcile_pass(&mut report).await?;
        Ok(report)
    }

    /// Reads [`PgEffects::stats`] for this kind and sets the gauges of [`metric`].
    ///
    /// # Errors
    /// [`EffectsError::NotMigrated`] or [`EffectsError::Database`].
    pub async fn publish_stats(&self) -> Result<EffectsStats, EffectsError> {
        let stats = self
            .effects
            .backlog(&self.pool, Some(&self.config.kind))
            .await?;
        let kind = self.config.kind.clone();
        metrics::gauge!(metric::UNKNOWN, "kind" => kind.clone()).set(stats.unknown as f64);
        metrics::gauge!(metric::OLDEST_UNKNOWN_AGE, "kind" => kind.clone())
            .set(stats.oldest_unknown_age.map_or(0.0, |d| d.as_secs_f64()));
        metrics::gauge!(metric::PENDING, "kind" => kind.clone()).set(stats.pending as f64);
        metrics::gauge!(metric::IN_PROGRESS, "kind" => kind).set(stats.in_progress as f64);
        Ok(stats)
    }

    /// Runs passes until `shutdown` is cancelled. A pass in progress is finished first (its
    /// calls are answered or time out, and are recorded), so no item is left `in_progress` by
    /// a clean shutdown. Database errors are logged and waited out with a growing delay (from
    /// `poll_interval` up to 30 s); nothing is lost meanwhile. Gauges are refreshed every
    /// `stats_interval`, and after a pass that changed something (at most once per
    /// `poll_interval`).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let outage = Backoff {
            base: self.config.poll_interval,
            max: Duration::from_secs(30).max(self.config.poll_interval),
        };
        let mut last_stats: Option<Instant> = None;
        let mut failures = 0;
        while !shutdown.is_cancelled() {
            let wait = match self.run_once().await {
                Ok(report) => {
                    failures = 0;
                    let since = last_stats.map(|t| t.elapsed());
                    let due = since.is_none_or(|s| {
                        s >= self.config.stats_interval
                            || (report.changed() && s >= self.config.poll_interval)
                    });
                    if due {
                        match self.publish_stats().await {
                            Ok(_) => last_stats = Some(Instant::now()),
                            Err(e) => warn!(kind = %self.config.kind, error = %e,
                                "could not refresh work-item gauges"),
                        }
                    }
                    let full = report.called >= self.config.batch_size
                        || report.looked_up >= self.config.batch_size;
                    if full {
                        Duration::ZERO
                    } else {
                        self.config.poll_interval
                    }
                }
                Err(e) => {
                    failures += 1;
                    let wait = outage.delay(failures);
                    warn!(kind = %self.config.kind, error = %e, ?wait,
                        "effects executor error; retrying");
                    wait
                }
            };
            if wait.is_zero() {
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => break,
            }
        }
    }

    async fn expire_leases(&self) -> Result<usize, EffectsError> {
        let ids: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.effects.sql.expire)))
            .bind(&self.config.kind)
            .bind(self.config.reconcile_after.as_secs_f64())
            .bind(LEASE_EXPIRED_REASON)
            .fetch_all(&self.pool)
            .await?;
        for id in &ids {
            warn!(kind = %self.config.kind, id, "work item lease expired before its result was recorded; outcome unknown");
        }
        Ok(ids.len())
    }

    async fn claim(&self, sql: &Arc<str>) -> Result<Vec<Claimed>, EffectsError> {
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(sql)))
            .bind(&self.config.kind)
            .bind(self.config.batch_size as i64)
            .bind(self.config.lease.as_secs_f64())
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(claimed_from_row)
            .collect::<Result<_, _>>()?)
    }

    /// The fenced write of a result; `Settled::LeaseLost` when it changed nothing.
    async fn write(&self, c: &Claimed, in_state: &str, w: Write<'_>) -> Settled {
        let mut query = sqlx::query(AssertSqlSafe(Arc::clone(w.sql)))
            .bind(c.item.id)
            .bind(c.token)
            .bind(in_state)
            .bind(w.text)
            .bind(w.lookups);
        if let Some(delay) = w.delay {
            query = query.bind(delay.as_secs_f64());
        }
        let res = query.execute(&self.pool).await;
        match res {
            Ok(done) if done.rows_affected() == 1 => Settled::Recorded(""),
            Ok(_) => {
                metrics::counter!(metric::LEASE_LOST, "kind" => self.config.kind.clone())
                    .increment(1);
                warn!(kind = %self.config.kind, id = c.item.id, token = c.token,
                    "work-item lease lost before the result was recorded; result dropped");
                Settled::LeaseLost
            }
            Err(e) => {
                warn!(kind = %self.config.kind, id = c.item.id, error = %e,
                    "could not record a work-item result; the lease expiry will make it unknown");
                Settled::Error
            }
        }
    }

    async fn call_pass(&self, report: &mut TickReport) -> Result<(), EffectsError> {
        let claimed = self.claim(&self.effects.sql.claim_calls).await?;
        report.called = claimed.len();
        let settled: Vec<Settled> = futures::stream::iter(claimed)
            .map(|c| self.call_one(c))
            .buffer_unordered(self.config.concurrency)
            .collect()
            .await;
        for s in settled {
            match s {
                Settled::Recorded("succeeded") => report.succeeded += 1,
                Settled::Recorded("failed") => report.failed += 1,
                Settled::Recorded("not_sent") => report.not_sent += 1,
                Settled::Recorded(_) => report.unknown += 1,
                Settled::LeaseLost => report.lease_lost += 1,
                Settled::Error => report.record_errors += 1,
            }
        }
        Ok(())
    }

    async fn call_one(&self, c: Claimed) -> Settled {
        let timeout = self.config.call_timeout;
        let outcome = match tokio::time::timeout(timeout, self.provider.call(&c.item)).await {
            Ok(outcome) => outcome,
            Err(_) => CallOutcome::Unknown {
                reason: format!("call timed out after {timeout:?}"),
            },
        };
        crash::hit(CRASH_AFTER_CALL);
        let sql = &self.effects.sql;
        let (outcome_label, label, write) = match outcome {
            CallOutcome::Succeeded { reference } => (
                "succeeded",
                "succeeded",
                Write {
                    sql: &sql.set_succeeded,
                    text: Some(reference),
                    lookups: 0,
                    delay: None,
                },
            ),
            CallOutcome::Failed { reason } => (
                "failed",
                "failed",
                Write {
                    sql: &sql.set_failed,
                    text: Some(reason),
                    lookups: 0,
                    delay: None,
                },
            ),
            CallOutcome::NotSent { reason }
                if c.item.attempts >= self.config.max_not_sent_attempts =>
            {
                (
                    "not_sent",
                    "failed",
                    Write {
                        sql: &sql.set_failed,
                        text: Some(format!(
                            "not sent after {} attempts, giving up: {reason}",
                            c.item.attempts
                        )),
                        lookups: 0,
                        delay: None,
                    },
                )
            }
            CallOutcome::NotSent { reason } => (
                "not_sent",
                "not_sent",
                Write {
                    sql: &sql.set_pending,
                    text: Some(format!("not sent: {reason}")),
                    lookups: 0,
                    delay: Some(self.config.retry_backoff.delay(c.item.attempts)),
                },
            ),
            CallOutcome::Unknown { reason } => (
                "unknown",
                "unknown",
                Write {
                    sql: &sql.set_unknown,
                    text: Some(reason),
                    lookups: 0,
                    delay: Some(self.config.reconcile_after),
                },
            ),
        };
        metrics::counter!(metric::CALLS, "kind" => self.config.kind.clone(), "outcome" => outcome_label)
            .increment(1);
        debug!(kind = %self.config.kind, id = c.item.id, outcome = label, "work item called");
        let settled = match self.write(&c, state::IN_PROGRESS, write).await {
            Settled::Recorded(_) => Settled::Recorded(label),
            other => other,
        };
        crash::hit(CRASH_AFTER_RECORD);
        settled
    }

    async fn reconcile_pass(&self, report: &mut TickReport) -> Result<(), EffectsError> {
        let claimed = self.claim(&self.effects.sql.claim_lookups).await?;
        report.looked_up = claimed.len();
        let settled: Vec<Settled> = futures::stream::iter(claimed)
            .map(|c| self.lookup_one(c))
            .buffer_unordered(self.config.concurrency)
            .collect()
            .await;
        for s in settled {
            match s {
                Settled::Recorded("succeeded") => report.reconciled_succeeded += 1,
                Settled::Recorded("failed") => report.reconciled_failed += 1,
                Settled::Recorded("resent") => report.resent += 1,
                Settled::Recorded("parked") => report.parked += 1,
                Settled::Recorded(_) => report.still_unknown += 1,
                Settled::LeaseLost => report.lease_lost += 1,
                Settled::Error => report.record_errors += 1,
            }
        }
        Ok(())
    }

    async fn lookup_one(&self, c: Claimed) -> Settled {
        let timeout = self.config.call_timeout;
        let outcome = match tokio::time::timeout(timeout, self.provider.lookup(&c.item)).await {
            Ok(outcome) => outcome,
            Err(_) => LookupOutcome::Unknown {
                reason: format!("lookup timed out after {timeout:?}"),
            },
        };
        let sql = &self.effects.sql;
        let (label, write) = match outcome {
            LookupOutcome::Succeeded { reference } => (
                "succeeded",
                Write {
                    sql: &sql.set_succeeded,
                    text: Some(reference),
                    lookups: 1,
                    delay: None,
                },
            ),
            LookupOutcome::Failed { reason } => (
                "failed",
                Write {
                    sql: &sql.set_failed,
                    text: Some(reason),
                    lookups: 1,
                    delay: None,
                },
            ),
            LookupOutcome::NotFound if self.config.resend_when_not_found => (
                "resent",
                Write {
                    sql: &sql.set_pending,
                    text: Some(
                        "provider has no record; calling again with the same key".to_owned(),
                    ),
                    lookups: 1,
                    delay: Some(Duration::ZERO),
                },
            ),
            LookupOutcome::NotFound => (
                "parked",
                Write {
                    sql: &sql.set_unknown,
                    text: Some(PARKED_REASON.to_owned()),
                    lookups: 1,
                    delay: Some(self.config.lookup_backoff.max),
                },
            ),
            LookupOutcome::Unknown { reason } => (
                "unknown",
                Write {
                    sql: &sql.set_unknown,
                    text: Some(format!("lookup: {reason}")),
                    lookups: 1,
                    delay: Some(self.config.lookup_backoff.delay(c.lookups + 1)),
                },
            ),
        };
        metrics::counter!(metric::RECONCILED, "kind" => self.config.kind.clone(), "result" => label)
            .increment(1);
        if label == "parked" {
            warn!(kind = %self.config.kind, id = c.item.id, key = %c.item.idempotency_key,
                "work item parked: {PARKED_REASON}");
        }
        match self.write(&c, state::UNKNOWN, write).await {
            Settled::Recorded(_) => Settled::Recorded(label),
            other => other,
        }
    }
}
