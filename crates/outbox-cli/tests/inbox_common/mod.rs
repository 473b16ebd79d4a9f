//! Shared set-up of the consumer-inbox acceptance tests (on top of `common`): one migrated
//! schema + one broker environment per test, delivery sources on a random durable / queue, an
//! instrumented source that logs every delivery and every ack / nack, a test handler writing
//! one row per effect (no unique key: a double effect shows up as two rows), and helpers to put
//! the same event on the wire several times.
#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::options::{
    BasicPublishOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use outbox::broker::{BoxSource, BoxTransport};
use outbox_core::Backoff;
use outbox_core::consumer::{ConsumerConfig, ConsumerReport, Handler, HandlerError, OrderingGuard};
use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceError};
use outbox_core::{DecodeError, Fingerprint, IncomingEvent, OutboxMessage, Payload, Transport};
use outbox_kafka::rdkafka::message::{Header, OwnedHeaders};
use outbox_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_kafka::{KafkaConsumerConfig, KafkaSource};
use outbox_nats::async_nats;
use outbox_nats::{NatsConsumerConfig, NatsSource, NatsTransport};
use outbox_postgres::{PgConsumer, PgStore};
use outbox_rabbitmq::{RabbitConsumerConfig, RabbitSource};
use outbox_testkit::tap::{Tap, Tapped};
use sqlx::{AssertSqlSafe, PgConnection};
use uuid::Uuid;

use crate::common::*;

/// Runs each named `async fn(Kind)` of the calling file as three tests, `<name>::nats`,
/// `<name>::rabbitmq` and `<name>::kafka`.
#[macro_export]
macro_rules! on_both_brokers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn nats() {
                super::$name(super::Kind::Nats).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn rabbitmq() {
                super::$name(super::Kind::Rabbit).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn kafka() {
                super::$name(super::Kind::Kafka).await;
            }
        }
    )*};
}

/// The body limit of most of the tests' sources: 1 MiB.
pub const MIB: usize = 1 << 20;
/// How long the tests wait for a consumer to settle what they published, or for a CLI command.
pub const T: Duration = Duration::from_secs(20);

/// NATS ack wait of the in-process sources: an unacknowledged delivery comes back after 1 s.
pub const ACK_WAIT_SECS: u64 = 1;
/// Longer than the ack wait: long enough to see a redelivery of anything not acknowledged.
pub const QUIET: Duration = Duration::from_millis(1600);

// ------------------------------------------------------------------------------------------
// The environment of one test
// ------------------------------------------------------------------------------------------

pub struct Env {
    pub db: TestDb,
    pub broker: BrokerEnv,
    /// The relay's transport, from the broker registry.
    pub transport: BoxTransport,
    /// NATS only: the transport's own subject and header rules, for hand-made publishes.
    pub nats_wire: Option<NatsTransport>,
    /// RabbitMQ queues created for sources, deleted at cleanup.
    queues: Mutex<Vec<String>>,
}

impl Env {
    pub async fn new(kind: Kind) -> Env {
        let db = TestDb::new().await;
        db.exec(
            "CREATE TABLE {s}.effects (id bigserial PRIMARY KEY, consumer text NOT NULL, \
             event_id uuid NOT NULL, aggregate_id text NOT NULL, version bigint NOT NULL, \
             payload text NOT NULL)",
        )
        .await;
        let broker = BrokerEnv::new(kind).await;
        let transport = broker.transport(&broker.url()).await;
        let nats_wire = match &broker {
            BrokerEnv::Nats(n) => Some(n.transport(&broker.url()).await),
            BrokerEnv::Rabbit(_) | BrokerEnv::Kafka(_) => None,
        };
        Env {
            db,
            nats_wire,
            broker,
            transport,
            queues: Mutex::new(Vec::new()),
        }
    }

    pub fn kind(&self) -> Kind {
        self.broker.kind()
    }

    /// A random durable (NATS) / queue (RabbitMQ) name.
    pub fn endpoint_name(&self) -> String {
        match self.kind() {
            Kind::Nats => format!("inbox-{}", uid()),
            Kind::Rabbit => format!("outbox-e2e-inbox-{}", uid()),
            Kind::Kafka => format!("inbox-{}", uid()),
        }
    }

