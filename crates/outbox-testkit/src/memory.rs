//! [`MemoryStore`]: an in-memory **fake** of every store trait of the core ([`OutboxStore`],
//! [`InboxStore`], [`WorkItemStore`], [`MaintenanceStore`]), for the engines' unit tests and as
//! the second implementation the store conformance suite checks.
//!
//! It models the contracts, not a database's performance: transactions are serialized by one
//! lock (a transaction holds it from [`InboxStore::begin`] to commit or rollback) and work on a
//! copy of the consumer-side state, swapped in on commit; the relay and executor sides change
//! their state under short locks, exactly as the traits' single statements would. Time is the
//! wall clock, so fixtures can age rows by moving their timestamps back.
//!
//! A handler writes on [`MemoryConn`]: effects ([`MemoryConn::effect`]), outbox rows
//! ([`MemoryConn::enqueue`]) and work items ([`MemoryConn::enqueue_work_item`]), all committed
//! with the transaction or not at all.
//!
//! It also implements the operator contract ([`outbox_core::operator`], in `memory/operator.rs`):
//! dead letters, conflicts, work items, pauses (a paused route is not claimed), traces and the
//! audit, so the operator suite ([`crate::operator`]) runs against it too. What it cannot model
//! (heartbeats, activity rates, kept published rows) is said at each method.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::consumer::{
    ConsumerDeadLetter, ConsumerDeadLetterState, InboxOutcome, InboxStore, NewConsumerDeadLetter,
    OrderingGuard, RawMessage, RequeuedDeadLetter,
};
use outbox_core::effect::{
    ClaimPurpose, ClaimedWorkItem, EffectsStats, NewWorkItem, WorkItem, WorkItemClaimParams,
    WorkItemRecordParams, WorkItemState, WorkItemStore, WorkItemUpdate,
};
use outbox_core::maintenance::MaintenanceStore;
use outbox_core::{
    ClaimParams, ClaimScope, ClaimedBatch, EventId, EventIdentity, FailureParams, Fingerprint,
    IncomingEvent, LeaseToken, MarkParams, NewMessage, OutboxMessage, OutboxStats, OutboxStore,
    ReleaseParams, StoreError, StoreErrorKind, Takeover,
};
use tokio::sync::{Notify, OwnedMutexGuard};

mod operator;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

fn age(since: DateTime<Utc>) -> Duration {
    (Utc::now() - since).to_std().unwrap_or(Duration::ZERO)
}

/// The time `ago` before now: a purge's cutoff.
fn before(ago: Duration) -> DateTime<Utc> {
    Utc::now() - chrono(ago)
}

/// A purge's batch: the keys of the first `limit` entries `old` yields (none for a limit below
/// 1), cloned off the map they come from so that it can delete them.
fn first<'m, K: Clone + 'm, V: 'm>(
    old: impl Iterator<Item = (&'m K, &'m V)>,
    limit: i64,
) -> Vec<K> {
    old.take(usize::try_from(limit).unwrap_or(0))
        .map(|(k, _)| k.clone())
        .collect()
}

