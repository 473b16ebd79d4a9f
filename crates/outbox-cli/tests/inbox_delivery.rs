//! Consumer inbox through the real brokers (G5, G6, G8): events published by hand with the
//! real transports, consumed by the in-process `PgConsumer` over `NatsSource` / `RabbitSource`
//! (wrapped to log every delivery, ack and nack), one effect row per applied event.
#![allow(missing_docs)]

mod common;
mod inbox_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use inbox_common::*;
use outbox_core::consumer::{ConsumerReport, OrderingGuard};
use serde_json::json;

on_both_brokers!(
    same_event_delivered_n_times_has_one_effect,
    two_instances_racing_on_one_event_have_one_effect,
    same_id_different_payload_is_a_loud_conflict,
    two_consumer_names_get_one_effect_each,
    transient_handler_error_is_retried_without_a_second_effect,
    permanent_handler_error_is_dead_lettered_then_requeued_once,
    malformed_and_oversize_messages_are_dead_lettered_and_acked,
    ordering_guard_wait_holds_a_gap_until_the_missing_version,
    ordering_guard_apply_anyway_absorbs_the_late_version_as_stale,
    a_paused_consumer_waits_and_its_heartbeat_shows_lag_throughput_and_pause,
);

fn agg() -> String {
    format!("pay-{}", uid())
}

/// A `ledger` consumer with the ordering guard `ordering`, and versions 1 to 3 of a fresh
/// aggregate, of which 1 and 3 are published (2 is the gap). Returns the consumer, its
/// source's delivery log and the three versions.
async fn versions_with_a_gap(
    env: &Env,
    ordering: OrderingGuard,
) -> (
    outbox_postgres::PgConsumer<Src, TestHandler>,
    LogHandle,
    Vec<outbox_core::OutboxMessage>,
) {
    let (c, log) = env.ledger(MIB, ordering).await;
    let a = agg();
    let v: Vec<_> = (1..=3)
        .map(|n| message(&a, n, "PaymentUpdated", json!({"v": n})))
        .collect();
    env.publish(&v[0]).await;
    env.publish(&v[2]).await;
    (c, log, v)
}

/// A `ledger` consumer whose handler refuses every event for good while the returned flag is
/// set, run until it dead-lettered one published event. Returns the consumer, its source's
/// delivery log, the flag, the event and the runs' totals.
async fn dead_lettered_by_the_handler(
    env: &Env,
) -> (
    outbox_postgres::PgConsumer<Src, TestHandler>,
    LogHandle,
    Arc<std::sync::atomic::AtomicBool>,
    outbox_core::OutboxMessage,
    ConsumerReport,
) {
    let handler = TestHandler::new(env, "ledger");
    handler
        .permanent
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let permanent = Arc::clone(&handler.permanent);
    let (mut c, log) = env.ledger_with(MIB, handler, OrderingGuard::Off).await;
    let msg = message(&agg(), 1, "PaymentCreated", json!({"amount": 1}));
    env.publish(&msg).await;
    let mut t = ConsumerReport::default();
    run_until(&mut c, &mut t, T, "dead-lettered", |t| t.dead_lettered >= 1).await;
    (c, log, permanent, msg, t)
}

