//! What claims hand out of the rows: dead letters and backoff park only their aggregate, a
//! late commit is claimed after later ones, a claimed row is what the producer wrote.

use std::time::Duration;

use outbox_core::OutboxStore;
use outbox_core::operator::{Actor, DeadLetterFilter, DeadLetterOps as _, DeadLetterSelection};

use super::claims::versions;
use super::{claim, msg};
use crate::fixture::StoreFixture;
use crate::support::{batch_ids, publish_all, record_failure, release, row_id};

/// A dead letter parks only its own aggregate (and says what waits behind it); a requeue
/// brings it back first, in order; a row in backoff is not claimable before its time.
pub async fn dead_letters_and_backoff_park_only_their_aggregate<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    f.enqueue(vec![msg("a", 1), msg("a", 2), msg("b", 1)]).await;
    let b = store.claim_batch(claim(10, 30_000)).await.unwrap();
    let a1 = row_id(&b, "a", 1);
    let rest: Vec<i64> = batch_ids(&b).into_iter().filter(|id| *id != a1).collect();
    assert!(record_failure(&store, b.token, a1, "too large", None).await);
    release(&store, b.token, &rest).await;
    let b2 = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(b2.messages.len(), 1, "{:?}", b2.messages);
    assert_eq!(b2.messages[0].aggregate_id, "b");
    publish_all(&store, &b2).await;
    let dead = store
        .dead_letters(&DeadLetterFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].blocked_behind, 1);
    assert_eq!(dead[0].attempts, 1);
    assert_eq!(dead[0].last_error.as_deref(), Some("too large"));
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.dead, stats.pending), (1, 1));

    let n = store
        .requeue_dead_letters(
            &DeadLetterSelection::Ids(vec![dead[0].event_id]),
            &Actor::new("suite", "test").unwrap(),
            "store suite",
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let b3 = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(versions(&b3.messages, "a"), vec![1, 2]);
    assert_eq!(b3.messages[0].attempts, 0, "a requeue resets the attempts");

    let (first, later) = (b3.messages[0].id, &batch_ids(&b3)[1..]);
    let backoff = Some(Duration::from_millis(300));
    record_failure(&store, b3.token, first, "down", backoff).await;
    release(&store, b3.token, later).await;
    let during = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert!(during.messages.is_empty(), "{:?}", during.messages);
    release(&store, during.token, &[]).await;
    let s = store.stats().await.unwrap();
    assert_eq!(s.retrying, 1);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let b4 = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(versions(&b4.messages, "a"), vec![1, 2]);
    assert_eq!(b4.messages[0].attempts, 1);
    f.cleanup().await;
}

/// A producer transaction that took its row id first but commits last is claimed once it
/// commits: nothing is skipped by a read cursor (G2).
pub async fn a_late_commit_is_claimed_after_later_ones<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let held = f.enqueue_held(vec![msg("t1", 1)]).await;
    f.enqueue(vec![msg("t2", 1)]).await;
    let b = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(b.messages.len(), 1, "uncommitted rows are invisible");
    assert_eq!(b.messages[0].aggregate_id, "t2");
    publish_all(&store, &b).await;
    held.commit().await;
    let b = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(b.messages.len(), 1);
    assert_eq!(b.messages[0].aggregate_id, "t1");
    f.cleanup().await;
}

/// A claimed row carries exactly what the producer wrote (the same event id on every claim).
pub async fn a_claimed_row_is_what_the_producer_wrote<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let m = msg("a", 1)
        .with_header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .with_partition_key("p-1");
    f.enqueue(vec![m.clone()]).await;
    let b = store.claim_batch(claim(10, 30_000)).await.unwrap();
    let got = &b.messages[0];
    assert_eq!(got.event_id, m.event_id);
    assert_eq!(got.payload.bytes, m.payload.bytes);
    assert_eq!(got.payload.content_type, m.payload.content_type);
    assert_eq!(got.fingerprint, m.payload.fingerprint());
    assert_eq!(got.headers, m.headers);
    assert_eq!(got.partition_key(), "p-1");
    assert_eq!(got.attempts, 0);
    record_failure(&store, b.token, got.id, "down", Some(Duration::ZERO)).await;
    release(&store, b.token, &[]).await;
    let again = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(
        again.messages[0].event_id, m.event_id,
        "same id on retry (G4)"
    );
    assert_eq!(again.messages[0].attempts, 1);
    f.cleanup().await;
}
