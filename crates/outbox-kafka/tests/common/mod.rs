//! One test's private topic and consumer group on the real Kafka-protocol broker
//! (`OUTBOX_TEST_KAFKA_URL`, default `kafka://127.0.0.1:9092`), and the conformance harnesses of
//! `outbox-testkit` over it. A missing broker fails the tests.
//!
//! The topic (one partition) is created when the fixture starts; every test has its own, so
//! tests run in parallel. Topics are not deleted afterwards (see [`Harness::cleanup`]).
//!
//! Outages: [`Harness::outage_proxy`] starts a private broker that advertises the proxy's
//! address ([`outbox_testkit::tansu`] says why), and the case runs on that broker.
#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use outbox_core::consumer::RawMessage;
use outbox_core::{OutboxMessage, PublishErrorKind, Transport};
use outbox_kafka::rdkafka::ClientConfig;
use outbox_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use outbox_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use outbox_kafka::rdkafka::message::{Header, Headers as _, Message as _, OwnedHeaders, RawHeader};
use outbox_kafka::rdkafka::producer::{FutureProducer, FutureRecord};
use outbox_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use outbox_kafka::rdkafka::util::Timeout;
use outbox_kafka::{
    CE_PREFIX, CONTENT_TYPE_HEADER, KafkaConfig, KafkaConsumerConfig, KafkaSource, KafkaTransport,
    Properties, bootstrap_servers,
};
use outbox_testkit::env::KAFKA;
use outbox_testkit::harness::Harness;
use outbox_testkit::net::Proxy;
use outbox_testkit::source::{
    LagCounts, Redelivery, SourceCapabilities, SourceHarness, SourceSettings,
};
use outbox_testkit::tansu::{PrivateBroker, free_port};
use outbox_testkit::transport::{Received, Timeouts, TransportCapabilities, TransportHarness};
use tokio::sync::Mutex as AsyncMutex;
use uuid::Uuid;

pub fn kafka_url() -> String {
    KAFKA.url()
}

/// librdkafka's default `message.max.bytes`.
pub const MESSAGE_MAX_BYTES: usize = 1_000_000;

/// A client configuration of the fixture's own (never a transport's or a source's).
pub fn client(url: &str) -> anyhow::Result<ClientConfig> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap_servers(url)?);
    Ok(config)
}

