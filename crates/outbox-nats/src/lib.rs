//! NATS JetStream transport for the outbox toolkit.
//!
//! [`NatsTransport`] implements [`outbox_core::Transport`]: each publish goes to a JetStream
//! stream and returns `Ok` only after the server's `PublishAck`, i.e. after the event is stored
//! in the stream (replicated, if the stream is). Sending and acknowledgement are two separate
//! awaits; a message that was sent but not acknowledged is an error, never a success.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_nats::{NatsConfig, NatsTransport};
//! let transport = NatsTransport::connect("nats://127.0.0.1:4222", NatsConfig::default()).await?;
//! // hand `transport` to outbox_core::relay::Relay
//! # Ok(()) }
//! ```
//!
//! The consumer side, [`NatsSource`] (a durable JetStream pull consumer implementing
//! [`outbox_core::consumer::DeliverySource`]), is described in [`source`].
//!
//! # Wire format
//!
//! CloudEvents 1.0 in binary content mode, following the CloudEvents NATS protocol binding:
//!
//! * **subject**: the message's destination override, or [`NatsConfig::subject_template`]
//!   (default `outbox.{aggregate_type}.{event_type}`) with each placeholder's value made a
//!   valid subject token (whitespace, control characters, `.`, `*` and `>` become `_`).
//! * **body**: the payload bytes, unchanged.
//! * **headers**:
//!
//! | header                | value                                                       |
//! |-----------------------|-------------------------------------------------------------|
//! | `ce-specversion`      | `1.0`                                                       |
//! | `ce-id`               | event id, hyphenated UUID                                   |
//! | `ce-source`           | [`NatsConfig::source`], default `/outbox`                   |
//! | `ce-type`             | event type                                                  |
//! | `ce-subject`          | aggregate id                                                |
//! | `ce-time`             | created_at, RFC 3339, microseconds, UTC                     |
//! | `ce-aggregatetype`    | aggregate type                                              |
//! | `ce-aggregateid`      | aggregate id                                                |
//! | `ce-aggregateversion` | aggregate version, decimal                                  |
//! | `ce-schemaversion`    | payload schema version, decimal                             |
//! | `ce-partitionkey`     | partition key (override or aggregate id)                    |
//! | `ce-payloadsha256`    | SHA-256 of the payload, lower-case hex                      |
//! | `ce-datacontenttype`  | payload content type                                        |
//! | `Content-Type`        | payload content type (same value, not percent-encoded)      |
//! | `Nats-Msg-Id`         | event id, hyphenated UUID (JetStream dedup key)             |
//! | user headers          | each of the message's headers, name and value unchanged     |
//!
//! `ce-` values are percent-encoded as the binding prescribes: every UTF-8 byte outside
//! printable ASCII `0x21..=0x7E`, plus space, `"` and `%`, is written as `%XX`. A consumer
//! decodes them; plain values (ids, versions, times, hex) are never changed by the encoding.
//! User header names that collide with the headers above (`ce-*`, `ce_*`, `nats-*`,
//! `content-type`, any case: [`RESERVED_HEADERS`]) are refused as [`PublishErrorKind::Invalid`](outbox_core::PublishErrorKind::Invalid).
//! The registry entry [`BROKER`] declares them, so a producer that reserves the registry's
//! names refuses them already at enqueue time (the PostgreSQL producer refuses them by
//! default).
//!
//! # Deduplication
//!
//! `Nats-Msg-Id` carries the event id, so JetStream drops a republish of the same event that
//! arrives within the stream's duplicate window (`duplicate_window_secs`, default 120 s, for a
//! stream this transport creates): the ack then says `duplicate`, reported as
//! [`PublishReceipt::duplicate`](outbox_core::PublishReceipt::duplicate), and the stream still
//! holds one copy. A republish after the window (a relay that crashed after the broker
//! accepted but before marking the row, and came back late) is stored again: a wire duplicate
//! with the same event id and payload, which the consumer inbox absorbs. Publishing never
//! alters the message, so every republish is byte-identical.
//!
//! # Error mapping
//!
//! | situation                                                         | kind          |
//! |-------------------------------------------------------------------|---------------|
//! | subject invalid (empty, empty token, whitespace, wildcard token)  | `Invalid`     |
//! | user header reserved or not expressible (CR/LF, bad name)         | `Invalid`     |
//! | payload + headers over the server's `max_payload` (checked before sending), client or server "maximum payload" error, stream `max_msg_size` exceeded | `TooLarge` |
//! | no stream captures the subject (no responders), stream not found  | `Rejected`    |
//! | JetStream negative ack (stream limits, wrong sequence ...)        | `Rejected`    |
//! | not sent within `ack_timeout_secs`, or no `PublishAck` within it  | `TimedOut`    |
//! | connection broken / disconnected (broken pipe, closed client)     | `Unavailable` |
//! | anything else                                                     | `Rejected`    |
//!
//! `TooLarge` and `Invalid` are dead-lettered by the relay at once; the other kinds are
//! retried with the same event id. During an outage after a successful start, the client
//! reconnects by itself; publishes meanwhile end in `TimedOut` or `Unavailable`. A publish that
//! timed out may still be delivered once the connection returns: the outcome is unknown, which
//! is exactly why the relay republishes with the same `Nats-Msg-Id`.
//!
//! # Stream setup
//!
//! With [`NatsConfig::ensure_stream`] (default), startup creates the stream if it is missing:
//! [`NatsConfig::stream_subjects`], file storage, the configured duplicate window, one replica
//! and no limits. An existing stream is never modified; a shorter duplicate window or memory
//! storage is logged as a warning. Production deployments usually create the stream
//! themselves (replicas, retention) and may turn `ensure_stream` off.
//!
//! # Crate layout
//!
//! The same file roles as every transport crate: `config.rs` (both sides' settings and their
//! validation, refused as [`outbox_core::ConfigError`]), `connection.rs` (reaching the server:
//! TLS, credentials, the connect attempt), `binding.rs` (the wire binding both ways and its
//! header rules), `transport.rs` (the relay's [`outbox_core::Transport`]), [`source`] (the
//! consumer's delivery source) and `broker.rs` (the registry entry); NATS's own `subject.rs`
//! (subject and name rules, percent-encoding) and `header_block.rs` (header blocks the client
//! could not parse) beside them.
#![forbid(unsafe_code)]

