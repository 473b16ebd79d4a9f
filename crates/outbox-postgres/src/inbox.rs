//! The consumer inbox: one database effect per `(consumer, event)`, in the consumer's own
//! transaction.
//!
//! ```no_run
//! # async fn handle(pool: sqlx::PgPool, event: outbox_core::IncomingEvent) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_postgres::{InboxOutcome, OrderingGuard, PgInbox, Schema};
//! let inbox = PgInbox::new(Schema::new("outbox")?);
//! let mut tx = pool.begin().await?;
//! match inbox.record(&mut tx, "reporting", OrderingGuard::Off, &event).await? {
//!     InboxOutcome::New => {
//!         sqlx::query("UPDATE totals SET n = n + 1").execute(&mut *tx).await?; // the effect
//!         tx.commit().await?;
//!     }
//!     InboxOutcome::Duplicate | InboxOutcome::Stale { .. } | InboxOutcome::Conflict { .. } => {
//!         tx.commit().await?; // no effect (a conflict is recorded in this transaction)
//!     }
//!     InboxOutcome::Gap { .. } => tx.rollback().await?, // redeliver later
//! }
//! // only now acknowledge the delivery to the broker
//! # Ok(()) }
//! ```
//!
//! # Isolation and concurrency
//!
//! The identity is the primary key `(consumer_name, event_id)`. Two transactions recording the
//! same event at once (two instances of one consumer, a redelivery racing the first delivery)
//! meet on that key: the second `INSERT … ON CONFLICT DO NOTHING` waits for the first
//! transaction, then inserts nothing if it committed (→ `Duplicate`, no second effect) or
//! inserts if it rolled back (→ `New`). This holds under READ COMMITTED, the default; nothing
//! here needs SERIALIZABLE.
//!
//! # Key sizes
//!
//! The ordering guard's key is (consumer, aggregate type, aggregate id), a btree index, and
//! PostgreSQL's btree keys hold at most 2,704 bytes. The wire format bounds every attribute at
//! [`MAX_ATTRIBUTE_CHARS`](outbox_core::wire::MAX_ATTRIBUTE_CHARS) (255) characters: two of
//! them in four-byte characters are 2,040 bytes, which leaves room for a consumer name of 150
//! such characters (any ASCII name up to the inbox's 255). A key the index still refuses (an
//! even longer consumer name) is an `InvalidData` store error, which the consumer engine
//! dead-letters instead of retrying it for ever.

use std::sync::Arc;

pub use outbox_core::consumer::{InboxOutcome, OrderingGuard};
use outbox_core::{Fingerprint, IncomingEvent};
use sqlx::{AssertSqlSafe, PgConnection};

use crate::schema::Schema;

/// Reads a stored fingerprint; a value that is not 32 bytes is a corrupt row, reported as a
/// decode error naming the column, never read as zeros (which would turn every redelivery of
/// that event into a conflict).
fn stored_fingerprint(bytes: &[u8], column: &str) -> Result<Fingerprint, sqlx::Error> {
    Fingerprint::from_slice(bytes).ok_or_else(|| {
        sqlx::Error::Decode(
            format!(
                "corrupt {column}: {} bytes where a SHA-256 fingerprint has 32",
                bytes.len()
            )
            .into(),
        )
    })
}

/// A recorded conflict, for the CLI and the contract's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxConflict {
    /// Consumer.
    pub consumer_name: String,
    /// Event id.
    pub event_id: uuid::Uuid,
    /// Fingerprint recorded first.
    pub stored: Fingerprint,
    /// Fingerprint of the conflicting delivery.
    pub received: Fingerprint,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Version.
    pub aggregate_version: i64,
    /// Event type.
    pub event_type: String,
    /// How often this exact conflicting payload arrived.
    pub occurrences: i32,
    /// First seen.
    pub first_seen: chrono::DateTime<chrono::Utc>,
    /// Last seen.
    pub last_seen: chrono::DateTime<chrono::Utc>,
}

