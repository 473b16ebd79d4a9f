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

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use outbox_core::consumer::{
    Delivery, DeliverySource, HEADER_KEY_ESCAPE, RawMessage, SourceError, SourceErrorKind,
};
use outbox_core::secrets::redact_url;
use outbox_core::wire::{self, DecodeError, EventIdentity, IncomingEvent, attr};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer as _, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message as _};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::util::Timeout;
use tokio::sync::{mpsc, oneshot};

use crate::client::{KafkaUrlError, LogContext, bootstrap_servers, client_config};
use crate::config::{KafkaConfigError, KafkaConsumerConfig, StartFrom};
use crate::tracker::{Arrival, Done, Tp, Tracker};
use crate::transport::{CE_PREFIX, CONTENT_TYPE_HEADER};

/// Longest one `poll` call blocks, so due redeliveries are handed out on time.
const POLL_SLICE: Duration = Duration::from_millis(100);

/// Deliveries to come again that the source lets go of (reading them again from the broker
/// later) at most, per delivery of `max_unacked`: a spilled one costs its offset only.
pub const SPILL_PER_UNACKED: usize = 64;

/// How long a failed seek back waits before it is tried again.
const RESEEK_DELAY: Duration = Duration::from_secs(1);

/// Why [`KafkaSource`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaConsumerError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] KafkaConfigError),
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

/// The consumer's context: librdkafka's logs, and the rebalance hooks that keep the books.
struct SourceContext {
    log: LogContext,
    tracker: Arc<Mutex<Tracker>>,
    /// Held across every offset commit, so commits never overlap and a later one never lands
    /// before an earlier one (a committed offset never moves back).
    commit_lock: Arc<Mutex<()>>,
    timeout: Duration,
}

/// Takes `lock`, waiting at most `timeout` (a commit stuck in an outage must not block a
/// rebalance for ever).
fn lock_within(lock: &Mutex<()>, timeout: Duration) -> Option<MutexGuard<'_, ()>> {
    let until = Instant::now() + timeout;
    loop {
        match lock.try_lock() {
            Ok(guard) => return Some(guard),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

fn lock(tracker: &Mutex<Tracker>) -> MutexGuard<'_, Tracker> {
    // The books stay consistent whatever panicked while holding them: every method leaves
    // them whole.
    tracker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn tps_of(list: &TopicPartitionList) -> Vec<Tp> {
    list.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

fn list_of(positions: &[(Tp, i64)]) -> Result<TopicPartitionList, KafkaError> {
    let mut list = TopicPartitionList::new();
    for ((topic, partition), offset) in positions {
        list.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
    }
    Ok(list)
}

impl ClientContext for SourceContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        self.log.log(level, facility, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.log.error(error, reason);
    }

    fn stats_raw(&self, statistics: &[u8]) {
        self.log.stats_raw(statistics);
    }
}

impl ConsumerContext for SourceContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(list) = rebalance else {
            return;
        };
        let tps = tps_of(list);
        // Commit what this member applied before the partitions go: the next owner starts
        // right after it. A failure only means the next owner reads a little more again.
        let guard = lock_within(&self.commit_lock, self.timeout);
        let positions = lock(&self.tracker).positions(&tps);
        if guard.is_none() {
            tracing::warn!(
                ?positions,
                "an earlier offset commit is still stuck; not committing before the revocation: \
                 the next owner reads these events again and its inbox absorbs them"
            );
        } else if !positions.is_empty() {
            match list_of(&positions).and_then(|l| consumer.commit(&l, CommitMode::Sync)) {
                Ok(()) => tracing::debug!(?positions, "committed before the revocation"),
                Err(e) => tracing::warn!(
                    error = %e,
                    ?positions,
                    "cannot commit before the revocation: the next owner reads these events \
                     again and its inbox absorbs them"
                ),
            }
        }
        lock(&self.tracker).revoke(&tps);
        drop(guard);
        tracing::info!(partitions = ?tps, "partitions revoked");
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(list) => {
                let tps = tps_of(list);
                tracing::info!(partitions = ?tps, "partitions assigned");
                // The assigned partitions take the source's flow-control state. librdkafka
                // keeps an application's pause of a partition across revocation and
                // assignment, so a partition paused before is resumed unless the source is
                // paused. And with `cooperative-sticky` an assignment only adds partitions to
                // those held (paused or not): the source's state stays as it is, and the new
                // partitions follow it, so the next resume reaches all of them.
                let mut tracker = lock(&self.tracker);
                let result = if tracker.paused {
                    consumer.pause(list)
                } else {
                    consumer.resume(list)
                };
                if let Err(e) = result {
                    tracing::warn!(
                        error = %e,
                        paused = tracker.paused,
                        "cannot pause or resume the assigned partitions"
                    );
                }
                tracker.assign(tps);
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => {
                // After a failed rebalance rdkafka drops the assignment (all of it, or, with
                // `cooperative-sticky`, the partitions of that rebalance): the books keep only
                // what the consumer still holds (the next assignment reads from the committed
                // offsets).
                let still: std::collections::HashSet<Tp> = consumer
                    .assignment()
                    .map(|list| tps_of(&list).into_iter().collect())
                    .unwrap_or_default();
                let mut tracker = lock(&self.tracker);
                let gone: Vec<Tp> = tracker
                    .assigned()
                    .into_iter()
                    .filter(|tp| !still.contains(tp))
                    .collect();
                tracker.revoke(&gone);
                tracing::warn!(error = %e, dropped = ?gone, "rebalance failed; its partitions are dropped");
            }
        }
    }
}

