//! The feed conformance suite: one case per promise of the relay's [`Feed`] contract
//! (`outbox_core::relay::feed`), generic over a [`FeedFixture`], so that the polling feed over
//! any store and a log feed (PostgreSQL's CDC feed) are held to the same rules:
//!
//! ```ignore
//! outbox_testkit::feed_suite!(MyFeedFixture);
//! ```
//!
//! The cases drive the feed as the publish engine does (a batch, then exactly one settlement
//! with every row in one list) without a broker. A feed may hand events out in several batches
//! and at its own pace (a log feed streams them), so every case reads until what it waits for
//! has come, within a deadline, and never depends on how the events were split into batches.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::operator::prelude::*;
use outbox_core::operator::{Actor, DeadLetterSelection, PauseTarget};
use outbox_core::relay::{FailedRow, Feed, FeedBatch, PollingFeed, Settlement};
use outbox_core::{EventId, NewMessage, OutboxMessage, OutboxStore as _};

use crate::fixture::{HeldProducer, StoreFixture};
use crate::store::msg;

/// How long a case waits for what it expects a feed to hand out.
const DEADLINE: Duration = Duration::from_secs(20);

/// How long a case watches a feed to see that it does *not* hand something out.
const QUIET: Duration = Duration::from_millis(700);

/// A feed under test and what the cases need around it. Every method panics on an unexpected
/// error (it is test set-up).
pub trait FeedFixture: Send + Sync + Sized + 'static {
    /// The feed under test.
    type Feed: Feed;

    /// A fixture with an empty outbox of its own.
    fn new() -> impl Future<Output = Self> + Send;

    /// The feed (the same one at every call: a log feed follows one stream).
    fn feed(&self) -> Arc<Self::Feed>;

    /// Writes `messages` as one committed producer transaction.
    fn enqueue(&self, messages: Vec<NewMessage>) -> impl Future<Output = ()> + Send;

    /// Writes `messages` in a producer transaction that stays open until the handle commits.
    fn enqueue_held(
        &self,
        messages: Vec<NewMessage>,
    ) -> impl Future<Output = Box<dyn HeldProducer>> + Send;

    /// Outbox rows not published yet (pending or dead).
    fn unpublished(&self) -> impl Future<Output = usize> + Send;

    /// The store's operator contract: the cases requeue dead letters and pause routes through
    /// it, as an operator does.
    type Operator: OperatorStore;

    /// The operator contract of the store the feed reads.
    fn operator(&self) -> Self::Operator;

    /// Removes what the fixture created.
    fn cleanup(&self) -> impl Future<Output = ()> + Send;
}

/// The polling feed over any store's [`StoreFixture`]: how a store runs this suite on its
/// polling feed (`feed_suite!(PollingFixture<MyStoreFixture>)`), 100 rows of an aggregate a
/// batch under a 30 s lease.
pub struct PollingFixture<F: StoreFixture> {
    store: F,
    feed: Arc<PollingFeed<F::Store>>,
}

impl<F: StoreFixture> FeedFixture for PollingFixture<F> {
    type Feed = PollingFeed<F::Store>;
    type Operator = F::Store;

    async fn new() -> Self {
        let store = F::new().await;
        let feed = Arc::new(PollingFeed::new(
            Arc::new(store.store()),
            100,
            Duration::from_secs(30),
        ));
        Self { store, feed }
    }

    fn feed(&self) -> Arc<Self::Feed> {
        Arc::clone(&self.feed)
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) {
        self.store.enqueue(messages).await;
    }

    async fn enqueue_held(&self, messages: Vec<NewMessage>) -> Box<dyn HeldProducer> {
        self.store.enqueue_held(messages).await
    }

    async fn unpublished(&self) -> usize {
        let s = self.store.store().stats().await.expect("stats");
        usize::try_from(s.pending + s.dead).expect("counts")
    }