/// Creates `topic` with one partition on the broker at `url`.
pub async fn create_topic(url: &str, topic: &str) -> anyhow::Result<()> {
    let admin: AdminClient<_> = client(url)?.create()?;
    let results = admin
        .create_topics(
            [&NewTopic::new(topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| KAFKA.unreachable(e))?;
    for result in results {
        result.map_err(|(t, e)| anyhow::anyhow!("creating topic {t}: {e}"))?;
    }
    Ok(())
}

/// One test's topic `outboxtest<id>` (every event goes there) and group `consumer-<id>`.
pub struct Fixture {
    pub topic: String,
    pub group: String,
    /// The broker the case runs on: the shared one, or the private one behind the proxy.
    url: Mutex<String>,
    private: AsyncMutex<Option<PrivateBroker>>,
    /// The transport the source harness publishes with, and the broker it is connected to.
    publisher: AsyncMutex<Option<(String, KafkaTransport)>>,
    /// Next offset `take_arrived` reads.
    next_offset: AsyncMutex<i64>,
}

impl Fixture {
    /// Creates the topic on the shared broker.
    ///
    /// Also installs (once per test binary) a log subscriber for the source's rebalance,
    /// commit and librdkafka messages (`outbox_kafka` at info, the rest at warn), so a failing
    /// case shows whether its group rebalanced or its client saw errors.
    pub async fn start() -> anyhow::Result<Self> {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn,outbox_kafka=info"))
            .try_init();
        let id = Uuid::now_v7().simple().to_string();
        let fixture = Self {
            topic: format!("outboxtest{id}"),
            group: format!("consumer-{id}"),
            url: Mutex::new(kafka_url()),
            private: AsyncMutex::new(None),
            publisher: AsyncMutex::new(None),
            next_offset: AsyncMutex::new(0),
        };
        create_topic(&kafka_url(), &fixture.topic).await?;
        Ok(fixture)
    }

    pub fn url(&self) -> String {
        self.url.lock().expect("url lock").clone()
    }

    /// The transport configuration: every event to this fixture's topic, a 5 s delivery
    /// timeout.
    pub fn config(&self) -> KafkaConfig {
        KafkaConfig {
            topic_template: Some(self.topic.clone()),
            topic_partitions: 1,
            topic_replication_factor: 1,
            delivery_timeout_secs: 5,
            properties: Properties(BTreeMap::from([(
                "reconnect.backoff.max.ms".to_owned(),
                "1000".to_owned(),
            )])),
            ..KafkaConfig::default()
        }
    }

    pub async fn transport_with(&self, config: KafkaConfig) -> anyhow::Result<KafkaTransport> {
        KafkaTransport::connect(&self.url(), config)
            .await
            .map_err(|e| KAFKA.unreachable(e))
    }

    /// The consumer configuration for this fixture's topic and group.
    pub fn consumer_config(&self, settings: &SourceSettings) -> KafkaConsumerConfig {
        KafkaConsumerConfig {
            topics: vec![self.topic.clone()],
            group_id: self.group.clone(),
            max_message_bytes: settings.max_message_bytes,
            max_unacked: usize::from(settings.max_unacked),
            request_timeout_secs: 5,
            properties: Properties(BTreeMap::from([
                ("reconnect.backoff.max.ms".to_owned(), "1000".to_owned()),
                ("session.timeout.ms".to_owned(), "10000".to_owned()),
                ("heartbeat.interval.ms".to_owned(), "1000".to_owned()),
            ])),
            ..KafkaConsumerConfig::default()
        }
    }

    async fn publisher(&self) -> anyhow::Result<KafkaTransport> {
        let url = self.url();
        let mut publisher = self.publisher.lock().await;
        if let Some((at, transport)) = publisher.as_ref()
            && *at == url
        {
            return Ok(transport.clone());
        }
        let transport = self.transport_with(self.config()).await?;
        *publisher = Some((url, transport.clone()));
        Ok(transport)
    }

    /// Every message of the topic from `from` up to its end, read with a client of its own.
    ///
    /// The end is where nothing more comes for half a second after the high watermark (read
    /// first) was reached: a record a case expects to be missing must have had its chance.
    pub async fn read_from(&self, from: i64) -> anyhow::Result<Vec<Received>> {
        let url = self.url();
        let topic = self.topic.clone();
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = client(&url)?
                .set("group.id", format!("reader-{}", Uuid::now_v7().simple()))
                .set("enable.auto.commit", "false")
                .create()?;
            let (_, high) =
                consumer.fetch_watermarks(&topic, 0, Timeout::After(Duration::from_secs(10)))?;
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(&topic, 0, Offset::Offset(from))?;
            consumer.assign(&list)?;
            let mut out = Vec::new();
            let mut next = from;
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            let mut quiet_since = None;
            loop {
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "read {} of the messages up to offset {high}",
                    out.len()
                );
                match consumer.poll(Duration::from_millis(100)) {
                    Some(message) => {
                        let message = message?;
                        next = message.offset() + 1;
                        out.push(received(&message));
                        quiet_since = None;
                    }
                    None if next >= high => {
                        let since = *quiet_since.get_or_insert_with(std::time::Instant::now);
                        if since.elapsed() >= Duration::from_millis(500) {
                            return Ok(out);
                        }
                    }
                    None => {}
                }
            }
        })
        .await?
    }
}

impl Harness for Fixture {
    fn broker_url(&self) -> String {
        self.url()
    }

    async fn outage_proxy(&self) -> anyhow::Result<Proxy> {
        let port = free_port()?;
        let listen = format!("127.0.0.1:{port}");
        let proxy = Proxy::start(listen.clone()).await?;
        let broker = PrivateBroker::start(&listen, &proxy.addr().to_string()).await?;
        let url = format!("kafka://{}", proxy.addr());
        create_topic(&url, &self.topic).await?;
        *self.private.lock().await = Some(broker);
        *self.url.lock().expect("url lock") = url;
        *self.next_offset.lock().await = 0;
        Ok(proxy)
    }

    /// Drops the fixture's own clients. The topic stays: tansu 0.6 answers the metadata
    /// request of a consumer still subscribed to a deleted topic in a way that crashes
    /// librdkafka 2.12 (a segmentation fault in its metadata cache), and a closed source leaves
    /// its group asynchronously. Topics live in the test broker's memory until it restarts.
    async fn cleanup(&self) -> anyhow::Result<()> {
        *self.publisher.lock().await = None;
        Ok(())
    }
}

/// A stored message with the Kafka binding undone: `ce_*` headers are attributes, `ce_id` also
/// the message id, `content-type` the content type, the rest user headers.
fn received<M: outbox_kafka::rdkafka::message::Message>(message: &M) -> Received {
    let mut r = Received {
        message_id: None,
        attributes: BTreeMap::new(),
        content_type: None,
        headers: BTreeMap::new(),
        payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
    };
    if let Some(headers) = message.headers() {
        for header in headers.iter() {
            let value = String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned();
            if let Some(attribute) = header.key.strip_prefix(CE_PREFIX) {
                if attribute == "id" {
                    r.message_id = Some(value.clone());
                }
                r.attributes.insert(attribute.to_owned(), value);
            } else if header.key == CONTENT_TYPE_HEADER {
                r.content_type = Some(value);
            } else {
                r.headers.insert(header.key.to_owned(), value);
            }
        }
    }
    r
}

impl TransportHarness for Fixture {
    type Transport = KafkaTransport;

