//! Shared set-up of the end-to-end acceptance tests: real PostgreSQL, real NATS JetStream, real
//! RabbitMQ (a missing service fails loudly, never skips), one fresh schema / stream / exchange
//! per test, the `outbox` binary as a real child process, and a TCP proxy that simulates broker
//! outages without touching the shared servers.
#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox::broker::{BoxTransport, BrokerSettings};
use outbox_core::{NewMessage, Payload};
use outbox_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use outbox_kafka::rdkafka::message::Headers as _;
use outbox_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use outbox_kafka::{KafkaConfig, KafkaTransport};
use outbox_nats::async_nats;
use outbox_nats::async_nats::jetstream;
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_postgres::Schema;
use outbox_rabbitmq::{RabbitConfig, RabbitTransport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Runs each `async fn(Kind)` `$body` of the calling file as three tests, on NATS, RabbitMQ
/// and Kafka, named `$nats`, `$rabbitmq` and `$kafka`, each with the test attribute given
/// first (`#[tokio::test]` ...).
#[macro_export]
macro_rules! each_broker {
    (#[$attr:meta] $($body:ident => $nats:ident, $rabbitmq:ident, $kafka:ident;)+) => {$(
        #[$attr]
        async fn $nats() {
            $body($crate::common::Kind::Nats).await;
        }

        #[$attr]
        async fn $rabbitmq() {
            $body($crate::common::Kind::Rabbit).await;
        }

        #[$attr]
        async fn $kafka() {
            $body($crate::common::Kind::Kafka).await;
        }
    )+};
}

pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

pub fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

pub fn kafka_url() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".to_owned())
}

pub fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A fresh lower-case hex id (UUIDv7: 74 random bits, so parallel tests never collide).
pub fn uid() -> String {
    Uuid::now_v7().simple().to_string()
}

/// Polls `cond` every 25 ms until it holds; panics naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ------------------------------------------------------------------------------------------
// PostgreSQL
// ------------------------------------------------------------------------------------------

pub use outbox_testkit::pg::{TestDb, database_url};

/// `payment/<agg>` version `v` with a small JSON payload.
pub fn event(agg: &str, v: i64) -> NewMessage {
    NewMessage::new(
        "payment",
        agg,
        v,
        "PaymentUpdated",
        Payload::json(&serde_json::json!({"agg": agg, "v": v})).unwrap(),
    )
}

// ------------------------------------------------------------------------------------------
// What a subscriber saw on the wire
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub event_id: Uuid,
    pub aggregate_id: String,
    pub version: i64,
    /// Every header / property, normalised to strings.
    pub headers: BTreeMap<String, String>,
    pub payload: Vec<u8>,
}

