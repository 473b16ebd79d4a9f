//! The transport chosen by the broker URL's scheme.

use anyhow::{Context, Result};
use outbox_core::{OutboxMessage, PublishError, PublishReceipt, Transport};
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_rabbitmq::{RabbitConfig, RabbitTransport};

use crate::config::redact;

/// NATS JetStream or RabbitMQ, picked at runtime.
pub enum AnyTransport {
    /// `nats://`
    Nats(Box<NatsTransport>),
    /// `amqp://`, `amqps://`
    Rabbit(RabbitTransport),
}

impl AnyTransport {
    /// Connects by scheme.
    pub async fn connect(url: &str, nats: NatsConfig, rabbit: RabbitConfig) -> Result<Self> {
        if url.starts_with("nats://") {
            Ok(Self::Nats(Box::new(
                NatsTransport::connect(url, nats)
                    .await
                    .with_context(|| format!("cannot connect to NATS at {}", redact(url)))?,
            )))
        } else {
            Ok(Self::Rabbit(
                RabbitTransport::connect(url, rabbit)
                    .await
                    .with_context(|| format!("cannot connect to RabbitMQ at {}", redact(url)))?,
            ))
        }
    }
}

impl Transport for AnyTransport {
    fn name(&self) -> &'static str {
        match self {
            Self::Nats(t) => t.name(),
            Self::Rabbit(t) => t.name(),
        }
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        match self {
            Self::Nats(t) => t.publish(message).await,
            Self::Rabbit(t) => t.publish(message).await,
        }
    }
}

/// A consumer's delivery source picked by the broker URL's scheme.
pub enum AnySource {
    /// JetStream durable pull consumer.
    Nats(Box<outbox_nats::NatsSource>),
    /// RabbitMQ queue with manual acks.
    Rabbit(Box<outbox_rabbitmq::RabbitSource>),
}

/// A delivery from [`AnySource`]. Deliveries are moved a few times per batch; the size
/// difference between the variants does not matter next to a database round trip.
#[allow(clippy::large_enum_variant)]
pub enum AnyDelivery {
    /// From NATS.
    Nats(outbox_nats::NatsDelivery),
    /// From RabbitMQ.
    Rabbit(outbox_rabbitmq::RabbitDelivery),
}

impl AnySource {
    /// Connects by scheme.
    pub async fn connect(
        url: &str,
        nats: outbox_nats::NatsConsumerConfig,
        rabbit: outbox_rabbitmq::RabbitConsumerConfig,
    ) -> Result<Self> {
        if url.starts_with("nats://") {
            Ok(Self::Nats(Box::new(
                outbox_nats::NatsSource::connect(url, nats)
                    .await
                    .with_context(|| format!("cannot consume from NATS at {}", redact(url)))?,
            )))
        } else {
            Ok(Self::Rabbit(Box::new(
                outbox_rabbitmq::RabbitSource::connect(url, rabbit)
                    .await
                    .with_context(|| format!("cannot consume from RabbitMQ at {}", redact(url)))?,
            )))
        }
    }
}

use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceError};
use outbox_core::{DecodeError, IncomingEvent};

impl Delivery for AnyDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        match self {
            Self::Nats(d) => d.event(),
            Self::Rabbit(d) => d.event(),
        }
    }
    fn raw(&self) -> &RawMessage {
        match self {
            Self::Nats(d) => d.raw(),
            Self::Rabbit(d) => d.raw(),
        }
    }
    fn delivery_count(&self) -> Option<u32> {
        match self {
            Self::Nats(d) => d.delivery_count(),
            Self::Rabbit(d) => d.delivery_count(),
        }
    }
    async fn ack(self) -> Result<(), SourceError> {
        match self {
            Self::Nats(d) => d.ack().await,
            Self::Rabbit(d) => d.ack().await,
        }
    }
    async fn nack(self, delay: std::time::Duration) -> Result<(), SourceError> {
        match self {
            Self::Nats(d) => d.nack(delay).await,
            Self::Rabbit(d) => d.nack(delay).await,
        }
    }
}

impl DeliverySource for AnySource {
    type Delivery = AnyDelivery;
    async fn next_batch(
        &mut self,
        max: usize,
        wait: std::time::Duration,
    ) -> Result<Vec<AnyDelivery>, SourceError> {
        Ok(match self {
            Self::Nats(s) => s
                .next_batch(max, wait)
                .await?
                .into_iter()
                .map(AnyDelivery::Nats)
                .collect(),
            Self::Rabbit(s) => s
                .next_batch(max, wait)
                .await?
                .into_iter()
                .map(AnyDelivery::Rabbit)
                .collect(),
        })
    }
    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        match self {
            Self::Nats(s) => s.lag().await,
            Self::Rabbit(s) => s.lag().await,
        }
    }
    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        match self {
            Self::Nats(s) => s.decode(raw),
            Self::Rabbit(s) => s.decode(raw),
        }
    }
}

/// Test-only source that acknowledges every delivery the moment it arrives, before the consumer
/// has even begun its transaction: the mistake "ack before commit" (guarantee G6), built on purpose
/// so the crash matrix can show that it detects it. Only `OUTBOX_TEST_ACK_BEFORE_COMMIT=1` selects it.
pub struct AckFirstSource(pub AnySource);

/// A delivery whose broker acknowledgement was already sent; its own ack and nack do nothing.
pub struct AckedDelivery {
    event: Result<IncomingEvent, DecodeError>,
    raw: RawMessage,
    count: Option<u32>,
}

impl Delivery for AckedDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        &self.event
    }
    fn raw(&self) -> &RawMessage {
        &self.raw
    }
    fn delivery_count(&self) -> Option<u32> {
        self.count
    }
    async fn ack(self) -> Result<(), SourceError> {
        Ok(())
    }
    async fn nack(self, _delay: std::time::Duration) -> Result<(), SourceError> {
        Ok(())
    }
}

impl DeliverySource for AckFirstSource {
    type Delivery = AckedDelivery;
    async fn next_batch(
        &mut self,
        max: usize,
        wait: std::time::Duration,
    ) -> Result<Vec<AckedDelivery>, SourceError> {
        let mut out = Vec::new();
        for d in self.0.next_batch(max, wait).await? {
            let acked = AckedDelivery {
                event: d.event().clone(),
                raw: d.raw().clone(),
                count: d.delivery_count(),
            };
            d.ack().await?;
            out.push(acked);
        }
        Ok(out)
    }
    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        self.0.lag().await
    }
    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        self.0.decode(raw)
    }
}
