//! Tracing an event, or an aggregate, through everything this database holds of it.
//!
//! An event's path: its outbox row while the outbox holds it (pending, dead, or published in
//! mark mode; in delete mode a published row is gone, and the consumers' records are what is
//! left), or its copy if an operator discarded it; each consumer's inbox record of it; the
//! conflicts and consumer dead letters it caused; the remote effects (work items) it caused;
//! and the audit records that name it.
//!
//! Cost: one lookup per table through an index. The inbox is keyed by (consumer, event), so
//! its lookup walks the distinct consumer names first (a recursive walk of the primary key,
//! one probe per consumer), then probes each; the same for an aggregate's versions per
//! consumer. Conflicts and consumer dead letters, which are few, are looked up by their event
//! id index (schema version 8).

use chrono::{DateTime, Utc};
use outbox_core::EventId;
use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use super::ConflictView;

pub(super) const EVENT: &str = "SELECT id, event_id, aggregate_type, aggregate_id, \
    aggregate_version, event_type, schema_version, content_type, payload_sha256, destination, \
    partition_key, created_at, state, attempts, available_at, last_error, published_at \
    FROM {s}.events WHERE event_id = $1";

/// An aggregate's rows the outbox holds, by version (`$3`: at most this many, from the lowest).
pub(super) const AGGREGATE_EVENTS: &str = "SELECT id, event_id, aggregate_type, aggregate_id, \
    aggregate_version, event_type, schema_version, content_type, payload_sha256, destination, \
    partition_key, created_at, state, attempts, available_at, last_error, published_at \
    FROM {s}.events WHERE aggregate_type = $1 AND aggregate_id = $2 \
    ORDER BY aggregate_version LIMIT $3";

pub(super) const DISCARDED: &str = "SELECT event_id, aggregate_type, aggregate_id, \
    aggregate_version, event_type, created_at, attempts, last_error, discarded_at, audit_id \
    FROM {s}.discarded_events WHERE event_id = $1 ORDER BY audit_id DESC LIMIT 1";

pub(super) const AGGREGATE_DISCARDED: &str = "SELECT event_id, aggregate_type, aggregate_id, \
    aggregate_version, event_type, created_at, attempts, last_error, discarded_at, audit_id \
    FROM {s}.discarded_events WHERE aggregate_type = $1 AND aggregate_id = $2 \
    ORDER BY aggregate_version LIMIT $3";

/// The distinct consumer names of `{table}` by a walk of its primary key (which starts with
/// `consumer_name`): one index probe per consumer, not a read of the table.
const CONSUMERS: &str = "WITH RECURSIVE c(name) AS ( \
      (SELECT consumer_name FROM {s}.{table} ORDER BY consumer_name LIMIT 1) \
      UNION ALL \
      SELECT (SELECT t.consumer_name FROM {s}.{table} t WHERE t.consumer_name > c.name \
              ORDER BY t.consumer_name LIMIT 1) \
      FROM c WHERE c.name IS NOT NULL)";

pub(super) fn inbox_of_event() -> String {
    CONSUMERS.replace("{table}", "inbox")
        + " SELECT i.consumer_name, i.payload_sha256, i.outcome, i.received_at, \
          i.aggregate_version FROM c JOIN {s}.inbox i \
          ON i.consumer_name = c.name AND i.event_id = $1 ORDER BY i.received_at"
}

pub(super) fn inbox_of_aggregate() -> String {
    CONSUMERS.replace("{table}", "inbox_aggregates")
        + " SELECT a.consumer_name, a.last_version FROM c JOIN {s}.inbox_aggregates a \
          ON a.consumer_name = c.name AND a.aggregate_type = $1 AND a.aggregate_id = $2 \
          ORDER BY a.consumer_name"
}

pub(super) const CONSUMER_DEAD_OF_EVENT: &str = "SELECT id, consumer_name, event_id, \
    aggregate_type, aggregate_id, aggregate_version, event_type, error, attempts, state, \
    created_at FROM {s}.consumer_dead_letters WHERE event_id = $1 ORDER BY id";

pub(super) const WORK_ITEMS_OF_EVENT: &str =
    "SELECT * FROM {s}.work_items WHERE event_id = $1 ORDER BY id";

/// An outbox row as a trace shows it (everything but the payload and headers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TracedEvent {
    /// The row's storage id.
    pub id: i64,
    /// Event id.
    pub event_id: EventId,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Version.
    pub aggregate_version: i64,
    /// Event type.
    pub event_type: String,
    /// The payload's schema version.
    pub schema_version: i32,
    /// The payload's content type.
    pub content_type: String,
    /// SHA-256 of the payload, hex.
    pub payload_sha256: String,
    /// The producer's destination override.
    pub destination: Option<String>,
    /// The producer's partition key.
    pub partition_key: Option<String>,
    /// When the producer wrote it.
    pub created_at: DateTime<Utc>,
    /// `pending`, `published` (mark mode) or `dead`.
    pub state: String,
    /// Publish attempts that failed.
    pub attempts: i32,
    /// Not retried before this time.
    pub available_at: DateTime<Utc>,
    /// The last publish error.
    pub last_error: Option<String>,
    /// When the broker confirmed it (mark mode).
    pub published_at: Option<DateTime<Utc>>,
}

