//! The consumer engine through outages: nothing lost, acks only after commit, the source
//! released after an error, and a stuck consumer that says why.

use outbox_core::StoreErrorKind;
use uuid::Uuid;

use super::rig::*;
use crate::fakes::event_message;
use crate::fixture::StoreFixture;

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
