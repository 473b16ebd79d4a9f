//! Tracing an event, or an aggregate, through everything the store holds of it: its outbox
//! row while the outbox holds it (pending, dead, or published in mark mode), or its copy if an
//! operator discarded it; each consumer's inbox record of it; the conflicts and consumer dead
//! letters it caused; the remote effects (work items) it caused; and the audit records that
//! name it.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{ConflictView, OperatorError};
use crate::{EventId, OutboxMessage};

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

impl TracedEvent {
    /// The trace of the outbox row `m` in `state` (`pending`, `published` or `dead`): its
    /// fields but the payload and headers, with the payload's content type and fingerprint
    /// (hex) in their place, and the relay's bookkeeping of it (`available_at`, `last_error`,
    /// `published_at`), for a store that holds its rows as [`OutboxMessage`]s.
    ///
    /// ```
    /// use outbox_core::operator::TracedEvent;
    /// use outbox_core::{NewMessage, Payload};
    /// let now = chrono::Utc::now();
    /// let row = NewMessage::new("payment", "p-1", 1, "PaymentCreated", Payload::json(&1).unwrap())
    ///     .stored(7, now);
    /// let t = TracedEvent::of_message(&row, "pending", now, None, None);
    /// assert_eq!((t.id, t.event_id, t.state.as_str()), (7, row.event_id, "pending"));
    /// assert_eq!(t.payload_sha256, row.fingerprint.to_hex());
    /// assert_eq!(t.content_type, "application/json");
    /// ```
    pub fn of_message(
        m: &OutboxMessage,
        state: impl Into<String>,
        available_at: DateTime<Utc>,
        last_error: Option<String>,
        published_at: Option<DateTime<Utc>>,
    ) -> Self {
        Self {
            id: m.id,
            event_id: m.event_id,
            aggregate_type: m.aggregate_type.clone(),
            aggregate_id: m.aggregate_id.clone(),
            aggregate_version: m.aggregate_version,
            event_type: m.event_type.clone(),
            schema_version: m.schema_version,
            content_type: m.payload.content_type.0.clone(),
            payload_sha256: m.fingerprint.to_hex(),
            destination: m.destination.clone(),
            partition_key: m.partition_key.clone(),
            created_at: m.created_at,
            state: state.into(),
            attempts: m.attempts,
            available_at,
            last_error,
            published_at,
        }
    }
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
    pub consumer_dead_letters: Vec<crate::consumer::ConsumerDeadLetter>,
    /// Remote effects it caused.
    pub work_items: Vec<super::WorkItemRow>,
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

/// Traces.
pub trait TraceOps {
    /// Everything the store holds of `event_id` ([`EventTrace`]).
    ///
    /// # Errors
    /// [`OperatorError`]: the store's failure.
    fn trace_event(
        &self,
        event_id: EventId,
    ) -> impl Future<Output = Result<EventTrace, OperatorError>> + Send;

    /// Everything the store holds of one aggregate's events: the outbox's rows (lowest version
    /// first, at most `limit`, 1 to [`MAX_LIST`](super::MAX_LIST)), the discarded ones, and
    /// each consumer's last applied version.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// store's failure.
    fn trace_aggregate(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        limit: i64,
    ) -> impl Future<Output = Result<AggregateTrace, OperatorError>> + Send;
}
