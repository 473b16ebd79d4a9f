//! Named in-memory **fakes** of the broker and provider sides, for the engines' unit tests and
//! the engine suites: [`FakeTransport`] (a broker that acknowledges, fails as scripted, and
//! records what it accepted), [`FakeSource`] (a queue of deliveries with redelivery on nack or
//! drop), [`FakeProvider`] (a payment provider with switches), and [`FaultyStore`], a wrapper that
//! makes any store fail as an outage would. None of them talks to a real service; the transport
//! and store conformance suites check the real ones.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use outbox_core::consumer::{
    ConsumerDeadLetterState, Delivery, DeliverySource, InboxOutcome, InboxStore,
    NewConsumerDeadLetter, OrderingGuard, RawMessage, RequeuedDeadLetter, SourceError,
    SourceErrorKind,
};
use outbox_core::effect::{
    ClaimedWorkItem, EffectsStats, WorkItemClaimParams, WorkItemRecordParams, WorkItemStore,
};
use outbox_core::{
    CallOutcome, ClaimParams, ClaimedBatch, DecodeError, EventIdentity, FailureParams, Fingerprint,
    IncomingEvent, LookupOutcome, MarkParams, OutboxMessage, OutboxStats, OutboxStore, Payload,
    PublishError, PublishErrorKind, PublishReceipt, ReleaseParams, RemoteEffect, StoreError,
    StoreErrorKind, Transport, WorkItem, wire,
};
use uuid::Uuid;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Transport

/// A fake broker: acknowledges every publish (recording it) unless a failure is scripted for
/// the message's `(aggregate_id, version)`.
#[derive(Debug, Default)]
pub struct FakeTransport {
    acked: Mutex<Vec<OutboxMessage>>,
    fail: Mutex<HashMap<(String, i64), (PublishErrorKind, u32)>>,
    delay: Duration,
    /// `Some(window)`: declares ordered pipelining and takes at most `window` messages of a run
    /// at once (see [`FakeTransport::pipelined`]).
    pipeline: Option<usize>,
    /// The length of every run handed over by [`Transport::publish_run`].
    runs: Mutex<Vec<usize>>,
}

impl FakeTransport {
    /// A broker that acknowledges everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// A broker that takes `delay` for every publish.
    pub fn with_delay(delay: Duration) -> Self {
        Self {
            delay,
            ..Self::default()
        }
    }

    /// A broker with ordered pipelining: [`Transport::publish_run`] takes up to `window`
    /// messages of a run at once (one `delay` for all of them) and stores them as a gap-less
    /// prefix: a scripted failure stores nothing from that message on, like Kafka's idempotent
    /// producer with the gap-less guarantee.
    pub fn pipelined(window: usize) -> Self {
        Self {
            pipeline: Some(window),
            ..Self::default()
        }
    }

    /// [`FakeTransport::pipelined`] taking `delay` for every run.
    pub fn pipelined_with_delay(window: usize, delay: Duration) -> Self {
        Self {
            delay,
            ..Self::pipelined(window)
        }
    }

    /// The length of every run handed over at once, in order (pipelined brokers only).
    pub fn runs(&self) -> Vec<usize> {
        lock(&self.runs).clone()
    }

    /// Makes the next `times` publishes of `(aggregate_id, version)` fail with `kind`.
    pub fn fail(
        self,
        aggregate_id: &str,
        version: i64,
        kind: PublishErrorKind,
        times: u32,
    ) -> Self {
        lock(&self.fail).insert((aggregate_id.to_owned(), version), (kind, times));
        self
    }

    /// Versions of `aggregate_id` acknowledged, in acknowledgement order.
    pub fn acked_for(&self, aggregate_id: &str) -> Vec<i64> {
        lock(&self.acked)
            .iter()
            .filter(|m| m.aggregate_id == aggregate_id)
            .map(|m| m.aggregate_version)
            .collect()
    }

    /// Every acknowledged message, in order.
    pub fn acked(&self) -> Vec<OutboxMessage> {
        lock(&self.acked).clone()
    }
}

impl Transport for FakeTransport {
    fn name(&self) -> &'static str {
        "fake"
    }

    async fn publish(&self, m: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.store(m)
    }

    fn ordered_pipelining(&self) -> bool {
        self.pipeline.is_some()
    }

    fn publish_run<'a>(
        &'a self,
        run: &'a [OutboxMessage],
    ) -> impl futures::Stream<Item = Result<PublishReceipt, PublishError>> + Send + 'a {
        use futures::StreamExt as _;
        let taken = &run[..run.len().min(self.pipeline.unwrap_or(1))];
        lock(&self.runs).push(taken.len());
        futures::stream::once(async move {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            let mut results = Vec::with_capacity(taken.len());
            for m in taken {
                let r = self.store(m);
                let failed = r.is_err();
                results.push(r);
                if failed {
                    break;
                }
            }
            futures::stream::iter(results)
        })
        .flatten()
    }
}

