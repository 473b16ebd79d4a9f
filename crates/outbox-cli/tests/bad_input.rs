//! Bad input to the `outbox` binary fails cleanly: non-zero exit, a message naming the problem,
//! never a panic. And a poison message (too large for the broker) is dead-lettered with its
//! reason while other aggregates keep flowing and its own aggregate waits behind it.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;
use outbox_core::Payload;

const QUICK: Duration = Duration::from_secs(30);

async fn relay_with_config(toml: &str, schema: &str) -> Run {
    let config = TempFile::new(".toml", toml);
    let mut cmd = outbox(Some(schema), Some(&nats_url()), Some(config.path()));
    cmd.arg("relay");
    run(cmd, QUICK).await
}

#[tokio::test]
async fn config_file_with_unknown_key_is_refused_naming_the_key() {
    let r = relay_with_config("[relay]\nbatch_sise = 5\n", "outbox_unused").await;
    assert_clean_failure(&r, &["batch_sise"]);
    let r = relay_with_config("[nats]\nstreem = \"X\"\n", "outbox_unused").await;
    assert_clean_failure(&r, &["streem"]);
    let r = relay_with_config("[rabbitmq]\nexchnage = \"x\"\n", "outbox_unused").await;
    assert_clean_failure(&r, &["exchnage"]);
}

#[tokio::test]
async fn config_file_with_wrong_type_is_refused_naming_the_key() {
    let r = relay_with_config("[relay]\nbatch_size = \"many\"\n", "outbox_unused").await;
    assert_clean_failure(&r, &["batch_size"]);
    let r = relay_with_config("[relay]\npoll_interval_ms = -5\n", "outbox_unused").await;
    assert_clean_failure(&r, &["poll_interval_ms"]);
}

#[tokio::test]
async fn lease_shorter_than_publish_window_is_refused_naming_the_key() {
    let db = TestDb::new().await;
    let r = relay_with_config(
        "[relay]\nlease_secs = 1\npublish_timeout_secs = 1\nlease_safety_margin_secs = 0.5\n",
        db.name(),
    )
    .await;
    assert_clean_failure(&r, &["relay.lease"]);
    db.drop().await;
}

/// A zero poll or stats interval turns the relay into a busy loop of claim / full-table stats
/// queries against the database. Like the other zero values (`publish_timeout`,
/// `backoff_base_ms`, ...) it must be refused at startup, naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_poll_or_stats_interval_is_refused_naming_the_key() {
    let db = TestDb::new().await;
    let nats = NatsEnv::new().await;
    // Failures are collected so the schema and stream are cleaned up before the verdict.
    let mut failures = Vec::new();
    for (key, what) in [
        ("poll_interval_ms", "claim"),
        ("stats_interval_secs", "stats"),
    ] {
        let config = TempFile::new(".toml", &format!("[relay]\n{key} = 0\n{}", nats.toml()));
        let mut cmd = outbox(Some(db.name()), Some(&nats_url()), Some(config.path()));
        cmd.arg("relay");
        let mut relay = ChildGuard::spawn(cmd, "relay-zero-interval");
        let Some(status) = relay.try_wait_exit(Duration::from_secs(3)).await else {
            failures.push(format!(
                "`relay.{key} = 0` was accepted: the relay runs with a zero interval, a busy \
                 loop of {what} queries against the database. It must be refused at startup \
                 naming `relay.{key}`."
            ));
            continue;
        };
        let log = relay.log();
        if status.success() || !log.contains(key) || log.contains("panicked") {
            failures.push(format!(
                "`relay.{key} = 0`: expected a clean failure naming the key, got {status}: {log}"
            ));
        }
    }
    nats.cleanup().await;
    db.drop().await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn unreachable_database_at_startup_is_a_clean_error() {
    let runs = [&["status"][..], &["relay"], &["migrate"]].map(|sub| {
        let mut cmd = outbox(Some("outbox"), Some(&nats_url()), None);
        cmd.env(
            "OUTBOX_DATABASE_URL",
            "postgres://postgres@127.0.0.1:1/test",
        )
        .args(sub);
        run(cmd, QUICK)
    });
    for r in futures::future::join_all(runs).await {
        assert_clean_failure(&r, &["cannot connect to PostgreSQL", "127.0.0.1:1"]);
    }
}

#[tokio::test]
async fn unreachable_broker_at_startup_is_a_clean_error() {
    let db = TestDb::new().await;
    for (url, needle) in [
        ("nats://127.0.0.1:1", "cannot connect to NATS"),
        (
            "amqp://guest:guest@127.0.0.1:1/%2f",
            "cannot connect to RabbitMQ",
        ),
    ] {
        let mut cmd = outbox(Some(db.name()), Some(url), None);
        cmd.arg("relay");
        let r = run(cmd, QUICK).await;
        assert_clean_failure(&r, &[needle, "127.0.0.1:1"]);
        assert!(
            !r.stderr.contains("guest:guest"),
            "credentials leaked: {}",
            r.stderr
        );
    }
    db.drop().await;
}

#[tokio::test]
async fn unknown_broker_scheme_is_refused_naming_the_supported_ones() {
    for url in ["foo://x", "localhost:4222"] {
        let mut cmd = outbox(Some("outbox_unused"), Some(url), None);
        cmd.arg("relay");
        let r = run(cmd, QUICK).await;
        assert_clean_failure(
            &r,
            &["broker_url", "nats://", "tls://", "amqp://", "amqps://"],
        );
    }
    let mut cmd = outbox(Some("outbox_unused"), Some("foo://user:hunter2@x"), None);
    cmd.arg("relay");
    let r = run(cmd, QUICK).await;
    assert_clean_failure(&r, &["`foo`"]);
    assert!(!r.stderr.contains("hunter2"), "{}", r.stderr);
}