/// Case 1: One event on the wire N = 6 times: one effect, N - 1 duplicates, every copy acked.
async fn same_event_delivered_n_times_has_one_effect(kind: Kind) {
    const N: usize = 6;
    let env = Env::new(kind).await;
    let (mut c, log) = env.ledger(MIB, OrderingGuard::Off).await;
    let msg = message(&agg(), 1, "PaymentCreated", json!({"amount": 100}));
    env.publish(&msg).await;
    for _ in 1..N {
        env.publish_copy(&msg).await;
    }
    let mut t = ConsumerReport::default();
    run_until(&mut c, &mut t, T, "every copy settled", |t| {
        t.processed + t.duplicates >= N
    })
    .await;
    let after = run_for(&mut c, QUIET).await;
    assert_eq!(
        (t.processed, t.duplicates, t.conflicts, t.dead_lettered),
        (1, N - 1, 0, 0),
        "{t:?}"
    );
    assert_eq!(after.received, 0, "an acked copy came back: {after:?}");
    assert_eq!(env.effects_of("ledger", msg.event_id).await, 1, "G5");
    assert_eq!(env.inbox_rows("ledger").await, 1);
    let key = msg.event_id.to_string();
    let log = log.lock().unwrap().clone();
    assert_eq!(log.deliveries_of(&key), N, "{log:?}");
    assert_eq!(log.acks_of(&key), N, "every copy is acked: {log:?}");
    env.cleanup().await;
}

/// Case 2: Two instances of one consumer (same name, same durable / queue) each get one copy of
/// the same event at the same time; the handler holds its transaction open for 500 ms so the
/// second instance's inbox insert meets the first one's uncommitted row. One effect.
async fn two_instances_racing_on_one_event_have_one_effect(kind: Kind) {
    let env = Env::new(kind).await;
    let endpoint = env.endpoint_name();
    let settled = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    let mut logs = Vec::new();
    for _ in 0..2 {
        // Prefetch 1 on RabbitMQ: the broker cannot push both copies to one instance.
        let src = env.source_with(&endpoint, MIB, 1).await;
        logs.push(src.tap());
        let mut handler = TestHandler::new(&env, "ledger");
        handler.delay = Duration::from_millis(500);
        let mut c = env.consumer("ledger", src, handler, OrderingGuard::Off);
        let settled = Arc::clone(&settled);
        tasks.push(tokio::spawn(async move {
            let mut t = ConsumerReport::default();
            let deadline = Instant::now() + T;
            while settled.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
                let r = c.run_batch().await.expect("run_batch");
                settled.fetch_add(r.processed + r.duplicates, Ordering::SeqCst);
                add(&mut t, &r);
            }
            t
        }));
    }
    // Both instances are polling; now both copies, back to back.
    let msg = message(&agg(), 1, "PaymentCreated", json!({"amount": 7}));
    env.publish(&msg).await;
    env.publish_copy(&msg).await;
    let mut reports = Vec::new();
    for task in tasks {
        reports.push(task.await.expect("instance task"));
    }
    let processed: usize = reports.iter().map(|r| r.processed).sum();
    let duplicates: usize = reports.iter().map(|r| r.duplicates).sum();
    assert_eq!((processed, duplicates), (1, 1), "{reports:?}");
    if kind == Kind::Kafka {
        // One partition has one owner in a group: both copies go to the instance that owns it
        // and it absorbs the second, or, when the second member's join moved the partition
        // between the two copies, each instance gets one (the race across a rebalance). Either
        // way one effect (asserted above and below).
        let mut received: Vec<usize> = reports.iter().map(|r| r.received).collect();
        received.sort_unstable();
        assert!(
            received == vec![0, 2] || received == vec![1, 1],
            "{reports:?}"
        );
    } else {
        assert!(
            reports.iter().all(|r| r.received == 1),
            "each instance must have received one copy (the race was not exercised): {reports:?}"
        );
    }
    assert_eq!(env.effects_of("ledger", msg.event_id).await, 1, "G5");
    assert_eq!(env.inbox_rows("ledger").await, 1);
    for log in logs {
        let log = log.lock().unwrap();
        assert_eq!(log.acked.len(), log.delivered.len(), "{log:?}");
    }
    env.cleanup().await;
}

