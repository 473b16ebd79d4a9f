//! Broker setup and teardown (random names), the raw-client baselines, and subscribers; a
//! fresh schema and NATS stream for one measurement of a relay process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use outbox::broker::{BoxTransport, BrokerSettings};
use outbox_core::{OutboxMessage, wire};
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_rabbitmq::RabbitConsumerConfig;
use serde_json::json;
use sqlx::PgPool;

use crate::common::{BenchSchema, Env, TransportChoice, random_suffix};

/// Receive times by event id, filled by a subscriber.
pub type Arrivals = Arc<Mutex<HashMap<uuid::Uuid, Instant>>>;

fn record(arrivals: &Arrivals, id: Option<String>) {
    let now = Instant::now();
    if let Some(id) = id.and_then(|s| s.parse::<uuid::Uuid>().ok()) {
        arrivals.lock().unwrap().entry(id).or_insert(now);
    }
}

/// Runs `publish_one` over clones of `msgs` with at most `window` outstanding, either as
/// futures polled by this task or (`tasks`) each on its own tokio task, as the relay's
/// transports do.
async fn run_window<F, Fut>(
    msgs: &[OutboxMessage],
    window: usize,
    tasks: bool,
    publish_one: F,
) -> Vec<Result<()>>
where
    F: Fn(OutboxMessage) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let it = futures::stream::iter(msgs.iter().cloned());
    if tasks {
        it.map(|m| {
            let h = tokio::spawn(publish_one(m));
            async move { h.await.map_err(anyhow::Error::from).and_then(|r| r) }
        })
        .buffer_unordered(window)
        .collect()
        .await
    } else {
        it.map(publish_one).buffer_unordered(window).collect().await
    }
}

fn finish(started: Instant, results: Vec<Result<()>>) -> Result<Duration> {
    let elapsed = started.elapsed();
    let errors = results.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
        bail!("{errors} baseline publishes failed, first: {e:#}");
    }
    Ok(elapsed)
}

/// A broker's raw client, for the baselines: it publishes a message as the relay's transport
/// would, without the relay.
pub trait RawClient {
    /// Publishes `m` and awaits the broker's confirmation.
    fn publish_raw(&self, m: OutboxMessage) -> impl Future<Output = Result<()>> + Send + 'static;
}

/// The raw client's baseline: `msgs` published by `client`, at most `window` confirmations
/// outstanding, awaiting every one (see [`run_window`] for `tasks`). Returns the elapsed time.
pub async fn baseline<C: RawClient>(
    client: &C,
    msgs: &[OutboxMessage],
    window: usize,
    tasks: bool,
) -> Result<Duration> {
    let started = Instant::now();
    let results = run_window(msgs, window, tasks, |m| client.publish_raw(m)).await;
    finish(started, results)
}

/// A JetStream stream with a random name, the relay's transport on it (connected through the
/// broker registry, as `outbox relay` does), and a separate raw client for the baseline.
pub struct NatsBench {
    pub transport: Arc<BoxTransport>,
    /// The NATS transport's own subject and header rules, for the raw baseline.
    wire: Arc<NatsTransport>,
    pub stream: String,
    pub prefix: String,
    client: async_nats::Client,
    js: async_nats::jetstream::Context,
}

impl NatsBench {
    pub async fn setup(env: &Env) -> Result<Self> {
        let suffix = random_suffix();
        let prefix = format!("bench_{suffix}");
        let stream = format!("BENCH_{}", suffix.to_uppercase());
        let config = NatsConfig {
            stream: stream.clone(),
            stream_subjects: vec![format!("{prefix}.>")],
            subject_template: format!("{prefix}.{{aggregate_type}}.{{event_type}}"),
            ..NatsConfig::default()
        };
        let settings = BrokerSettings::new().with_section(
            "nats",
            json!({
                "stream": stream,
                "stream_subjects": config.stream_subjects,
                "subject_template": config.subject_template,
            }),
        );
        let transport = outbox::brokers()
            .connect_transport(&env.nats_url, &settings)
            .await
            .context("NATS transport")?;
        let wire = NatsTransport::connect(&env.nats_url, config)
            .await
            .context("NATS transport")?;
        let client = async_nats::connect(&env.nats_url).await?;
        let js = async_nats::jetstream::new(client.clone());
        Ok(Self {
            transport: Arc::new(transport),
            wire: Arc::new(wire),
            stream,
            prefix,
            client,
            js,
        })
    }