    /// Declares the RabbitMQ queue `name` (durable, no arguments: what `RabbitSource` and the
    /// `outbox demo-consumer` declare) bound with `#` to the test exchange; remembered for
    /// cleanup. Nothing on NATS (the durable is created by the source).
    pub async fn declare_queue(&self, name: &str) {
        if let BrokerEnv::Rabbit(r) = &self.broker {
            r.channel
                .queue_declare(
                    name.into(),
                    QueueDeclareOptions::durable(),
                    FieldTable::default(),
                )
                .await
                .expect("queue.declare");
            r.channel
                .queue_bind(
                    name.into(),
                    r.exchange.as_str().into(),
                    "#".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .expect("queue.bind");
            self.queues.lock().unwrap().push(name.to_owned());
        }
    }

    /// A connected source on the durable / queue `endpoint` (declared and bound here, so
    /// messages published after this call reach it).
    pub async fn source(&self, endpoint: &str, max_message_bytes: usize) -> Src {
        self.source_with(endpoint, max_message_bytes, 256).await
    }

    pub async fn source_with(
        &self,
        endpoint: &str,
        max_message_bytes: usize,
        prefetch: u32,
    ) -> Src {
        match &self.broker {
            BrokerEnv::Nats(n) => src(NatsSource::connect(
                &nats_url(),
                NatsConsumerConfig {
                    stream: n.stream.clone(),
                    durable_name: endpoint.to_owned(),
                    ack_wait_secs: ACK_WAIT_SECS,
                    max_message_bytes,
                    ..NatsConsumerConfig::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("NatsSource: {e}"))),
            BrokerEnv::Rabbit(r) => {
                self.declare_queue(endpoint).await;
                src(RabbitSource::connect(
                    &amqp_url(),
                    RabbitConsumerConfig {
                        queue: endpoint.to_owned(),
                        bind_exchange: Some(r.exchange.clone()),
                        binding_key: "#".into(),
                        prefetch,
                        max_message_bytes,
                        requeue_delay_cap_ms: 200,
                        connect_timeout_secs: 5,
                        reconnect_min_delay_ms: 200,
                        ..RabbitConsumerConfig::default()
                    },
                )
                .await
                .unwrap_or_else(|e| panic!("RabbitSource: {e}")))
            }
            BrokerEnv::Kafka(k) => src(KafkaSource::connect(
                &kafka_url(),
                kafka_source_config(&k.topic, endpoint, max_message_bytes),
            )
            .await
            .unwrap_or_else(|e| panic!("KafkaSource: {e}"))),
        }
    }

    /// A runner named `name` over `source` with the test's fast settings.
    pub fn consumer(
        &self,
        name: &str,
        source: Src,
        handler: TestHandler,
        ordering: OrderingGuard,
    ) -> PgConsumer<Src, TestHandler> {
        PgConsumer::new(
            PgStore::with_schema(self.db.pool.clone(), self.db.schema.clone()),
            source,
            handler,
            fast_config(name, ordering),
        )
        .expect("valid consumer config")
    }

    /// A runner named `ledger` with a fresh [`TestHandler`] over `source`.
    pub fn ledger_consumer(
        &self,
        source: Src,
        ordering: OrderingGuard,
    ) -> PgConsumer<Src, TestHandler> {
        self.consumer("ledger", source, TestHandler::new(self, "ledger"), ordering)
    }

    /// [`Env::ledger_consumer`] over a source on a fresh durable / queue / group (messages up
    /// to `max_message_bytes`), and that source's delivery log.
    pub async fn ledger(
        &self,
        max_message_bytes: usize,
        ordering: OrderingGuard,
    ) -> (PgConsumer<Src, TestHandler>, LogHandle) {
        self.ledger_with(
            max_message_bytes,
            TestHandler::new(self, "ledger"),
            ordering,
        )
        .await
    }

    /// [`Env::ledger`] with `handler` in place of a fresh [`TestHandler`].
    pub async fn ledger_with(
        &self,
        max_message_bytes: usize,
        handler: TestHandler,
        ordering: OrderingGuard,
    ) -> (PgConsumer<Src, TestHandler>, LogHandle) {
        self.ledger_on(&self.endpoint_name(), max_message_bytes, handler, ordering)
            .await
    }

    /// A runner named `ledger` with `handler` over a source on the durable / queue / group
    /// `endpoint` (messages up to `max_message_bytes`), and that source's delivery log.
    pub async fn ledger_on(
        &self,
        endpoint: &str,
        max_message_bytes: usize,
        handler: TestHandler,
        ordering: OrderingGuard,
    ) -> (PgConsumer<Src, TestHandler>, LogHandle) {
        let src = self.source(endpoint, max_message_bytes).await;
        let log = src.tap();
        (self.consumer("ledger", src, handler, ordering), log)
    }

    /// Runs `outbox <args>` on the test's schema (no broker, no config file), killed after
    /// [`T`].
    pub async fn cli(&self, args: &[&str]) -> Run {
        let mut cmd = outbox(Some(self.db.name()), None, None);
        cmd.args(args);
        run(cmd, T).await
    }

    /// Publishes `msg` with the real transport (on NATS with `Nats-Msg-Id` = event id).
    pub async fn publish(&self, msg: &OutboxMessage) {
        let receipt = self
            .transport
            .publish(msg)
            .await
            .unwrap_or_else(|e| panic!("publish {}: {e}", msg.event_id));
        assert!(
            !receipt.duplicate,
            "the broker deduplicated the first publish of {}",
            msg.event_id
        );
    }

    /// Puts another copy of `msg` on the wire that reaches the consumer. RabbitMQ and Kafka:
    /// the real transport again (no broker-side dedup by event id). NATS: JetStream would drop a republish with
    /// the same `Nats-Msg-Id` inside the stream's duplicate window (120 s here), so the copy is
    /// published raw with the transport's exact subject and headers *minus* `Nats-Msg-Id`, as
    /// a republish after the window would arrive.
    pub async fn publish_copy(&self, msg: &OutboxMessage) {
        match &self.nats_wire {
            None => {
                self.transport.publish(msg).await.expect("republish");
            }
            Some(t) => {
                let subject = t.subject_for(msg).expect("subject");
                let mut headers = async_nats::HeaderMap::new();
                for (k, v) in t.headers_for(msg).expect("headers") {
                    if !k.eq_ignore_ascii_case("Nats-Msg-Id") {
                        headers.insert(k.as_str(), v.as_str());
                    }
                }
                jetstream_publish(t, subject, headers, msg.payload.bytes.clone()).await;
            }
        }
    }

    /// Publishes a message by hand: `body` with the wire headers of `msg` (the transport's
    /// for NATS, `cloudEvents_*` + `content_type` for RabbitMQ), after `edit` changed them
    /// (header names given without the protocol prefix: `specversion`, `id` ...). No
    /// `Nats-Msg-Id`.
    pub async fn publish_raw(
        &self,
        msg: &OutboxMessage,
        body: Vec<u8>,
        edit: impl Fn(&mut BTreeMap<String, String>),
    ) {
        let mut attrs: BTreeMap<String, String> =
            outbox_core::wire::attributes(msg, outbox_core::wire::DEFAULT_SOURCE)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
        edit(&mut attrs);
        match (&self.nats_wire, &self.broker) {
            (Some(t), _) => {
                let subject = t.subject_for(msg).expect("subject");
                let mut headers = async_nats::HeaderMap::new();
                for (k, v) in &attrs {
                    headers.insert(format!("ce-{k}").as_str(), v.as_str());
                }
                headers.insert("Content-Type", msg.payload.content_type.0.as_str());
                jetstream_publish(t, subject, headers, body.into()).await;
            }
            (None, BrokerEnv::Rabbit(r)) => {
                let mut table = FieldTable::default();
                for (k, v) in &attrs {
                    table.insert(
                        format!("cloudEvents_{k}").into(),
                        AMQPValue::LongString(LongString::from(v.as_str())),
                    );
                }
                let props = BasicProperties::default()
                    .with_headers(table)
                    .with_content_type(msg.payload.content_type.0.as_str().into())
                    .with_delivery_mode(2);
                amqp_publish(r, &format!("payment.{}", msg.aggregate_id), &body, props).await;
            }
            (None, BrokerEnv::Kafka(k)) => {
                let mut headers = OwnedHeaders::new();
                for (key, value) in &attrs {
                    headers = headers.insert(Header {
                        key: &format!("ce_{key}"),
                        value: Some(value.as_bytes()),
                    });
                }
                headers = headers.insert(Header {
                    key: "content-type",
                    value: Some(msg.payload.content_type.0.as_bytes()),
                });
                kafka_produce(k, msg.aggregate_id.as_bytes(), headers, &body).await;
            }
            _ => unreachable!(),
        }
    }

    /// Effects of `consumer` (rows of the effects table).
    pub async fn effects(&self, consumer: &str) -> i64 {
        self.db
            .scalar(&format!(
                "SELECT count(*) FROM {{s}}.effects WHERE consumer = '{consumer}'"
            ))
            .await
    }

    /// Effects of `consumer` for `event_id`.
    pub async fn effects_of(&self, consumer: &str, event_id: Uuid) -> i64 {
        self.db
            .scalar(&format!(
                "SELECT count(*) FROM {{s}}.effects WHERE consumer = '{consumer}' AND event_id = '{event_id}'"
            ))
            .await
    }

    /// Inbox rows of `consumer`.
    pub async fn inbox_rows(&self, consumer: &str) -> i64 {
        self.db
            .scalar(&format!(
                "SELECT count(*) FROM {{s}}.inbox WHERE consumer_name = '{consumer}'"
            ))
            .await
    }

    /// Versions applied by `consumer`, in effect order.
    pub async fn applied_versions(&self, consumer: &str) -> Vec<i64> {
        sqlx::query_scalar(AssertSqlSafe(self.db.sql(&format!(
            "SELECT version FROM {{s}}.effects WHERE consumer = '{consumer}' ORDER BY id"
        ))))
        .fetch_all(&self.db.pool)
        .await
        .expect("versions")
    }

    /// Open consumer dead letters `(event_id, error)` of `consumer`.
    pub async fn dead_letters(&self, consumer: &str) -> Vec<(Option<Uuid>, String)> {
        use outbox_core::operator::DeadLetterOps as _;
        let which = outbox_core::operator::ConsumerSelection {
            consumer: Some(consumer.to_owned()),
            ..Default::default()
        };
        self.db
            .store()
            .consumer_dead_letters(&which, 1000)
            .await
            .expect("dead letters")
            .into_iter()
            .map(|d| (d.dead_letter.event_id, d.dead_letter.error))
            .collect()
    }

    pub async fn cleanup(self) {
        if let BrokerEnv::Rabbit(r) = &self.broker {
            let queues = std::mem::take(&mut *self.queues.lock().unwrap());
            for q in &queues {
                let _ = r
                    .channel
                    .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
        }
        self.broker.cleanup().await;
        self.db.drop().await;
    }
}

/// Publishes `body` with `headers` on `subject` through the JetStream context of `t` (the
/// test's stream), waiting until the stream stored it.
pub async fn jetstream_publish(
    t: &NatsTransport,
    subject: String,
    headers: async_nats::HeaderMap,
    body: bytes::Bytes,
) {
    t.jetstream()
        .publish_with_headers(subject, headers, body)
        .await
        .expect("publish")
        .await
        .expect("not stored");
}

/// Publishes `body` with `props` to the test's exchange under `routing_key`, waiting for the
/// broker's confirm.
pub async fn amqp_publish(r: &RabbitEnv, routing_key: &str, body: &[u8], props: BasicProperties) {
    r.channel
        .basic_publish(
            r.exchange.as_str().into(),
            routing_key.into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await
        .expect("basic.publish")
        .await
        .expect("publish confirm");
}

/// Writes a record of `body` with `key` and `headers` to the test's topic (librdkafka's
/// partitioner picks the partition), waiting for the broker's acknowledgement.
pub async fn kafka_produce(k: &KafkaEnv, key: &[u8], headers: OwnedHeaders, body: &[u8]) {
    let producer: FutureProducer = kafka_client().create().expect("producer");
    let record = FutureRecord::to(&k.topic)
        .key(key)
        .payload(body)
        .headers(headers);
    producer
        .send(record, Duration::from_secs(10))
        .await
        .map_err(|(e, _)| e)
        .expect("produce");
}

/// A consumer dead letter as stored, with the raw columns.
#[derive(Debug, sqlx::FromRow)]
pub struct StoredDeadLetter {
    pub event_id: Option<Uuid>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    pub aggregate_version: Option<i64>,
    pub error: String,
    pub attempts: i32,
    pub payload: Vec<u8>,
    pub content_type: Option<Vec<u8>>,
    pub header_names: Option<Vec<Vec<u8>>>,
    pub header_values: Option<Vec<Vec<u8>>>,
    pub metadata: serde_json::Value,
}

impl StoredDeadLetter {
    /// The value of the stored raw header `name` (bytes, so any name a broker can carry).
    pub fn header(&self, name: impl AsRef<[u8]>) -> Option<&[u8]> {
        let names = self.header_names.as_ref()?;
        let values = self.header_values.as_ref()?;
        names
            .iter()
            .position(|n| n == name.as_ref())
            .map(|i| values[i].as_slice())
    }
}

/// The consumer dead letters of `consumer`, oldest first, with their raw columns.
pub async fn stored_dead_letters(env: &Env, consumer: &str) -> Vec<StoredDeadLetter> {
    sqlx::query_as(sqlx::AssertSqlSafe(env.db.sql(
        "SELECT event_id, aggregate_type, aggregate_id, aggregate_version, error, attempts, \
         payload, content_type_bytes AS content_type, header_names, header_values, \
         broker_metadata AS metadata \
         FROM {s}.consumer_dead_letters WHERE consumer_name = $1 ORDER BY id",
    )))
    .bind(consumer)
    .fetch_all(&env.db.pool)
    .await
    .expect("dead letters")
}

/// The Kafka source of the tests: group `group` on `topic`, a 10 s session.
pub fn kafka_source_config(
    topic: &str,
    group: &str,
    max_message_bytes: usize,
) -> KafkaConsumerConfig {
    KafkaConsumerConfig {
        topics: vec![topic.to_owned()],
        group_id: group.to_owned(),
        max_message_bytes,
        request_timeout_secs: 5,
        properties: outbox_kafka::Properties(BTreeMap::from([
            ("session.timeout.ms".to_owned(), "10000".to_owned()),
            ("heartbeat.interval.ms".to_owned(), "1000".to_owned()),
        ])),
        ..KafkaConsumerConfig::default()
    }
}

pub fn fast_config(name: &str, ordering: OrderingGuard) -> ConsumerConfig {
    ConsumerConfig {
        ordering,
        batch_wait: Duration::from_millis(200),
        backoff: Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        gap_delay: Duration::from_millis(100),
        housekeeping_interval: Duration::from_millis(100),
        ..ConsumerConfig::new(name)
    }
}

/// A `payment/<agg>` event at version `v` with a JSON payload.
pub fn message(agg: &str, v: i64, event_type: &str, body: serde_json::Value) -> OutboxMessage {
    let payload = Payload::json(&body).unwrap();
    OutboxMessage {
        id: v,
        event_id: Uuid::now_v7(),
        aggregate_type: "payment".into(),
        aggregate_id: agg.into(),
        aggregate_version: v,
        event_type: event_type.into(),
        schema_version: 1,
        fingerprint: payload.fingerprint(),
        payload,
        headers: BTreeMap::new(),
        destination: None,
        partition_key: None,
        created_at: chrono::Utc::now(),
        attempts: 0,
    }
}

/// A `payment` event of a fresh aggregate at version 1.
pub fn fresh(event_type: &str) -> OutboxMessage {
    message(
        &format!("pay-{}", uid()),
        1,
        event_type,
        serde_json::json!({"amount": 100}),
    )
}

/// `msg` with another payload (same event id): what a producer that reused an id sends.
pub fn with_payload(msg: &OutboxMessage, body: serde_json::Value) -> OutboxMessage {
    let payload = Payload::json(&body).unwrap();
    OutboxMessage {
        fingerprint: payload.fingerprint(),
        payload,
        ..msg.clone()
    }
}

pub fn fingerprint_hex(bytes: &[u8]) -> String {
    Fingerprint::of(bytes).to_hex()
}

// ------------------------------------------------------------------------------------------
// Driving a runner
// ------------------------------------------------------------------------------------------

pub fn add(total: &mut ConsumerReport, r: &ConsumerReport) {
    *total += r;
}

/// Runs batches until `done(totals)` holds; panics with the totals after `timeout`. Runner
/// errors fail the test.
pub async fn run_until<S: DeliverySource, H: Handler<PgConnection>>(
    consumer: &mut PgConsumer<S, H>,
    totals: &mut ConsumerReport,
    timeout: Duration,
    what: &str,
    done: impl Fn(&ConsumerReport) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !done(totals) {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}; totals so far {totals:?}"
        );
        let r = consumer
            .run_batch()
            .await
            .unwrap_or_else(|e| panic!("run_batch failed: {e}"));
        add(totals, &r);
    }
}

/// Runs batches for `period` and returns what they did (to show nothing comes back).
pub async fn run_for<S: DeliverySource, H: Handler<PgConnection>>(
    consumer: &mut PgConsumer<S, H>,
    period: Duration,
) -> ConsumerReport {
    let mut totals = ConsumerReport::default();
    let deadline = Instant::now() + period;
    while Instant::now() < deadline {
        let r = consumer.run_batch().await.expect("run_batch");
        add(&mut totals, &r);
    }
    totals
}

// ------------------------------------------------------------------------------------------
// The test handler
// ------------------------------------------------------------------------------------------

/// One effect row per applied event, in the runner's transaction. Can be told to fail.
#[derive(Clone)]
pub struct TestHandler {
    insert: Arc<str>,
    consumer: String,
    /// Fail this many calls with a transient error first.
    pub transient_failures: Arc<AtomicU32>,
    /// While set, fail with a permanent error.
    pub permanent: Arc<AtomicBool>,
    /// Calls so far.
    pub calls: Arc<AtomicU32>,
    /// Sleep this long inside the transaction (after the effect), to overlap instances.
    pub delay: Duration,
}

impl TestHandler {
    pub fn new(env: &Env, consumer: &str) -> TestHandler {
        TestHandler {
            insert: env
                .db
                .sql(
                    "INSERT INTO {s}.effects (consumer, event_id, aggregate_id, version, payload) \
                     VALUES ($1, $2, $3, $4, $5)",
                )
                .into(),
            consumer: consumer.to_owned(),
            transient_failures: Arc::default(),
            permanent: Arc::default(),
            calls: Arc::default(),
            delay: Duration::ZERO,
        }
    }
}

impl Handler<PgConnection> for TestHandler {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.permanent.load(Ordering::SeqCst) {
            return Err(HandlerError::Permanent(format!(
                "test refuses {} v{}",
                event.event_type, event.aggregate_version
            )));
        }
        if self
            .transient_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(HandlerError::Transient("test dependency down".into()));
        }
        sqlx::query(AssertSqlSafe(Arc::clone(&self.insert)))
            .bind(&self.consumer)
            .bind(event.event_id)
            .bind(&event.aggregate_id)
            .bind(event.aggregate_version)
            .bind(String::from_utf8_lossy(&event.payload.bytes).into_owned())
            .execute(&mut *tx)
            .await?;
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// An instrumented source over either broker
// ------------------------------------------------------------------------------------------

/// What happened to deliveries, keyed by event id (or `raw:<body prefix>` when the message
/// has no valid id).
#[derive(Debug, Default, Clone)]
pub struct Log {
    pub delivered: Vec<String>,
    pub acked: Vec<String>,
    pub nacked: Vec<String>,
}

impl Log {
    pub fn deliveries_of(&self, key: &str) -> usize {
        self.delivered.iter().filter(|k| *k == key).count()
    }
    pub fn acks_of(&self, key: &str) -> usize {
        self.acked.iter().filter(|k| *k == key).count()
    }
}

/// The tap that writes a source's [`Log`].
#[derive(Default)]
pub struct Recorder(Mutex<Log>);

impl Recorder {
    /// The log so far.
    pub fn lock(&self) -> std::sync::LockResult<std::sync::MutexGuard<'_, Log>> {
        self.0.lock()
    }
}

impl Tap for Recorder {
    type Mark = String;
    fn fetched<D: Delivery>(&self, _started: Instant, batch: &[D]) -> Vec<String> {
        let keys: Vec<String> = batch.iter().map(|d| key_of(d.event(), d.raw())).collect();
        self.0
            .lock()
            .unwrap()
            .delivered
            .extend(keys.iter().cloned());
        keys
    }
    fn acked(&self, key: String, _took: Duration, result: &Result<(), SourceError>) {
        if result.is_ok() {
            self.0.lock().unwrap().acked.push(key);
        }
    }
    fn nacking(&self, key: String) {
        self.0.lock().unwrap().nacked.push(key);
    }
}

/// Any broker's source, boxed as the broker registry boxes it, writing its delivery log.
pub type Src = Tapped<BoxSource, Recorder>;
/// A source's delivery log, as the test keeps it while the consumer owns the source.
pub type LogHandle = Arc<Recorder>;

/// `source` boxed, with a fresh delivery log.
pub fn src<S: DeliverySource + Sync>(source: S) -> Src {
    Tapped::new(BoxSource::new(source), Arc::default())
}

/// The log key of a message: its event id when it decodes, else `raw:` + the body's start.
pub fn key_of(event: &Result<IncomingEvent, DecodeError>, raw: &RawMessage) -> String {
    match event {
        Ok(e) => e.event_id.to_string(),
        Err(_) => raw_key(&raw.payload),
    }
}

pub fn raw_key(body: &[u8]) -> String {
    format!(
        "raw:{}",
        String::from_utf8_lossy(&body[..body.len().min(24)])
    )
}