impl FakeTransport {
    /// Stores `m` unless a failure is scripted for it.
    fn store(&self, m: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        let key = (m.aggregate_id.clone(), m.aggregate_version);
        if let Some((kind, left)) = lock(&self.fail).get_mut(&key)
            && *left > 0
        {
            *left -= 1;
            return Err(PublishError::new(*kind, "scripted failure"));
        }
        let mut acked = lock(&self.acked);
        let duplicate = acked.iter().any(|a| a.event_id == m.event_id);
        acked.push(m.clone());
        Ok(PublishReceipt { duplicate })
    }
}

// ---------------------------------------------------------------------------------------------
// Delivery source

/// The wire form of `m` as the fake source carries it: CloudEvents attributes as `ce-<name>`
/// headers, the payload as the body.
pub fn wire_message(m: &OutboxMessage) -> RawMessage {
    let mut headers: BTreeMap<String, String> = wire::attributes(m, "/test")
        .into_iter()
        .map(|(k, v)| (format!("ce-{k}"), v))
        .collect();
    for (k, v) in &m.headers {
        headers.insert(k.clone(), v.clone());
    }
    RawMessage {
        payload: m.payload.bytes.clone(),
        headers,
        content_type: Some(m.payload.content_type.0.clone()),
        ..RawMessage::default()
    }
}

/// An event `event_id` of aggregate `payment/aggregate_id` at `version` with a JSON `body`, as a
/// stored row would carry it.
pub fn event_message(
    event_id: Uuid,
    aggregate_id: &str,
    version: i64,
    body: &str,
) -> OutboxMessage {
    OutboxMessage {
        id: 0,
        event_id,
        aggregate_type: "payment".into(),
        aggregate_id: aggregate_id.into(),
        aggregate_version: version,
        event_type: "PaymentCreated".into(),
        schema_version: 1,
        payload: Payload::bytes("application/json", Bytes::from(body.to_owned())),
        fingerprint: Fingerprint::of(body.as_bytes()),
        headers: BTreeMap::new(),
        destination: None,
        partition_key: None,
        created_at: chrono::Utc::now(),
        attempts: 0,
    }
}

/// A `ce-` attribute of what [`wire_message`] wrote.
fn wire_attribute(raw: &RawMessage, name: &str) -> Option<String> {
    raw.headers.get(&format!("ce-{name}")).cloned()
}

/// Decodes what [`wire_message`] wrote, with a 1 MiB body limit.
pub fn decode_wire(raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
    wire::decode(
        |n| wire_attribute(raw, n),
        raw.content_type.clone(),
        raw.payload.clone(),
        BTreeMap::new(),
        1 << 20,
    )
}

#[derive(Debug, Default)]
struct Queue {
    ready: VecDeque<(RawMessage, u32)>,
    acked: usize,
    nacked: usize,
    unsettled: usize,
    /// Deliveries say nothing about their count (a broker that cannot tell).
    uncounted: bool,
    /// How long an ack takes (a broker's confirmation round trip).
    ack_delay: Option<Duration>,
    /// The most deliveries still unsettled when a batch was asked for.
    unsettled_at_fetch: usize,
    /// Calls of [`DeliverySource::release`].
    releases: usize,
    /// The most deliveries still unsettled when the source was released.
    unsettled_at_release: usize,
    /// Reads still to fail ([`FakeSource::fail_reads`]), with the error's text.
    failing_reads: Option<(u32, String)>,
}

/// A fake broker queue: [`FakeSource::push`] adds messages; a nack puts a delivery back with its
/// count + 1 (the delay is not waited for), a delivery dropped without ack or nack comes back
/// the same way (a crashed consumer's unacknowledged message).
#[derive(Debug, Clone, Default)]
pub struct FakeSource {
    queue: Arc<Mutex<Queue>>,
}

impl FakeSource {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty queue whose deliveries do not tell their count
    /// ([`Delivery::delivery_count`] is `None`), as a broker without one.
    pub fn without_counts() -> Self {
        let source = Self::default();
        lock(&source.queue).uncounted = true;
        source
    }

    /// An empty queue whose acks each take `delay` before they count (a broker confirming
    /// them over the network).
    pub fn with_ack_delay(delay: Duration) -> Self {
        let source = Self::default();
        lock(&source.queue).ack_delay = Some(delay);
        source
    }

    /// The most deliveries that were handed out and still unsettled when a batch was asked
    /// for: above zero when the consumer took a batch while the acks of the one before were
    /// still on their way.
    pub fn unsettled_at_fetch(&self) -> usize {
        lock(&self.queue).unsettled_at_fetch
    }

