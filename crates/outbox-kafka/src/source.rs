//! [`KafkaSource`]: a consumer-group member as a [`DeliverySource`] for the inbox runner.
//!
//! # Offsets
//!
//! Kafka acknowledges by offset, per partition, not per message. The source keeps its own
//! books (which offsets were delivered, which are done) and commits, after acknowledgements,
//! the lowest offset of each partition that was delivered and is not done yet, or one past
//! the last delivered when all are done. A committed offset therefore never passes an event
//! whose inbox transaction has not committed (G6): a crash or a rebalance makes the group read
//! from there again, and the inbox absorbs what was applied already.
//!
//! * [`Delivery::ack`] records the offset as done and waits for the commit that follows (acks
//!   arriving together share one commit). It fails as `Unavailable` when that commit fails
//!   or takes longer than `request_timeout_secs`; the offset is still done, so the next
//!   successful commit covers it. An ack whose partition was revoked meanwhile fails as
//!   `Other`: the new owner reads the event again and its inbox absorbs it.
//! * [`Delivery::nack`] keeps the message in the source's memory and delivers it again once
//!   the delay has passed; a delivery dropped without ack or nack comes again at once. The
//!   messages after it keep flowing meanwhile, as on the other brokers (the consumer's ordering
//!   guard holds an aggregate's later versions back where it must), so one event that waits
//!   for its turn never stalls its partition. Its offset stays uncommitted until it is
//!   acknowledged: after a crash or a rebalance the partition is read again from there, and
//!   the inbox absorbs what was applied already.
//! * Before partitions are revoked (a rebalance), their committable offsets are committed
//!   synchronously, so the next owner starts exactly after what this member applied.
//! * Closing the source (dropping it) commits what is done and leaves the group at once, so
//!   the partitions move to the other members without waiting for the session timeout.
//!
//! Kafka does not count deliveries: [`Delivery::delivery_count`] is `None`, and the consumer
//! engine counts attempts itself.
//!
//! # Lag
//!
//! [`DeliverySource::lag`] is the group's lag on the partitions assigned to this member: the
//! sum over them of the high watermark minus the committed offset (the low watermark when the
//! group has none yet). Summed over the members, it is the group's lag as Kafka tools show it.
//!
//! # Flow control
//!
//! The source holds at most [`KafkaConsumerConfig::max_unacked`] deliveries (handed out and not
//! acknowledged yet, nacked ones waiting in memory included). At the limit it pauses every
//! assigned partition (it stays in its group and serves rebalances) and resumes them once a
//! quarter settled. A partition assigned meanwhile takes the same state: paused while the
//! source is paused. With the `cooperative-sticky` assignor an assignment only adds partitions,
//! and those already held stay as they are (before, an assignment counted the source as
//! resumed while its earlier partitions stayed paused, for good).
//!
//! A delivery nacked while the source is paused (an event waiting under the ordering guard for
//! an earlier version, a transient error) is *spilled*: the source lets go of the message,
//! keeps its offset uncommitted, and, once its delay has passed, seeks the partition back to it
//! so the broker hands it out again (deliveries held or done meanwhile are not handed out
//! twice). Waiting deliveries therefore never fill the window and stop the source from reading
//! further: with `OrderingGuard::Wait`, an aggregate whose versions sit on several partitions
//! or topics (a partition key that changed, partitions added to a topic, a destination
//! override) is applied in order, however small the window, as long as the version it waits
//! for lies within [`SPILL_PER_UNACKED`] × `max_unacked` spilled deliveries (beyond, nacked
//! deliveries stay in memory and the source waits, paused, as before). A spilled delivery costs
//! its offset; reading it again costs a fetch from its offset.
//!
//! # Decoding
//!
//! The CloudEvents Kafka binding: `ce_<attribute>` headers, values as UTF-8 text, and
//! `content-type`. Header names are matched without regard to case; a header sent several
//! times is kept as its values joined by `, ` (so a repeated `ce_id` is invalid, never a silent
//! pick). A null value is kept as an empty text value. Whatever a record holds, the poll never
//! fails on it: each record is one delivery, applied or dead-lettered with its raw bytes.
//!
//! * A header value that is not UTF-8 is kept byte for byte in
//!   [`RawMessage::binary_headers`]. On a `ce_` attribute or `content-type` the message is
//!   malformed ([`DecodeError::Invalid`]); on a user header it reaches the handler with U+FFFD
//!   for the bytes that are not UTF-8 (as on RabbitMQ).
//! * A header *name* that is not UTF-8 (the Kafka protocol says names are strings, but
//!   librdkafka writes whatever bytes it is given) is kept in [`RawMessage::binary_headers`]
//!   under [`RawMessage::header_key`] (a lossless escape; a store keeps the exact bytes), and
//!   the message is malformed ([`DecodeError::Protocol`], ``the header name `%FF%FE` is not
//!   UTF-8 text``, the name's bytes that are not UTF-8 as `%XX`): the event's headers cannot
//!   carry that name. librdkafka reads a name up to its first NUL byte, so a name holding NUL
//!   is kept up to there. (rdkafka 0.39 panicked on such a name inside the poll; the workspace
//!   carries a patched rdkafka, see `vendor/rdkafka/README.outbox.md`.)
//! * A NUL or another control character in the content type or an attribute makes the message
//!   malformed; the dead letter keeps the bytes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::ConfigError;
use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceError, SourceErrorKind};
use outbox_core::secrets::redact_url;
use outbox_core::wire::{DecodeError, EventIdentity, IncomingEvent};
use rdkafka::consumer::Consumer as _;
use rdkafka::util::Timeout;
use tokio::sync::{mpsc, oneshot};

