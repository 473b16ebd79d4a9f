//! The remote-effect executor over a store: work items written with the inbox transaction,
//! calls made once with their key, unknown outcomes reconciled, expired leases fenced, retries,
//! outages, concurrency and shutdown.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::Backoff;
use outbox_core::effect::{
    Executor, ExecutorConfig, LEASE_EXPIRED_REASON, NewWorkItem, PARKED_REASON, WorkItemState,
    WorkItemStore,
};
use uuid::Uuid;

use super::rig::*;
use crate::fakes::{CallMode, FakeProvider, FaultyStore, event_message};
use crate::fixture::StoreFixture;
use crate::support::enqueue_work_item;

/// The executor's config for tests: fast polls and backoffs, short timeouts.
pub(super) fn executor_config() -> ExecutorConfig {
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
pub(super) fn executor_with<S: WorkItemStore>(
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
pub(super) async fn work_item<F: StoreFixture>(f: &F, consumer: &str) -> (i64, String) {
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
    // The call is held by a gate until its lease has expired and the item was swept.
    let held = ExecutorConfig {
        call_timeout: Duration::from_secs(60),
        lease: Duration::from_secs(600),
        ..executor_config()
    };
    let slow = Arc::new(executor_with(f.store(), CallMode::Succeed, held));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    slow.provider()
        .with(|s| s.gates.insert(key.clone(), Arc::clone(&gate)));
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
    // Not a measure of speed: how long a stuck executor may take before the case fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while f.work_item(id).await.state != WorkItemState::InProgress {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow executor did not claim the item"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f.expire_work_item_leases().await;
    assert_eq!(sweeper.run_once().await.unwrap().expired, 1);
    gate.add_permits(1);
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
    // The slow call is held by a gate until the fast ones are recorded, far within its timeout.
    let config = ExecutorConfig {
        call_timeout: Duration::from_secs(60),
        lease: Duration::from_secs(600),
        ..executor_config()
    };
    let ex = Arc::new(executor_with(f.store(), CallMode::Succeed, config));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    ex.provider()
        .with(|s| s.gates.insert(slow_key, Arc::clone(&gate)));
    let task = tokio::spawn({
        let ex = Arc::clone(&ex);
        async move { ex.run_once().await }
    });
    // Not a measure of speed: how long a stuck executor may take before the case fails.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
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
    gate.add_permits(1);
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