const INSERT: &str = "INSERT INTO {s}.inbox (consumer_name, event_id, payload_sha256, \
    aggregate_type, aggregate_id, aggregate_version, event_type) \
    VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (consumer_name, event_id) DO NOTHING";
const INSERT_MANY: &str = "INSERT INTO {s}.inbox (consumer_name, event_id, payload_sha256, \
    aggregate_type, aggregate_id, aggregate_version, event_type) \
    SELECT $1, u.* FROM UNNEST($2::uuid[], $3::bytea[], $4::text[], $5::text[], $6::int8[], \
    $7::text[]) AS u ON CONFLICT (consumer_name, event_id) DO NOTHING RETURNING event_id";
const SELECT_FPS: &str = "SELECT event_id, payload_sha256 FROM {s}.inbox \
    WHERE consumer_name = $1 AND event_id = ANY($2)";
const SELECT_FP: &str =
    "SELECT payload_sha256 FROM {s}.inbox WHERE consumer_name = $1 AND event_id = $2";
const INSERT_CONFLICT: &str = "INSERT INTO {s}.inbox_conflicts AS c (consumer_name, event_id, \
    stored_sha256, received_sha256, aggregate_type, aggregate_id, aggregate_version, event_type, \
    payload) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
    ON CONFLICT ON CONSTRAINT inbox_conflicts_key \
    DO UPDATE SET occurrences = c.occurrences + 1, last_seen = now(), resolved_at = NULL, \
    resolved_audit_id = NULL";
const ENSURE_AGG: &str = "INSERT INTO {s}.inbox_aggregates (consumer_name, aggregate_type, \
    aggregate_id, last_version) VALUES ($1, $2, $3, 0) ON CONFLICT DO NOTHING";
const LOCK_AGG: &str = "SELECT last_version FROM {s}.inbox_aggregates WHERE consumer_name = $1 \
    AND aggregate_type = $2 AND aggregate_id = $3 FOR UPDATE";
const SET_AGG: &str = "UPDATE {s}.inbox_aggregates SET last_version = $4 WHERE consumer_name = $1 \
    AND aggregate_type = $2 AND aggregate_id = $3";
const MARK_STALE: &str =
    "UPDATE {s}.inbox SET outcome = 'stale' WHERE consumer_name = $1 AND event_id = $2";
const LIST_CONFLICTS: &str = "SELECT consumer_name, event_id, stored_sha256, received_sha256, \
    aggregate_type, aggregate_id, aggregate_version, event_type, occurrences, first_seen, \
    last_seen FROM {s}.inbox_conflicts ORDER BY id DESC LIMIT $1";
const COUNT_CONFLICTS: &str = "SELECT count(*) FROM {s}.inbox_conflicts WHERE resolved_at IS NULL";

#[derive(Debug)]
struct InboxSql {
    insert: Arc<str>,
    insert_many: Arc<str>,
    select_fps: Arc<str>,
    select_fp: Arc<str>,
    insert_conflict: Arc<str>,
    ensure_agg: Arc<str>,
    lock_agg: Arc<str>,
    set_agg: Arc<str>,
    mark_stale: Arc<str>,
    list_conflicts: Arc<str>,
    count_conflicts: Arc<str>,
}

/// The inbox of one schema. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgInbox {
    schema: Schema,
    sql: Arc<InboxSql>,
}

fn q(sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(Arc::clone(sql))
}

