//! The consumer side: [`RabbitSource`] reads outbox events from a RabbitMQ queue and hands
//! them to the inbox runner as [`RabbitDelivery`]s
//! ([`outbox_core::consumer::DeliverySource`] / [`outbox_core::consumer::Delivery`]).
//!
//! ```no_run
//! use outbox_core::consumer::{Delivery, DeliverySource};
//! use outbox_rabbitmq::{RabbitConsumerConfig, RabbitSource};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let mut source = RabbitSource::connect(
//!     "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10",
//!     RabbitConsumerConfig { queue: "payments-ledger".into(), ..Default::default() },
//! )
//! .await?;
//! for delivery in source.next_batch(100, Duration::from_secs(1)).await? {
//!     match delivery.event() {
//!         Ok(event) => println!("{} v{}", event.aggregate_id, event.aggregate_version),
//!         Err(why) => println!("malformed: {why}"),
//!     }
//!     delivery.ack().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Acknowledgements and prefetch
//!
//! The queue is consumed with `basic.consume` and **manual acknowledgements** (`no_ack =
//! false`) on a channel of its own, with `basic.qos(prefetch)` (per consumer). The broker
//! pushes at most [`RabbitConsumerConfig::prefetch`] unacknowledged messages to this consumer;
//! they wait in memory until [`next_batch`](outbox_core::consumer::DeliverySource::next_batch)
//! hands them out. A batch is therefore never larger than the prefetch: keep the prefetch at
//! or above the runner's batch size.
//!
//! A message is removed from the queue only by [`RabbitDelivery::ack`] (`basic.ack`, single).
//! [`RabbitDelivery::nack`] requeues it (`basic.nack`, `requeue = true`) after waiting; see
//! there. Dropping a [`RabbitDelivery`] without ack or nack requeues it at once (a
//! `basic.nack` with `requeue = true` sent in the background), so its prefetch slot is not
//! held until the connection ends.
//!
//! # Connection loss and redelivery
//!
//! lapin's automatic recovery is not used. When the connection or the channel breaks, the
//! broker returns every unacknowledged delivery of that channel to the queue and delivers it
//! again (with the `redelivered` flag) — that is the at-least-once contract, and the inbox
//! absorbs the duplicates. Acknowledging a delivery of a dead channel fails with
//! [`SourceErrorKind::Unavailable`]; it never reports a success that did not happen.
//!
//! The [`next_batch`](outbox_core::consumer::DeliverySource::next_batch) (or
//! [`lag`](outbox_core::consumer::DeliverySource::lag)) that notices the loss returns
//! [`SourceErrorKind::Unavailable`]; later calls reconnect lazily: a channel closed by a
//! channel-level error (or a consumer cancelled by the broker) is reopened on the same
//! connection at once, a lost connection is
//! reconnected no sooner than [`RabbitConsumerConfig::reconnect_min_delay_ms`] after the loss
//! was noticed and after the previous attempt (calls in between fail fast with `Unavailable`),
//! so an outage never becomes a reconnect loop. Every (re)connect declares and binds the queue
//! again (per the configuration) before consuming. Dead peers are detected by AMQP heartbeats,
//! negotiated with the broker; set an interval with `?heartbeat=10` in the URL.
//!
//! # Delivery counts
//!
//! [`RabbitDelivery::delivery_count`] (1 = first delivery) is the largest of:
//!
//! * `x-delivery-count` + 1, when the header is present. Quorum queues set it (it counts the
//!   *previous* deliveries, and is absent on the first one). This is the only count that
//!   survives a consumer restart: **use quorum queues** where the runner's `max_attempts` must
//!   hold across restarts.
//! * the count this source tracked: a bounded in-memory map (at most
//!   [`DELIVERY_COUNT_CAPACITY`] event ids, oldest evicted first; an entry is removed when the
//!   event is acknowledged) counting redeliveries of an event id seen by *this* source. It is
//!   lost on restart, and a redelivery to another consumer of the queue is not seen.
//! * 2 when the broker's `redelivered` flag is set, 1 otherwise.
//!
//! So a redelivered message always counts at least 2, but on classic queues the count can be
//! lower than the true number of deliveries after a restart.
//!
//! # Lag
//!
//! [`lag`](outbox_core::consumer::DeliverySource::lag) is the queue's `message_count` from a
//! passive `queue.declare` on a separate channel: the messages **ready** for delivery. Messages
//! delivered to a consumer and not yet acknowledged (at most the prefetch per consumer) are not
//! included.
//!
//! # Decoding
//!
//! The wire format is the one [`crate::RabbitTransport`] publishes (CloudEvents binary mode,
//! see the [crate documentation](crate)), decoded by [`outbox_core::wire::decode`]: attribute
//! `<name>` from header `cloudEvents_<name>`, the content type from the AMQP `content_type`
//! property, and every header not starting with `cloudEvents_` (e.g. `traceparent`, but also
//! broker headers such as `x-delivery-count`) as a user header. A live delivery is decoded from
//! its [`RawMessage`], exactly as [`RabbitSource::decode`] decodes a stored one, so both always
//! agree.
//!
//! [`RawMessage::headers`] holds every AMQP header as text: string values as received, numbers
//! and booleans in decimal / `true` / `false`, tables and arrays in a debug notation. A long
//! string or byte array that is not valid UTF-8 is kept byte for byte in
//! [`RawMessage::binary_headers`] instead: as a CloudEvents attribute it is
//! [`DecodeError::Invalid`], as a user header it reaches the handler with U+FFFD for the
//! invalid bytes. Attributes are expected as long strings (or byte arrays holding UTF-8 text);
//! `aggregateversion` and `schemaversion` may also be AMQP integers (the CloudEvents `Integer`
//! type), read through their decimal form; any other type is refused (see below). A body above
//! [`RabbitConsumerConfig::max_message_bytes`] decodes as [`DecodeError::TooLarge`]; every
//! attribute is bounded as [`outbox_core::wire::decode`] says. A header table that names a
//! header twice (RabbitMQ passes that on) reaches this source with the last value only, as
//! every AMQP client reads a table: lapin keeps one value per name.
//!
//! [`RawMessage::metadata`] holds the delivery's exchange, routing key, redelivered flag and
//! delivery tag, and every message property other than the content type and the headers
//! (`message_id`, `type`, `timestamp`, `app_id` ...), for the operator reading a dead letter.
//!
//! # Messages that break AMQP's rules
//!
//! RabbitMQ checks little of what a publisher sends, and passes the rest on byte for byte. A
//! message that breaks AMQP's own rules, or carries a CloudEvents attribute as a type that is
//! not text, is still a delivery: it decodes as [`DecodeError::Protocol`] with a reason naming
//! the place, so the runner dead-letters it (with its body and every header) and acknowledges
//! it, and the connection is not touched. The reason is also kept in
//! [`RawMessage::metadata`] under [`PROTOCOL_ERROR_KEY`], so a stored message decodes to the
//! same error. The dead letter keeps the event id and aggregate where their attributes are
//! readable ([`DeliverySource::identify`]); an attribute carried as a type that is not text is
//! not read for that (such headers are listed under [`REFUSED_ATTRIBUTES_KEY`]). Refused, in
//! this order:
//!
//! * a content type that is not UTF-8 text (one holding control characters, NUL included, is
//!   refused by [`outbox_core::wire::decode`] as an invalid `datacontenttype`);
//! * any other short-string property (`message_id`, `type`, `correlation_id`, `reply_to`,
//!   `app_id`, `user_id`, `content_encoding`, `expiration`, `cluster_id`) that is not UTF-8 text
//!   or holds a NUL byte, which AMQP forbids in short strings;
//! * a header name, at any depth of the header table, that is empty, not UTF-8 text, or holds
//!   a NUL byte;
//! * a header value that nests tables or arrays deeper than [`MAX_HEADER_DEPTH`] levels;
//! * a `cloudEvents_*` attribute carried as a boolean, a float or double, a decimal, a
//!   timestamp, a table, an array or a void (or as an integer, for attributes other than
//!   `aggregateversion` and `schemaversion`);
//! * an exchange or routing key (of `basic.deliver`) that is not UTF-8 text or holds a NUL
//!   byte.
//!
//! lapin's AMQP codec (amq-protocol-types, carried with a fix in `vendor/`) reads bytes that
//! are not UTF-8 in a short string as U+FFFD instead of dropping the connection, so those bytes
//! themselves are not kept: the dead letter shows U+FFFD where they were, and a U+FFFD sent as
//! such in those places is refused the same way. The codec parses header tables at most 64
//! levels deep; deeper ones, which used to overflow the stack of lapin's I/O thread and abort
//! the process, arrive as a byte array below that level, and such a header is refused here
//! for its depth. What RabbitMQ itself refuses at publish (an unknown field type, a field of
//! the specification's `U` type, bytes after the property list, an `expiration` that is not a
//! number, a `user_id` other than the publisher's user) never reaches a consumer: the broker
//! closes the publisher's connection.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Acker, BasicProperties, Channel, Connection, Consumer};
use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceError, SourceErrorKind};
use outbox_core::wire::{self, DecodeError, EventIdentity, IncomingEvent};
use serde::Deserialize;
use tracing::{debug, info, warn};

