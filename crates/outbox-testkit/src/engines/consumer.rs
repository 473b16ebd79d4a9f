//! The consumer engine over a store: one effect per event, retries, dead letters and their
//! requeue, malformed messages, conflicts, pauses, the ordering guard, several consumers.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::consumer::{ConflictPolicy, ConsumerConfig, ConsumerReport, OrderingGuard};
use uuid::Uuid;

use super::rig::*;
use crate::fakes::{FakeSource, event_message};
use crate::fixture::StoreFixture;

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