    /// Makes the next `n` reads ([`DeliverySource::next_batch`]) fail as a broker outage
    /// saying `message`.
    pub fn fail_reads(&self, n: u32, message: &str) {
        lock(&self.queue).failing_reads = Some((n, message.to_owned()));
    }

    /// Adds a message at the end of the queue (first delivery).
    pub fn push(&self, raw: RawMessage) {
        lock(&self.queue).ready.push_back((raw, 1));
    }

    /// Adds the wire form of `m`.
    pub fn push_message(&self, m: &OutboxMessage) {
        self.push(wire_message(m));
    }

    /// Acknowledged deliveries so far.
    pub fn acked(&self) -> usize {
        lock(&self.queue).acked
    }

    /// Negative acknowledgements so far.
    pub fn nacked(&self) -> usize {
        lock(&self.queue).nacked
    }

    /// Messages waiting to be delivered (not counting deliveries handed out and unsettled).
    pub fn ready(&self) -> usize {
        lock(&self.queue).ready.len()
    }

    /// Deliveries handed out and neither acknowledged, nor negatively acknowledged, nor dropped.
    pub fn unsettled(&self) -> usize {
        lock(&self.queue).unsettled
    }

    /// How many times [`DeliverySource::release`] was called (the fake holds nothing ahead,
    /// so it only counts them).
    pub fn releases(&self) -> usize {
        lock(&self.queue).releases
    }

    /// The most deliveries handed out and still unsettled when the source was released: 0
    /// when every release came after the batches before it were settled.
    pub fn unsettled_at_release(&self) -> usize {
        lock(&self.queue).unsettled_at_release
    }
}

/// A delivery of the [`FakeSource`].
#[derive(Debug)]
pub struct FakeDelivery {
    raw: RawMessage,
    event: Result<IncomingEvent, DecodeError>,
    count: u32,
    queue: Arc<Mutex<Queue>>,
    settled: bool,
}

impl Drop for FakeDelivery {
    fn drop(&mut self) {
        if !self.settled {
            let mut q = lock(&self.queue);
            q.unsettled -= 1;
            q.ready.push_back((self.raw.clone(), self.count + 1));
        }
    }
}

impl Delivery for FakeDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        &self.event
    }
    fn raw(&self) -> &RawMessage {
        &self.raw
    }
    fn delivery_count(&self) -> Option<u32> {
        (!lock(&self.queue).uncounted).then_some(self.count)
    }
    async fn ack(mut self) -> Result<(), SourceError> {
        let delay = lock(&self.queue).ack_delay;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        self.settled = true;
        let mut q = lock(&self.queue);
        q.unsettled -= 1;
        q.acked += 1;
        Ok(())
    }
    async fn nack(mut self, _delay: Duration) -> Result<(), SourceError> {
        self.settled = true;
        let mut q = lock(&self.queue);
        q.unsettled -= 1;
        q.nacked += 1;
        q.ready.push_back((self.raw.clone(), self.count + 1));
        Ok(())
    }
}

impl DeliverySource for FakeSource {
    type Delivery = FakeDelivery;

    async fn next_batch(
        &mut self,
        max: usize,
        _wait: Duration,
    ) -> Result<Vec<FakeDelivery>, SourceError> {
        let mut q = lock(&self.queue);
        if let Some((n, message)) = q.failing_reads.take() {
            if n > 1 {
                q.failing_reads = Some((n - 1, message.clone()));
            }
            if n > 0 {
                return Err(SourceError::new(SourceErrorKind::Unavailable, message));
            }
        }
        q.unsettled_at_fetch = q.unsettled_at_fetch.max(q.unsettled);
        let mut out = Vec::new();
        while out.len() < max {
            let Some((raw, count)) = q.ready.pop_front() else {
                break;
            };
            q.unsettled += 1;
            out.push(FakeDelivery {
                event: decode_wire(&raw),
                raw,
                count,
                queue: Arc::clone(&self.queue),
                settled: false,
            });
        }
        Ok(out)
    }

    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        let q = lock(&self.queue);
        Ok(Some((q.ready.len() + q.unsettled) as u64))
    }

    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        decode_wire(raw)
    }

    fn identify(&self, raw: &RawMessage) -> EventIdentity {
        wire::identify(|n| wire_attribute(raw, n))
    }

    async fn release(&mut self) {
        let mut q = lock(&self.queue);
        q.releases += 1;
        q.unsettled_at_release = q.unsettled_at_release.max(q.unsettled);
    }
}

// ---------------------------------------------------------------------------------------------
// Provider