/// A background subscriber collecting [`Received`] messages; aborted on drop.
pub struct Subscriber {
    items: Arc<Mutex<Vec<Received>>>,
    task: JoinHandle<()>,
    what: String,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Subscriber {
    pub fn snapshot(&self) -> Vec<Received> {
        self.items.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.items.lock().unwrap().len()
    }

    /// Waits until at least `n` messages arrived.
    pub async fn wait_len(&self, n: usize, timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let len = self.len();
            if len >= n {
                return self.snapshot();
            }
            assert!(
                !self.task.is_finished(),
                "{}: subscriber task ended after {len} messages",
                self.what
            );
            assert!(
                Instant::now() < deadline,
                "{}: only {len} of {n} messages arrived within {timeout:?}",
                self.what
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many of `ids` have not arrived yet.
    pub fn missing(&self, ids: &[Uuid]) -> usize {
        let arrived: std::collections::HashSet<Uuid> = self
            .items
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.event_id)
            .collect();
        ids.iter().filter(|id| !arrived.contains(id)).count()
    }

    /// Waits until every id in `ids` was seen at least once. Each look reads only what
    /// arrived since the last one (a copy of 100,000 messages every 20 ms would slow the
    /// test, and the relay beside it, more than the relay's own work).
    pub async fn wait_ids(&self, ids: &[Uuid], timeout: Duration) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        let mut missing: std::collections::HashSet<Uuid> = ids.iter().copied().collect();
        let mut read = 0;
        loop {
            {
                let items = self.items.lock().unwrap();
                for r in &items[read..] {
                    missing.remove(&r.event_id);
                }
                read = items.len();
            }
            if missing.is_empty() {
                return self.snapshot();
            }
            assert!(
                Instant::now() < deadline,
                "{}: {} of {} events never arrived within {timeout:?}, e.g. {:?}",
                self.what,
                missing.len(),
                ids.len(),
                missing.iter().next()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Copies of an event sent again (after a kill, a takeover, a recovery) are fine, same id;
/// the first appearances must be in version order per aggregate. Returns the ids seen.
pub fn assert_first_appearances_in_order(seen: Vec<Received>) -> std::collections::HashSet<Uuid> {
    let mut ids = std::collections::HashSet::new();
    let firsts: Vec<_> = seen
        .into_iter()
        .filter(|r| ids.insert(r.event_id))
        .collect();
    assert_strictly_increasing(&firsts);
    ids
}

/// Checks per-aggregate order: versions of each aggregate strictly increasing in arrival order.
pub fn assert_strictly_increasing(seen: &[Received]) {
    let mut last: BTreeMap<&str, i64> = BTreeMap::new();
    for r in seen {
        if let Some(prev) = last.get(r.aggregate_id.as_str()) {
            assert!(
                r.version > *prev,
                "aggregate {} went from version {prev} to {} (G7 violated)",
                r.aggregate_id,
                r.version
            );
        }
        last.insert(&r.aggregate_id, r.version);
    }
}

fn from_nats(m: &async_nats::Message) -> Received {
    let mut headers = BTreeMap::new();
    if let Some(h) = &m.headers {
        for (k, vs) in h.iter() {
            let v: Vec<&str> = vs.iter().map(|v| v.as_str()).collect();
            headers.insert(AsRef::<str>::as_ref(k).to_owned(), v.join(","));
        }
    }
    headers.insert("nats.subject".to_owned(), m.subject.to_string());
    let get = |k: &str| headers.get(k).cloned().unwrap_or_default();
    Received {
        event_id: get("ce-id").parse().unwrap_or_else(|_| Uuid::nil()),
        aggregate_id: get("ce-aggregateid"),
        version: get("ce-aggregateversion").parse().unwrap_or(-1),
        payload: m.payload.to_vec(),
        headers,
    }
}

fn amqp_string(v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        other => format!("{other:?}"),
    }
}

fn from_amqp(d: &lapin::message::Delivery) -> Received {
    let p = &d.properties;
    let mut headers = BTreeMap::new();
    if let Some(h) = p.headers() {
        for (k, v) in h.inner() {
            headers.insert(k.as_str().to_owned(), amqp_string(v));
        }
    }
    let mut prop = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            headers.insert(format!("amqp.{k}"), v);
        }
    };
    prop(
        "message_id",
        p.message_id().as_ref().map(|s| s.as_str().to_owned()),
    );
    prop(
        "content_type",
        p.content_type().as_ref().map(|s| s.as_str().to_owned()),
    );
    prop("type", p.kind().as_ref().map(|s| s.as_str().to_owned()));
    prop("timestamp", p.timestamp().map(|t| t.to_string()));
    prop("delivery_mode", p.delivery_mode().map(|t| t.to_string()));
    prop("routing_key", Some(d.routing_key.as_str().to_owned()));
    let get = |k: &str| headers.get(k).cloned().unwrap_or_default();
    Received {
        event_id: get("amqp.message_id")
            .parse()
            .unwrap_or_else(|_| Uuid::nil()),
        aggregate_id: get("cloudEvents_aggregateid"),
        version: get("cloudEvents_aggregateversion").parse().unwrap_or(-1),
        payload: d.data.clone(),
        headers,
    }
}

// ------------------------------------------------------------------------------------------
// NATS JetStream
// ------------------------------------------------------------------------------------------

pub async fn nats_client(url: &str) -> async_nats::Client {
    tokio::time::timeout(Duration::from_secs(10), async_nats::connect(url))
        .await
        .unwrap_or_else(|_| panic!("NATS at {url} is required: connect timed out"))
        .unwrap_or_else(|e| panic!("NATS at {url} is required (set OUTBOX_TEST_NATS_URL): {e}"))
}

/// A per-test JetStream stream capturing `<prefix>.>`.
pub struct NatsEnv {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub stream: String,
    pub prefix: String,
}

impl NatsEnv {
    pub async fn new() -> NatsEnv {
        let client = nats_client(&nats_url()).await;
        let js = jetstream::new(client.clone());
        let id = uid();
        let stream = format!("T_{}", id.to_uppercase());
        let prefix = format!("t{id}");
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            duplicate_window: Duration::from_secs(120),
            max_age: Duration::from_secs(3600),
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "JetStream at {} is required (nats-server -js): {e}",
                nats_url()
            )
        });
        NatsEnv {
            client,
            js,
            stream,
            prefix,
        }
    }

    pub fn subject_template(&self) -> String {
        format!("{}.{{aggregate_type}}.{{event_type}}", self.prefix)
    }

    pub fn config(&self) -> NatsConfig {
        NatsConfig {
            stream: self.stream.clone(),
            stream_subjects: vec![format!("{}.>", self.prefix)],
            subject_template: self.subject_template(),
            ack_timeout_secs: 2,
            connect_timeout_secs: 3,
            ..NatsConfig::default()
        }
    }

    /// The `[nats]` table of a config file.
    pub fn toml(&self) -> String {
        format!(
            "[nats]\nstream = \"{}\"\nstream_subjects = [\"{}.>\"]\nsubject_template = \"{}\"\nack_timeout_secs = 2\nconnect_timeout_secs = 3\n",
            self.stream,
            self.prefix,
            self.subject_template()
        )
    }

    pub async fn transport(&self, url: &str) -> NatsTransport {
        NatsTransport::connect(url, self.config())
            .await
            .unwrap_or_else(|e| panic!("NATS transport at {url}: {e}"))
    }

    /// An in-process relay from `db` to this stream (polling every 50 ms), until the token is
    /// cancelled; await the handle after cancelling.
    pub async fn start_relay(
        &self,
        db: &TestDb,
    ) -> (
        tokio_util::sync::CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let transport = self.transport(&nats_url()).await;
        let relay = Arc::new(
            outbox_core::relay::Relay::new(
                Arc::new(db.store()),
                Arc::new(transport),
                outbox_core::relay::RelayConfig {
                    poll_interval: Duration::from_millis(50),
                    ..outbox_core::relay::RelayConfig::default()
                },
            )
            .expect("relay config"),
        );
        let stop = tokio_util::sync::CancellationToken::new();
        // With its heartbeat, as `outbox relay` runs one (the console shows both).
        let beat = outbox_postgres::heartbeat::Heartbeat::new(
            outbox_postgres::PgStore::with_schema(db.pool.clone(), db.store().schema().clone()),
            outbox_postgres::heartbeat::InstanceKind::Relay,
            "polling",
        )
        .expect("heartbeat")
        .with_interval(Duration::from_secs(1))
        .with_publish_activity(relay.activity())
        .with_health(relay.health());
        let beat = tokio::spawn(beat.run(stop.clone()));
        let run = Arc::clone(&relay).run(stop.clone());
        let task = tokio::spawn(async move {
            run.await;
            let _ = beat.await;
        });
        (stop, task)
    }

    /// An independent JetStream pull consumer reading the stream from the start: what the
    /// stream stores, in stream order.
    pub async fn stream_subscriber(&self) -> Subscriber {
        let stream = self.js.get_stream(&self.stream).await.expect("stream");
        let consumer = stream
            .create_consumer(jetstream::consumer::pull::Config {
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ack_policy: jetstream::consumer::AckPolicy::None,
                inactive_threshold: Duration::from_secs(300),
                ..Default::default()
            })
            .await
            .expect("pull consumer");
        let mut messages = consumer.messages().await.expect("consumer messages");
        let items = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&items);
        let task = tokio::spawn(async move {
            while let Some(m) = messages.next().await {
                match m {
                    Ok(m) => sink.lock().unwrap().push(from_nats(&m)),
                    Err(e) => eprintln!("jetstream consumer error: {e}"),
                }
            }
        });
        Subscriber {
            items,
            task,
            what: format!("JetStream consumer on {}", self.stream),
        }
    }

    /// A core NATS subscription on `<prefix>.>`: every copy on the wire, including republishes
    /// that JetStream deduplicated.
    pub async fn core_subscriber(&self) -> Subscriber {
        let mut sub = self
            .client
            .subscribe(format!("{}.>", self.prefix))
            .await
            .expect("subscribe");
        self.client.flush().await.expect("flush");
        let items = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&items);
        let task = tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                sink.lock().unwrap().push(from_nats(&m));
            }
        });
        Subscriber {
            items,
            task,
            what: format!("core subscription on {}.>", self.prefix),
        }
    }

    /// Messages stored in the stream.
    pub async fn stream_len(&self) -> u64 {
        let mut s = self.js.get_stream(&self.stream).await.expect("stream");
        s.info().await.expect("stream info").state.messages
    }

    pub async fn cleanup(self) {
        self.js
            .delete_stream(&self.stream)
            .await
            .expect("delete stream");
    }
}

