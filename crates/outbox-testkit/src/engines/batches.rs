//! The consumer engine in batch mode: a failure rolls back only its own writes, a batch
//! handler gets the new events at once and a failed call is redone one by one, and `run` acks
//! beside the next batch.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use uuid::Uuid;

use super::rig::*;
use crate::fakes::{FakeSource, event_message};
use crate::fixture::StoreFixture;

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