/// Case 4: The same event id with another payload: recorded as a conflict, visible in `outbox
/// conflicts list` and `outbox status --json`, and never applied.
async fn same_id_different_payload_is_a_loud_conflict(kind: Kind) {
    let env = Env::new(kind).await;
    let (mut c, log) = env.ledger(MIB, OrderingGuard::Off).await;
    let first = message(&agg(), 1, "PaymentCreated", json!({"amount": 100}));
    let reused = with_payload(&first, json!({"amount": 999_999}));
    env.publish(&first).await;
    // On NATS without Nats-Msg-Id: JetStream would otherwise drop it as a duplicate.
    env.publish_copy(&reused).await;
    let mut t = ConsumerReport::default();
    run_until(&mut c, &mut t, T, "the event and the conflict", |t| {
        t.processed + t.conflicts >= 2
    })
    .await;
    assert_eq!((t.processed, t.conflicts, t.duplicates), (1, 1, 0), "{t:?}");
    assert_eq!(env.effects_of("ledger", first.event_id).await, 1);
    let payload: String = sqlx::query_scalar(sqlx::AssertSqlSafe(
        env.db.sql("SELECT payload FROM {s}.effects"),
    ))
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert!(
        payload.contains("100") && !payload.contains("999999"),
        "the first payload's effect stays, the conflicting one is not applied: {payload}"
    );
    // The default policy acknowledges after recording.
    assert_eq!(log.lock().unwrap().acks_of(&first.event_id.to_string()), 2);

    let list = env.cli(&["conflicts", "list"]).await;
    assert!(list.status.success(), "{list:?}");
    assert!(
        list.stdout.contains(&first.event_id.to_string())
            && list.stdout.contains("consumer=ledger"),
        "conflicts list must show the event: {}",
        list.stdout
    );
    assert!(
        list.stdout.contains(&first.fingerprint.to_hex())
            && list.stdout.contains(&reused.fingerprint.to_hex()),
        "both fingerprints shown: {}",
        list.stdout
    );
    let status = env.cli(&["status", "--json"]).await;
    assert!(status.status.success(), "{status:?}");
    let v: serde_json::Value = serde_json::from_str(status.stdout.trim())
        .unwrap_or_else(|e| panic!("status --json: {e}: {}", status.stdout));
    assert_eq!(v["inbox_conflicts"], 1, "{v}");
    env.cleanup().await;
}

/// Case 5: Two consumers (different names, their own durable / queue) of the same event: one
/// effect each, and each absorbs its redelivery.
async fn two_consumer_names_get_one_effect_each(kind: Kind) {
    let env = Env::new(kind).await;
    let mut consumers = Vec::new();
    for name in ["ledger", "reporting"] {
        let src = env.source(&env.endpoint_name(), MIB).await;
        consumers.push(env.consumer(name, src, TestHandler::new(&env, name), OrderingGuard::Off));
    }
    let msg = message(&agg(), 1, "PaymentCreated", json!({"amount": 5}));
    env.publish(&msg).await;
    env.publish_copy(&msg).await;
    for c in &mut consumers {
        let mut t = ConsumerReport::default();
        run_until(c, &mut t, T, "both copies", |t| {
            t.processed + t.duplicates >= 2
        })
        .await;
        assert_eq!((t.processed, t.duplicates), (1, 1), "{t:?}");
    }
    for name in ["ledger", "reporting"] {
        assert_eq!(env.effects_of(name, msg.event_id).await, 1, "{name}");
        assert_eq!(env.inbox_rows(name).await, 1, "{name}");
    }
    env.cleanup().await;
}