// ------------------------------------------------------------------------------------------
// RabbitMQ
// ------------------------------------------------------------------------------------------

pub async fn amqp_connection() -> Connection {
    tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(&amqp_url(), ConnectionProperties::default()),
    )
    .await
    .unwrap_or_else(|_| panic!("RabbitMQ at {} is required: connect timed out", amqp_url()))
    .unwrap_or_else(|e| {
        panic!(
            "RabbitMQ at {} is required (set OUTBOX_TEST_AMQP_URL): {e}",
            amqp_url()
        )
    })
}

/// A per-test topic exchange and a queue bound to it with `#`.
pub struct RabbitEnv {
    pub connection: Connection,
    pub channel: Channel,
    pub exchange: String,
    pub queue: String,
}

impl RabbitEnv {
    pub async fn new() -> RabbitEnv {
        let connection = amqp_connection().await;
        let channel = connection.create_channel().await.expect("channel");
        let id = uid();
        let exchange = format!("outbox-e2e-x-{id}");
        let queue = format!("outbox-e2e-q-{id}");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("exchange.declare");
        let mut args = FieldTable::default();
        // A queue a crashed test leaves behind disappears by itself.
        args.insert("x-expires".into(), AMQPValue::LongUInt(600_000));
        channel
            .queue_declare(queue.as_str().into(), QueueDeclareOptions::durable(), args)
            .await
            .expect("queue.declare");
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("queue.bind");
        RabbitEnv {
            connection,
            channel,
            exchange,
            queue,
        }
    }

    pub fn config(&self) -> RabbitConfig {
        RabbitConfig {
            exchange: self.exchange.clone(),
            routing_key_template: "{aggregate_type}.{aggregate_id}".to_owned(),
            reconnect_min_delay_ms: 200,
            connect_timeout_secs: 3,
            confirm_timeout_secs: 5,
            ..RabbitConfig::default()
        }
    }

