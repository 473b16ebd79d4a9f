//! The publish engine's logic against named in-memory fakes (the store and broker of
//! `outbox-testkit`): ordering per aggregate, parking on failure, dead letters, the lease
//! deadline, fencing, store outages, and the feed seam. The real stores and brokers are
//! checked by their conformance suites.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::relay::{
    Feed, FeedBatch, PollingFeed, Relay, RelayConfig, SettleReport, Settlement,
};
use outbox_core::{
    Backoff, ClaimParams, MarkParams, NewMessage, OutboxStore, Payload, PublishErrorKind,
    StoreError,
};
use outbox_testkit::fakes::{FakeTransport, FaultyStore};
use outbox_testkit::memory::MemoryStore;

fn msg(agg: &str, v: i64) -> NewMessage {
    NewMessage::new(
        "t",
        agg,
        v,
        "E",
        Payload::json(&serde_json::json!({"v": v})).unwrap(),
    )
}

fn store_with(events: &[(&str, i64)]) -> MemoryStore {
    let s = MemoryStore::new();
    let messages: Vec<NewMessage> = events.iter().map(|(a, v)| msg(a, *v)).collect();
    s.enqueue(&messages).unwrap();
    s
}

/// A claim of up to `rows` rows (all of one aggregate if need be) for `lease`, any aggregate.
fn claim(rows: usize, lease: Duration) -> ClaimParams {
    ClaimParams {
        max_rows: rows,
        max_per_aggregate: rows,
        lease,
        scope: Default::default(),
    }
}

fn fast_config() -> RelayConfig {
    RelayConfig {
        backoff: Backoff {
            base: Duration::from_millis(1),
            max: Duration::from_millis(2),
        },
        ..RelayConfig::default()
    }
}

fn relay<S: OutboxStore>(
    store: S,
    transport: FakeTransport,
    config: RelayConfig,
) -> Relay<PollingFeed<S>, FakeTransport> {
    Relay::new(Arc::new(store), Arc::new(transport), config).unwrap()
}

