//! The engine suites: the core's consumer engine and remote-effect executor, unchanged, over any
//! store that has a [`StoreFixture`], fed by the fakes of [`crate::fakes`]. PostgreSQL runs them
//! as integration tests, the in-memory store as unit tests:
//!
//! ```ignore
//! outbox_testkit::engine_suite!(MyFixture);
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use outbox_core::consumer::{
    ConflictPolicy, Consumer, ConsumerConfig, ConsumerReport, Handler, HandlerError, InboxStore,
    OrderingGuard, RawMessage,
};
use outbox_core::effect::{
    Executor, ExecutorConfig, LEASE_EXPIRED_REASON, NewWorkItem, PARKED_REASON, WorkItemState,
    WorkItemStore,
};
use outbox_core::{Backoff, IncomingEvent, OutboxMessage, StoreErrorKind};
use uuid::Uuid;

use crate::fakes::{CallMode, FakeProvider, FakeSource, FaultyStore, event_message, wire_message};
use crate::fixture::StoreFixture;
use crate::support::{enqueue_work_item, old_and_young_inbox, take_requeued};

/// What the test handler does for one delivery of an event, after writing its effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// Fail with a transient error.
    Transient,
    /// Fail with a permanent error.
    Permanent,
    /// Panic.
    Panic,
}

/// A handler that adds one to the effect `"{consumer}:{event_id}"` on the inbox transaction,
/// writes a work item when asked to, then fails as scripted for that event (so a rolled-back
/// attempt must leave no effect).
pub struct TestHandler<F> {
    fixture: Arc<F>,
    consumer: String,
    script: Mutex<HashMap<Uuid, VecDeque<Script>>>,
    poison: Mutex<std::collections::HashSet<Uuid>>,
    work_items: bool,
}

impl<F> TestHandler<F> {
    /// A handler of `consumer` writing through `fixture`.
    pub fn new(fixture: Arc<F>, consumer: &str) -> Self {
        Self {
            fixture,
            consumer: consumer.to_owned(),
            script: Mutex::default(),
            poison: Mutex::default(),
            work_items: false,
        }
    }

    /// Also writes a `payout` work item per event (keyed by consumer and event).
    pub fn with_work_items(mut self) -> Self {
        self.work_items = true;
        self
    }

    /// The next deliveries of `event_id` fail as `steps` says, one step per delivery.
    pub fn script(&self, event_id: Uuid, steps: &[Script]) {
        self.script
            .lock()
            .unwrap()
            .entry(event_id)
            .or_default()
            .extend(steps);
    }

    /// Every run of the handler for `event_id` fails with a permanent error (however often
    /// the engine runs it for one delivery).
    pub fn poison(&self, event_id: Uuid) {
        self.poison.lock().unwrap().insert(event_id);
    }

    /// The effect key of `event_id` for this handler's consumer.
    pub fn key(&self, event_id: Uuid) -> String {
        format!("{}:{event_id}", self.consumer)
    }
}

impl<F: StoreFixture> Handler<<F::Store as InboxStore>::Conn> for TestHandler<F> {
    async fn handle(
        &self,
        conn: &mut <F::Store as InboxStore>::Conn,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        let key = self.key(event.event_id);
        self.fixture.write_effect(conn, &key).await?;
        if self.work_items {
            let item = NewWorkItem::for_event(
                "payout",
                self.consumer.clone(),
                event.event_id,
                serde_json::json!({"aggregate": event.aggregate_id}),
            );
            self.fixture
                .enqueue_work_item(conn, &item)
                .await
                .map_err(HandlerError::transient)?;
        }
        if self.poison.lock().unwrap().contains(&event.event_id) {
            return Err(HandlerError::permanent("poisoned event"));
        }
        let step = self
            .script
            .lock()
            .unwrap()
            .get_mut(&event.event_id)
            .and_then(|q| q.pop_front());
        match step {
            None => Ok(()),
            Some(Script::Transient) => Err(HandlerError::transient("scripted transient")),
            Some(Script::Permanent) => Err(HandlerError::permanent("scripted permanent")),
            Some(Script::Panic) => panic!("scripted panic in the handler"),
        }
    }
}

/// One event of each aggregate `agg0` to `agg{n-1}`, at `version`.
fn one_per_aggregate(n: usize, version: i64) -> Vec<OutboxMessage> {
    (0..n)
        .map(|i| event_message(Uuid::now_v7(), &format!("agg{i}"), version, "{}"))
        .collect()
}

/// A consumer config for tests: fast backoff, short waits.
pub fn fast_config(name: &str) -> ConsumerConfig {
    ConsumerConfig {
        batch_wait: Duration::from_millis(10),
        backoff: Backoff {
            base: Duration::from_millis(1),
            max: Duration::from_millis(2),
        },
        gap_delay: Duration::from_millis(1),
        conflict_hold_delay: Duration::from_millis(1),
        housekeeping_interval: Duration::from_millis(1),
        ..ConsumerConfig::new(name)
    }
}

/// Runs batches until the source has nothing ready and nothing unsettled (or 200 batches),
/// adding up the reports. Engine errors are counted as `errors`, not failed on.
pub async fn drain<S, H>(
    consumer: &mut Consumer<S, FakeSource, H>,
    source: &FakeSource,
) -> (ConsumerReport, usize)
where
    S: InboxStore,
    H: Handler<S::Conn>,
{
    let mut total = ConsumerReport::default();
    let mut errors = 0;
    for _ in 0..200 {
        match consumer.run_batch().await {
            Ok(r) => {
                total += &r;
                if r.received == 0 && source.ready() == 0 && source.unsettled() == 0 {
                    break;
                }
            }
            Err(_) => errors += 1,
        }
    }
    (total, errors)
}

struct Rig<F: StoreFixture> {
    fixture: Arc<F>,
    /// The fixture's store, healthy until a case injects faults.
    faults: FaultyStore<F::Store>,
    source: FakeSource,
    handler: Arc<TestHandler<F>>,
}

/// The handler shared between the rig and the consumer.
struct Shared<F>(Arc<TestHandler<F>>);

impl<F: StoreFixture> Handler<<F::Store as InboxStore>::Conn> for Shared<F> {
    fn handle<'a>(
        &'a self,
        conn: &'a mut <F::Store as InboxStore>::Conn,
        event: &'a IncomingEvent,
    ) -> impl std::future::Future<Output = Result<(), HandlerError>> + Send + 'a {
        self.0.handle(conn, event)
    }
}

/// A consumer named in `config` over `source` and `store`, whose handler is `handler`.
fn consumer_of<F: StoreFixture, S: InboxStore<Conn = <F::Store as InboxStore>::Conn>>(
    store: S,
    source: &FakeSource,
    handler: &Arc<TestHandler<F>>,
    config: ConsumerConfig,
) -> Consumer<S, FakeSource, Shared<F>> {
    Consumer::new(store, source.clone(), Shared(Arc::clone(handler)), config)
        .expect("valid consumer config")
}

/// [`fast_config`] of consumer `c` with `batch_size`.
fn batched(batch_size: usize) -> ConsumerConfig {
    ConsumerConfig {
        batch_size,
        ..fast_config("c")
    }
}

/// [`fast_config`] of consumer `c` with `max_attempts`.
fn attempts(max_attempts: u32) -> ConsumerConfig {
    ConsumerConfig {
        max_attempts,
        ..fast_config("c")
    }
}

impl<F: StoreFixture> Rig<F> {
    async fn new(consumer: &str) -> Self {
        Self::with_source(consumer, FakeSource::new()).await
    }

    async fn with_source(consumer: &str, source: FakeSource) -> Self {
        let fixture = Arc::new(F::new().await);
        Self {
            handler: Arc::new(TestHandler::new(Arc::clone(&fixture), consumer)),
            faults: FaultyStore::new(fixture.store()),
            fixture,
            source,
        }
    }

