//! Crash matrix row "after broker accept, before relay marker" with a REAL process: the `outbox`
//! relay aborts right after the broker acknowledged an event and before marking it; a restarted
//! relay republishes the same event (G3, G4).
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;

async fn crash_after_broker_ack_before_mark(kind: Kind) {
    let db = TestDb::new().await;
    let broker = BrokerEnv::new(kind).await;
    // Every copy on the wire: a core subscription (NATS sees even the copy JetStream
    // deduplicates) or the bound queue (RabbitMQ delivers both copies).
    let wire = match &broker {
        BrokerEnv::Nats(n) => n.core_subscriber().await,
        BrokerEnv::Rabbit(r) => r.subscriber().await,
        BrokerEnv::Kafka(k) => k.subscriber().await,
    };
    let config = config_file("", &broker.toml(""));

    let mut cmd = outbox(Some(db.name()), Some(&broker.url()), Some(config.path()));
    cmd.arg("relay")
        .env("OUTBOX_CRASH_POINT", "relay.after_publish");
    let mut first = ChildGuard::spawn(cmd, "relay-with-crash-point");

    let msg = event("pay-crash", 1)
        .with_trace_context(TRACEPARENT, Some("vendor=abc".to_owned()))
        .with_header("tenant", "acme");
    db.enqueue(std::slice::from_ref(&msg)).await;

    let status = first.wait_exit(Duration::from_secs(30)).await;
    assert!(
        !status.success(),
        "the relay must die at the crash point, got {status}; log:\n{}",
        first.log()
    );
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(6),
            "expected SIGABRT, got {status}; log:\n{}",
            first.log()
        );
    }
    assert!(
        first
            .log()
            .contains("crash point relay.after_publish reached"),
        "{}",
        first.log()
    );
    // The broker has the event: the crash happened after the ack.
    let before = wire.wait_len(1, Duration::from_secs(10)).await;
    assert_eq!(before[0].event_id, msg.event_id);
    // G3: it was never marked, the row is still pending.
    assert_eq!(
        db.count(&format!(
            "event_id = '{}' AND state = 'pending'",
            msg.event_id
        ))
        .await,
        1,
        "a row acknowledged by the broker but not marked must stay pending"
    );

    let port = free_port();
    let mut cmd = outbox(Some(db.name()), Some(&broker.url()), Some(config.path()));
    cmd.args(["relay", "--metrics-addr", &format!("127.0.0.1:{port}")]);
    let mut second = ChildGuard::spawn(cmd, "relay-restarted");

    // After the dead relay's lease (2 s) expired, the row is claimed again and republished.
    let copies = wire.wait_len(2, Duration::from_secs(20)).await;
    wait_until(
        Duration::from_secs(10),
        "the republished row is marked",
        || {
            let db = &db;
            async move { db.count("true").await == 0 }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let copies_after = wire.snapshot();
    assert_eq!(
        copies_after.len(),
        2,
        "exactly one republish expected: {copies_after:#?}"
    );
    // G4: same event id, headers and payload bytes.
    assert_eq!(copies[0], copies[1], "the republish must be byte-identical");
    assert_eq!(copies[0].event_id, msg.event_id);
    assert_eq!(copies[0].payload, msg.payload.bytes.to_vec());
    assert_eq!(
        copies[0].headers.get("traceparent").map(String::as_str),
        Some(TRACEPARENT)
    );
    assert_eq!(
        copies[0].headers.get("tracestate").map(String::as_str),
        Some("vendor=abc")
    );
    assert_eq!(
        copies[0].headers.get("tenant").map(String::as_str),
        Some("acme")
    );

    if let BrokerEnv::Nats(n) = &broker {
        assert_eq!(
            n.stream_len().await,
            1,
            "JetStream must store the event once (Nats-Msg-Id dedup)"
        );
        let text = scrape_metrics(port).await;
        assert_eq!(
            metric_value(&text, "outbox_broker_duplicates_total"),
            Some(1.0),
            "the restarted relay must count the broker-reported duplicate:\n{text}"
        );
        assert_eq!(metric_value(&text, "outbox_published_total"), Some(1.0));
    } else {
        let text = scrape_metrics(port).await;
        assert_eq!(metric_value(&text, "outbox_published_total"), Some(1.0));
    }

    second.assert_running();
    let status = second.terminate().await;
    assert!(
        status.success(),
        "SIGTERM must stop the relay cleanly: {status}"
    );
    drop(wire);
    broker.cleanup().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_crash_after_broker_ack_before_mark_republishes_same_event() {
    crash_after_broker_ack_before_mark(Kind::Nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_crash_after_broker_ack_before_mark_republishes_same_event() {
    crash_after_broker_ack_before_mark(Kind::Rabbit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_crash_after_broker_ack_before_mark_republishes_same_event() {
    crash_after_broker_ack_before_mark(Kind::Kafka).await;
}
