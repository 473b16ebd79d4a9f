//! Outbox and consumer dead letters of the [`MemoryStore`]: listed, grouped, read whole,
//! requeued and discarded.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use outbox_core::EventId;
use outbox_core::consumer::{ConsumerDeadLetterState, RawMessage};
use outbox_core::operator::{
    Action, ConsumerDeadLetterDetail, ConsumerDeadLetterGroup, ConsumerDeadLetterGroups,
    ConsumerDeadLetterView, ConsumerSelection, DeadLetterDetail, DeadLetterFilter, DeadLetterGroup,
    DeadLetterGroups, DeadLetterOps, DeadLetterSelection, DeadLetterView, Discarded, GROUP_SCAN,
    OperatorError, PayloadView, page_size, reason_key,
};
use serde_json::Value;

use super::{Discard, count, is_open};
use crate::memory::{DeadLetterRow, MemoryStore, OutboxRow, RowState, lock};

fn row_reason(r: &OutboxRow) -> String {
    reason_key(r.last_error.as_deref())
}

/// Whether the outbox row `r` is a dead letter `which` selects.
fn selects(which: &DeadLetterSelection, r: &OutboxRow) -> bool {
    r.state == RowState::Dead
        && match which {
            DeadLetterSelection::Ids(ids) => ids.contains(&r.msg.event_id),
            DeadLetterSelection::Matching(f) => matches_filter(f, r),
            DeadLetterSelection::All => true,
        }
}

fn matches_filter(f: &DeadLetterFilter, r: &OutboxRow) -> bool {
    f.matches(
        &r.msg.aggregate_type,
        &r.msg.event_type,
        r.msg.destination.as_deref(),
        &row_reason(r),
        r.msg.created_at,
    )
}

/// Whether the consumer dead letter `d` (id `id`) matches `which` (its state aside).
fn consumer_selects(which: &ConsumerSelection, id: i64, d: &DeadLetterRow) -> bool {
    which.consumer.as_deref().is_none_or(|c| c == d.consumer)
        && which.ids.as_ref().is_none_or(|ids| ids.contains(&id))
        && which
            .reason_group
            .as_deref()
            .is_none_or(|r| r == reason_key(Some(&d.error)))
}
fn dead_letter_view(rows: &BTreeMap<i64, OutboxRow>, r: &OutboxRow) -> DeadLetterView {
    let m = &r.msg;
    let blocked_behind = rows
        .values()
        .filter(|b| {
            b.state == RowState::Pending
                && b.msg.aggregate_type == m.aggregate_type
                && b.msg.aggregate_id == m.aggregate_id
                && b.msg.aggregate_version > m.aggregate_version
        })
        .count();
    DeadLetterView {
        event_id: m.event_id,
        aggregate_type: m.aggregate_type.clone(),
        aggregate_id: m.aggregate_id.clone(),
        aggregate_version: m.aggregate_version,
        event_type: m.event_type.clone(),
        attempts: m.attempts,
        last_error: r.last_error.clone(),
        created_at: m.created_at,
        blocked_behind: count(blocked_behind),
        destination: m.destination.clone(),
        content_type: m.payload.content_type.0.clone(),
        schema_version: m.schema_version,
        reason: row_reason(r),
    }
}
/// Text a PostgreSQL text column can hold: NUL shows as U+FFFD (what the PostgreSQL store
/// shows of a consumer dead letter's headers).
fn readable(s: &str) -> String {
    s.replace('\0', "\u{FFFD}")
}

/// A received message's headers as one JSON object of text (binary values lossily).
fn headers_json(raw: &RawMessage) -> Value {
    let map: BTreeMap<String, String> = raw
        .headers
        .iter()
        .map(|(k, v)| (readable(k), readable(v)))
        .chain(
            raw.binary_headers
                .iter()
                .map(|(k, v)| (readable(k), readable(&String::from_utf8_lossy(v)))),
        )
        .collect();
    serde_json::to_value(map).unwrap_or_default()
}
impl DeadLetterOps for MemoryStore {
    async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<DeadLetterView>, OperatorError> {
        let take = page_size("dead letters", limit)?;
        let o = lock(&self.inner.outbox);
        Ok(o.rows
            .values()
            .filter(|r| r.state == RowState::Dead && matches_filter(filter, r))
            .take(take)
            .map(|r| dead_letter_view(&o.rows, r))
            .collect())
    }

