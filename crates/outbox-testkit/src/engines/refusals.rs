//! The consumer engine when the database refuses: what is dead-lettered at once, what is
//! retried then parked, what is never dead-lettered, hostile messages kept byte for byte, and
//! requeued letters the database refuses or loses to a deadlock.

use bytes::Bytes;
use outbox_core::StoreErrorKind;
use uuid::Uuid;

use super::rig::*;
use crate::fakes::{FakeSource, event_message, wire_message};
use crate::fixture::StoreFixture;

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