    fn operator(&self) -> F::Store {
        self.store.store()
    }

    async fn cleanup(&self) {
        self.store.cleanup().await;
    }
}

/// The suite's operator.
fn actor() -> Actor {
    Actor::new("suite", "test").expect("actor")
}

/// An operator's requeue of every dead letter. Returns how many.
async fn requeue_all<F: FeedFixture>(f: &F) -> u64 {
    f.operator()
        .requeue_dead_letters(&DeadLetterSelection::All, &actor(), "feed suite")
        .await
        .expect("requeue")
}

/// An operator's pause of the route `route` (a route key: `destination:<name>` or
/// `type:<aggregate type>`), or its resume when `paused` is false.
async fn set_route_paused<F: FeedFixture>(f: &F, route: &str, paused: bool) {
    let target = PauseTarget::Route(route.to_owned());
    let store = f.operator();
    if paused {
        store
            .pause(&target, &actor(), "feed suite")
            .await
            .expect("pause");
    } else {
        store
            .resume(&target, &actor(), "feed suite")
            .await
            .expect("resume");
    }
}

/// What a case decides for each event of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Publish,
    Retry(Duration),
    Dead,
    Skip,
}

/// The settlement of `batch` with `decide`'s outcome for each event; the rows of an aggregate
/// after its first failure are not attempted, as the engine does.
fn settlement<T>(batch: &FeedBatch<T>, decide: &dyn Fn(&OutboxMessage) -> Outcome) -> Settlement {
    let mut s = Settlement::default();
    let mut failed_aggregates: Vec<(String, String)> = Vec::new();
    for m in &batch.messages {
        let aggregate = (m.aggregate_type.clone(), m.aggregate_id.clone());
        if failed_aggregates.contains(&aggregate) {
            s.not_attempted.push(m.id);
            continue;
        }
        match decide(m) {
            Outcome::Publish => s.published.push(m.id),
            Outcome::Skip => s.not_attempted.push(m.id),
            Outcome::Retry(after) => {
                failed_aggregates.push(aggregate);
                s.failed.push(FailedRow {
                    id: m.id,
                    error: "suite: broker down".into(),
                    retry_after: Some(after),
                });
            }
            Outcome::Dead => {
                failed_aggregates.push(aggregate);
                s.failed.push(FailedRow {
                    id: m.id,
                    error: "suite: refused for good".into(),
                    retry_after: None,
                });
            }
        }
    }
    s
}

/// One batch read and settled with `decide`; returns its events with the time it came.
async fn step<F: Feed>(
    feed: &F,
    decide: &dyn Fn(&OutboxMessage) -> Outcome,
) -> Vec<(OutboxMessage, Instant)> {
    let batch = feed.next_batch(100).await.expect("next batch");
    let at = Instant::now();
    if batch.messages.is_empty() {
        feed.wait_for_work(Duration::from_millis(20)).await;
        return Vec::new();
    }
    let s = settlement(&batch, decide);
    let out = batch.messages.iter().map(|m| (m.clone(), at)).collect();
    feed.settle(batch.ticket, &s).await.expect("settle");
    out
}

/// Reads and settles batches (publishing everything `decide` does not decide otherwise) until
/// `done` holds of the events published so far, or fails the case at the deadline.
async fn read_until<F: Feed>(
    feed: &F,
    decide: &dyn Fn(&OutboxMessage) -> Outcome,
    done: impl Fn(&[(OutboxMessage, Instant)]) -> bool,
    what: &str,
) -> Vec<(OutboxMessage, Instant)> {
    let deadline = Instant::now() + DEADLINE;
    let mut seen = Vec::new();
    while !done(&seen) {
        assert!(
            Instant::now() < deadline,
            "{what}: not within {DEADLINE:?}; handed out so far: {:?}",
            names(&seen)
        );
        seen.extend(step(feed, decide).await);
    }
    seen
}