    /// A consumer over the rig's source, on the store with the rig's injected faults.
    fn consumer(
        &self,
        config: ConsumerConfig,
    ) -> Consumer<FaultyStore<F::Store>, FakeSource, Shared<F>> {
        consumer_of(self.faults.clone(), &self.source, &self.handler, config)
    }

    /// Runs a [`Rig::consumer`] of `config` until the source is drained ([`drain`]).
    async fn drain(&self, config: ConsumerConfig) -> (ConsumerReport, usize) {
        drain(&mut self.consumer(config), &self.source).await
    }

    /// A batch consumer (`batch_size` 10) over the rig's source whose handler writes through
    /// `handle_many`, recording its calls in `calls`; it panics on its first call if
    /// `panic_first`.
    fn batch_consumer(
        &self,
        calls: &Arc<Mutex<Vec<Vec<Uuid>>>>,
        panic_first: bool,
    ) -> Consumer<FaultyStore<F::Store>, FakeSource, BatchHandler<F>> {
        let handler = BatchHandler {
            inner: Arc::clone(&self.handler),
            calls: Arc::clone(calls),
            panic_next: panic_first.into(),
        };
        Consumer::new(
            self.faults.clone(),
            self.source.clone(),
            handler,
            batched(10),
        )
        .expect("valid consumer config")
    }

    async fn effects(&self, event_id: Uuid) -> u64 {
        self.fixture.effect_count(&self.handler.key(event_id)).await
    }

    /// Pushes each of `messages` to the rig's source, in order.
    fn push(&self, messages: &[OutboxMessage]) {
        for m in messages {
            self.source.push_message(m);
        }
    }

    /// Waits (20 s at most, else fails with `what`) until each of `messages` has its effect.
    async fn wait_applied(&self, messages: &[OutboxMessage], what: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        for m in messages {
            while self.effects(m.event_id).await == 0 {
                assert!(std::time::Instant::now() < deadline, "{what}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// Requeues every open dead letter of consumer `c` and returns their raw messages as the
    /// store hands them back (oldest first), without applying them.
    async fn requeued_raw(&self) -> Vec<RawMessage> {
        self.fixture.requeue_consumer_dead_letters("c").await;
        let letters = take_requeued(&self.fixture.store(), "c", 100).await;
        letters.into_iter().map(|l| l.raw).collect()
    }
}

/// Three deliveries of one event: one effect, two duplicates, all acknowledged (G5).
pub async fn redeliveries_have_one_effect<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let m = event_message(Uuid::now_v7(), "a", 1, r#"{"n":1}"#);
    for _ in 0..3 {
        rig.source.push_message(&m);
    }
    let (r, errors) = rig.drain(fast_config("c")).await;
    assert_eq!((r.processed, r.duplicates, errors), (1, 2, 0), "{r:?}");
    assert_eq!(rig.effects(m.event_id).await, 1);
    assert_eq!(rig.source.acked(), 3);
    rig.fixture.cleanup().await;
}

/// A paused consumer takes nothing from its source (the broker keeps it), releases what the
/// source received ahead, and applies no requeued dead letter; once resumed (seen within the
/// engine's pause check interval) it applies everything once.
pub async fn a_paused_consumer_takes_nothing_until_resumed<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let m = event_message(Uuid::now_v7(), "a", 1, r#"{"n":1}"#);
    rig.source.push_message(&m);
    rig.fixture.set_consumer_paused("c", true).await;
    let mut consumer = rig.consumer(fast_config("c"));
    for _ in 0..3 {
        let r = consumer.run_batch().await.expect("a paused batch");
        assert_eq!(r, ConsumerReport::default());
    }
    assert_eq!(rig.source.ready(), 1, "the delivery stays with the source");
    assert_eq!(
        rig.source.releases(),
        3,
        "each paused batch releases the source"
    );
    assert_eq!(rig.effects(m.event_id).await, 0);
    rig.fixture.set_consumer_paused("c", false).await;
    tokio::time::sleep(outbox_core::consumer::PAUSE_CHECK_INTERVAL + Duration::from_millis(100))
        .await;
    let (r, errors) = drain(&mut consumer, &rig.source).await;
    assert_eq!((r.processed, errors), (1, 0), "{r:?}");
    assert_eq!(rig.effects(m.event_id).await, 1);
    assert_eq!(rig.source.acked(), 1);
    rig.fixture.cleanup().await;
}

/// Transient handler errors roll back and redeliver; the final success has one effect.
pub async fn transient_errors_are_retried_without_a_second_effect<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let m = event_message(Uuid::now_v7(), "a", 1, "{}");
    rig.handler
        .script(m.event_id, &[Script::Transient, Script::Transient]);
    rig.source.push_message(&m);
    let (r, _) = rig.drain(fast_config("c")).await;
    assert_eq!((r.processed, r.nacked), (1, 2), "{r:?}");
    assert_eq!(rig.effects(m.event_id).await, 1);
    rig.fixture.cleanup().await;
}

/// After `max_attempts` transient failures (a panic counts as one) the delivery is
/// dead-lettered and acknowledged, with no effect; an operator's requeue then applies it once.
pub async fn exhausted_retries_dead_letter_and_a_requeue_applies_once<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let m = event_message(Uuid::now_v7(), "a", 1, "{}");
    rig.handler.script(
        m.event_id,
        &[Script::Transient, Script::Panic, Script::Transient],
    );
    rig.source.push_message(&m);
    let mut consumer = rig.consumer(attempts(3));
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!((r.processed, r.nacked, r.dead_lettered), (0, 2, 1), "{r:?}");
    assert_eq!(
        rig.effects(m.event_id).await,
        0,
        "a dead letter is not an effect"
    );
    let dead = rig.fixture.consumer_dead_letters("c").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].event_id, Some(m.event_id));
    assert!(
        dead[0].error.contains("after 3 deliveries"),
        "{}",
        dead[0].error
    );
    assert!(rig.source.ready() == 0 && rig.source.unsettled() == 0);

    assert_eq!(rig.fixture.requeue_consumer_dead_letters("c").await, 1);
    assert_eq!(consumer.process_requeued().await.unwrap(), 1);
    assert_eq!(rig.effects(m.event_id).await, 1);
    assert_eq!(
        consumer.process_requeued().await.unwrap(),
        0,
        "a resolved letter is not applied again"
    );
    let dead = rig.fixture.consumer_dead_letters("c").await;
    assert_eq!(dead[0].state, "resolved");
    rig.fixture.cleanup().await;
}

/// A permanent error dead-letters at once and acknowledges; the events behind it go on.
pub async fn a_permanent_error_is_dead_lettered_at_once<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let bad = event_message(Uuid::now_v7(), "a", 1, "{}");
    let good = event_message(Uuid::now_v7(), "b", 1, "{}");
    rig.handler.script(bad.event_id, &[Script::Permanent]);
    rig.source.push_message(&bad);
    rig.source.push_message(&good);
    let (r, _) = rig.drain(fast_config("c")).await;
    assert_eq!((r.processed, r.dead_lettered, r.nacked), (1, 1, 0), "{r:?}");
    assert_eq!(rig.effects(bad.event_id).await, 0);
    assert_eq!(rig.effects(good.event_id).await, 1);
    let dead = rig.fixture.consumer_dead_letters("c").await;
    assert!(dead[0].error.contains("permanent"), "{}", dead[0].error);
    assert_eq!(rig.source.acked(), 2);
    rig.fixture.cleanup().await;
}

/// A message that does not decode is dead-lettered with the reason and its raw bytes, and
/// acknowledged; the valid message behind it is applied.
pub async fn a_malformed_message_is_dead_lettered_and_does_not_block<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let mut garbage = crate::fakes::wire_message(&event_message(Uuid::now_v7(), "a", 1, "{}"));
    garbage.headers.remove("ce-id");
    rig.source.push(garbage);
    let good = event_message(Uuid::now_v7(), "b", 1, "{}");
    rig.source.push_message(&good);
    let (r, _) = rig.drain(fast_config("c")).await;
    assert_eq!((r.processed, r.dead_lettered), (1, 1), "{r:?}");
    assert_eq!(rig.effects(good.event_id).await, 1);
    let dead = rig.fixture.consumer_dead_letters("c").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].event_id, None);
    assert!(dead[0].error.starts_with("malformed"), "{}", dead[0].error);
    rig.fixture.cleanup().await;
}

