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
use lapin::types::{FieldTable, ShortString};
use lapin::{Acker, Channel, Connection, Consumer};
use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceError, SourceErrorKind};
use outbox_core::wire::{DecodeError, EventIdentity, IncomingEvent};
use tracing::{debug, info, warn};

use crate::binding::{decode_raw, delivery_fault, identify_raw, raw_message};
use crate::config::{MAX_SHORT_STRING, RabbitConsumerConfig};
use crate::connection::{Connector, Link, RabbitConnectError, ReconnectState, Session, StepError};

mod counts;

pub use crate::binding::{MAX_HEADER_DEPTH, PROTOCOL_ERROR_KEY, REFUSED_ATTRIBUTES_KEY};
pub use crate::config::MAX_REQUEUE_DELAY_CAP_MS;
pub use counts::{DELIVERY_COUNT_CAPACITY, DELIVERY_COUNT_HEADER};

use counts::{DeliveryCounts, previous_deliveries, tracking_key};

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

    /// The working link, repaired (see `connection.rs`) if it broke and the reconnect delay allows.
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
