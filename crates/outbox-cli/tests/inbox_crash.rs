//! Crash matrix rows "consumer before commit" and "consumer after commit, before ack" with a
//! REAL process: `outbox demo-consumer` (the demo's ReportingHandler: `PaymentCreated` inserts
//! a `payment_report` row with `events_applied = 1`) aborts at a crash point; a restarted
//! process gets the redelivery. G5, G6.
#![allow(missing_docs)]

mod common;
mod inbox_common;

use std::time::Duration;

use common::*;
use inbox_common::*;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use outbox_core::OutboxMessage;
use outbox_nats::async_nats::jetstream::consumer::pull;
use serde_json::json;
use uuid::Uuid;

const T: Duration = Duration::from_secs(20);

macro_rules! on_both_brokers {
    ($($name:ident: $point:expr),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn nats() {
                super::crash_and_restart(super::Kind::Nats, $point).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn rabbitmq() {
                super::crash_and_restart(super::Kind::Rabbit, $point).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn kafka() {
                super::crash_and_restart(super::Kind::Kafka, $point).await;
            }
        }
    )*};
}

on_both_brokers!(
    crash_after_commit_redelivery_is_absorbed: "consumer.after_commit",
    crash_after_effect_rolls_back_then_applies_once: "consumer.after_effect",
    crash_after_inbox_rolls_back_then_applies_once: "consumer.after_inbox",
);

struct Consumer<'a> {
    env: &'a Env,
    endpoint: String,
    /// Kafka: a group member killed without leaving holds its partitions until its session
    /// times out, so the test's consumers use a short one (6 s instead of librdkafka's 45 s).
    config: TempFile,
}

