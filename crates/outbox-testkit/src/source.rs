//! The [`DeliverySource`] conformance suite.
//!
//! A backend implements [`SourceHarness`] in its `tests/` directory and runs every case with
//! [`source_suite!`](crate::source_suite). Each case is a public async function taking the
//! harness, so a backend may also call one directly; the helpers ([`receive`],
//! [`receive_one`], [`expect_nothing`] ...) serve backend-specific tests too.
//!
//! What the cases check, for every source:
//!
//! * A published event is delivered, decoded into exactly the published fields, with its raw
//!   message kept; acknowledged, it is not delivered again, not even to a restarted consumer.
//! * A delivery dropped without an ack, or held by a consumer that crashed before its commit,
//!   is delivered again, with a higher delivery count.
//! * `nack(delay)` delivers again after the delay.
//! * Malformed messages (no attributes, missing, empty or bad id, bad version, unknown spec
//!   version, altered body, body over the limit, an attribute over
//!   [`wire::MAX_ATTRIBUTE_CHARS`], NUL in an attribute or the content type, an attribute that
//!   is not UTF-8) are deliveries whose event is the exact [`DecodeError`], with the raw
//!   message kept, and they do not hold back the valid event behind them.
//! * [`DeliverySource::lag`] counts what waits, and falls to 0 once everything is acknowledged.
//! * Batches hold at most `max`, come in publish order, drain everything, and an empty batch
//!   waits instead of spinning.
//! * A lost connection is reported as [`SourceErrorKind::Unavailable`], an ack on it is never a
//!   success, and after the broker is back the source delivers again.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceErrorKind};
use outbox_core::wire::{self, DecodeError, IncomingEvent};
use outbox_core::{Fingerprint, OutboxMessage, Payload};
use tokio::time::Instant;

use crate::harness::Harness;
use crate::net::Proxy;
use crate::{message, wait};

/// Longest a published message may take to be delivered.
pub const DELIVERY_WITHIN: Duration = Duration::from_secs(20);

/// Longest a source may take to report a lost connection, and to deliver again once the broker
/// is back.
pub const RECOVERY_WITHIN: Duration = Duration::from_secs(60);

/// How a case wants its source to consume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSettings {
    /// How long a delivery may stay unacknowledged before the broker delivers it again (NATS
    /// `ack_wait`); whole seconds. Ignored by brokers without one.
    pub ack_wait: Duration,
    /// Most deliveries handed to this consumer and not yet acknowledged (NATS
    /// `max_ack_pending`, AMQP prefetch).
    pub max_unacked: u16,
    /// Largest body the source decodes; a larger one is [`DecodeError::TooLarge`].
    pub max_message_bytes: usize,
}

impl SourceSettings {
    /// The defaults with another ack wait.
    pub fn with_ack_wait(ack_wait: Duration) -> Self {
        Self {
            ack_wait,
            ..Self::default()
        }
    }
}

impl Default for SourceSettings {
    /// Ack wait 30 s, 256 unacknowledged, 1 MiB bodies.
    fn default() -> Self {
        Self {
            ack_wait: Duration::from_secs(30),
            max_unacked: 256,
            max_message_bytes: 1024 * 1024,
        }
    }
}

/// When the broker delivers again a delivery that was dropped without ack or nack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redelivery {
    /// Once its ack wait expired (NATS JetStream), not before.
    AfterAckWait,
    /// At once (the source requeues it when it is dropped, as the RabbitMQ source does).
    AtOnce,
}

/// What [`DeliverySource::lag`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LagCounts {
    /// Nothing: the broker cannot tell, `lag` is `None`.
    Nothing,
    /// Messages not yet delivered to a consumer (RabbitMQ's ready messages).
    Waiting,
    /// Messages not yet delivered plus those delivered but not acknowledged (JetStream's
    /// `num_pending + num_ack_pending`).
    WaitingAndUnacknowledged,
}

/// How a backend's source behaves where the contract leaves a choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceCapabilities {
    /// [`Delivery::delivery_count`] is known (1 on the first delivery, then counting up).
    pub counts_deliveries: bool,
    /// When a dropped delivery comes again.
    pub dropped_delivery: Redelivery,
    /// What `lag` counts.
    pub lag: LagCounts,
    /// An ack that failed because the connection was lost was certainly not applied, so the
    /// broker delivers the message again (RabbitMQ: the channel is gone). `false` where the ack
    /// may still reach the broker once the client reconnects (NATS).
    pub failed_ack_redelivers: bool,
    /// A message redelivered after a lost connection always has a higher delivery count.
    /// `false` where the broker may take back a redelivery that went to the dead connection and
    /// count the next one as the same delivery (JetStream: consumer sequence 2, delivered 1).
    pub count_grows_across_cuts: bool,
}