/// Case 6a: The handler fails twice with a transient error: redelivered with backoff, applied on
/// the third delivery, one effect, no dead letter.
async fn transient_handler_error_is_retried_without_a_second_effect(kind: Kind) {
    let env = Env::new(kind).await;
    let handler = TestHandler::new(&env, "ledger");
    handler
        .transient_failures
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let calls = Arc::clone(&handler.calls);
    let (mut c, log) = env.ledger_with(MIB, handler, OrderingGuard::Off).await;
    let msg = message(&agg(), 1, "PaymentCreated", json!({"amount": 1}));
    env.publish(&msg).await;
    let mut t = ConsumerReport::default();
    run_until(&mut c, &mut t, T, "applied after two failures", |t| {
        t.processed >= 1
    })
    .await;
    let after = run_for(&mut c, QUIET).await;
    assert_eq!((t.processed, t.nacked, t.dead_lettered), (1, 2, 0), "{t:?}");
    assert_eq!(after.received, 0, "{after:?}");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 3);
    assert_eq!(env.effects_of("ledger", msg.event_id).await, 1);
    assert_eq!(env.inbox_rows("ledger").await, 1);
    assert!(env.dead_letters("ledger").await.is_empty());
    let key = msg.event_id.to_string();
    let log = log.lock().unwrap().clone();
    assert_eq!(
        (log.deliveries_of(&key), log.acks_of(&key)),
        (3, 1),
        "{log:?}"
    );
    env.cleanup().await;
}