    /// The `[rabbitmq]` table of a config file; `extra` adds lines.
    pub fn toml(&self, extra: &str) -> String {
        format!(
            "[rabbitmq]\nexchange = \"{}\"\nrouting_key_template = \"{{aggregate_type}}.{{aggregate_id}}\"\nreconnect_min_delay_ms = 200\nconnect_timeout_secs = 3\nconfirm_timeout_secs = 5\n{extra}\n",
            self.exchange
        )
    }

    pub async fn transport(&self, url: &str) -> RabbitTransport {
        RabbitTransport::connect(url, self.config())
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ transport at {url}: {e}"))
    }

    /// An independent consumer of the test queue (auto-ack), in delivery order.
    pub async fn subscriber(&self) -> Subscriber {
        let channel = self.connection.create_channel().await.expect("channel");
        let mut consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                format!("e2e-{}", uid()).as_str().into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("basic.consume");
        let items = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&items);
        let task = tokio::spawn(async move {
            let _channel = channel;
            while let Some(d) = consumer.next().await {
                match d {
                    Ok(d) => sink.lock().unwrap().push(from_amqp(&d)),
                    Err(e) => {
                        eprintln!("amqp consumer error: {e}");
                        break;
                    }
                }
            }
        });
        Subscriber {
            items,
            task,
            what: format!("RabbitMQ queue {}", self.queue),
        }
    }

    pub async fn cleanup(self) {
        self.channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .expect("queue.delete");
        self.channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await
            .expect("exchange.delete");
        let _ = self.connection.close(200, "bye".into()).await;
    }
}

// ------------------------------------------------------------------------------------------
// Kafka
// ------------------------------------------------------------------------------------------

/// Partitions of a test topic: several, so keys (aggregates) really spread.
pub const KAFKA_PARTITIONS: i32 = 4;

pub fn kafka_client() -> outbox_kafka::rdkafka::ClientConfig {
    kafka_client_of(&kafka_url())
}

/// A client configuration for the broker at `url`.
pub fn kafka_client_of(url: &str) -> outbox_kafka::rdkafka::ClientConfig {
    let mut config = outbox_kafka::rdkafka::ClientConfig::new();
    config.set(
        "bootstrap.servers",
        outbox_kafka::bootstrap_servers(url).expect("a kafka:// URL"),
    );
    config
}

/// A per-test topic of [`KAFKA_PARTITIONS`] partitions; every event goes there.
pub struct KafkaEnv {
    pub topic: String,
    /// The broker: the shared one, or a private one behind an outage proxy.
    pub url: String,
}

impl KafkaEnv {
    pub async fn new() -> KafkaEnv {
        Self::on(kafka_url()).await
    }