/// What the source, its deliveries and its committer share.
struct Shared {
    consumer: BaseConsumer<SourceContext>,
    tracker: Arc<Mutex<Tracker>>,
    commit_lock: Arc<Mutex<()>>,
    /// One thread polls at a time: a rebalance seen by one poll is in the books before another
    /// poll can return a message of the new assignment (a `next_batch` whose future was
    /// dropped leaves its blocking poll running).
    poll_lock: Mutex<()>,
    timeout: Duration,
}

impl Shared {
    /// Commits the books' committable positions, synchronously (call from a blocking thread).
    fn commit(&self) -> Result<(), KafkaError> {
        let _guard = self
            .commit_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let positions = lock(&self.tracker).to_commit();
        if positions.is_empty() {
            return Ok(());
        }
        self.consumer
            .commit(&list_of(&positions)?, CommitMode::Sync)?;
        lock(&self.tracker).committed(&positions);
        tracing::trace!(?positions, "offsets committed");
        Ok(())
    }

    /// Pauses every assigned partition once `max` deliveries are held, and resumes them once
    /// a quarter of them (at least one) settled (blocking thread). Paused, the consumer is still polled:
    /// it stays in its group and serves rebalances.
    fn flow_control(&self, max: usize) {
        let (held, paused, assigned) = {
            let tracker = lock(&self.tracker);
            (tracker.held(), tracker.paused, tracker.assigned())
        };
        let pause = if !paused && held >= max {
            true
        } else if paused && held <= max - max.div_ceil(4) {
            false
        } else {
            return;
        };
        let list = list_of(&assigned.into_iter().map(|tp| (tp, 0)).collect::<Vec<_>>());
        let result = list.and_then(|l| {
            if pause {
                self.consumer.pause(&l)
            } else {
                self.consumer.resume(&l)
            }
        });
        match result {
            Ok(()) => {
                lock(&self.tracker).paused = pause;
                if pause {
                    tracing::warn!(
                        held,
                        max,
                        "the Kafka source holds its limit of unacknowledged deliveries: \
                         partitions paused until some are settled"
                    );
                } else {
                    tracing::info!(held, "partitions resumed");
                }
            }
            Err(e) => tracing::warn!(error = %e, pause, "cannot pause or resume the partitions"),
        }
    }