/// How the source suite reaches one backend.
///
/// Every harness owns a fresh stream or queue (and whatever publishes to it) that no other test
/// uses, created when it is built and removed by [`Harness::cleanup`]. Every source it makes
/// consumes the same durable position (JetStream durable consumer, queue), as the instances of
/// one consuming service do, so a new source is a restarted consumer.
pub trait SourceHarness: Harness {
    /// The source under test.
    type Source: DeliverySource;

    /// A new source, with its own connection to the broker at `url` (the broker's own, or a
    /// [`Proxy`]'s), consuming as `settings` say, and reconnecting quickly (within a second or
    /// two) after a lost connection.
    fn source_at(
        &self,
        url: &str,
        settings: &SourceSettings,
    ) -> impl Future<Output = anyhow::Result<Self::Source>> + Send;

    /// A source connected straight to the broker.
    fn source(
        &self,
        settings: &SourceSettings,
    ) -> impl Future<Output = anyhow::Result<Self::Source>> + Send {
        async move {
            let url = self.broker_url();
            self.source_at(&url, settings).await
        }
    }

    /// A source whose connection goes through `proxy`.
    fn source_through(
        &self,
        proxy: &Proxy,
        settings: &SourceSettings,
    ) -> impl Future<Output = anyhow::Result<Self::Source>> + Send {
        async move {
            let url = proxy.url(&self.broker_url())?;
            self.source_at(&url, settings)
                .await
                .context("connecting through the proxy")
        }
    }

    /// Publishes `message` with the backend's transport, in the wire format, to where the
    /// sources read; returns once the broker acknowledged it. The sources see it only once one
    /// was made (a queue may be declared by the first source).
    fn publish(&self, message: &OutboxMessage) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// The wire form of `message` (what the transport sends) as a [`RawMessage`]: every
    /// protocol header by name with its value as text, the content type, the body. The suite
    /// checks it against what the transport really sent, then alters it into malformed
    /// messages.
    ///
    /// # Errors
    /// When the message cannot be encoded.
    fn encode(&self, message: &OutboxMessage) -> anyhow::Result<RawMessage>;

    /// The protocol header carrying CloudEvents attribute `attribute` (`id` -> `ce-id`,
    /// `cloudEvents_id` ...).
    fn attribute_header(&self, attribute: &str) -> String;

    /// Publishes `raw` as it is (body, headers with text values, binary header values where
    /// the protocol has them, content type if any) to where the sources read; returns once the
    /// broker acknowledged it.
    fn publish_raw(&self, raw: &RawMessage) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Sets CloudEvents attribute `attribute` of `raw` to `value`, bytes that are not UTF-8,
    /// the way this protocol can carry them (NATS: percent-encoded in the text header; AMQP: a
    /// long string of those bytes, in [`RawMessage::binary_headers`]).
    fn set_attribute_bytes(&self, raw: &mut RawMessage, attribute: &str, value: &[u8]);

    /// How this backend's source behaves where the contract leaves a choice.
    fn capabilities(&self) -> SourceCapabilities;
}

/// Runs every source case as its own `#[tokio::test]`, each on a fresh harness from `$start`:
/// an async function (or closure) returning `anyhow::Result<impl SourceHarness>`.
///
/// ```ignore
/// mod source {
///     outbox_testkit::source_suite!(crate::common::Fixture::start);
/// }
/// ```
#[macro_export]
macro_rules! source_suite {
    ($start:expr) => {
        $crate::__conformance_cases!(source, $start;
            delivered_event_is_decoded_and_gone_once_acked,
            dropped_delivery_is_delivered_again,
            crashed_consumer_leaves_its_delivery_to_the_next,
            nack_delivers_again_after_its_delay,
            malformed_messages_are_deliveries_and_do_not_block,
            lag_counts_waiting_messages_then_falls_to_zero,
            batches_respect_max_and_drain_in_order,
            connection_loss_keeps_unacknowledged_deliveries,
        );
    };
}

/// Calls [`DeliverySource::next_batch`] until `n` deliveries arrived.
///
/// # Errors
/// A source error, or fewer than `n` deliveries within `within`.
pub async fn receive<S: DeliverySource>(
    source: &mut S,
    n: usize,
    within: Duration,
) -> anyhow::Result<Vec<S::Delivery>> {
    let deadline = Instant::now() + within;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        ensure!(
            !left.is_zero(),
            "{} of {n} deliveries arrived within {within:?}",
            out.len()
        );
        let batch = source
            .next_batch(n - out.len(), left.min(Duration::from_secs(1)))
            .await
            .context("next_batch")?;
        out.extend(batch);
    }
    Ok(out)
}

/// One delivery, within `within`.
///
/// # Errors
/// As [`receive`].
pub async fn receive_one<S: DeliverySource>(
    source: &mut S,
    within: Duration,
) -> anyhow::Result<S::Delivery> {
    let mut one = receive(source, 1, within).await?;
    one.pop().context("no delivery")
}