    /// The relay's `[nats]` configuration section for the stream.
    pub fn relay_toml(&self) -> String {
        format!(
            "[nats]\nstream = \"{}\"\nstream_subjects = [\"{}.>\"]\nsubject_template = \
             \"{}.{{aggregate_type}}.{{event_type}}\"\n",
            self.stream, self.prefix, self.prefix
        )
    }

    pub async fn count(&self) -> Result<u64> {
        let mut s = self.js.get_stream(&self.stream).await?;
        Ok(s.info().await?.state.messages)
    }

    pub async fn purge(&self) -> Result<()> {
        let s = self.js.get_stream(&self.stream).await?;
        s.purge().await?;
        Ok(())
    }

    /// The stream's last sequence: messages stored since its creation, purged ones included
    /// (duplicates the stream dropped by message id excluded).
    pub async fn last_sequence(&self) -> Result<u64> {
        let mut s = self.js.get_stream(&self.stream).await?;
        Ok(s.info().await?.state.last_sequence)
    }

    /// `(num_pending, num_ack_pending)` of a durable consumer on the stream.
    pub async fn consumer_pending(&self, durable: &str) -> Result<(u64, u64)> {
        let s = self.js.get_stream(&self.stream).await?;
        let mut c: async_nats::jetstream::consumer::PullConsumer = s
            .get_consumer(durable)
            .await
            .map_err(|e| anyhow::anyhow!("consumer {durable}: {e}"))?;
        let info = c.info().await?;
        Ok((info.num_pending, info.num_ack_pending as u64))
    }

    pub async fn delete_consumer(&self, durable: &str) -> Result<()> {
        let s = self.js.get_stream(&self.stream).await?;
        s.delete_consumer(durable).await?;
        Ok(())
    }

    /// A core-NATS subscriber on the stream's subjects, recording receive times by `ce-id`.
    pub async fn subscribe(&self, arrivals: Arrivals) -> Result<tokio::task::JoinHandle<()>> {
        let mut sub = self.client.subscribe(format!("{}.>", self.prefix)).await?;
        self.client.flush().await?;
        Ok(tokio::spawn(async move {
            while let Some(m) = sub.next().await {
                let id = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("ce-id"))
                    .map(|v| v.as_str().to_owned());
                record(&arrivals, id);
            }
        }))
    }

    pub async fn teardown(self) -> Result<()> {
        self.js.delete_stream(&self.stream).await?;
        Ok(())
    }
}

impl RawClient for NatsBench {
    /// Raw async-nats: publish with the transport's exact subject and headers, awaiting the
    /// PublishAck.
    fn publish_raw(&self, m: OutboxMessage) -> impl Future<Output = Result<()>> + Send + 'static {
        let transport = Arc::clone(&self.wire);
        let js = self.js.clone();
        async move {
            let subject = transport.subject_for(&m)?;
            let mut headers = async_nats::HeaderMap::new();
            for (n, v) in transport.headers_for(&m)? {
                headers.append(n, v);
            }
            let ack = js
                .publish_with_headers(subject, headers, m.payload.bytes.clone())
                .await?;
            ack.await?;
            anyhow::Ok(())
        }
    }
}

/// Partitions of the bench's Kafka topic.
const KAFKA_PARTITIONS: i32 = 4;

/// A Kafka topic with a random name and four partitions, the relay's transport on it (through
/// the broker registry), and a separate raw rdkafka producer for the baseline, configured as
/// the transport's (idempotent, `acks=all`).
pub struct KafkaBench {
    pub transport: Arc<BoxTransport>,
    topic: String,
    producer: outbox_kafka::rdkafka::producer::FutureProducer,
    reader: Arc<outbox_kafka::rdkafka::consumer::BaseConsumer>,
    /// Sum of the partitions' end offsets at the last purge: the bench cannot delete records,
    /// so it counts from there.
    base: Mutex<i64>,
}