use crate::config::{MAX_SHORT_STRING, RABBITMQ_MAX_MESSAGE_BYTES, RabbitConfigError};
use crate::encode::CLOUDEVENTS_HEADER_PREFIX;
use crate::error::RabbitConnectError;
use crate::link::{Connector, Link, ReconnectState, Session, StepError};

/// Most event ids whose delivery counts a [`RabbitSource`] remembers (see the
/// [module documentation](self)).
pub const DELIVERY_COUNT_CAPACITY: usize = 100_000;

/// Upper bound of [`RabbitConsumerConfig::requeue_delay_cap_ms`]: 15 minutes, half of
/// RabbitMQ's default `consumer_timeout` (30 minutes), after which the broker closes a channel
/// that holds an unacknowledged delivery.
pub const MAX_REQUEUE_DELAY_CAP_MS: u64 = 15 * 60 * 1000;

/// The quorum-queue header counting previous deliveries.
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// The [`RawMessage::metadata`] key under which a delivery that breaks AMQP's rules keeps why
/// (see [Messages that break AMQP's rules](self#messages-that-break-amqps-rules)); decoding
/// such a message fails with [`DecodeError::Protocol`] and that reason.
pub const PROTOCOL_ERROR_KEY: &str = "protocol_error";

/// The [`RawMessage::metadata`] key listing (separated by spaces) the CloudEvents attribute
/// headers of a delivery whose AMQP type is not text; they are left out of its identity (see
/// [`DeliverySource::identify`]). The first one's reason is under [`PROTOCOL_ERROR_KEY`].
pub const REFUSED_ATTRIBUTES_KEY: &str = "protocol_error_attributes";

/// Deepest nesting of field tables and arrays in a header value this source accepts (a table
/// in a header is level 1).
pub const MAX_HEADER_DEPTH: usize = 16;

/// The CloudEvents attributes that may be carried as an AMQP integer (the CloudEvents
/// `Integer` type); every other attribute must be a string.
const INTEGER_ATTRIBUTES: [&str; 2] = [wire::attr::AGGREGATE_VERSION, wire::attr::SCHEMA_VERSION];

/// Settings of a [`RabbitSource`].
///
/// Deserialises from a configuration file; unknown keys are refused so a typo does not
/// silently fall back to a default.
///
/// ```
/// use outbox_rabbitmq::RabbitConsumerConfig;
/// let config = RabbitConsumerConfig {
///     queue: "ledger".into(),
///     ..RabbitConsumerConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// assert_eq!(config.bind_exchange.as_deref(), Some("outbox"));
/// assert_eq!(config.prefetch, 256);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RabbitConsumerConfig {
    /// Queue consumed. Default `outbox-consumer`.
    pub queue: String,
    /// Declare the queue (durable, not exclusive, not auto-delete, no arguments) on every
    /// (re)connect. Default `true`. Set `false` for a queue declared elsewhere, e.g. a quorum
    /// queue or one with a dead-letter exchange: declaring an existing queue with other
    /// arguments is refused by the broker.
    pub declare_queue: bool,
    /// Exchange the queue is bound to on every (re)connect, with
    /// [`binding_key`](Self::binding_key). Default `outbox` (the publisher's default). `None`
    /// or the empty string: no binding. The exchange must exist (the relay declares it).
    pub bind_exchange: Option<String>,
    /// Binding key. Default `#` (everything, on a topic exchange).
    pub binding_key: String,
    /// Most unacknowledged deliveries the broker pushes to this consumer (`basic.qos`),
    /// 1..=65535. Default 256. Also the largest possible batch.
    pub prefetch: u32,
    /// Largest body accepted; larger ones decode as [`DecodeError::TooLarge`] (and are
    /// dead-lettered by the runner). Default 8 MiB.
    pub max_message_bytes: usize,
    /// Longest wait of [`RabbitDelivery::nack`] before requeueing (RabbitMQ has no delayed
    /// requeue). Default 1000 ms; 0 requeues at once. At most [`MAX_REQUEUE_DELAY_CAP_MS`].
    pub requeue_delay_cap_ms: u64,
    /// Time allowed to connect, open the channel, declare and bind the queue and start
    /// consuming. Default 5 seconds.
    pub connect_timeout_secs: u64,
    /// Minimum pause between reconnect attempts, counted from the last attempt and from the
    /// moment a lost connection was noticed. Default 1000 ms.
    pub reconnect_min_delay_ms: u64,
    /// Custom CA and client certificate for `amqps://`. Default: the system's trust store, no
    /// client certificate.
    pub tls: crate::tls::RabbitTls,
}

impl Default for RabbitConsumerConfig {
    fn default() -> Self {
        Self {
            queue: "outbox-consumer".to_owned(),
            declare_queue: true,
            bind_exchange: Some("outbox".to_owned()),
            binding_key: "#".to_owned(),
            prefetch: 256,
            max_message_bytes: 8 * 1024 * 1024,
            requeue_delay_cap_ms: 1000,
            connect_timeout_secs: 5,
            reconnect_min_delay_ms: 1000,
            tls: crate::tls::RabbitTls::default(),
        }
    }
}

fn bad(key: &'static str, reason: impl Into<String>) -> Result<(), RabbitConfigError> {
    Err(RabbitConfigError {
        key,
        reason: reason.into(),
    })
}

impl RabbitConsumerConfig {
    /// Checks every setting.
    ///
    /// # Errors
    /// A [`RabbitConfigError`] naming the first offending key.
    pub fn validate(&self) -> Result<(), RabbitConfigError> {
        let queue = &self.queue;
        if queue.is_empty() || queue.len() > MAX_SHORT_STRING {
            return bad("queue", "must be 1..=255 bytes");
        }
        if queue.chars().any(char::is_control) {
            return bad("queue", "must not contain control characters");
        }
        if self.declare_queue && queue.starts_with("amq.") {
            return bad(
                "queue",
                "names starting with `amq.` are reserved by the broker: set declare_queue = false to consume one",
            );
        }
        if let Some(exchange) = self.exchange() {
            if exchange.len() > MAX_SHORT_STRING {
                return bad("bind_exchange", "must be at most 255 bytes");
            }
            if exchange.chars().any(char::is_control) {
                return bad("bind_exchange", "must not contain control characters");
            }
        }
        if self.binding_key.len() > MAX_SHORT_STRING {
            return bad("binding_key", "must be at most 255 bytes");
        }
        if self.prefetch == 0 || self.prefetch > u32::from(u16::MAX) {
            return bad(
                "prefetch",
                format!(
                    "must be 1..=65535 (0 would mean unlimited), got {}",
                    self.prefetch
                ),
            );
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > RABBITMQ_MAX_MESSAGE_BYTES {
            return bad(
                "max_message_bytes",
                format!(
                    "must be 1..={RABBITMQ_MAX_MESSAGE_BYTES}, got {}",
                    self.max_message_bytes
                ),
            );
        }
        if self.requeue_delay_cap_ms > MAX_REQUEUE_DELAY_CAP_MS {
            return bad(
                "requeue_delay_cap_ms",
                format!(
                    "must be at most {MAX_REQUEUE_DELAY_CAP_MS} (the broker closes channels holding a delivery for too long), got {}",
                    self.requeue_delay_cap_ms
                ),
            );
        }
        if self.connect_timeout_secs == 0 {
            return bad("connect_timeout_secs", "must be at least 1");
        }
        if self.reconnect_min_delay_ms == 0 {
            return bad(
                "reconnect_min_delay_ms",
                "must be at least 1, or an outage becomes a reconnect loop",
            );
        }
        self.tls.validate()
    }

    /// The exchange to bind to, if any (`None` and `""` both mean no binding).
    fn exchange(&self) -> Option<&str> {
        self.bind_exchange.as_deref().filter(|x| !x.is_empty())
    }

    fn connect_timeout(&self) -> Duration {
        Duration::from_secs(self.connect_timeout_secs)
    }

    fn reconnect_min_delay(&self) -> Duration {
        Duration::from_millis(self.reconnect_min_delay_ms)
    }

    fn requeue_delay_cap(&self) -> Duration {
        Duration::from_millis(self.requeue_delay_cap_ms)
    }
}

/// Why [`RabbitSource::connect`] failed. Nothing is retried at startup.
///
/// The same type as the transport's [`RabbitConnectError`]: both sides reach the broker the same
/// way, so they fail the same way; only the setup steps differ (see
/// [`RabbitConnectError::Setup`]).
pub type RabbitConsumerError = RabbitConnectError;

fn is_not_found(err: &lapin::Error) -> bool {
    matches!(
        err.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if amqp.kind() == &AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)
    )
}