/// The same id with another payload is recorded as a conflict and never applied (G8); with
/// `ConflictPolicy::Hold` the delivery is sent back instead of acknowledged.
pub async fn a_conflict_is_recorded_not_applied<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let id = Uuid::now_v7();
    let first = event_message(id, "a", 1, r#"{"amount":100}"#);
    let changed = event_message(id, "a", 1, r#"{"amount":999}"#);
    rig.source.push_message(&first);
    rig.source.push_message(&changed);
    let (r, _) = rig.drain(fast_config("c")).await;
    assert_eq!((r.processed, r.conflicts), (1, 1), "{r:?}");
    assert_eq!(rig.effects(id).await, 1);
    assert_eq!(rig.fixture.conflict_count().await, 1);

    rig.source.push_message(&changed);
    let mut held = rig.consumer(ConsumerConfig {
        conflict_policy: ConflictPolicy::Hold,
        ..fast_config("c")
    });
    let nacked_before = rig.source.nacked();
    let r = held.run_batch().await.unwrap();
    assert_eq!(r.conflicts, 1, "{r:?}");
    assert_eq!(
        rig.source.nacked(),
        nacked_before + 1,
        "a held conflict comes back"
    );
    assert_eq!(rig.effects(id).await, 1);
    rig.fixture.cleanup().await;
}

/// In batch mode a failing delivery rolls back only its own writes: the others commit once.
pub async fn a_batch_failure_rolls_back_only_its_own_writes<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let messages = one_per_aggregate(5, 1);
    // The batch's first attempt runs the handler too, then redoes the batch one delivery at a
    // time: the poisoned event fails every run, the transient one only its first.
    rig.handler.poison(messages[2].event_id);
    rig.handler
        .script(messages[3].event_id, &[Script::Transient]);
    rig.push(&messages);
    let (r, _) = rig.drain(batched(10)).await;
    assert_eq!((r.processed, r.dead_lettered, r.nacked), (4, 1, 1), "{r:?}");
    for (i, m) in messages.iter().enumerate() {
        let want = u64::from(i != 2);
        assert_eq!(rig.effects(m.event_id).await, want, "event {i}");
    }
    rig.fixture.cleanup().await;
}

/// A handler that writes a batch's effects in one `handle_many` call and records each call's
/// events; `handle` (the redo path) is the test handler's.
struct BatchHandler<F> {
    inner: Arc<TestHandler<F>>,
    calls: Arc<Mutex<Vec<Vec<Uuid>>>>,
    /// The next call panics after writing its effects.
    panic_next: std::sync::atomic::AtomicBool,
}

impl<F: StoreFixture> Handler<<F::Store as InboxStore>::Conn> for BatchHandler<F> {
    /// The test handler's, for the redo one delivery at a time.
    async fn handle(
        &self,
        conn: &mut <F::Store as InboxStore>::Conn,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        self.inner.handle(conn, event).await
    }

    async fn handle_many(
        &self,
        conn: &mut <F::Store as InboxStore>::Conn,
        events: &[&IncomingEvent],
    ) -> Result<(), HandlerError> {
        self.calls
            .lock()
            .unwrap()
            .push(events.iter().map(|e| e.event_id).collect());
        for event in events {
            self.inner
                .fixture
                .write_effect(conn, &self.inner.key(event.event_id))
                .await?;
        }
        if self
            .panic_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            panic!("scripted panic in handle_many");
        }
        if events
            .iter()
            .any(|e| self.inner.poison.lock().unwrap().contains(&e.event_id))
        {
            return Err(HandlerError::permanent("poisoned event in the batch"));
        }
        Ok(())
    }
}

/// Batch mode hands the handler every new event of a batch in one `handle_many` call, in
/// delivery order, without the redeliveries the inbox absorbed; when that call fails, its
/// writes roll back and the batch is redone one delivery at a time with `handle`, so only the
/// failing delivery is dead-lettered and every other event has exactly one effect.
pub async fn a_batch_handler_gets_the_new_events_at_once_and_a_failure_is_redone_one_by_one<
    F: StoreFixture,
>() {
    let rig = Rig::<F>::new("c").await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let mut consumer = rig.batch_consumer(&calls, false);
    let first = one_per_aggregate(3, 1);
    rig.push(&first);
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!(r.processed, 3, "{r:?}");
    // A redelivery of the first event beside four new ones, the third of which is poisoned.
    let second = one_per_aggregate(4, 2);
    rig.handler.poison(second[2].event_id);
    rig.source.push_message(&first[0]);
    rig.push(&second);
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!(
        (r.processed, r.duplicates, r.dead_lettered),
        (3, 1, 1),
        "{r:?}"
    );
    let ids = |ms: &[outbox_core::OutboxMessage]| ms.iter().map(|m| m.event_id).collect::<Vec<_>>();
    // The batch's one call; its failure made the engine redo the batch with `handle`, one
    // delivery per transaction, so there is no second batch call.
    assert_eq!(
        *calls.lock().unwrap(),
        vec![ids(&first), ids(&second)],
        "one call per batch, new events only, in delivery order"
    );
    for (i, m) in first.iter().chain(&second).enumerate() {
        let want = u64::from(m.event_id != second[2].event_id);
        assert_eq!(rig.effects(m.event_id).await, want, "event {i}");
    }
    assert_eq!(rig.source.unsettled(), 0);
    rig.fixture.cleanup().await;
}