    /// A topic on the broker at `url`.
    pub async fn on(url: String) -> KafkaEnv {
        let topic = format!("outboxe2e{}", uid());
        let admin: AdminClient<_> = kafka_client_of(&url).create().expect("admin client");
        let created = tokio::time::timeout(
            Duration::from_secs(20),
            admin.create_topics(
                [&NewTopic::new(
                    &topic,
                    KAFKA_PARTITIONS,
                    TopicReplication::Fixed(1),
                )],
                &AdminOptions::new(),
            ),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "Kafka at {url} is required (set OUTBOX_TEST_KAFKA_URL; `bash scripts/services` \
                 starts it): creating a topic timed out"
            )
        })
        .unwrap_or_else(|e| panic!("Kafka at {url} is required: {e}"));
        for result in created {
            result.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e}"));
        }
        KafkaEnv { topic, url }
    }

    pub fn config(&self) -> KafkaConfig {
        KafkaConfig {
            topic_template: Some(self.topic.clone()),
            delivery_timeout_secs: 2,
            connect_timeout_secs: 3,
            ..KafkaConfig::default()
        }
    }

    /// The `[kafka]` table of a config file.
    pub fn toml(&self) -> String {
        format!(
            "[kafka]\ntopic_template = \"{}\"\ndelivery_timeout_secs = 2\nconnect_timeout_secs = 3\n",
            self.topic
        )
    }

    pub async fn transport(&self, url: &str) -> KafkaTransport {
        KafkaTransport::connect(url, self.config())
            .await
            .unwrap_or_else(|e| panic!("Kafka transport at {url}: {e}"))
    }

    /// An independent reader of every partition of the topic from its start, in arrival order
    /// (each partition in order; an aggregate's events share one partition).
    pub async fn subscriber(&self) -> Subscriber {
        let consumer: BaseConsumer = kafka_client_of(&self.url)
            .set("group.id", format!("e2e-reader-{}", uid()))
            .set("enable.auto.commit", "false")
            .create()
            .expect("Kafka reader");
        let mut list = TopicPartitionList::new();
        for p in 0..KAFKA_PARTITIONS {
            list.add_partition_offset(&self.topic, p, Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&list).expect("assign");
        let consumer = Arc::new(consumer);
        let items = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&items);
        let task = tokio::spawn(async move {
            loop {
                let c = Arc::clone(&consumer);
                let got = tokio::task::spawn_blocking(move || {
                    let mut got = Vec::new();
                    if let Some(m) = c.poll(Duration::from_millis(100)) {
                        match m {
                            Ok(m) => got.push(from_kafka(&m)),
                            Err(e) => eprintln!("Kafka reader error: {e}"),
                        }
                        while let Some(Ok(m)) = c.poll(Duration::ZERO) {
                            got.push(from_kafka(&m));
                        }
                    }
                    got
                })
                .await
                .expect("Kafka reader poll");
                sink.lock().unwrap().extend(got);
            }
        });
        Subscriber {
            items,
            task,
            what: format!("Kafka reader of {}", self.topic),
        }
    }

    /// Where each of `ids` is stored on the topic, read again from the start of every
    /// partition up to its high watermark by a fresh reader (at most 20 s): `(event id,
    /// partition, offset)` of every copy found. For a test that misses events, to tell a
    /// reader that did not see them from a topic that does not hold them.
    pub async fn find(&self, ids: &[uuid::Uuid]) -> Vec<(uuid::Uuid, i32, i64)> {
        let consumer: BaseConsumer = kafka_client_of(&self.url)
            .set("group.id", format!("e2e-finder-{}", uid()))
            .set("enable.auto.commit", "false")
            // Every stored record, whatever the broker says of transactions (the relay's
            // idempotent producer writes none).
            .set("isolation.level", "read_uncommitted")
            .create()
            .expect("Kafka reader");
        let topic = self.topic.clone();
        let wanted: std::collections::HashSet<uuid::Uuid> = ids.iter().copied().collect();
        tokio::task::spawn_blocking(move || {
            use outbox_kafka::rdkafka::Message as _;
            let mut list = TopicPartitionList::new();
            let mut ends = std::collections::HashMap::new();
            for p in 0..KAFKA_PARTITIONS {
                let (_, high) = consumer
                    .fetch_watermarks(&topic, p, Duration::from_secs(10))
                    .expect("watermarks");
                ends.insert(p, high);
                list.add_partition_offset(&topic, p, Offset::Beginning)
                    .expect("partition");
            }
            consumer.assign(&list).expect("assign");
            let mut found = Vec::new();
            let mut done = std::collections::HashSet::new();
            let deadline = Instant::now() + Duration::from_secs(20);
            while done.len() < ends.len() && Instant::now() < deadline {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
                    continue;
                };
                let r = from_kafka(&m);
                if wanted.contains(&r.event_id) {
                    found.push((r.event_id, m.partition(), m.offset()));
                }
                if m.offset() + 1 >= ends[&m.partition()] {
                    done.insert(m.partition());
                }
            }
            found
        })
        .await
        .expect("Kafka finder")
    }

    /// The lag of consumer group `group` on the topic: end offsets minus committed offsets (the
    /// start of the partition where nothing is committed).
    pub async fn group_lag(&self, group: &str) -> u64 {
        let consumer: BaseConsumer = kafka_client_of(&self.url)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("Kafka client");
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || {
            let mut list = TopicPartitionList::new();
            for p in 0..KAFKA_PARTITIONS {
                list.add_partition(&topic, p);
            }
            let committed = consumer
                .committed_offsets(list, Duration::from_secs(10))
                .expect("committed offsets");
            let mut lag = 0;
            for e in committed.elements() {
                let (low, high) = consumer
                    .fetch_watermarks(&topic, e.partition(), Duration::from_secs(10))
                    .expect("watermarks");
                let from = match e.offset() {
                    Offset::Offset(o) => o,
                    _ => low,
                };
                lag += u64::try_from(high - from).unwrap_or(0);
            }
            lag
        })
        .await
        .expect("lag task")
    }

    /// Nothing to remove: the topic stays. tansu 0.6 answers the metadata request of a
    /// consumer still subscribed to a deleted topic in a way that crashes librdkafka 2.12, and
    /// a consumer process of the test may still be leaving its group. Topics live in the test
    /// broker's memory until it restarts.
    pub async fn cleanup(self) {}
}

fn from_kafka<M: outbox_kafka::rdkafka::message::Message>(m: &M) -> Received {
    let mut headers = BTreeMap::new();
    if let Some(h) = m.headers() {
        for header in h.iter() {
            let value = String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned();
            headers
                .entry(header.key.to_owned())
                .and_modify(|v: &mut String| {
                    v.push(',');
                    v.push_str(&value);
                })
                .or_insert(value);
        }
    }
    headers.insert("kafka.topic".to_owned(), m.topic().to_owned());
    headers.insert("kafka.partition".to_owned(), m.partition().to_string());
    if let Some(key) = m.key() {
        headers.insert(
            "kafka.key".to_owned(),
            String::from_utf8_lossy(key).into_owned(),
        );
    }
    let get = |k: &str| headers.get(k).cloned().unwrap_or_default();
    Received {
        event_id: get("ce_id").parse().unwrap_or_else(|_| Uuid::nil()),
        aggregate_id: get("ce_aggregateid"),
        version: get("ce_aggregateversion").parse().unwrap_or(-1),
        payload: m.payload().unwrap_or_default().to_vec(),
        headers,
    }
}