fn unavailable(message: impl Into<String>) -> SourceError {
    SourceError::new(SourceErrorKind::Unavailable, message)
}

/// One connection, the consuming channel and its consumer.
type ConsumerLink = Link<Consuming>;

/// What a [`ConsumerLink`] keeps beside its connection and channel.
pub(crate) struct Consuming {
    consumer: Consumer,
    /// A channel for `lag`, opened on first use; a passive declare of a missing queue closes it.
    inspect: Option<Channel>,
}

/// What the source opens on a connection: its channel, the queue declared and bound as
/// configured, `basic.qos(prefetch)` and the consumer.
impl Session for RabbitConsumerConfig {
    type Parts = Consuming;

    fn describe(&self) -> String {
        format!("consumer of queue `{}`", self.queue)
    }

    async fn open(&self, connection: &Connection) -> Result<(Channel, Consuming), StepError> {
        let queue = ShortString::from(self.queue.as_str());
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| ("channel.open", e))?;
        if self.declare_queue {
            channel
                .queue_declare(
                    queue.clone(),
                    QueueDeclareOptions::durable(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| ("queue.declare", e))?;
        }
        if let Some(exchange) = self.exchange() {
            channel
                .queue_bind(
                    queue.clone(),
                    exchange.into(),
                    self.binding_key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| ("queue.bind", e))?;
        }
        let prefetch = u16::try_from(self.prefetch).unwrap_or(u16::MAX);
        channel
            .basic_qos(prefetch, BasicQosOptions { global: false })
            .await
            .map_err(|e| ("basic.qos", e))?;
        // Manual acknowledgements: a delivery leaves the queue only when it is acked.
        let manual_ack = BasicConsumeOptions {
            no_ack: false,
            ..BasicConsumeOptions::default()
        };
        let consumer = channel
            .basic_consume(
                queue,
                ShortString::from(""),
                manual_ack,
                FieldTable::default(),
            )
            .await
            .map_err(|e| ("basic.consume", e))?;
        Ok((
            channel,
            Consuming {
                consumer,
                inspect: None,
            },
        ))
    }
}

/// Reads outbox events from a RabbitMQ queue; see the [module documentation](self).
///
/// Implements [`DeliverySource`]. Deliveries it returns are acknowledged independently of it
/// (they may be acked or nacked concurrently while the next batch is fetched); dropping the
/// source closes its connection, and the broker redelivers whatever was not acknowledged.
pub struct RabbitSource {
    connector: Connector,
    config: RabbitConsumerConfig,
    link: Option<ConsumerLink>,
    state: ReconnectState,
    counts: Arc<Mutex<DeliveryCounts>>,
}

impl fmt::Debug for RabbitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitSource")
            .field("endpoint", &self.connector.endpoint())
            .field("queue", &self.config.queue)
            .field("connected", &self.is_connected())
            .finish_non_exhaustive()
    }
}

impl RabbitSource {
    /// Validates `config`, connects to the broker at `url`, opens a channel, declares the queue
    /// (with `declare_queue`), binds it (with `bind_exchange`), sets `basic.qos(prefetch)` and
    /// starts consuming with manual acknowledgements.
    ///
    /// The whole sequence is bounded by `connect_timeout_secs` and tried once: an unreachable
    /// broker is an error here, not a retry loop. Once connected, a lost connection is
    /// re-established lazily by later calls.
    ///
    /// # Errors
    /// * [`RabbitConsumerError::Config`] for an invalid `config`, naming the key, including TLS
    ///   files that cannot be read or are given with an `amqp://` URL;
    /// * [`RabbitConsumerError::InvalidUrl`] for a malformed `url`;
    /// * [`RabbitConsumerError::Unreachable`] when the TCP connection or the AMQP handshake
    ///   (credentials, vhost) fails;
    /// * [`RabbitConsumerError::TimedOut`] when it all took longer than `connect_timeout_secs`;
    /// * [`RabbitConsumerError::Setup`] when a step is refused: the queue exists with other
    ///   arguments, the exchange to bind to or the queue (without `declare_queue`) does not
    ///   exist, or permissions are missing.
    pub async fn connect(
        url: &str,
        config: RabbitConsumerConfig,
    ) -> Result<Self, RabbitConsumerError> {
        config.validate()?;
        let name = format!("outbox-consumer {}", config.queue);
        let name: String = name.chars().take(MAX_SHORT_STRING / 4).collect();
        let connector = Connector::new(
            url,
            &config.tls,
            name,
            config.connect_timeout(),
            config.reconnect_min_delay(),
        )?;
        let mut state = ReconnectState::default();
        let link = connector.connect(&config, &mut state).await?;
        info!(
            endpoint = %connector.endpoint(),
            queue = %config.queue,
            "consuming from RabbitMQ"
        );
        Ok(Self {
            connector,
            config,
            link: Some(link),
            state,
            counts: Arc::new(Mutex::new(DeliveryCounts::new(DELIVERY_COUNT_CAPACITY))),
        })
    }

    /// True while the connection and the consuming channel are open. A `false` is repaired by
    /// a later [`next_batch`](DeliverySource::next_batch). Suitable for a readiness probe.
    pub fn is_connected(&self) -> bool {
        self.link.as_ref().is_some_and(Link::usable)
    }

    /// The settings this source was built with.
    pub fn config(&self) -> &RabbitConsumerConfig {
        &self.config
    }

    /// `host:port/vhost` of the broker, without credentials.
    pub fn endpoint(&self) -> &str {
        self.connector.endpoint()
    }

    /// Closes the connection gracefully. Deliveries not yet acknowledged are redelivered by
    /// the broker; acknowledging them afterwards fails. Later calls reconnect as after a
    /// connection loss.
    pub async fn close(&mut self) {
        if let Some(link) = self.link.take() {
            self.state.lost();
            link.close().await;
        }
    }

    /// The working link, repaired (see `link.rs`) if it broke and the reconnect delay allows.
    async fn ensure_link(&mut self) -> Result<&mut ConsumerLink, SourceError> {
        let link = match self.link.take() {
            Some(link) if link.usable() => link,
            old => self
                .connector
                .repair(&self.config, &mut self.state, old.as_ref())
                .await
                .map_err(|e| {
                    let kind = if e.refused {
                        SourceErrorKind::Other
                    } else {
                        SourceErrorKind::Unavailable
                    };
                    SourceError::new(kind, e.message)
                })?,
        };
        Ok(self.link.insert(link))
    }

    fn wrap(&self, delivery: lapin::message::Delivery) -> RabbitDelivery {
        let lapin::message::Delivery {
            delivery_tag,
            exchange,
            routing_key,
            redelivered,
            properties,
            data,
            acker,
        } = delivery;
        let mut raw = raw_message(&properties, Bytes::from(data));
        for (key, value) in [
            ("exchange", exchange.to_string()),
            ("routing_key", routing_key.to_string()),
            ("redelivered", redelivered.to_string()),
            ("delivery_tag", delivery_tag.to_string()),
        ] {
            raw.metadata.insert(key.to_owned(), value);
        }
        if !raw.metadata.contains_key(PROTOCOL_ERROR_KEY)
            && let Some(fault) = delivery_fault(exchange.as_str(), routing_key.as_str())
        {
            raw.metadata.insert(PROTOCOL_ERROR_KEY.to_owned(), fault);
        }
        let event = decode_raw(&raw, self.config.max_message_bytes);
        let previous = previous_deliveries(&properties);
        let key = tracking_key(&raw, &properties);
        let delivery_count = self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(key.as_deref(), redelivered, previous);
        RabbitDelivery {
            acker: Some(acker),
            event,
            raw,
            delivery_count,
            requeue_delay_cap: self.config.requeue_delay_cap(),
            counts: Arc::clone(&self.counts),
            key,
        }
    }