/// Waits `wait` for deliveries and fails if any comes.
///
/// # Errors
/// A source error, or a delivery (named by event id or decode error).
pub async fn expect_nothing<S: DeliverySource>(
    source: &mut S,
    wait: Duration,
) -> anyhow::Result<()> {
    let batch = source.next_batch(10, wait).await.context("next_batch")?;
    if let Some(d) = batch.first() {
        bail!(
            "{} unexpected deliveries, the first {}",
            batch.len(),
            describe(d)
        );
    }
    Ok(())
}

/// The decoded event of a delivery that must be valid.
///
/// # Errors
/// The decode error.
pub fn event_of<D: Delivery>(delivery: &D) -> anyhow::Result<&IncomingEvent> {
    delivery
        .event()
        .as_ref()
        .map_err(|e| anyhow::anyhow!("a valid event was delivered as malformed: {e}"))
}

/// Acknowledges every delivery.
///
/// # Errors
/// The first ack that failed.
pub async fn ack_all<D: Delivery>(deliveries: Vec<D>) -> anyhow::Result<()> {
    for d in deliveries {
        d.ack().await.context("ack")?;
    }
    Ok(())
}

/// A delivery as a failure message names it: the event (id, aggregate and version) or the
/// decode error, its delivery count, and where the broker says it was read from (the raw
/// message's metadata: a Kafka offset, a stream sequence), so a duplicate or a skip shows which.
fn describe<D: Delivery>(d: &D) -> String {
    let what = match d.event() {
        Ok(e) => format!(
            "event {} ({} {} v{})",
            e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version
        ),
        Err(e) => format!("malformed message ({e})"),
    };
    format!(
        "{what}, delivery count {:?}, read at {:?}",
        d.delivery_count(),
        d.raw().metadata
    )
}

/// Checks that `event` carries exactly the fields of `message` as published with the default
/// CloudEvents source.
///
/// # Errors
/// Naming the first difference.
pub fn check_event(event: &IncomingEvent, message: &OutboxMessage) -> anyhow::Result<()> {
    let field = |name: &str, got: &dyn std::fmt::Debug, published: &dyn std::fmt::Debug| {
        anyhow::anyhow!(
            "event {}: `{name}` decoded as {got:?}, published as {published:?}",
            message.event_id
        )
    };
    macro_rules! same {
        ($name:literal, $got:expr, $published:expr) => {
            if $got != $published {
                return Err(field($name, &$got, &$published));
            }
        };
    }
    same!("event_id", event.event_id, message.event_id);
    same!("event_type", event.event_type, message.event_type);
    same!("source", event.source.as_str(), wire::DEFAULT_SOURCE);
    same!(
        "aggregate_type",
        event.aggregate_type,
        message.aggregate_type
    );
    same!("aggregate_id", event.aggregate_id, message.aggregate_id);
    same!(
        "aggregate_version",
        event.aggregate_version,
        message.aggregate_version
    );
    same!(
        "schema_version",
        event.schema_version,
        message.schema_version
    );
    same!(
        "partition_key",
        event.partition_key.as_str(),
        message.partition_key()
    );
    same!("time", event.time, Some(message.created_at));
    same!(
        "content type",
        event.payload.content_type,
        message.payload.content_type
    );
    same!("fingerprint", event.fingerprint, message.fingerprint);
    same!("headers", event.headers, message.headers);
    ensure!(
        event.payload.bytes == message.payload.bytes,
        "event {}: the payload differs ({} bytes decoded, {} published)",
        message.event_id,
        event.payload.bytes.len(),
        message.payload.bytes.len()
    );
    Ok(())
}

/// Checks a delivery's count where the backend counts.
fn check_count<D: Delivery>(
    caps: &SourceCapabilities,
    d: &D,
    expected: u32,
    when: &str,
) -> anyhow::Result<()> {
    if caps.counts_deliveries {
        ensure!(
            d.delivery_count() == Some(expected),
            "{when}: delivery count {:?}, expected {expected}",
            d.delivery_count()
        );
    }
    Ok(())
}

/// Publishes one event of `aggregate` and receives it on `source`: its first delivery,
/// counted 1.
async fn publish_and_receive<H: SourceHarness>(
    h: &H,
    source: &mut H::Source,
    aggregate: &str,
) -> anyhow::Result<(OutboxMessage, <H::Source as DeliverySource>::Delivery)> {
    let msg = message::event(aggregate, 1, &b"{\"n\":1}"[..]);
    h.publish(&msg).await?;
    let first = receive_one(source, DELIVERY_WITHIN).await?;
    is_again(&h.capabilities(), &first, &msg, 1, "first delivery")?;
    Ok((msg, first))
}

