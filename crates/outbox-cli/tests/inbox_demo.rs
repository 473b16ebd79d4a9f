//! `outbox demo` as a real process on every broker: its verdict (every committed event reached
//! the broker in order and had exactly one effect at the reporting consumer, replays absorbed)
//! must pass. The demo uses the fixed schema `outbox_demo`, stream `OUTBOX_DEMO` and exchange
//! `outbox_demo` (Kafka: a topic of its own per run), so the runs happen one after the other in
//! this one test.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_verdict_passes_on_nats_then_rabbitmq_then_kafka() {
    for url in [nats_url(), amqp_url(), kafka_url()] {
        let mut cmd = outbox(None, Some(&url), None);
        cmd.args(["demo", "--payments", "300", "--timeout-secs", "60"]);
        let r = run(cmd, Duration::from_secs(90)).await;
        assert!(
            r.status.success() && r.stdout.contains("VERDICT: PASS"),
            "demo on {url} failed with {}\nstdout:\n{}\nstderr:\n{}",
            r.status,
            r.stdout,
            r.stderr
        );
        assert!(
            r.stdout
                .contains("missing committed events                0")
                && r.stdout
                    .contains("rolled-back events that leaked          0"),
            "{}",
            r.stdout
        );
    }
}