use crate::binding::{decode_raw, identify_raw};
use crate::config::{KafkaConsumerConfig, StartFrom};
use crate::connection::{KafkaUrlError, bootstrap_servers, client_config};

mod group;
mod tracker;

use group::{ErrorKind, Shared, committer, consumer_error, lock};
use tracker::{Tp, Tracker};

/// Deliveries to come again that the source lets go of (reading them again from the broker
/// later) at most, per delivery of `max_unacked`: a spilled one costs its offset only.
pub const SPILL_PER_UNACKED: usize = 64;

/// Why [`KafkaSource`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaConsumerError {
    /// The configuration is invalid.
    #[error("invalid Kafka config `{}`: {}", .0.key, .0.reason)]
    Config(#[from] ConfigError),
    /// The URL is not a `kafka://` broker list.
    #[error(transparent)]
    Url(#[from] KafkaUrlError),
    /// librdkafka refused the configuration or the subscription.
    #[error("librdkafka refused the consumer: {0}")]
    Client(String),
    /// No broker answered within `request_timeout_secs`.
    #[error("cannot reach the Kafka cluster at `{url}`: {reason}")]
    Connect {
        /// The address tried.
        url: String,
        /// librdkafka's error.
        reason: String,
    },
}

/// An acknowledgement on its way to the committer.
struct Ack {
    tp: Tp,
    generation: u64,
    offset: i64,
    reply: oneshot::Sender<Result<(), SourceError>>,
}

/// A delivery's message and where it came from.
struct Held {
    event: Result<IncomingEvent, DecodeError>,
    raw: RawMessage,
    tp: Tp,
    offset: i64,
    generation: u64,
}

/// What a delivery needs of its source.
#[derive(Clone)]
struct Links {
    tracker: Arc<Mutex<Tracker>>,
    acks: mpsc::UnboundedSender<Ack>,
    /// Nacked and dropped deliveries, each with the moment it may come again.
    retries: Arc<Mutex<Vec<(Instant, Held)>>>,
    max_message_bytes: usize,
    max_unacked: usize,
}

impl Links {
    /// `held` is to come again at `at`: kept in memory, or, while the source is paused at its
    /// limit (and has spilled fewer than its cap), let go of and read again from the broker
    /// then, so that deliveries waiting for their turn never hold the source's whole window.
    fn retry(&self, held: Held, at: Instant) {
        {
            let mut tracker = lock(&self.tracker);
            if tracker.paused
                && tracker.spilled() < self.max_unacked.saturating_mul(SPILL_PER_UNACKED)
                && tracker.spill(&held.tp, held.generation, held.offset, at)
            {
                return;
            }
        }
        self.retries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((at, held));
    }

    /// Moves up to `room` due redeliveries (oldest offset first) into `batch`, dropping those
    /// whose partition moved to another member; returns when the next one is due.
    fn take_due_retries(&self, room: usize, batch: &mut Vec<KafkaDelivery>) -> Option<Instant> {
        let mut retries = self
            .retries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if retries.is_empty() {
            return None;
        }
        let tracker = lock(&self.tracker);
        retries.retain(|(_, held)| tracker.is_current(&held.tp, held.generation));
        drop(tracker);
        let now = Instant::now();
        retries.sort_by(|(a, x), (b, y)| {
            (a > &now, &x.tp, x.offset).cmp(&(b > &now, &y.tp, y.offset))
        });
        let due = retries
            .iter()
            .take_while(|(at, _)| *at <= now)
            .count()
            .min(room);
        for (_, held) in retries.drain(..due) {
            batch.push(KafkaDelivery {
                held: Some(held),
                link: self.clone(),
            });
        }
        retries.iter().map(|(at, _)| *at).min()
    }
}

/// The Kafka [`DeliverySource`]: one member of a consumer group.
pub struct KafkaSource {
    shared: Arc<Shared>,
    links: Links,
    config: KafkaConsumerConfig,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Joins group [`KafkaConsumerConfig::group_id`] on the cluster at `url`
    /// (`kafka://host:port,host:port`) and subscribes to [`KafkaConsumerConfig::topics`].
    /// Waits for the cluster's metadata, so an unreachable cluster is an error after at most
    /// `request_timeout_secs`; once started, the client reconnects by itself.
    ///
    /// # Errors
    /// [`KafkaConsumerError::Config`] / [`KafkaConsumerError::Url`] for a bad configuration,
    /// [`KafkaConsumerError::Client`] when librdkafka refuses a property or the subscription,
    /// [`KafkaConsumerError::Connect`] when no broker answers.
    #[tracing::instrument(
        level = "info",
        skip_all,
        fields(brokers = %redact_url(url), group = %config.group_id)
    )]
    pub async fn connect(
        url: &str,
        config: KafkaConsumerConfig,
    ) -> Result<Self, KafkaConsumerError> {
        config.validate()?;
        let bootstrap = bootstrap_servers(url)?;
        let mut client = client_config(&bootstrap, &config.properties);
        let fetch_max = config
            .max_message_bytes
            .saturating_add(64 * 1024)
            .max(1_048_576);
        client
            .set("group.id", &config.group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set(
                "auto.offset.reset",
                match config.start_from {
                    StartFrom::Earliest => "earliest",
                    StartFrom::Latest => "latest",
                },
            );
        if !config.properties.0.contains_key("fetch.message.max.bytes")
            && !config
                .properties
                .0
                .contains_key("max.partition.fetch.bytes")
        {
            client.set("fetch.message.max.bytes", fetch_max.to_string());
        }
        let timeout = config.request_timeout();
        let shared = Arc::new(
            Shared::new(&client, timeout).map_err(|e| KafkaConsumerError::Client(e.to_string()))?,
        );
        let topics = config.topics.clone();
        let probe = Arc::clone(&shared);
        let started = tokio::task::spawn_blocking(move || {
            probe
                .consumer
                .fetch_metadata(None, Timeout::After(timeout))
                .map_err(|e| KafkaConsumerError::Connect {
                    url: String::new(),
                    reason: e.to_string(),
                })?;
            let names: Vec<&str> = topics.iter().map(String::as_str).collect();
            probe
                .consumer
                .subscribe(&names)
                .map_err(|e| KafkaConsumerError::Client(e.to_string()))
        })
        .await
        .map_err(|e| KafkaConsumerError::Client(format!("startup task failed: {e}")))?;
        if let Err(e) = started {
            return Err(match e {
                KafkaConsumerError::Connect { reason, .. } => KafkaConsumerError::Connect {
                    url: redact_url(url),
                    reason,
                },
                other => other,
            });
        }
        let (acks, requests) = mpsc::unbounded_channel();
        tokio::spawn(committer(Arc::clone(&shared), requests));
        tracing::info!(topics = ?config.topics, "joined the consumer group");
        Ok(Self {
            links: Links {
                tracker: Arc::clone(&shared.tracker),
                acks,
                retries: Arc::default(),
                max_message_bytes: config.max_message_bytes,
                max_unacked: config.max_unacked,
            },
            shared,
            config,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &KafkaConsumerConfig {
        &self.config
    }

    /// How many partitions this member holds now.
    pub fn assigned_partitions(&self) -> usize {
        lock(&self.shared.tracker).assigned().len()
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        // Commit what is done and leave the group now, off the async threads: the partitions
        // go to the other members at once instead of after the session timeout. Deliveries
        // still held can no longer be acknowledged; their events come again to the next owner.
        let shared = Arc::clone(&self.shared);
        let close = move || shared.leave();
        if tokio::runtime::Handle::try_current().is_ok() {
            // A blocking thread outside the runtime, so a runtime shutting down does not
            // abandon the close halfway.
            std::thread::spawn(close);
        } else {
            close();
        }
    }
}

impl DeliverySource for KafkaSource {
    type Delivery = KafkaDelivery;

    async fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<KafkaDelivery>, SourceError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let shared = Arc::clone(&self.shared);
        let links = self.links.clone();
        tokio::task::spawn_blocking(move || shared.poll_batch(max, wait, &links))
            .await
            .map_err(|e| SourceError::new(SourceErrorKind::Other, format!("poll task: {e}")))?
    }

    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        let shared = Arc::clone(&self.shared);
        let lag = tokio::task::spawn_blocking(move || shared.lag())
            .await
            .map_err(|e| SourceError::new(SourceErrorKind::Other, format!("lag task: {e}")))?;
        lag.map(Some).map_err(|e| {
            SourceError::new(
                match consumer_error(&e) {
                    ErrorKind::Other => SourceErrorKind::Other,
                    _ => SourceErrorKind::Unavailable,
                },
                format!("consumer lag: {e}"),
            )
        })
    }

    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        decode_raw(raw, self.config.max_message_bytes)
    }

    fn identify(&self, raw: &RawMessage) -> EventIdentity {
        identify_raw(raw)
    }
}