    async fn dead_letter_groups(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<DeadLetterGroups, OperatorError> {
        struct Acc {
            count: i64,
            first: DateTime<Utc>,
            last: DateTime<Utc>,
            types: BTreeSet<String>,
            events: BTreeSet<String>,
            example: Option<String>,
        }
        let mut by_reason: BTreeMap<String, Acc> = BTreeMap::new();
        {
            let o = lock(&self.inner.outbox);
            let scan = usize::try_from(GROUP_SCAN).unwrap_or(usize::MAX);
            for r in o
                .rows
                .values()
                .filter(|r| r.state == RowState::Dead && matches_filter(filter, r))
                .take(scan)
            {
                let at = r.msg.created_at;
                let acc = by_reason.entry(row_reason(r)).or_insert_with(|| Acc {
                    count: 0,
                    first: at,
                    last: at,
                    types: BTreeSet::new(),
                    events: BTreeSet::new(),
                    // The oldest one's (rows are read in the table's order).
                    example: r.last_error.clone(),
                });
                acc.count += 1;
                acc.first = acc.first.min(at);
                acc.last = acc.last.max(at);
                acc.types.insert(r.msg.aggregate_type.clone());
                acc.events.insert(r.msg.event_type.clone());
            }
        }
        let groups: Vec<DeadLetterGroup> = by_reason
            .into_iter()
            .map(|(reason, a)| DeadLetterGroup {
                reason,
                count: a.count,
                first_created_at: a.first,
                last_created_at: a.last,
                aggregate_types: a.types.into_iter().take(10).collect(),
                event_types: a.events.into_iter().take(10).collect(),
                example_error: a.example,
            })
            .collect();
        // In reason order (the map's): `from_scan` puts the largest first, that order kept
        // among groups of one count.
        Ok(DeadLetterGroups::from_scan(groups))
    }

    async fn dead_letter(&self, event_id: EventId) -> Result<DeadLetterDetail, OperatorError> {
        let o = lock(&self.inner.outbox);
        let r = o
            .rows
            .values()
            .find(|r| r.state == RowState::Dead && r.msg.event_id == event_id)
            .ok_or_else(|| {
                OperatorError::not_found(
                    "dead letter",
                    format!("{event_id} is not an outbox dead letter"),
                )
            })?;
        Ok(DeadLetterDetail {
            dead_letter: dead_letter_view(&o.rows, r),
            payload: PayloadView::of(r.msg.payload.bytes.to_vec()),
            headers: serde_json::to_value(&r.msg.headers).unwrap_or_default(),
            partition_key: r.msg.partition_key.clone(),
        })
    }

    async fn apply_requeue_dead_letters(
        &self,
        action: &Action<'_>,
        which: &DeadLetterSelection,
    ) -> Result<u64, OperatorError> {
        let n = {
            let mut o = lock(&self.inner.outbox);
            let now = Utc::now();
            let mut n = 0;
            for r in o.rows.values_mut().filter(|r| selects(which, r)) {
                r.state = RowState::Pending;
                r.msg.attempts = 0;
                r.available_at = now;
                n += 1;
            }
            lock(&self.inner.ops).record(action, n);
            n
        };
        if n > 0 {
            self.inner.wake.notify_waiters();
        }
        Ok(n)
    }

    async fn apply_discard_dead_letters(
        &self,
        action: &Action<'_>,
        which: &DeadLetterSelection,
    ) -> Result<Discarded, OperatorError> {
        let discarded = {
            let mut o = lock(&self.inner.outbox);
            let ids: Vec<i64> = o
                .rows
                .iter()
                .filter(|(_, r)| selects(which, r))
                .map(|(id, _)| *id)
                .collect();
            let removed: Vec<OutboxRow> = ids.iter().filter_map(|id| o.rows.remove(id)).collect();
            let discarded = removed.len() as u64;
            let mut ops = lock(&self.inner.ops);
            let audit_id = ops.record(action, discarded);
            let discarded_at = Utc::now();
            ops.discarded.extend(removed.into_iter().map(|row| Discard {
                row,
                discarded_at,
                audit_id,
            }));
            Discarded {
                discarded,
                audit_id,
            }
        };
        // The events that waited behind the discarded ones may be claimed now.
        if discarded.discarded > 0 {
            self.inner.wake.notify_waiters();
        }
        Ok(discarded)
    }

    async fn consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        limit: i64,
    ) -> Result<Vec<ConsumerDeadLetterView>, OperatorError> {
        let take = page_size("consumer dead letters", limit)?;
        let c = lock(&self.inner.consumer);
        Ok(c.dead
            .iter()
            .filter(|(id, d)| is_open(d) && consumer_selects(which, **id, d))
            .take(take)
            .map(|(id, d)| ConsumerDeadLetterView {
                dead_letter: d.view(*id),
                reason: reason_key(Some(&d.error)),
            })
            .collect())
    }