    async fn transport_at(&self, url: &str, timeouts: Timeouts) -> anyhow::Result<KafkaTransport> {
        let config = match timeouts {
            Timeouts::Normal => self.config(),
            Timeouts::Short => KafkaConfig {
                delivery_timeout_secs: 2,
                connect_timeout_secs: 2,
                ..self.config()
            },
        };
        KafkaTransport::connect(url, config)
            .await
            .map_err(|e| KAFKA.unreachable(e))
    }

    async fn take_arrived(&self) -> anyhow::Result<Vec<Received>> {
        let mut next = self.next_offset.lock().await;
        let arrived = self.read_from(*next).await?;
        *next += i64::try_from(arrived.len())?;
        Ok(arrived)
    }

    async fn capabilities(&self) -> anyhow::Result<TransportCapabilities> {
        // The message the suite publishes at the largest accepted size, without its payload:
        // what its key and headers take of message.max.bytes, and a margin for the framing.
        let sample = outbox_testkit::message::sized("oversize", 100, 0);
        let headers = self.publisher().await?.headers_for(&sample)?;
        let header_bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        let key = sample.partition_key().len();
        Ok(TransportCapabilities {
            deduplicates: false,
            refused_destinations: vec![
                ("a b".to_owned(), PublishErrorKind::Invalid),
                ("a/b".to_owned(), PublishErrorKind::Invalid),
                ("..".to_owned(), PublishErrorKind::Invalid),
                ("x".repeat(250), PublishErrorKind::Invalid),
                (String::new(), PublishErrorKind::Invalid),
            ],
            reserved_headers: ["content-type", "ce_id", "CE_Type", "ce-id", "Content-Type"]
                .map(str::to_owned)
                .to_vec(),
            // Over message.max.bytes; and a payload that fits alone but not with its headers.
            too_large_payloads: vec![MESSAGE_MAX_BYTES + 1, MESSAGE_MAX_BYTES - 100],
            largest_accepted_payload: MESSAGE_MAX_BYTES - header_bytes - key - 1024,
        })
    }
}

impl SourceHarness for Fixture {
    type Source = KafkaSource;

    async fn source_at(&self, url: &str, settings: &SourceSettings) -> anyhow::Result<KafkaSource> {
        KafkaSource::connect(url, self.consumer_config(settings))
            .await
            .map_err(|e| KAFKA.unreachable(e))
    }

    async fn publish(&self, message: &OutboxMessage) -> anyhow::Result<()> {
        self.publisher().await?.publish(message).await?;
        Ok(())
    }

    fn encode(&self, message: &OutboxMessage) -> anyhow::Result<RawMessage> {
        let headers: BTreeMap<String, String> =
            outbox_kafka::wire_headers(message, outbox_core::wire::DEFAULT_SOURCE)?
                .into_iter()
                .collect();
        Ok(RawMessage {
            payload: message.payload.bytes.clone(),
            content_type: headers.get(CONTENT_TYPE_HEADER).cloned(),
            headers,
            ..RawMessage::default()
        })
    }

    fn attribute_header(&self, attribute: &str) -> String {
        format!("{CE_PREFIX}{attribute}")
    }

    async fn publish_raw(&self, raw: &RawMessage) -> anyhow::Result<()> {
        let producer: FutureProducer = client(&self.url())?.create()?;
        let mut headers = OwnedHeaders::new();
        for (name, value) in &raw.headers {
            headers = headers.insert(Header {
                key: name,
                value: Some(value.as_bytes()),
            });
        }
        for (name, value) in &raw.binary_headers {
            // A name that is not UTF-8 is kept escaped: its bytes go on the wire.
            headers = headers.insert_raw(RawHeader {
                key: &RawMessage::header_name(name),
                value: Some(value.as_ref()),
            });
        }
        if let Some(content_type) = &raw.content_type
            && !raw
                .headers
                .keys()
                .any(|n| n.eq_ignore_ascii_case(CONTENT_TYPE_HEADER))
        {
            headers = headers.insert(Header {
                key: CONTENT_TYPE_HEADER,
                value: Some(content_type.as_bytes()),
            });
        }
        let record: FutureRecord<'_, (), [u8]> = FutureRecord::to(&self.topic)
            .payload(raw.payload.as_ref())
            .headers(headers);
        producer
            .send(record, Timeout::After(Duration::from_secs(10)))
            .await
            .map_err(|(e, _)| anyhow::anyhow!("producing a hand-made message: {e}"))?;
        Ok(())
    }

    fn set_attribute_bytes(&self, raw: &mut RawMessage, attribute: &str, value: &[u8]) {
        let name = format!("{CE_PREFIX}{attribute}");
        raw.headers.remove(&name);
        raw.binary_headers
            .insert(name, Bytes::copy_from_slice(value));
    }

    fn capabilities(&self) -> SourceCapabilities {
        SourceCapabilities {
            counts_deliveries: false,
            dropped_delivery: Redelivery::AtOnce,
            lag: LagCounts::WaitingAndUnacknowledged,
            failed_ack_redelivers: false,
            count_grows_across_cuts: false,
        }
    }
}
