//! The consumer side: [`NatsSource`] reads the events [`NatsTransport`](crate::NatsTransport)
//! published, from a durable JetStream **pull** consumer, and hands them to the inbox runner as
//! [`NatsDelivery`]s ([`DeliverySource`] / [`Delivery`] of `outbox_core::consumer`).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::consumer::{Delivery, DeliverySource};
//! use outbox_nats::{NatsConsumerConfig, NatsSource};
//! let config = NatsConsumerConfig {
//!     durable_name: "billing".to_owned(),
//!     filter_subject: "outbox.payment.>".to_owned(),
//!     ..NatsConsumerConfig::default()
//! };
//! let mut source = NatsSource::connect("nats://127.0.0.1:4222", config).await?;
//! for delivery in source.next_batch(100, std::time::Duration::from_secs(1)).await? {
//!     // normally: the inbox runner applies it in a transaction, commits, then acks
//!     delivery.ack().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # Acknowledgements and redelivery (at-least-once)
//!
//! The consumer is durable ([`NatsConsumerConfig::durable_name`]): the server remembers, per
//! message, whether this consumer acknowledged it, across client restarts. It uses explicit
//! acks (`AckPolicy::Explicit`) and starts at the beginning of the stream
//! (`DeliverPolicy::All`) when it is first created.
//!
//! * A fetched message is *pending acknowledgement*. [`Delivery::ack`] sends `+ACK` and waits
//!   (up to 5 s) for the server to confirm it; only then is the message done for this consumer.
//!   An ack error means the outcome is unknown: the message may come again, and the inbox
//!   absorbs the duplicate.
//! * A message not acknowledged within [`NatsConsumerConfig::ack_wait_secs`] of its delivery
//!   (the process crashed, the delivery was dropped, the handler is slow) is delivered again,
//!   to this or another instance sharing the durable. So a handler that takes longer than the
//!   ack wait sees its message twice: choose the ack wait well above the slowest handling.
//! * [`Delivery::nack`] sends `-NAK` with a delay: the message is delivered again after that
//!   delay instead of after the ack wait.
//! * [`Delivery::delivery_count`] is JetStream's delivery counter for the message (1 = first
//!   delivery, 2 = first redelivery, ...). After a lost connection the server may take back a
//!   redelivery that went to the dead connection's pull request, so the count can stay one
//!   behind (seen about once in twenty cuts in the conformance suite): the engine's attempt cap
//!   then parks a poison message one delivery later, but it still parks it.
//! * Nothing is ever dropped by this side: a message that does not decode is still a
//!   [`NatsDelivery`] whose [`Delivery::event`] is the [`DecodeError`]; the runner dead-letters
//!   it and then acks it. That includes a message whose header block the client library cannot
//!   parse (see "Decoding").
//! * The durable has no `max_deliver` (the source creates it without one and never sets one):
//!   the engine's `max_attempts` is the one cap, and a message that keeps failing is
//!   dead-lettered by the engine on its `max_attempts`-th delivery. An operator who sets
//!   `max_deliver` on the durable must keep it above `max_attempts` (with prefetch, a release
//!   counts a delivery too, so well above): at `max_deliver` the server stops delivering the
//!   message, unacknowledged, and only a `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES` advisory
//!   says so; it is then neither handled nor dead-lettered, and stays in the consumer's
//!   `num_ack_pending` for good. The source warns at start when the durable has one.
//!
//! Together with the inbox, which records each event id in the same transaction as its effect
//! and acks only after commit, this gives *effectively once* processing over an
//! at-least-once wire: every event is delivered until acknowledged; duplicates (republishes
//! after the stream's duplicate window, redeliveries after a lost ack) are recognised by event
//! id.
//!
//! # Prefetch
//!
//! By default each [`DeliverySource::next_batch`] sends one pull request and waits for its answer:
//! a round trip to the server per batch, taken after the batch before was committed. With
//! [`NatsConsumerConfig::prefetch`] `= n > 0` the source keeps pull requests for `n` messages open
//! (renewed when half of them were handed out, as the NATS clients' `consume` does; each expires
//! after 5 s, and the client renews it within 10 s even while nothing is taken),
//! so the messages arrive while the batch before is still being applied, and a batch is what has
//! already arrived: the round trip leaves the latency of every event. What it changes:
//!
//! * About `n` to `1.5 n` messages sit in the client, delivered and not yet handed out, and their
//!   ack wait runs (more if the runner stops taking batches while the requests are renewed every
//!   few seconds; it releases them on every error and pause). Keep `n` times the handling time per
//!   message well under [`NatsConsumerConfig::ack_wait_secs`]: a message held past its ack wait is
//!   delivered again (handled twice, absorbed by the inbox, and counted: its delivery count grows,
//!   which the engine's attempt cap reads; a release counts one delivery too). With batches of `b`,
//!   `n` of one to two times `b` keeps at most a batch or two ahead; below `b`, batches stay
//!   smaller than `b` (a batch is only what arrived).
//! * They count in `max_ack_pending` (`n` may not exceed it; with several instances of one durable,
//!   their `n`s together should not) and in the lag. An existing durable whose `max_batch` or
//!   `max_expires` would refuse the requests is refused at start.
//! * [`DeliverySource::release`] (the runner calls it when `run` stops, while it is paused and
//!   after an error; a caller of `run_batch` calls `Consumer::release` before dropping it) closes
//!   the requests and sends `-NAK` for what was not handed out, so those come again 5 s later, to
//!   this consumer or another; the source does the same when its requests fail. The delay is the
//!   life of a pull request: the server drops a request nobody listens to, but not always at once,
//!   and a message NAKed without delay was seen sent straight onto the closed request, to nobody.
//!   The delay also means released messages come after later ones (the ordering guard holds those
//!   back). A source dropped without a release (a crash) or cut off leaves them to come again after
//!   the ack wait, like a delivery in flight.
//! * Memory: up to `1.5 n` messages of up to the server's `max_payload` each.
//!
//! Nothing is lost either way; ordering is the same as with fetches (a message that comes again may
//! come after later ones, which the runner's ordering guard handles). Off by default: the ack wait
//! running on messages not yet handed out is a trade an operator should choose. Measured (W3 in
//! BENCHMARKS.md, 1k events/s, `batch_size` 100 filled with about 5 events, `n` = 200): the
//! consumer's wait for a batch fell from 1.1–1.7 ms to 0.4–0.6 ms and the 110 ms stalls of a fetch
//! that outlives its expiry are gone (p99 median 39 → 31 ms, max 95 → 52 ms); the median latency
//! did not move beyond the noise.
//!
//! # Decoding
//!
//! The inverse of the transport's wire format: `ce-<attribute>` headers (names matched without
//! regard to case), values percent-decoded (a malformed `%XX` sequence or non-UTF-8 result is a
//! [`DecodeError::Invalid`] naming the attribute); the content type from `Content-Type`, else
//! `ce-datacontenttype`; the user headers ([`IncomingEvent::headers`], e.g. `traceparent`)
//! are all headers except `ce-*`, `Nats-*` and `Content-Type`. A header sent several times is
//! kept as its values joined by `, ` (so a duplicated `ce-id` is invalid, never a silent
//! choice of one). The body over [`NatsConsumerConfig::max_message_bytes`] is
//! [`DecodeError::TooLarge`]; every attribute is bounded as [`outbox_core::wire::decode`]
//! says. [`DeliverySource::decode`] applies exactly this to a stored [`RawMessage`]: a live
//! delivery is decoded *from* its `RawMessage`, so both agree.
//!
//! [`RawMessage::metadata`] holds the subject and JetStream's view of the delivery (stream,
//! consumer, stream and consumer sequence, deliveries, pending, publish time), for the
//! operator reading a dead letter.
//!
//! ## Header blocks the client cannot parse
//!
//! The server stores any header block a publisher sends; async-nats refuses some that other
//! clients write (a Go producer writes header values as bytes) or that only a hostile one
//! writes. This workspace carries async-nats with a fix (`vendor/README.md`): instead of
//! dropping the connection on such a message, which JetStream would deliver again after every
//! ack wait, for ever, the client hands it over with its block as received, and the source
//! reads the block itself, line by line as the client reads a valid one:
//!
//! * a value that is not UTF-8 is kept byte for byte in [`RawMessage::binary_headers`]: as a
//!   `ce-` attribute it is [`DecodeError::Invalid`], as a user header it reaches the handler
//!   with U+FFFD for the invalid bytes (as on the other brokers);
//! * a block that is not valid NATS headers (a line without `:`, a name that is not printable
//!   ASCII, a version line other than `NATS/1.0`) is [`DecodeError::Protocol`] naming the line,
//!   and the whole block is kept byte for byte under [`RAW_HEADER_BLOCK`] (among the text
//!   headers when it is UTF-8, else among the binary ones);
//! * every readable line is kept by name as well, so the dead letter still shows the event id
//!   and the other attributes beside the defect.
//!
//! Such a message costs no reconnection and delays nothing behind it. The alternative, a
//! `max_deliver` on the durable with the max-deliveries advisory and the stream's direct get
//! to fetch the raw bytes, would still cost one reset per message and a wait of an ack wait
//! for the messages lost with the connection, and depends on the advisory reaching the
//! source. A subject that is not UTF-8 still drops the connection (the client refuses it
//! before the headers; the relay never publishes one): see the guide's known limits.
//!
//! # Lag
//!
//! [`DeliverySource::lag`] is the consumer's `num_pending + num_ack_pending` from the server:
//! messages in the stream (matching the filter) not yet delivered to this consumer, plus those
//! delivered but not yet acknowledged (including the ones the runner is handling right now).
//! Zero means every stored event was processed and acknowledged.
//!
//! # Failure handling
//!
//! Startup fails fast with a [`NatsConsumerError`]: unreachable server (after 5 s), missing
//! stream, JetStream disabled, or an existing durable of the same name that cannot serve
//! (a push consumer, or not explicit acks). An existing pull durable whose ack wait, max ack
//! pending or filter subject differ from the configuration is updated to it. After startup the
//! client reconnects by itself; meanwhile [`DeliverySource::next_batch`] fails with
//! [`SourceErrorKind::Unavailable`] and the runner retries.

