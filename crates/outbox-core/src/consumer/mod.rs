//! The consumer side: where deliveries come from ([`DeliverySource`], implemented by each
//! transport crate), the database side ([`InboxStore`], implemented by each store crate), and
//! the engine ([`Consumer`]) that applies deliveries through the inbox, exactly once per
//! `(consumer, event)`.

mod engine;
mod source;
mod stats;
mod store;

pub(crate) use engine::printable;
pub use engine::{
    ConflictPolicy, Consumer, ConsumerConfig, ConsumerError, ConsumerReport, Handler, HandlerError,
    LOCAL_COUNT_CAPACITY, MAX_REASON_CHARS, PAUSE_CHECK_INTERVAL, metric,
};
pub use source::{
    Delivery, DeliverySource, HEADER_KEY_ESCAPE, RawMessage, SourceError, SourceErrorKind,
};
pub use stats::{ConsumerStats, ConsumerStatsSnapshot};
pub use store::{
    ConsumerDeadLetter, ConsumerDeadLetterState, InboxOutcome, InboxStore, NewConsumerDeadLetter,
    OrderingGuard, RequeuedDeadLetter,
};