#[tokio::test]
async fn a_failure_parks_its_aggregate_and_the_others_flow() {
    let r = relay(
        store_with(&[("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]),
        FakeTransport::new().fail("a", 2, PublishErrorKind::Unavailable, 1),
        fast_config(),
    );
    let o = r.run_batch().await.unwrap();
    assert_eq!(
        (
            o.claimed,
            o.published,
            o.retried,
            o.released,
            o.dead_lettered
        ),
        (5, 3, 1, 1, 0)
    );
    assert_eq!(
        r.transport().acked_for("a"),
        vec![1],
        "a3 must not overtake a2"
    );
    assert_eq!(r.transport().acked_for("b"), vec![1, 2]);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let o = r.run_batch().await.unwrap();
    assert_eq!(o.published, 2);
    assert_eq!(r.transport().acked_for("a"), vec![1, 2, 3]);
    assert_eq!(r.store().outbox_len(), 0);
}

#[tokio::test]
async fn a_permanent_error_dead_letters_at_once_and_blocks_only_its_key() {
    let r = relay(
        store_with(&[("a", 1), ("a", 2), ("b", 1)]),
        FakeTransport::new().fail("a", 1, PublishErrorKind::TooLarge, u32::MAX),
        fast_config(),
    );
    let o = r.run_batch().await.unwrap();
    assert_eq!((o.published, o.dead_lettered, o.released), (1, 1, 1));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let o = r.run_batch().await.unwrap();
    assert_eq!(o.claimed, 0, "a2 waits behind the dead letter");
    assert_eq!(r.store().stats().await.unwrap().dead, 1);
    assert!(r.transport().acked_for("a").is_empty());
}

#[tokio::test]
async fn retryable_errors_dead_letter_after_max_attempts() {
    let r = relay(
        store_with(&[("a", 1)]),
        FakeTransport::new().fail("a", 1, PublishErrorKind::Unavailable, u32::MAX),
        RelayConfig {
            max_attempts: 3,
            ..fast_config()
        },
    );
    for _ in 0..2 {
        assert_eq!(r.run_batch().await.unwrap().retried, 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(r.run_batch().await.unwrap().dead_lettered, 1);
    // Through the operator contract.
    let dead = outbox_core::operator::DeadLetterOps::dead_letters(
        r.store().as_ref(),
        &outbox_core::operator::DeadLetterFilter::default(),
        10,
    )
    .await
    .unwrap();
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0]
            .last_error
            .as_deref()
            .unwrap()
            .starts_with("attempt 3:"),
        "{:?}",
        dead[0].last_error
    );
}

#[tokio::test]
async fn no_publish_starts_once_the_lease_could_expire() {
    let events: Vec<(&str, i64)> = (1..=20).map(|v| ("a", v)).collect();
    let r = relay(
        store_with(&events),
        FakeTransport::with_delay(Duration::from_millis(20)),
        RelayConfig {
            lease: Duration::from_millis(300),
            publish_timeout: Duration::from_millis(100),
            lease_safety_margin: Duration::from_millis(50),
            ..fast_config()
        },
    );
    let started = Instant::now();
    let o = r.run_batch().await.unwrap();
    assert!(o.published > 0 && o.published < 20, "{o:?}");
    assert_eq!(o.published + o.released, 20);
    // The last publish began before lease - publish_timeout - margin = 150 ms.
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        r.transport().acked_for("a"),
        (1..=o.published as i64).collect::<Vec<_>>()
    );
    let o2 = r.run_batch().await.unwrap();
    assert!(
        o2.published > 0,
        "released rows are claimable again at once"
    );
}

#[tokio::test]
async fn a_mark_after_takeover_changes_nothing() {
    let store = store_with(&[("a", 1)]);
    let stale = store
        .claim_batch(claim(10, Duration::from_secs(30)))
        .await
        .unwrap();
    store.expire_relay_leases();
    let fresh = store
        .claim_batch(claim(10, Duration::from_secs(9)))
        .await
        .unwrap();
    assert_eq!(fresh.messages.len(), 1);
    let ids = [stale.messages[0].id];
    let mark = |token| MarkParams { token, ids: &ids };
    assert_eq!(store.mark_published(mark(stale.token)).await.unwrap(), 0);
    assert_eq!(store.mark_published(mark(fresh.token)).await.unwrap(), 1);
}

/// A store outage while settling leaves the acknowledged rows unmarked: after the lease they
/// are published again with the same event id, and nothing is lost.
#[tokio::test]
async fn a_settle_outage_republishes_with_the_same_event_id() {
    let store = FaultyStore::new(store_with(&[("a", 1), ("a", 2)]));
    let r = relay(
        store.clone(),
        FakeTransport::new(),
        RelayConfig {
            lease: Duration::from_millis(300),
            publish_timeout: Duration::from_millis(100),
            lease_safety_margin: Duration::from_millis(50),
            ..fast_config()
        },
    );
    store.fail_op("mark", 1);
    assert!(r.run_batch().await.is_err(), "the outage is reported");
    assert_eq!(store.inner().outbox_len(), 2, "nothing was marked");
    assert_eq!(
        r.run_batch().await.unwrap().claimed,
        0,
        "the unreleased lease still holds the aggregate"
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    let o = r.run_batch().await.unwrap();
    assert_eq!(o.published, 2);
    let acked = r.transport().acked();
    assert_eq!(acked.len(), 4);
    assert_eq!(
        acked[0].event_id, acked[2].event_id,
        "same id on the republish"
    );
    assert_eq!(acked[1].event_id, acked[3].event_id);
    assert_eq!(r.transport().acked_for("a"), vec![1, 2, 1, 2]);
    assert_eq!(store.inner().outbox_len(), 0);
}

/// A feed that is not the polling one (here: a fixed list, confirmed by id) plugs into the
/// same engine: publishing, ordering and the failure policy come with it.
#[tokio::test]
async fn any_feed_plugs_into_the_publish_engine() {
    struct ListFeed {
        pending: std::sync::Mutex<Vec<outbox_core::OutboxMessage>>,
        settled: std::sync::Mutex<Vec<Settlement>>,
    }
    impl Feed for ListFeed {
        type Ticket = u32;
        async fn next_batch(&self, max_rows: usize) -> Result<FeedBatch<u32>, StoreError> {
            let mut p = self.pending.lock().unwrap();
            let n = max_rows.min(p.len());
            Ok(FeedBatch {
                ticket: 7,
                messages: p.drain(..n).collect(),
                owned_until: None,
                takeovers: Vec::new(),
                undecodable: Vec::new(),
                liveness: None,
            })
        }
        async fn settle(&self, ticket: u32, s: &Settlement) -> Result<SettleReport, StoreError> {
            assert_eq!(ticket, 7);
            self.settled.lock().unwrap().push(s.clone());
            Ok(SettleReport {
                marked: s.published.len(),
                retried: s.failed.len(),
                released: s.not_attempted.len(),
                ..SettleReport::default()
            })
        }
    }
    let source = store_with(&[("x", 1), ("x", 2), ("y", 1)]);
    let batch = source
        .claim_batch(claim(10, Duration::from_secs(30)))
        .await
        .unwrap();
    let feed = Arc::new(ListFeed {
        pending: std::sync::Mutex::new(batch.messages.clone()),
        settled: std::sync::Mutex::default(),
    });
    let r = Relay::with_feed(
        Arc::clone(&feed),
        Arc::new(FakeTransport::new().fail("x", 1, PublishErrorKind::Rejected, 1)),
        fast_config(),
    )
    .unwrap();
    let o = r.run_batch().await.unwrap();
    assert_eq!(
        (o.claimed, o.published, o.retried, o.released),
        (3, 1, 1, 1)
    );
    let settled = feed.settled.lock().unwrap();
    let s = &settled[0];
    let x2 = batch
        .messages
        .iter()
        .find(|m| m.aggregate_version == 2)
        .unwrap();
    assert_eq!(
        s.not_attempted,
        vec![x2.id],
        "x2 is not sent after x1 failed"
    );
    assert!(s.failed[0].retry_after.is_some());
    assert!(s.failed[0].error.starts_with("attempt 1:"));
}

/// A batch tied to a session ([`outbox_core::Liveness`]): once the session is lost, the
/// engine starts no further publish of it; what was acknowledged is settled, the rest given
/// back (another relay owns it now).
#[tokio::test]
async fn a_batch_whose_session_is_lost_starts_no_more_publishes() {
    struct OneBatch {
        batch: std::sync::Mutex<Option<Vec<outbox_core::OutboxMessage>>>,
        liveness: Arc<outbox_core::Liveness>,
        settled: std::sync::Mutex<Vec<Settlement>>,
    }
    impl Feed for OneBatch {
        type Ticket = ();
        async fn next_batch(&self, _max_rows: usize) -> Result<FeedBatch<()>, StoreError> {
            Ok(FeedBatch {
                ticket: (),
                messages: self.batch.lock().unwrap().take().unwrap_or_default(),
                owned_until: None,
                takeovers: Vec::new(),
                undecodable: Vec::new(),
                liveness: Some(Arc::clone(&self.liveness)),
            })
        }
        async fn settle(&self, _: (), s: &Settlement) -> Result<SettleReport, StoreError> {
            self.settled.lock().unwrap().push(s.clone());
            Ok(SettleReport::default())
        }
    }
    let events: Vec<(&str, i64)> = (1..=40).map(|v| ("a", v)).collect();
    let batch = store_with(&events)
        .claim_batch(claim(100, Duration::from_secs(30)))
        .await
        .unwrap();
    let liveness = Arc::new(outbox_core::Liveness::new());
    liveness.confirm(Instant::now() + Duration::from_secs(60));
    let feed = Arc::new(OneBatch {
        batch: std::sync::Mutex::new(Some(batch.messages)),
        liveness: Arc::clone(&liveness),
        settled: std::sync::Mutex::default(),
    });
    let r = Relay::with_feed(
        Arc::clone(&feed),
        Arc::new(FakeTransport::with_delay(Duration::from_millis(10))),
        fast_config(),
    )
    .unwrap();
    let transport = Arc::clone(r.transport());
    let lose = tokio::spawn(async move {
        while transport.acked().len() < 5 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        liveness.lose();
        transport.acked().len()
    });
    let o = r.run_batch().await.unwrap();
    let acked_at_loss = lose.await.unwrap();
    let acked = r.transport().acked().len();
    // At most the publish already in flight when the session was lost ends after it.
    assert!(
        acked <= acked_at_loss + 1,
        "{acked} acknowledged, {acked_at_loss} when the session was lost"
    );
    let s = &feed.settled.lock().unwrap()[0];
    assert_eq!(s.published.len(), acked);
    assert_eq!(s.not_attempted.len(), 40 - acked, "{o:?}");
    assert!(s.failed.is_empty());
}

#[tokio::test]
async fn ordered_pipelining_hands_a_whole_run_over_and_marks_only_the_stored_prefix() {
    let events: Vec<(&str, i64)> = (1..=10)
        .map(|v| ("a", v))
        .chain((1..=3).map(|v| ("b", v)))
        .collect();
    let r = relay(
        store_with(&events),
        FakeTransport::pipelined(100).fail("a", 4, PublishErrorKind::Unavailable, 1),
        fast_config(),
    );
    let o = r.run_batch().await.unwrap();
    // a1..a3 stored, a4 failed (retried), a5..a10 neither stored nor failed: released.
    assert_eq!(
        (o.claimed, o.published, o.retried, o.released),
        (13, 6, 1, 6),
        "{o:?}"
    );
    let mut runs = r.transport().runs();
    runs.sort_unstable();
    assert_eq!(
        runs,
        vec![3, 10],
        "each aggregate's run handed over at once"
    );
    assert_eq!(r.transport().acked_for("a"), vec![1, 2, 3]);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let o = r.run_batch().await.unwrap();
    assert_eq!((o.published, o.retried), (7, 0), "{o:?}");
    assert_eq!(
        r.transport().acked_for("a"),
        (1..=10).collect::<Vec<_>>(),
        "every version once, in order"
    );
    assert_eq!(r.store().stats().await.unwrap().pending, 0);
}

#[tokio::test]
async fn a_pipelined_run_the_transport_takes_in_part_leaves_the_rest_for_the_next_claim() {
    let events: Vec<(&str, i64)> = (1..=7).map(|v| ("a", v)).collect();
    let r = relay(
        store_with(&events),
        FakeTransport::pipelined(3),
        fast_config(),
    );
    let o = r.run_batch().await.unwrap();
    assert_eq!((o.published, o.retried, o.released), (3, 0, 4), "{o:?}");
    let o = r.run_batch().await.unwrap();
    assert_eq!((o.published, o.released), (3, 1), "{o:?}");
    let o = r.run_batch().await.unwrap();
    assert_eq!(o.published, 1, "{o:?}");
    assert_eq!(r.transport().acked_for("a"), (1..=7).collect::<Vec<_>>());
    assert_eq!(r.transport().runs(), vec![3, 3, 1]);
}

#[tokio::test]
async fn a_pipelined_run_is_cut_at_one_publish_timeout_from_its_start() {
    let events: Vec<(&str, i64)> = (1..=5).map(|v| ("a", v)).collect();
    let r = relay(
        store_with(&events),
        FakeTransport::pipelined_with_delay(100, Duration::from_secs(3)),
        RelayConfig {
            publish_timeout: Duration::from_millis(50),
            ..fast_config()
        },
    );
    let started = Instant::now();
    let o = r.run_batch().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // The first version timed out (retried), the rest were not attempted: nothing is marked.
    assert_eq!((o.published, o.retried, o.released), (0, 1, 4), "{o:?}");
}

#[tokio::test]
async fn a_batch_counts_as_in_flight_until_it_is_settled() {
    let r = Arc::new(relay(
        store_with(&[("a", 1), ("a", 2), ("b", 1)]),
        FakeTransport::with_delay(Duration::from_millis(300)),
        fast_config(),
    ));
    let activity = r.activity();
    assert_eq!(activity.in_flight().batches, 0);
    let batch = tokio::spawn({
        let r = Arc::clone(&r);
        async move { r.run_batch().await }
    });
    // While the broker is slow, the relay holds the batch: two aggregates, three rows.
    let deadline = Instant::now() + Duration::from_secs(5);
    while activity.in_flight().batches == 0 {
        assert!(Instant::now() < deadline, "the batch never showed as held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = activity.in_flight();
    assert_eq!((held.aggregates, held.rows), (2, 3));
    assert!(held.oldest_ms.is_some());
    let outcome = batch.await.unwrap().unwrap();
    assert_eq!(outcome.published, 3);
    assert_eq!(activity.in_flight(), Default::default());
}

/// The relay says why it is stuck (`Relay::health`): a publish that keeps failing makes it
/// `failing` with the transport's error, progress ends that; a failed claim is closed by the
/// next claim, a failed settle only by the next settle (a lease still held leaves it open); a
/// dead letter never makes it `failing`; a relay with nothing to do is `idle`.
#[tokio::test]
async fn the_relay_says_why_it_is_stuck() {
    use outbox_core::health::{HealthState, TroubleKind};

    let idle = relay(MemoryStore::new(), FakeTransport::new(), fast_config());
    assert_eq!(idle.run_batch().await.unwrap().claimed, 0);
    let r = idle.health().report();
    assert_eq!(
        (r.state, r.errors, &r.last_error),
        (HealthState::Idle, 0, &None)
    );

    // The broker refuses a2 twice: failing, with its words; then it goes through.
    let store = FaultyStore::new(store_with(&[("a", 1), ("a", 2)]));
    let r = relay(
        store.clone(),
        FakeTransport::new().fail("a", 2, PublishErrorKind::Unavailable, 2),
        fast_config(),
    );
    assert_eq!(r.run_batch().await.unwrap().published, 1);
    let h = r.health().report();
    assert_eq!(h.state, HealthState::Degraded, "a1 went out: {h:?}");
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(r.run_batch().await.unwrap().retried, 1);
    let h = r.health().report();
    assert_eq!(h.state, HealthState::Failing, "{h:?}");
    let e = h.last_error.as_ref().expect("the last error");
    assert_eq!(e.kind, TroubleKind::Publish);
    assert!(
        e.message.starts_with("attempt 2: Unavailable:"),
        "{}",
        e.message
    );
    assert_eq!((h.errors, h.errors_per_minute), (2, 2));
    let progress = h.last_progress_at.expect("a1's progress");
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(r.run_batch().await.unwrap().published, 1);
    let h = r.health().report();
    assert_eq!(h.state, HealthState::Degraded, "{h:?}");
    assert!(h.last_progress_at.unwrap() > progress);
    assert_eq!(h.last_error.unwrap().kind, TroubleKind::Publish, "kept");

    // A failed claim: failing until the next claim succeeds, even an empty one.
    store.fail_op("claim", 1);
    assert!(r.run_batch().await.is_err());
    let h = r.health().report();
    assert_eq!(h.state, HealthState::Failing);
    assert_eq!(h.last_error.unwrap().kind, TroubleKind::Claim);
    assert_eq!(r.run_batch().await.unwrap().claimed, 0);
    assert_eq!(r.health().report().state, HealthState::Degraded);

    // A failed settle (a missing grant): claims that find the lease still held do not close
    // it.
    let store = FaultyStore::new(store_with(&[("b", 1)]));
    let r = relay(store.clone(), FakeTransport::new(), fast_config());
    store.fail_op_with("mark", outbox_core::StoreErrorKind::PermissionDenied, 1);
    assert!(r.run_batch().await.is_err());
    assert_eq!(r.run_batch().await.unwrap().claimed, 0, "the lease holds b");
    let h = r.health().report();
    assert_eq!(h.state, HealthState::Failing, "{h:?}");
    let e = h.last_error.unwrap();
    assert_eq!(e.kind, TroubleKind::Settle);
    assert!(e.message.starts_with("PermissionDenied"), "{}", e.message);
    assert_eq!(h.last_progress_at, None);

    // A dead letter: an error and progress at once.
    let r = relay(
        store_with(&[("c", 1)]),
        FakeTransport::new().fail("c", 1, PublishErrorKind::TooLarge, 1),
        fast_config(),
    );
    assert_eq!(r.run_batch().await.unwrap().dead_lettered, 1);
    let h = r.health().report();
    assert_eq!(h.state, HealthState::Degraded, "{h:?}");
    assert_eq!(h.last_error.unwrap().kind, TroubleKind::DeadLetter);
    assert!(h.last_progress_at.is_some());
}
