//! One test's private exchange and queues on the real RabbitMQ (`OUTBOX_TEST_AMQP_URL`,
//! default `amqp://guest:guest@127.0.0.1:5672/%2f`), and the conformance harnesses of
//! `outbox-testkit` over them. A missing broker fails the tests.
//!
//! The transports publish to exchange `outbox-test-x-<id>` with routing keys
//! `routed.{aggregate_type}.{event_type}`; queue `outbox-test-read-<id>` (bound `routed.#`,
//! declared by the fixture) is what the transport harness reads back, queue
//! `outbox-test-src-<id>` (declared and bound by the sources themselves) is what the sources
//! consume. [`Harness::cleanup`] deletes all three, so tests run in parallel and leave nothing
//! behind.
#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;

use anyhow::{Context, ensure};
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use outbox_core::consumer::RawMessage;
use outbox_core::{OutboxMessage, PublishErrorKind, Transport, wire};
use outbox_rabbitmq::{
    CLOUDEVENTS_HEADER_PREFIX, DELIVERY_MODE_PERSISTENT, RabbitConfig, RabbitConsumerConfig,
    RabbitSource, RabbitTransport,
};
use outbox_testkit::env::RABBITMQ;
use outbox_testkit::harness::Harness;
use outbox_testkit::source::{
    LagCounts, Redelivery, SourceCapabilities, SourceHarness, SourceSettings,
};
use outbox_testkit::transport::{Received, Timeouts, TransportCapabilities, TransportHarness};
use tokio::sync::OnceCell;
use uuid::Uuid;

/// The routing-key prefix the fixture's queues are bound to.
pub const ROUTED: &str = "routed";

/// The transport's own payload limit in the fixture's configuration.
pub const MAX_MESSAGE_BYTES: usize = 1024;

pub fn amqp_url() -> String {
    RABBITMQ.url()
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::now_v7().simple())
}

pub fn long(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// A connection of its own (never a transport's or a source's), for setup, publishing by hand,
/// reading back and cleanup. Its channel is in publisher-confirm mode.
pub struct Admin {
    _connection: Connection,
    pub channel: Channel,
}

impl Admin {
    pub async fn connect() -> anyhow::Result<Self> {
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .map_err(|e| RABBITMQ.unreachable(e))?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            _connection: connection,
            channel,
        })
    }

    /// A durable queue that expires if a failed test leaves it behind, with `args` added.
    pub async fn queue(&self, name: &str, mut args: FieldTable) -> anyhow::Result<()> {
        args.insert("x-expires".into(), AMQPValue::LongUInt(600_000));
        self.channel
            .queue_declare(name.into(), QueueDeclareOptions::durable(), args)
            .await?;
        Ok(())
    }

    pub async fn bind(&self, queue: &str, exchange: &str, key: &str) -> anyhow::Result<()> {
        self.channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    /// Ready messages of `queue`.
    pub async fn count(&self, queue: &str) -> anyhow::Result<u32> {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable().passive(),
                FieldTable::default(),
            )
            .await?;
        Ok(q.message_count())
    }

    /// Takes one message off `queue`, if any.
    pub async fn get(&self, queue: &str) -> anyhow::Result<Option<BasicGetMessage>> {
        Ok(self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await?)
    }

    /// Publishes to `queue` through the default exchange (persistent, mandatory) and waits
    /// for the broker's confirm of a routed message.
    pub async fn publish(
        &self,
        queue: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> anyhow::Result<()> {
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                properties.with_delivery_mode(DELIVERY_MODE_PERSISTENT),
            )
            .await?
            .await?;
        ensure!(
            matches!(confirm, lapin::Confirmation::Ack(None)),
            "publish to {queue} not confirmed as routed: {confirm:?}"
        );
        Ok(())
    }

    pub async fn delete_queue(&self, queue: &str) -> anyhow::Result<()> {
        self.channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await?;
        Ok(())
    }

    pub async fn delete_exchange(&self, exchange: &str) -> anyhow::Result<()> {
        self.channel
            .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
            .await?;
        Ok(())
    }
}

/// The broker-side pid of the connection named `name`, via `rabbitmqctl`.
pub fn connection_pid(name: &str) -> anyhow::Result<Option<String>> {
    let out = std::process::Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_connections",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .output()
        .context("rabbitmqctl must be installed and runnable (as root) for the reconnect tests")?;
    ensure!(
        out.status.success(),
        "rabbitmqctl list_connections failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(stdout
        .lines()
        .find(|line| line.contains(name))
        .and_then(|line| line.split_whitespace().next())
        .map(str::to_owned))
}

