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