    /// Seeks each partition with a spilled delivery that is due back to the lowest such
    /// offset, so the broker hands them out again (blocking thread). What was held or done
    /// meanwhile is skipped when it comes by again.
    fn reread_spilled(&self) {
        let due = lock(&self.tracker).rereads_due(Instant::now());
        for ((topic, partition), offset) in due {
            match self.consumer.seek(
                &topic,
                partition,
                Offset::Offset(offset),
                Timeout::After(self.timeout),
            ) {
                Ok(()) => tracing::debug!(
                    topic,
                    partition,
                    offset,
                    "reading spilled deliveries again from the broker"
                ),
                Err(e) => {
                    tracing::warn!(
                        error = %e, topic, partition, offset,
                        "cannot seek back to spilled deliveries; trying again shortly"
                    );
                    lock(&self.tracker)
                        .reread_failed(&(topic, partition), Instant::now() + RESEEK_DELAY);
                }
            }
        }
    }

    /// Up to `max` deliveries, waiting at most `wait` for the first (blocking thread).
    fn poll_batch(
        self: &Arc<Self>,
        max: usize,
        wait: Duration,
        links: &Links,
    ) -> Result<Vec<KafkaDelivery>, SourceError> {
        let _polling = self
            .poll_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let deadline = Instant::now() + wait;
        let mut batch = Vec::new();
        while batch.len() < max {
            self.flow_control(links.max_unacked);
            self.reread_spilled();
            let next_retry = links.take_due_retries(max - batch.len(), &mut batch);
            if batch.len() >= max {
                break;
            }
            let now = Instant::now();
            let slice = if batch.is_empty() {
                let mut slice = deadline.saturating_duration_since(now).min(POLL_SLICE);
                if let Some(at) = next_retry {
                    slice = slice.min(at.saturating_duration_since(now));
                }
                slice
            } else {
                Duration::ZERO
            };
            match self.consumer.poll(Timeout::After(slice)) {
                None => {
                    if !batch.is_empty() || Instant::now() >= deadline {
                        break;
                    }
                }
                Some(Ok(message)) => {
                    if let Some(d) = self.deliver(&message, links) {
                        batch.push(d);
                    }
                }
                Some(Err(e)) => match consumer_error(&e) {
                    ErrorKind::Ignore => {
                        tracing::warn!(error = %e, "Kafka consumer error");
                    }
                    kind => {
                        if !batch.is_empty() {
                            // Hand over what came; the error shows again on the next call.
                            tracing::warn!(error = %e, "Kafka consumer error");
                            break;
                        }
                        let kind = if kind == ErrorKind::Unavailable {
                            SourceErrorKind::Unavailable
                        } else {
                            SourceErrorKind::Other
                        };
                        return Err(SourceError::new(kind, format!("Kafka consumer: {e}")));
                    }
                },
            }
        }
        Ok(batch)
    }

    fn deliver(
        self: &Arc<Self>,
        message: &BorrowedMessage<'_>,
        links: &Links,
    ) -> Option<KafkaDelivery> {
        let tp = (message.topic().to_owned(), message.partition());
        let offset = message.offset();
        let generation = match lock(&self.tracker).arrived(&tp, offset) {
            Arrival::Deliver(generation) => generation,
            // Read again by a seek back: held or done already.
            Arrival::Skip => return None,
            Arrival::Unknown => {
                // librdkafka hands out messages of assigned partitions only, and the books
                // learn of an assignment in the same poll, before any of its messages: this
                // is a bug. Not delivered, the message is not committed past either while the
                // partition stays unknown; a later assignment reads it again.
                tracing::error!(
                    topic = %tp.0, partition = tp.1, offset,
                    "a message of a partition this source does not know it holds; not delivered"
                );
                return None;
            }
        };
        let raw = raw_of(message);
        let event = decode_raw(&raw, links.max_message_bytes);
        Some(KafkaDelivery {
            held: Some(Held {
                event,
                raw,
                tp,
                offset,
                generation,
            }),
            link: links.clone(),
        })
    }

