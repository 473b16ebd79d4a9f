//! The overview's counts and the routes' counts.

use std::time::Duration;

use outbox_core::OutboxStore;
use outbox_core::consumer::OrderingGuard;
use outbox_core::operator::prelude::*;
use outbox_core::operator::{ConsumerSelection, Counting, MINUTES, OperatorErrorKind};
use uuid::Uuid;

use super::steps::*;
use crate::fixture::StoreFixture;
use crate::store::{claim, incoming};
use crate::support::{record, record_failure, release_all};

/// The overview counts pending (retrying, in flight), dead, open conflicts, open consumer dead
/// letters and work items by state, exactly or up to a bound; a bound below 1 is refused.
pub async fn overview_counts_what_waits_and_what_failed<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    a_fresh_store_counts_nothing(&s).await;
    rows_wait_retry_stay_in_flight_and_die(&f, &s).await;
    conflicts_consumer_dead_letters_and_work_items_wait(&f, &s).await;
    the_overview_counts_exactly(&s).await;
    the_overview_counts_up_to_a_bound(&s).await;
    f.cleanup().await;
}

/// A fresh store is ready and its overview counts nothing.
async fn a_fresh_store_counts_nothing<S: OperatorStore>(s: &S) {
    s.ready().await.expect("a fresh store is ready");
    let empty = s.overview().await.unwrap();
    assert_eq!(
        (
            empty.pending,
            empty.dead_letters,
            empty.inbox_conflicts,
            empty.consumer_dead_letters,
            empty.counted_up_to
        ),
        (0, 0, 0, 0, None)
    );
    assert_eq!(empty.oldest_pending_age_seconds, 0.0);
}

/// Four rows: a's first dies (a's second waits behind it), b's waits out its backoff, and c's
/// is claimed and stays in flight.
async fn rows_wait_retry_stay_in_flight_and_die<F: StoreFixture>(f: &F, s: &F::Store) {
    let (a1, a2, b1, c1) = (
        created("a", 1),
        created("a", 2),
        created("b", 1),
        created("c", 1),
    );
    let (dead_id, retry_id) = (a1.event_id, b1.event_id);
    f.enqueue(vec![a1, a2, b1]).await;
    let batch = s.claim_batch(claim(100, 30_000)).await.unwrap();
    for (event_id, retry_after) in [(dead_id, None), (retry_id, Some(Duration::from_secs(3600)))] {
        let m = batch
            .messages
            .iter()
            .find(|m| m.event_id == event_id)
            .unwrap();
        let error = "broker unavailable";
        assert!(record_failure(s, batch.token, m.id, error, retry_after).await);
    }
    release_all(s, &batch).await;
    // c's row is claimed and stays in flight.
    f.enqueue(vec![c1]).await;
    let held = s.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(pairs(&[("c", 1)]), claimed_pairs(&held.messages));
}

/// One conflict, three consumer dead letters (one requeued, still open; one discarded), and a
/// work item in each of the unknown, failed and pending states.
async fn conflicts_consumer_dead_letters_and_work_items_wait<F: StoreFixture>(f: &F, s: &F::Store) {
    // One conflict: the same event id with two payloads.
    let id = Uuid::now_v7();
    for body in [r#"{"n":1}"#, r#"{"n":2}"#] {
        record(s, "c1", OrderingGuard::Off, &incoming(id, "x", 1, body)).await;
    }
    for n in 0..3 {
        consumer_dead(
            s,
            "ledger",
            Uuid::now_v7(),
            &format!("l{n}"),
            "{}",
            true,
            "boom",
        )
        .await;
    }
    let letters = s
        .consumer_dead_letters(&ConsumerSelection::default(), 10)
        .await
        .unwrap();
    let ids: Vec<i64> = letters.iter().map(|l| l.dead_letter.id).collect();
    let one = |id: i64| ConsumerSelection {
        ids: Some(vec![id]),
        ..ConsumerSelection::default()
    };
    // A requeued letter is still open; a discarded one is not.
    assert_eq!(
        s.requeue_consumer_dead_letters(&one(ids[0]), &actor(), "retry")
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.discard_consumer_dead_letters(&one(ids[1]), &actor(), "obsolete")
            .await
            .unwrap(),
        1
    );

    unknown_item(f, "k-unknown").await;
    failed_item(f, "k-failed").await;
    work_item(f, "k-pending", None).await;
}