// ------------------------------------------------------------------------------------------
// Any broker
// ------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Nats,
    Rabbit,
    Kafka,
}

pub enum BrokerEnv {
    Nats(NatsEnv),
    Rabbit(RabbitEnv),
    Kafka(KafkaEnv),
}

impl BrokerEnv {
    pub async fn new(kind: Kind) -> BrokerEnv {
        match kind {
            Kind::Nats => Self::Nats(NatsEnv::new().await),
            Kind::Rabbit => Self::Rabbit(RabbitEnv::new().await),
            Kind::Kafka => Self::Kafka(KafkaEnv::new().await),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Self::Nats(_) => Kind::Nats,
            Self::Rabbit(_) => Kind::Rabbit,
            Self::Kafka(_) => Kind::Kafka,
        }
    }

    /// The real broker's URL.
    pub fn url(&self) -> String {
        match self {
            Self::Nats(_) => nats_url(),
            Self::Rabbit(_) => amqp_url(),
            Self::Kafka(k) => k.url.clone(),
        }
    }

    /// The broker table of a config file (`rabbit_extra` adds lines to `[rabbitmq]`).
    pub fn toml(&self, rabbit_extra: &str) -> String {
        match self {
            Self::Nats(n) => n.toml(),
            Self::Rabbit(r) => r.toml(rabbit_extra),
            Self::Kafka(k) => k.toml(),
        }
    }

    /// The broker settings of this environment (its stream / exchange), as the binary reads
    /// them from its config file.
    pub fn settings(&self) -> BrokerSettings {
        let table: toml::Table = toml::from_str(&self.toml("")).expect("valid broker table");
        let mut settings = BrokerSettings::new();
        for (name, value) in table {
            settings.set_section(name, serde_json::to_value(value).expect("json"));
        }
        settings
    }

    /// The relay's transport for `url`, chosen by the broker registry as `outbox relay` does.
    pub async fn transport(&self, url: &str) -> BoxTransport {
        outbox::brokers()
            .connect_transport(url, &self.settings())
            .await
            .unwrap_or_else(|e| panic!("transport at {url}: {e}"))
    }

    /// The independent subscriber: the stream's content (NATS), the bound queue (RabbitMQ),
    /// or the topic's partitions (Kafka).
    pub async fn subscriber(&self) -> Subscriber {
        match self {
            Self::Nats(n) => n.stream_subscriber().await,
            Self::Rabbit(r) => r.subscriber().await,
            Self::Kafka(k) => k.subscriber().await,
        }
    }

    pub async fn cleanup(self) {
        match self {
            Self::Nats(n) => n.cleanup().await,
            Self::Rabbit(r) => r.cleanup().await,
            Self::Kafka(k) => k.cleanup().await,
        }
    }
}

/// `host:port` of a broker URL.
pub fn host_port(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    rest.split('/').next().unwrap().to_owned()
}

/// `url` with its `host:port` replaced.
pub fn with_host_port(url: &str, addr: SocketAddr) -> String {
    url.replacen(&host_port(url), &addr.to_string(), 1)
}

// ------------------------------------------------------------------------------------------
// The outage proxy
// ------------------------------------------------------------------------------------------

/// A TCP proxy in front of a real broker. `set_down` drops every live connection and closes new
/// ones at once; `set_up` forwards again. The shared broker is never touched.
pub struct Proxy {
    pub addr: SocketAddr,
    up: Arc<AtomicBool>,
    kill: Arc<Mutex<CancellationToken>>,
    /// Cancelled by [`Proxy::set_blackhole`] and [`Proxy::set_cut_behind`].
    freeze: CancellationToken,
    /// Whether the freeze closes the upstream side ([`Proxy::set_cut_behind`]).
    close_upstream: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let kill = Arc::new(Mutex::new(CancellationToken::new()));
        let (up2, kill2) = (Arc::clone(&up), Arc::clone(&kill));
        let freeze = CancellationToken::new();
        let freeze2 = freeze.clone();
        let close_upstream = Arc::new(AtomicBool::new(false));
        let close_upstream2 = Arc::clone(&close_upstream);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let token = kill2.lock().unwrap().clone();
                if freeze2.is_cancelled() {
                    // A black hole: the connection is held open, nothing goes through.
                    tokio::spawn(async move {
                        token.cancelled().await;
                        drop(client);
                    });
                    continue;
                }
                let frozen = freeze2.clone();
                let close_upstream = Arc::clone(&close_upstream2);
                if !up2.load(Ordering::SeqCst) {
                    // Down: the client's connection closes at once.
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    tokio::select! {
                        // Down: both sides are dropped, the client sees its connection close.
                        () = token.cancelled() => {}
                        // A black hole: nothing goes through any more, both sides stay open.
                        () = frozen.cancelled() => {
                            if close_upstream.load(Ordering::SeqCst) {
                                drop(server);
                            }
                            token.cancelled().await;
                        }
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            up,
            kill,
            freeze,
            close_upstream,
            task,
        }
    }