/// Closes the connection named `name` from the broker side (`CONNECTION_FORCED`), via
/// `rabbitmqctl`.
pub fn close_connection(name: &str) -> anyhow::Result<()> {
    let pid =
        connection_pid(name)?.with_context(|| format!("no broker connection named {name}"))?;
    let out = std::process::Command::new("rabbitmqctl")
        .args(["-q", "close_connection", &pid, "outbox reconnect test"])
        .output()?;
    ensure!(
        out.status.success(),
        "rabbitmqctl close_connection failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The headers the transport publishes for `message` (CloudEvents binding and user headers),
/// as text; [`table`] makes the AMQP table of them.
pub fn wire_headers(message: &OutboxMessage) -> BTreeMap<String, String> {
    wire::attributes(message, wire::DEFAULT_SOURCE)
        .into_iter()
        .map(|(name, value)| (format!("{CLOUDEVENTS_HEADER_PREFIX}{name}"), value))
        .chain(message.headers.clone())
        .collect()
}

pub fn table(headers: &BTreeMap<String, String>) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        table.insert(name.as_str().into(), long(value));
    }
    table
}

fn text(value: &AMQPValue) -> anyhow::Result<String> {
    match value {
        AMQPValue::LongString(s) => Ok(String::from_utf8(s.as_bytes().to_vec())?),
        other => anyhow::bail!("a header is not a long string: {other:?}"),
    }
}

/// One test's exchange and queues.
pub struct Fixture {
    pub exchange: String,
    /// Read back by the transport harness.
    pub read_queue: String,
    /// Consumed by the sources.
    pub source_queue: String,
    pub admin: Admin,
    /// Declares the exchange and binds the read queue once.
    reader: OnceCell<()>,
    /// The transport the source harness publishes with.
    publisher: OnceCell<RabbitTransport>,
}

impl Fixture {
    pub async fn start() -> anyhow::Result<Self> {
        Ok(Self {
            exchange: unique("outbox-test-x"),
            read_queue: unique("outbox-test-read"),
            source_queue: unique("outbox-test-src"),
            admin: Admin::connect().await?,
            reader: OnceCell::new(),
            publisher: OnceCell::new(),
        })
    }

    /// The transport configuration: this fixture's exchange, routing keys under
    /// [`ROUTED`], payloads up to [`MAX_MESSAGE_BYTES`].
    pub fn config(&self) -> RabbitConfig {
        RabbitConfig {
            exchange: self.exchange.clone(),
            routing_key_template: format!("{ROUTED}.{{aggregate_type}}.{{event_type}}"),
            max_message_bytes: MAX_MESSAGE_BYTES,
            ..RabbitConfig::default()
        }
    }

    pub async fn transport_with(&self, config: RabbitConfig) -> anyhow::Result<RabbitTransport> {
        RabbitTransport::connect(&amqp_url(), config)
            .await
            .map_err(|e| RABBITMQ.unreachable(e))
    }

    /// The consumer configuration: the source queue, declared and bound by the source.
    pub fn consumer_config(&self, settings: &SourceSettings) -> RabbitConsumerConfig {
        RabbitConsumerConfig {
            queue: self.source_queue.clone(),
            declare_queue: true,
            bind_exchange: Some(self.exchange.clone()),
            binding_key: format!("{ROUTED}.#"),
            prefetch: u32::from(settings.max_unacked),
            max_message_bytes: settings.max_message_bytes,
            reconnect_min_delay_ms: 300,
            ..RabbitConsumerConfig::default()
        }
    }

