//! The audit of the [`MemoryStore`], and the traces of an event and of an aggregate.

use std::collections::HashSet;

use outbox_core::EventId;
use outbox_core::operator::{
    AggregateTrace, AuditEntry, AuditOps, ConsumerProgress, DiscardedEvent, EventTrace,
    InboxRecord, OperatorError, TraceOps, TracedEvent, page_size,
};
use serde_json::Value;

use super::Discard;
use super::conflicts::conflict_view;
use super::work_items::work_item_row;
use crate::memory::{ConflictRow, MemoryStore, OutboxRow, RowState, lock};

fn state_name(state: RowState) -> &'static str {
    match state {
        RowState::Pending => "pending",
        RowState::Dead => "dead",
        RowState::Published => "published",
    }
}

fn traced(r: &OutboxRow) -> TracedEvent {
    TracedEvent::of_message(
        &r.msg,
        state_name(r.state),
        r.available_at,
        r.last_error.clone(),
        // Never set: a published row is deleted.
        None,
    )
}

fn discarded_event(d: &Discard) -> DiscardedEvent {
    let m = &d.row.msg;
    DiscardedEvent {
        event_id: m.event_id,
        aggregate_type: m.aggregate_type.clone(),
        aggregate_id: m.aggregate_id.clone(),
        aggregate_version: m.aggregate_version,
        event_type: m.event_type.clone(),
        created_at: m.created_at,
        attempts: m.attempts,
        last_error: d.row.last_error.clone(),
        discarded_at: d.discarded_at,
        audit_id: d.audit_id,
    }
}
impl AuditOps for MemoryStore {
    async fn audit(
        &self,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AuditEntry>, OperatorError> {
        let take = page_size("audit", limit)?;
        Ok(lock(&self.inner.ops)
            .audit
            .iter()
            .rev()
            .filter(|a| before.is_none_or(|b| a.id < b))
            .take(take)
            .cloned()
            .collect())
    }
}

impl TraceOps for MemoryStore {
    async fn trace_event(&self, event_id: EventId) -> Result<EventTrace, OperatorError> {
        let outbox = lock(&self.inner.outbox)
            .rows
            .values()
            .find(|r| r.msg.event_id == event_id)
            .map(traced);
        let (mut inbox, conflicts, consumer_dead_letters) = {
            let c = lock(&self.inner.consumer);
            let inbox: Vec<InboxRecord> = c
                .inbox
                .iter()
                .filter(|((_, e), _)| *e == event_id)
                .map(|(key, row)| InboxRecord {
                    consumer_name: key.0.clone(),
                    payload_sha256: row.fingerprint.to_hex(),
                    outcome: if c.stale.contains(key) {
                        "stale"
                    } else {
                        "applied"
                    }
                    .to_owned(),
                    received_at: row.received_at,
                    aggregate_version: row.aggregate_version,
                })
                .collect();
            let mut conflicts: Vec<ConflictRow> = c
                .conflicts
                .iter()
                .filter(|x| x.event_id == event_id)
                .cloned()
                .collect();
            conflicts.sort_by_key(|c| std::cmp::Reverse(c.id));
            let dead = c
                .dead
                .iter()
                .filter(|(_, d)| d.identity.event_id == Some(event_id))
                .map(|(id, d)| d.view(*id))
                .collect();
            (inbox, conflicts, dead)
        };
        inbox.sort_by(|a, b| {
            (a.received_at, &a.consumer_name).cmp(&(b.received_at, &b.consumer_name))
        });
        let work_items = lock(&self.inner.work)
            .items
            .values()
            .filter(|r| r.item.event_id == Some(event_id))
            .map(work_item_row)
            .collect();
        let ops = lock(&self.inner.ops);
        let discards: Vec<&Discard> = ops
            .discarded
            .iter()
            .filter(|d| d.row.msg.event_id == event_id)
            .collect();
        let discard_audits: HashSet<i64> = discards.iter().map(|d| d.audit_id).collect();
        let id_text = event_id.to_string();
        let names = |a: &AuditEntry| {
            a.selection
                .get("event_ids")
                .and_then(Value::as_array)
                .is_some_and(|ids| ids.iter().any(|v| v.as_str() == Some(&id_text)))
        };
        let audit = ops
            .audit
            .iter()
            .rev()
            .filter(|a| names(a) || discard_audits.contains(&a.id))
            .take(100)
            .cloned()
            .collect();
        Ok(EventTrace {
            event_id,
            outbox,
            discarded: discards
                .iter()
                .max_by_key(|d| d.audit_id)
                .map(|d| discarded_event(d)),
            inbox,
            conflicts: conflicts.iter().map(|c| conflict_view(c, &ops)).collect(),
            consumer_dead_letters,
            work_items,
            audit,
        })
    }

    async fn trace_aggregate(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        limit: i64,
    ) -> Result<AggregateTrace, OperatorError> {
        let take = page_size("trace", limit)?;
        let of = |t: &str, i: &str| t == aggregate_type && i == aggregate_id;
        let mut outbox: Vec<TracedEvent> = lock(&self.inner.outbox)
            .rows
            .values()
            .filter(|r| of(&r.msg.aggregate_type, &r.msg.aggregate_id))
            .map(traced)
            .collect();
        outbox.sort_by_key(|e| e.aggregate_version);
        outbox.truncate(take);
        let mut discarded: Vec<DiscardedEvent> = lock(&self.inner.ops)
            .discarded
            .iter()
            .filter(|d| of(&d.row.msg.aggregate_type, &d.row.msg.aggregate_id))
            .map(discarded_event)
            .collect();
        discarded.sort_by_key(|d| d.aggregate_version);
        discarded.truncate(take);
        let mut consumers: Vec<ConsumerProgress> = lock(&self.inner.consumer)
            .aggregates
            .iter()
            .filter(|((_, t, i), _)| of(t, i))
            .map(|((consumer, _, _), last)| ConsumerProgress {
                consumer_name: consumer.clone(),
                last_version: *last,
            })
            .collect();
        consumers.sort_by(|a, b| a.consumer_name.cmp(&b.consumer_name));
        Ok(AggregateTrace {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            outbox,
            discarded,
            consumers,
        })
    }
}