    /// The connections end behind the proxy, not in front of it: the upstream server sees
    /// each one closed at once, the client sees nothing at all, as when a server ended a
    /// connection whose FIN never reached the client (a NAT or firewall that dropped it).
    pub fn set_cut_behind(&self) {
        self.close_upstream.store(true, Ordering::SeqCst);
        self.freeze.cancel();
    }

    /// A network partition: every connection, live or new, stays open and carries nothing
    /// more, in either direction (until the proxy is dropped). Neither side sees it closed.
    pub fn set_blackhole(&self) {
        self.freeze.cancel();
    }

    pub fn set_down(&self) {
        self.up.store(false, Ordering::SeqCst);
        let old = std::mem::take(&mut *self.kill.lock().unwrap());
        old.cancel();
    }

    pub fn set_up(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.kill.lock().unwrap().cancel();
    }
}

// ------------------------------------------------------------------------------------------
// The `outbox` binary
// ------------------------------------------------------------------------------------------

/// A temporary file, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(suffix: &str, contents: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("outbox-e2e-{}{suffix}", uid()));
        std::fs::write(&path, contents).expect("write temp file");
        TempFile(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A config file with short relay intervals plus `tables` (broker tables, extra `[relay]` keys
/// must go in `relay_extra`).
pub fn config_file(relay_extra: &str, tables: &str) -> TempFile {
    let text = format!(
        "[relay]\npoll_interval_ms = 50\nstats_interval_secs = 1\nlease_secs = 2\npublish_timeout_secs = 0.5\nlease_safety_margin_secs = 0.2\nbackoff_base_ms = 100\nbackoff_max_secs = 1\n{relay_extra}\n{tables}\n"
    );
    TempFile::new(".toml", &text)
}

/// `outbox` with a clean environment: database, schema, broker and config set explicitly
/// when given.
pub fn outbox(
    schema: Option<&str>,
    broker_url: Option<&str>,
    config: Option<&Path>,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_outbox"));
    for var in [
        "DATABASE_URL",
        "OUTBOX_DATABASE_URL",
        "OUTBOX_BROKER_URL",
        "OUTBOX_SCHEMA",
        "OUTBOX_CONFIG",
        "OUTBOX_CRASH_POINT",
        "OUTBOX_CRASH_SKIP",
        "OUTBOX_CRASH_ACTION",
        "OUTBOX_CRASH_KEY",
        "OUTBOX_TEST_ACK_BEFORE_COMMIT",
        "OUTBOX_METRICS_ADDR",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("OUTBOX_DATABASE_URL", database_url())
        .env("RUST_LOG", "info,sqlx=warn")
        .stdin(Stdio::null());
    if let Some(s) = schema {
        cmd.env("OUTBOX_SCHEMA", s);
    }
    if let Some(b) = broker_url {
        cmd.env("OUTBOX_BROKER_URL", b);
    }
    if let Some(c) = config {
        cmd.env("OUTBOX_CONFIG", c);
    }
    cmd
}

#[derive(Debug)]
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a command to completion (killed after `timeout`).
pub async fn run(cmd: std::process::Command, timeout: Duration) -> Run {
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let out = tokio::time::timeout(timeout, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{cmd:?} did not finish within {timeout:?}"))
        .expect("spawn outbox");
    Run {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A long-running child process, killed (SIGKILL) and reaped on drop, also on panic. Its
/// output goes to a log file, printed when the test panics.
pub struct ChildGuard {
    child: std::process::Child,
    exited: Option<ExitStatus>,
    log: PathBuf,
    pub name: String,
}

impl ChildGuard {
    pub fn spawn(mut cmd: std::process::Command, name: &str) -> ChildGuard {
        let log = std::env::temp_dir().join(format!("outbox-e2e-{name}-{}.log", uid()));
        let file = std::fs::File::create(&log).expect("log file");
        cmd.stdout(file.try_clone().unwrap()).stderr(file);
        let child = cmd.spawn().expect("spawn outbox");
        ChildGuard {
            child,
            exited: None,
            log,
            name: name.to_owned(),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn poll(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().expect("try_wait");
        }
        self.exited
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub async fn try_wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.poll() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the process to exit by itself.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.poll() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}; log:\n{}",
                self.name,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asserts the process is still running.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.poll() {
            panic!(
                "{} exited unexpectedly with {status}; log:\n{}",
                self.name,
                self.log()
            );
        }
    }

    /// SIGKILL, then waits for the exit.
    pub async fn sigkill(&mut self) {
        if self.poll().is_none() {
            let _ = self.child.kill();
        }
        self.wait_exit(Duration::from_secs(10)).await;
    }

    /// SIGTERM, then waits for the exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        if self.poll().is_none() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &self.id().to_string()])
                .status();
        }
        self.wait_exit(Duration::from_secs(10)).await
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.poll().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- {} log ----\n{}", self.name, self.log());
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

/// `GET path` on 127.0.0.1:`port` over a plain TCP connection: the status code and the body.
pub async fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("endpoint 127.0.0.1:{port}: {e}"));
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("GET {path} timed out"))
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("GET {path}: not an HTTP/1.1 answer: {text}"));
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    (status, body)
}

/// `GET /metrics`: the exposition (a status other than 200 fails the test).
pub async fn scrape_metrics(port: u16) -> String {
    let (status, text) = http_get(port, "/metrics").await;
    assert_eq!(status, 200, "metrics response: {text}");
    text
}

/// Sum of every series of `name` in a Prometheus text exposition (`None` if absent).
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let value: f64 = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("bad metric line {line}"));
        *total.get_or_insert(0.0) += value;
    }
    total
}