    /// Declares the exchange as the transport does and binds the read queue to it.
    pub async fn reader(&self) -> anyhow::Result<()> {
        self.reader
            .get_or_try_init(|| async {
                self.admin
                    .channel
                    .exchange_declare(
                        self.exchange.as_str().into(),
                        ExchangeKind::Topic,
                        ExchangeDeclareOptions {
                            durable: true,
                            ..ExchangeDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await?;
                self.admin
                    .queue(&self.read_queue, FieldTable::default())
                    .await?;
                self.admin
                    .bind(&self.read_queue, &self.exchange, &format!("{ROUTED}.#"))
                    .await
            })
            .await
            .copied()
    }

    async fn publisher(&self) -> anyhow::Result<&RabbitTransport> {
        self.publisher
            .get_or_try_init(|| self.transport_with(self.config()))
            .await
    }
}

impl Harness for Fixture {
    fn broker_url(&self) -> String {
        amqp_url()
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        if let Some(publisher) = self.publisher.get() {
            publisher.close().await;
        }
        self.admin.delete_queue(&self.read_queue).await?;
        self.admin.delete_queue(&self.source_queue).await?;
        self.admin.delete_exchange(&self.exchange).await
    }
}

impl TransportHarness for Fixture {
    type Transport = RabbitTransport;

    async fn transport_at(&self, url: &str, timeouts: Timeouts) -> anyhow::Result<RabbitTransport> {
        self.reader().await?;
        let config = match timeouts {
            Timeouts::Normal => self.config(),
            Timeouts::Short => RabbitConfig {
                confirm_timeout_secs: 2,
                connect_timeout_secs: 2,
                reconnect_min_delay_ms: 200,
                ..self.config()
            },
        };
        RabbitTransport::connect(url, config)
            .await
            .map_err(|e| RABBITMQ.unreachable(e))
    }

    async fn take_arrived(&self) -> anyhow::Result<Vec<Received>> {
        let mut out = Vec::new();
        while let Some(got) = self.admin.get(&self.read_queue).await? {
            let p = &got.delivery.properties;
            let mut r = Received {
                message_id: p.message_id().as_ref().map(|s| s.as_str().to_owned()),
                attributes: BTreeMap::new(),
                content_type: p.content_type().as_ref().map(|s| s.as_str().to_owned()),
                headers: BTreeMap::new(),
                payload: got.delivery.data.clone().into(),
            };
            for (name, value) in p
                .headers()
                .as_ref()
                .map(|t| t.inner())
                .into_iter()
                .flatten()
            {
                let value = text(value)?;
                match name.as_str().strip_prefix(CLOUDEVENTS_HEADER_PREFIX) {
                    Some(attribute) => r.attributes.insert(attribute.to_owned(), value),
                    None => r.headers.insert(name.as_str().to_owned(), value),
                };
            }
            out.push(r);
        }
        Ok(out)
    }

    async fn capabilities(&self) -> anyhow::Result<TransportCapabilities> {
        Ok(TransportCapabilities {
            deduplicates: false,
            refused_destinations: vec![
                // Longer than an AMQP short string.
                ("k".repeat(256), PublishErrorKind::Invalid),
                // No queue is bound for it: returned (mandatory), never counted as sent.
                ("unrouted.key".to_owned(), PublishErrorKind::Rejected),
            ],
            reserved_headers: vec!["cloudEvents_id".to_owned(), "CloudEvents_type".to_owned()],
            too_large_payloads: vec![MAX_MESSAGE_BYTES + 1, 4 * MAX_MESSAGE_BYTES],
            largest_accepted_payload: MAX_MESSAGE_BYTES,
        })
    }
}

impl SourceHarness for Fixture {
    type Source = RabbitSource;

    async fn source_at(
        &self,
        url: &str,
        settings: &SourceSettings,
    ) -> anyhow::Result<RabbitSource> {
        self.publisher().await?;
        RabbitSource::connect(url, self.consumer_config(settings))
            .await
            .map_err(|e| RABBITMQ.unreachable(e))
    }

    async fn publish(&self, message: &OutboxMessage) -> anyhow::Result<()> {
        self.publisher().await?.publish(message).await?;
        Ok(())
    }

    fn encode(&self, message: &OutboxMessage) -> anyhow::Result<RawMessage> {
        Ok(RawMessage {
            payload: message.payload.bytes.clone(),
            headers: wire_headers(message),
            content_type: Some(message.payload.content_type.0.clone()),
            ..RawMessage::default()
        })
    }

    fn attribute_header(&self, attribute: &str) -> String {
        format!("{CLOUDEVENTS_HEADER_PREFIX}{attribute}")
    }

    async fn publish_raw(&self, raw: &RawMessage) -> anyhow::Result<()> {
        let mut properties = BasicProperties::default();
        if !raw.headers.is_empty() || !raw.binary_headers.is_empty() {
            let mut headers = table(&raw.headers);
            for (name, value) in &raw.binary_headers {
                headers.insert(
                    name.as_str().into(),
                    AMQPValue::LongString(LongString::from(value.to_vec())),
                );
            }
            properties = properties.with_headers(headers);
        }
        if let Some(content_type) = &raw.content_type {
            properties = properties.with_content_type(content_type.as_str().into());
        }
        self.admin
            .publish(&self.source_queue, &raw.payload, properties)
            .await
    }

    fn set_attribute_bytes(&self, raw: &mut RawMessage, attribute: &str, value: &[u8]) {
        let header = format!("{CLOUDEVENTS_HEADER_PREFIX}{attribute}");
        raw.headers.remove(&header);
        raw.binary_headers
            .insert(header, bytes::Bytes::copy_from_slice(value));
    }

    fn capabilities(&self) -> SourceCapabilities {
        SourceCapabilities {
            counts_deliveries: true,
            dropped_delivery: Redelivery::AtOnce,
            lag: LagCounts::Waiting,
            failed_ack_redelivers: true,
            count_grows_across_cuts: true,
        }
    }
}
