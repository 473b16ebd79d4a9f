//! Transactional Outbox / Inbox toolkit: the crate a service depends on.
//!
//! ```toml
//! [dependencies]
//! outbox = { version = "0.1", features = ["postgres", "nats"] }
//! ```
//!
//! | feature         | crate             | what it brings                                          |
//! |-----------------|-------------------|---------------------------------------------------------|
//! | (always)        | `outbox-core`     | message model, store / transport traits, the engines    |
//! | `postgres` (default) | `outbox-postgres` | migrations, `enqueue` on your transaction, the store |
//! | `nats`          | `outbox-nats`     | NATS JetStream transport and delivery source            |
//! | `rabbitmq`      | `outbox-rabbitmq` | RabbitMQ transport and delivery source                  |
//! | `kafka`         | `outbox-kafka`    | Kafka transport and delivery source (librdkafka)        |
//! | `http`          | `outbox-http`     | HTTP remote-effect adapter (payouts by idempotency key) |
//! | `opentelemetry` |                   | trace context from an OpenTelemetry context             |
//!
//! Everything of `outbox-core` is at the root (`outbox::NewMessage`, `outbox::relay::Relay`,
//! `outbox::consumer::Consumer` ...); the backends are modules (`outbox::postgres`,
//! `outbox::nats`, `outbox::rabbitmq`, `outbox::kafka`, `outbox::http`). [`brokers`] lists the transports of this
//! build by URL scheme, for services that pick their broker from configuration.
#![forbid(unsafe_code)]

pub use outbox_core::*;

/// PostgreSQL store and producer API.
#[cfg(feature = "postgres")]
pub use outbox_postgres as postgres;

/// NATS JetStream transport and delivery source.
#[cfg(feature = "nats")]
pub use outbox_nats as nats;

/// RabbitMQ transport and delivery source.
#[cfg(feature = "rabbitmq")]
pub use outbox_rabbitmq as rabbitmq;

/// Kafka transport and delivery source.
#[cfg(feature = "kafka")]
pub use outbox_kafka as kafka;

/// HTTP remote-effect adapter.
#[cfg(feature = "http")]
pub use outbox_http as http;

/// The brokers of this build, chosen by URL scheme: one registry entry per transport feature
/// (`nats://`, `tls://` with `nats`; `amqp://`, `amqps://` with `rabbitmq`; `kafka://` with
/// `kafka`). Adding a transport
/// is its crate plus one line here.
///
/// ```
/// let brokers = outbox::brokers();
/// let err = brokers.find("foo://x").unwrap_err();
/// assert!(err.to_string().contains("foo"));
/// ```
pub fn brokers() -> broker::Registry {
    broker::Registry::new(&[
        #[cfg(feature = "nats")]
        &outbox_nats::BROKER,
        #[cfg(feature = "rabbitmq")]
        &outbox_rabbitmq::BROKER,
        #[cfg(feature = "kafka")]
        &outbox_kafka::BROKER,
    ])
}

/// The header names any broker of this build reserves for its own headers, one set per broker
/// ([`broker::Registry::reserved_headers`]): what a producer that does not know which broker
/// will carry its events refuses, e.g.
/// `PgOutbox::new(schema).reserve_headers(outbox::reserved_headers())`.
///
/// ```
/// let msg = outbox::NewMessage::new("payment", "p-1", 1, "PaymentCreated",
///     outbox::Payload::json(&1).unwrap());
/// assert!(msg.validate_reserving(&outbox::reserved_headers()).is_ok());
/// ```
pub fn reserved_headers() -> Vec<ReservedHeaders> {
    brokers().reserved_headers()
}

/// Cancels `token` on SIGTERM or Ctrl-C, so a relay, consumer or executor finishes its current
/// batch and stops (their `run` methods take the token). Returns without cancelling if the
/// signal handlers cannot be installed (logged).
pub async fn cancel_on_signal(token: tokio_util::sync::CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGTERM handler");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: finishing the current batch, then stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("Ctrl-C: finishing the current batch, then stopping"),
    }
    token.cancel();
}