/// Asserts a CLI failure: non-zero exit, stderr naming each of `needles`, no panic.
pub fn assert_clean_failure(r: &Run, needles: &[&str]) {
    assert!(
        !r.status.success(),
        "expected a failure, got {}\nstdout: {}\nstderr: {}",
        r.status,
        r.stdout,
        r.stderr
    );
    for n in needles {
        assert!(
            r.stderr.contains(n),
            "stderr does not mention `{n}`:\n{}",
            r.stderr
        );
    }
    assert!(
        !r.stderr.contains("panicked"),
        "the binary panicked instead of reporting an error:\n{}",
        r.stderr
    );
}

// ------------------------------------------------------------------------------------------
// Least-privilege roles
// ------------------------------------------------------------------------------------------

#[path = "../../../outbox-postgres/tests/support/login_roles.rs"]
mod login_roles;
pub use login_roles::LoginRoles;

/// Login roles for one test on the test database.
pub async fn login_roles() -> LoginRoles {
    LoginRoles::new(&database_url()).await
}

/// Creates a login role per component and grants each its component's grants in `schema`
/// (as the superuser, who acts as the owner). Returns the roles by component.
pub async fn roles_per_component(
    roles: &mut LoginRoles,
    schema: &Schema,
) -> BTreeMap<outbox_postgres::Component, String> {
    use outbox_postgres::{Component, RoleName, RolePlan};
    let mut plan = RolePlan::new(schema.clone());
    let mut by = BTreeMap::new();
    for c in Component::ALL {
        if c == Component::Migrator {
            continue;
        }
        let name = roles.create(c.as_str()).await;
        plan = plan.with_role(c, RoleName::new(&name).unwrap());
        by.insert(c, name);
    }
    plan.apply_grants(roles.admin()).await.expect("grants");
    by
}

/// `outbox` as [`outbox`] does, logged in to the database as `role`.
pub fn outbox_as(
    role: &str,
    schema: Option<&str>,
    broker_url: Option<&str>,
    config: Option<&Path>,
) -> std::process::Command {
    let mut cmd = outbox(schema, broker_url, config);
    cmd.env(
        "OUTBOX_DATABASE_URL",
        login_roles::url_as(&database_url(), role),
    );
    cmd
}

// ------------------------------------------------------------------------------------------
// The console's HTTP API
// ------------------------------------------------------------------------------------------

/// One request to the console; the status and the body as JSON (a string when not JSON).
pub async fn console_call(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, serde_json::Value) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{path}"))
        .header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = client
        .request(
            req.body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .unwrap(),
        )
        .await
        .expect("console request");
    let status = resp.status().as_u16();
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// `outbox console --listen 127.0.0.1:<port>` from `cmd` (an `outbox` or `outbox_as` command,
/// with its environment), once its readiness probe answers 200.
pub async fn spawn_console(mut cmd: std::process::Command, port: u16) -> ChildGuard {
    cmd.args(["console", "--listen", &format!("127.0.0.1:{port}")]);
    let mut console = ChildGuard::spawn(cmd, "console");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Ok(r)) =
            tokio::time::timeout(Duration::from_secs(2), console_call_quiet(port, "/readyz")).await
            && r == 200
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the console is not ready after 30 s; log:\n{}",
            console.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    console.assert_running();
    console
}

/// `outbox console` on `db`'s schema with `OUTBOX_CONSOLE_TOKEN=token`, on a free loopback
/// port, once ready (see [`spawn_console`]); its port and its process.
pub async fn spawn_console_with_token(db: &TestDb, token: &str) -> (u16, ChildGuard) {
    let port = free_port();
    let mut cmd = outbox(Some(db.name()), None, None);
    cmd.env("OUTBOX_CONSOLE_TOKEN", token);
    (port, spawn_console(cmd, port).await)
}

/// `GET path` of the console on `port`, without a token; the status and the body.
pub async fn console_get(port: u16, path: &str) -> (u16, serde_json::Value) {
    console_call(port, "GET", path, None, "").await
}

/// A GET's status, or the connection error (the console may not listen yet).
async fn console_call_quiet(port: u16, path: &str) -> Result<u16, String> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let uri = format!("http://127.0.0.1:{port}{path}").parse().unwrap();
    client
        .get(uri)
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| e.to_string())
}