/// A batch that mixes new events with a malformed delivery and a conflicting one: the batch
/// call gets the new events alone; when it panics, its writes roll back and the batch is redone
/// one delivery at a time, so each new event has one effect, the malformed delivery is
/// dead-lettered once and the conflict recorded once.
pub async fn a_panicking_batch_handler_on_a_mixed_batch_is_redone_one_by_one<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let id = Uuid::now_v7();
    let first = event_message(id, "a", 1, r#"{"amount":100}"#);
    rig.source.push_message(&first);
    let mut consumer = rig.batch_consumer(&calls, false);
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!(r.processed, 1, "{r:?}");

    let b = event_message(Uuid::now_v7(), "b", 1, "{}");
    let changed = event_message(id, "a", 1, r#"{"amount":999}"#);
    let mut garbage = crate::fakes::wire_message(&event_message(Uuid::now_v7(), "g", 1, "{}"));
    garbage.headers.remove("ce-id");
    let c = event_message(Uuid::now_v7(), "c", 1, "{}");
    rig.source.push_message(&b);
    rig.source.push_message(&changed);
    rig.source.push(garbage);
    rig.source.push_message(&c);
    calls.lock().unwrap().clear();
    // A second consumer, whose handler panics on its first call.
    let mut consumer = rig.batch_consumer(&calls, true);
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!(
        (r.processed, r.conflicts, r.dead_lettered, r.nacked),
        (2, 1, 1, 0),
        "{r:?}"
    );
    assert_eq!(
        *calls.lock().unwrap(),
        vec![vec![b.event_id, c.event_id]],
        "the one batch call, with the new events only"
    );
    for (m, want) in [(&first, 1), (&b, 1), (&c, 1)] {
        assert_eq!(rig.effects(m.event_id).await, want);
    }
    assert_eq!(rig.fixture.conflict_count().await, 1);
    assert_eq!(rig.fixture.consumer_dead_letters("c").await.len(), 1);
    assert_eq!(rig.source.unsettled(), 0);
    rig.fixture.cleanup().await;
}

/// `Consumer::run` sends a batch's acks beside the next batch (a broker's confirmation takes
/// a round trip), and every committed delivery is acknowledged by the time it returns, after
/// which the source is released once (what it received ahead goes back to the broker).
pub async fn run_acks_beside_the_next_batch_and_settles_everything_before_it_returns<
    F: StoreFixture,
>() {
    let source = FakeSource::with_ack_delay(Duration::from_millis(50));
    let rig = Rig::<F>::with_source("c", source).await;
    let messages = one_per_aggregate(20, 1);
    rig.push(&messages);
    let consumer = consumer_of(rig.fixture.store(), &rig.source, &rig.handler, batched(5));
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    rig.wait_applied(&messages, "every event applied").await;
    let source = &rig.source;
    assert_eq!(source.releases(), 0, "nothing released while running");
    stop.cancel();
    task.await.expect("the consumer's task");
    assert_eq!(
        source.acked(),
        messages.len(),
        "every delivery acknowledged"
    );
    assert_eq!(source.unsettled(), 0);
    assert_eq!(
        source.releases(),
        1,
        "the source is released once when run stops"
    );
    assert_eq!(
        source.unsettled_at_release(),
        0,
        "released after the last batch's acks"
    );
    assert!(
        source.unsettled_at_fetch() > 0,
        "a batch was taken while the acks of the one before were on their way"
    );
    for m in &messages {
        assert_eq!(rig.effects(m.event_id).await, 1);
    }
    rig.fixture.cleanup().await;
}

/// `OrderingGuard::Wait`: a version that arrives before the one it follows is sent back until
/// the missing one came; an older version that comes again is absorbed as stale.
pub async fn the_ordering_guard_holds_a_gap_until_the_missing_version<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let v1 = event_message(Uuid::now_v7(), "a", 1, r#"{"v":1}"#);
    let v2 = event_message(Uuid::now_v7(), "a", 2, r#"{"v":2}"#);
    let v1_again = event_message(Uuid::now_v7(), "a", 1, r#"{"v":1,"replayed":true}"#);
    rig.source.push_message(&v2);
    rig.source.push_message(&v1);
    let mut consumer = rig.consumer(ConsumerConfig {
        ordering: OrderingGuard::Wait,
        ..fast_config("c")
    });
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!(r.processed, 2, "{r:?}");
    assert!(r.nacked >= 1, "v2 waited for v1: {r:?}");
    rig.source.push_message(&v1_again);
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!(r.stale, 1, "{r:?}");
    assert_eq!(rig.effects(v1.event_id).await, 1);
    assert_eq!(rig.effects(v2.event_id).await, 1);
    assert_eq!(rig.effects(v1_again.event_id).await, 0);
    rig.fixture.cleanup().await;
}

/// Two consumers of one event, each with its own name, get one effect each.
pub async fn two_consumers_get_one_effect_each<F: StoreFixture>() {
    let rig = Rig::<F>::new("reporting").await;
    let billing = Arc::new(TestHandler::new(Arc::clone(&rig.fixture), "billing"));
    let m = event_message(Uuid::now_v7(), "a", 1, "{}");
    let billing_source = FakeSource::new();
    for _ in 0..2 {
        rig.source.push_message(&m);
        billing_source.push_message(&m);
    }
    let mut reporting = rig.consumer(fast_config("reporting"));
    let mut billing_consumer = consumer_of(
        rig.fixture.store(),
        &billing_source,
        &billing,
        fast_config("billing"),
    );
    drain(&mut reporting, &rig.source).await;
    drain(&mut billing_consumer, &billing_source).await;
    assert_eq!(rig.effects(m.event_id).await, 1);
    assert_eq!(rig.fixture.effect_count(&billing.key(m.event_id)).await, 1);
    rig.fixture.cleanup().await;
}

/// A database outage (begin, record or commit failing) is waited out: the deliveries are sent
/// back, never acknowledged before a commit (G6), and applied once when the store is back.
pub async fn a_store_outage_loses_nothing_and_acks_only_after_commit<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let messages = one_per_aggregate(3, 1);
    rig.push(&messages);
    let mut consumer = rig.consumer(fast_config("c"));
    rig.faults.fail_op("commit", 2);
    rig.faults.fail_op("begin", 1);
    rig.faults.fail_op("inbox record", 1);
    let (r, errors) = drain(&mut consumer, &rig.source).await;
    assert_eq!(rig.faults.injected(), 4, "every planned failure happened");
    assert!(errors >= 1, "an outage is reported");
    assert_eq!(r.processed, 3, "{r:?}");
    for m in &messages {
        assert_eq!(rig.effects(m.event_id).await, 1);
    }
    assert_eq!(
        rig.source.acked(),
        3,
        "each acknowledged once, after its commit"
    );
    rig.fixture.cleanup().await;
}

/// `Consumer::run` releases its source after an error, before it waits (what the source
/// received ahead goes back to the broker instead of waiting there), and again when it stops;
/// the delivery of the failed batch is applied once on the retry.
pub async fn run_releases_the_source_after_an_error<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let m = event_message(Uuid::now_v7(), "a", 1, "{}");
    rig.source.push_message(&m);
    let consumer = rig.consumer(fast_config("c"));
    rig.faults.fail_op("commit", 1);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(consumer.run(stop.clone()));
    rig.wait_applied(std::slice::from_ref(&m), "the event applied")
        .await;
    assert_eq!(rig.faults.injected(), 1, "the planned failure happened");
    assert_eq!(rig.source.releases(), 1, "released once, after the error");
    stop.cancel();
    task.await.expect("the consumer's task");
    assert_eq!(rig.source.releases(), 2, "and once more when run stopped");
    assert_eq!(rig.source.acked(), 1);
    assert_eq!(rig.effects(m.event_id).await, 1);
    rig.fixture.cleanup().await;
}

/// The consumer says why it is stuck (`ConsumerStats::health`): idle with nothing to do; a
/// handler that fails makes it `failing` with the handler's words until the delivery is
/// applied; a broker that cannot be read, until a read succeeds; a database outage, until a
/// batch commits; a dead letter that cannot be written, until one is; a dead letter is an
/// error and progress at once.
pub async fn a_stuck_consumer_says_why<F: StoreFixture>() {
    use outbox_core::health::{HealthState, TroubleKind};
    let rig = Rig::<F>::new("c").await;
    let mut consumer = rig.consumer(fast_config("c"));
    let health = consumer.stats().health();
    consumer.run_batch().await.expect("an empty batch");
    assert_eq!(health.report().state, HealthState::Idle);
    let failing = |kind: TroubleKind, words: &str| {
        let h = health.report();
        assert_eq!(h.state, HealthState::Failing, "{h:?}");
        let e = h.last_error.expect("the last error");
        assert_eq!(e.kind, kind, "{e:?}");
        assert!(e.message.contains(words), "{e:?}");
    };

    let m = event_message(Uuid::now_v7(), "a", 1, "{}");
    rig.handler.script(m.event_id, &[Script::Transient]);
    rig.source.push_message(&m);
    assert_eq!(consumer.run_batch().await.unwrap().nacked, 1);
    failing(TroubleKind::Handler, "transient: scripted transient");
    assert_eq!(consumer.run_batch().await.unwrap().processed, 1);
    let h = health.report();
    assert_eq!(h.state, HealthState::Degraded, "{h:?}");
    assert!(h.last_progress_at.is_some());

    rig.source.fail_reads(2, "connection reset by the broker");
    assert!(consumer.run_batch().await.is_err());
    assert!(consumer.run_batch().await.is_err());
    failing(TroubleKind::Source, "connection reset by the broker");
    consumer.run_batch().await.expect("the broker is back");
    assert_eq!(health.report().state, HealthState::Degraded);

    let m = event_message(Uuid::now_v7(), "b", 1, "{}");
    rig.source.push_message(&m);
    rig.faults.fail_op("inbox record", 1);
    assert!(consumer.run_batch().await.is_err());
    failing(TroubleKind::Store, "inbox record");
    assert_eq!(consumer.run_batch().await.unwrap().processed, 1);
    assert_eq!(health.report().state, HealthState::Degraded);

    // A permanent failure whose dead letter cannot be written (a missing grant): sent back,
    // failing with both reasons; the next delivery writes it.
    let m = event_message(Uuid::now_v7(), "c", 1, "{}");
    rig.handler
        .script(m.event_id, &[Script::Permanent, Script::Permanent]);
    rig.source.push_message(&m);
    rig.faults
        .fail_op_with("dead letter", StoreErrorKind::PermissionDenied, 1);
    assert_eq!(consumer.run_batch().await.unwrap().nacked, 1);
    failing(
        TroubleKind::Store,
        "cannot write the dead letter (permanent handler error",
    );
    assert_eq!(consumer.run_batch().await.unwrap().dead_lettered, 1);
    let h = health.report();
    assert_eq!(h.state, HealthState::Degraded, "{h:?}");
    let e = h.last_error.as_ref().expect("the dead letter");
    assert_eq!(e.kind, TroubleKind::DeadLetter);
    assert!(e.message.contains("scripted permanent"), "{e:?}");
    // The handler's 1 + 2 failures, two reads, the outage, the refused and the written dead
    // letter.
    assert_eq!((h.errors, h.errors_per_minute), (8, 8), "{h:?}");
    rig.fixture.cleanup().await;
}

/// The database refuses a delivery's values (`InvalidData`: bytes it cannot store, a key over
/// an index's limit): the delivery is dead-lettered at its first delivery, with its event id
/// and the reason, and acknowledged; the delivery behind it is applied; nothing is sent back.
/// One transaction per delivery and in batches.
pub async fn a_delivery_the_database_refuses_is_dead_lettered_at_once<F: StoreFixture>() {
    for batch_size in [1, 10] {
        let rig = Rig::<F>::new("c").await;
        let bad = event_message(Uuid::now_v7(), "a", 1, "{}");
        let good = event_message(Uuid::now_v7(), "b", 1, "{}");
        rig.faults
            .fail_event(bad.event_id, StoreErrorKind::InvalidData, u32::MAX);
        rig.source.push_message(&bad);
        rig.source.push_message(&good);
        let (r, errors) = rig.drain(batched(batch_size)).await;
        let what = format!("batch size {batch_size}: {r:?}");
        assert_eq!(
            (r.processed, r.dead_lettered, r.nacked, errors),
            (1, 1, 0, 0),
            "{what}"
        );
        assert_eq!(rig.effects(bad.event_id).await, 0, "{what}");
        assert_eq!(rig.effects(good.event_id).await, 1, "{what}");
        let dead = rig.fixture.consumer_dead_letters("c").await;
        assert_eq!(dead.len(), 1, "{what}");
        assert_eq!(dead[0].event_id, Some(bad.event_id), "{what}");
        assert_eq!(dead[0].attempts, 1, "{what}");
        assert!(
            dead[0].error.starts_with("refused by the database"),
            "{what}: {}",
            dead[0].error
        );
        assert_eq!(rig.source.acked(), 2, "{what}");
        rig.fixture.cleanup().await;
    }
}

/// Any other database error (a missing grant, a constraint, a deadlock or serialization
/// failure that recurs on every delivery, anything) sends the delivery back, and at its
/// `max_attempts`th delivery dead-letters it ("parked"), visibly: counted, with the reason and
/// the attempts. The delivery behind it is applied.
pub async fn other_database_errors_are_retried_then_dead_lettered<F: StoreFixture>() {
    for kind in [StoreErrorKind::PermissionDenied, StoreErrorKind::Contention] {
        retried_then_dead_lettered::<F>(kind).await;
    }
}

async fn retried_then_dead_lettered<F: StoreFixture>(kind: StoreErrorKind) {
    let rig = Rig::<F>::new("c").await;
    let bad = event_message(Uuid::now_v7(), "a", 1, "{}");
    let good = event_message(Uuid::now_v7(), "b", 1, "{}");
    rig.faults.fail_event(bad.event_id, kind, u32::MAX);
    rig.source.push_message(&bad);
    rig.source.push_message(&good);
    let (r, errors) = rig.drain(attempts(3)).await;
    assert_eq!(
        (r.processed, r.dead_lettered, r.nacked, errors),
        (1, 1, 2, 0),
        "{r:?}"
    );
    assert_eq!(rig.effects(bad.event_id).await, 0);
    assert_eq!(rig.effects(good.event_id).await, 1);
    let dead = rig.fixture.consumer_dead_letters("c").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].event_id, dead[0].attempts),
        (Some(bad.event_id), 3)
    );
    assert!(
        dead[0]
            .error
            .starts_with("database error after 3 deliveries")
            && dead[0].error.contains(&format!("{kind:?}")),
        "{}",
        dead[0].error
    );
    assert!(rig.source.ready() == 0 && rig.source.unsettled() == 0);
    rig.fixture.cleanup().await;
}

