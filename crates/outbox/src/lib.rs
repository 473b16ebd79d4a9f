//! Transactional Outbox / Inbox toolkit.
//!
//! This facade re-exports the pieces a service needs, behind features:
//!
//! | feature    | crate             | what it brings                                   |
//! |------------|-------------------|--------------------------------------------------|
//! | (always)   | `outbox-core`     | message model, store and transport traits, engines |
//! | `postgres` | `outbox-postgres` | migrations, `enqueue` on your transaction, store |
//! | `nats`     | `outbox-nats`     | NATS JetStream transport                         |
//! | `rabbitmq` | `outbox-rabbitmq` | RabbitMQ transport (publisher confirms)          |
#![forbid(unsafe_code)]

pub use outbox_core::*;

/// PostgreSQL store and producer API.
#[cfg(feature = "postgres")]
pub use outbox_postgres as postgres;

/// NATS JetStream transport.
#[cfg(feature = "nats")]
pub use outbox_nats as nats;

/// RabbitMQ transport.
#[cfg(feature = "rabbitmq")]
pub use outbox_rabbitmq as rabbitmq;
