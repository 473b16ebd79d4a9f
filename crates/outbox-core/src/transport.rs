//! The broker side: one trait every transport implements.

use std::future::Future;

use futures::Stream;

use crate::message::OutboxMessage;

/// What a broker said when it durably accepted a message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishReceipt {
    /// The broker recognised the event id as already stored (within its dedup window, for a
    /// broker that deduplicates by message id). Brokers without dedup always report `false`.
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
///   durably (the broker's own confirmation that it stored the message, a mandatory message not
///   returned as unroutable, a record stored by every in-sync replica). Anything
///   else is an `Err`; the relay then keeps the row pending and retries it later.
/// * The event id is carried as the broker's own message id / dedup key where one exists.
/// * Calls may run concurrently (the relay pipelines different aggregates); the transport
///   bounds how many are in flight.
/// * `publish` never alters the message: a republish is byte-identical.
pub trait Transport: Send + Sync + 'static {
    /// A short name for logs and metrics labels: the broker's, as its registry entry's
    /// [`name`](crate::broker::BrokerEntry::name).
    fn name(&self) -> &'static str;

    /// Publishes one message and waits for the broker's durable acknowledgement.
    ///
    /// # Errors
    /// A [`PublishError`] whose kind says whether a retry may help.
    fn publish(
        &self,
        message: &OutboxMessage,
    ) -> impl Future<Output = Result<PublishReceipt, PublishError>> + Send;

    /// Whether [`Transport::publish_run`] keeps several versions of one aggregate in flight at
    /// once, in order (*ordered pipelining*). `false` unless the transport overrides it: the
    /// relay then publishes an aggregate's versions one after another, each after the previous
    /// one's acknowledgement, which is correct on any broker.
    fn ordered_pipelining(&self) -> bool {
        false
    }

    /// Publishes `run`, consecutive versions of one aggregate (one partition key) in version
    /// order, and yields one result per message, in order. The relay calls it only when
    /// [`Transport::ordered_pipelining`] is `true`, and stops reading at the first error (the
    /// rest of the run is retried later, with the same event ids).
    ///
    /// The stream may end before the run does (the transport bounds how much it keeps in
    /// flight): the messages without a result were not published and are handed out again.
    ///
    /// The default publishes one message after another with [`Transport::publish`] and ends
    /// after the first error. A transport that overrides it to hand the whole run to its client
    /// at once must guarantee what that gives for free: **the broker never stores a message of
    /// the run unless it stored every earlier message of the run before it** (in this call or
    /// an earlier one), whatever fails, times out or is retried. Copies of a message stored
    /// again later are fine (same event id, the consumer's inbox absorbs them); a later version
    /// stored before the first copy of an earlier one is not.
    ///
    /// # Errors
    /// Each item is the message's [`Transport::publish`] result.
    fn publish_run<'a>(
        &'a self,
        run: &'a [OutboxMessage],
    ) -> impl Stream<Item = Result<PublishReceipt, PublishError>> + Send + 'a {
        futures::stream::unfold((0usize, false), move |(next, failed)| async move {
            if failed || next >= run.len() {
                return None;
            }
            let result = self.publish(&run[next]).await;
            let failed = result.is_err();
            Some((result, (next + 1, failed)))
        })
    }
}