/// A database outage is waited out however many deliveries it lasts (here four times
/// `max_attempts`): never dead-lettered, applied once when the database is back.
pub async fn an_outage_is_never_dead_lettered<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let m = event_message(Uuid::now_v7(), "a", 1, "{}");
    rig.faults
        .fail_event(m.event_id, StoreErrorKind::Unavailable, 12);
    rig.source.push_message(&m);
    let (r, errors) = rig.drain(attempts(3)).await;
    assert_eq!(rig.faults.injected(), 12, "the outage lasted 12 deliveries");
    assert_eq!(errors, 12, "each reported as an outage");
    assert_eq!((r.processed, r.dead_lettered), (1, 0), "{r:?}");
    assert_eq!(rig.effects(m.event_id).await, 1);
    assert!(rig.fixture.consumer_dead_letters("c").await.is_empty());
    assert_eq!(rig.source.acked(), 1);
    rig.fixture.cleanup().await;
}

/// Where the broker does not count deliveries, the engine counts them itself: the cap of
/// `max_attempts` holds for database errors and transient handler errors alike.
pub async fn the_attempt_cap_holds_without_a_broker_count<F: StoreFixture>() {
    let rig = Rig::<F>::with_source("c", FakeSource::without_counts()).await;
    let refused = event_message(Uuid::now_v7(), "a", 1, "{}");
    let flaky = event_message(Uuid::now_v7(), "b", 1, "{}");
    let good = event_message(Uuid::now_v7(), "c", 1, "{}");
    rig.faults
        .fail_event(refused.event_id, StoreErrorKind::Other, u32::MAX);
    rig.handler.script(flaky.event_id, &[Script::Transient; 10]);
    for m in [&refused, &flaky, &good] {
        rig.source.push_message(m);
    }
    let (r, errors) = rig.drain(attempts(4)).await;
    assert_eq!(
        (r.processed, r.dead_lettered, r.nacked, errors),
        (1, 2, 6, 0),
        "{r:?}"
    );
    assert_eq!(rig.effects(good.event_id).await, 1);
    let dead = rig.fixture.consumer_dead_letters("c").await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(dead.iter().all(|d| d.attempts == 4), "{dead:?}");
    rig.fixture.cleanup().await;
}

/// When the database refuses the dead letter with the decoded event's fields, it is written
/// with the raw message alone: the delivery is still parked, never sent back for ever.
pub async fn a_refused_dead_letter_is_kept_with_the_raw_message_alone<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let bad = event_message(Uuid::now_v7(), "a", 1, "{}");
    let good = event_message(Uuid::now_v7(), "b", 1, "{}");
    rig.handler.poison(bad.event_id);
    rig.faults
        .fail_op_with("dead letter", StoreErrorKind::InvalidData, 1);
    rig.source.push_message(&bad);
    rig.source.push_message(&good);
    let (r, errors) = rig.drain(fast_config("c")).await;
    assert_eq!(rig.faults.injected(), 1);
    assert_eq!(
        (r.processed, r.dead_lettered, r.nacked, errors),
        (1, 1, 0, 0),
        "{r:?}"
    );
    let dead = rig.fixture.consumer_dead_letters("c").await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].event_id, None, "written without the decoded fields");
    assert!(dead[0].error.contains("permanent"), "{}", dead[0].error);
    assert_eq!(rig.requeued_raw().await, vec![wire_message(&bad)]);
    rig.fixture.cleanup().await;
}