impl Consumer<'_> {
    fn spawn(&self, crash_point: Option<&str>, name: &str) -> ChildGuard {
        let mut cmd = outbox(
            Some(self.env.db.name()),
            Some(&self.env.broker.url()),
            Some(self.config.path()),
        );
        cmd.arg("demo-consumer");
        match &self.env.broker {
            BrokerEnv::Nats(n) => cmd.args([
                "--nats-stream",
                &n.stream,
                "--nats-durable",
                &self.endpoint,
                "--ack-wait-secs",
                "2",
            ]),
            BrokerEnv::Rabbit(r) => cmd.args([
                "--rabbit-queue",
                &self.endpoint,
                "--rabbit-exchange",
                &r.exchange,
            ]),
            BrokerEnv::Kafka(k) => {
                cmd.args(["--kafka-topic", &k.topic, "--kafka-group", &self.endpoint])
            }
        };
        if let Some(p) = crash_point {
            cmd.env("OUTBOX_CRASH_POINT", p);
        }
        ChildGuard::spawn(cmd, name)
    }

    /// Messages the broker still holds for this consumer: NATS `num_pending +
    /// num_ack_pending` of the durable; RabbitMQ the queue's ready messages (call it when no
    /// consumer holds unacknowledged deliveries: their channel closed, so they were requeued);
    /// Kafka the group's lag (end offsets minus committed offsets).
    async fn broker_backlog(&self) -> u64 {
        match &self.env.broker {
            BrokerEnv::Nats(n) => {
                let stream = n.js.get_stream(&n.stream).await.expect("stream");
                let mut c = stream
                    .get_consumer::<pull::Config>(&self.endpoint)
                    .await
                    .expect("durable");
                let info = c.info().await.expect("consumer info");
                info.num_pending + info.num_ack_pending as u64
            }
            BrokerEnv::Rabbit(r) => u64::from(
                r.channel
                    .queue_declare(
                        self.endpoint.as_str().into(),
                        QueueDeclareOptions {
                            passive: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .expect("queue.declare passive")
                    .message_count(),
            ),
            BrokerEnv::Kafka(k) => k.group_lag(&self.endpoint).await,
        }
    }
}

fn payment(id: &str, amount: i64) -> OutboxMessage {
    message(
        id,
        1,
        "PaymentCreated",
        json!({"payment_id": id, "amount": amount, "currency": "EUR"}),
    )
}

async fn events_applied(env: &Env, payment_id: &str) -> Option<i64> {
    sqlx::query_scalar::<_, i32>(sqlx::AssertSqlSafe(
        env.db
            .sql("SELECT events_applied FROM {s}.payment_report WHERE payment_id = $1"),
    ))
    .bind(payment_id)
    .fetch_optional(&env.db.pool)
    .await
    .expect("payment_report")
    .map(i64::from)
}

async fn inbox_rows_of(env: &Env, event_id: Uuid) -> i64 {
    env.db
        .scalar(&format!(
            "SELECT count(*) FROM {{s}}.inbox WHERE event_id = '{event_id}'"
        ))
        .await
}

async fn crash_and_restart(kind: Kind, point: &str) {
    let env = Env::new(kind).await;
    let consumer = Consumer {
        endpoint: env.endpoint_name(),
        env: &env,
        config: TempFile::new(
            ".toml",
            "[kafka_consumer.properties]\n\"session.timeout.ms\" = \"6000\"\n\
             \"heartbeat.interval.ms\" = \"1000\"\n",
        ),
    };
    // RabbitMQ: the queue exists (as the process declares it) before anything is published.
    env.declare_queue(&consumer.endpoint).await;
    let pay = format!("pay-{}", uid());
    let msg = payment(&pay, 123);

    let mut first = consumer.spawn(Some(point), "demo-consumer-with-crash-point");
    env.publish(&msg).await;
    let status = first.wait_exit(T).await;
    assert!(
        !status.success(),
        "the consumer must die at {point}, got {status}; log:\n{}",
        first.log()
    );
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            status.signal(),
            Some(6),
            "SIGABRT expected; log:\n{}",
            first.log()
        );
    }
    assert!(
        first
            .log()
            .contains(&format!("crash point {point} reached")),
        "{}",
        first.log()
    );
    let after_commit = point == "consumer.after_commit";
    if after_commit {
        // Committed exactly once, never acknowledged.
        assert_eq!(events_applied(&env, &pay).await, Some(1));
        assert_eq!(inbox_rows_of(&env, msg.event_id).await, 1);
    } else {
        // Nothing committed: neither the effect nor the inbox identity.
        assert_eq!(events_applied(&env, &pay).await, None, "effect leaked");
        assert_eq!(
            inbox_rows_of(&env, msg.event_id).await,
            0,
            "inbox row leaked"
        );
    }
    // The delivery was never acknowledged (G6): the broker still holds it (RabbitMQ requeues
    // it once it noticed the dead connection).
    wait_until(
        Duration::from_secs(5),
        "the broker still holds the unacknowledged delivery",
        || async { consumer.broker_backlog().await == 1 },
    )
    .await;
    assert_eq!(
        env.db
            .scalar("SELECT count(*) FROM {s}.payment_report")
            .await,
        i64::from(after_commit)
    );

    let mut second = consumer.spawn(None, "demo-consumer-restarted");
    // A second payment after the crashed one: once it is applied, the restarted process is
    // consuming (on RabbitMQ the requeued delivery is ahead of it in the queue).
    let sentinel_id = format!("pay-{}", uid());
    env.publish(&payment(&sentinel_id, 1)).await;
    wait_until(
        T,
        "the restarted consumer applies the next payment",
        || async { events_applied(&env, &sentinel_id).await == Some(1) },
    )
    .await;
    wait_until(T, "the redelivery is settled", || async {
        events_applied(&env, &pay).await.is_some()
            && (kind == Kind::Rabbit || consumer.broker_backlog().await == 0)
    })
    .await;
    second.assert_running();
    let status = second.terminate().await;
    assert!(status.success(), "{status}; log:\n{}", second.log());
    // The restarted process got the crashed delivery again: after a commit the inbox absorbed
    // it as a duplicate; before one it was applied (two payments processed).
    let stopped = second
        .log()
        .lines()
        .find(|l| l.contains("consumer stopped"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no final counts in the log:\n{}", second.log()));
    let count = |field: &str| -> u64 {
        stopped
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{field}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {field} in: {stopped}"))
    };
    if after_commit {
        assert_eq!(count("processed"), 1, "only the next payment: {stopped}");
        assert!(
            count("duplicates") >= 1,
            "the redelivery absorbed: {stopped}"
        );
    } else {
        assert_eq!(
            count("processed"),
            2,
            "the redelivery and the next payment: {stopped}"
        );
    }
    assert_eq!(
        consumer.broker_backlog().await,
        0,
        "everything acknowledged after the restart; log:\n{}",
        second.log()
    );
    assert_eq!(
        events_applied(&env, &pay).await,
        Some(1),
        "exactly one effect (G5)"
    );
    assert_eq!(inbox_rows_of(&env, msg.event_id).await, 1);
    assert_eq!(
        env.db
            .scalar("SELECT count(*) FROM {s}.consumer_dead_letters")
            .await,
        0
    );
    drop(first);
    drop(second);
    env.cleanup().await;
}