/// Reads and settles batches (publishing everything) for [`QUIET`]; returns what came.
async fn read_for<F: Feed>(feed: &F) -> Vec<(OutboxMessage, Instant)> {
    let until = Instant::now() + QUIET;
    let mut seen = Vec::new();
    while Instant::now() < until {
        seen.extend(step(feed, &|_| Outcome::Publish).await);
    }
    seen
}

fn names(seen: &[(OutboxMessage, Instant)]) -> Vec<String> {
    seen.iter()
        .map(|(m, _)| format!("{}/{}", m.aggregate_id, m.aggregate_version))
        .collect()
}

/// The versions of `aggregate` among `seen`, in the order they were handed out.
fn versions(seen: &[(OutboxMessage, Instant)], aggregate: &str) -> Vec<i64> {
    seen.iter()
        .filter(|(m, _)| m.aggregate_id == aggregate)
        .map(|(m, _)| m.aggregate_version)
        .collect()
}

/// Version 2 of `aggregate` was handed out only in a batch with its version 1 (after which the
/// case's settlement leaves it unattempted): never alone while version 1 waits.
fn assert_later_only_with_head(seen: &[(OutboxMessage, Instant)], aggregate: &str) {
    for (m, at) in seen {
        if m.aggregate_id == aggregate && m.aggregate_version == 2 {
            assert!(
                seen.iter().any(|(h, t)| h.aggregate_id == aggregate
                    && h.aggregate_version == 1
                    && t == at),
                "{aggregate}/2 handed out without {aggregate}/1 ahead of it: {:?}",
                names(seen)
            );
        }
    }
}

/// Whether every version `1..=n` of each of `aggregates` was handed out.
fn has_all(seen: &[(OutboxMessage, Instant)], aggregates: &[&str], n: i64) -> bool {
    aggregates.iter().all(|a| {
        let v = versions(seen, a);
        (1..=n).all(|i| v.contains(&i))
    })
}

/// Every committed event is handed out, each aggregate's in version order, and once it was
/// confirmed as sent it is never handed out again.
pub async fn every_committed_event_comes_once_in_version_order<F: FeedFixture>() {
    let f = F::new().await;
    let feed = f.feed();
    let aggregates = ["a", "b", "c", "d", "e"];
    for v in 1..=4 {
        f.enqueue(aggregates.iter().map(|a| msg(a, v)).collect())
            .await;
    }
    let seen = read_until(
        &*feed,
        &|_| Outcome::Publish,
        |s| has_all(s, &aggregates, 4),
        "20 events",
    )
    .await;
    let later = read_for(&*feed).await;
    for a in aggregates {
        assert_eq!(versions(&seen, a), vec![1, 2, 3, 4], "{a}");
    }
    assert!(later.is_empty(), "handed out again: {:?}", names(&later));
    let mut ids: HashMap<EventId, usize> = HashMap::new();
    for (m, _) in &seen {
        *ids.entry(m.event_id).or_default() += 1;
    }
    assert!(ids.values().all(|n| *n == 1), "an event came twice");
    assert_eq!(f.unpublished().await, 0);
    f.cleanup().await;
}