/// A hostile message (NUL in its content type, a header name and a value, control characters,
/// a header that is not UTF-8, broker metadata) is dead-lettered as malformed with a printable
/// reason and kept byte for byte; the valid message behind it is applied.
pub async fn a_hostile_message_is_dead_lettered_byte_for_byte<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let mut hostile = wire_message(&event_message(Uuid::now_v7(), "a", 1, "{}"));
    hostile.content_type = Some("application/json\0\u{1b}[31m".into());
    hostile
        .headers
        .insert("x-\0name".into(), "v\0\r\nalue".into());
    hostile
        .binary_headers
        .insert("x-binary".into(), Bytes::from_static(&[0xff, 0x00, 0xfe]));
    hostile.payload = Bytes::from_static(b"\xff\x00 not UTF-8");
    hostile
        .metadata
        .insert("subject".into(), "payments.a".into());
    let good = event_message(Uuid::now_v7(), "b", 1, "{}");
    rig.source.push(hostile.clone());
    rig.source.push_message(&good);
    for batch_size in [1, 10] {
        let (r, errors) = rig.drain(batched(batch_size)).await;
        if batch_size == 1 {
            assert_eq!(
                (r.processed, r.dead_lettered, r.nacked, errors),
                (1, 1, 0, 0),
                "{r:?}"
            );
            // Once more, in one batch with a duplicate of the valid message.
            rig.source.push(hostile.clone());
            rig.source.push_message(&good);
        } else {
            assert_eq!((r.duplicates, r.dead_lettered, errors), (1, 1, 0), "{r:?}");
        }
    }
    assert_eq!(rig.effects(good.event_id).await, 1);
    let dead = rig.fixture.consumer_dead_letters("c").await;
    assert_eq!(dead.len(), 2);
    for d in &dead {
        assert!(d.error.starts_with("malformed"), "{}", d.error);
        assert!(!d.error.chars().any(char::is_control), "{:?}", d.error);
    }
    assert_eq!(rig.requeued_raw().await, vec![hostile.clone(), hostile]);
    rig.fixture.cleanup().await;
}

/// A requeued dead letter whose inbox record the database refuses goes back to `dead` with
/// the reason; the next requeued letter is still applied.
pub async fn a_requeued_letter_the_database_refuses_does_not_block_the_others<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let (first, second) = (
        event_message(Uuid::now_v7(), "a", 1, "{}"),
        event_message(Uuid::now_v7(), "b", 1, "{}"),
    );
    for m in [&first, &second] {
        rig.handler.script(m.event_id, &[Script::Permanent]);
        rig.source.push_message(m);
    }
    let mut consumer = rig.consumer(fast_config("c"));
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!(r.dead_lettered, 2, "{r:?}");
    rig.faults
        .fail_event(first.event_id, StoreErrorKind::InvalidData, u32::MAX);
    assert_eq!(rig.fixture.requeue_consumer_dead_letters("c").await, 2);
    assert_eq!(consumer.process_requeued().await.unwrap(), 1);
    assert_eq!(rig.effects(first.event_id).await, 0);
    assert_eq!(rig.effects(second.event_id).await, 1);
    let dead = rig.fixture.consumer_dead_letters("c").await;
    let state = |id| {
        dead.iter()
            .find(|d| d.event_id == Some(id))
            .map(|d| (d.state.clone(), d.error.clone()))
            .expect("a dead letter")
    };
    let (first_state, first_error) = state(first.event_id);
    assert_eq!(first_state, "dead");
    assert!(
        first_error.starts_with("database error on requeue"),
        "{first_error}"
    );
    assert_eq!(state(second.event_id).0, "resolved");
    rig.fixture.cleanup().await;
}

/// A requeued letter whose apply loses to a concurrent transaction (deadlock, serialization
/// failure) stays requeued and is applied on the next round: a transient conflict never undoes
/// the operator's requeue.
pub async fn a_requeued_letter_survives_a_deadlock<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let m = event_message(Uuid::now_v7(), "a", 1, "{}");
    rig.handler.script(m.event_id, &[Script::Permanent]);
    rig.source.push_message(&m);
    let mut consumer = rig.consumer(fast_config("c"));
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!(r.dead_lettered, 1, "{r:?}");
    rig.faults
        .fail_event(m.event_id, StoreErrorKind::Contention, 1);
    assert_eq!(rig.fixture.requeue_consumer_dead_letters("c").await, 1);
    let e = consumer.process_requeued().await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Contention);
    let dead = rig.fixture.consumer_dead_letters("c").await;
    assert_eq!(dead[0].state, "requeued", "{dead:?}");
    assert_eq!(consumer.process_requeued().await.unwrap(), 1);
    assert_eq!(rig.effects(m.event_id).await, 1);
    assert_eq!(
        rig.fixture.consumer_dead_letters("c").await[0].state,
        "resolved"
    );
    rig.fixture.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// Executor

fn executor_config() -> ExecutorConfig {
    let fast = Backoff {
        base: Duration::from_millis(50),
        max: Duration::from_millis(100),
    };
    ExecutorConfig {
        poll_interval: Duration::from_millis(10),
        reconcile_after: Duration::from_secs(5),
        call_timeout: Duration::from_secs(2),
        lookup_backoff: fast,
        retry_backoff: fast,
        ..ExecutorConfig::new("payout")
    }
}

/// An executor of `payout` items over `store`, calling a provider in `mode`, with `config`.
fn executor_with<S: WorkItemStore>(
    store: S,
    mode: CallMode,
    config: ExecutorConfig,
) -> Executor<S, FakeProvider> {
    Executor::new(store, FakeProvider::new(mode), config).expect("valid config")
}

/// [`executor_with`] the [`executor_config`].
fn executor<S: WorkItemStore>(store: S, mode: CallMode) -> Executor<S, FakeProvider> {
    executor_with(store, mode, executor_config())
}

/// Writes a `payout` work item of `consumer` for a new event; returns its id and key.
async fn work_item<F: StoreFixture>(f: &F, consumer: &str) -> (i64, String) {
    let item = NewWorkItem::for_event(
        "payout",
        consumer,
        Uuid::now_v7(),
        serde_json::json!({"amount": 1250, "beneficiary": consumer}),
    );
    (enqueue_work_item(f, &item).await, item.idempotency_key)
}

/// A consumer's work item is written with its inbox transaction (rolled back with it), once
/// per event however often the event is delivered.
pub async fn work_items_are_written_with_the_inbox_transaction<F: StoreFixture>() {
    let rig = Rig::<F>::new("c").await;
    let handler = Arc::new(TestHandler::new(Arc::clone(&rig.fixture), "c").with_work_items());
    let m = event_message(Uuid::now_v7(), "a", 1, "{}");
    handler.script(m.event_id, &[Script::Transient]);
    for _ in 0..2 {
        rig.source.push_message(&m);
    }
    let mut consumer = consumer_of(rig.fixture.store(), &rig.source, &handler, fast_config("c"));
    let (r, _) = drain(&mut consumer, &rig.source).await;
    assert_eq!((r.processed, r.duplicates), (1, 1), "{r:?}");
    let items = rig.fixture.work_items().await;
    assert_eq!(items.len(), 1, "one work item per event: {items:?}");
    assert_eq!(items[0].state, WorkItemState::Pending);
    rig.fixture.cleanup().await;
}