/// One message delivered by a [`KafkaSource`].
pub struct KafkaDelivery {
    /// Always there until ack, nack or drop takes it.
    held: Option<Held>,
    link: Links,
}

impl std::fmt::Debug for KafkaDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (topic, partition, offset) = self.position();
        f.debug_struct("KafkaDelivery")
            .field("topic", &topic)
            .field("partition", &partition)
            .field("offset", &offset)
            .finish_non_exhaustive()
    }
}

impl KafkaDelivery {
    fn held(&self) -> &Held {
        self.held
            .as_ref()
            .expect("a delivery holds its message until it is settled")
    }

    /// Topic, partition and offset of the message.
    pub fn position(&self) -> (&str, i32, i64) {
        let held = self.held();
        (&held.tp.0, held.tp.1, held.offset)
    }
}

impl Drop for KafkaDelivery {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            // Dropped without ack or nack (the handler gave up before its commit): it comes
            // again at once.
            self.link.retry(held, Instant::now());
        }
    }
}

impl Delivery for KafkaDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        &self.held().event
    }

    fn raw(&self) -> &RawMessage {
        &self.held().raw
    }

    fn delivery_count(&self) -> Option<u32> {
        None
    }

    async fn ack(mut self) -> Result<(), SourceError> {
        let held = self.held.take().expect("a delivery is settled once");
        let (reply, answer) = oneshot::channel();
        let ack = Ack {
            tp: held.tp,
            generation: held.generation,
            offset: held.offset,
            reply,
        };
        self.link
            .acks
            .send(ack)
            .map_err(|_| SourceError::new(SourceErrorKind::Other, "the Kafka source was closed"))?;
        answer
            .await
            .map_err(|_| SourceError::new(SourceErrorKind::Other, "the Kafka source was closed"))?
    }

    async fn nack(mut self, delay: Duration) -> Result<(), SourceError> {
        let held = self.held.take().expect("a delivery is settled once");
        self.link.retry(held, Instant::now() + delay);
        Ok(())
    }
}