    /// Group lag on this member's partitions (blocking thread).
    fn lag(&self) -> Result<u64, KafkaError> {
        let assigned = lock(&self.tracker).assigned();
        if assigned.is_empty() {
            return Ok(0);
        }
        let list = list_of(
            &assigned
                .iter()
                .map(|tp| (tp.clone(), 0))
                .collect::<Vec<_>>(),
        )?;
        let committed = self
            .consumer
            .committed_offsets(list, Timeout::After(self.timeout))?;
        let mut lag = 0u64;
        for element in committed.elements() {
            let (low, high) = self.consumer.fetch_watermarks(
                element.topic(),
                element.partition(),
                Timeout::After(self.timeout),
            )?;
            let from = match element.offset() {
                Offset::Offset(o) => o,
                _ => low,
            };
            lag += u64::try_from(high.saturating_sub(from)).unwrap_or(0);
        }
        Ok(lag)
    }
}

/// What a consumer error means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorKind {
    /// Logged; consuming goes on (a subscribed topic that does not exist yet, for instance).
    Ignore,
    /// The cluster cannot be reached.
    Unavailable,
    /// Anything else the caller must see.
    Other,
}

fn consumer_error(e: &KafkaError) -> ErrorKind {
    use RDKafkaErrorCode as C;
    if matches!(e, KafkaError::MessageConsumptionFatal(_)) {
        return ErrorKind::Other;
    }
    match e.rdkafka_error_code() {
        Some(
            C::BrokerTransportFailure
            | C::AllBrokersDown
            | C::Resolve
            | C::NetworkException
            | C::RequestTimedOut
            | C::OperationTimedOut
            | C::CoordinatorNotAvailable
            | C::NotCoordinator
            | C::WaitingForCoordinator,
        ) => ErrorKind::Unavailable,
        Some(
            C::TopicAuthorizationFailed
            | C::GroupAuthorizationFailed
            | C::SaslAuthenticationFailed
            | C::Authentication
            | C::SSL,
        ) => ErrorKind::Other,
        _ => ErrorKind::Ignore,
    }
}

/// A message as received: value, every header, the content type, and where it was read.
fn raw_of(message: &BorrowedMessage<'_>) -> RawMessage {
    let (headers, binary_headers) = match message.headers() {
        Some(headers) => headers_of(headers.iter_raw().map(|h| (h.key, h.value))),
        None => Default::default(),
    };
    let content_type = header_ci(&headers, CONTENT_TYPE_HEADER);
    let mut metadata = BTreeMap::from([
        ("topic".to_owned(), message.topic().to_owned()),
        ("partition".to_owned(), message.partition().to_string()),
        ("offset".to_owned(), message.offset().to_string()),
    ]);
    if let Some(ms) = message.timestamp().to_millis() {
        metadata.insert("timestamp_ms".to_owned(), ms.to_string());
    }
    if let Some(key) = message.key() {
        metadata.insert("key".to_owned(), String::from_utf8_lossy(key).into_owned());
    }
    RawMessage {
        payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
        headers,
        content_type,
        binary_headers,
        metadata,
    }
}