/// Checks that `d` is `msg` delivered for the `count`th time (where the backend counts).
fn is_again<D: Delivery>(
    caps: &SourceCapabilities,
    d: &D,
    msg: &OutboxMessage,
    count: u32,
    when: &str,
) -> anyhow::Result<()> {
    ensure!(
        event_of(d)?.event_id == msg.event_id,
        "{when}: {} came instead of event {}",
        describe(d),
        msg.event_id
    );
    check_count(caps, d, count, when)
}

/// Acknowledges `d`, then checks that nothing comes again (not even after the ack wait) and
/// that lag is 0.
async fn ack_and_expect_it_gone<S: DeliverySource>(
    source: &mut S,
    d: S::Delivery,
    caps: &SourceCapabilities,
    settings: &SourceSettings,
) -> anyhow::Result<()> {
    d.ack().await.context("ack")?;
    expect_nothing(source, settings.ack_wait + Duration::from_secs(1))
        .await
        .context("after the ack")?;
    check_lag(source, caps, 0, 0, "all acknowledged").await
}

/// Checks `lag` against `waiting` undelivered and `unacked` delivered, unacknowledged messages,
/// as the backend counts them.
async fn check_lag<S: DeliverySource>(
    source: &mut S,
    caps: &SourceCapabilities,
    waiting: u64,
    unacked: u64,
    when: &str,
) -> anyhow::Result<()> {
    let expected = match caps.lag {
        LagCounts::Nothing => None,
        LagCounts::Waiting => Some(waiting),
        LagCounts::WaitingAndUnacknowledged => Some(waiting + unacked),
    };
    let lag = source.lag().await.context("lag")?;
    ensure!(
        lag == expected,
        "{when} ({waiting} waiting, {unacked} unacknowledged): lag {lag:?}, expected {expected:?} \
         ({:?})",
        caps.lag
    );
    Ok(())
}

/// A published event (every field exercising the encoding) is delivered once, counted 1,
/// decoded into exactly the published fields, with its raw message (body, content type, every
/// header the transport sent) kept, and [`DeliverySource::decode`] of that raw message gives the
/// same event. Acknowledged, it is not delivered again after the ack wait, lag is 0, and a
/// restarted consumer does not get it either.
///
/// # Errors
/// The first broken expectation.
pub async fn delivered_event_is_decoded_and_gone_once_acked<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::with_ack_wait(Duration::from_secs(1));
    let mut source = h.source(&settings).await?;
    let msg = message::rich();
    h.publish(&msg).await?;

    let d = receive_one(&mut source, DELIVERY_WITHIN).await?;
    check_count(&caps, &d, 1, "first delivery")?;
    let event = event_of(&d)?;
    check_event(event, &msg)?;
    let raw = d.raw();
    ensure!(
        raw.payload == msg.payload.bytes,
        "raw body differs from the payload"
    );
    ensure!(
        raw.content_type.as_ref() == Some(&msg.payload.content_type.0),
        "raw content type {:?}",
        raw.content_type
    );
    let sent = h.encode(&msg)?;
    for (name, value) in &sent.headers {
        ensure!(
            raw.headers.get(name) == Some(value),
            "raw header `{name}` is {:?}; the transport sent {value:?}",
            raw.headers.get(name)
        );
    }
    ensure!(
        source.decode(raw).as_ref() == Ok(event),
        "decoding the kept raw message gives {:?}, the live delivery {event:?}",
        source.decode(raw)
    );

    ack_and_expect_it_gone(&mut source, d, &caps, &settings).await?;
    drop(source);
    let mut restarted = h.source(&settings).await?;
    expect_nothing(&mut restarted, Duration::from_secs(1))
        .await
        .context("a restarted consumer after the ack")
}

/// A delivery dropped without ack or nack (the handler gave up before its commit) is
/// delivered again, counted 2: after its ack wait (2 s) where the broker has one (nothing in
/// the first 300 ms, and not sooner than 80 % of it, measured from when the client had the
/// delivery), at once where the source requeues it. Acknowledged, it stays gone.
///
/// # Errors
/// The first broken expectation.
pub async fn dropped_delivery_is_delivered_again<H: SourceHarness>(h: &H) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::with_ack_wait(Duration::from_secs(2));
    let mut source = h.source(&settings).await?;
    let (msg, first) = publish_and_receive(h, &mut source, "dropped").await?;
    let delivered = Instant::now();
    drop(first);

    let again = match caps.dropped_delivery {
        Redelivery::AfterAckWait => {
            expect_nothing(&mut source, Duration::from_millis(300))
                .await
                .context("before the ack wait expired")?;
            let again = receive_one(&mut source, DELIVERY_WITHIN).await?;
            let after = delivered.elapsed();
            ensure!(
                after >= settings.ack_wait.mul_f64(0.8),
                "delivered again {after:?} after being dropped, before the ack wait of {:?}",
                settings.ack_wait
            );
            again
        }
        Redelivery::AtOnce => receive_one(&mut source, DELIVERY_WITHIN).await?,
    };
    is_again(&caps, &again, &msg, 2, "after the drop")?;
    ack_and_expect_it_gone(&mut source, again, &caps, &settings).await
}

