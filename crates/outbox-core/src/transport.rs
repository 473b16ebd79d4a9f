//! The broker side: one trait every transport implements.

use std::future::Future;

use crate::message::OutboxMessage;

/// What a broker said when it durably accepted a message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishReceipt {
    /// The broker recognised the event id as already stored (NATS `Nats-Msg-Id` dedup window).
    /// Brokers without dedup always report `false`.
    pub duplicate: bool,
}

/// Why a publish did not end in a durable acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishErrorKind {
    /// Could not connect, or the connection broke. Retry with backoff.
    Unavailable,
    /// No acknowledgement within the configured timeout: the outcome is unknown, so the message
    /// must be republished (with the same event id) later.
    TimedOut,
    /// The broker refused the message (negative ack, no stream / route, returned as unroutable).
    /// Usually retryable: a stream may be created or a queue bound later.
    Rejected,
    /// The message is larger than the broker accepts. Never retried: it is dead-lettered.
    TooLarge,
    /// The message cannot be expressed in the protocol (bad subject, bad header). Never retried.
    Invalid,
}

/// A failed publish.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct PublishError {
    /// The kind.
    pub kind: PublishErrorKind,
    /// Details from the client library or broker.
    pub message: String,
}

impl PublishError {
    /// Builds an error.
    pub fn new(kind: PublishErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// True when the same message may succeed later; false for [`PublishErrorKind::TooLarge`]
    /// and [`PublishErrorKind::Invalid`], which the relay dead-letters at once.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self.kind,
            PublishErrorKind::TooLarge | PublishErrorKind::Invalid
        )
    }
}

/// A broker the relay publishes to.
///
/// # Contract (checked by each transport's conformance tests)
///
/// * [`Transport::publish`] returns `Ok` only after the broker acknowledged the message
///   durably (JetStream `PublishAck`, AMQP publisher confirm `Ack` and not returned). Anything
///   else is an `Err`; the relay then keeps the row pending and retries it later.
/// * The event id is carried as the broker's own message id / dedup key where one exists.
/// * Calls may run concurrently (the relay pipelines different aggregates); the transport
///   bounds how many are in flight.
/// * `publish` never alters the message: a republish is byte-identical.
pub trait Transport: Send + Sync + 'static {
    /// A short name for logs and metrics labels (`nats`, `rabbitmq`).
    fn name(&self) -> &'static str;

    /// Publishes one message and waits for the broker's durable acknowledgement.
    ///
    /// # Errors
    /// A [`PublishError`] whose kind says whether a retry may help.
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<PublishReceipt, PublishError>> + Send;
}