/// A failed event comes back after its delay, not before, under its own event id, ahead of its
/// aggregate's later events, which wait for it; other aggregates are not held.
pub async fn a_retried_event_holds_its_aggregate_and_comes_back_first<F: FeedFixture>() {
    let f = F::new().await;
    let feed = f.feed();
    f.enqueue(vec![msg("a", 1), msg("b", 1)]).await;
    f.enqueue(vec![msg("a", 2), msg("b", 2)]).await;
    let delay = Duration::from_millis(400);
    let failed_at = Instant::now();
    let first = read_until(
        &*feed,
        &|m| match (m.aggregate_id.as_str(), m.aggregate_version) {
            ("a", 1) => Outcome::Retry(delay),
            _ => Outcome::Publish,
        },
        |s| versions(s, "a").contains(&1) && versions(s, "b") == vec![1, 2],
        "a/1 (failing) and b",
    )
    .await;
    let a1 = first
        .iter()
        .find(|(m, _)| m.aggregate_id == "a")
        .map(|(m, _)| m.event_id)
        .expect("a/1");
    assert_later_only_with_head(&first, "a");
    let again = read_until(
        &*feed,
        &|_| Outcome::Publish,
        |s| versions(s, "a").contains(&2),
        "a after its retry",
    )
    .await;
    assert_eq!(versions(&again, "a"), vec![1, 2], "a/1 first, then a/2");
    let (back, at) = again
        .iter()
        .find(|(m, _)| m.aggregate_id == "a")
        .expect("a/1 again");
    assert_eq!(back.event_id, a1, "the same event id");
    assert!(
        *at >= failed_at + delay - Duration::from_millis(50),
        "a/1 came back {:?} after its failure, before its delay of {delay:?}",
        at.duration_since(failed_at)
    );
    assert!(
        versions(&again, "b").is_empty(),
        "b was not handed out again"
    );
    f.cleanup().await;
}

/// A dead letter holds its aggregate (its later events wait) and nothing else, until an
/// operator requeues it; then it comes back under its own event id, ahead of the rest.
pub async fn a_dead_letter_holds_only_its_aggregate_until_requeued<F: FeedFixture>() {
    let f = F::new().await;
    let feed = f.feed();
    f.enqueue(vec![msg("a", 1), msg("b", 1)]).await;
    f.enqueue(vec![msg("a", 2), msg("b", 2)]).await;
    let first = read_until(
        &*feed,
        &|m| match (m.aggregate_id.as_str(), m.aggregate_version) {
            ("a", 1) => Outcome::Dead,
            _ => Outcome::Publish,
        },
        |s| versions(s, "a").contains(&1) && versions(s, "b") == vec![1, 2],
        "a/1 (dead) and b",
    )
    .await;
    let dead_id = first
        .iter()
        .find(|(m, _)| m.aggregate_id == "a")
        .map(|(m, _)| m.event_id)
        .expect("a/1");
    assert_later_only_with_head(&first, "a");
    let held = read_for(&*feed).await;
    assert!(
        versions(&held, "a").is_empty(),
        "a waits behind its dead letter: {:?}",
        names(&held)
    );
    assert_eq!(f.unpublished().await, 2, "a/1 dead, a/2 pending");
    assert_eq!(requeue_all(&f).await, 1);
    let after = read_until(
        &*feed,
        &|_| Outcome::Publish,
        |s| versions(s, "a").contains(&2),
        "a after the requeue",
    )
    .await;
    assert_eq!(versions(&after, "a"), vec![1, 2]);
    assert_eq!(after[0].0.event_id, dead_id, "the same event id");
    assert_eq!(f.unpublished().await, 0);
    f.cleanup().await;
}

/// Events handed out and not attempted (the engine ran out of time, or stopped) come back,
/// under their own event ids, in order.
pub async fn events_not_attempted_come_back_with_their_event_ids<F: FeedFixture>() {
    let f = F::new().await;
    let feed = f.feed();
    f.enqueue(vec![msg("a", 1), msg("a", 2)]).await;
    let skipped = read_until(
        &*feed,
        &|_| Outcome::Skip,
        |s| versions(s, "a").contains(&2),
        "a, not attempted",
    )
    .await;
    let ids: Vec<EventId> = skipped.iter().map(|(m, _)| m.event_id).collect();
    let again = read_until(
        &*feed,
        &|_| Outcome::Publish,
        |s| versions(s, "a").contains(&2),
        "a again",
    )
    .await;
    assert_eq!(versions(&again, "a"), vec![1, 2]);
    assert_eq!(
        again.iter().map(|(m, _)| m.event_id).collect::<Vec<_>>(),
        ids,
        "the same event ids"
    );
    assert_eq!(f.unpublished().await, 0);
    f.cleanup().await;
}