impl PgInbox {
    /// The inbox in `schema` (migrated by [`crate::migrate()`]).
    pub fn new(schema: Schema) -> Self {
        let r = |t: &str| schema.render(t);
        let sql = Arc::new(InboxSql {
            insert: r(INSERT),
            insert_many: r(INSERT_MANY),
            select_fps: r(SELECT_FPS),
            select_fp: r(SELECT_FP),
            insert_conflict: r(INSERT_CONFLICT),
            ensure_agg: r(ENSURE_AGG),
            lock_agg: r(LOCK_AGG),
            set_agg: r(SET_AGG),
            mark_stale: r(MARK_STALE),
            list_conflicts: r(LIST_CONFLICTS),
            count_conflicts: r(COUNT_CONFLICTS),
        });
        Self { schema, sql }
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Records `event` for `consumer` inside the caller's transaction and says whether to
    /// apply its effect. Commit the transaction (effect included) before acknowledging the
    /// delivery to the broker; on [`InboxOutcome::Gap`] roll back instead.
    ///
    /// # Errors
    /// [`sqlx::Error`] from the database; the caller's transaction is then aborted and must be
    /// rolled back, and the delivery must not be acknowledged.
    pub async fn record(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        guard: OrderingGuard,
        event: &IncomingEvent,
    ) -> Result<InboxOutcome, sqlx::Error> {
        let inserted = sqlx::query(q(&self.sql.insert))
            .bind(consumer)
            .bind(event.event_id)
            .bind(&event.fingerprint.0[..])
            .bind(&event.aggregate_type)
            .bind(&event.aggregate_id)
            .bind(event.aggregate_version)
            .bind(&event.event_type)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if inserted == 0 {
            let stored: Vec<u8> = sqlx::query_scalar(q(&self.sql.select_fp))
                .bind(consumer)
                .bind(event.event_id)
                .fetch_one(&mut *conn)
                .await?;
            let stored = stored_fingerprint(&stored, "inbox.payload_sha256")?;
            let outcome = InboxOutcome::seen_again(stored, event.fingerprint);
            if outcome == InboxOutcome::Duplicate {
                return Ok(outcome);
            }
            sqlx::query(q(&self.sql.insert_conflict))
                .bind(consumer)
                .bind(event.event_id)
                .bind(&stored.0[..])
                .bind(&event.fingerprint.0[..])
                .bind(&event.aggregate_type)
                .bind(&event.aggregate_id)
                .bind(event.aggregate_version)
                .bind(&event.event_type)
                .bind(event.payload.bytes.as_ref())
                .execute(&mut *conn)
                .await?;
            return Ok(outcome);
        }
        if guard == OrderingGuard::Off {
            return Ok(InboxOutcome::New);
        }
        let key = (consumer, &event.aggregate_type, &event.aggregate_id);
        sqlx::query(q(&self.sql.ensure_agg))
            .bind(key.0)
            .bind(key.1)
            .bind(key.2)
            .execute(&mut *conn)
            .await?;
        let last: i64 = sqlx::query_scalar(q(&self.sql.lock_agg))
            .bind(key.0)
            .bind(key.1)
            .bind(key.2)
            .fetch_one(&mut *conn)
            .await?;
        let outcome = guard.judge(last, event.aggregate_version);
        match outcome {
            InboxOutcome::Stale { .. } => {
                sqlx::query(q(&self.sql.mark_stale))
                    .bind(consumer)
                    .bind(event.event_id)
                    .execute(&mut *conn)
                    .await?;
            }
            InboxOutcome::New => {
                sqlx::query(q(&self.sql.set_agg))
                    .bind(key.0)
                    .bind(key.1)
                    .bind(key.2)
                    .bind(event.aggregate_version)
                    .execute(&mut *conn)
                    .await?;
            }
            _ => {}
        }
        Ok(outcome)
    }

    /// Records several events for `consumer` in the caller's transaction with one multi-row
    /// insert (the batch path of the runner; no ordering guard). Returns one outcome per event,
    /// in order, exactly as calling [`PgInbox::record`] for each in turn would: an event id
    /// repeated inside the batch is `New` once and then `Duplicate` or `Conflict`.
    ///
    /// # Errors
    /// [`sqlx::Error`]; the caller's transaction is then aborted.
    pub async fn record_many(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        events: &[&IncomingEvent],
    ) -> Result<Vec<InboxOutcome>, sqlx::Error> {
        use std::collections::{HashMap, HashSet};
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<uuid::Uuid> = events.iter().map(|e| e.event_id).collect();
        let fps: Vec<&[u8]> = events.iter().map(|e| &e.fingerprint.0[..]).collect();
        let types: Vec<&str> = events.iter().map(|e| e.aggregate_type.as_str()).collect();
        let aggs: Vec<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
        let versions: Vec<i64> = events.iter().map(|e| e.aggregate_version).collect();
        let etypes: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
        let inserted: Vec<uuid::Uuid> = sqlx::query_scalar(q(&self.sql.insert_many))
            .bind(consumer)
            .bind(&ids)
            .bind(&fps)
            .bind(&types)
            .bind(&aggs)
            .bind(&versions)
            .bind(&etypes)
            .fetch_all(&mut *conn)
            .await?;
        let mut new: HashSet<uuid::Uuid> = inserted.into_iter().collect();
        // Fingerprints already known: stored before this batch, or first seen in it.
        let mut known: HashMap<uuid::Uuid, Fingerprint> = HashMap::new();
        let earlier: Vec<uuid::Uuid> = ids.iter().filter(|id| !new.contains(id)).copied().collect();
        if !earlier.is_empty() {
            let rows: Vec<(uuid::Uuid, Vec<u8>)> = sqlx::query_as(q(&self.sql.select_fps))
                .bind(consumer)
                .bind(&earlier)
                .fetch_all(&mut *conn)
                .await?;
            for (id, fp) in rows {
                known.insert(id, stored_fingerprint(&fp, "inbox.payload_sha256")?);
            }
        }
        let mut outcomes = Vec::with_capacity(events.len());
        for e in events {
            if new.remove(&e.event_id) {
                known.insert(e.event_id, e.fingerprint);
                outcomes.push(InboxOutcome::New);
                continue;
            }
            let stored = known.get(&e.event_id).copied().ok_or_else(|| {
                sqlx::Error::Protocol(format!(
                    "inbox row of event {} neither inserted nor found",
                    e.event_id
                ))
            })?;
            let outcome = InboxOutcome::seen_again(stored, e.fingerprint);
            if outcome != InboxOutcome::Duplicate {
                sqlx::query(q(&self.sql.insert_conflict))
                    .bind(consumer)
                    .bind(e.event_id)
                    .bind(&stored.0[..])
                    .bind(&e.fingerprint.0[..])
                    .bind(&e.aggregate_type)
                    .bind(&e.aggregate_id)
                    .bind(e.aggregate_version)
                    .bind(&e.event_type)
                    .bind(e.payload.bytes.as_ref())
                    .execute(&mut *conn)
                    .await?;
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// The most recent conflicts, newest first.
    ///
    /// # Errors
    /// [`sqlx::Error`].
    pub async fn conflicts<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
        limit: i64,
    ) -> Result<Vec<InboxConflict>, sqlx::Error> {
        use sqlx::Row;
        let rows = sqlx::query(q(&self.sql.list_conflicts))
            .bind(limit)
            .fetch_all(executor)
            .await?;
        rows.iter()
            .map(|r| {
                let fp = |i: usize| -> Result<Fingerprint, sqlx::Error> {
                    let v: Vec<u8> = r.try_get(i)?;
                    stored_fingerprint(&v, "inbox_conflicts fingerprint")
                };
                Ok(InboxConflict {
                    consumer_name: r.try_get(0)?,
                    event_id: r.try_get(1)?,
                    stored: fp(2)?,
                    received: fp(3)?,
                    aggregate_type: r.try_get(4)?,
                    aggregate_id: r.try_get(5)?,
                    aggregate_version: r.try_get(6)?,
                    event_type: r.try_get(7)?,
                    occurrences: r.try_get(8)?,
                    first_seen: r.try_get(9)?,
                    last_seen: r.try_get(10)?,
                })
            })
            .collect()
    }

    /// Number of open conflicts: recorded and not resolved by an operator (the overview's
    /// count; `ConflictOps::resolve_conflicts`).
    ///
    /// # Errors
    /// [`sqlx::Error`].
    pub async fn conflict_count<'e, E: sqlx::PgExecutor<'e>>(
        &self,
        executor: E,
    ) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(q(&self.sql.count_conflicts))
            .fetch_one(executor)
            .await
    }
}