/// The happy path: one call with the key, the reference kept.
pub async fn a_call_succeeds_once_with_its_key<F: StoreFixture>() {
    let f = F::new().await;
    let (id, key) = work_item(&f, "ledger").await;
    let ex = executor(f.store(), CallMode::Succeed);
    let r = ex.run_once().await.unwrap();
    assert_eq!((r.called, r.succeeded), (1, 1), "{r:?}");
    let w = f.work_item(id).await;
    assert_eq!((w.state, w.attempts), (WorkItemState::Succeeded, 1));
    assert!(w.reference.is_some());
    assert_eq!(ex.provider().calls_for(&key), 1);
    assert_eq!(
        ex.run_once().await.unwrap().called,
        0,
        "settled items are not called"
    );
    f.cleanup().await;
}

/// A refusal is terminal: `failed`, never called again.
pub async fn a_failed_call_is_terminal<F: StoreFixture>() {
    let f = F::new().await;
    let (id, key) = work_item(&f, "ledger").await;
    let ex = executor(f.store(), CallMode::Fail);
    assert_eq!(ex.run_once().await.unwrap().failed, 1);
    f.age_work_items(Duration::from_secs(3600)).await;
    ex.run_once().await.unwrap();
    assert_eq!(f.work_item(id).await.state, WorkItemState::Failed);
    assert_eq!(ex.provider().calls_for(&key), 1);
    f.cleanup().await;
}

/// An unknown outcome is looked up, never blindly retried: the provider had acted, the lookup
/// finds it, and there is exactly one payout.
pub async fn an_unknown_outcome_is_reconciled_without_a_second_call<F: StoreFixture>() {
    let f = F::new().await;
    let (id, key) = work_item(&f, "ledger").await;
    let ex = executor(f.store(), CallMode::PerformedUnknown);
    let r = ex.run_once().await.unwrap();
    assert_eq!(r.unknown, 1, "{r:?}");
    assert_eq!(f.work_item(id).await.state, WorkItemState::Unknown);
    f.age_work_items(Duration::from_secs(10)).await;
    let r = ex.run_once().await.unwrap();
    assert_eq!(r.reconciled_succeeded, 1, "{r:?}");
    let w = f.work_item(id).await;
    assert_eq!((w.state, w.lookups), (WorkItemState::Succeeded, 1));
    assert_eq!(ex.provider().calls_for(&key), 1);
    assert_eq!(ex.provider().performed(), 1, "exactly one payout");
    f.cleanup().await;
}

/// A lookup that finds nothing sends the item back for a call with the same key (resend on), or
/// parks it for an operator (resend off); a lookup without an answer keeps it unknown.
pub async fn not_found_resends_with_the_same_key_or_parks<F: StoreFixture>() {
    let f = F::new().await;
    let (resend, key) = work_item(&f, "a").await;
    let ex = executor(f.store(), CallMode::LostUnknown);
    ex.run_once().await.unwrap();
    ex.provider().with(|s| s.lookup_unknown = true);
    f.age_work_items(Duration::from_secs(10)).await;
    let r = ex.run_once().await.unwrap();
    assert_eq!(r.still_unknown, 1, "{r:?}");
    assert_eq!(f.work_item(resend).await.state, WorkItemState::Unknown);
    ex.provider().with(|s| {
        s.lookup_unknown = false;
        s.mode = CallMode::Succeed;
    });
    f.age_work_items(Duration::from_secs(10)).await;
    let r = ex.run_once().await.unwrap();
    assert_eq!(r.resent, 1, "{r:?}");
    f.age_work_items(Duration::from_secs(10)).await;
    ex.run_once().await.unwrap();
    let w = f.work_item(resend).await;
    assert_eq!(w.state, WorkItemState::Succeeded);
    assert_eq!(
        ex.provider().calls_for(&key),
        2,
        "called again, with the same key"
    );
    assert_eq!(ex.provider().performed(), 1);

    let (parked, _) = work_item(&f, "b").await;
    let cautious = executor_with(
        f.store(),
        CallMode::LostUnknown,
        ExecutorConfig {
            resend_when_not_found: false,
            ..executor_config()
        },
    );
    cautious.run_once().await.unwrap();
    f.age_work_items(Duration::from_secs(10)).await;
    let r = cautious.run_once().await.unwrap();
    assert_eq!(r.parked, 1, "{r:?}");
    let w = f.work_item(parked).await;
    assert_eq!(w.state, WorkItemState::Unknown);
    assert_eq!(w.last_error.as_deref(), Some(PARKED_REASON));
    f.cleanup().await;
}

