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
//! [`outbox_core::consumer::DeliverySource`]), is described in [`consumer`].
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
#![forbid(unsafe_code)]

mod broker;
mod client;
mod config;
pub mod consumer;
mod header_block;
mod security;
mod subject;
mod transport;

pub use broker::{BROKER, CREDENTIALS_FILE, NKEY_SEED_FILE};
pub use config::{NatsConfig, NatsConfigError};
pub use consumer::{
    MAX_PREFETCH, NatsConsumerConfig, NatsConsumerConfigError, NatsConsumerError, NatsDelivery,
    NatsSource, decode_raw,
};
pub use header_block::{RAW_HEADER_BLOCK, raw_header_block};
pub use security::{NatsSecurity, NatsSecurityError};
pub use transport::{
    CE_PREFIX, CONTENT_TYPE_HEADER, MSG_ID_HEADER, NatsConnectError, NatsTransport,
    RESERVED_HEADERS,
};

/// The async-nats client library this transport is built on, re-exported so callers can build
/// [`ConnectOptions`](async_nats::ConnectOptions) of the matching version.
pub use async_nats;