/// Deletes each key of a purge's batch with `delete`; returns how many it deleted.
fn purged<K>(batch: Vec<K>, delete: impl FnMut(&K)) -> u64 {
    batch.iter().for_each(delete);
    batch.len() as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowState {
    Pending,
    Dead,
    Published,
}

#[derive(Debug, Clone)]
struct OutboxRow {
    msg: OutboxMessage,
    state: RowState,
    available_at: DateTime<Utc>,
    last_error: Option<String>,
}

#[derive(Debug, Default)]
struct OutboxState {
    rows: BTreeMap<i64, OutboxRow>,
    /// Per aggregate: its relay lease.
    leases: HashMap<(String, String), Lease>,
}

/// A relay lease on one aggregate.
#[derive(Debug, Clone, Copy)]
struct Lease {
    token: i64,
    until: DateTime<Utc>,
    /// The aggregate's head row when the lease was taken.
    head: i64,
    /// Consecutive takeovers with that head (0: acquired free).
    takeovers: u32,
}

#[derive(Debug, Clone)]
struct InboxRow {
    fingerprint: Fingerprint,
    received_at: DateTime<Utc>,
    /// The event's version as the consumer saw it.
    aggregate_version: i64,
}

#[derive(Debug, Clone)]
struct DeadLetterRow {
    consumer: String,
    raw: RawMessage,
    identity: EventIdentity,
    error: String,
    attempts: i32,
    state: ConsumerDeadLetterState,
    created_at: DateTime<Utc>,
    /// Order of last update (the engine takes requeued letters least recently updated first).
    updated: u64,
}

impl DeadLetterRow {
    fn view(&self, id: i64) -> ConsumerDeadLetter {
        ConsumerDeadLetter {
            id,
            consumer_name: self.consumer.clone(),
            event_id: self.identity.event_id,
            aggregate_type: self.identity.aggregate_type.clone(),
            aggregate_id: self.identity.aggregate_id.clone(),
            aggregate_version: self.identity.aggregate_version,
            event_type: self.identity.event_type.clone(),
            error: self.error.clone(),
            attempts: self.attempts,
            state: self.state.as_str().to_owned(),
            created_at: self.created_at,
        }
    }
}

/// A conflict as the store keeps it: what [`MemoryConflict`] shows, and what the operator
/// contract reads (id, the event's fields, the received payload, times, resolution).
#[derive(Debug, Clone)]
struct ConflictRow {
    id: i64,
    consumer: String,
    event_id: EventId,
    stored: Fingerprint,
    received: Fingerprint,
    aggregate_type: String,
    aggregate_id: String,
    aggregate_version: i64,
    event_type: String,
    /// The conflicting payload, as received.
    payload: bytes::Bytes,
    occurrences: u32,
    first_seen: DateTime<Utc>,
    last_seen: DateTime<Utc>,
    /// Set by an operator's resolution, cleared when the conflicting payload arrives again.
    resolved_at: Option<DateTime<Utc>>,
    resolved_audit_id: Option<i64>,
}

/// A recorded conflict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryConflict {
    /// Consumer.
    pub consumer: String,
    /// Event id.
    pub event_id: EventId,
    /// Fingerprint recorded first.
    pub stored: Fingerprint,
    /// Fingerprint of the conflicting delivery.
    pub received: Fingerprint,
    /// How often this conflicting payload arrived.
    pub occurrences: u32,
}

/// The consumer-side state: copied into a transaction, swapped back on commit.
#[derive(Debug, Clone, Default)]
struct ConsumerState {
    inbox: HashMap<(String, EventId), InboxRow>,
    stale: HashSet<(String, EventId)>,
    aggregates: HashMap<(String, String, String), i64>,
    conflicts: Vec<ConflictRow>,
    next_conflict: i64,
    dead: BTreeMap<i64, DeadLetterRow>,
    next_dead: i64,
    effects: BTreeMap<String, u64>,
    updates: u64,
}

#[derive(Debug, Clone)]
struct WorkRow {
    item: WorkItem,
    consumer_name: Option<String>,
    payload_fingerprint: Fingerprint,
    state: WorkItemState,
    lookups: i32,
    lease: Option<(i64, DateTime<Utc>)>,
    next_attempt_at: DateTime<Utc>,
    unknown_since: Option<DateTime<Utc>>,
    resolved_at: Option<DateTime<Utc>>,
    reference: Option<String>,
    last_error: Option<String>,
    updated_at: DateTime<Utc>,
}

#[derive(Debug, Default)]
struct WorkState {
    items: BTreeMap<i64, WorkRow>,
}

#[derive(Debug)]
struct Inner {
    outbox: Mutex<OutboxState>,
    consumer: Mutex<ConsumerState>,
    work: Mutex<WorkState>,
    tx_lock: Arc<tokio::sync::Mutex<()>>,
    wake: Notify,
    next_id: AtomicI64,
    next_work_id: AtomicI64,
    tokens: AtomicI64,
    sessions: AtomicU64,
    leader: Mutex<Option<u64>>,
    /// The operator's state: audit records, pauses, discarded events (locked last).
    ops: Mutex<operator::OpsState>,
}

/// The in-memory fake store. Cheap to clone; clones share the data.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

/// Why [`MemoryStore::enqueue`] refused a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryEnqueueError {
    /// The message is invalid.
    #[error("invalid message: {0}")]
    Invalid(#[from] outbox_core::MessageError),
    /// The event id is already stored.
    #[error("event id {0} is already in the outbox")]
    DuplicateEventId(EventId),
    /// The aggregate already has this version.
    #[error("aggregate {0}/{1} already has version {2}")]
    VersionConflict(String, String, i64),
}