/// An executor that stalls past its lease cannot record; the item goes to `unknown` (never
/// back to `pending`) and is reconciled without a second call.
pub async fn an_expired_lease_goes_unknown_and_the_stale_record_is_refused<F: StoreFixture>() {
    let f = F::new().await;
    let (id, key) = work_item(&f, "ledger").await;
    let slow = Arc::new(executor(
        f.store(),
        CallMode::SucceedAfter(Duration::from_millis(600)),
    ));
    let sweeper = executor_with(
        f.store(),
        CallMode::Succeed,
        ExecutorConfig {
            reconcile_after: Duration::from_secs(3600),
            ..executor_config()
        },
    );
    let task = tokio::spawn({
        let slow = Arc::clone(&slow);
        async move { slow.run_once().await }
    });
    let mut claimed = false;
    for _ in 0..100 {
        if f.work_item(id).await.state == WorkItemState::InProgress {
            claimed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(claimed, "the slow executor claimed the item");
    f.expire_work_item_leases().await;
    assert_eq!(sweeper.run_once().await.unwrap().expired, 1);
    let r = task.await.unwrap().unwrap();
    assert_eq!((r.lease_lost, r.succeeded), (1, 0), "{r:?}");
    let w = f.work_item(id).await;
    assert_eq!(w.state, WorkItemState::Unknown);
    assert_eq!(w.last_error.as_deref(), Some(LEASE_EXPIRED_REASON));
    f.age_work_items(Duration::from_secs(7200)).await;
    let r = slow.run_once().await.unwrap();
    assert_eq!(r.reconciled_succeeded, 1, "{r:?}");
    assert_eq!(ex_calls(&slow, &key) + ex_calls(&sweeper, &key), 1);
    assert_eq!(slow.provider().performed(), 1);
    f.cleanup().await;
}

fn ex_calls<S: WorkItemStore>(ex: &Executor<S, FakeProvider>, key: &str) -> usize {
    ex.provider().calls_for(key)
}

/// `NotSent` is retried with backoff, then failed at the limit.
pub async fn not_sent_is_retried_then_failed_at_the_limit<F: StoreFixture>() {
    let f = F::new().await;
    let (id, key) = work_item(&f, "ledger").await;
    let ex = executor_with(
        f.store(),
        CallMode::NotSent,
        ExecutorConfig {
            max_not_sent_attempts: 2,
            retry_backoff: Backoff {
                base: Duration::from_secs(60),
                max: Duration::from_secs(120),
            },
            ..executor_config()
        },
    );
    assert_eq!(ex.run_once().await.unwrap().not_sent, 1);
    let w = f.work_item(id).await;
    assert_eq!((w.state, w.attempts), (WorkItemState::Pending, 1));
    assert_eq!(
        ex.run_once().await.unwrap().called,
        0,
        "not before its backoff"
    );
    f.age_work_items(Duration::from_secs(300)).await;
    assert_eq!(ex.run_once().await.unwrap().failed, 1);
    let w = f.work_item(id).await;
    assert_eq!((w.state, w.attempts), (WorkItemState::Failed, 2));
    assert_eq!(ex.provider().calls_for(&key), 2);
    f.cleanup().await;
}

/// A store outage fails the pass, changes nothing and loses nothing; the next pass does the
/// work once.
pub async fn an_executor_waits_out_a_store_outage<F: StoreFixture>() {
    let f = F::new().await;
    let (id, key) = work_item(&f, "ledger").await;
    let store = FaultyStore::new(f.store());
    let ex = executor(store.clone(), CallMode::Succeed);
    store.fail_op("claim work items", 1);
    assert!(ex.run_once().await.is_err());
    assert_eq!(f.work_item(id).await.state, WorkItemState::Pending);
    assert_eq!(ex.provider().calls_for(&key), 0);
    assert_eq!(ex.run_once().await.unwrap().succeeded, 1);
    assert_eq!(ex.provider().calls_for(&key), 1);
    f.cleanup().await;
}

/// Calls of one batch run concurrently and each is recorded as soon as it returns: a slow call
/// does not hold the others' results back.
pub async fn calls_of_a_batch_run_concurrently_and_record_independently<F: StoreFixture>() {
    let f = F::new().await;
    let (slow, slow_key) = work_item(&f, "ledger").await;
    let mut fast = Vec::new();
    for _ in 0..3 {
        fast.push(work_item(&f, "ledger").await.0);
    }
    let ex = Arc::new(executor(f.store(), CallMode::Succeed));
    ex.provider()
        .with(|s| s.slow_keys.insert(slow_key, Duration::from_millis(2000)));
    let task = tokio::spawn({
        let ex = Arc::clone(&ex);
        async move { ex.run_once().await }
    });
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    loop {
        let mut done = 0;
        for id in &fast {
            if f.work_item(*id).await.state == WorkItemState::Succeeded {
                done += 1;
            }
        }
        if done == fast.len() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fast items were not recorded while the slow call was in flight"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(f.work_item(slow).await.state, WorkItemState::InProgress);
    let r = task.await.unwrap().unwrap();
    assert_eq!((r.called, r.succeeded), (4, 4), "{r:?}");
    assert_eq!(f.work_item(slow).await.state, WorkItemState::Succeeded);
    f.cleanup().await;
}

/// `run` settles items by itself and returns once shutdown is asked for.
pub async fn run_processes_items_and_stops_on_shutdown<F: StoreFixture>() {
    let f = F::new().await;
    let ids = [work_item(&f, "a").await.0, work_item(&f, "b").await.0];
    let ex = Arc::new(executor(f.store(), CallMode::Succeed));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&ex).run(shutdown.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for id in ids {
        while f.work_item(id).await.state != WorkItemState::Succeeded {
            assert!(
                std::time::Instant::now() < deadline,
                "run did not settle {id}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("run stops on shutdown")
        .unwrap();
    assert_eq!(ex.provider().with(|s| s.calls.len()), 2);
    f.cleanup().await;
}

// ---------------------------------------------------------------------------------------------
// Maintainer

/// The maintainer deletes, on the elected instance only and in batches, inbox identities older
/// than the retention, old succeeded work items and leases of crashed relays; it refuses a
/// retention inside the replay horizon; leadership moves when the leader's session ends.
pub async fn the_maintainer_cleans_up_on_one_elected_instance<F: StoreFixture>() {
    use outbox_core::maintenance::{
        InboxRetention, Maintainer, MaintenanceConfig, MaintenanceStore, ReplayHorizon,
    };
    let f = F::new().await;
    let store = f.store();
    let day = Duration::from_secs(86_400);
    old_and_young_inbox(&f, day * 3).await;
    let (settled, _) = work_item(&f, "old").await;
    let (open, _) = work_item(&f, "open").await;
    // Settle only the first: the second stays pending (claimed one at a time).
    let one = executor_with(
        f.store(),
        CallMode::Succeed,
        ExecutorConfig {
            batch_size: 1,
            ..executor_config()
        },
    );
    one.run_once().await.unwrap();
    assert_eq!(f.work_item(settled).await.state, WorkItemState::Succeeded);
    assert_eq!(f.work_item(open).await.state, WorkItemState::Pending);
    f.age_work_items(day * 10).await;

    let horizon = ReplayHorizon {
        broker_retention: day,
        outbox_retention: Duration::ZERO,
        dead_letter_requeue_window: day * 2,
    };
    let config = MaintenanceConfig {
        inbox: Some(InboxRetention {
            keep: day * 2,
            horizon,
        }),
        work_items_keep: Some(day * 7),
        published_keep: None,
        lease_reap_after: Some(Duration::from_secs(600)),
        batch_size: 2,
        interval: Duration::from_secs(60),
    };
    let unsafe_config = MaintenanceConfig {
        inbox: Some(InboxRetention {
            keep: Duration::from_secs(3600),
            horizon,
        }),
        ..config.clone()
    };
    let err = Maintainer::new(store.clone(), unsafe_config).expect_err("refused");
    assert_eq!(err.key, "inbox.keep");
    assert!(err.to_string().contains("172800"), "{err}");

    let a = Maintainer::new(store.clone(), config.clone()).unwrap();
    let b = Maintainer::new(store.clone(), config).unwrap();
    let mut sa = store.maintenance_session().await.unwrap();
    let mut sb = store.maintenance_session().await.unwrap();
    let r = a.round(&mut sa).await.unwrap().expect("a is elected");
    assert_eq!((r.inbox, r.work_items), (5, 1), "{r:?}");
    assert_eq!(
        b.round(&mut sb).await.unwrap(),
        None,
        "b is not the maintainer"
    );
    assert_eq!(f.inbox_len().await, 1);
    let left: Vec<i64> = f.work_items().await.iter().map(|w| w.id).collect();
    assert_eq!(left, vec![open]);
    drop(sa);
    let mut elected = None;
    for _ in 0..50 {
        elected = b.round(&mut sb).await.unwrap();
        if elected.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        elected.map(|r| r.total()),
        Some(0),
        "b took over; nothing left to delete"
    );
    f.cleanup().await;
}

/// Expands to one `#[tokio::test]` per case of the engine suites for the [`StoreFixture`]
/// `$fixture`.
#[macro_export]
macro_rules! engine_suite {
    ($fixture:ty) => {
        $crate::__fixture_cases!(engines, $fixture;
            redeliveries_have_one_effect,
            a_paused_consumer_takes_nothing_until_resumed,
            transient_errors_are_retried_without_a_second_effect,
            exhausted_retries_dead_letter_and_a_requeue_applies_once,
            a_permanent_error_is_dead_lettered_at_once,
            a_malformed_message_is_dead_lettered_and_does_not_block,
            a_conflict_is_recorded_not_applied,
            a_batch_failure_rolls_back_only_its_own_writes,
            a_batch_handler_gets_the_new_events_at_once_and_a_failure_is_redone_one_by_one,
            a_panicking_batch_handler_on_a_mixed_batch_is_redone_one_by_one,
            run_acks_beside_the_next_batch_and_settles_everything_before_it_returns,
            the_ordering_guard_holds_a_gap_until_the_missing_version,
            two_consumers_get_one_effect_each,
            a_store_outage_loses_nothing_and_acks_only_after_commit,
            run_releases_the_source_after_an_error,
            a_stuck_consumer_says_why,
            a_delivery_the_database_refuses_is_dead_lettered_at_once,
            other_database_errors_are_retried_then_dead_lettered,
            an_outage_is_never_dead_lettered,
            the_attempt_cap_holds_without_a_broker_count,
            a_refused_dead_letter_is_kept_with_the_raw_message_alone,
            a_hostile_message_is_dead_lettered_byte_for_byte,
            a_requeued_letter_the_database_refuses_does_not_block_the_others,
            a_requeued_letter_survives_a_deadlock,
            work_items_are_written_with_the_inbox_transaction,
            a_call_succeeds_once_with_its_key,
            a_failed_call_is_terminal,
            an_unknown_outcome_is_reconciled_without_a_second_call,
            not_found_resends_with_the_same_key_or_parks,
            an_expired_lease_goes_unknown_and_the_stale_record_is_refused,
            not_sent_is_retried_then_failed_at_the_limit,
            an_executor_waits_out_a_store_outage,
            calls_of_a_batch_run_concurrently_and_record_independently,
            run_processes_items_and_stops_on_shutdown,
            the_maintainer_cleans_up_on_one_elected_instance,
        );
    };
}