use std::sync::Arc;
use std::time::Duration;

use async_nats::ConnectOptions;
use async_nats::connection::State;
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, AckKind};
use futures::{FutureExt, StreamExt};
use outbox_core::ConfigError;
use outbox_core::consumer::{DeliverySource, RawMessage, SourceError, SourceErrorKind};
use outbox_core::secrets::redact_url;
use outbox_core::wire::{DecodeError, EventIdentity, IncomingEvent};

use crate::binding::{decode_raw, identify_raw};
use crate::config::NatsConsumerConfig;
use crate::connection::{ClientConnectError, is_stream_not_found, logged_connect_options};
use crate::transport::connect_side;
#[cfg(doc)]
use {crate::RAW_HEADER_BLOCK, outbox_core::consumer::Delivery};

mod delivery;

pub use delivery::NatsDelivery;

/// How long one pull request of a prefetching source stays open at the server; the client
/// sends a new one when it ends. Short, so that a request left behind by a source that went
/// away is gone soon (a release delays its NAKs by this much).
const PREFETCH_EXPIRES: Duration = Duration::from_secs(5);
/// How often the server tells a prefetching source that its open request is alive while no
/// message comes; two missed in a row and the source opens a new request.
const PREFETCH_HEARTBEAT: Duration = Duration::from_secs(1);
/// A release takes back messages until none came for this long...
const RELEASE_QUIET: Duration = Duration::from_millis(20);
/// ... or for this long at most; what the server sends on the closed requests later comes
/// again after the ack wait.
const RELEASE_WITHIN: Duration = Duration::from_millis(250);