/// A record's headers, names and values as bytes, in their order, sorted into the text headers
/// and the binary ones of a [`RawMessage`]: a header whose name and value are UTF-8 text is
/// text (a null value counts as empty text); any other is kept byte for byte among the binary
/// headers, a name that is not UTF-8 under [`RawMessage::header_key`]. A name sent several
/// times is kept as its values joined by `, `, binary as soon as one of them is.
fn headers_of<'a>(
    headers: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) -> (BTreeMap<String, String>, BTreeMap<String, Bytes>) {
    let mut text: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut binary: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (name, value) in headers {
        let value = value.unwrap_or_default();
        let key = RawMessage::header_key(name);
        let name_is_text = key.as_bytes() == name;
        match std::str::from_utf8(value) {
            Ok(s) if name_is_text && !binary.contains_key(key.as_ref()) => {
                text.entry(key.into_owned()).or_default().push(s.to_owned());
            }
            _ => {
                // Not text (or repeated with a value that is not): byte for byte.
                let earlier = text.remove(key.as_ref());
                let bytes = binary.entry(key.into_owned()).or_default();
                if let Some(earlier) = earlier {
                    *bytes = earlier.join(", ").into_bytes();
                }
                if !bytes.is_empty() {
                    bytes.extend_from_slice(b", ");
                }
                bytes.extend_from_slice(value);
            }
        }
    }
    let text = text
        .into_iter()
        .map(|(name, values)| (name, values.join(", ")))
        .collect();
    let binary = binary
        .into_iter()
        .map(|(name, value)| (name, Bytes::from(value)))
        .collect();
    (text, binary)
}

/// A header's value by name without regard to case; several matches are joined by `, `.
fn header_ci(headers: &BTreeMap<String, String>, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// Whether a header belongs to the binding rather than to the user.
fn is_protocol_header(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with(CE_PREFIX) || lower == CONTENT_TYPE_HEADER
}

/// What [`decode_raw`] would read of a message's identity, attribute by attribute
/// ([`wire::identify`]): the event id and aggregate a malformed message's dead letter keeps.
/// An attribute found only among the binary headers is not read.
pub fn identify_raw(raw: &RawMessage) -> EventIdentity {
    wire::identify(|name| header_ci(&raw.headers, &format!("{CE_PREFIX}{name}")))
}

/// Decodes a message as received (live, or kept in a dead letter) from the CloudEvents Kafka
/// binding.
///
/// # Errors
/// [`DecodeError`] naming the first problem; an attribute found only among the binary headers
/// is [`DecodeError::Invalid`].
pub fn decode_raw(raw: &RawMessage, max_bytes: usize) -> Result<IncomingEvent, DecodeError> {
    if raw.payload.len() > max_bytes {
        return Err(DecodeError::TooLarge {
            size: raw.payload.len(),
            max: max_bytes,
        });
    }
    if let Some(key) = raw
        .binary_headers
        .keys()
        .find(|k| RawMessage::header_name(k).as_ref() != k.as_bytes())
    {
        let shown = key.strip_prefix(HEADER_KEY_ESCAPE).unwrap_or(key);
        return Err(DecodeError::Protocol(format!(
            "the header name `{}` is not UTF-8 text",
            wire::excerpt(shown)
        )));
    }
    let not_text = |value: &[u8]| {
        format!(
            "not UTF-8 text: `{}`",
            wire::excerpt(&String::from_utf8_lossy(value))
        )
    };
    if let Some((_, value)) = raw
        .binary_headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(CONTENT_TYPE_HEADER))
    {
        return Err(DecodeError::Invalid {
            name: attr::DATA_CONTENT_TYPE,
            value: not_text(value),
        });
    }
    for name in attr::ALL {
        let header = format!("{CE_PREFIX}{name}");
        if let Some((_, value)) = raw
            .binary_headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(&header))
        {
            return Err(DecodeError::Invalid {
                name,
                value: not_text(value),
            });
        }
    }
    let content_type = raw
        .content_type
        .clone()
        .or_else(|| header_ci(&raw.headers, CONTENT_TYPE_HEADER))
        .filter(|c| !c.trim().is_empty());
    // A user header whose value is not UTF-8 reaches the handler with U+FFFD for the bytes
    // that are not (as on RabbitMQ); its bytes stay in the raw message.
    let user_headers: BTreeMap<String, String> = raw
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), v.clone()))
        .chain(
            raw.binary_headers
                .iter()
                .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned())),
        )
        .filter(|(name, _)| !is_protocol_header(name))
        .collect();
    wire::decode(
        |name| header_ci(&raw.headers, &format!("{CE_PREFIX}{name}")),
        content_type,
        raw.payload.clone(),
        user_headers,
        max_bytes,
    )
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
        let tracker = Arc::new(Mutex::new(Tracker::default()));
        let commit_lock = Arc::new(Mutex::new(()));
        let timeout = config.request_timeout();
        let consumer: BaseConsumer<SourceContext> = client
            .create_with_context(SourceContext {
                log: LogContext,
                tracker: Arc::clone(&tracker),
                commit_lock: Arc::clone(&commit_lock),
                timeout,
            })
            .map_err(|e| KafkaConsumerError::Client(e.to_string()))?;
        let shared = Arc::new(Shared {
            consumer,
            tracker: Arc::clone(&tracker),
            commit_lock,
            poll_lock: Mutex::new(()),
            timeout,
        });
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
                tracker,
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
        let close = move || {
            if let Err(e) = shared.commit() {
                tracing::warn!(error = %e, "cannot commit the last offsets while closing");
            }
            let _polling = shared
                .poll_lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            lock(&shared.tracker).close();
            shared.consumer.unsubscribe();
            let until = Instant::now() + shared.timeout;
            while Instant::now() < until
                && shared.consumer.assignment().is_ok_and(|a| a.count() > 0)
            {
                let _ = shared.consumer.poll(Timeout::After(POLL_SLICE));
            }
            let _ = shared.consumer.poll(Timeout::After(Duration::ZERO));
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // A blocking thread outside the runtime, so a runtime shutting down does not
            // abandon the close halfway.
            std::thread::spawn(close);
        } else {
            close();
        }
    }
}