/// Case 6b: A permanent handler error: dead-lettered (listed by `outbox consumer-dead-letters list`
/// with the reason), acked, no effect, no inbox row. After `requeue --all` the runner loop
/// applies it exactly once, and a second requeue changes nothing.
async fn permanent_handler_error_is_dead_lettered_then_requeued_once(kind: Kind) {
    let env = Env::new(kind).await;
    let (mut c, log, permanent, msg, t) = dead_lettered_by_the_handler(&env).await;
    let after = run_for(&mut c, QUIET).await;
    assert_eq!((t.processed, t.dead_lettered), (0, 1), "{t:?}");
    assert_eq!(
        after.received, 0,
        "a dead-lettered delivery is acked: {after:?}"
    );
    assert_eq!(
        log.lock().unwrap().acks_of(&msg.event_id.to_string()),
        1,
        "acked after the dead letter committed"
    );
    assert_eq!(env.effects("ledger").await, 0);
    assert_eq!(
        env.inbox_rows("ledger").await,
        0,
        "the inbox row is rolled back"
    );

    let list = env.cli(&["consumer-dead-letters", "list"]).await;
    assert!(list.status.success(), "{list:?}");
    assert!(
        list.stdout.contains(&msg.event_id.to_string())
            && list.stdout.contains("consumer=ledger")
            && list.stdout.contains("state=dead")
            && list
                .stdout
                .contains("permanent handler error: test refuses PaymentCreated v1"),
        "dead letter with its reason: {}",
        list.stdout
    );
    // The same, machine-readable: the list and the groups.
    let json = env.cli(&["consumer-dead-letters", "list", "--json"]).await;
    let letters: serde_json::Value = serde_json::from_str(&json.stdout).expect("a JSON list");
    assert_eq!(letters.as_array().map(Vec::len), Some(1), "{letters}");
    assert_eq!(
        letters[0]["event_id"],
        msg.event_id.to_string(),
        "{letters}"
    );
    assert_eq!(letters[0]["consumer_name"], "ledger", "{letters}");
    let json = env
        .cli(&["consumer-dead-letters", "groups", "--json"])
        .await;
    let groups: serde_json::Value = serde_json::from_str(&json.stdout).expect("a JSON object");
    assert_eq!(groups["groups"][0]["count"], 1, "{groups}");
    assert_eq!(groups["groups"][0]["consumer_name"], "ledger", "{groups}");

    permanent.store(false, std::sync::atomic::Ordering::SeqCst);
    let requeue = env
        .cli(&["consumer-dead-letters", "requeue", "--all"])
        .await;
    assert!(
        requeue.status.success() && requeue.stdout.contains("requeued 1"),
        "{requeue:?}"
    );
    // The runner loop (housekeeping every 100 ms) applies it through the inbox.
    let stop = tokio_util::sync::CancellationToken::new();
    let runner = tokio::spawn(c.run(stop.clone()));
    wait_until(T, "the requeued dead letter is applied", || async {
        env.effects("ledger").await >= 1
    })
    .await;
    let again = env
        .cli(&["consumer-dead-letters", "requeue", "--all"])
        .await;
    assert!(
        again.status.success() && again.stdout.contains("requeued 0"),
        "a resolved dead letter is not requeued again: {again:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await; // several housekeeping rounds
    stop.cancel();
    runner.await.expect("runner");
    assert_eq!(
        env.effects_of("ledger", msg.event_id).await,
        1,
        "exactly once"
    );
    assert_eq!(env.inbox_rows("ledger").await, 1);
    let list = env.cli(&["consumer-dead-letters", "list"]).await;
    assert!(
        list.stdout.contains("no consumer dead letters"),
        "{}",
        list.stdout
    );
    env.cleanup().await;
}

/// Case 7: Malformed messages (no CloudEvents attributes, a bad specversion, a body altered after
/// its payloadsha256 was computed) and one over the source's `max_message_bytes` (512) are
/// dead-lettered with the reason and acked, never redelivered; a good one after them is
/// applied.
async fn malformed_and_oversize_messages_are_dead_lettered_and_acked(kind: Kind) {
    let env = Env::new(kind).await;
    let (mut c, log) = env.ledger(512, OrderingGuard::Off).await;
    let a = agg();
    let base = message(&a, 1, "PaymentCreated", json!({"case": "template"}));
    let missing_body = b"missing-attributes body".to_vec();
    env.publish_raw(&base, missing_body.clone(), |h| h.clear())
        .await;
    let bad_version = message(&a, 1, "PaymentCreated", json!({"case": "bad-version"}));
    env.publish_raw(&bad_version, bad_version.payload.bytes.to_vec(), |h| {
        h.insert("specversion".into(), "0.3".into());
    })
    .await;
    let altered = message(&a, 1, "PaymentCreated", json!({"case": "altered"}));
    let altered_body = br#"{"case":"altered-on-the-way"}"#.to_vec();
    env.publish_raw(&altered, altered_body.clone(), |_| {})
        .await;
    let oversize = message(
        &a,
        1,
        "PaymentCreated",
        json!({"case": "oversize", "pad": "x".repeat(1000)}),
    );
    env.publish(&oversize).await;
    let good = message(&a, 1, "PaymentCreated", json!({"case": "good"}));
    env.publish(&good).await;

    let mut t = ConsumerReport::default();
    run_until(&mut c, &mut t, T, "4 dead letters and the good one", |t| {
        t.dead_lettered >= 4 && t.processed >= 1
    })
    .await;
    let after = run_for(&mut c, QUIET).await;
    assert_eq!((t.dead_lettered, t.processed), (4, 1), "{t:?}");
    assert_eq!(
        after.received, 0,
        "dead-lettered messages are acked: {after:?}"
    );
    assert_eq!(env.effects("ledger").await, 1);
    assert_eq!(env.effects_of("ledger", good.event_id).await, 1);

    let reasons: Vec<String> = env
        .dead_letters("ledger")
        .await
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    for needle in [
        "missing CloudEvents attribute `specversion`",
        "unsupported CloudEvents specversion `0.3`",
        "payload fingerprint mismatch",
        "exceeds the limit of 512 bytes",
    ] {
        assert!(
            reasons
                .iter()
                .any(|r| r.starts_with("malformed: ") && r.contains(needle)),
            "no dead letter says `{needle}`: {reasons:?}"
        );
    }
    let log = log.lock().unwrap().clone();
    for key in [
        raw_key(&missing_body),
        raw_key(&bad_version.payload.bytes),
        raw_key(&altered_body),
        raw_key(&oversize.payload.bytes),
        good.event_id.to_string(),
    ] {
        assert_eq!(
            (log.deliveries_of(&key), log.acks_of(&key)),
            (1, 1),
            "{key}: {log:?}"
        );
    }
    let list = env
        .cli(&["consumer-dead-letters", "list", "--consumer", "ledger"])
        .await;
    assert!(list.status.success(), "{list:?}");
    assert_eq!(
        list.stdout.matches("error: malformed: ").count(),
        4,
        "{}",
        list.stdout
    );
    env.cleanup().await;
}

/// Case 8a: OrderingGuard::Wait: v1 and v3 arrive; v3 is nacked again and again until v2
/// arrives; then v2 and v3 are applied, in order, each once.
async fn ordering_guard_wait_holds_a_gap_until_the_missing_version(kind: Kind) {
    let env = Env::new(kind).await;
    let (mut c, log, v) = versions_with_a_gap(&env, OrderingGuard::Wait).await;
    let mut t = ConsumerReport::default();
    run_until(&mut c, &mut t, T, "v1 applied and v3 held", |t| {
        t.processed >= 1 && t.nacked >= 3
    })
    .await;
    assert_eq!(t.processed, 1, "v3 must not be applied before v2: {t:?}");
    assert_eq!(env.applied_versions("ledger").await, vec![1]);
    env.publish(&v[1]).await;
    run_until(&mut c, &mut t, T, "all three applied", |t| t.processed >= 3).await;
    let after = run_for(&mut c, QUIET).await;
    assert_eq!(after.received, 0, "{after:?}");
    assert_eq!(env.applied_versions("ledger").await, vec![1, 2, 3]);
    assert_eq!(env.inbox_rows("ledger").await, 3);
    let log = log.lock().unwrap().clone();
    let v3 = v[2].event_id.to_string();
    assert!(
        log.nacked.iter().filter(|k| **k == v3).count() >= 3,
        "{log:?}"
    );
    for m in &v {
        assert_eq!(log.acks_of(&m.event_id.to_string()), 1, "{log:?}");
    }
    env.cleanup().await;
}

/// Case 8b: OrderingGuard::ApplyAnyway: v1, v3 applied across the gap; v2 arriving late is
/// absorbed as stale (recorded, no effect).
async fn ordering_guard_apply_anyway_absorbs_the_late_version_as_stale(kind: Kind) {
    let env = Env::new(kind).await;
    let (mut c, _, v) = versions_with_a_gap(&env, OrderingGuard::ApplyAnyway).await;
    let mut t = ConsumerReport::default();
    run_until(&mut c, &mut t, T, "v1 and v3 applied", |t| t.processed >= 2).await;
    env.publish(&v[1]).await;
    run_until(&mut c, &mut t, T, "v2 absorbed", |t| t.stale >= 1).await;
    let after = run_for(&mut c, QUIET).await;
    assert_eq!((t.processed, t.stale, t.nacked), (2, 1, 0), "{t:?}");
    assert_eq!(after.received, 0, "{after:?}");
    assert_eq!(env.applied_versions("ledger").await, vec![1, 3]);
    assert_eq!(
        env.db
            .scalar(&format!(
                "SELECT count(*) FROM {{s}}.inbox WHERE event_id = '{}' AND outcome = 'stale'",
                v[1].event_id
            ))
            .await,
        1
    );
    env.cleanup().await;
}

/// `PgConsumer::run_batch` is documented as "Processes one batch of deliveries (and any
/// requeued dead letters)" and `ConsumerReport::requeued_resolved` as "Requeued dead letters
/// applied (or absorbed) this call". A requeued dead letter must therefore be applied by
/// `run_batch` alone and counted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_batch_applies_requeued_dead_letters_as_documented() {
    let env = Env::new(Kind::Nats).await;
    let (mut c, _, permanent, _, _) = dead_lettered_by_the_handler(&env).await;
    permanent.store(false, std::sync::atomic::Ordering::SeqCst);
    let n = {
        use outbox_core::operator::DeadLetterOps as _;
        let actor = outbox_core::operator::Actor::new("test", "test").unwrap();
        env.db
            .store()
            .requeue_consumer_dead_letters(&Default::default(), &actor, "healed")
            .await
            .unwrap()
    };
    assert_eq!(n, 1);
    let after = run_for(&mut c, Duration::from_secs(1)).await;
    let effects = env.effects("ledger").await;
    env.cleanup().await;
    assert_eq!(
        (effects, after.requeued_resolved),
        (1, 1),
        "run_batch did not apply/count the requeued dead letter: {after:?}"
    );
}