/// A consumer crashes while holding an unacknowledged delivery (its source and delivery vanish
/// before any commit): the next consumer gets the event, counted 2; acknowledged there, a third
/// consumer does not get it.
///
/// # Errors
/// The first broken expectation.
pub async fn crashed_consumer_leaves_its_delivery_to_the_next<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::with_ack_wait(Duration::from_secs(1));
    let mut crashing = h.source(&settings).await?;
    let (msg, held) = publish_and_receive(h, &mut crashing, "crashed").await?;
    drop(crashing);
    drop(held);

    let mut next = h.source(&settings).await?;
    let again = receive_one(&mut next, DELIVERY_WITHIN + settings.ack_wait).await?;
    is_again(&caps, &again, &msg, 2, "at the next consumer")?;
    again.ack().await.context("ack")?;
    drop(next);
    let mut third = h.source(&settings).await?;
    expect_nothing(&mut third, settings.ack_wait + Duration::from_secs(1))
        .await
        .context("a third consumer after the ack")
}

/// `nack(500 ms)` delivers again no sooner than the delay and within 5 s more (the ack wait
/// is 30 s), counted 2; `nack(0)` delivers again, counted 3; acknowledged, lag is 0.
///
/// # Errors
/// The first broken expectation.
pub async fn nack_delivers_again_after_its_delay<H: SourceHarness>(h: &H) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::default();
    let mut source = h.source(&settings).await?;
    let (msg, first) = publish_and_receive(h, &mut source, "nacked").await?;
    let delay = Duration::from_millis(500);
    let nacked = Instant::now();
    first.nack(delay).await.context("nack")?;
    let second = receive_one(&mut source, DELIVERY_WITHIN).await?;
    let after = nacked.elapsed();
    ensure!(
        after >= delay.mul_f64(0.9) && after < delay + Duration::from_secs(5),
        "nack({delay:?}) delivered again after {after:?} (the ack wait is {:?})",
        settings.ack_wait
    );
    is_again(&caps, &second, &msg, 2, "after nack with a delay")?;

    second.nack(Duration::ZERO).await.context("nack(0)")?;
    let third = receive_one(&mut source, DELIVERY_WITHIN).await?;
    is_again(&caps, &third, &msg, 3, "after nack(0)")?;
    third.ack().await.context("ack")?;
    check_lag(&mut source, &caps, 0, 0, "all acknowledged").await
}

