//! [`FaultyStore`]: a wrapper that makes any store fail as an outage would.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::consumer::{
    ConsumerDeadLetterState, InboxOutcome, InboxStore, NewConsumerDeadLetter, OrderingGuard,
    RequeuedDeadLetter,
};
use outbox_core::effect::{
    ClaimedWorkItem, EffectsStats, WorkItemClaimParams, WorkItemRecordParams, WorkItemStore,
};
use outbox_core::{
    ClaimParams, ClaimedBatch, FailureParams, IncomingEvent, MarkParams, OutboxStats, OutboxStore,
    ReleaseParams, StoreError, StoreErrorKind,
};
use uuid::Uuid;

use super::lock;

/// Wraps a store and makes its calls fail with `Unavailable` as an outage would: the next `n`
/// calls of any kind ([`FaultyStore::fail_next`]) or of one operation
/// ([`FaultyStore::fail_op`], by the names used in the error messages: `begin`, `commit`,
/// `claim`, `mark`, `inbox record`, `dead letter` ...). The engines must wait such an outage
/// out and lose nothing. Other kinds of error can be injected too: per operation
/// ([`FaultyStore::fail_op_with`]), or for the inbox records of one event
/// ([`FaultyStore::fail_event`]: the database refusing that event's values, say).
#[derive(Debug, Clone)]
pub struct FaultyStore<S> {
    inner: S,
    plan: Arc<Mutex<FaultPlan>>,
}

#[derive(Debug, Default)]
struct FaultPlan {
    any: u32,
    ops: HashMap<&'static str, (u32, StoreErrorKind)>,
    events: HashMap<Uuid, (u32, StoreErrorKind)>,
    injected: u32,
}

/// Takes one failure from `left`, if any is left.
fn take_one(left: Option<&mut (u32, StoreErrorKind)>) -> Option<StoreErrorKind> {
    let (n, kind) = left.filter(|(n, _)| *n > 0)?;
    *n -= 1;
    Some(*kind)
}

impl<S> FaultyStore<S> {
    /// Wraps `inner`, healthy.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            plan: Arc::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Makes the next `n` calls fail, whatever they are.
    pub fn fail_next(&self, n: u32) {
        lock(&self.plan).any = n;
    }

    /// Makes the next `n` calls of the operation `op` fail as an outage.
    pub fn fail_op(&self, op: &'static str, n: u32) {
        self.fail_op_with(op, StoreErrorKind::Unavailable, n);
    }

    /// Makes the next `n` calls of the operation `op` fail with `kind`.
    pub fn fail_op_with(&self, op: &'static str, kind: StoreErrorKind, n: u32) {
        lock(&self.plan).ops.insert(op, (n, kind));
    }

    /// Makes the next `n` inbox records (`inbox record`, alone or in a batch) that include the
    /// event `event_id` fail with `kind` (`u32::MAX`: every one).
    pub fn fail_event(&self, event_id: Uuid, kind: StoreErrorKind, n: u32) {
        lock(&self.plan).events.insert(event_id, (n, kind));
    }

    /// Failures injected so far.
    pub fn injected(&self) -> u32 {
        lock(&self.plan).injected
    }

    fn check(&self, what: &'static str) -> Result<(), StoreError> {
        let mut plan = lock(&self.plan);
        let kind = match take_one(plan.ops.get_mut(what)) {
            Some(kind) => Some(kind),
            None if plan.any > 0 => {
                plan.any -= 1;
                Some(StoreErrorKind::Unavailable)
            }
            None => None,
        };
        match kind {
            Some(kind) => {
                plan.injected += 1;
                Err(injected(what, kind))
            }
            None => Ok(()),
        }
    }

    /// [`FaultyStore::check`] of an inbox record of `events`.
    fn check_events<'e>(
        &self,
        events: impl IntoIterator<Item = &'e IncomingEvent>,
    ) -> Result<(), StoreError> {
        self.check("inbox record")?;
        let mut plan = lock(&self.plan);
        for e in events {
            if let Some(kind) = take_one(plan.events.get_mut(&e.event_id)) {
                plan.injected += 1;
                return Err(injected("inbox record", kind));
            }
        }
        Ok(())
    }
}