    async fn take_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<RabbitDelivery>, SourceError> {
        let endpoint = self.connector.endpoint().to_owned();
        let link = self.ensure_link().await?;
        let first = match tokio::time::timeout(wait, link.parts.consumer.next()).await {
            Err(_) => return Ok(Vec::new()),
            Ok(Some(Ok(d))) => d,
            Ok(Some(Err(e))) => {
                link.mark_channel_failed();
                return Err(unavailable(format!(
                    "RabbitMQ consumer at {endpoint} failed: {e}"
                )));
            }
            Ok(None) => {
                link.mark_channel_failed();
                return Err(unavailable(format!(
                    "RabbitMQ at {endpoint} cancelled the consumer (queue deleted?)"
                )));
            }
        };
        let mut raw = vec![first];
        while raw.len() < max {
            match link.parts.consumer.next().now_or_never() {
                None => break,
                Some(Some(Ok(d))) => raw.push(d),
                Some(Some(Err(e))) => {
                    // Hand out what arrived; acking it fails if the channel is gone, and the
                    // next call reports the loss.
                    warn!(error = %e, "RabbitMQ consumer failed");
                    link.mark_channel_failed();
                    break;
                }
                Some(None) => {
                    link.mark_channel_failed();
                    break;
                }
            }
        }
        Ok(raw.into_iter().map(|d| self.wrap(d)).collect())
    }

    async fn ready_messages(&mut self) -> Result<Option<u64>, SourceError> {
        let queue = ShortString::from(self.config.queue.as_str());
        let timeout = self.config.connect_timeout();
        let endpoint = self.connector.endpoint().to_owned();
        let link = self.ensure_link().await?;
        let inspect = &mut link.parts.inspect;
        let channel = match inspect.as_ref().filter(|c| c.status().connected()) {
            Some(c) => c.clone(),
            None => {
                let c = tokio::time::timeout(timeout, link.connection.create_channel())
                    .await
                    .map_err(|_| unavailable("opening a channel for lag timed out"))?
                    .map_err(|e| unavailable(format!("opening a channel for lag: {e}")))?;
                *inspect = Some(c.clone());
                c
            }
        };
        let declared = tokio::time::timeout(
            timeout,
            channel.queue_declare(
                queue,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .map_err(|_| unavailable("queue.declare (passive) for lag timed out"))?;
        match declared {
            Ok(q) => Ok(Some(u64::from(q.message_count()))),
            Err(e) => {
                *inspect = None;
                let kind = if is_not_found(&e) {
                    SourceErrorKind::Other
                } else {
                    SourceErrorKind::Unavailable
                };
                Err(SourceError::new(
                    kind,
                    format!("queue.declare (passive) on {endpoint}: {e}"),
                ))
            }
        }
    }
}

impl DeliverySource for RabbitSource {
    type Delivery = RabbitDelivery;

    /// Waits up to `wait` for the first delivery, then takes whatever else has already arrived,
    /// up to `max` (and never more than the prefetch).
    ///
    /// # Errors
    /// [`SourceErrorKind::Unavailable`] when the connection or channel was lost or is not yet
    /// re-established; [`SourceErrorKind::Other`] when reconnecting was refused (e.g. the queue
    /// no longer exists and `declare_queue` is off).
    async fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<RabbitDelivery>, SourceError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        self.take_batch(max, wait).await
    }

    /// The queue's **ready** messages (passive `queue.declare`); deliveries in flight to
    /// consumers and not yet acknowledged are not included.
    ///
    /// # Errors
    /// [`SourceErrorKind::Unavailable`] without a connection; [`SourceErrorKind::Other`] when
    /// the queue does not exist.
    fn lag(&mut self) -> impl Future<Output = Result<Option<u64>, SourceError>> + Send {
        self.ready_messages()
    }

    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        decode_raw(raw, self.config.max_message_bytes)
    }

    fn identify(&self, raw: &RawMessage) -> EventIdentity {
        identify_raw(raw)
    }
}

/// One message delivered by a [`RabbitSource`].
///
/// Dropping it without [`ack`](Delivery::ack) or [`nack`](Delivery::nack) requeues it in the
/// background (when a Tokio runtime is available; otherwise it stays unacknowledged until the
/// channel closes).
pub struct RabbitDelivery {
    /// `None` once settled.
    acker: Option<Acker>,
    event: Result<IncomingEvent, DecodeError>,
    raw: RawMessage,
    delivery_count: u32,
    requeue_delay_cap: Duration,
    counts: Arc<Mutex<DeliveryCounts>>,
    key: Option<String>,
}

impl fmt::Debug for RabbitDelivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitDelivery")
            .field("event_id", &self.key)
            .field("delivery_count", &self.delivery_count)
            .field("malformed", &self.event.as_ref().err())
            .finish_non_exhaustive()
    }
}

impl RabbitDelivery {
    fn take_acker(&mut self) -> Result<Acker, SourceError> {
        self.acker
            .take()
            .ok_or_else(|| SourceError::new(SourceErrorKind::Other, "delivery already settled"))
    }
}

fn dead_channel(what: &str) -> SourceError {
    unavailable(format!(
        "{what} not sent: the channel of this delivery was closed; the broker redelivers it"
    ))
}

impl Delivery for RabbitDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        &self.event
    }

    fn raw(&self) -> &RawMessage {
        &self.raw
    }

    /// Always `Some`; see the [module documentation](self) for how it is counted.
    fn delivery_count(&self) -> Option<u32> {
        Some(self.delivery_count)
    }

    /// `basic.ack` of this delivery only.
    ///
    /// # Errors
    /// [`SourceErrorKind::Unavailable`] when the channel it came on is closed (the broker
    /// redelivers it) or the ack could not be sent.
    async fn ack(mut self) -> Result<(), SourceError> {
        let acker = self.take_acker()?;
        match acker.ack(BasicAckOptions { multiple: false }).await {
            Ok(true) => {
                if let Some(key) = &self.key {
                    self.counts
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .forget(key);
                }
                Ok(())
            }
            Ok(false) => Err(dead_channel("basic.ack")),
            Err(e) => Err(unavailable(format!("basic.ack: {e}"))),
        }
    }

    /// Waits `min(delay, requeue_delay_cap_ms)`, then `basic.nack` with `requeue = true`.
    ///
    /// RabbitMQ has no per-message redelivery delay: a requeued message is delivered again at
    /// once (to this or another consumer, at or near the head of the queue). The wait happens
    /// here, holding the delivery — and its prefetch slot — for at most the cap. Longer
    /// backoffs need a delay/retry queue topology set up outside this crate.
    ///
    /// # Errors
    /// [`SourceErrorKind::Unavailable`] when the channel it came on is closed (the broker
    /// redelivers it anyway) or the nack could not be sent.
    async fn nack(mut self, delay: Duration) -> Result<(), SourceError> {
        if !self.acker.as_ref().is_some_and(Acker::usable) {
            // Drop does nothing for an unusable acker.
            return Err(dead_channel("basic.nack"));
        }
        let pause = delay.min(self.requeue_delay_cap);
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let acker = self.take_acker()?;
        match acker
            .nack(BasicNackOptions {
                multiple: false,
                requeue: true,
            })
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(dead_channel("basic.nack")),
            Err(e) => Err(unavailable(format!("basic.nack: {e}"))),
        }
    }
}

impl Drop for RabbitDelivery {
    fn drop(&mut self) {
        let Some(acker) = self.acker.take() else {
            return;
        };
        if !acker.usable() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let requeue = BasicNackOptions {
                    multiple: false,
                    requeue: true,
                };
                if let Err(e) = acker.nack(requeue).await {
                    debug!(error = %e, "requeueing a dropped delivery failed; the broker redelivers it when the channel closes");
                }
            });
        }
    }
}

/// Renders an AMQP header value as text for [`RawMessage::headers`].
pub(crate) fn value_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::ByteArray(b) => String::from_utf8_lossy(b.as_slice()).into_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        AMQPValue::DecimalValue(d) => decimal_text(d.value, d.scale),
        AMQPValue::Void => String::new(),
        other @ (AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_)) => format!("{other:?}"),
    }
}