/// The row of `m` under `id`: everything the producer wrote, moved out of a copy.
fn to_row(id: i64, m: &NewMessage) -> OutboxRow {
    let m = m.clone();
    OutboxRow {
        msg: OutboxMessage {
            id,
            event_id: m.event_id,
            aggregate_type: m.aggregate_type,
            aggregate_id: m.aggregate_id,
            aggregate_version: m.aggregate_version,
            event_type: m.event_type,
            schema_version: m.schema_version,
            fingerprint: Fingerprint::of(&m.payload.bytes),
            payload: m.payload,
            headers: m.headers,
            destination: m.destination,
            partition_key: m.partition_key,
            created_at: Utc::now(),
            attempts: 0,
        },
        state: RowState::Pending,
        available_at: Utc::now(),
        last_error: None,
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                outbox: Mutex::default(),
                consumer: Mutex::default(),
                work: Mutex::default(),
                tx_lock: Arc::new(tokio::sync::Mutex::new(())),
                wake: Notify::new(),
                next_id: AtomicI64::new(1),
                next_work_id: AtomicI64::new(1),
                tokens: AtomicI64::new(1),
                sessions: AtomicU64::new(1),
                leader: Mutex::new(None),
                ops: Mutex::default(),
            }),
        }
    }

    fn token(&self) -> i64 {
        self.inner.tokens.fetch_add(1, Ordering::Relaxed)
    }

    /// Writes outbox rows as one committed producer transaction.
    ///
    /// # Errors
    /// [`MemoryEnqueueError`]; nothing is written then.
    pub fn enqueue(&self, messages: &[NewMessage]) -> Result<(), MemoryEnqueueError> {
        let ids: Vec<i64> = messages
            .iter()
            .map(|_| self.inner.next_id.fetch_add(1, Ordering::Relaxed))
            .collect();
        self.insert_rows(&ids, messages)
    }

    /// Starts a producer transaction that takes its row ids now and becomes visible only at
    /// [`HeldEnqueue::commit`]: a transaction that commits after later ones, with lower ids.
    pub fn enqueue_held(&self, messages: Vec<NewMessage>) -> HeldEnqueue {
        let ids = messages
            .iter()
            .map(|_| self.inner.next_id.fetch_add(1, Ordering::Relaxed))
            .collect();
        HeldEnqueue {
            store: self.clone(),
            ids,
            messages,
        }
    }

    fn insert_rows(&self, ids: &[i64], messages: &[NewMessage]) -> Result<(), MemoryEnqueueError> {
        for m in messages {
            m.validate()?;
        }
        let mut o = lock(&self.inner.outbox);
        let mut seen_ids = HashSet::new();
        let mut seen_versions = HashSet::new();
        for m in messages {
            let version = (
                m.aggregate_type.clone(),
                m.aggregate_id.clone(),
                m.aggregate_version,
            );
            let id_taken = o.rows.values().any(|r| r.msg.event_id == m.event_id);
            if id_taken || !seen_ids.insert(m.event_id) {
                return Err(MemoryEnqueueError::DuplicateEventId(m.event_id));
            }
            let version_taken = o.rows.values().any(|r| {
                r.msg.aggregate_type == version.0
                    && r.msg.aggregate_id == version.1
                    && r.msg.aggregate_version == version.2
            });
            if version_taken || !seen_versions.insert(version.clone()) {
                return Err(MemoryEnqueueError::VersionConflict(
                    version.0, version.1, version.2,
                ));
            }
        }
        for (id, m) in ids.iter().zip(messages) {
            o.rows.insert(*id, to_row(*id, m));
        }
        drop(o);
        self.inner.wake.notify_waiters();
        Ok(())
    }

    /// Outbox rows not yet published (pending and dead).
    pub fn outbox_len(&self) -> usize {
        lock(&self.inner.outbox)
            .rows
            .values()
            .filter(|r| r.state != RowState::Published)
            .count()
    }

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

    /// Moves every work item's due time back by `by`, and its resolution and unknown times
    /// too: what was due later is due now, what was settled is older.
    pub fn age_work_items(&self, by: Duration) {
        for row in lock(&self.inner.work).items.values_mut() {
            row.next_attempt_at -= chrono(by);
            row.resolved_at = row.resolved_at.map(|t| t - chrono(by));
            row.unknown_since = row.unknown_since.map(|t| t - chrono(by));
        }
    }

    /// Ends every live lease of work items (as if their executor stalled past it).
    pub fn expire_work_item_leases(&self) {
        for row in lock(&self.inner.work).items.values_mut() {
            if let Some((token, _)) = row.lease {
                row.lease = Some((token, Utc::now() - chrono::Duration::milliseconds(1)));
            }
        }
    }

    /// Ends every live relay lease (as if the relay holding it stalled past it).
    pub fn expire_relay_leases(&self) {
        for lease in lock(&self.inner.outbox).leases.values_mut() {
            lease.until = Utc::now() - chrono::Duration::milliseconds(1);
        }
    }

    /// Moves every relay lease's end back by `by` (to test reaping).
    pub fn age_relay_leases(&self, by: Duration) {
        for lease in lock(&self.inner.outbox).leases.values_mut() {
            lease.until -= chrono(by);
        }
    }

    /// Relay leases held right now (live or expired).
    pub fn relay_lease_count(&self) -> usize {
        lock(&self.inner.outbox).leases.len()
    }

    /// Every work item, by id.
    pub fn work_item_views(&self) -> Vec<crate::fixture::WorkItemView> {
        lock(&self.inner.work)
            .items
            .values()
            .map(|r| crate::fixture::WorkItemView {
                id: r.item.id,
                state: r.state,
                attempts: r.item.attempts,
                lookups: r.lookups,
                reference: r.reference.clone(),
                last_error: r.last_error.clone(),
            })
            .collect()
    }

    /// Inbox identities held (all consumers).
    pub fn inbox_len(&self) -> usize {
        lock(&self.inner.consumer).inbox.len()
    }

    fn enqueue_work_items(&self, items: Vec<NewWorkItem>) {
        let mut w = lock(&self.inner.work);
        for item in items {
            let id = self.inner.next_work_id.fetch_add(1, Ordering::Relaxed);
            let fingerprint = Fingerprint::of(item.payload.to_string().as_bytes());
            w.items.insert(
                id,
                WorkRow {
                    consumer_name: item.consumer_name,
                    item: WorkItem {
                        id,
                        kind: item.kind,
                        idempotency_key: item.idempotency_key,
                        payload: item.payload,
                        event_id: item.event_id,
                        attempts: 0,
                        created_at: Utc::now(),
                    },
                    payload_fingerprint: fingerprint,
                    state: WorkItemState::Pending,
                    lookups: 0,
                    lease: None,
                    next_attempt_at: Utc::now(),
                    unknown_since: None,
                    resolved_at: None,
                    reference: None,
                    last_error: None,
                    updated_at: Utc::now(),
                },
            );
        }
    }
}