/// An event whose transaction commits after later ones (a lower id, a later commit) is handed
/// out once it is committed: never lost behind the events that overtook it.
pub async fn a_late_commit_is_handed_out_after_the_events_that_overtook_it<F: FeedFixture>() {
    let f = F::new().await;
    let feed = f.feed();
    let held = f.enqueue_held(vec![msg("late", 1)]).await;
    f.enqueue(vec![msg("early", 1)]).await;
    let first = read_until(
        &*feed,
        &|_| Outcome::Publish,
        |s| versions(s, "early") == vec![1],
        "the event committed first",
    )
    .await;
    assert!(versions(&first, "late").is_empty(), "not committed yet");
    held.commit().await;
    read_until(
        &*feed,
        &|_| Outcome::Publish,
        |s| versions(s, "late") == vec![1],
        "the late commit",
    )
    .await;
    assert_eq!(f.unpublished().await, 0);
    f.cleanup().await;
}

/// A route paused before the feed's first batch holds every aggregate whose next event goes
/// there, its later events too whatever their route, and nothing else; the resume hands them
/// out in order, each once.
pub async fn a_paused_route_holds_its_aggregates_until_resumed<F: FeedFixture>() {
    let f = F::new().await;
    let feed = f.feed();
    set_route_paused(&f, "destination:held", true).await;
    let held = |agg: &str, v: i64| {
        let mut m = msg(agg, v);
        m.destination = Some("held".into());
        m
    };
    f.enqueue(vec![msg("a", 1), msg("b", 1), held("c", 1)])
        .await;
    f.enqueue(vec![held("a", 2), msg("b", 2), msg("c", 2)])
        .await;
    f.enqueue(vec![msg("a", 3)]).await;
    let first = read_until(
        &*feed,
        &|_| Outcome::Publish,
        |s| versions(s, "a").contains(&1) && versions(s, "b") == vec![1, 2],
        "a/1 and b, whose routes are not paused",
    )
    .await;
    let quiet = read_for(&*feed).await;
    let seen: Vec<_> = first.iter().chain(&quiet).cloned().collect();
    assert_eq!(
        versions(&seen, "a"),
        vec![1],
        "a/2 goes to the paused route: a waits"
    );
    assert!(
        versions(&seen, "c").is_empty(),
        "c/1 goes to the paused route, c/2 waits behind it: {:?}",
        names(&seen)
    );
    assert_eq!(f.unpublished().await, 4, "a/2, a/3, c/1 and c/2 pending");
    set_route_paused(&f, "destination:held", false).await;
    let after = read_until(
        &*feed,
        &|_| Outcome::Publish,
        |s| has_all(s, &["c"], 2) && versions(s, "a").contains(&3),
        "a and c after the resume",
    )
    .await;
    assert_eq!(versions(&after, "a"), vec![2, 3]);
    assert_eq!(versions(&after, "c"), vec![1, 2]);
    assert!(
        versions(&after, "b").is_empty(),
        "b was not handed out again"
    );
    assert_eq!(f.unpublished().await, 0);
    f.cleanup().await;
}

/// Expands to one `#[tokio::test]` per case of the feed suite for `$fixture`.
#[macro_export]
macro_rules! feed_suite {
    ($fixture:ty) => {
        $crate::feed_suite!(@cases $fixture;
            every_committed_event_comes_once_in_version_order,
            a_retried_event_holds_its_aggregate_and_comes_back_first,
            a_dead_letter_holds_only_its_aggregate_until_requeued,
            events_not_attempted_come_back_with_their_event_ids,
            a_late_commit_is_handed_out_after_the_events_that_overtook_it,
            a_paused_route_holds_its_aggregates_until_resumed,
        );
    };
    (@cases $fixture:ty; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::feed::$case::<$fixture>().await;
            }
        )*
    };
}