mod binding;
mod broker;
mod config;
mod connection;
mod header_block;
pub mod source;
mod subject;
mod transport;

pub use binding::{
    CE_PREFIX, CONTENT_TYPE_HEADER, MSG_ID_HEADER, RESERVED_HEADERS, decode_raw, identify_raw,
};
pub use broker::{BROKER, CREDENTIALS_FILE, NKEY_SEED_FILE};
pub use config::{MAX_PREFETCH, NatsConfig, NatsConsumerConfig};
pub use connection::NatsSecurity;
pub use header_block::{RAW_HEADER_BLOCK, raw_header_block};
pub use source::{NatsConsumerError, NatsDelivery, NatsSource};
pub use transport::{NatsConnectError, NatsTransport};

/// The async-nats client library this transport is built on, re-exported so callers can build
/// [`ConnectOptions`](async_nats::ConnectOptions) of the matching version.
pub use async_nats;

/// Former name of the transport's configuration error, now [`outbox_core::ConfigError`] (its
/// `message` is `reason`).
#[deprecated(note = "use outbox_core::ConfigError (the field `message` is now `reason`)")]
pub type NatsConfigError = outbox_core::ConfigError;

/// Former name of the consumer's configuration error, now [`outbox_core::ConfigError`] (its
/// `message` is `reason`).
#[deprecated(note = "use outbox_core::ConfigError (the field `message` is now `reason`)")]
pub type NatsConsumerConfigError = outbox_core::ConfigError;

/// Former name of a security setting's error, now [`outbox_core::ConfigError`] (its `message`
/// is `reason`).
#[deprecated(note = "use outbox_core::ConfigError (the field `message` is now `reason`)")]
pub type NatsSecurityError = outbox_core::ConfigError;

/// The delivery source under its former module name: see [`source`].
#[deprecated(note = "the module is now `outbox_nats::source`; its items are at the crate root")]
pub mod consumer {
    #[allow(deprecated)]
    pub use crate::NatsConsumerConfigError;
    pub use crate::binding::{decode_raw, identify_raw};
    pub use crate::config::{MAX_PREFETCH, NatsConsumerConfig};
    pub use crate::source::{NatsConsumerError, NatsDelivery, NatsSource};
}