pub(super) fn traced_event(r: &PgRow) -> Result<TracedEvent, sqlx::Error> {
    Ok(TracedEvent {
        id: r.try_get(0)?,
        event_id: r.try_get(1)?,
        aggregate_type: r.try_get(2)?,
        aggregate_id: r.try_get(3)?,
        aggregate_version: r.try_get(4)?,
        event_type: r.try_get(5)?,
        schema_version: r.try_get(6)?,
        content_type: r.try_get(7)?,
        payload_sha256: hex::encode(r.try_get::<Vec<u8>, _>(8)?),
        destination: r.try_get(9)?,
        partition_key: r.try_get(10)?,
        created_at: r.try_get(11)?,
        state: r.try_get(12)?,
        attempts: r.try_get(13)?,
        available_at: r.try_get(14)?,
        last_error: r.try_get(15)?,
        published_at: r.try_get(16)?,
    })
}

/// A dead letter an operator discarded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiscardedEvent {
    /// Event id.
    pub event_id: EventId,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Version.
    pub aggregate_version: i64,
    /// Event type.
    pub event_type: String,
    /// When the producer wrote it.
    pub created_at: DateTime<Utc>,
    /// Publish attempts made before it was discarded.
    pub attempts: i32,
    /// The last publish error.
    pub last_error: Option<String>,
    /// When it was discarded.
    pub discarded_at: DateTime<Utc>,
    /// The audit record of the discard (who, why).
    pub audit_id: i64,
}

pub(super) fn discarded(r: &PgRow) -> Result<DiscardedEvent, sqlx::Error> {
    Ok(DiscardedEvent {
        event_id: r.try_get(0)?,
        aggregate_type: r.try_get(1)?,
        aggregate_id: r.try_get(2)?,
        aggregate_version: r.try_get(3)?,
        event_type: r.try_get(4)?,
        created_at: r.try_get(5)?,
        attempts: r.try_get(6)?,
        last_error: r.try_get(7)?,
        discarded_at: r.try_get(8)?,
        audit_id: r.try_get(9)?,
    })
}

/// A consumer's inbox record of an event: it was applied (or absorbed as stale) there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InboxRecord {
    /// The consumer.
    pub consumer_name: String,
    /// SHA-256 of the payload it applied, hex.
    pub payload_sha256: String,
    /// `applied`, or `stale` (absorbed by the ordering guard without effect).
    pub outcome: String,
    /// When it committed.
    pub received_at: DateTime<Utc>,
    /// The event's version as the consumer saw it.
    pub aggregate_version: i64,
}

pub(super) fn inbox_record(r: &PgRow) -> Result<InboxRecord, sqlx::Error> {
    Ok(InboxRecord {
        consumer_name: r.try_get(0)?,
        payload_sha256: hex::encode(r.try_get::<Vec<u8>, _>(1)?),
        outcome: r.try_get(2)?,
        received_at: r.try_get(3)?,
        aggregate_version: r.try_get(4)?,
    })
}

/// Everything this database holds of one event (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventTrace {
    /// The event id traced.
    pub event_id: EventId,
    /// Its outbox row, while the outbox holds it.
    pub outbox: Option<TracedEvent>,
    /// Its copy, if an operator discarded it.
    pub discarded: Option<DiscardedEvent>,
    /// Each consumer's inbox record of it.
    pub inbox: Vec<InboxRecord>,
    /// Conflicts: the id arrived at a consumer with another payload.
    pub conflicts: Vec<ConflictView>,
    /// Consumer dead letters of it (any state).
    pub consumer_dead_letters: Vec<outbox_core::consumer::ConsumerDeadLetter>,
    /// Remote effects it caused.
    pub work_items: Vec<crate::effects::WorkItemRow>,
    /// Audit records that name it, newest first.
    pub audit: Vec<super::AuditEntry>,
}

/// A consumer's progress on an aggregate (its ordering guard).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerProgress {
    /// The consumer.
    pub consumer_name: String,
    /// The last version it applied.
    pub last_version: i64,
}

/// Everything this database holds of one aggregate's events.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AggregateTrace {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// The outbox's rows of it, lowest version first (at most the limit asked for).
    pub outbox: Vec<TracedEvent>,
    /// Its discarded events.
    pub discarded: Vec<DiscardedEvent>,
    /// Each consumer's last applied version of it.
    pub consumers: Vec<ConsumerProgress>,
}

pub(super) fn progress(r: &PgRow) -> Result<ConsumerProgress, sqlx::Error> {
    Ok(ConsumerProgress {
        consumer_name: r.try_get(0)?,
        last_version: r.try_get(1)?,
    })
}

/// A statement being bound (it owns its SQL and its arguments).
pub(super) type Query = sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Runs `sql` (rendered for `schema`) with `bind` applied, decoding every row with `decode`.
pub(super) async fn rows<T>(
    pool: &sqlx::PgPool,
    schema: &crate::schema::Schema,
    sql: &str,
    bind: impl FnOnce(Query) -> Query,
    decode: impl Fn(&PgRow) -> Result<T, sqlx::Error>,
) -> Result<Vec<T>, sqlx::Error> {
    bind(sqlx::query(AssertSqlSafe(schema.render(sql))))
        .fetch_all(pool)
        .await?
        .iter()
        .map(decode)
        .collect()
}