/// A producer transaction of [`MemoryStore::enqueue_held`], not yet committed.
#[derive(Debug)]
pub struct HeldEnqueue {
    store: MemoryStore,
    ids: Vec<i64>,
    messages: Vec<NewMessage>,
}

impl HeldEnqueue {
    /// The row ids taken at the start.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// Commits: the rows become visible.
    ///
    /// # Errors
    /// [`MemoryEnqueueError`].
    pub fn commit(self) -> Result<(), MemoryEnqueueError> {
        self.store.insert_rows(&self.ids, &self.messages)
    }
}

/// The connection of a [`MemoryTx`]: the consumer-side state as this transaction sees it, and
/// the rows it will add on commit.
#[derive(Debug)]
pub struct MemoryConn {
    state: ConsumerState,
    outbox: Vec<NewMessage>,
    work_items: Vec<NewWorkItem>,
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

    /// Writes a work item with this transaction. An item whose key is already stored (or
    /// written earlier in this transaction) with the same kind and payload is a redelivery and
    /// is not written again; with another kind or payload it is refused.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Constraint` for a key used with another payload.
    pub fn enqueue_work_item(
        &mut self,
        store: &MemoryStore,
        item: NewWorkItem,
    ) -> Result<(), StoreError> {
        item.validate()
            .map_err(|e| StoreError::new(StoreErrorKind::InvalidData, e.to_string()))?;
        let fp = Fingerprint::of(item.payload.to_string().as_bytes());
        let stored = lock(&store.inner.work)
            .items
            .values()
            .find(|r| r.item.idempotency_key == item.idempotency_key)
            .map(|r| (r.item.kind.clone(), r.payload_fingerprint));
        let pending = self
            .work_items
            .iter()
            .find(|w| w.idempotency_key == item.idempotency_key)
            .map(|w| {
                (
                    w.kind.clone(),
                    Fingerprint::of(w.payload.to_string().as_bytes()),
                )
            });
        match stored.or(pending) {
            Some((kind, f)) if kind == item.kind && f == fp => Ok(()),
            Some(_) => Err(StoreError::new(
                StoreErrorKind::Constraint,
                format!(
                    "idempotency key `{}` names a work item with another payload",
                    item.idempotency_key
                ),
            )),
            None => {
                self.work_items.push(item);
                Ok(())
            }
        }
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

impl OutboxStore for MemoryStore {
    /// A row whose route an operator paused is not handed out: an aggregate whose head is on
    /// a paused route waits, and a run stops before its first row on one (per-aggregate
    /// order), as the PostgreSQL claim does.
    async fn claim_batch(&self, p: ClaimParams) -> Result<ClaimedBatch, StoreError> {
        let token = self.token();
        let now = Utc::now();
        // Read before the outbox is locked (the operator's lock is taken last everywhere): a
        // pause holds from the next claim on.
        let paused_routes = lock(&self.inner.ops).paused_routes();
        let paused = |r: &OutboxRow| {
            !paused_routes.is_empty()
                && paused_routes.contains(&outbox_core::operator::route_key(
                    r.msg.destination.as_deref(),
                    &r.msg.aggregate_type,
                ))
        };
        let mut o = lock(&self.inner.outbox);
        // Per aggregate, its unpublished rows in version order.
        let mut by_agg: BTreeMap<(String, String), Vec<i64>> = BTreeMap::new();
        for (id, r) in &o.rows {
            if r.state != RowState::Published {
                by_agg
                    .entry((r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
                    .or_default()
                    .push(*id);
            }
        }
        if p.scope == ClaimScope::TakeOver {
            // Expired leases with nothing to take over go: no unpublished row left, a dead
            // head, a head in backoff, a head on a paused route (its count starts again).
            let rows = &o.rows;
            let takeable = |ids: &Vec<i64>| {
                ids.iter()
                    .map(|id| &rows[id])
                    .min_by_key(|r| r.msg.aggregate_version)
                    .is_some_and(|h| {
                        h.state == RowState::Pending && h.available_at <= now && !paused(h)
                    })
            };
            let keep: HashSet<(String, String)> = by_agg
                .iter()
                .filter(|(_, ids)| takeable(ids))
                .map(|(agg, _)| agg.clone())
                .collect();
            o.leases
                .retain(|agg, l| l.until > now || l.takeovers == 0 || keep.contains(agg));
        }
        let mut heads: Vec<((String, String), Vec<i64>)> = Vec::new();
        for (agg, mut ids) in by_agg {
            ids.sort_by_key(|id| o.rows[id].msg.aggregate_version);
            let head = &o.rows[&ids[0]];
            let lease = o.leases.get(&agg);
            let eligible = match p.scope {
                ClaimScope::All => lease.is_none_or(|l| l.until <= now),
                ClaimScope::Free => lease.is_none_or(|l| l.until <= now && l.takeovers == 0),
                ClaimScope::TakeOver => lease.is_some_and(|l| l.until <= now && l.takeovers > 0),
            };
            if head.state == RowState::Pending
                && head.available_at <= now
                && eligible
                && !paused(head)
            {
                heads.push((agg, ids));
            }
        }
        if p.scope == ClaimScope::TakeOver {
            // One aggregate, its head alone: the lease that expired first.
            heads.sort_by_key(|(agg, ids)| (o.leases[agg].until, ids[0]));
            heads.truncate(1);
            for (_, ids) in &mut heads {
                ids.truncate(1);
            }
        } else {
            heads.sort_by_key(|(_, ids)| ids[0]);
        }
        let mut messages = Vec::new();
        let mut takeovers = Vec::new();
        for (agg, ids) in heads {
            if messages.len() >= p.max_rows {
                break;
            }
            let head = ids[0];
            // Only expired leases are left on the aggregates seen here: taking one over.
            let count = match o.leases.get(&agg) {
                Some(old) if old.head == head => old.takeovers + 1,
                Some(_) => 1,
                None => 0,
            };
            if count > 0 {
                takeovers.push(Takeover {
                    head,
                    count,
                    orphaned_for: None,
                });
            }
            for (taken, id) in ids.into_iter().enumerate() {
                let r = &o.rows[&id];
                if r.state != RowState::Pending
                    || paused(r)
                    || taken >= p.max_per_aggregate
                    || messages.len() >= p.max_rows
                {
                    break;
                }
                messages.push(r.msg.clone());
            }
            o.leases.insert(
                agg,
                Lease {
                    token,
                    until: now + chrono(p.lease),
                    head,
                    takeovers: count,
                },
            );
        }
        messages.sort_by(|a, b| {
            (&a.aggregate_type, &a.aggregate_id, a.aggregate_version).cmp(&(
                &b.aggregate_type,
                &b.aggregate_id,
                b.aggregate_version,
            ))
        });
        Ok(ClaimedBatch {
            token: LeaseToken(token),
            messages,
            takeovers,
            undecodable: Vec::new(),
            liveness: None,
        })
    }

    async fn mark_published(&self, p: MarkParams<'_>) -> Result<u64, StoreError> {
        let mut o = lock(&self.inner.outbox);
        let mut n = 0;
        for id in p.ids {
            let owned = o.rows.get(id).is_some_and(|r| {
                o.leases
                    .get(&(r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
                    .is_some_and(|l| l.token == p.token.0)
            });
            if owned {
                o.rows.remove(id);
                n += 1;
            }
        }
        Ok(n)
    }

    async fn record_failure(&self, p: FailureParams<'_>) -> Result<bool, StoreError> {
        let mut o = lock(&self.inner.outbox);
        let Some(agg) = o
            .rows
            .get(&p.id)
            .map(|r| (r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
        else {
            return Ok(false);
        };
        if o.leases.get(&agg).is_none_or(|l| l.token != p.token.0) {
            return Ok(false);
        }
        let r = o.rows.get_mut(&p.id).expect("checked above");
        r.msg.attempts += 1;
        r.last_error = Some(p.error.to_owned());
        match p.retry_after {
            Some(d) => r.available_at = Utc::now() + chrono(d),
            None => r.state = RowState::Dead,
        }
        Ok(true)
    }

    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, StoreError> {
        let mut o = lock(&self.inner.outbox);
        let before = o.leases.len();
        o.leases.retain(|_, l| l.token != p.token.0);
        Ok((before - o.leases.len()) as u64)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let o = lock(&self.inner.outbox);
        let now = Utc::now();
        let mut s = OutboxStats::default();
        for r in o.rows.values() {
            match r.state {
                RowState::Pending => {
                    s.pending += 1;
                    if r.msg.attempts > 0 {
                        s.retrying += 1;
                    }
                    let leased = o
                        .leases
                        .get(&(r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
                        .is_some_and(|l| l.until > now);
                    if leased {
                        s.in_flight += 1;
                    }
                    let a = age(r.msg.created_at);
                    s.oldest_pending_age = Some(s.oldest_pending_age.map_or(a, |o| o.max(a)));
                }
                RowState::Dead => s.dead += 1,
                RowState::Published => s.published_retained += 1,
            }
        }
        Ok(s)
    }

    async fn wait_for_work(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.inner.wake.notified()).await;
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

impl WorkItemStore for MemoryStore {
    async fn work_item_expire<'a>(
        &'a self,
        kind: &'a str,
        reconcile_after: Duration,
        reason: &'a str,
    ) -> Result<Vec<i64>, StoreError> {
        let now = Utc::now();
        let mut w = lock(&self.inner.work);
        let mut ids = Vec::new();
        for r in w.items.values_mut() {
            let expired = r.lease.is_some_and(|(_, until)| until < now);
            if r.item.kind == kind && r.state == WorkItemState::InProgress && expired {
                r.state = WorkItemState::Unknown;
                r.unknown_since = Some(now);
                r.next_attempt_at = now + chrono(reconcile_after);
                r.lease = None;
                r.last_error = Some(reason.to_owned());
                r.updated_at = now;
                ids.push(r.item.id);
            }
        }
        Ok(ids)
    }

    async fn work_item_claim<'a>(
        &'a self,
        p: WorkItemClaimParams<'a>,
    ) -> Result<Vec<ClaimedWorkItem>, StoreError> {
        let now = Utc::now();
        let mut w = lock(&self.inner.work);
        let mut due: Vec<&mut WorkRow> = w
            .items
            .values_mut()
            .filter(|r| r.item.kind == p.kind && r.next_attempt_at <= now)
            .filter(|r| match p.purpose {
                ClaimPurpose::Call => r.state == WorkItemState::Pending,
                ClaimPurpose::Lookup => {
                    r.state == WorkItemState::Unknown
                        && r.lease.is_none_or(|(_, until)| until < now)
                }
            })
            .collect();
        due.sort_by_key(|r| (r.next_attempt_at, r.item.id));
        let mut claimed = Vec::new();
        for r in due.into_iter().take(p.limit) {
            let token = self.token();
            r.lease = Some((token, now + chrono(p.lease)));
            r.updated_at = now;
            if p.purpose == ClaimPurpose::Call {
                r.state = WorkItemState::InProgress;
                r.item.attempts += 1;
            }
            claimed.push(ClaimedWorkItem {
                item: r.item.clone(),
                lookups: r.lookups,
                token: LeaseToken(token),
            });
        }
        Ok(claimed)
    }

    async fn work_item_record<'a>(
        &'a self,
        p: WorkItemRecordParams<'a>,
    ) -> Result<bool, StoreError> {
        let now = Utc::now();
        let mut w = lock(&self.inner.work);
        let Some(r) = w.items.get_mut(&p.id) else {
            return Ok(false);
        };
        if r.state != p.claimed_in || r.lease.map(|(t, _)| t) != Some(p.token.0) {
            return Ok(false);
        }
        r.lookups += p.lookups_add;
        r.lease = None;
        r.updated_at = now;
        match p.update {
            WorkItemUpdate::Succeeded { reference } => {
                r.state = WorkItemState::Succeeded;
                r.reference = Some(reference.clone());
                r.unknown_since = None;
                r.resolved_at = Some(now);
            }
            WorkItemUpdate::Failed { reason } => {
                r.state = WorkItemState::Failed;
                r.last_error = Some(reason.clone());
                r.unknown_since = None;
                r.resolved_at = Some(now);
            }
            WorkItemUpdate::Pending { reason, delay } => {
                r.state = WorkItemState::Pending;
                r.last_error = Some(reason.clone());
                r.next_attempt_at = now + chrono(*delay);
                r.unknown_since = None;
            }
            WorkItemUpdate::Unknown { reason, delay } => {
                r.state = WorkItemState::Unknown;
                r.last_error = Some(reason.clone());
                r.next_attempt_at = now + chrono(*delay);
                r.unknown_since = Some(r.unknown_since.unwrap_or(now));
            }
        }
        Ok(true)
    }

    async fn work_item_backlog<'a>(
        &'a self,
        kind: Option<&'a str>,
    ) -> Result<EffectsStats, StoreError> {
        // The operator's counts, without the settled states.
        let all = operator::work_stats(&lock(&self.inner.work), kind);
        Ok(EffectsStats {
            succeeded: 0,
            failed: 0,
            ..all
        })
    }
}

/// A maintenance session of the [`MemoryStore`]; leadership ends when it is dropped.
#[derive(Debug)]
pub struct MemorySession {
    id: u64,
    store: MemoryStore,
}

impl Drop for MemorySession {
    fn drop(&mut self) {
        let mut leader = lock(&self.store.inner.leader);
        if *leader == Some(self.id) {
            *leader = None;
        }
    }
}

impl MaintenanceStore for MemoryStore {
    type Session = MemorySession;

    async fn maintenance_session(&self) -> Result<MemorySession, StoreError> {
        Ok(MemorySession {
            id: self.inner.sessions.fetch_add(1, Ordering::Relaxed),
            store: self.clone(),
        })
    }

    async fn maintainer_elect<'a>(
        &'a self,
        session: &'a mut MemorySession,
    ) -> Result<bool, StoreError> {
        let mut leader = lock(&self.inner.leader);
        match *leader {
            Some(id) => Ok(id == session.id),
            None => {
                *leader = Some(session.id);
                Ok(true)
            }
        }
    }

    async fn inbox_purge<'a>(
        &'a self,
        _session: &'a mut MemorySession,
        older_than: Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let _tx = self.inner.tx_lock.lock().await;
        let cutoff = before(older_than);
        let mut c = lock(&self.inner.consumer);
        let old = first(
            c.inbox.iter().filter(|(_, r)| r.received_at < cutoff),
            limit,
        );
        Ok(purged(old, |k| {
            c.inbox.remove(k);
            c.stale.remove(k);
        }))
    }

    async fn work_item_purge<'a>(
        &'a self,
        _session: &'a mut MemorySession,
        older_than: Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let cutoff = before(older_than);
        let mut w = lock(&self.inner.work);
        let settled = |r: &WorkRow| {
            r.state == WorkItemState::Succeeded && r.resolved_at.is_some_and(|t| t < cutoff)
        };
        let old = first(w.items.iter().filter(|(_, r)| settled(r)), limit);
        Ok(purged(old, |id| {
            w.items.remove(id);
        }))
    }

    /// Nothing to purge: this fake deletes a row when it is published (delete mode only).
    async fn published_purge<'a>(
        &'a self,
        _session: &'a mut MemorySession,
        _older_than: Duration,
        _limit: i64,
    ) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn lease_reap<'a>(
        &'a self,
        _session: &'a mut MemorySession,
        expired_for: Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let cutoff = before(expired_for);
        let mut o = lock(&self.inner.outbox);
        let reapable = |l: &Lease| l.until < cutoff && l.takeovers == 0;
        let old = first(o.leases.iter().filter(|(_, l)| reapable(l)), limit);
        Ok(purged(old, |k| {
            o.leases.remove(k);
        }))
    }
}

/// The [`crate::fixture::StoreFixture`] of the [`MemoryStore`]: how the conformance and engine
/// suites run against the fake.
#[derive(Debug, Clone, Default)]
pub struct MemoryFixture {
    store: MemoryStore,
}

struct HeldMemory(HeldEnqueue);

impl crate::fixture::HeldProducer for HeldMemory {
    fn commit(self: Box<Self>) -> crate::fixture::BoxFuture<'static, ()> {
        Box::pin(async move { self.0.commit().expect("held producer commits") })
    }
}

impl crate::fixture::StoreFixture for MemoryFixture {
    type Store = MemoryStore;