#[cfg(test)]
mod tests {
    /// The producer's default (the events table's rule) refuses what every broker of the build
    /// reserves, so a plain `PgOutbox::new` never lets a header through that a transport would
    /// refuse at publish.
    #[cfg(feature = "postgres")]
    #[test]
    fn the_tables_rule_covers_every_brokers_reserved_headers() {
        let table = outbox_postgres::RESERVED_HEADERS;
        for entry in crate::brokers().entries() {
            let r = entry.reserved_headers;
            for p in r.prefixes {
                assert!(table.reserves(&format!("{p}x")), "{}: {p}", entry.name);
            }
            for n in r.names {
                assert!(table.reserves(n), "{}: {n}", entry.name);
            }
        }
    }
}

/// The guide (`docs/guide`, an mdBook) and the README, one module per chapter, so that
/// `cargo test --doc -p outbox --all-features` compiles (and, unless marked `no_run`, runs)
/// every ```rust block of them: the book's code is tested, not pasted. Blocks in another
/// language are tagged (```toml, ```sh, ```sql, ```text) and left alone by rustdoc.
/// crates/outbox-cli/tests/guide.rs checks that every chapter of SUMMARY.md is listed here.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../../../README.md")]
    mod readme {}
    #[doc = include_str!("../../../docs/guide/src/introduction.md")]
    mod introduction {}
    #[doc = include_str!("../../../docs/guide/src/quick-start.md")]
    mod quick_start {}
    #[doc = include_str!("../../../docs/guide/src/examples.md")]
    mod examples {}
    #[doc = include_str!("../../../docs/guide/src/producer.md")]
    mod producer {}
    #[doc = include_str!("../../../docs/guide/src/sql-contract.md")]
    mod sql_contract {}
    #[doc = include_str!("../../../docs/guide/src/relay.md")]
    mod relay {}
    #[doc = include_str!("../../../docs/guide/src/transports.md")]
    mod transports {}
    #[doc = include_str!("../../../docs/guide/src/configuration.md")]
    mod configuration {}
    #[doc = include_str!("../../../docs/guide/src/consumer.md")]
    mod consumer {}
    #[doc = include_str!("../../../docs/guide/src/remote-effects.md")]
    mod remote_effects {}
    #[doc = include_str!("../../../docs/guide/src/operations.md")]
    mod operations {}
    #[doc = include_str!("../../../docs/guide/src/retention.md")]
    mod retention {}
    #[doc = include_str!("../../../docs/guide/src/guarantees.md")]
    mod guarantees {}
    #[doc = include_str!("../../../docs/guide/src/security.md")]
    mod security {}
    #[doc = include_str!("../../../docs/guide/src/console.md")]
    mod console {}
    #[doc = include_str!("../../../docs/guide/src/cli.md")]
    mod cli {}
    #[doc = include_str!("../../../docs/guide/src/troubleshooting.md")]
    mod troubleshooting {}
    #[doc = include_str!("../../../docs/guide/src/migrating.md")]
    mod migrating {}
    #[doc = include_str!("../../../docs/guide/src/known-limits.md")]
    mod known_limits {}
    #[doc = include_str!("../../../docs/guide/src/architecture.md")]
    mod architecture {}
    #[doc = include_str!("../../../docs/guide/src/crash-matrix.md")]
    mod crash_matrix {}
    #[doc = include_str!("../../../docs/guide/src/debezium-router.md")]
    mod debezium_router {}
    // The docs the guide includes with {{#include}}: their blocks are tagged too.
    #[doc = include_str!("../../../docs/architecture.md")]
    mod docs_architecture {}
    #[doc = include_str!("../../../docs/security.md")]
    mod docs_security {}
    #[doc = include_str!("../../../docs/guarantees.md")]
    mod docs_guarantees {}
    #[doc = include_str!("../../../docs/debezium-router.md")]
    mod docs_debezium_router {}
}