/// The exact overview counts everything that waits and everything that failed.
async fn the_overview_counts_exactly<S: OperatorStore>(s: &S) {
    let o = s.overview().await.unwrap();
    assert_eq!(o.counted_up_to, None);
    assert_eq!(
        (
            o.pending,
            o.retrying,
            o.in_flight,
            o.dead_letters,
            o.published_retained
        ),
        (3, 1, 1, 1, 0),
        "{o:?}"
    );
    assert!(o.oldest_pending_age_seconds >= 0.0);
    assert_eq!(
        (o.inbox_conflicts, o.consumer_dead_letters),
        (1, 2),
        "{o:?}"
    );
    let w = &o.work_items;
    assert_eq!(
        (w.pending, w.in_progress, w.unknown, w.failed),
        (1, 0, 1, 1),
        "{w:?}"
    );
    assert!(w.oldest_unknown_age_seconds >= 0.0);
}

/// Counted up to a bound, each count stops there; a bound below 1 is refused.
async fn the_overview_counts_up_to_a_bound<S: OperatorStore>(s: &S) {
    let bounded = s.overview_counting(Counting::UpTo(1)).await.unwrap();
    assert_eq!(bounded.counted_up_to, Some(1));
    assert_eq!(
        (
            bounded.pending,
            bounded.retrying,
            bounded.in_flight,
            bounded.dead_letters
        ),
        (1, 1, 1, 1),
        "each count stops at the bound"
    );
    assert_eq!((bounded.inbox_conflicts, bounded.work_items.failed), (1, 1));
    for bound in [0, -5] {
        assert_eq!(
            kind(s.overview_counting(Counting::UpTo(bound)).await),
            OperatorErrorKind::InvalidRequest
        );
    }
}

/// Routes count pending rows (and the oldest one's age) and dead letters per route among the
/// oldest `bound` rows, busiest first, with a per-minute series; a bound below 1 is refused; a
/// fresh store runs no process.
pub async fn routes_count_pending_and_dead_rows_per_route<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    assert!(s.instances().await.unwrap().is_empty());
    let empty = s.routes(10).await.unwrap();
    assert!(empty.routes.is_empty() && empty.complete);
    let d1 = event("order", "d", 1, "OrderPlaced");
    let dead = d1.event_id;
    f.enqueue(vec![d1]).await;
    kill(&f, &[(dead, "refused")]).await;
    f.enqueue(vec![
        created("p", 1),
        created("q", 1),
        created("l", 1).with_destination("ledger"),
    ])
    .await;

    let routes = s.routes(100).await.unwrap();
    assert!(routes.complete);
    assert_eq!(routes.counted_up_to, 100);
    let got: Vec<(Option<&str>, Option<&str>, i64, i64)> = routes
        .routes
        .iter()
        .map(|r| {
            (
                r.destination.as_deref(),
                r.aggregate_type.as_deref(),
                r.pending,
                r.dead_letters,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (None, Some("payment"), 2, 0),
            (Some("ledger"), None, 1, 0),
            (None, Some("order"), 0, 1),
        ],
        "busiest first"
    );
    assert!(
        routes
            .routes
            .iter()
            .all(|r| r.published_per_minute.len() == MINUTES)
    );
    assert!(routes.routes[0].oldest_pending_age_seconds >= 0.0);
    assert_eq!(routes.routes[2].oldest_pending_age_seconds, 0.0);

    let bounded = s.routes(1).await.unwrap();
    assert!(!bounded.complete, "more rows than the bound");
    assert_eq!(bounded.counted_up_to, 1);
    assert_eq!(bounded.routes.iter().map(|r| r.pending).sum::<i64>(), 1);
    assert_eq!(
        bounded.routes.iter().map(|r| r.dead_letters).sum::<i64>(),
        1
    );
    f.cleanup().await;
}