/// How the [`FakeProvider`] answers a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMode {
    /// Perform (once per key when honouring keys) and answer `Succeeded`.
    Succeed,
    /// Perform, then take this long before answering `Succeeded` (a slow or hung provider).
    SucceedAfter(Duration),
    /// The request is lost before the provider sees it, but the caller cannot tell: `Unknown`.
    LostUnknown,
    /// The provider performs the effect, but the answer is lost: `Unknown`.
    PerformedUnknown,
    /// The request provably never left: `NotSent`.
    NotSent,
    /// The provider refuses: `Failed`.
    Fail,
}

/// The [`FakeProvider`]'s record and switches.
#[derive(Debug)]
pub struct ProviderState {
    /// How calls are answered.
    pub mode: CallMode,
    /// Keys whose calls take this long before answering (as `mode` says).
    pub slow_keys: HashMap<String, Duration>,
    /// Answer every lookup with `Unknown`.
    pub lookup_unknown: bool,
    /// Whether a second call with a known key returns the first result instead of acting again.
    pub honour_keys: bool,
    /// Every call, in order, by key.
    pub calls: Vec<String>,
    /// Every lookup, in order, by key.
    pub lookups: Vec<String>,
    /// Effects really performed: key -> reference.
    pub done: HashMap<String, String>,
    /// Effects performed in total (more than `done.len()` means a double payout).
    pub performed: usize,
}

/// A fake payment provider with switches; never a real service.
#[derive(Debug)]
pub struct FakeProvider(Mutex<ProviderState>);

impl FakeProvider {
    /// A provider answering calls as `mode`, honouring idempotency keys.
    pub fn new(mode: CallMode) -> Self {
        Self(Mutex::new(ProviderState {
            mode,
            slow_keys: HashMap::new(),
            lookup_unknown: false,
            honour_keys: true,
            calls: Vec::new(),
            lookups: Vec::new(),
            done: HashMap::new(),
            performed: 0,
        }))
    }

    /// Reads or changes the state.
    pub fn with<R>(&self, f: impl FnOnce(&mut ProviderState) -> R) -> R {
        f(&mut lock(&self.0))
    }

    /// Calls made with `key`.
    pub fn calls_for(&self, key: &str) -> usize {
        self.with(|s| s.calls.iter().filter(|k| *k == key).count())
    }

    /// Lookups made for `key`.
    pub fn lookups_for(&self, key: &str) -> usize {
        self.with(|s| s.lookups.iter().filter(|k| *k == key).count())
    }

    /// Effects performed in total.
    pub fn performed(&self) -> usize {
        self.with(|s| s.performed)
    }

    fn perform(s: &mut ProviderState, key: &str) -> String {
        if s.honour_keys
            && let Some(r) = s.done.get(key)
        {
            return r.clone();
        }
        s.performed += 1;
        let reference = format!("ref-{}-{key}", s.performed);
        s.done.insert(key.to_owned(), reference.clone());
        reference
    }
}

impl RemoteEffect for FakeProvider {
    async fn call(&self, item: &WorkItem) -> CallOutcome {
        let key = item.idempotency_key.clone();
        let (outcome, wait) = self.with(|s| {
            s.calls.push(key.clone());
            let slow = s.slow_keys.get(&key).copied();
            let (outcome, wait) = match s.mode {
                CallMode::Succeed => (
                    CallOutcome::Succeeded {
                        reference: Self::perform(s, &key),
                    },
                    None,
                ),
                CallMode::SucceedAfter(d) => (
                    CallOutcome::Succeeded {
                        reference: Self::perform(s, &key),
                    },
                    Some(d),
                ),
                CallMode::LostUnknown => (
                    CallOutcome::Unknown {
                        reason: "connection reset".into(),
                    },
                    None,
                ),
                CallMode::PerformedUnknown => {
                    Self::perform(s, &key);
                    (
                        CallOutcome::Unknown {
                            reason: "answer lost".into(),
                        },
                        None,
                    )
                }
                CallMode::NotSent => (
                    CallOutcome::NotSent {
                        reason: "connection refused".into(),
                    },
                    None,
                ),
                CallMode::Fail => (
                    CallOutcome::Failed {
                        reason: "insufficient funds".into(),
                    },
                    None,
                ),
            };
            (outcome, wait.or(slow))
        });
        if let Some(d) = wait {
            tokio::time::sleep(d).await;
        }
        outcome
    }

    async fn lookup(&self, item: &WorkItem) -> LookupOutcome {
        self.with(|s| {
            s.lookups.push(item.idempotency_key.clone());
            if s.lookup_unknown {
                LookupOutcome::Unknown {
                    reason: "503".into(),
                }
            } else if let Some(r) = s.done.get(&item.idempotency_key) {
                LookupOutcome::Succeeded {
                    reference: r.clone(),
                }
            } else {
                LookupOutcome::NotFound
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Fault injection

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