/// Why [`NatsSource`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsConsumerError {
    /// The configuration is invalid.
    #[error("invalid NATS consumer config `{}`: {}", .0.key, .0.reason)]
    Config(#[from] ConfigError),
    /// A TLS or authentication file cannot be used, or the URL's credentials contradict them.
    #[error("invalid NATS security setting `{}`: {}", .0.key, .0.reason)]
    Security(ConfigError),
    /// The server could not be reached or refused the connection (address, DNS, TLS, auth).
    #[error("cannot connect to NATS at `{url}`: {source}")]
    Connect {
        /// The address tried.
        url: String,
        /// The client library's error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// The server did not complete the connection in time.
    #[error("cannot connect to NATS at `{url}`: no connection within {timeout_secs}s")]
    ConnectTimedOut {
        /// The address tried.
        url: String,
        /// The timeout.
        timeout_secs: u64,
    },
    /// The stream does not exist (the consumer never creates it: the publishing side or the
    /// operator does).
    #[error("JetStream stream `{stream}` does not exist; create it (or start the relay) first")]
    StreamNotFound {
        /// The stream name.
        stream: String,
    },
    /// The stream could not be looked up (JetStream disabled, permissions, timeout).
    #[error("JetStream stream `{stream}`: {message}")]
    Stream {
        /// The stream name.
        stream: String,
        /// What went wrong.
        message: String,
    },
    /// The durable consumer could not be looked up, created or updated, or an existing one
    /// with that name cannot serve (push consumer, not explicit acks).
    #[error("JetStream consumer `{durable}` on stream `{stream}`: {message}")]
    Consumer {
        /// The stream name.
        stream: String,
        /// The durable name.
        durable: String,
        /// What went wrong.
        message: String,
    },
}

impl ClientConnectError for NatsConsumerError {
    fn security(error: ConfigError) -> Self {
        Self::Security(error)
    }

    fn unreachable(url: String, source: async_nats::ConnectError) -> Self {
        Self::Connect { url, source }
    }

    fn timed_out(url: String, timeout_secs: u64) -> Self {
        Self::ConnectTimedOut { url, timeout_secs }
    }
}

/// The NATS JetStream [`DeliverySource`]: a durable pull consumer with explicit acks.
pub struct NatsSource {
    client: async_nats::Client,
    consumer: PullConsumer,
    config: Arc<NatsConsumerConfig>,
    /// The open pull requests of a prefetching source, and what arrived on them not yet
    /// handed out; opened by the first [`DeliverySource::next_batch`] after a start, an error
    /// or a [`DeliverySource::release`].
    ahead: Option<pull::Stream>,
}

impl std::fmt::Debug for NatsSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSource")
            .field("stream", &self.config.stream)
            .field("durable_name", &self.config.durable_name)
            .field("prefetching", &self.ahead.is_some())
            .finish_non_exhaustive()
    }
}