#[tokio::test]
async fn invalid_schema_identifier_is_refused() {
    for sub in [&["relay"][..], &["migrate"], &["status"]] {
        let mut cmd = outbox(None, Some(&nats_url()), None);
        cmd.args(["--schema", "Bad-Name"]).args(sub);
        let r = run(cmd, QUICK).await;
        assert_clean_failure(&r, &["schema", "Bad-Name"]);
    }
}

#[tokio::test]
async fn relay_against_unmigrated_schema_says_to_run_migrate() {
    let db = TestDb::unmigrated().await;
    let mut cmd = outbox(Some(db.name()), Some(&nats_url()), None);
    cmd.arg("relay");
    let r = run(cmd, QUICK).await;
    assert_clean_failure(&r, &["outbox migrate"]);
    // Nothing was created behind the operator's back.
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = '{}'",
            db.name()
        ))
        .await,
        0
    );
    db.drop().await;
}

/// An event over the broker's size limit is dead-lettered at once with the reason; other
/// aggregates keep flowing; the same aggregate's later version waits behind it.
async fn oversized_payload_is_dead_lettered_and_parks_only_its_aggregate(kind: Kind) {
    let db = TestDb::new().await;
    let broker = BrokerEnv::new(kind).await;
    let sub = broker.subscriber().await;
    let size = match kind {
        // The server's max_payload is 1 MiB.
        Kind::Nats => 1024 * 1024 + 10,
        // Over the transport's configured max_message_bytes.
        Kind::Rabbit => 4096,
        // Over librdkafka's message.max.bytes of 1,000,000.
        Kind::Kafka => 1_000_010,
    };
    let config = config_file("", &broker.toml("max_message_bytes = 2048"));
    let mut cmd = outbox(Some(db.name()), Some(&broker.url()), Some(config.path()));
    cmd.arg("relay");
    let mut relay = ChildGuard::spawn(cmd, "relay-poison");

    let big = outbox_core::NewMessage::new(
        "payment",
        "pay-big",
        1,
        "PaymentUpdated",
        Payload::bytes("application/octet-stream", vec![b'x'; size]),
    );
    let behind = event("pay-big", 2);
    let others: Vec<_> = (0..4)
        .flat_map(|a| (1..=2).map(move |v| event(&format!("pay-ok-{a}"), v)))
        .collect();
    let mut all = vec![big.clone(), behind.clone()];
    all.extend(others.iter().cloned());
    db.enqueue(&all).await;

    let ids: Vec<_> = others.iter().map(|m| m.event_id).collect();
    sub.wait_ids(&ids, Duration::from_secs(20)).await;
    wait_until(
        Duration::from_secs(10),
        "the big event dead-lettered",
        || {
            let db = &db;
            let f = format!("event_id = '{}' AND state = 'dead'", big.event_id);
            async move { db.count(&f).await == 1 }
        },
    )
    .await;
    // Several more poll cycles: the parked version must not move.
    tokio::time::sleep(Duration::from_millis(600)).await;
    relay.assert_running();

    let last_error: String = sqlx::query_scalar(sqlx::AssertSqlSafe(
        db.sql("SELECT last_error FROM {s}.events WHERE event_id = $1"),
    ))
    .bind(big.event_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        last_error.contains("TooLarge"),
        "last_error must give the reason: {last_error}"
    );
    assert_eq!(
        db.count(&format!(
            "event_id = '{}' AND state = 'pending' AND attempts = 0",
            behind.event_id
        ))
        .await,
        1,
        "the later version of the poisoned aggregate must wait behind the dead letter"
    );
    assert_eq!(
        db.count("true").await,
        2,
        "only the dead letter and its parked successor remain"
    );
    let seen = sub.snapshot();
    assert!(
        !seen
            .iter()
            .any(|r| r.event_id == big.event_id || r.event_id == behind.event_id),
        "nothing of the poisoned aggregate may leave"
    );
    assert_eq!(seen.len(), others.len());
    assert_strictly_increasing(&seen);

    // The CLI shows the dead letter with its reason and what waits behind it.
    let r = run(
        {
            let mut c = outbox(Some(db.name()), None, Some(config.path()));
            c.args(["dead-letters", "list"]);
            c
        },
        QUICK,
    )
    .await;
    assert!(r.status.success(), "{r:?}");
    assert!(r.stdout.contains(&big.event_id.to_string()), "{}", r.stdout);
    assert!(r.stdout.contains("waiting_behind=1"), "{}", r.stdout);
    assert!(r.stdout.contains("TooLarge"), "{}", r.stdout);

    relay.terminate().await;
    drop(sub);
    broker.cleanup().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_oversized_payload_is_dead_lettered_and_parks_only_its_aggregate() {
    oversized_payload_is_dead_lettered_and_parks_only_its_aggregate(Kind::Nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_oversized_payload_is_dead_lettered_and_parks_only_its_aggregate() {
    oversized_payload_is_dead_lettered_and_parks_only_its_aggregate(Kind::Rabbit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_oversized_payload_is_dead_lettered_and_parks_only_its_aggregate() {
    oversized_payload_is_dead_lettered_and_parks_only_its_aggregate(Kind::Kafka).await;
}
