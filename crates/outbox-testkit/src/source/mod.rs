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
//!
//! One file per topic: delivery, redelivery and nack (`delivery.rs`), malformed messages
//! (`malformed.rs`), lag and batches (`flow.rs`), a lost connection (`outage.rs`), and the
//! helpers the cases share, public for backend-specific tests too (`steps.rs`).
//!
//! [`wire::MAX_ATTRIBUTE_CHARS`]: outbox_core::wire::MAX_ATTRIBUTE_CHARS
//! [`DecodeError`]: outbox_core::wire::DecodeError
//! [`SourceErrorKind::Unavailable`]: outbox_core::consumer::SourceErrorKind::Unavailable

use std::future::Future;
use std::time::Duration;

use anyhow::Context as _;
use outbox_core::OutboxMessage;
use outbox_core::consumer::{DeliverySource, RawMessage};

use crate::harness::Harness;
use crate::net::Proxy;

mod delivery;
mod flow;
mod malformed;
mod outage;
mod steps;

pub use delivery::{
    crashed_consumer_leaves_its_delivery_to_the_next,
    delivered_event_is_decoded_and_gone_once_acked, dropped_delivery_is_delivered_again,
    nack_delivers_again_after_its_delay,
};
pub use flow::{
    batches_respect_max_and_drain_in_order, lag_counts_waiting_messages_then_falls_to_zero,
};
pub use malformed::malformed_messages_are_deliveries_and_do_not_block;
pub use outage::connection_loss_keeps_unacknowledged_deliveries;
pub use steps::{ack_all, check_event, event_of, expect_nothing, receive, receive_one};

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
    ///
    /// [`DecodeError::TooLarge`]: outbox_core::wire::DecodeError::TooLarge
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
    ///
    /// [`Delivery::delivery_count`]: outbox_core::consumer::Delivery::delivery_count
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
