//! [`MemoryStore`]: an in-memory **fake** of every store trait of the core
//! ([`OutboxStore`](outbox_core::OutboxStore), [`InboxStore`](outbox_core::consumer::InboxStore),
//! [`WorkItemStore`](outbox_core::effect::WorkItemStore),
//! [`MaintenanceStore`](outbox_core::maintenance::MaintenanceStore)), for the engines' unit
//! tests and as the second implementation the store conformance suite checks.
//!
//! It models the contracts, not a database's performance: transactions are serialized by one
//! lock (a transaction holds it from
//! [`InboxStore::begin`](outbox_core::consumer::InboxStore::begin) to commit or rollback) and
//! work on a copy of the consumer-side state, swapped in on commit; the relay and executor sides
//! change their state under short locks, exactly as the traits' single statements would. Time is
//! the wall clock, so fixtures can age rows by moving their timestamps back.
//!
//! A handler writes on [`MemoryConn`]: effects ([`MemoryConn::effect`]), outbox rows
//! ([`MemoryConn::enqueue`]) and work items ([`MemoryConn::enqueue_work_item`]), all committed
//! with the transaction or not at all.
//!
//! It also implements the operator contract ([`outbox_core::operator`], in `memory/operator/`):
//! dead letters, conflicts, work items, pauses (a paused route is not claimed), traces and the
//! audit, so the operator suite ([`crate::operator`]) runs against it too. What it cannot model
//! (heartbeats, activity rates, kept published rows) is said at each method.
//!
//! One file per trait it implements: the outbox side (`OutboxStore` and the producer's writes,
//! `outbox.rs`), the consumer side (`InboxStore`, its connection and transaction, `inbox.rs`),
//! work items (`WorkItemStore`, `effect.rs`), maintenance (`MaintenanceStore`,
//! `maintenance.rs`), the operator contract (`operator/`, one file per topic) and the fixture
//! (`fixture.rs`); this file holds the state they share.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::consumer::{ConsumerDeadLetter, ConsumerDeadLetterState, RawMessage};
use outbox_core::effect::{WorkItem, WorkItemState};
use outbox_core::{EventId, EventIdentity, Fingerprint, OutboxMessage};
use tokio::sync::Notify;

mod effect;
mod fixture;
mod inbox;
mod maintenance;
mod operator;
mod outbox;

pub use fixture::MemoryFixture;
pub use inbox::{MemoryConn, MemoryTx};
pub use maintenance::MemorySession;
pub use outbox::HeldEnqueue;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn chrono(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

fn age(since: DateTime<Utc>) -> Duration {
    (Utc::now() - since).to_std().unwrap_or(Duration::ZERO)
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
}
