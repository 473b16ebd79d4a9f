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

use outbox_core::EventId;
use outbox_core::operator::{
    AggregateTrace, ConflictFilter, ConflictOps, ConsumerProgress, DiscardedEvent, EventTrace,
    InboxRecord, MAX_LIST, OperatorError, TraceOps, TracedEvent, check_limit,
};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use super::{audit, op_err};
use crate::store::PgStore;

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

pub(super) fn inbox_record(r: &PgRow) -> Result<InboxRecord, sqlx::Error> {
    Ok(InboxRecord {
        consumer_name: r.try_get(0)?,
        payload_sha256: hex::encode(r.try_get::<Vec<u8>, _>(1)?),
        outcome: r.try_get(2)?,
        received_at: r.try_get(3)?,
        aggregate_version: r.try_get(4)?,
    })
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

impl TraceOps for PgStore {
    async fn trace_event(&self, event_id: EventId) -> Result<EventTrace, OperatorError> {
        let (pool, schema) = (self.pool(), self.schema());
        let err = |e| op_err("trace", e);
        let bind = |q: Query| q.bind(event_id);
        Ok(EventTrace {
            event_id,
            outbox: rows(pool, schema, EVENT, bind, traced_event)
                .await
                .map_err(err)?
                .pop(),
            discarded: rows(pool, schema, DISCARDED, bind, discarded)
                .await
                .map_err(err)?
                .pop(),
            inbox: rows(pool, schema, &inbox_of_event(), bind, inbox_record)
                .await
                .map_err(err)?,
            conflicts: self
                .conflicts(ConflictFilter::of(event_id), MAX_LIST)
                .await?,
            consumer_dead_letters: rows(
                pool,
                schema,
                CONSUMER_DEAD_OF_EVENT,
                bind,
                crate::consumer::dead_letter_from_row,
            )
            .await
            .map_err(err)?,
            work_items: rows(
                pool,
                schema,
                WORK_ITEMS_OF_EVENT,
                bind,
                crate::effects::row_to_item,
            )
            .await
            .map_err(err)?,
            audit: audit::of_event(pool, schema, event_id).await.map_err(err)?,
        })
    }

    async fn trace_aggregate(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        limit: i64,
    ) -> Result<AggregateTrace, OperatorError> {
        check_limit("trace", limit)?;
        let (pool, schema) = (self.pool(), self.schema());
        let err = |e| op_err("trace", e);
        let (t, i) = (aggregate_type.to_owned(), aggregate_id.to_owned());
        Ok(AggregateTrace {
            outbox: rows(
                pool,
                schema,
                AGGREGATE_EVENTS,
                |q| q.bind(t.clone()).bind(i.clone()).bind(limit),
                traced_event,
            )
            .await
            .map_err(err)?,
            discarded: rows(
                pool,
                schema,
                AGGREGATE_DISCARDED,
                |q| q.bind(t.clone()).bind(i.clone()).bind(limit),
                discarded,
            )
            .await
            .map_err(err)?,
            consumers: rows(
                pool,
                schema,
                &inbox_of_aggregate(),
                |q| q.bind(t.clone()).bind(i.clone()),
                progress,
            )
            .await
            .map_err(err)?,
            aggregate_type: t,
            aggregate_id: i,
        })
    }
}