/// Creates `topic` with the bench's partitions, replication factor 1.
async fn create_topic(client: &outbox_kafka::rdkafka::ClientConfig, topic: &str) -> Result<()> {
    use outbox_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<_> = client.create()?;
    for r in admin
        .create_topics(
            [&NewTopic::new(
                topic,
                KAFKA_PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await?
    {
        r.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    Ok(())
}

impl KafkaBench {
    pub async fn setup(env: &Env) -> Result<Self> {
        let topic = format!("bench_{}", random_suffix());
        let mut client = outbox_kafka::rdkafka::ClientConfig::new();
        client.set(
            "bootstrap.servers",
            outbox_kafka::bootstrap_servers(&env.kafka_url)?,
        );
        create_topic(&client, &topic).await?;
        // Producer properties for both the relay's transport and the raw baseline, e.g.
        // OUTBOX_BENCH_KAFKA_PROPERTIES="linger.ms=1,batch.size=65536".
        let properties: std::collections::BTreeMap<String, String> =
            std::env::var("OUTBOX_BENCH_KAFKA_PROPERTIES")
                .unwrap_or_default()
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect();
        let settings = BrokerSettings::new().with_section(
            "kafka",
            json!({ "topic_template": topic, "properties": properties }),
        );
        let transport = outbox::brokers()
            .connect_transport(&env.kafka_url, &settings)
            .await
            .context("Kafka transport")?;
        let mut producer_config = client.clone();
        for (k, v) in &properties {
            producer_config.set(k, v);
        }
        let producer = producer_config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()?;
        let reader = client
            .clone()
            .set("group.id", format!("bench-reader-{}", random_suffix()))
            .create()?;
        Ok(Self {
            transport: Arc::new(transport),
            topic,
            producer,
            reader: Arc::new(reader),
            base: Mutex::new(0),
        })
    }

    /// The relay's `[kafka]` configuration section for the topic.
    pub fn relay_toml(&self) -> String {
        format!("[kafka]\ntopic_template = \"{}\"\n", self.topic)
    }

    /// The broker's own latency floor for W3: the raw producer sends a 1 KB record every
    /// `1/rate` s for `secs` s (after `warmup_secs` unmeasured) to a topic of its own, and a
    /// raw consumer in a group (the consumer settings `KafkaSource` uses: manual offset
    /// store and commit) receives each one and commits its offset synchronously, as the
    /// source's ack does. No database, no relay: what the clients and the broker cost.
    pub async fn raw_latency(
        &self,
        env: &Env,
        rate: u64,
        secs: u64,
        warmup_secs: u64,
    ) -> Result<RawLatency> {
        use outbox_kafka::rdkafka::Message as _;
        use outbox_kafka::rdkafka::consumer::{CommitMode, Consumer as _, StreamConsumer};
        use outbox_kafka::rdkafka::producer::FutureRecord;
        let topic = format!("{}_raw", self.topic);
        let bootstrap = outbox_kafka::bootstrap_servers(&env.kafka_url)?;
        let mut client = outbox_kafka::rdkafka::ClientConfig::new();
        client.set("bootstrap.servers", &bootstrap);
        create_topic(&client, &topic).await?;
        let consumer: StreamConsumer = client
            .clone()
            .set("group.id", format!("{topic}-reader"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .create()?;
        consumer.subscribe(&[&topic])?;
        let total = ((warmup_secs + secs) * rate) as usize;
        let sent: Arc<Mutex<Vec<Option<Instant>>>> = Arc::new(Mutex::new(vec![None; total]));
        let stop = tokio_util::sync::CancellationToken::new();
        let reader = {
            let sent = Arc::clone(&sent);
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut received = vec![None::<(Instant, Instant)>; total];
                let mut got = 0;
                while got < total {
                    let m = tokio::select! {
                        m = consumer.recv() => m?,
                        () = stop.cancelled() => break,
                    };
                    let at = Instant::now();
                    let i: usize = std::str::from_utf8(m.key().unwrap_or_default())?.parse()?;
                    consumer.commit_message(&m, CommitMode::Sync)?;
                    if received[i].is_none() {
                        received[i] = Some((at, Instant::now()));
                        got += 1;
                    }
                }
                let sent = sent.lock().unwrap().clone();
                anyhow::Ok((sent, received))
            })
        };
        // Let the consumer join its group before the clock starts.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let payload = vec![b'x'; 1024];
        let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
        let mut reports = tokio::task::JoinSet::new();
        let mut acked = vec![None::<Instant>; total];
        for i in 0..total {
            ticker.tick().await;
            let key = i.to_string();
            let record = FutureRecord::to(&topic).key(&key).payload(&payload);
            sent.lock().unwrap()[i] = Some(Instant::now());
            let delivery = self
                .producer
                .send_result(record)
                .map_err(|(e, _)| anyhow::anyhow!("queueing: {e}"))?;
            reports.spawn(async move {
                let r = delivery.await;
                (i, Instant::now(), r)
            });
            while let Some(done) = reports.try_join_next() {
                let (i, at, r) = done?;
                r?.map_err(|(e, _)| anyhow::anyhow!("delivery: {e}"))?;
                acked[i] = Some(at);
            }
        }
        while let Some(done) = reports.join_next().await {
            let (i, at, r) = done?;
            r?.map_err(|(e, _)| anyhow::anyhow!("delivery: {e}"))?;
            acked[i] = Some(at);
        }
        let Ok(reader_done) = tokio::time::timeout(Duration::from_secs(30), reader).await else {
            stop.cancel();
            bail!("the raw consumer did not receive every record within 30 s");
        };
        let (sent, received) = reader_done??;
        let skip = (warmup_secs * rate) as usize;
        let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
        let mut out = RawLatency::default();
        for i in skip..total {
            let Some(s) = sent[i] else { continue };
            if let Some(a) = acked[i] {
                out.acked_ms.push(ms(s, a));
            }
            match received[i] {
                Some((r, c)) => {
                    out.received_ms.push(ms(s, r));
                    out.committed_ms.push(ms(s, c));
                }
                None => out.missing += 1,
            }
        }
        for v in [
            &mut out.acked_ms,
            &mut out.received_ms,
            &mut out.committed_ms,
        ] {
            v.sort_by(f64::total_cmp);
        }
        Ok(out)
    }

    /// The topic every event goes to.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    fn end_offsets(&self) -> Result<i64> {
        use outbox_kafka::rdkafka::consumer::Consumer as _;
        let mut sum = 0;
        for p in 0..KAFKA_PARTITIONS {
            let (_, high) =
                self.reader
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(10))?;
            sum += high;
        }
        Ok(sum)
    }

    /// Records stored since the last purge (from the partitions' end offsets).
    pub async fn count(&self) -> Result<u64> {
        let base = *self.base.lock().unwrap();
        Ok(u64::try_from(self.end_offsets()? - base).unwrap_or(0))
    }

    /// Remembers the current end: later counts start there.
    pub async fn purge(&self) -> Result<()> {
        *self.base.lock().unwrap() = self.end_offsets()?;
        Ok(())
    }

    /// Nothing to remove: the test broker cannot take deleting a topic a client still uses;
    /// the topic (random name) stays in its memory.
    pub async fn teardown(self) -> Result<()> {
        Ok(())
    }
}

impl RawClient for KafkaBench {
    /// Raw rdkafka: the transport's exact key, headers and payload, awaiting the delivery
    /// report.
    fn publish_raw(&self, m: OutboxMessage) -> impl Future<Output = Result<()>> + Send + 'static {
        use outbox_kafka::rdkafka::message::{Header, OwnedHeaders};
        use outbox_kafka::rdkafka::producer::FutureRecord;
        let producer = self.producer.clone();
        let topic = self.topic.clone();
        async move {
            let mut headers = OwnedHeaders::new();
            for (name, value) in outbox_kafka::wire_headers(&m, wire::DEFAULT_SOURCE)? {
                headers = headers.insert(Header {
                    key: &name,
                    value: Some(value.as_bytes()),
                });
            }
            let record = FutureRecord::to(&topic)
                .key(m.partition_key().as_bytes())
                .payload(m.payload.bytes.as_ref())
                .headers(headers)
                .timestamp(m.created_at.timestamp_millis());
            producer
                .send(record, Duration::from_secs(30))
                .await
                .map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
            anyhow::Ok(())
        }
    }
}

/// [`KafkaBench::raw_latency`]'s measurements, in ms from the send, sorted.
#[derive(Debug, Default)]
pub struct RawLatency {
    /// Until the delivery report.
    pub acked_ms: Vec<f64>,
    /// Until the consumer received the record.
    pub received_ms: Vec<f64>,
    /// Until the consumer's synchronous offset commit returned.
    pub committed_ms: Vec<f64>,
    /// Measured records never received.
    pub missing: usize,
}

/// A durable topic exchange and a durable queue bound to it with `#` (random names), the
/// relay's transport (through the broker registry), and a separate raw lapin connection for
/// the baseline.
pub struct RabbitBench {
    pub transport: Arc<BoxTransport>,
    pub exchange: String,
    pub queue: String,
    conn: Connection,
    admin: Channel,
    publisher: Channel,
}

impl RabbitBench {
    pub async fn setup(env: &Env) -> Result<Self> {
        let name = format!("bench_{}", random_suffix());
        let settings = BrokerSettings::new().with_section("rabbitmq", json!({ "exchange": name }));
        let transport = outbox::brokers()
            .connect_transport(&env.amqp_url, &settings)
            .await
            .context("RabbitMQ transport")?;
        let conn = Connection::connect(&env.amqp_url, ConnectionProperties::default()).await?;
        let admin = conn.create_channel().await?;
        admin
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        admin
            .queue_bind(
                name.as_str().into(),
                name.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let publisher = conn.create_channel().await?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            transport: Arc::new(transport),
            exchange: name.clone(),
            queue: name,
            conn,
            admin,
            publisher,
        })
    }

    /// The properties the transport would send (same as `outbox_rabbitmq`'s encoder).
    fn properties(m: &OutboxMessage) -> BasicProperties {
        let mut headers = FieldTable::default();
        for (name, value) in wire::attributes(m, wire::DEFAULT_SOURCE) {
            headers.insert(
                ShortString::from(format!("cloudEvents_{name}")),
                AMQPValue::LongString(LongString::from(value)),
            );
        }
        BasicProperties::default()
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(m.event_id.hyphenated().to_string()))
            .with_content_type(ShortString::from(m.payload.content_type.0.clone()))
            .with_type(ShortString::from(m.event_type.clone()))
            .with_timestamp(u64::try_from(m.created_at.timestamp()).unwrap_or(0))
            .with_headers(headers)
    }

    /// The consumer configuration of the bound queue (with the queue's binding).
    pub fn consumer_config(&self) -> RabbitConsumerConfig {
        RabbitConsumerConfig {
            queue: self.queue.clone(),
            bind_exchange: Some(self.exchange.clone()),
            binding_key: "#".into(),
            ..RabbitConsumerConfig::default()
        }
    }

    /// The queue's state (a passive declare).
    async fn queue_state(&self) -> Result<lapin::Queue> {
        Ok(self
            .admin
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?)
    }

    pub async fn count(&self) -> Result<u64> {
        let q = self.queue_state().await?;
        Ok(u64::from(q.message_count()))
    }

    /// Ready messages once no consumer is attached any more (a closed consumer's unacked
    /// deliveries are requeued, so they show up here); waits at most 5 s for the detach.
    pub async fn count_when_idle(&self) -> Result<u64> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let q = self.queue_state().await?;
            if q.consumer_count() == 0 || Instant::now() > deadline {
                return Ok(u64::from(q.message_count()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn purge(&self) -> Result<()> {
        self.admin
            .queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
            .await?;
        Ok(())
    }

    /// A consumer (auto-ack) on the bound queue, recording receive times by `cloudEvents_id`.
    pub async fn subscribe(&self, arrivals: Arrivals) -> Result<tokio::task::JoinHandle<()>> {
        let ch = self.conn.create_channel().await?;
        let mut consumer = ch
            .basic_consume(
                self.queue.as_str().into(),
                "outbox-bench".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(tokio::spawn(async move {
            let _ch = ch;
            while let Some(Ok(d)) = consumer.next().await {
                let id = d.properties.headers().as_ref().and_then(|h| {
                    match h.inner().get("cloudEvents_id") {
                        Some(AMQPValue::LongString(s)) => Some(s.to_string()),
                        _ => None,
                    }
                });
                record(&arrivals, id);
            }
        }))
    }

    pub async fn teardown(self) -> Result<()> {
        drop(self.transport);
        self.admin
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
        self.admin
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await?;
        let _ = self.conn.close(200, "bye".into()).await;
        Ok(())
    }
}

impl RawClient for RabbitBench {
    /// Raw lapin: basic_publish (mandatory, persistent, the transport's properties and
    /// routing key) on a confirm-mode channel, awaiting the confirm and refusing a returned
    /// message.
    fn publish_raw(&self, m: OutboxMessage) -> impl Future<Output = Result<()>> + Send + 'static {
        let exchange = ShortString::from(self.exchange.clone());
        let channel = self.publisher.clone();
        async move {
            let rk = format!("{}.{}", m.aggregate_type, m.event_type);
            let confirm = channel
                .basic_publish(
                    exchange,
                    ShortString::from(rk),
                    BasicPublishOptions {
                        mandatory: true,
                        immediate: false,
                    },
                    &m.payload.bytes,
                    Self::properties(&m),
                )
                .await?;
            match confirm.await? {
                Confirmation::Ack(None) => Ok(()),
                other => bail!("not confirmed: {other:?}"),
            }
        }
    }
}

/// `$body` with `$b` bound to the bench inside `$any`, whichever broker it is.
macro_rules! on_each {
    ($any:expr, $b:ident => $body:expr) => {
        match $any {
            AnyBench::Nats($b) => $body,
            AnyBench::Rabbit($b) => $body,
            AnyBench::Kafka($b) => $body,
        }
    };
}

/// The bench of any broker, for the workloads that run the same phases on each.
pub enum AnyBench {
    /// NATS JetStream.
    Nats(NatsBench),
    /// RabbitMQ.
    Rabbit(RabbitBench),
    /// Kafka (the test broker).
    Kafka(KafkaBench),
}

impl AnyBench {
    /// Sets up the broker `t` names (RabbitMQ for `all`, which a workload splits first).
    pub async fn setup(env: &Env, t: TransportChoice) -> Result<Self> {
        Ok(match t {
            TransportChoice::Nats => Self::Nats(NatsBench::setup(env).await?),
            TransportChoice::Kafka => Self::Kafka(KafkaBench::setup(env).await?),
            _ => Self::Rabbit(RabbitBench::setup(env).await?),
        })
    }

    /// The broker's name in messages (`NATS`, `RabbitMQ`, `Kafka`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Nats(_) => "NATS",
            Self::Rabbit(_) => "RabbitMQ",
            Self::Kafka(_) => "Kafka",
        }
    }

    /// The relay's transport on the broker.
    pub fn transport(&self) -> &Arc<BoxTransport> {
        on_each!(self, b => &b.transport)
    }

    /// [`baseline`] with the broker's raw client.
    pub async fn baseline(
        &self,
        msgs: &[OutboxMessage],
        window: usize,
        tasks: bool,
    ) -> Result<Duration> {
        on_each!(self, b => baseline(b, msgs, window, tasks).await)
    }

    /// Messages the broker holds.
    pub async fn count(&self) -> Result<u64> {
        on_each!(self, b => b.count().await)
    }

    /// Forgets what the broker holds.
    pub async fn purge(&self) -> Result<()> {
        on_each!(self, b => b.purge().await)
    }

    /// A subscriber recording receive times (NATS and RabbitMQ).
    pub async fn subscribe(&self, arrivals: Arrivals) -> Result<tokio::task::JoinHandle<()>> {
        match self {
            Self::Nats(b) => b.subscribe(arrivals).await,
            Self::Rabbit(b) => b.subscribe(arrivals).await,
            Self::Kafka(_) => bail!("no subscriber on Kafka"),
        }
    }

    /// Removes the broker's objects.
    pub async fn teardown(self) -> Result<()> {
        on_each!(self, b => b.teardown().await)
    }
}

