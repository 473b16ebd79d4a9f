//! The consumer settings the examples share.
//!
//! Each example builds its consumers itself (`PgConsumer::new` with the inbox in the consuming
//! service's own database, the deployment's delivery source, the handler): that is the
//! library's API as a service uses it. What is the same for every consumer of the examples is
//! how they take their deliveries, written once here; the ordering guard stays each
//! consumer's own choice.

use std::time::Duration;

use outbox::consumer::{ConsumerConfig, OrderingGuard};

/// The settings of the consumer `name` with the ordering guard `ordering`: deliveries in
/// batches of up to 50 (one transaction each), waiting at most 100 ms for a batch's first
/// delivery, and,
/// under [`OrderingGuard::Wait`], a delivery that arrived before its predecessor redelivered
/// after 200 ms. Everything else is the toolkit's default (`ConsumerConfig::new`).
pub fn config(name: &str, ordering: OrderingGuard) -> ConsumerConfig {
    ConsumerConfig {
        ordering,
        gap_delay: Duration::from_millis(200),
        batch_size: 50,
        batch_wait: Duration::from_millis(100),
        ..ConsumerConfig::new(name)
    }
}