fn injected(what: &str, kind: StoreErrorKind) -> StoreError {
    let message = match kind {
        StoreErrorKind::Unavailable => format!("{what}: injected outage"),
        other => format!("{what}: injected {other:?} error"),
    };
    StoreError::new(kind, message)
}

/// Implements store methods that first check the fault plan for their operation `$op` (the
/// name [`FaultyStore::fail_op`] takes), then call the wrapped store's method of the same name
/// with the same arguments.
macro_rules! checked {
    ($($op:literal => fn $name:ident $(<$lt:lifetime>)? ($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        $(
            async fn $name $(<$lt>)? (&$($lt)? self, $($arg: $ty),*) -> Result<$out, StoreError> {
                self.check($op)?;
                self.inner.$name($($arg),*).await
            }
        )*
    };
}

impl<S: OutboxStore> OutboxStore for FaultyStore<S> {
    checked! {
        "claim" => fn claim_batch(p: ClaimParams) -> ClaimedBatch;
        "mark" => fn mark_published(p: MarkParams<'_>) -> u64;
        "record failure" => fn record_failure(p: FailureParams<'_>) -> bool;
        "release" => fn release(p: ReleaseParams<'_>) -> u64;
        "stats" => fn stats() -> OutboxStats;
    }

    async fn wait_for_work(&self, timeout: Duration) {
        self.inner.wait_for_work(timeout).await
    }
}

impl<S: InboxStore> InboxStore for FaultyStore<S> {
    type Conn = S::Conn;
    type Tx = S::Tx;

    checked! {
        "begin" => fn begin() -> S::Tx;
        "commit" => fn commit(tx: S::Tx) -> ();
        "dead letter" => fn consumer_dead_letter_insert<'a>(
            conn: &'a mut S::Conn,
            letter: NewConsumerDeadLetter<'a>
        ) -> ();
        "take requeued" => fn consumer_dead_letter_take_requeued<'a>(
            conn: &'a mut S::Conn,
            consumer: &'a str,
            limit: usize
        ) -> Vec<RequeuedDeadLetter>;
        "settle requeued" => fn consumer_dead_letter_settle<'a>(
            conn: &'a mut S::Conn,
            id: i64,
            state: ConsumerDeadLetterState,
            error: Option<&'a str>
        ) -> ();
        "count dead letters" => fn consumer_dead_letter_count<'a>(consumer: &'a str) -> i64;
    }

    async fn rollback(&self, tx: S::Tx) -> Result<(), StoreError> {
        self.inner.rollback(tx).await
    }
    async fn inbox_record<'a>(
        &'a self,
        conn: &'a mut S::Conn,
        consumer: &'a str,
        guard: OrderingGuard,
        event: &'a IncomingEvent,
    ) -> Result<InboxOutcome, StoreError> {
        self.check_events([event])?;
        self.inner.inbox_record(conn, consumer, guard, event).await
    }
    async fn inbox_record_many<'a>(
        &'a self,
        conn: &'a mut S::Conn,
        consumer: &'a str,
        events: &'a [&'a IncomingEvent],
    ) -> Result<Vec<InboxOutcome>, StoreError> {
        self.check_events(events.iter().copied())?;
        self.inner.inbox_record_many(conn, consumer, events).await
    }
    /// Never injected: the engine logs and keeps its last answer on an error here, so a
    /// fault spent on it would only be lost for the operation a case aims it at.
    async fn consumer_paused<'a>(&'a self, consumer: &'a str) -> Result<bool, StoreError> {
        self.inner.consumer_paused(consumer).await
    }
}

impl<S: WorkItemStore> WorkItemStore for FaultyStore<S> {
    checked! {
        "expire" => fn work_item_expire<'a>(
            kind: &'a str,
            reconcile_after: Duration,
            reason: &'a str
        ) -> Vec<i64>;
        "claim work items" => fn work_item_claim<'a>(
            params: WorkItemClaimParams<'a>
        ) -> Vec<ClaimedWorkItem>;
        "record work item" => fn work_item_record<'a>(
            params: WorkItemRecordParams<'a>
        ) -> bool;
        "backlog" => fn work_item_backlog<'a>(kind: Option<&'a str>) -> EffectsStats;
    }
}