    async fn new() -> Self {
        Self::default()
    }

    fn store(&self) -> MemoryStore {
        self.store.clone()
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) {
        self.store.enqueue(&messages).expect("enqueue");
    }

    async fn enqueue_held(
        &self,
        messages: Vec<NewMessage>,
    ) -> Box<dyn crate::fixture::HeldProducer> {
        Box::new(HeldMemory(self.store.enqueue_held(messages)))
    }

    async fn write_effect<'a>(
        &'a self,
        conn: &'a mut MemoryConn,
        key: &'a str,
    ) -> Result<(), outbox_core::consumer::HandlerError> {
        conn.effect(key);
        Ok(())
    }

    async fn effect_count(&self, key: &str) -> u64 {
        self.store.effect_count(key)
    }

    async fn enqueue_work_item<'a>(
        &'a self,
        conn: &'a mut MemoryConn,
        item: &'a NewWorkItem,
    ) -> Result<(), StoreError> {
        conn.enqueue_work_item(&self.store, item.clone())
    }

    async fn work_item(&self, id: i64) -> crate::fixture::WorkItemView {
        self.work_items()
            .await
            .into_iter()
            .find(|w| w.id == id)
            .unwrap_or_else(|| panic!("no work item {id}"))
    }

    async fn work_items(&self) -> Vec<crate::fixture::WorkItemView> {
        self.store.work_item_views()
    }

    async fn age_work_items(&self, by: Duration) {
        self.store.age_work_items(by);
    }

    async fn expire_work_item_leases(&self) {
        self.store.expire_work_item_leases();
    }

    async fn age_inbox(&self, by: Duration) {
        self.store.age_inbox(by);
    }

    async fn inbox_len(&self) -> usize {
        self.store.inbox_len()
    }

    async fn conflict_count(&self) -> usize {
        self.store.conflict_records().len()
    }

    async fn expire_relay_leases(&self) {
        self.store.expire_relay_leases();
    }

    async fn age_relay_leases(&self, by: Duration) {
        self.store.age_relay_leases(by);
    }

    async fn relay_lease_count(&self) -> usize {
        self.store.relay_lease_count()
    }

    async fn consumer_dead_letters(&self, consumer: &str) -> Vec<ConsumerDeadLetter> {
        self.store.consumer_dead_letter_records(Some(consumer))
    }

    async fn requeue_consumer_dead_letters(&self, consumer: &str) -> u64 {
        // Through the operator contract, audited, as on every store.
        let which = outbox_core::operator::ConsumerSelection {
            consumer: Some(consumer.to_owned()),
            ..Default::default()
        };
        outbox_core::operator::DeadLetterOps::requeue_consumer_dead_letters(
            &self.store,
            &which,
            &suite_actor(),
            "suite",
        )
        .await
        .expect("requeue")
    }

    async fn set_consumer_paused(&self, consumer: &str, paused: bool) {
        use outbox_core::operator::PauseOps as _;
        let target = outbox_core::operator::PauseTarget::Consumer(consumer.to_owned());
        if paused {
            self.store
                .pause(&target, &suite_actor(), "engine suite")
                .await
                .expect("pause");
        } else {
            self.store
                .resume(&target, &suite_actor(), "")
                .await
                .expect("resume");
        }
    }

    async fn cleanup(&self) {}
}

/// Who the suites' operator actions are recorded under.
fn suite_actor() -> outbox_core::operator::Actor {
    outbox_core::operator::Actor::new("suite", "test").expect("actor")
}