/// Kafka, issue 10 acceptance 3: two instances of one consumer in one group through two
/// rebalances (the second joins while events stream in, then the first leaves): every event
/// applied exactly once, each aggregate's versions applied in order. Copies re-read after a
/// rebalance (from the last committed offset) are absorbed by the inbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_two_instances_through_rebalances_apply_every_event_once_in_order() {
    const AGGREGATES: usize = 24;
    const VERSIONS: i64 = 30;
    let total = AGGREGATES * VERSIONS as usize;
    let env = Env::new(Kind::Kafka).await;
    let endpoint = env.endpoint_name();
    let applied = Arc::new(AtomicUsize::new(0));
    let stop_a = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let b_applied = Arc::new(AtomicUsize::new(0));

    let instance = |src: Src,
                    stop: Option<Arc<std::sync::atomic::AtomicBool>>,
                    mine: Option<Arc<AtomicUsize>>| {
        let mut handler = TestHandler::new(&env, "ledger");
        // Slow enough that the stream outlasts both rebalances.
        handler.delay = Duration::from_millis(5);
        let mut c = env.consumer("ledger", src, handler, OrderingGuard::Off);
        let applied = Arc::clone(&applied);
        tokio::spawn(async move {
            let mut t = ConsumerReport::default();
            let deadline = Instant::now() + Duration::from_secs(90);
            while applied.load(Ordering::SeqCst) < total
                && !stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst))
            {
                assert!(Instant::now() < deadline, "not done within 90 s: {t:?}");
                let r = c.run_batch().await.expect("run_batch");
                applied.fetch_add(r.processed, Ordering::SeqCst);
                if let Some(mine) = &mine {
                    mine.fetch_add(r.processed, Ordering::SeqCst);
                }
                add(&mut t, &r);
            }
            // Dropping the runner closes the source: the member leaves the group at once.
            drop(c);
            t
        })
    };

    let a = instance(
        env.source(&endpoint, MIB).await,
        Some(Arc::clone(&stop_a)),
        None,
    );
    let mut b = None;
    let mut expected = Vec::with_capacity(total);
    for v in 1..=VERSIONS {
        for n in 0..AGGREGATES {
            let msg = message(&format!("agg-{n:02}"), v, "PaymentCreated", json!({"v": v}));
            env.publish(&msg).await;
            expected.push(msg.event_id);
        }
        if v == 4 {
            // A second member: the partitions are split between the two.
            b = Some(instance(
                env.source(&endpoint, MIB).await,
                None,
                Some(Arc::clone(&b_applied)),
            ));
        }
        if v >= 10 && !stop_a.load(Ordering::SeqCst) && b_applied.load(Ordering::SeqCst) > 0 {
            // Both members have applied events: the first leaves, the second takes every
            // partition.
            eprintln!(
                "the first member leaves at version {v}; the second applied {} by then",
                b_applied.load(Ordering::SeqCst)
            );
            stop_a.store(true, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        stop_a.load(Ordering::SeqCst),
        "the second member applied nothing while {VERSIONS} rounds were published: the \
         partitions were never split between two live members"
    );
    let a = a.await.expect("instance a");
    let b = b.expect("second instance").await.expect("instance b");
    eprintln!("instance a: {a:?}\ninstance b: {b:?}");

    assert!(a.processed > 0 && b.processed > 0, "a {a:?}, b {b:?}");
    assert_eq!(a.processed + b.processed, total, "a {a:?}, b {b:?}");
    assert_eq!(
        a.conflicts + b.conflicts + a.dead_lettered + b.dead_lettered,
        0
    );
    assert_eq!(
        env.effects("ledger").await,
        total as i64,
        "G5: one effect per event"
    );
    let twice = env
        .db
        .scalar(
            "SELECT count(*) FROM (SELECT event_id FROM {s}.effects GROUP BY event_id \
             HAVING count(*) > 1) d",
        )
        .await;
    assert_eq!(twice, 0, "an event applied twice");
    for id in &expected {
        assert_eq!(env.effects_of("ledger", *id).await, 1, "{id}");
    }
    for n in 0..AGGREGATES {
        let versions: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(env.db.sql(&format!(
            "SELECT version FROM {{s}}.effects WHERE aggregate_id = 'agg-{n:02}' ORDER BY id"
        ))))
        .fetch_all(&env.db.pool)
        .await
        .unwrap();
        assert_eq!(versions, (1..=VERSIONS).collect::<Vec<_>>(), "agg-{n:02}");
    }
    env.cleanup().await;
}