/// What a malformed message must decode to.
#[derive(Debug)]
enum Expected {
    /// Exactly this error.
    Exactly(DecodeError),
    /// [`DecodeError::Invalid`] naming this attribute (the value shown depends on the protocol).
    InvalidAttribute(&'static str),
}

impl Expected {
    fn is(&self, got: &DecodeError) -> bool {
        match self {
            Self::Exactly(e) => e == got,
            Self::InvalidAttribute(name) => {
                matches!(got, DecodeError::Invalid { name: n, .. } if n == name)
            }
        }
    }
}

impl From<DecodeError> for Expected {
    fn from(e: DecodeError) -> Self {
        Self::Exactly(e)
    }
}

/// Builds the malformed messages of
/// [`malformed_messages_are_deliveries_and_do_not_block`], each with the error it must decode
/// to.
fn malformed<H: SourceHarness>(
    h: &H,
    max_message_bytes: usize,
) -> anyhow::Result<Vec<(&'static str, RawMessage, Expected)>> {
    let encoded = |version: i64| h.encode(&message::event("poison", version, &b"{\"x\":1}"[..]));
    let altered =
        |version: i64, attribute: &str, value: Option<&str>| -> anyhow::Result<RawMessage> {
            let mut raw = encoded(version)?;
            let header = h.attribute_header(attribute);
            ensure!(
                raw.headers.contains_key(&header),
                "the harness encodes no header `{header}` for attribute `{attribute}`"
            );
            match value {
                Some(v) => raw.headers.insert(header, v.to_owned()),
                None => raw.headers.remove(&header),
            };
            Ok(raw)
        };
    let mut tampered = encoded(6)?;
    let sent_fingerprint = Fingerprint::of(&tampered.payload);
    tampered.payload = Bytes::from_static(b"{\"x\":999}");
    let big_len = max_message_bytes + 1000;
    let big = h.encode(&message::sized("poison", 7, big_len))?;
    let too_long = "x".repeat(wire::MAX_ATTRIBUTE_CHARS + 45);
    let bad_type = "application/json\0; charset=x";
    let mut nul_content_type = encoded(11)?;
    nul_content_type.content_type = Some(bad_type.to_owned());
    for (name, value) in &mut nul_content_type.headers {
        if name.eq_ignore_ascii_case("content-type") {
            bad_type.clone_into(value);
        }
    }
    let mut not_utf8 = encoded(12)?;
    h.set_attribute_bytes(&mut not_utf8, "aggregateid", b"p-\xff\xfe");
    let cases: Vec<(&'static str, RawMessage, Expected)> = vec![
        (
            "no CloudEvents attributes at all",
            RawMessage {
                payload: Bytes::from_static(b"plain text, no CloudEvents headers"),
                ..RawMessage::default()
            },
            DecodeError::Missing("specversion").into(),
        ),
        (
            "no id",
            altered(2, "id", None)?,
            DecodeError::Missing("id").into(),
        ),
        (
            "an id that is not a UUID",
            altered(3, "id", Some("not-a-uuid"))?,
            DecodeError::Invalid {
                name: "id",
                value: "not-a-uuid".to_owned(),
            }
            .into(),
        ),
        (
            "a bad aggregate version",
            altered(4, "aggregateversion", Some("zero"))?,
            DecodeError::Invalid {
                name: "aggregateversion",
                value: "zero".to_owned(),
            }
            .into(),
        ),
        (
            "an unknown spec version",
            altered(5, "specversion", Some("0.3"))?,
            DecodeError::SpecVersion("0.3".to_owned()).into(),
        ),
        (
            "a body that is not the fingerprinted one",
            tampered,
            DecodeError::FingerprintMismatch {
                expected: sent_fingerprint.to_hex(),
                actual: Fingerprint::of(b"{\"x\":999}").to_hex(),
            }
            .into(),
        ),
        (
            "a body over the limit",
            big,
            DecodeError::TooLarge {
                size: big_len,
                max: max_message_bytes,
            }
            .into(),
        ),
        (
            "an empty event type",
            altered(9, "type", Some(""))?,
            DecodeError::Missing("type").into(),
        ),
        (
            "an aggregate id over the attribute limit",
            altered(10, "aggregateid", Some(&too_long))?,
            DecodeError::TooLong {
                name: "aggregateid",
                len: too_long.len(),
                max: wire::MAX_ATTRIBUTE_CHARS,
            }
            .into(),
        ),
        (
            "a NUL in the aggregate type",
            altered(13, "aggregatetype", Some("pay\0ment"))?,
            DecodeError::Invalid {
                name: "aggregatetype",
                value: "pay?ment".to_owned(),
            }
            .into(),
        ),
        (
            "a NUL in the content type",
            nul_content_type,
            DecodeError::Invalid {
                name: "datacontenttype",
                value: wire::excerpt(bad_type),
            }
            .into(),
        ),
        (
            "an aggregate id that is not UTF-8",
            not_utf8,
            Expected::InvalidAttribute("aggregateid"),
        ),
    ];
    Ok(cases)
}

/// Poison messages published before a valid event are each a delivery, in publish order, whose
/// event is the exact [`DecodeError`], whose raw message is the one sent (body, content type,
/// headers), and which [`DeliverySource::decode`] judges the same way; the valid event behind
/// them is delivered and decoded. Once all are acknowledged, lag is 0.
///
/// # Errors
/// The first broken expectation.
pub async fn malformed_messages_are_deliveries_and_do_not_block<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings {
        max_message_bytes: 1024,
        ..SourceSettings::default()
    };
    let mut source = h.source(&settings).await?;
    let cases = malformed(h, settings.max_message_bytes)?;
    for (what, raw, _) in &cases {
        h.publish_raw(raw)
            .await
            .with_context(|| format!("publishing {what}"))?;
    }
    let valid = message::with_payload(
        message::event("poison", 8, Bytes::new()),
        Payload::bytes("application/json", &b"{\"ok\":true}"[..]),
    );
    h.publish(&valid).await?;

