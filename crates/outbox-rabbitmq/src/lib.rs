//! RabbitMQ transport for the outbox relay: AMQP 0-9-1 via [lapin], publisher confirms,
//! persistent mandatory messages, CloudEvents 1.0 in binary content mode.
//!
//! The consumer side, [`RabbitSource`] (a [`outbox_core::consumer::DeliverySource`] for the
//! inbox runner: manual acks, prefetch, redelivery on channel loss), is described in the
//! [`source`] module.
//!
//! ```no_run
//! use outbox_core::Transport;
//! use outbox_rabbitmq::{RabbitConfig, RabbitTransport};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let transport = RabbitTransport::connect(
//!     "amqp://guest:guest@127.0.0.1:5672/%2f",
//!     RabbitConfig { exchange: "payments".into(), ..RabbitConfig::default() },
//! )
//! .await?;
//! assert_eq!(transport.name(), "rabbitmq");
//! # Ok(()) }
//! ```
//!
//! # Wire format
//!
//! One `basic.publish` per outbox row to [`RabbitConfig::exchange`] with `mandatory = true`.
//! The routing key is [`RabbitConfig::routing_key_template`] expanded by
//! [`outbox_core::wire::destination`] (template values have whitespace and control characters
//! replaced by `_`; a message's own destination override is used as is). The body is the
//! payload bytes, unchanged. Properties:
//!
//! | AMQP property   | value                                                 |
//! |-----------------|-------------------------------------------------------|
//! | `delivery_mode` | `2` (persistent)                                      |
//! | `message_id`    | event id, hyphenated UUID (consumers dedup on it)     |
//! | `content_type`  | payload content type (CloudEvents `datacontenttype`)  |
//! | `type`          | event type                                            |
//! | `timestamp`     | `created_at`, Unix seconds                            |
//! | `app_id`        | [`RabbitConfig::app_id`], when set                    |
//! | `headers`       | see below                                             |
//!
//! Headers (all AMQP long strings): `cloudEvents_<name>` for every attribute of
//! [`outbox_core::wire::attributes`] (`cloudEvents_specversion`, `cloudEvents_id`,
//! `cloudEvents_source`, `cloudEvents_type`, `cloudEvents_subject`, `cloudEvents_time`,
//! `cloudEvents_aggregatetype`, `cloudEvents_aggregateid`, `cloudEvents_aggregateversion`,
//! `cloudEvents_schemaversion`, `cloudEvents_partitionkey`, `cloudEvents_payloadsha256`), plus
//! every user header of the message (e.g. `traceparent`) under its own name and value.
//!
//! Publishing never modifies the message, so a republish after a crash or retry is
//! byte-identical, with the same `message_id`.
//!
//! # When a publish counts as sent
//!
//! The channel is in publisher-confirm mode and [`outbox_core::Transport::publish`] returns
//! `Ok` only for a `basic.ack` of a message that was **not** returned. Messages are published
//! `mandatory`: if no queue is bound for the routing key, RabbitMQ returns the message
//! (`basic.return`, `312 NO_ROUTE`) and then acks it. Such a message reached no queue, so the
//! publish fails with [`PublishErrorKind::Rejected`]; the relay keeps the row pending and
//! retries it (a queue may be bound later) until its retry policy dead-letters it. A route-less
//! message is never counted as sent.
//!
//! lapin attaches a `basic.return` to whichever confirm it resolves next, and RabbitMQ may
//! deliver the return after the (multiple) ack covering its message, so the transport does not
//! trust where a return arrived: one collector task per channel pairs every return with its
//! publish by `message_id` (the event id) and decides confirmed publishes in cohorts, each
//! closed by a *probe*: an empty, non-mandatory message to the queue name
//! `outbox.confirm-probe.no-such-queue` through the default exchange, which the broker drops and
//! acknowledges. Every cohort member's return was sent before the probe's ack, so it has been
//! seen. The user needs write permission on the default exchange; if the probe cannot be
//! published, confirmed publishes fail as `Unavailable` (retried, never counted as sent).
//!
//! Many publishes are in flight on the one channel at once (bounded by
//! [`RabbitConfig::max_in_flight`]); only fetching the channel handle is serialised, the
//! publish and confirm wait are not. If the caller stops waiting (the relay's publish
//! timeout), the confirm is still collected in the background and its in-flight slot freed only
//! then.
//!
//! # Reconnects
//!
//! lapin's automatic recovery is not used: it would replay publishes behind the relay's back.
//! Instead, when the connection or channel breaks, every publish in flight on it fails with
//! [`PublishErrorKind::Unavailable`] (its outcome is unknown, so the relay republishes it with
//! the same event id). The next publish notices the broken link under a mutex and re-establishes
//! it: a channel closed by a channel-level error is reopened on the same connection at once; a
//! lost connection is reconnected no sooner than [`RabbitConfig::reconnect_min_delay_ms`] after
//! the loss was noticed and after the previous attempt. Publishes arriving before that fail fast
//! with `Unavailable`, so an outage never becomes a reconnect loop. The exchange is declared
//! again on every reconnect (with `declare_exchange`). Dead peers are detected by AMQP
//! heartbeats, negotiated with the broker (set one with `?heartbeat=10` in the URL). While the
//! broker blocks publishers (memory or disk alarm), publishes fail fast with `Unavailable`.
//!
//! # Error mapping
//!
//! | situation                                                        | kind          |
//! |------------------------------------------------------------------|---------------|
//! | `basic.ack`, not returned                                        | `Ok`          |
//! | returned (`mandatory`, no route), then acked                     | `Rejected`    |
//! | acked, but the cohort's probe could not be published or acked    | `Unavailable` |
//! | `basic.nack`                                                     | `Rejected`    |
//! | channel closed with `NOT_FOUND` (no exchange) / `ACCESS_REFUSED` | `Rejected`    |
//! | payload above `max_message_bytes` (checked before sending)       | `TooLarge`    |
//! | channel closed by the broker for message size (`PRECONDITION_FAILED`, "larger than max size"), for the oversized message | `TooLarge` |
//! | … for other messages in flight on that channel                   | `Unavailable` |
//! | properties + headers larger than the negotiated `frame_max`      | `TooLarge`    |
//! | routing key, event type, content type or header name over 255 bytes, header shadowing `cloudEvents_*`, `created_at` before 1970 | `Invalid` |
//! | connection or channel closed, I/O error, missed heartbeats, not yet reconnected, broker blocking publishers | `Unavailable` |
//! | no confirm within [`RabbitConfig::confirm_timeout_secs`]          | `TimedOut`    |
//!
//! Startup problems are [`RabbitConnectError`]s: [`RabbitTransport::connect`] tries once, within
//! [`RabbitConfig::connect_timeout_secs`], and reports an unreachable broker instead of retrying.
//!
//! # Crate layout
//!
//! The same file roles as every transport crate: `config.rs` (both sides' settings and their
//! validation, refused as [`outbox_core::ConfigError`]), `connection.rs` (reaching the broker:
//! the URL, TLS, the link and its lazy reconnect, [`RabbitConnectError`]), `binding.rs` (the
//! wire binding both ways and its header rules), `transport.rs` (the relay's
//! [`outbox_core::Transport`], with its publisher-confirm collector), [`source`] (the
//! consumer's delivery source, with its delivery counts) and `broker.rs` (the registry entry).
//!
//! [`PublishErrorKind::Rejected`]: outbox_core::PublishErrorKind::Rejected
//! [`PublishErrorKind::Unavailable`]: outbox_core::PublishErrorKind::Unavailable
#![forbid(unsafe_code)]

