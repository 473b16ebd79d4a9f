//! The consumers of the examples: the settings they share ([`config`]), what each subscribes to
//! ([`Subscription`]), how one is built on the library's API ([`Subscription::connect`]:
//! `PgConsumer::new` with the inbox in the consuming service's own database and the
//! deployment's delivery source), and the decoding of an event's JSON payload ([`decode`]).
//!
//! Each example writes its handlers (what a delivery changes, on the inbox transaction) and
//! picks each consumer's subscription and ordering guard.

use std::time::Duration;

use anyhow::Result;
use outbox::IncomingEvent;
use outbox::broker::BoxSource;
use outbox::consumer::{ConsumerConfig, Handler, HandlerError, OrderingGuard};
use outbox::postgres::{PgConsumer, PgStore};
use sqlx::{PgConnection, PgPool};

use crate::topology::Topology;

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

/// What a consumer of a deployment takes from the broker and how: its name (its durable
/// subscription or queue, and its inbox key `(name, event_id)`), the one event type it is
/// restricted to, if any, and its ordering guard.
#[derive(Debug, Clone, Copy)]
pub struct Subscription {
    /// The consumer's name.
    pub name: &'static str,
    /// The one event type it receives (a NATS filter subject, a RabbitMQ binding key); `None`:
    /// every event of the aggregate.
    pub only: Option<&'static str>,
    /// Its ordering guard.
    pub ordering: OrderingGuard,
}

impl Subscription {
    /// The consumer `name` of every event of the aggregate, under `ordering`.
    pub fn all(name: &'static str, ordering: OrderingGuard) -> Self {
        Self {
            name,
            only: None,
            ordering,
        }
    }

    /// The consumer `name` of the events of type `event_type` only, under `ordering`.
    pub fn only(name: &'static str, event_type: &'static str, ordering: OrderingGuard) -> Self {
        Self {
            name,
            only: Some(event_type),
            ordering,
        }
    }

    /// The consumer with `handler`: its inbox in `pool` (the consuming service's own database,
    /// on the toolkit's schema), its deliveries from the deployment `topology` on `broker_url`
    /// ([`Topology::connect_source`]), its settings from [`config`]:
    /// `PgConsumer::new(PgStore::with_schema(pool, schema), source, handler, config)`. Run it
    /// with `consumer.run(shutdown)`.
    ///
    /// # Errors
    /// The broker is unreachable or refused the subscription, or the settings are invalid.
    pub async fn connect<H>(
        self,
        topology: &Topology,
        broker_url: &str,
        pool: PgPool,
        handler: H,
    ) -> Result<PgConsumer<BoxSource, H>>
    where
        H: Handler<PgConnection>,
    {
        let source = topology
            .connect_source(broker_url, self.name, self.only)
            .await?;
        Ok(PgConsumer::new(
            PgStore::with_schema(pool, crate::database::schema()),
            source,
            handler,
            config(self.name, self.ordering),
        )?)
    }
}

/// Decodes the payload of `event`, schema version 1, as JSON of a `T` (`what` names it in the
/// error: `payment event`). A payload that does not decode never will: the error is permanent
/// (the delivery becomes a consumer dead letter with that reason).
///
/// # Errors
/// [`HandlerError::Permanent`] for an unknown schema version or a malformed payload.
pub fn decode<T: serde::de::DeserializeOwned>(
    event: &IncomingEvent,
    what: &str,
) -> Result<T, HandlerError> {
    if event.schema_version != 1 {
        return Err(HandlerError::permanent(format!(
            "unknown schema version {} of {}",
            event.schema_version, event.event_type
        )));
    }
    serde_json::from_slice(&event.payload.bytes)
        .map_err(|e| HandlerError::permanent(format!("payload is not a {what}: {e}")))
}

/// The permanent error of an event type a handler does not know.
pub fn unknown_event_type(event_type: &str) -> HandlerError {
    HandlerError::permanent(format!("unknown event type {event_type}"))
}