fn decimal_text(value: u32, scale: u8) -> String {
    let digits = value.to_string();
    let scale = usize::from(scale);
    if scale == 0 {
        return digits;
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{int}.{frac}")
}

/// An AMQP header value as [`RawMessage`] keeps it: its text, or the bytes of a long string or
/// byte array that is not valid UTF-8.
pub(crate) fn header_value(value: &AMQPValue) -> Result<String, Bytes> {
    let bytes = match value {
        AMQPValue::LongString(s) => s.as_bytes(),
        AMQPValue::ByteArray(b) => b.as_slice(),
        other => return Ok(value_text(other)),
    };
    String::from_utf8(bytes.to_vec()).map_err(|e| Bytes::from(e.into_bytes()))
}

/// The message as received: body, every header (text, or bytes when not UTF-8), content type,
/// and the message properties as metadata.
pub(crate) fn raw_message(properties: &BasicProperties, body: Bytes) -> RawMessage {
    let mut raw = RawMessage {
        payload: body,
        content_type: properties
            .content_type()
            .as_ref()
            .map(|c| c.as_str().to_owned()),
        ..RawMessage::default()
    };
    if let Some(table) = properties.headers() {
        for (name, value) in table.inner() {
            let name = name.as_str().to_owned();
            match header_value(value) {
                Ok(text) => {
                    raw.headers.insert(name, text);
                }
                Err(bytes) => {
                    raw.binary_headers.insert(name, bytes);
                }
            }
        }
    }
    let text = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_owned());
    let number = |v: Option<u64>| v.map(|n| n.to_string());
    for (key, value) in [
        ("message_id", text(properties.message_id())),
        ("type", text(properties.kind())),
        ("timestamp", number(*properties.timestamp())),
        ("app_id", text(properties.app_id())),
        ("user_id", text(properties.user_id())),
        ("correlation_id", text(properties.correlation_id())),
        ("reply_to", text(properties.reply_to())),
        ("expiration", text(properties.expiration())),
        ("content_encoding", text(properties.content_encoding())),
        ("cluster_id", text(properties.cluster_id())),
        (
            "delivery_mode",
            number(properties.delivery_mode().map(u64::from)),
        ),
        ("priority", number(properties.priority().map(u64::from))),
    ] {
        if let Some(value) = value {
            raw.metadata.insert(key.to_owned(), value);
        }
    }
    if let Some(fault) = properties_fault(properties) {
        raw.metadata.insert(PROTOCOL_ERROR_KEY.to_owned(), fault);
    }
    let refused: Vec<String> = properties
        .headers()
        .as_ref()
        .map(attribute_type_faults)
        .unwrap_or_default()
        .into_iter()
        .map(|(header, _)| header)
        .collect();
    if !refused.is_empty() {
        raw.metadata
            .insert(REFUSED_ATTRIBUTES_KEY.to_owned(), refused.join(" "));
    }
    raw
}

/// A CloudEvents attribute's text header, by its bare name. A header whose AMQP type was
/// refused (see [`REFUSED_ATTRIBUTES_KEY`]) is not read: its text is a rendering (a table's debug
/// notation, a boolean's `true`), not a value the producer gave.
fn attribute(raw: &RawMessage, name: &str) -> Option<String> {
    let header = format!("{CLOUDEVENTS_HEADER_PREFIX}{name}");
    let refused = raw
        .metadata
        .get(REFUSED_ATTRIBUTES_KEY)
        .is_some_and(|list| list.split(' ').any(|h| h == header));
    if refused {
        return None;
    }
    raw.headers.get(&header).cloned()
}

/// What [`decode_raw`] would read of a message's identity, attribute by attribute
/// ([`wire::identify`]): the event id and aggregate a malformed message's dead letter keeps.
/// An attribute found only among the binary headers is not read.
pub(crate) fn identify_raw(raw: &RawMessage) -> EventIdentity {
    wire::identify(|name| attribute(raw, name))
}

/// What is wrong with a short string by AMQP's rules (UTF-8, no NUL), if anything. lapin's
/// codec reads bytes that are not UTF-8 as U+FFFD, so a U+FFFD sent as such is refused too.
fn short_string_fault(s: &str) -> Option<&'static str> {
    if s.contains(char::REPLACEMENT_CHARACTER) {
        Some("is not UTF-8 text")
    } else if s.contains('\0') {
        Some("holds a NUL byte")
    } else {
        None
    }
}

/// The first way the exchange or routing key of a delivery break AMQP's rules.
fn delivery_fault(exchange: &str, routing_key: &str) -> Option<String> {
    [("exchange", exchange), ("routing key", routing_key)]
        .into_iter()
        .find_map(|(what, value)| {
            short_string_fault(value)
                .map(|fault| format!("the {what} `{}` {fault}", wire::excerpt(value)))
        })
}

/// The first way a message's properties and header table break AMQP's rules or carry a
/// CloudEvents attribute as a type that is not text; see the module documentation.
fn properties_fault(properties: &BasicProperties) -> Option<String> {
    if let Some(content_type) = properties.content_type()
        && content_type.as_str().contains(char::REPLACEMENT_CHARACTER)
    {
        return Some(format!(
            "the content type `{}` is not UTF-8 text",
            wire::excerpt(content_type.as_str())
        ));
    }
    for (name, value) in [
        ("content_encoding", properties.content_encoding()),
        ("correlation_id", properties.correlation_id()),
        ("reply_to", properties.reply_to()),
        ("expiration", properties.expiration()),
        ("message_id", properties.message_id()),
        ("type", properties.kind()),
        ("user_id", properties.user_id()),
        ("app_id", properties.app_id()),
        ("cluster_id", properties.cluster_id()),
    ] {
        if let Some(value) = value
            && let Some(fault) = short_string_fault(value.as_str())
        {
            return Some(format!(
                "the property `{name}` `{}` {fault}",
                wire::excerpt(value.as_str())
            ));
        }
    }
    let table = properties.headers().as_ref()?;
    for (name, value) in table.inner() {
        if let Some(fault) = header_fault(name.as_str(), value) {
            return Some(fault);
        }
    }
    attribute_type_faults(table)
        .into_iter()
        .next()
        .map(|(_, fault)| fault)
}

/// Every CloudEvents attribute header of `table` carried as a type that is not text (an integer
/// is text for `aggregateversion` and `schemaversion`), with the reason.
fn attribute_type_faults(table: &FieldTable) -> Vec<(String, String)> {
    wire::attr::ALL.into_iter().filter_map(|name| {
        let header = format!("{CLOUDEVENTS_HEADER_PREFIX}{name}");
        let value = table.inner().get(header.as_str())?;
        let text = matches!(
            value,
            AMQPValue::LongString(_) | AMQPValue::ShortString(_) | AMQPValue::ByteArray(_)
        );
        let integer = matches!(
            value,
            AMQPValue::ShortShortInt(_)
                | AMQPValue::ShortShortUInt(_)
                | AMQPValue::ShortInt(_)
                | AMQPValue::ShortUInt(_)
                | AMQPValue::LongInt(_)
                | AMQPValue::LongUInt(_)
                | AMQPValue::LongLongInt(_)
        );
        let allowed = text || (integer && INTEGER_ATTRIBUTES.contains(&name));
        (!allowed).then(|| {
            let fault = format!(
                "the CloudEvents attribute `{name}` (header `{header}`) is an AMQP {}, not a string",
                type_name(value)
            );
            (header, fault)
        })
    })
    .collect()
}

/// What is wrong with the header `name` (its name, or the names and nesting inside a table or
/// array value), if anything.
fn header_fault(name: &str, value: &AMQPValue) -> Option<String> {
    fn name_fault(name: &str) -> Option<String> {
        if name.is_empty() {
            return Some("a header has an empty name".to_owned());
        }
        short_string_fault(name)
            .map(|fault| format!("the header name `{}` {fault}", wire::excerpt(name)))
    }
    /// `value` is at nesting level `level` (a header value is level 0).
    fn inside(header: &str, value: &AMQPValue, level: usize) -> Option<String> {
        let deeper = |level: usize| {
            (level > MAX_HEADER_DEPTH).then(|| {
                format!(
                    "the header `{}` nests tables or arrays deeper than {MAX_HEADER_DEPTH} levels",
                    wire::excerpt(header)
                )
            })
        };
        match value {
            AMQPValue::FieldTable(table) => deeper(level + 1).or_else(|| {
                table.inner().iter().find_map(|(name, value)| {
                    name_fault(name.as_str()).or_else(|| inside(header, value, level + 1))
                })
            }),
            AMQPValue::FieldArray(array) => deeper(level + 1).or_else(|| {
                array
                    .as_slice()
                    .iter()
                    .find_map(|value| inside(header, value, level + 1))
            }),
            _ => None,
        }
    }
    name_fault(name).or_else(|| inside(name, value, 0))
}

/// The AMQP name of a field value's type, for reasons.
fn type_name(value: &AMQPValue) -> &'static str {
    match value {
        AMQPValue::Boolean(_) => "boolean",
        AMQPValue::ShortShortInt(_) => "short-short-int",
        AMQPValue::ShortShortUInt(_) => "short-short-uint",
        AMQPValue::ShortInt(_) => "short-int",
        AMQPValue::ShortUInt(_) => "short-uint",
        AMQPValue::LongInt(_) => "long-int",
        AMQPValue::LongUInt(_) => "long-uint",
        AMQPValue::LongLongInt(_) => "long-long-int",
        AMQPValue::Float(_) => "float",
        AMQPValue::Double(_) => "double",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) => "short string",
        AMQPValue::LongString(_) => "long string",
        AMQPValue::FieldArray(_) => "field array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "field table",
        AMQPValue::ByteArray(_) => "byte array",
        AMQPValue::Void => "void",
    }
}