    let got = receive(&mut source, cases.len() + 1, DELIVERY_WITHIN).await?;
    for ((what, sent, expected), d) in cases.iter().zip(&got) {
        ensure!(
            d.event().as_ref().err().is_some_and(|e| expected.is(e)),
            "{what}: delivered as {:?}, expected {expected:?} (deliveries come in publish \
             order)",
            d.event()
        );
        let raw = d.raw();
        ensure!(
            raw.payload == sent.payload,
            "{what}: the raw body was not kept"
        );
        ensure!(
            raw.content_type == sent.content_type,
            "{what}: raw content type {:?}, sent {:?}",
            raw.content_type,
            sent.content_type
        );
        for (name, value) in &sent.headers {
            ensure!(
                raw.headers.get(name) == Some(value),
                "{what}: raw header `{name}` is {:?}, sent {value:?}",
                raw.headers.get(name)
            );
        }
        ensure!(
            raw.binary_headers == sent.binary_headers,
            "{what}: raw binary headers {:?}, sent {:?}",
            raw.binary_headers,
            sent.binary_headers
        );
        ensure!(
            source.decode(raw) == *d.event(),
            "{what}: decoding the kept raw message gives {:?}",
            source.decode(raw)
        );
    }
    let last = got.last().context("no deliveries")?;
    check_event(event_of(last)?, &valid).context("the valid event behind the poison")?;
    ensure!(
        source.decode(last.raw()).as_ref() == Ok(event_of(last)?),
        "decoding the valid event's raw message differs"
    );
    ack_all(got).await?;
    check_lag(&mut source, &caps, 0, 0, "all acknowledged").await
}

/// With one unacknowledged delivery allowed: lag is 0 on an empty source; one event held and
/// ten more published, lag counts the ten waiting (plus the held one where the broker counts
/// unacknowledged deliveries); the held one acknowledged and the next one held, one less;
/// everything acknowledged, 0.
///
/// # Errors
/// The first broken expectation.
pub async fn lag_counts_waiting_messages_then_falls_to_zero<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings {
        max_unacked: 1,
        ..SourceSettings::default()
    };
    let mut source = h.source(&settings).await?;
    check_lag(&mut source, &caps, 0, 0, "nothing published").await?;
    if caps.lag == LagCounts::Nothing {
        return Ok(());
    }
    h.publish(&message::event("lag", 1, &b"{}"[..])).await?;
    let held = receive_one(&mut source, DELIVERY_WITHIN).await?;
    for version in 2..=11 {
        h.publish(&message::event("lag", version, &b"{}"[..]))
            .await?;
    }
    check_lag(&mut source, &caps, 10, 1, "one held, ten published").await?;
    held.ack().await.context("ack")?;
    let next = receive_one(&mut source, DELIVERY_WITHIN).await?;
    ensure!(
        event_of(&next)?.aggregate_version == 2,
        "not the next event"
    );
    check_lag(
        &mut source,
        &caps,
        9,
        1,
        "the first acknowledged, the next held",
    )
    .await?;
    next.ack().await.context("ack")?;
    for version in 3..=11 {
        let d = receive_one(&mut source, DELIVERY_WITHIN).await?;
        ensure!(
            event_of(&d)?.aggregate_version == version,
            "expected version {version}, got {}",
            describe(&d)
        );
        d.ack().await.context("ack")?;
    }
    check_lag(&mut source, &caps, 0, 0, "all acknowledged").await
}

/// Fifty events of one aggregate: batches of at most 20 (at least one full) that come as soon
/// as messages are there, in publish order, without duplicates, drain everything; then an empty
/// batch waits for its wait (the runner does not spin), a batch of at most 0 is empty at once,
/// and lag is 0.
///
/// # Errors
/// The first broken expectation.
pub async fn batches_respect_max_and_drain_in_order<H: SourceHarness>(h: &H) -> anyhow::Result<()> {
    const EVENTS: i64 = 50;
    const MAX: usize = 20;
    let batch_wait = Duration::from_secs(5);
    let caps = h.capabilities();
    let mut source = h.source(&SourceSettings::default()).await?;
    for version in 1..=EVENTS {
        h.publish(&message::event(
            "batch",
            version,
            format!("{{\"v\":{version}}}"),
        ))
        .await?;
    }
    if caps.lag == LagCounts::Waiting {
        // Where lag counts only undelivered messages, 0 means the broker handed all of them to
        // the consumer: batches can then be full.
        wait::until(
            "the broker hands every message to the consumer",
            DELIVERY_WITHIN,
            async || Ok((source.lag().await.context("lag")? == Some(0)).then_some(())),
        )
        .await?;
    }

    let mut order = Vec::new();
    let mut sizes = Vec::new();
    while order.len() < usize::try_from(EVENTS)? {
        ensure!(
            sizes.len() < 2 * usize::try_from(EVENTS)?,
            "not drained after {} batches of sizes {sizes:?}",
            sizes.len()
        );
        let started = Instant::now();
        let batch = source
            .next_batch(MAX, batch_wait)
            .await
            .context("next_batch")?;
        let took = started.elapsed();
        ensure!(
            batch.len() <= MAX,
            "a batch of {} for max {MAX}",
            batch.len()
        );
        ensure!(
            !batch.is_empty(),
            "an empty batch while {} events wait",
            usize::try_from(EVENTS)? - order.len()
        );
        ensure!(
            took < batch_wait,
            "a batch took {took:?} although messages were waiting"
        );
        sizes.push(batch.len());
        for d in batch {
            order.push(event_of(&d)?.aggregate_version);
            d.ack().await.context("ack")?;
        }
    }
    ensure!(
        order == (1..=EVENTS).collect::<Vec<_>>(),
        "delivered in the order {order:?}"
    );
    ensure!(
        sizes.contains(&MAX),
        "no batch was full (sizes {sizes:?}): a batch takes up to max of the waiting messages"
    );

    let started = Instant::now();
    let empty = source
        .next_batch(MAX, Duration::from_secs(1))
        .await
        .context("next_batch")?;
    let took = started.elapsed();
    ensure!(
        empty.is_empty(),
        "{} deliveries after the drain",
        empty.len()
    );
    ensure!(
        took >= Duration::from_millis(800),
        "an empty batch returned after {took:?}, before its 1 s wait: the runner would spin"
    );
    let started = Instant::now();
    let none = source
        .next_batch(0, batch_wait)
        .await
        .context("next_batch(0)")?;
    ensure!(none.is_empty(), "a batch of at most 0 held {}", none.len());
    ensure!(
        started.elapsed() < batch_wait,
        "a batch of at most 0 waited {:?}",
        started.elapsed()
    );
    check_lag(&mut source, &caps, 0, 0, "all acknowledged").await
}

