//! The consumer side of the [`MemoryStore`]: [`InboxStore`] (transactions, the inbox,
//! conflicts, consumer dead letters, pauses), the connection a handler writes on, and what a
//! fixture reads and ages there.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use outbox_core::consumer::{
    ConsumerDeadLetter, ConsumerDeadLetterState, InboxOutcome, InboxStore, NewConsumerDeadLetter,
    OrderingGuard, RequeuedDeadLetter,
};
use outbox_core::effect::NewWorkItem;
use outbox_core::{IncomingEvent, NewMessage, StoreError, StoreErrorKind};
use tokio::sync::OwnedMutexGuard;

use super::{
    ConflictRow, ConsumerState, DeadLetterRow, InboxRow, MemoryConflict, MemoryStore, chrono, lock,
};

impl MemoryStore {
    /// The committed count of the effect `key` (written by handlers with
    /// [`MemoryConn::effect`]).
    pub fn effect_count(&self, key: &str) -> u64 {
        lock(&self.inner.consumer)
            .effects
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Recorded conflicts, oldest first.
    pub fn conflict_records(&self) -> Vec<MemoryConflict> {
        lock(&self.inner.consumer)
            .conflicts
            .iter()
            .map(|c| MemoryConflict {
                consumer: c.consumer.clone(),
                event_id: c.event_id,
                stored: c.stored,
                received: c.received,
                occurrences: c.occurrences,
            })
            .collect()
    }

    /// Pauses (`true`) or resumes `consumer` directly, without an audit record (a test's
    /// shortcut; [`PauseOps`](outbox_core::operator::PauseOps) is the operator's way, audited).
    pub fn set_consumer_paused(&self, consumer: &str, paused: bool) {
        lock(&self.inner.ops).set_consumer_paused(consumer, paused);
    }

    /// Consumer dead letters (all states), oldest first.
    pub fn consumer_dead_letter_records(&self, consumer: Option<&str>) -> Vec<ConsumerDeadLetter> {
        lock(&self.inner.consumer)
            .dead
            .iter()
            .filter(|(_, d)| consumer.is_none_or(|c| c == d.consumer))
            .map(|(id, d)| d.view(*id))
            .collect()
    }

    /// Hands dead letters back to their consumer (all open ones of `consumer` when `ids` is
    /// `None`), as an operator's requeue does. Returns how many.
    pub async fn consumer_dead_letter_requeue(
        &self,
        consumer: Option<&str>,
        ids: Option<&[i64]>,
    ) -> u64 {
        let _tx = self.inner.tx_lock.lock().await;
        let mut c = lock(&self.inner.consumer);
        c.updates += 1;
        let stamp = c.updates;
        let mut n = 0;
        for (id, d) in c.dead.iter_mut() {
            if d.state == ConsumerDeadLetterState::Dead
                && consumer.is_none_or(|c| c == d.consumer)
                && ids.is_none_or(|ids| ids.contains(id))
            {
                d.state = ConsumerDeadLetterState::Requeued;
                d.updated = stamp;
                n += 1;
            }
        }
        n
    }

    /// Moves the receive time of every inbox identity back by `by` (to test retention).
    pub fn age_inbox(&self, by: Duration) {
        for row in lock(&self.inner.consumer).inbox.values_mut() {
            row.received_at -= chrono(by);
        }
    }

    /// Inbox identities held (all consumers).
    pub fn inbox_len(&self) -> usize {
        lock(&self.inner.consumer).inbox.len()
    }
}

/// The connection of a [`MemoryTx`]: the consumer-side state as this transaction sees it, and
/// the rows it will add on commit.
#[derive(Debug)]
pub struct MemoryConn {
    pub(super) state: ConsumerState,
    pub(super) outbox: Vec<NewMessage>,
    pub(super) work_items: Vec<NewWorkItem>,
}

impl MemoryConn {
    /// Adds one to the effect `key` (a handler's business write).
    pub fn effect(&mut self, key: &str) {
        *self.state.effects.entry(key.to_owned()).or_default() += 1;
    }