mod binding;
mod broker;
mod config;
mod connection;
pub mod source;
mod transport;

pub use binding::{
    CLOUDEVENTS_HEADER_PREFIX, DELIVERY_MODE_PERSISTENT, RESERVED_HEADERS,
    sanitize_routing_key_part,
};
pub use broker::{BROKER, URL_RULES};
pub use config::{
    MAX_IN_FLIGHT, RABBITMQ_MAX_MESSAGE_BYTES, RabbitConfig, RabbitConsumerConfig,
    TEMPLATE_PLACEHOLDERS,
};
pub use connection::{RabbitConnectError, RabbitTls};
pub use source::{RabbitConsumerError, RabbitDelivery, RabbitSource};
pub use transport::RabbitTransport;

/// Former name of the configuration error, now [`outbox_core::ConfigError`] (same fields).
#[deprecated(note = "use outbox_core::ConfigError")]
pub type RabbitConfigError = outbox_core::ConfigError;

/// The delivery source under its former module name: see [`source`].
#[deprecated(note = "the module is now `outbox_rabbitmq::source`; its items are at the crate root")]
pub mod consumer {
    pub use crate::config::RabbitConsumerConfig;
    pub use crate::source::{
        DELIVERY_COUNT_CAPACITY, DELIVERY_COUNT_HEADER, MAX_HEADER_DEPTH, MAX_REQUEUE_DELAY_CAP_MS,
        PROTOCOL_ERROR_KEY, REFUSED_ATTRIBUTES_KEY, RabbitConsumerError, RabbitDelivery,
        RabbitSource,
    };
}