/// Through a [`Proxy`]: an event is held unacknowledged, then the connection is cut. The
/// source reports the loss as [`SourceErrorKind::Unavailable`] (never a delivery on the cut
/// link), and acknowledging the held delivery fails as `Unavailable`: it never pretends. Once
/// restored, the source delivers again (only `Unavailable` meanwhile): an event published after
/// the outage arrives, and the held one comes again (counted at least 2) where a failed ack
/// certainly did not apply; once all are acknowledged, lag is 0.
///
/// # Errors
/// The first broken expectation.
pub async fn connection_loss_keeps_unacknowledged_deliveries<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::with_ack_wait(Duration::from_secs(2));
    let proxy = h.outage_proxy().await?;
    let mut source = h.source_through(&proxy, &settings).await?;
    let (lost, held) = publish_and_receive(h, &mut source, "loss").await?;

    proxy.cut();
    let err = wait::until(
        "the source reports the lost connection",
        RECOVERY_WITHIN,
        async || match source.next_batch(10, Duration::from_millis(200)).await {
            Ok(batch) if batch.is_empty() => Ok(None),
            Ok(batch) => bail!("{} deliveries on a cut connection", batch.len()),
            Err(e) => Ok(Some(e)),
        },
    )
    .await?;
    ensure!(
        err.kind == SourceErrorKind::Unavailable,
        "the lost connection was reported as {err}, not Unavailable"
    );
    let held_metadata = held.raw().metadata.clone();
    match held.ack().await {
        Ok(()) => bail!("an ack on a cut connection reported success"),
        Err(e) => ensure!(
            e.kind == SourceErrorKind::Unavailable,
            "an ack on a cut connection failed as {e}, not Unavailable"
        ),
    }

    proxy.restore();
    let after = message::event("loss", 2, &b"{\"n\":2}"[..]);
    h.publish(&after).await?;
    let (mut lost_again, mut after_seen) = (false, false);
    wait::until(
        "the event after the outage (and, where a failed ack is final, the held one) delivered",
        RECOVERY_WITHIN,
        async || {
            match source.next_batch(10, Duration::from_millis(500)).await {
                Err(e) => ensure!(
                    e.kind == SourceErrorKind::Unavailable,
                    "while reconnecting: {e}, not Unavailable"
                ),
                Ok(batch) => {
                    for d in batch {
                        let id = event_of(&d)?.event_id;
                        if id == lost.event_id {
                            lost_again = true;
                            // Where the broker may take back a redelivery that went to the
                            // dead connection (JetStream, about 1 run in 20), the count may not
                            // have grown; the attempt cap then parks one delivery later.
                            if caps.counts_deliveries {
                                let count = d.delivery_count().unwrap_or(0);
                                let least = if caps.count_grows_across_cuts { 2 } else { 1 };
                                ensure!(
                                    count >= least,
                                    "delivered again, counted {count}: first {held_metadata:?}, \
                                     again {:?}",
                                    d.raw().metadata
                                );
                            }
                        } else if id == after.event_id {
                            after_seen = true;
                        } else {
                            bail!("an unknown event {id}");
                        }
                        d.ack().await.context("ack after the reconnect")?;
                    }
                }
            }
            let settled = after_seen && (lost_again || !caps.failed_ack_redelivers);
            Ok((settled && matches!(source.lag().await, Ok(Some(0) | None))).then_some(()))
        },
    )
    .await
    .with_context(|| {
        format!("event after the outage seen: {after_seen}, held event seen again: {lost_again}")
    })?;
    check_lag(
        &mut source,
        &caps,
        0,
        0,
        "all acknowledged after the outage",
    )
    .await
}