    /// The effect `key` as this transaction sees it.
    pub fn effect_count(&self, key: &str) -> u64 {
        self.state.effects.get(key).copied().unwrap_or(0)
    }

    /// Writes an outbox row with this transaction (a consumer that produces).
    pub fn enqueue(&mut self, message: NewMessage) {
        self.outbox.push(message);
    }
}

/// An open transaction of the [`MemoryStore`]; dropping it rolls it back.
#[derive(Debug)]
pub struct MemoryTx {
    conn: MemoryConn,
    _lock: OwnedMutexGuard<()>,
}

impl Deref for MemoryTx {
    type Target = MemoryConn;
    fn deref(&self) -> &MemoryConn {
        &self.conn
    }
}

impl DerefMut for MemoryTx {
    fn deref_mut(&mut self) -> &mut MemoryConn {
        &mut self.conn
    }
}

impl InboxStore for MemoryStore {
    type Conn = MemoryConn;
    type Tx = MemoryTx;

    async fn begin(&self) -> Result<MemoryTx, StoreError> {
        let guard = Arc::clone(&self.inner.tx_lock).lock_owned().await;
        Ok(MemoryTx {
            conn: MemoryConn {
                state: lock(&self.inner.consumer).clone(),
                outbox: Vec::new(),
                work_items: Vec::new(),
            },
            _lock: guard,
        })
    }

    async fn commit(&self, tx: MemoryTx) -> Result<(), StoreError> {
        let MemoryTx { conn, _lock } = tx;
        if !conn.outbox.is_empty() {
            self.enqueue(&conn.outbox)
                .map_err(|e| StoreError::new(StoreErrorKind::Constraint, e.to_string()))?;
        }
        self.enqueue_work_items(conn.work_items);
        *lock(&self.inner.consumer) = conn.state;
        Ok(())
    }

    async fn rollback(&self, _tx: MemoryTx) -> Result<(), StoreError> {
        Ok(())
    }

    async fn inbox_record<'a>(
        &'a self,
        conn: &'a mut MemoryConn,
        consumer: &'a str,
        guard: OrderingGuard,
        event: &'a IncomingEvent,
    ) -> Result<InboxOutcome, StoreError> {
        let s = &mut conn.state;
        let key = (consumer.to_owned(), event.event_id);
        if let Some(row) = s.inbox.get(&key) {
            let stored = row.fingerprint;
            let outcome = InboxOutcome::seen_again(stored, event.fingerprint);
            if outcome == InboxOutcome::Duplicate {
                return Ok(outcome);
            }
            let now = Utc::now();
            match s.conflicts.iter_mut().find(|c| {
                c.consumer == consumer
                    && c.event_id == event.event_id
                    && c.received == event.fingerprint
            }) {
                // Seen again: counted, and reopened if an operator had resolved it.
                Some(c) => {
                    c.occurrences += 1;
                    c.last_seen = now;
                    c.resolved_at = None;
                    c.resolved_audit_id = None;
                }
                None => {
                    s.next_conflict += 1;
                    s.conflicts.push(ConflictRow {
                        id: s.next_conflict,
                        consumer: consumer.to_owned(),
                        event_id: event.event_id,
                        stored,
                        received: event.fingerprint,
                        aggregate_type: event.aggregate_type.clone(),
                        aggregate_id: event.aggregate_id.clone(),
                        aggregate_version: event.aggregate_version,
                        event_type: event.event_type.clone(),
                        payload: event.payload.bytes.clone(),
                        occurrences: 1,
                        first_seen: now,
                        last_seen: now,
                        resolved_at: None,
                        resolved_audit_id: None,
                    });
                }
            }
            return Ok(outcome);
        }
        s.inbox.insert(
            key.clone(),
            InboxRow {
                fingerprint: event.fingerprint,
                received_at: Utc::now(),
                aggregate_version: event.aggregate_version,
            },
        );
        if guard == OrderingGuard::Off {
            return Ok(InboxOutcome::New);
        }
        let agg = (
            consumer.to_owned(),
            event.aggregate_type.clone(),
            event.aggregate_id.clone(),
        );
        let last = s.aggregates.get(&agg).copied().unwrap_or(0);
        let outcome = guard.judge(last, event.aggregate_version);
        match outcome {
            InboxOutcome::Stale { .. } => {
                s.stale.insert(key);
            }
            InboxOutcome::New => {
                s.aggregates.insert(agg, event.aggregate_version);
            }
            _ => {}
        }
        Ok(outcome)
    }