/// A running consumer with a heartbeat (`with_consumer`): the console's consumer view shows it
/// up, its effects per minute and the lag its engine read; paused by an operator, it takes
/// nothing from the broker (the message waits there) and says so in its stats; resumed, it
/// applies the waiting message once.
async fn a_paused_consumer_waits_and_its_heartbeat_shows_lag_throughput_and_pause(kind: Kind) {
    use outbox_core::operator::prelude::*;
    use outbox_core::operator::{Actor, PauseTarget};
    use outbox_postgres::heartbeat::{Heartbeat, InstanceKind};
    let env = Env::new(kind).await;
    let (c, _) = env.ledger(MIB, OrderingGuard::Off).await;
    let beat = Heartbeat::new(
        outbox_postgres::PgStore::with_schema(env.db.pool.clone(), env.db.schema.clone()),
        InstanceKind::Consumer,
        "ledger",
    )
    .unwrap()
    .with_interval(Duration::from_millis(200))
    .with_consumer(c.stats());
    let stop = tokio_util::sync::CancellationToken::new();
    let beating = tokio::spawn(beat.run(stop.clone()));
    let running = tokio::spawn(c.run(stop.clone()));
    let admin = env.db.store();
    for v in 1..=3 {
        env.publish(&message(&agg(), v, "PaymentCreated", json!({"v": v})))
            .await;
    }
    wait_until(T, "three effects and their heartbeat", || async {
        let view = admin.consumers().await.unwrap();
        view.iter().any(|c| {
            c.name == "ledger"
                && c.instances_up == 1
                && c.processed_per_minute.iter().sum::<i64>() == 3
                && c.lag == Some(0)
        })
    })
    .await;
    assert_eq!(env.effects("ledger").await, 3);

    let me = Actor::new("tester", "test").unwrap();
    let target = PauseTarget::Consumer("ledger".into());
    admin.pause(&target, &me, "ledger migration").await.unwrap();
    wait_until(T, "the engine reporting itself paused", || async {
        let instances = admin.instances().await.unwrap();
        instances
            .iter()
            .any(|i| i.name == "ledger" && i.stats["paused"] == json!(true))
    })
    .await;
    let late = message(&agg(), 1, "PaymentCreated", json!({"late": true}));
    env.publish(&late).await;
    tokio::time::sleep(QUIET).await;
    assert_eq!(env.effects("ledger").await, 3, "a paused consumer applied");
    let view = admin.consumers().await.unwrap();
    assert!(view.iter().any(|c| c.name == "ledger" && c.paused));

    admin.resume(&target, &me, "done").await.unwrap();
    wait_until(T, "the waiting message applied", || async {
        env.effects("ledger").await == 4
    })
    .await;
    stop.cancel();
    running.await.unwrap();
    beating.await.unwrap();
    env.cleanup().await;
}