/// A fresh [`BenchSchema`] and [`NatsBench`] stream, with the pool and the service addresses:
/// one measurement of a relay process on objects of its own.
pub struct FreshNats<'a> {
    /// The service addresses.
    pub env: &'a Env,
    /// The pool the schema was created with.
    pub pool: &'a PgPool,
    /// The fresh schema.
    pub bench: BenchSchema,
    /// The fresh stream.
    pub nats: NatsBench,
}

impl<'a> FreshNats<'a> {
    /// Runs `measure` on a fresh schema and stream, then tears the stream down and drops the
    /// schema. The measurement's error comes before the clean-up's, except the schema's drop.
    pub async fn run<T>(
        env: &'a Env,
        pool: &'a PgPool,
        measure: impl AsyncFnOnce(&FreshNats<'a>) -> Result<T>,
    ) -> Result<T> {
        let bench = BenchSchema::create(pool).await?;
        let nats = match NatsBench::setup(env).await {
            Ok(nats) => nats,
            Err(e) => {
                bench.drop(pool).await?;
                return Err(e);
            }
        };
        let fresh = FreshNats {
            env,
            pool,
            bench,
            nats,
        };
        let result = measure(&fresh).await;
        let teardown = fresh.nats.teardown().await;
        fresh.bench.drop(pool).await?;
        let out = result?;
        teardown?;
        Ok(out)
    }
}