/// Decodes the wire format from a raw message; the one decoding path for live and stored
/// messages.
pub(crate) fn decode_raw(raw: &RawMessage, max_bytes: usize) -> Result<IncomingEvent, DecodeError> {
    if let Some(fault) = raw.metadata.get(PROTOCOL_ERROR_KEY) {
        return Err(DecodeError::Protocol(fault.clone()));
    }
    for name in wire::attr::ALL {
        if let Some(bytes) = raw
            .binary_headers
            .get(&format!("{CLOUDEVENTS_HEADER_PREFIX}{name}"))
        {
            return Err(DecodeError::Invalid {
                name,
                value: format!("not UTF-8 text ({} bytes)", bytes.len()),
            });
        }
    }
    let binary_as_text = raw
        .binary_headers
        .iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(v).into_owned()));
    let user_headers = raw
        .headers
        .iter()
        .map(|(k, v)| (k, v.clone()))
        .chain(binary_as_text)
        // The binding's attributes are `cloudEvents_*`, exactly; a header with the prefix in
        // another case is not one, yet reserved all the same (producers may not send one), so
        // it is not handed to the application as a user header either.
        .filter(|(k, _)| {
            !k.get(..CLOUDEVENTS_HEADER_PREFIX.len())
                .is_some_and(|p| p.eq_ignore_ascii_case(CLOUDEVENTS_HEADER_PREFIX))
        })
        .map(|(k, v)| (k.clone(), v))
        .collect();
    wire::decode(
        |name| attribute(raw, name),
        raw.content_type.clone(),
        raw.payload.clone(),
        user_headers,
        max_bytes,
    )
}