impl NatsSource {
    /// Connects to `url` (one address, or several separated by commas), then gets or creates
    /// the durable consumer (see the module docs).
    ///
    /// Fails fast: an unreachable server is an error after at most 5 s, never an endless
    /// retry. Once connected, the client reconnects by itself.
    ///
    /// # Errors
    /// [`NatsConsumerError::Config`] for a bad config, [`NatsConsumerError::Connect`] /
    /// [`NatsConsumerError::ConnectTimedOut`] when the server cannot be reached,
    /// [`NatsConsumerError::StreamNotFound`], [`NatsConsumerError::Stream`] and
    /// [`NatsConsumerError::Consumer`] as in [`NatsSource::from_client`].
    #[tracing::instrument(
        level = "info",
        skip_all,
        fields(server = %redact_url(url), stream = %config.stream, durable = %config.durable_name)
    )]
    pub async fn connect(url: &str, config: NatsConsumerConfig) -> Result<Self, NatsConsumerError> {
        Self::connect_with_options(url, logged_connect_options("outbox-consumer"), config).await
    }

    /// Like [`NatsSource::connect`] with caller-built [`ConnectOptions`] (event callback, or
    /// TLS and authentication settings beyond [`NatsConsumerConfig::security`], which is
    /// applied on top). Credentials in `url` are moved into the options, out of the address
    /// the client library logs. Do not enable `retry_on_initial_connect` unless startup should
    /// wait for the server.
    ///
    /// # Errors
    /// As [`NatsSource::connect`], plus [`NatsConsumerError::Security`] when a TLS or
    /// authentication file cannot be used.
    pub async fn connect_with_options(
        url: &str,
        options: ConnectOptions,
        config: NatsConsumerConfig,
    ) -> Result<Self, NatsConsumerError> {
        connect_side(url, options, config, Self::from_client).await
    }

    /// Wraps an already connected client, then gets or creates the durable pull consumer:
    /// explicit acks, deliver policy `All`, the configured ack wait, max ack pending and filter.
    /// An existing pull consumer of that name is reused (its position is kept); its ack wait,
    /// max ack pending and filter subject are updated when they differ from the config.
    ///
    /// # Errors
    /// [`NatsConsumerError::Config`]; [`NatsConsumerError::StreamNotFound`] when the stream
    /// is missing; [`NatsConsumerError::Stream`] when it cannot be looked up (JetStream
    /// disabled, permissions, timeout); [`NatsConsumerError::Consumer`] when the consumer
    /// cannot be created or updated, or the existing one is a push consumer or does not use
    /// explicit acks, or (with prefetch) limits pull requests below `prefetch` messages or 5 s.
    pub async fn from_client(
        client: async_nats::Client,
        config: NatsConsumerConfig,
    ) -> Result<Self, NatsConsumerError> {
        config.validate()?;
        let js = jetstream::ContextBuilder::new()
            .timeout(config.ack_timeout())
            .build(client.clone());
        let stream = match js.get_stream(&config.stream).await {
            Ok(stream) => stream,
            Err(e) if is_stream_not_found(&e.kind()) => {
                return Err(NatsConsumerError::StreamNotFound {
                    stream: config.stream.clone(),
                });
            }
            Err(e) => {
                return Err(NatsConsumerError::Stream {
                    stream: config.stream.clone(),
                    message: format!(
                        "cannot look it up (is JetStream enabled and the account allowed to use it?): {e}"
                    ),
                });
            }
        };
        let consumer_error = |message: String| NatsConsumerError::Consumer {
            stream: config.stream.clone(),
            durable: config.durable_name.clone(),
            message,
        };
        let wanted = config.consumer_config();
        let consumer: PullConsumer = stream
            .get_or_create_consumer(&config.durable_name, wanted.clone())
            .await
            .map_err(|e| {
                consumer_error(match e.kind() {
                    jetstream::stream::ConsumerErrorKind::InvalidConsumerType => format!(
                        "a consumer of this name exists but is not a pull consumer; use another \
                         durable_name or delete it: {e}"
                    ),
                    _ => format!("cannot get or create it: {e}"),
                })
            })?;
        let existing = consumer.cached_info().config.clone();
        if existing.ack_policy != AckPolicy::Explicit {
            return Err(consumer_error(format!(
                "exists with ack policy {:?}; the inbox needs explicit acks (delete the consumer \
                 or use another durable_name)",
                existing.ack_policy
            )));
        }
        if existing.max_deliver > 0 {
            tracing::warn!(
                stream = %config.stream,
                durable = %config.durable_name,
                max_deliver = existing.max_deliver,
                "the JetStream consumer has a max_deliver: keep it above the consumer's \
                 max_attempts, or a message that keeps failing stops being delivered before it \
                 is dead-lettered and is never handled"
            );
        }
        let differs = existing.ack_wait != wanted.ack_wait
            || existing.max_ack_pending != wanted.max_ack_pending
            || existing.filter_subject != wanted.filter_subject;
        let consumer = if differs {
            use async_nats::jetstream::consumer::FromConsumer as _;
            let mut update = pull::Config::try_from_consumer_config(existing.clone())
                .map_err(|e| consumer_error(format!("cannot read its configuration: {e}")))?;
            update.ack_wait = wanted.ack_wait;
            update.max_ack_pending = wanted.max_ack_pending;
            update.filter_subject = wanted.filter_subject.clone();
            let updated = stream.update_consumer(update).await.map_err(|e| {
                consumer_error(format!("cannot update it to the configuration: {e}"))
            })?;
            tracing::info!(
                stream = %config.stream,
                durable = %config.durable_name,
                old_ack_wait_secs = existing.ack_wait.as_secs_f64(),
                old_max_ack_pending = existing.max_ack_pending,
                old_filter_subject = %existing.filter_subject,
                "updated the existing JetStream consumer to the configuration"
            );
            updated
        } else {
            consumer
        };
        if config.prefetch > 0 {
            // The server refuses a pull request over these limits, every time: refuse the
            // configuration now rather than retry for ever.
            let limits = &consumer.cached_info().config;
            let prefetch = i64::try_from(config.prefetch).unwrap_or(i64::MAX);
            if limits.max_batch > 0 && prefetch > limits.max_batch {
                return Err(consumer_error(format!(
                    "allows pull requests of at most {} messages (max_batch), below prefetch {}",
                    limits.max_batch, config.prefetch
                )));
            }
            if !limits.max_expires.is_zero() && limits.max_expires < PREFETCH_EXPIRES {
                return Err(consumer_error(format!(
                    "allows pull requests of at most {:?} (max_expires); prefetch needs {:?}",
                    limits.max_expires, PREFETCH_EXPIRES
                )));
            }
        }
        Ok(Self {
            client,
            consumer,
            config: Arc::new(config),
            ahead: None,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &NatsConsumerConfig {
        &self.config
    }

    /// The underlying client.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The JetStream pull consumer (for inspection).
    pub fn consumer(&self) -> &PullConsumer {
        &self.consumer
    }

    fn unavailable_or(&self, kind: SourceErrorKind, message: String) -> SourceError {
        if self.client.connection_state() == State::Connected {
            SourceError::new(kind, message)
        } else {
            SourceError::new(SourceErrorKind::Unavailable, message)
        }
    }

    fn request_failed(&self, e: &dyn std::fmt::Display) -> SourceError {
        self.unavailable_or(
            SourceErrorKind::Other,
            format!("cannot request messages: {e}"),
        )
    }

    /// Takes what arrived on `stream` and was not handed out (at most twice the prefetch),
    /// drops `stream` (its requests are no longer renewed and the subscription ends), and
    /// sends `-NAK` with a delay of [`PREFETCH_EXPIRES`] for each taken message, bounded by
    /// `ack_timeout_secs` together with the flush.
    async fn give_back(&self, mut stream: pull::Stream) {
        let mut held = Vec::new();
        // Taking messages lets the stream ask for more (it renews its requests once half of a
        // window was taken): stop at two windows, what a source holds ahead (one and a half)
        // plus a margin, so that a release never drains a backlog.
        let bound = self.config.prefetch.saturating_mul(2);
        // What already arrived, then what is still on its way: until nothing came for
        // RELEASE_QUIET, and never past RELEASE_WITHIN. Unconstrained: tokio's cooperative
        // budget would otherwise end the drain after 128 messages, leaving the rest to wait
        // out their ack wait.
        let deadline = tokio::time::Instant::now() + RELEASE_WITHIN;
        tokio::task::coop::unconstrained(async {
            while held.len() < bound {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                match tokio::time::timeout(RELEASE_QUIET.min(left), stream.next()).await {
                    Ok(Some(Ok(message))) => held.push(message),
                    _ => break,
                }
            }
        })
        .await;
        drop(stream);
        if held.is_empty() {
            return;
        }
        // Delayed by the life of a request. Dropping the stream unsubscribes, and the server
        // discards a waiting request nobody listens to, but not at once in every case (a
        // request still on its way when the subscription ended; gateways and leaf nodes check
        // interest late): a message NAKed without delay was seen delivered onto such a
        // request, to wait out the ack wait. Every request of the stream has expired 5 s on.
        let sent = tokio::time::timeout(self.config.ack_timeout(), async {
            let naks = futures::future::join_all(
                held.iter()
                    .map(|message| message.ack_with(AckKind::Nak(Some(PREFETCH_EXPIRES)))),
            )
            .await;
            let failed = naks.iter().filter(|r| r.is_err()).count();
            (failed, self.client.flush().await.is_ok())
        })
        .await;
        tracing::debug!(
            released = held.len(),
            ?sent,
            "gave back the messages received ahead (failed NAKs, flushed)"
        );
    }

    /// One fetch of up to `max` messages: the server holds the request up to `wait` for the
    /// first message and answers as soon as it has delivered what is available.
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<NatsDelivery>, SourceError> {
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(max)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| self.request_failed(&e))?;
        let mut out = Vec::with_capacity(max.min(1024));
        // The server ends the request at `wait`; the client sometimes notices that only when its
        // own idle timer fires, seconds later. Past the expiry plus a margin nothing more can
        // come, so stop waiting: a message that would still arrive on the dropped request is
        // redelivered after the ack wait, never lost.
        let deadline = tokio::time::Instant::now() + wait + FETCH_GRACE;
        loop {
            let item = match tokio::time::timeout_at(deadline, batch.next()).await {
                Ok(Some(item)) => item,
                Ok(None) => break,
                Err(_) => {
                    tracing::debug!(
                        received = out.len(),
                        "fetch outlived its expiry; returning what arrived"
                    );
                    break;
                }
            };
            match item {
                Ok(message) => out.push(NatsDelivery::new(message, &self.config)),
                Err(e) if out.is_empty() => {
                    return Err(self.unavailable_or(
                        SourceErrorKind::Other,
                        format!(
                            "fetching from consumer `{}` on stream `{}`: {e}",
                            self.config.durable_name, self.config.stream
                        ),
                    ));
                }
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        received = out.len(),
                        "fetch ended with an error; returning the messages received"
                    );
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Up to `max` of the messages that arrived on the open pull requests, opening them first
    /// if needed: waits up to `wait` for the first, then takes only what is already here.
    async fn prefetched(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<NatsDelivery>, SourceError> {
        let stream = match &mut self.ahead {
            Some(stream) => stream,
            None => {
                let opened = self
                    .consumer
                    .stream()
                    .max_messages_per_batch(self.config.prefetch)
                    .expires(PREFETCH_EXPIRES)
                    .heartbeat(PREFETCH_HEARTBEAT)
                    .messages()
                    .await
                    .map_err(|e| self.request_failed(&e))?;
                self.ahead.insert(opened)
            }
        };
        let mut out = Vec::with_capacity(max.min(self.config.prefetch));
        let Ok(mut item) = tokio::time::timeout(wait, stream.next()).await else {
            return Ok(out);
        };
        loop {
            let failure = match item {
                Some(Ok(message)) => {
                    out.push(NatsDelivery::new(message, &self.config));
                    None
                }
                Some(Err(e)) => Some(e.to_string()),
                None => Some("the server ended the pull requests".to_owned()),
            };
            if let Some(why) = failure {
                // Opened again by the next call; what arrived on these requests and was not
                // taken is given back as on a release (due again 5 s later).
                DeliverySource::release(self).await;
                if out.is_empty() {
                    return Err(self.unavailable_or(
                        SourceErrorKind::Other,
                        format!(
                            "prefetching from consumer `{}` on stream `{}`: {why}",
                            self.config.durable_name, self.config.stream
                        ),
                    ));
                }
                tracing::warn!(
                    error = %why,
                    received = out.len(),
                    "prefetching ended with an error; returning the messages received"
                );
                break;
            }
            if out.len() >= max {
                break;
            }
            let Some(stream) = self.ahead.as_mut() else {
                break;
            };
            match stream.next().now_or_never() {
                Some(next) => item = next,
                None => break,
            }
        }
        Ok(out)
    }
}

/// How long past a fetch's expiry [`NatsSource::next_batch`] still waits for the request to end.
const FETCH_GRACE: Duration = Duration::from_millis(100);

impl DeliverySource for NatsSource {
    type Delivery = NatsDelivery;

    /// Up to `max` messages. Without prefetch, one fetch: the server holds the request up to
    /// `wait` for the first message and answers as soon as it has delivered what is
    /// available. With prefetch, what already arrived on the open pull requests, waiting up to
    /// `wait` for the first.
    ///
    /// # Errors
    /// [`SourceErrorKind::Unavailable`] while the connection is down; otherwise
    /// [`SourceErrorKind::Other`] (e.g. the consumer was deleted). A failure after some
    /// messages arrived returns those messages (the error is logged).
    async fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<NatsDelivery>, SourceError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        if self.client.connection_state() != State::Connected {
            // What arrived ahead before the cut comes again after the ack wait, as the
            // deliveries of a fetch in flight do.
            self.ahead = None;
            return Err(SourceError::new(
                SourceErrorKind::Unavailable,
                "not connected to NATS (reconnecting)",
            ));
        }
        if self.config.prefetch > 0 {
            self.prefetched(max, wait).await
        } else {
            self.fetch(max, wait).await
        }
    }

    /// `num_pending + num_ack_pending` of the consumer, from the server.
    ///
    /// # Errors
    /// [`SourceErrorKind::Unavailable`] while the connection is down, otherwise
    /// [`SourceErrorKind::Other`] (consumer deleted, permissions, timeout).
    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        let connected = self.client.connection_state() == State::Connected;
        match self.consumer.info().await {
            Ok(info) => Ok(Some(info.num_pending.saturating_add(
                u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX),
            ))),
            Err(e) => Err(SourceError::new(
                if connected {
                    SourceErrorKind::Other
                } else {
                    SourceErrorKind::Unavailable
                },
                format!("consumer `{}` info: {e}", self.config.durable_name),
            )),
        }
    }

    /// Decodes with [`decode_raw`] and the configured `max_message_bytes`.
    ///
    /// # Errors
    /// [`DecodeError`] naming the problem.
    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        decode_raw(raw, self.config.max_message_bytes)
    }

    fn identify(&self, raw: &RawMessage) -> EventIdentity {
        identify_raw(raw)
    }

    /// Closes the open pull requests and sends `-NAK` for every message that arrived on them
    /// and was not handed out, and for those still arriving within 20 ms of each other (250 ms
    /// and twice the prefetch at most), so the server delivers those again 5 s later (once
    /// the closed requests have expired at the server), not after the ack wait; then flushes
    /// the connection (all bounded by `ack_timeout_secs`). Deliveries handed out before are
    /// not touched. Harmless at any time: the next batch opens new requests.
    async fn release(&mut self) {
        let Some(stream) = self.ahead.take() else {
            return;
        };
        self.give_back(stream).await;
    }
}
