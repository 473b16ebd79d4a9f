//! The wire format: CloudEvents 1.0 in binary content mode.
//!
//! The payload bytes are the message body, unchanged. The event's attributes travel as protocol
//! headers; this module lists them once, and each transport maps them to its protocol binding:
//!
//! * NATS (JetStream): header `ce-<name>` for every attribute, values percent-encoded as the
//!   binding prescribes; `datacontenttype` both as `ce-datacontenttype` and as `Content-Type`
//!   (readers of either convention find it); `Nats-Msg-Id` = event id.
//! * RabbitMQ (AMQP 0-9-1, following the AMQP binding): header `cloudEvents_<name>` for every
//!   attribute, `datacontenttype` as the AMQP `content_type` property, `message_id` = event id,
//!   `type` = event type, `timestamp` = created_at, delivery mode 2 (persistent).
//!
//! | attribute          | value                                          |
//! |--------------------|------------------------------------------------|
//! | `specversion`      | `1.0`                                          |
//! | `id`               | event_id (UUID, hyphenated)                    |
//! | `source`           | configured per relay, default `/outbox`        |
//! | `type`             | event_type                                     |
//! | `subject`          | aggregate_id                                   |
//! | `time`             | created_at, RFC 3339 with microseconds, UTC    |
//! | `datacontenttype`  | payload content type                           |
//! | `aggregatetype`    | aggregate_type (extension)                     |
//! | `aggregateid`      | aggregate_id (extension)                       |
//! | `aggregateversion` | aggregate_version, decimal (extension)         |
//! | `schemaversion`    | schema_version, decimal (extension)            |
//! | `partitionkey`     | partition key (CloudEvents Partitioning ext.)  |
//! | `payloadsha256`    | payload fingerprint, lower-case hex (extension)|
//!
//! User headers (for example W3C `traceparent`) are carried as plain protocol headers with
//! their own names.

use chrono::SecondsFormat;

use crate::message::OutboxMessage;

/// CloudEvents spec version published.
pub const SPEC_VERSION: &str = "1.0";

/// Default CloudEvents `source`.
pub const DEFAULT_SOURCE: &str = "/outbox";

/// Attribute names (without protocol prefix).
pub mod attr {
    /// `specversion`
    pub const SPECVERSION: &str = "specversion";
    /// `id`
    pub const ID: &str = "id";
    /// `source`
    pub const SOURCE: &str = "source";
    /// `type`
    pub const TYPE: &str = "type";
    /// `subject`
    pub const SUBJECT: &str = "subject";
    /// `time`
    pub const TIME: &str = "time";
    /// `aggregatetype`
    pub const AGGREGATE_TYPE: &str = "aggregatetype";
    /// `aggregateid`
    pub const AGGREGATE_ID: &str = "aggregateid";
    /// `aggregateversion`
    pub const AGGREGATE_VERSION: &str = "aggregateversion";
    /// `schemaversion`
    pub const SCHEMA_VERSION: &str = "schemaversion";
    /// `partitionkey`
    pub const PARTITION_KEY: &str = "partitionkey";
    /// `payloadsha256`
    pub const PAYLOAD_SHA256: &str = "payloadsha256";
}

/// The CloudEvents attributes of `msg` except `datacontenttype` (which each binding carries as
/// its native content type), in a fixed order.
pub fn attributes(msg: &OutboxMessage, source: &str) -> Vec<(&'static str, String)> {
    vec![
        (attr::SPECVERSION, SPEC_VERSION.to_owned()),
        (attr::ID, msg.event_id.hyphenated().to_string()),
        (attr::SOURCE, source.to_owned()),
        (attr::TYPE, msg.event_type.clone()),
        (attr::SUBJECT, msg.aggregate_id.clone()),
        (
            attr::TIME,
            msg.created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
        ),
        (attr::AGGREGATE_TYPE, msg.aggregate_type.clone()),
        (attr::AGGREGATE_ID, msg.aggregate_id.clone()),
        (attr::AGGREGATE_VERSION, msg.aggregate_version.to_string()),
        (attr::SCHEMA_VERSION, msg.schema_version.to_string()),
        (attr::PARTITION_KEY, msg.partition_key().to_owned()),
        (attr::PAYLOAD_SHA256, msg.fingerprint.to_hex()),
    ]
}

/// Expands a destination template: `{aggregate_type}`, `{aggregate_id}`, `{event_type}` are
/// replaced by the message's values passed through `sanitize` (each transport knows which
/// characters its subjects / routing keys allow). A message's own destination override wins.
pub fn destination(
    msg: &OutboxMessage,
    template: &str,
    sanitize: impl Fn(&str) -> String,
) -> String {
    if let Some(d) = &msg.destination {
        return d.clone();
    }
    template
        .replace("{aggregate_type}", &sanitize(&msg.aggregate_type))
        .replace("{aggregate_id}", &sanitize(&msg.aggregate_id))
        .replace("{event_type}", &sanitize(&msg.event_type))
}