/// `x-delivery-count` (previous deliveries, quorum queues), when present and numeric.
fn previous_deliveries(properties: &BasicProperties) -> Option<u32> {
    let value = properties
        .headers()
        .as_ref()?
        .inner()
        .get(DELIVERY_COUNT_HEADER)?;
    let n: i128 = match value {
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => (*n).into(),
        AMQPValue::Timestamp(n) => (*n).into(),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
            .ok()?
            .trim()
            .parse()
            .ok()?,
        AMQPValue::ShortString(s) => s.as_str().trim().parse().ok()?,
        _ => return None,
    };
    (n >= 0).then(|| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The event id used to track redeliveries: the `cloudEvents_id` header, else `message_id`.
fn tracking_key(raw: &RawMessage, properties: &BasicProperties) -> Option<String> {
    raw.headers
        .get(&format!("{CLOUDEVENTS_HEADER_PREFIX}{}", wire::attr::ID))
        .cloned()
        .or_else(|| {
            properties
                .message_id()
                .as_ref()
                .map(|m| m.as_str().to_owned())
        })
        .filter(|k| !k.is_empty())
}

/// Bounded map event id → deliveries seen by this source; oldest entries evicted first.
struct DeliveryCounts {
    capacity: usize,
    next_seq: u64,
    by_key: HashMap<String, (u32, u64)>,
    by_age: BTreeMap<u64, String>,
}

impl DeliveryCounts {
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            next_seq: 0,
            by_key: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    /// Records one delivery and returns its count (1 = first).
    fn observe(&mut self, key: Option<&str>, redelivered: bool, previous: Option<u32>) -> u32 {
        let from_header = previous.map_or(0, |p| p.saturating_add(1));
        let Some(key) = key else {
            return from_header.max(if redelivered { 2 } else { 1 });
        };
        let tracked = if redelivered {
            self.by_key
                .get(key)
                .map_or(2, |(n, _)| n.saturating_add(1))
                .max(2)
        } else {
            // Not redelivered: a new message (possibly a republish of the same event id).
            1
        };
        let count = tracked.max(from_header);
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some((_, old_seq)) = self.by_key.insert(key.to_owned(), (count, seq)) {
            self.by_age.remove(&old_seq);
        }
        self.by_age.insert(seq, key.to_owned());
        while self.by_key.len() > self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.by_key.remove(&oldest);
        }
        count
    }

    /// Forgets an acknowledged event id.
    fn forget(&mut self, key: &str) {
        if let Some((_, seq)) = self.by_key.remove(key) {
            self.by_age.remove(&seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::{FieldArray, LongString};

    use super::*;

    #[test]
    fn defaults_and_unknown_keys() {
        let c: RabbitConsumerConfig = serde_json::from_str(r#"{"queue":"ledger"}"#).unwrap();
        assert_eq!(c.queue, "ledger");
        assert_eq!(c.prefetch, 256);
        assert_eq!(c.max_message_bytes, 8 * 1024 * 1024);
        assert_eq!(c.requeue_delay_cap_ms, 1000);
        assert_eq!(c.connect_timeout_secs, 5);
        assert!(c.declare_queue);
        assert_eq!(c.bind_exchange.as_deref(), Some("outbox"));
        assert_eq!(c.binding_key, "#");
        c.validate().unwrap();
        let err = serde_json::from_str::<RabbitConsumerConfig>(r#"{"prefech":1}"#).unwrap_err();
        assert!(err.to_string().contains("prefech"), "{err}");
        let none: RabbitConsumerConfig = serde_json::from_str(r#"{"bind_exchange":null}"#).unwrap();
        assert_eq!(none.exchange(), None);
        let empty = RabbitConsumerConfig {
            bind_exchange: Some(String::new()),
            ..Default::default()
        };
        empty.validate().unwrap();
        assert_eq!(empty.exchange(), None);
    }

    #[test]
    fn validate_names_the_key() {
        let cases = [
            (
                RabbitConsumerConfig {
                    queue: String::new(),
                    ..Default::default()
                },
                "queue",
            ),
            (
                RabbitConsumerConfig {
                    queue: "q".repeat(256),
                    ..Default::default()
                },
                "queue",
            ),
            (
                RabbitConsumerConfig {
                    queue: "amq.gen-1".into(),
                    ..Default::default()
                },
                "queue",
            ),
            (
                RabbitConsumerConfig {
                    bind_exchange: Some("x".repeat(256)),
                    ..Default::default()
                },
                "bind_exchange",
            ),
            (
                RabbitConsumerConfig {
                    binding_key: "k".repeat(256),
                    ..Default::default()
                },
                "binding_key",
            ),
            (
                RabbitConsumerConfig {
                    prefetch: 0,
                    ..Default::default()
                },
                "prefetch",
            ),
            (
                RabbitConsumerConfig {
                    prefetch: 65_536,
                    ..Default::default()
                },
                "prefetch",
            ),
            (
                RabbitConsumerConfig {
                    max_message_bytes: 0,
                    ..Default::default()
                },
                "max_message_bytes",
            ),
            (
                RabbitConsumerConfig {
                    requeue_delay_cap_ms: MAX_REQUEUE_DELAY_CAP_MS + 1,
                    ..Default::default()
                },
                "requeue_delay_cap_ms",
            ),
            (
                RabbitConsumerConfig {
                    connect_timeout_secs: 0,
                    ..Default::default()
                },
                "connect_timeout_secs",
            ),
            (
                RabbitConsumerConfig {
                    reconnect_min_delay_ms: 0,
                    ..Default::default()
                },
                "reconnect_min_delay_ms",
            ),
        ];
        for (config, key) in cases {
            let err = config.validate().unwrap_err();
            assert_eq!(err.key, key, "{err}");
            assert!(err.to_string().contains(key));
        }
        RabbitConsumerConfig {
            queue: "amq.direct-consumer".into(),
            declare_queue: false,
            requeue_delay_cap_ms: 0,
            ..Default::default()
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn header_values_as_text() {
        assert_eq!(
            value_text(&AMQPValue::LongString(LongString::from("zahlung-ü"))),
            "zahlung-ü"
        );
        assert_eq!(
            value_text(&AMQPValue::LongString(LongString::from(vec![b'a', 0xff]))),
            "a\u{fffd}"
        );
        assert_eq!(value_text(&AMQPValue::ShortString("s".into())), "s");
        assert_eq!(value_text(&AMQPValue::LongLongInt(-3)), "-3");
        assert_eq!(value_text(&AMQPValue::Boolean(true)), "true");
        assert_eq!(decimal_text(12345, 2), "123.45");
        assert_eq!(decimal_text(5, 3), "0.005");
        assert_eq!(decimal_text(7, 0), "7");
        assert!(!value_text(&AMQPValue::FieldArray(FieldArray::default())).is_empty());
        assert_eq!(
            header_value(&AMQPValue::LongString(LongString::from(vec![b'a', 0xff]))),
            Err(Bytes::from_static(&[b'a', 0xff])),
            "bytes that are not UTF-8 are kept as bytes"
        );
        assert_eq!(
            header_value(&AMQPValue::LongString(LongString::from("a\0b"))),
            Ok("a\0b".to_owned())
        );
    }

    #[test]
    fn an_attribute_that_is_not_text_is_invalid_and_kept_as_bytes() {
        let body = Bytes::from_static(b"{}");
        let p = props(vec![
            (
                "cloudEvents_specversion",
                AMQPValue::LongString("1.0".into()),
            ),
            (
                "cloudEvents_aggregateid",
                AMQPValue::LongString(LongString::from(vec![b'p', 0xfe, 0xff])),
            ),
            ("trace", AMQPValue::ByteArray(vec![0xc3, 0x28].into())),
        ])
        .with_message_id("m-1".into())
        .with_timestamp(7);
        let raw = raw_message(&p, body);
        assert_eq!(
            raw.binary_headers["cloudEvents_aggregateid"],
            Bytes::from_static(&[b'p', 0xfe, 0xff])
        );
        assert!(!raw.headers.contains_key("cloudEvents_aggregateid"));
        assert_eq!(
            raw.binary_headers["trace"],
            Bytes::from_static(&[0xc3, 0x28])
        );
        assert_eq!(raw.metadata["message_id"], "m-1");
        assert_eq!(raw.metadata["timestamp"], "7");
        assert_eq!(
            decode_raw(&raw, 1024).unwrap_err(),
            DecodeError::Invalid {
                name: "aggregateid",
                value: "not UTF-8 text (3 bytes)".into()
            }
        );
    }

    /// A header value of `levels` tables, each the only entry of the one around it.
    fn nested(levels: usize) -> AMQPValue {
        let mut value = AMQPValue::LongString("bottom".into());
        for _ in 0..levels {
            let mut table = FieldTable::default();
            table.insert("n".into(), value);
            value = AMQPValue::FieldTable(table);
        }
        value
    }

    #[test]
    fn messages_that_break_amqp_rules_are_refused_with_the_place() {
        let mut x_death = FieldTable::default();
        x_death.insert("count".into(), AMQPValue::LongLongInt(1));
        let fine = props(vec![
            ("cloudEvents_aggregateversion", AMQPValue::LongLongInt(4)),
            ("cloudEvents_schemaversion", AMQPValue::ShortShortUInt(1)),
            (
                "cloudEvents_aggregateid",
                AMQPValue::ByteArray(b"p-1".to_vec().into()),
            ),
            (
                "x-death",
                AMQPValue::FieldArray(vec![AMQPValue::FieldTable(x_death)].into()),
            ),
            ("deep-enough", nested(MAX_HEADER_DEPTH)),
            ("control\n", AMQPValue::Void),
            ("user-typed", AMQPValue::Double(1.5)),
        ])
        .with_message_id("m-1".into())
        .with_correlation_id("line\nbreak".into());
        let raw = raw_message(&fine, Bytes::new());
        assert_eq!(raw.metadata.get(PROTOCOL_ERROR_KEY), None, "{raw:?}");
        assert_eq!(delivery_fault("outbox", "payment.p-1"), None);

        let mut nul_inside = FieldTable::default();
        nul_inside.insert("a\0b".into(), AMQPValue::Boolean(true));
        let cases = [
            (
                fine.clone()
                    .with_content_type("application/\u{fffd}".into()),
                "the content type `application/\u{fffd}` is not UTF-8 text",
            ),
            (
                fine.clone().with_message_id("m\0".into()),
                "the property `message_id` `m?` holds a NUL byte",
            ),
            (
                fine.clone().with_type("T\u{fffd}".into()),
                "the property `type` `T\u{fffd}` is not UTF-8 text",
            ),
            (
                props(vec![("", AMQPValue::LongString("x".into()))]),
                "a header has an empty name",
            ),
            (
                props(vec![("n\u{fffd}", AMQPValue::LongString("x".into()))]),
                "the header name `n\u{fffd}` is not UTF-8 text",
            ),
            (
                props(vec![(
                    "t",
                    AMQPValue::FieldArray(vec![AMQPValue::FieldTable(nul_inside)].into()),
                )]),
                "the header name `a?b` holds a NUL byte",
            ),
            (
                props(vec![("deep", nested(MAX_HEADER_DEPTH + 1))]),
                "the header `deep` nests tables or arrays deeper than 16 levels",
            ),
            (
                props(vec![("cloudEvents_id", AMQPValue::LongInt(5))]),
                "the CloudEvents attribute `id` (header `cloudEvents_id`) is an AMQP long-int, not a string",
            ),
            (
                props(vec![("cloudEvents_aggregateid", nested(1))]),
                "the CloudEvents attribute `aggregateid` (header `cloudEvents_aggregateid`) is an AMQP field table, not a string",
            ),
            (
                props(vec![("cloudEvents_time", AMQPValue::Timestamp(1))]),
                "the CloudEvents attribute `time` (header `cloudEvents_time`) is an AMQP timestamp, not a string",
            ),
            (
                props(vec![("cloudEvents_subject", AMQPValue::Void)]),
                "the CloudEvents attribute `subject` (header `cloudEvents_subject`) is an AMQP void, not a string",
            ),
        ];
        for (properties, reason) in cases {
            let raw = raw_message(&properties, Bytes::from_static(b"{}"));
            assert_eq!(
                raw.metadata.get(PROTOCOL_ERROR_KEY).map(String::as_str),
                Some(reason)
            );
            assert_eq!(
                decode_raw(&raw, 1024),
                Err(DecodeError::Protocol(reason.to_owned())),
                "a stored copy decodes the same way"
            );
        }
        assert_eq!(
            delivery_fault("outbox", "payment.\u{fffd}").as_deref(),
            Some("the routing key `payment.\u{fffd}` is not UTF-8 text")
        );
        assert_eq!(
            delivery_fault("out\0box", "payment").as_deref(),
            Some("the exchange `out?box` holds a NUL byte")
        );
    }

    #[test]
    fn a_refused_message_keeps_its_readable_identity_but_no_rendered_attribute() {
        let id = uuid::Uuid::now_v7();
        let mut identity = vec![
            (
                "cloudEvents_id",
                AMQPValue::LongString(id.to_string().into()),
            ),
            (
                "cloudEvents_aggregatetype",
                AMQPValue::LongString("pay".into()),
            ),
            ("cloudEvents_aggregateversion", AMQPValue::LongLongInt(3)),
        ];
        identity.push(("n\u{fffd}", AMQPValue::Boolean(true)));
        let raw = raw_message(&props(identity.clone()), Bytes::new());
        assert!(raw.metadata.contains_key(PROTOCOL_ERROR_KEY));
        assert_eq!(raw.metadata.get(REFUSED_ATTRIBUTES_KEY), None);
        let read = identify_raw(&raw);
        assert_eq!(
            (
                read.event_id,
                read.aggregate_type.as_deref(),
                read.aggregate_version
            ),
            (Some(id), Some("pay"), Some(3))
        );

        identity.pop();
        identity.push(("cloudEvents_aggregateid", nested(1)));
        identity.push(("cloudEvents_type", AMQPValue::Boolean(true)));
        let raw = raw_message(&props(identity), Bytes::new());
        assert_eq!(
            raw.metadata.get(REFUSED_ATTRIBUTES_KEY).map(String::as_str),
            Some("cloudEvents_type cloudEvents_aggregateid")
        );
        assert!(
            raw.headers["cloudEvents_aggregateid"].contains("FieldTable"),
            "the header is kept, as its debug text"
        );
        let read = identify_raw(&raw);
        assert_eq!(read.event_id, Some(id));
        assert_eq!(
            read.aggregate_id, None,
            "a table's debug text is no aggregate id"
        );
        assert_eq!(read.event_type, None);
    }

    fn props(headers: Vec<(&str, AMQPValue)>) -> BasicProperties {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(k.into(), v);
        }
        BasicProperties::default()
            .with_headers(table)
            .with_content_type("application/json".into())
    }

    #[test]
    fn raw_and_decoded_agree_and_split_headers() {
        let id = uuid::Uuid::now_v7().to_string();
        let body = Bytes::from_static(br#"{"a":1}"#);
        let sha = outbox_core::Fingerprint::of(&body).to_hex();
        let p = props(vec![
            (
                "cloudEvents_specversion",
                AMQPValue::LongString("1.0".into()),
            ),
            ("cloudEvents_id", AMQPValue::LongString(id.as_str().into())),
            ("cloudEvents_type", AMQPValue::ShortString("T".into())),
            (
                "cloudEvents_aggregatetype",
                AMQPValue::LongString("pay".into()),
            ),
            (
                "cloudEvents_aggregateid",
                AMQPValue::LongString("p-ü".into()),
            ),
            // Another producer may send numbers as numbers.
            ("cloudEvents_aggregateversion", AMQPValue::LongLongInt(4)),
            (
                "cloudEvents_schemaversion",
                AMQPValue::LongString("1".into()),
            ),
            (
                "cloudEvents_payloadsha256",
                AMQPValue::LongString(sha.as_str().into()),
            ),
            ("traceparent", AMQPValue::LongString("00-1-2-01".into())),
            ("x-delivery-count", AMQPValue::LongLongInt(2)),
        ]);
        let raw = raw_message(&p, body.clone());
        assert_eq!(raw.content_type.as_deref(), Some("application/json"));
        assert_eq!(raw.headers["cloudEvents_aggregateversion"], "4");
        let e = decode_raw(&raw, 1024).unwrap();
        assert_eq!(e.event_id.to_string(), id);
        assert_eq!(e.aggregate_id, "p-ü");
        assert_eq!(e.aggregate_version, 4);
        assert_eq!(e.payload.bytes, body);
        assert_eq!(e.headers.len(), 2, "{:?}", e.headers);
        assert_eq!(e.headers["traceparent"], "00-1-2-01");
        assert_eq!(previous_deliveries(&p), Some(2));
        assert_eq!(tracking_key(&raw, &p), Some(id));
        assert!(matches!(
            decode_raw(&raw, 3),
            Err(DecodeError::TooLarge { size: 7, max: 3 })
        ));
    }

    #[test]
    fn counts_track_redeliveries_bounded() {
        let mut c = DeliveryCounts::new(2);
        assert_eq!(c.observe(Some("a"), false, None), 1);
        assert_eq!(c.observe(Some("a"), true, None), 2);
        assert_eq!(c.observe(Some("a"), true, None), 3);
        // The quorum header wins when it says more.
        assert_eq!(c.observe(Some("a"), true, Some(9)), 10);
        // A fresh (not redelivered) copy of the same id starts again.
        assert_eq!(c.observe(Some("a"), false, None), 1);
        // Unknown to the map but redelivered: at least 2.
        assert_eq!(c.observe(Some("b"), true, None), 2);
        assert_eq!(c.observe(None, true, None), 2);
        assert_eq!(c.observe(None, false, None), 1);
        assert_eq!(c.observe(None, true, Some(4)), 5);
        // Capacity 2: "a" is the oldest and is evicted by "c".
        assert_eq!(c.observe(Some("c"), false, None), 1);
        assert_eq!(c.by_key.len(), 2);
        assert_eq!(c.by_age.len(), 2);
        assert_eq!(c.observe(Some("a"), true, None), 2);
        c.forget("a");
        c.forget("zzz");
        assert!(!c.by_key.contains_key("a"));
        assert_eq!(c.by_key.len(), c.by_age.len());
    }

    /// The decoders at this boundary, over generated hostile input (outbox_testkit::fuzz): the
    /// CloudEvents attributes of a raw message, and the whole way from AMQP properties with a
    /// header table of any types and depth.
    mod fuzz {
        use lapin::types::{AMQPValue, DecimalValue, FieldArray, FieldTable, LongString};
        use outbox_testkit::fuzz::proptest::prelude::*;
        use outbox_testkit::fuzz::{self, check_decoded, check_identity, check_refused};

        use super::*;

        #[test]
        fn attributes_of_any_raw_message() {
            fuzz::check_decoder(
                CLOUDEVENTS_HEADER_PREFIX,
                str::to_owned,
                |raw| decode_raw(raw, 1 << 20),
                identify_raw,
            );
        }

        fn value() -> impl Strategy<Value = AMQPValue> {
            let leaf = prop_oneof![
                any::<bool>().prop_map(AMQPValue::Boolean),
                any::<i8>().prop_map(AMQPValue::ShortShortInt),
                any::<u8>().prop_map(AMQPValue::ShortShortUInt),
                any::<i16>().prop_map(AMQPValue::ShortInt),
                any::<u16>().prop_map(AMQPValue::ShortUInt),
                any::<i32>().prop_map(AMQPValue::LongInt),
                any::<u32>().prop_map(AMQPValue::LongUInt),
                any::<i64>().prop_map(AMQPValue::LongLongInt),
                any::<f32>().prop_map(AMQPValue::Float),
                any::<f64>().prop_map(AMQPValue::Double),
                (any::<u8>(), any::<u32>()).prop_map(|(scale, value)| AMQPValue::DecimalValue(
                    DecimalValue { scale, value }
                )),
                fuzz::hostile_text(12).prop_map(|s| AMQPValue::ShortString(ShortString::from(s))),
                fuzz::hostile_text(12).prop_map(|s| AMQPValue::LongString(LongString::from(s))),
                prop::collection::vec(any::<u8>(), 0..12)
                    .prop_map(|b| AMQPValue::LongString(LongString::from(b))),
                any::<u64>().prop_map(AMQPValue::Timestamp),
                prop::collection::vec(any::<u8>(), 0..12)
                    .prop_map(|b| AMQPValue::ByteArray(b.into())),
                Just(AMQPValue::Void),
            ];
            leaf.prop_recursive(4, 32, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4)
                        .prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
                    prop::collection::btree_map(fuzz::hostile_text(6), inner, 0..4).prop_map(|m| {
                        let mut t = FieldTable::default();
                        for (k, v) in m {
                            t.insert(ShortString::from(k), v);
                        }
                        AMQPValue::FieldTable(t)
                    }),
                ]
            })
        }

        /// A header table: the CloudEvents attributes of a valid event, some as another type
        /// or another value, beside random headers of every type.
        fn table() -> impl Strategy<Value = FieldTable> {
            let attribute = prop_oneof![
                4 => Just(None),
                1 => value().prop_map(Some),
            ];
            (
                prop::collection::vec(attribute, wire::attr::ALL.len()),
                prop::collection::btree_map(fuzz::hostile_text(8), value(), 0..4),
                1i64..100,
            )
                .prop_map(|(replaced, others, version)| {
                    let id = uuid::Uuid::now_v7().to_string();
                    let valid = |name: &str| -> Option<String> {
                        Some(match name {
                            "specversion" => "1.0".into(),
                            "id" => id.clone(),
                            "type" => "PaymentCreated".into(),
                            "aggregatetype" => "payment".into(),
                            "aggregateid" | "subject" | "partitionkey" => "p-1".into(),
                            "aggregateversion" => version.to_string(),
                            "schemaversion" => "1".into(),
                            _ => return None,
                        })
                    };
                    let mut t = FieldTable::default();
                    for (k, v) in others {
                        t.insert(ShortString::from(k), v);
                    }
                    for (name, replacement) in wire::attr::ALL.iter().zip(replaced) {
                        let header =
                            ShortString::from(format!("{CLOUDEVENTS_HEADER_PREFIX}{name}"));
                        match (replacement, valid(name)) {
                            (Some(v), _) => {
                                t.insert(header, v);
                            }
                            (None, Some(text)) => {
                                t.insert(header, AMQPValue::LongString(LongString::from(text)));
                            }
                            (None, None) => {}
                        }
                    }
                    t
                })
        }

        #[test]
        fn any_amqp_properties_and_header_table() {
            let counts = std::cell::Cell::new((0u32, 0u32));
            fuzz::runner()
                .run(
                    &(
                        table(),
                        prop::option::of(fuzz::hostile_text(20)),
                        prop::option::of(fuzz::hostile_text(20)),
                        prop::collection::vec(any::<u8>(), 0..32),
                    ),
                    |(table, content_type, message_id, body)| {
                        let mut properties = BasicProperties::default().with_headers(table);
                        if let Some(c) = content_type {
                            properties = properties.with_content_type(ShortString::from(c));
                        }
                        if let Some(m) = message_id {
                            properties = properties.with_message_id(ShortString::from(m));
                        }
                        let raw = raw_message(&properties, Bytes::from(body));
                        let decoded = decode_raw(&raw, 1 << 20);
                        match &decoded {
                            Ok(event) => check_decoded(&raw, event, CLOUDEVENTS_HEADER_PREFIX)?,
                            Err(e) => check_refused(e)?,
                        }
                        check_identity(&identify_raw(&raw), decoded.as_ref().ok())?;
                        let (ok, refused) = counts.get();
                        counts.set(if decoded.is_ok() {
                            (ok + 1, refused)
                        } else {
                            (ok, refused + 1)
                        });
                        Ok(())
                    },
                )
                .unwrap_or_else(|e| panic!("{e}"));
            let (ok, refused) = counts.get();
            assert!(ok > 0 && refused > 0, "{ok} decoded, {refused} refused");
        }
    }
}