    async fn consumer_dead_letter_groups(
        &self,
        which: &ConsumerSelection,
    ) -> Result<ConsumerDeadLetterGroups, OperatorError> {
        let mut by_key: BTreeMap<(String, String), ConsumerDeadLetterGroup> = BTreeMap::new();
        {
            let c = lock(&self.inner.consumer);
            let scan = usize::try_from(GROUP_SCAN).unwrap_or(usize::MAX);
            for (_, d) in c
                .dead
                .iter()
                .filter(|(id, d)| is_open(d) && consumer_selects(which, **id, d))
                .take(scan)
            {
                let key = (d.consumer.clone(), reason_key(Some(&d.error)));
                let g = by_key
                    .entry(key.clone())
                    .or_insert_with(|| ConsumerDeadLetterGroup {
                        consumer_name: key.0,
                        reason: key.1,
                        count: 0,
                        first_at: d.created_at,
                        last_at: d.created_at,
                        example_error: d.error.clone(),
                    });
                g.count += 1;
                g.first_at = g.first_at.min(d.created_at);
                g.last_at = g.last_at.max(d.created_at);
            }
        }
        // By consumer, then reason (the map's order): `from_scan` puts the largest first, that
        // order kept among groups of one count.
        Ok(ConsumerDeadLetterGroups::from_scan(
            by_key.into_values().collect(),
        ))
    }

    async fn consumer_dead_letter(
        &self,
        id: i64,
    ) -> Result<ConsumerDeadLetterDetail, OperatorError> {
        let c = lock(&self.inner.consumer);
        let d = c.dead.get(&id).ok_or_else(|| {
            OperatorError::not_found(
                "consumer dead letter",
                format!("no consumer dead letter {id}"),
            )
        })?;
        Ok(ConsumerDeadLetterDetail {
            dead_letter: ConsumerDeadLetterView {
                dead_letter: d.view(id),
                reason: reason_key(Some(&d.error)),
            },
            payload: PayloadView::of(d.raw.payload.to_vec()),
            headers: headers_json(&d.raw),
            content_type: d.raw.content_type.as_deref().map(readable),
        })
    }

    async fn apply_requeue_consumer_dead_letters(
        &self,
        action: &Action<'_>,
        which: &ConsumerSelection,
    ) -> Result<u64, OperatorError> {
        self.consumer_action(action, ConsumerDeadLetterState::Requeued, which)
            .await
    }

    async fn apply_discard_consumer_dead_letters(
        &self,
        action: &Action<'_>,
        which: &ConsumerSelection,
    ) -> Result<u64, OperatorError> {
        self.consumer_action(action, ConsumerDeadLetterState::Resolved, which)
            .await
    }
}

impl MemoryStore {
    /// Moves the consumer dead letters `which` selects from `dead` to `to`, with the audit
    /// record of `action`, under the transaction lock (no consumer transaction is open
    /// meanwhile).
    async fn consumer_action(
        &self,
        action: &Action<'_>,
        to: ConsumerDeadLetterState,
        which: &ConsumerSelection,
    ) -> Result<u64, OperatorError> {
        let _tx = self.inner.tx_lock.lock().await;
        let n = {
            let mut guard = lock(&self.inner.consumer);
            let c = &mut *guard;
            c.updates += 1;
            let stamp = c.updates;
            let mut n = 0;
            for (id, d) in c.dead.iter_mut() {
                if d.state == ConsumerDeadLetterState::Dead && consumer_selects(which, *id, d) {
                    d.state = to;
                    d.updated = stamp;
                    n += 1;
                }
            }
            lock(&self.inner.ops).record(action, n);
            n
        };
        Ok(n)
    }
}
