//! The names of the story's events and consumers, and the broker objects and timings of one
//! deployment ([`Topology`], shared with the other examples), used by every process.
//!
//! One name per deployment (`fintech run` uses one per run) keeps runs apart on a shared
//! broker: NATS stream `FINTECH_<NAME>` capturing `fintech_<name>.>`, RabbitMQ exchange
//! `fintech_<name>` with one queue per consumer.

use anyhow::Result;
pub use support::topology::Topology;

/// The aggregate type of every event of the service.
pub const AGGREGATE: &str = "payment";
/// Event type of a created payment (version 1).
pub const PAYMENT_CREATED: &str = "PaymentCreated";
/// Event type of a captured payment (version 2).
pub const PAYMENT_CAPTURED: &str = "PaymentCaptured";
/// The reporting service's consumer name (its inbox key is `(name, event_id)`).
pub const REPORTING_CONSUMER: &str = "reporting";
/// The capture worker's consumer name.
pub const CAPTURE_CONSUMER: &str = "capture";
/// The work-item kind of a capture at the provider.
pub const CAPTURE_KIND: &str = "provider-capture";

/// The topology of the deployment `name`.
///
/// # Errors
/// A name that cannot be part of a subject, stream or exchange name.
pub fn topology(name: &str, fast: bool) -> Result<Topology> {
    Topology::new("fintech", AGGREGATE, name, fast)
}
