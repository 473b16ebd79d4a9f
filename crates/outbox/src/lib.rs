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
//!
//! The core knows no backend; what it must know of one (URL schemes, the header names a
//! broker's binding reserves, how a URL carries credentials) each backend crate declares, and
//! this crate gathers for the build: [`brokers`], [`reserved_headers`] and
//! [`secrets::redactor`] (which [`secrets::redact_url`] applies).
#![forbid(unsafe_code)]

pub use outbox_core::*;

/// Keeping credentials out of logs and messages: everything of [`outbox_core::secrets`], with
/// [`redact_url`](secrets::redact_url) and [`url_secrets`](secrets::url_secrets) applying the
/// URL rules of every backend of this build ([`redactor`](secrets::redactor)), so that a user
/// name and harmless connection settings stay readable where the backend's protocol says so.
pub mod secrets {
    pub use outbox_core::secrets::*;

    /// A [`Redactor`] with the URL rules of every backend of this build: the brokers of
    /// [`brokers`](crate::brokers), the store and the HTTP adapter when built in.
    ///
    /// ```
    /// let r = outbox::secrets::redactor();
    /// assert_eq!(r.redact("foo://user:pw@h?password=pw"), "foo://user:***@h?password=***");
    /// ```
    pub fn redactor() -> Redactor {
        let r = crate::brokers().redactor();
        #[cfg(feature = "postgres")]
        let r = r.with(outbox_postgres::URL_RULES);
        #[cfg(feature = "http")]
        let r = r.with(outbox_http::URL_RULES);
        r
    }

    /// `url` (or a comma-separated list of URLs) with every secret masked, by the rules of the
    /// URL's backend when it is one of this build's ([`redactor`]), else by the generic rules
    /// ([`outbox_core::secrets::redact_url`]).
    pub fn redact_url(url: &str) -> String {
        redactor().redact(url)
    }

    /// Every secret [`redact_url`] would mask in `url`, as written and percent-decoded.
    pub fn url_secrets(url: &str) -> Vec<String> {
        redactor().secrets(url)
    }
}

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

    /// The build's redaction, URL by URL, as each backend's protocol reads it.
    #[test]
    fn the_builds_redaction_follows_each_backends_rules() {
        let cases: &[(&str, &str, bool)] = &[
            // (url, redacted, whether this build's features decide it)
            ("foo://tok@h?x=1", "foo://***@h?x=***", true),
            (
                "postgres://app@db/pay?sslmode=require&password=pw",
                "postgres://app@db/pay?sslmode=require&password=***",
                cfg!(feature = "postgres"),
            ),
            (
                "postgresql://app:pw@db/pay?application_name=relay",
                "postgresql://app:***@db/pay?application_name=relay",
                cfg!(feature = "postgres"),
            ),
            ("nats://t0k@h:4222", "nats://***@h:4222", true),
            ("tls://u:pw@h:4222", "tls://u:***@h:4222", true),
            (
                "amqp://guest@mq/%2f?heartbeat=5",
                "amqp://guest@mq/%2f?heartbeat=5",
                cfg!(feature = "rabbitmq"),
            ),
            ("kafka://h:9092", "kafka://h:9092", true),
            (
                "https://ops@pay/x",
                "https://ops@pay/x",
                cfg!(feature = "http"),
            ),
        ];
        for (url, redacted, decided) in cases {
            if *decided {
                assert_eq!(crate::secrets::redact_url(url), *redacted, "{url}");
            }
            // A backend's rules only ever show more: what they mask, the generic rules mask.
            for secret in crate::secrets::url_secrets(url) {
                assert!(
                    outbox_core::secrets::url_secrets(url).contains(&secret),
                    "{url}: {secret}"
                );
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
    #[doc = include_str!("../../../docs/guide/src/deployment.md")]
    mod deployment {}
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