    async fn inbox_record_many<'a>(
        &'a self,
        conn: &'a mut MemoryConn,
        consumer: &'a str,
        events: &'a [&'a IncomingEvent],
    ) -> Result<Vec<InboxOutcome>, StoreError> {
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            out.push(
                self.inbox_record(conn, consumer, OrderingGuard::Off, e)
                    .await?,
            );
        }
        Ok(out)
    }

    async fn consumer_dead_letter_insert<'a>(
        &'a self,
        conn: &'a mut MemoryConn,
        letter: NewConsumerDeadLetter<'a>,
    ) -> Result<(), StoreError> {
        let s = &mut conn.state;
        s.next_dead += 1;
        s.updates += 1;
        let id = s.next_dead;
        let updated = s.updates;
        s.dead.insert(
            id,
            DeadLetterRow {
                consumer: letter.consumer.to_owned(),
                raw: letter.raw.clone(),
                identity: letter.identity.clone(),
                error: letter.error.to_owned(),
                attempts: i32::try_from(letter.attempts).unwrap_or(i32::MAX),
                state: ConsumerDeadLetterState::Dead,
                created_at: Utc::now(),
                updated,
            },
        );
        Ok(())
    }

    async fn consumer_dead_letter_take_requeued<'a>(
        &'a self,
        conn: &'a mut MemoryConn,
        consumer: &'a str,
        limit: usize,
    ) -> Result<Vec<RequeuedDeadLetter>, StoreError> {
        let mut letters: Vec<(u64, i64, &DeadLetterRow)> = conn
            .state
            .dead
            .iter()
            .filter(|(_, d)| d.consumer == consumer && d.state == ConsumerDeadLetterState::Requeued)
            .map(|(id, d)| (d.updated, *id, d))
            .collect();
        letters.sort_by_key(|(updated, id, _)| (*updated, *id));
        Ok(letters
            .into_iter()
            .take(limit)
            .map(|(_, id, d)| RequeuedDeadLetter {
                id,
                raw: d.raw.clone(),
                attempts: d.attempts,
            })
            .collect())
    }

    async fn consumer_dead_letter_settle<'a>(
        &'a self,
        conn: &'a mut MemoryConn,
        id: i64,
        state: ConsumerDeadLetterState,
        error: Option<&'a str>,
    ) -> Result<(), StoreError> {
        let s = &mut conn.state;
        s.updates += 1;
        let stamp = s.updates;
        if let Some(d) = s.dead.get_mut(&id)
            && d.state == ConsumerDeadLetterState::Requeued
        {
            d.state = state;
            if let Some(e) = error {
                d.error = e.to_owned();
            }
            d.attempts += 1;
            d.updated = stamp;
        }
        Ok(())
    }

    async fn consumer_dead_letter_count<'a>(
        &'a self,
        consumer: &'a str,
    ) -> Result<i64, StoreError> {
        Ok(lock(&self.inner.consumer)
            .dead
            .values()
            .filter(|d| d.consumer == consumer && d.state != ConsumerDeadLetterState::Resolved)
            .count() as i64)
    }

    async fn consumer_paused<'a>(&'a self, consumer: &'a str) -> Result<bool, StoreError> {
        Ok(lock(&self.inner.ops).consumer_paused(consumer))
    }
}
