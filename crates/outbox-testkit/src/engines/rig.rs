//! What the engine cases run on: the test handler (effects, work items, scripted failures),
//! the batch handler, and the rig (a fixture, its store with injected faults, a fake source).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::consumer::{
    Consumer, ConsumerConfig, ConsumerReport, Handler, HandlerError, InboxStore, RawMessage,
};
use outbox_core::effect::NewWorkItem;
use outbox_core::{Backoff, IncomingEvent, OutboxMessage};
use uuid::Uuid;

use crate::fakes::{FakeSource, FaultyStore, event_message};
use crate::fixture::StoreFixture;
use crate::support::take_requeued;

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
pub(super) fn one_per_aggregate(n: usize, version: i64) -> Vec<OutboxMessage> {
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

pub(super) struct Rig<F: StoreFixture> {
    pub(super) fixture: Arc<F>,
    /// The fixture's store, healthy until a case injects faults.
    pub(super) faults: FaultyStore<F::Store>,
    pub(super) source: FakeSource,
    pub(super) handler: Arc<TestHandler<F>>,
}

/// The handler shared between the rig and the consumer.
pub(super) struct Shared<F>(Arc<TestHandler<F>>);

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
pub(super) fn consumer_of<F: StoreFixture, S: InboxStore<Conn = <F::Store as InboxStore>::Conn>>(
    store: S,
    source: &FakeSource,
    handler: &Arc<TestHandler<F>>,
    config: ConsumerConfig,
) -> Consumer<S, FakeSource, Shared<F>> {
    Consumer::new(store, source.clone(), Shared(Arc::clone(handler)), config)
        .expect("valid consumer config")
}

/// [`fast_config`] of consumer `c` with `batch_size`.
pub(super) fn batched(batch_size: usize) -> ConsumerConfig {
    ConsumerConfig {
        batch_size,
        ..fast_config("c")
    }
}

/// [`fast_config`] of consumer `c` with `max_attempts`.
pub(super) fn attempts(max_attempts: u32) -> ConsumerConfig {
    ConsumerConfig {
        max_attempts,
        ..fast_config("c")
    }
}

impl<F: StoreFixture> Rig<F> {
    pub(super) async fn new(consumer: &str) -> Self {
        Self::with_source(consumer, FakeSource::new()).await
    }

    pub(super) async fn with_source(consumer: &str, source: FakeSource) -> Self {
        let fixture = Arc::new(F::new().await);
        Self {
            handler: Arc::new(TestHandler::new(Arc::clone(&fixture), consumer)),
            faults: FaultyStore::new(fixture.store()),
            fixture,
            source,
        }
    }

    /// A consumer over the rig's source, on the store with the rig's injected faults.
    pub(super) fn consumer(
        &self,
        config: ConsumerConfig,
    ) -> Consumer<FaultyStore<F::Store>, FakeSource, Shared<F>> {
        consumer_of(self.faults.clone(), &self.source, &self.handler, config)
    }

    /// Runs a [`Rig::consumer`] of `config` until the source is drained ([`drain`]).
    pub(super) async fn drain(&self, config: ConsumerConfig) -> (ConsumerReport, usize) {
        drain(&mut self.consumer(config), &self.source).await
    }

    /// A batch consumer (`batch_size` 10) over the rig's source whose handler writes through
    /// `handle_many`, recording its calls in `calls`; it panics on its first call if
    /// `panic_first`.
    pub(super) fn batch_consumer(
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

    pub(super) async fn effects(&self, event_id: Uuid) -> u64 {
        self.fixture.effect_count(&self.handler.key(event_id)).await
    }

    /// Pushes each of `messages` to the rig's source, in order.
    pub(super) fn push(&self, messages: &[OutboxMessage]) {
        for m in messages {
            self.source.push_message(m);
        }
    }

    /// Waits (20 s at most, else fails with `what`) until each of `messages` has its effect.
    pub(super) async fn wait_applied(&self, messages: &[OutboxMessage], what: &str) {
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
    pub(super) async fn requeued_raw(&self) -> Vec<RawMessage> {
        self.fixture.requeue_consumer_dead_letters("c").await;
        let letters = take_requeued(&self.fixture.store(), "c", 100).await;
        letters.into_iter().map(|l| l.raw).collect()
    }
}

/// A handler that writes a batch's effects in one `handle_many` call and records each call's
/// events; `handle` (the redo path) is the test handler's.
pub(super) struct BatchHandler<F> {
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