/// Serves acknowledgements: records them, then commits once for all that came together.
/// Retries a failed commit every second while nothing new comes. Ends when the source and
/// every delivery are gone.
async fn committer(shared: Arc<Shared>, mut requests: mpsc::UnboundedReceiver<Ack>) {
    let mut retry_pending = false;
    // A commit that outlived its timeout (librdkafka waits for the connection to come back):
    // no new one starts before it ended, so commits land in order.
    let mut stuck: Option<tokio::task::JoinHandle<Result<(), KafkaError>>> = None;
    loop {
        let first = if retry_pending {
            match tokio::time::timeout(Duration::from_secs(1), requests.recv()).await {
                Ok(None) => break,
                Ok(Some(ack)) => Some(ack),
                Err(_) => None,
            }
        } else {
            match requests.recv().await {
                None => break,
                Some(ack) => Some(ack),
            }
        };
        let mut waiting = Vec::new();
        let mut pending = first.into_iter().collect::<Vec<_>>();
        while let Ok(ack) = requests.try_recv() {
            pending.push(ack);
        }
        {
            let mut tracker = lock(&shared.tracker);
            for ack in pending {
                match tracker.done(&ack.tp, ack.generation, ack.offset) {
                    Done::Recorded => waiting.push(ack.reply),
                    Done::Revoked => {
                        let _ = ack.reply.send(Err(SourceError::new(
                            SourceErrorKind::Other,
                            format!(
                                "partition {}[{}] was revoked before the ack of offset {}: \
                                 its new owner reads the event again and the inbox absorbs it",
                                ack.tp.0, ack.tp.1, ack.offset
                            ),
                        )));
                    }
                    Done::Closed => {
                        let _ = ack.reply.send(Err(SourceError::new(
                            SourceErrorKind::Other,
                            "the Kafka source was closed before the ack: the event is read \
                             again and the inbox absorbs it",
                        )));
                    }
                }
            }
        }
        if let Some(earlier) = stuck.as_mut()
            && tokio::time::timeout(shared.timeout, earlier).await.is_ok()
        {
            stuck = None;
        }
        let result = if stuck.is_some() {
            Err(())
        } else {
            let committing = Arc::clone(&shared);
            let mut task = tokio::task::spawn_blocking(move || committing.commit());
            match tokio::time::timeout(shared.timeout, &mut task).await {
                Ok(done) => Ok(done),
                Err(_) => {
                    stuck = Some(task);
                    Err(())
                }
            }
        };
        let outcome = match result {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(SourceError::new(
                match consumer_error(&e) {
                    ErrorKind::Other => SourceErrorKind::Other,
                    _ => SourceErrorKind::Unavailable,
                },
                format!("offset commit failed: {e}"),
            )),
            Ok(Err(e)) => Err(SourceError::new(
                SourceErrorKind::Other,
                format!("offset commit task failed: {e}"),
            )),
            Err(()) => Err(SourceError::new(
                SourceErrorKind::Unavailable,
                format!("offset commit did not complete within {:?}", shared.timeout),
            )),
        };
        retry_pending = outcome.is_err() && !lock(&shared.tracker).is_closed();
        for reply in waiting {
            let _ = reply.send(outcome.clone());
        }
    }
    // Everything is gone: librdkafka's close (leave the group, destroy) blocks, so it runs on
    // a blocking thread.
    let _ = tokio::task::spawn_blocking(move || drop(shared)).await;
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

#[cfg(test)]
mod tests {
    use outbox_core::OutboxMessage;

    use super::*;

    /// A record's headers, as (name, value) byte pairs.
    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

    /// The record the transport would send for a fresh event.
    fn record() -> (OutboxMessage, Pairs) {
        let msg = outbox_testkit::message::event("pay-1", 1, &br#"{"amount":1}"#[..]);
        let headers = crate::wire_headers(&msg, outbox_core::wire::DEFAULT_SOURCE)
            .expect("headers")
            .into_iter()
            .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
            .collect();
        (msg, headers)
    }

    fn raw(msg: &OutboxMessage, headers: &Pairs) -> RawMessage {
        let (headers, binary_headers) = headers_of(
            headers
                .iter()
                .map(|(n, v)| (n.as_slice(), Some(v.as_slice()))),
        );
        RawMessage {
            payload: msg.payload.bytes.clone(),
            content_type: header_ci(&headers, CONTENT_TYPE_HEADER),
            headers,
            binary_headers,
            ..RawMessage::default()
        }
    }

    #[test]
    fn a_header_name_that_is_not_utf8_is_kept_exactly_and_makes_the_message_malformed() {
        let (msg, mut headers) = record();
        headers.push((b"\xff\xfe".to_vec(), b"text".to_vec()));
        headers.push((b"x-\xc3".to_vec(), b"\xff".to_vec()));
        let raw = raw(&msg, &headers);
        let names: Vec<Vec<u8>> = raw
            .binary_headers
            .keys()
            .map(|k| RawMessage::header_name(k).into_owned())
            .collect();
        assert_eq!(names, vec![b"\xff\xfe".to_vec(), b"x-\xc3".to_vec()]);
        assert_eq!(
            raw.binary_headers[&*RawMessage::header_key(b"x-\xc3")],
            &b"\xff"[..]
        );
        assert!(
            raw.headers.contains_key("ce_id"),
            "the readable rest: {raw:?}"
        );
        let err = decode_raw(&raw, 1 << 20).expect_err("malformed");
        assert_eq!(
            err,
            DecodeError::Protocol("the header name `%FF%FE` is not UTF-8 text".into())
        );
        assert!(!err.to_string().chars().any(char::is_control), "{err}");
    }

    #[test]
    fn a_value_that_is_not_utf8_is_malformed_on_an_attribute_and_lossy_on_a_user_header() {
        let (msg, headers) = record();
        let mut user = headers.clone();
        user.push((b"x-trace".to_vec(), b"a\xffb".to_vec()));
        let event = decode_raw(&raw(&msg, &user), 1 << 20).expect("a user header's bytes");
        assert_eq!(event.event_id, msg.event_id);
        assert_eq!(event.headers["x-trace"], "a\u{FFFD}b");

        for name in ["ce_type", "content-type"] {
            let mut hostile = headers.clone();
            for (n, v) in &mut hostile {
                if n == name.as_bytes() {
                    v.push(0xff);
                }
            }
            let raw = raw(&msg, &hostile);
            assert!(raw.binary_headers.contains_key(name), "{raw:?}");
            let err = decode_raw(&raw, 1 << 20).expect_err(name);
            assert!(
                matches!(&err, DecodeError::Invalid { value, .. } if value.starts_with("not UTF-8 text: `")),
                "{name}: {err}"
            );
        }
    }

    #[test]
    fn a_repeated_name_is_joined_and_binary_once_any_value_is() {
        let pairs: [(&[u8], Option<&[u8]>); 4] = [
            (b"x", Some(b"1")),
            (b"x", Some(b"\xff")),
            (b"y", None),
            (b"y", Some(b"2")),
        ];
        let (text, binary) = headers_of(pairs.into_iter());
        assert_eq!(text, BTreeMap::from([("y".to_owned(), ", 2".to_owned())]));
        assert_eq!(binary["x"], &b"1, \xff"[..]);
    }

    /// The decoder properties of `outbox_testkit::fuzz` over the Kafka binding.
    #[test]
    fn attributes_of_any_raw_message() {
        outbox_testkit::fuzz::check_decoder(
            CE_PREFIX,
            str::to_owned,
            |raw| decode_raw(raw, 1 << 20),
            identify_raw,
        );
    }

    /// Records as librdkafka hands them out: a valid event's headers with names and values of
    /// any bytes mixed in (null values too). Sorting them never panics and keeps every name
    /// (its bytes come back from its key); decoding returns, a refusal's reason is printable
    /// and bounded, and a name that is not UTF-8 is always refused.
    #[test]
    fn headers_of_any_bytes() {
        use outbox_testkit::fuzz::proptest::prelude::*;
        use outbox_testkit::fuzz::{self, check_decoded, check_identity, check_refused};

        let bytes = |max: usize| prop::collection::vec(any::<u8>(), 0..max);
        let extra = prop::collection::vec((bytes(8), prop::option::of(bytes(8))), 0..4);
        let (msg, wire) = record();
        fuzz::runner()
            .run(&extra, |extra| {
                let mut pairs: Vec<(Vec<u8>, Option<Vec<u8>>)> = wire
                    .iter()
                    .map(|(n, v)| (n.clone(), Some(v.clone())))
                    .collect();
                pairs.extend(extra.iter().cloned());
                let (headers, binary_headers) =
                    headers_of(pairs.iter().map(|(n, v)| (n.as_slice(), v.as_deref())));
                let kept: std::collections::BTreeSet<Vec<u8>> = headers
                    .keys()
                    .chain(binary_headers.keys())
                    .map(|k| RawMessage::header_name(k).into_owned())
                    .collect();
                let given: std::collections::BTreeSet<Vec<u8>> =
                    pairs.iter().map(|(n, _)| n.clone()).collect();
                prop_assert_eq!(kept, given);
                let raw = RawMessage {
                    payload: msg.payload.bytes.clone(),
                    content_type: header_ci(&headers, CONTENT_TYPE_HEADER),
                    headers,
                    binary_headers,
                    ..RawMessage::default()
                };
                let decoded = decode_raw(&raw, 1 << 20);
                match &decoded {
                    Ok(event) => check_decoded(&raw, event, CE_PREFIX)?,
                    Err(e) => check_refused(e)?,
                }
                check_identity(&identify_raw(&raw), decoded.as_ref().ok())?;
                if extra.iter().any(|(n, _)| std::str::from_utf8(n).is_err()) {
                    prop_assert!(decoded.is_err(), "a name that is not UTF-8 was accepted");
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
