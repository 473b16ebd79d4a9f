//! The wire format: CloudEvents 1.0 in binary content mode.
//!
//! The payload bytes are the message body, unchanged. The event's attributes travel as protocol
//! headers; this module lists them once, and each transport maps them to its protocol's
//! CloudEvents binding: every attribute as a header named with the binding's prefix (the HTTP
//! binding's `ce-<name>`, for example), `datacontenttype` as the protocol's own content type
//! where it has one, the event id as the broker's message id or dedup key where it has one.
//! Each transport crate documents its binding ("Wire format") and declares the header names it
//! sets itself ([`crate::broker::BrokerEntry::reserved_headers`]), which user headers may not
//! take.
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
//!
//! # Bounded decoding
//!
//! [`decode`] trusts nothing it receives. Every attribute is text without control characters
//! (NUL above all: a database may refuse it in text) and at most [`MAX_ATTRIBUTE_CHARS`]
//! characters long: the producer's own limit, and what the inbox can index (see there). An
//! attribute repeated, not UTF-8, too long, empty where it is required or unparsable is a
//! [`DecodeError`]: the consumer dead-letters the message instead of failing on it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::SecondsFormat;

use crate::message::OutboxMessage;

/// CloudEvents spec version published.
pub const SPEC_VERSION: &str = "1.0";

/// Default CloudEvents `source`.
pub const DEFAULT_SOURCE: &str = "/outbox";

/// Longest attribute value [`decode`] accepts, in characters: the producer's limit on aggregate
/// type and id, event type, partition key and content type (`NewMessage::validate`), so every
/// event a producer could write decodes.
///
/// It is also what an inbox store must be able to index: the ordering guard's key is
/// (consumer, aggregate type, aggregate id), so a store whose index keys are bounded in bytes
/// needs room for two attributes of 255 four-byte characters (2,040 bytes) beside the consumer
/// name; each store crate states its bound. A key the store still refuses (an even longer
/// consumer name) is dead-lettered by the consumer engine, never retried for ever.
pub const MAX_ATTRIBUTE_CHARS: usize = 255;

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
    /// `datacontenttype` (carried as the protocol's content type; read as an attribute only
    /// when that is absent)
    pub const DATA_CONTENT_TYPE: &str = "datacontenttype";

    /// Every attribute a consumer reads, by its bare name: a transport looks each up in its
    /// protocol headers (and refuses one it finds twice or not as text).
    pub const ALL: [&str; 13] = [
        SPECVERSION,
        ID,
        SOURCE,
        TYPE,
        SUBJECT,
        TIME,
        AGGREGATE_TYPE,
        AGGREGATE_ID,
        AGGREGATE_VERSION,
        SCHEMA_VERSION,
        PARTITION_KEY,
        PAYLOAD_SHA256,
        DATA_CONTENT_TYPE,
    ];
}

/// The header name a binding gives the CloudEvents attribute `name`: its `prefix` (a string
/// literal) and the name, as a `&'static str`, for every name of [`attr::ALL`]; `None` for
/// any other. Each transport names its attribute headers with it, so that a publish formats
/// no names and the attribute list stands here once.
///
/// ```
/// use outbox_core::wire::attr;
/// assert_eq!(outbox_core::attribute_header!("ce_", attr::ID), Some("ce_id"));
/// assert_eq!(outbox_core::attribute_header!("ce_", "other"), None);
/// ```
#[macro_export]
macro_rules! attribute_header {
    ($prefix:literal, $name:expr) => {{
        use $crate::wire::attr;
        match $name {
            attr::SPECVERSION => Some(concat!($prefix, "specversion")),
            attr::ID => Some(concat!($prefix, "id")),
            attr::SOURCE => Some(concat!($prefix, "source")),
            attr::TYPE => Some(concat!($prefix, "type")),
            attr::SUBJECT => Some(concat!($prefix, "subject")),
            attr::TIME => Some(concat!($prefix, "time")),
            attr::AGGREGATE_TYPE => Some(concat!($prefix, "aggregatetype")),
            attr::AGGREGATE_ID => Some(concat!($prefix, "aggregateid")),
            attr::AGGREGATE_VERSION => Some(concat!($prefix, "aggregateversion")),
            attr::SCHEMA_VERSION => Some(concat!($prefix, "schemaversion")),
            attr::PARTITION_KEY => Some(concat!($prefix, "partitionkey")),
            attr::PAYLOAD_SHA256 => Some(concat!($prefix, "payloadsha256")),
            attr::DATA_CONTENT_TYPE => Some(concat!($prefix, "datacontenttype")),
            _ => None,
        }
    }};
}

/// The CloudEvents attributes of `msg` except `datacontenttype` (which each binding carries as
/// its native content type), in a fixed order. [`attribute_values`] gives the same pairs
/// without copying what the message holds.
pub fn attributes(msg: &OutboxMessage, source: &str) -> Vec<(&'static str, String)> {
    attribute_values(msg, source)
        .into_iter()
        .map(|(name, value)| (name, value.into_owned()))
        .collect()
}

/// [`attributes`] for the publish path: the same pairs in the same order, each value borrowed
/// from `msg` or `source` where they hold it (`id`, `time`, the two versions and
/// `payloadsha256` are formatted). A transport copies each value once, into its own header.
pub fn attribute_values<'a>(
    msg: &'a OutboxMessage,
    source: &'a str,
) -> Vec<(&'static str, Cow<'a, str>)> {
    vec![
        (attr::SPECVERSION, Cow::Borrowed(SPEC_VERSION)),
        (attr::ID, Cow::Owned(msg.event_id.hyphenated().to_string())),
        (attr::SOURCE, Cow::Borrowed(source)),
        (attr::TYPE, Cow::Borrowed(&msg.event_type)),
        (attr::SUBJECT, Cow::Borrowed(&msg.aggregate_id)),
        (
            attr::TIME,
            Cow::Owned(msg.created_at.to_rfc3339_opts(SecondsFormat::Micros, true)),
        ),
        (attr::AGGREGATE_TYPE, Cow::Borrowed(&msg.aggregate_type)),
        (attr::AGGREGATE_ID, Cow::Borrowed(&msg.aggregate_id)),
        (
            attr::AGGREGATE_VERSION,
            Cow::Owned(msg.aggregate_version.to_string()),
        ),
        (
            attr::SCHEMA_VERSION,
            Cow::Owned(msg.schema_version.to_string()),
        ),
        (attr::PARTITION_KEY, Cow::Borrowed(msg.partition_key())),
        (attr::PAYLOAD_SHA256, Cow::Owned(msg.fingerprint.to_hex())),
    ]
}

/// Expands a destination template: `{aggregate_type}`, `{aggregate_id}`, `{event_type}` are
/// replaced by the message's values passed through `sanitize` (each transport knows which
/// characters its subjects / routing keys allow). A message's own destination override wins.
///
/// One pass over the template: a value is never searched for placeholders again (an aggregate
/// id that reads `{event_type}` stays that text), `sanitize` runs only for the placeholders
/// the template holds, and any other `{` is kept as it is.
pub fn destination(
    msg: &OutboxMessage,
    template: &str,
    sanitize: impl Fn(&str) -> String,
) -> String {
    if let Some(d) = &msg.destination {
        return d.clone();
    }
    let placeholders: [(&str, &str); 3] = [
        ("{aggregate_type}", &msg.aggregate_type),
        ("{aggregate_id}", &msg.aggregate_id),
        ("{event_type}", &msg.event_type),
    ];
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        match placeholders.iter().find(|(p, _)| rest.starts_with(p)) {
            Some((placeholder, value)) => {
                out.push_str(&sanitize(value));
                rest = &rest[placeholder.len()..];
            }
            None => {
                out.push('{');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// An event as a consumer received it, decoded from the wire format above.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingEvent {
    /// `id`.
    pub event_id: crate::EventId,
    /// `type`.
    pub event_type: String,
    /// `source`.
    pub source: String,
    /// `aggregatetype`.
    pub aggregate_type: String,
    /// `aggregateid`.
    pub aggregate_id: String,
    /// `aggregateversion`.
    pub aggregate_version: i64,
    /// `schemaversion`.
    pub schema_version: i32,
    /// `partitionkey` (the aggregate id when absent).
    pub partition_key: String,
    /// `time`, when present and valid.
    pub time: Option<chrono::DateTime<chrono::Utc>>,
    /// The payload with its media type.
    pub payload: crate::Payload,
    /// SHA-256 of the payload bytes *as received* (checked against `payloadsha256`).
    pub fingerprint: crate::Fingerprint,
    /// The non-CloudEvents headers (e.g. `traceparent`).
    pub headers: std::collections::BTreeMap<String, String>,
}

/// Why a received message is not a valid event of this wire format. A consumer dead-letters
/// such a message with this reason; it never crashes on it and never drops it silently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// A required attribute is missing.
    #[error("missing CloudEvents attribute `{0}`")]
    Missing(&'static str),
    /// An attribute has a value that does not parse, holds control characters, is not UTF-8
    /// text, or was sent more than once.
    #[error("CloudEvents attribute `{name}` has an invalid value `{value}`")]
    Invalid {
        /// Attribute.
        name: &'static str,
        /// The value as received, cut to 64 characters with control characters shown as `?`
        /// (see [`excerpt`]), or what is wrong with it.
        value: String,
    },
    /// An attribute is longer than [`MAX_ATTRIBUTE_CHARS`].
    #[error("CloudEvents attribute `{name}` is {len} characters long, over the limit of {max}")]
    TooLong {
        /// Attribute.
        name: &'static str,
        /// Its length in characters.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// `specversion` is not `1.0`.
    #[error("unsupported CloudEvents specversion `{0}`")]
    SpecVersion(String),
    /// The body's SHA-256 differs from the `payloadsha256` attribute: the payload was altered
    /// on the way.
    #[error("payload fingerprint mismatch: header says {expected}, body hashes to {actual}")]
    FingerprintMismatch {
        /// From the header.
        expected: String,
        /// Computed from the body.
        actual: String,
    },
    /// The message is larger than the consumer accepts.
    #[error("message of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Body size.
        size: usize,
        /// Limit.
        max: usize,
    },
    /// The message breaks its protocol's own rules, which the transport found before any
    /// attribute was decoded: headers that cannot be read as headers at all (a header line
    /// without `:`, a name that is not printable ASCII; nothing in them can be trusted), a
    /// header name or a protocol property that is not UTF-8 text, a header nested deeper than
    /// the transport reads, an attribute carried as a protocol type that is not text. The reason names the place; it is printable and bounded (values in it
    /// are [`excerpt`]s).
    #[error("{0}")]
    Protocol(String),
}

/// The header `name` of `headers`, in any case; several matches joined with `, ` (a header a
/// protocol allows more than once).
pub fn header_ci(headers: &BTreeMap<String, String>, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

/// How a decoder names a value that is not UTF-8 text: `not UTF-8 text: `{excerpt}``.
pub fn not_text(value: &[u8]) -> String {
    format!(
        "not UTF-8 text: `{}`",
        excerpt(&String::from_utf8_lossy(value))
    )
}

/// A received value as it may appear in an error: at most 64 characters, each control
/// character (NUL, CR, LF, ESC ...) shown as `?`. Transports use it for the `value` of
/// [`DecodeError::Invalid`], so a reason can always be stored and printed.
pub fn excerpt(value: &str) -> String {
    value
        .chars()
        .take(64)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Decodes an event. `attribute(name)` returns a CloudEvents attribute's value (already
/// unescaped by the protocol binding) by its bare name (`id`, `aggregateversion` ...);
/// `content_type` is the protocol's content type, if any; `headers` are the other headers.
///
/// # Errors
/// A [`DecodeError`] naming the first problem found.
pub fn decode(
    attribute: impl Fn(&'static str) -> Option<String>,
    content_type: Option<String>,
    body: bytes::Bytes,
    headers: std::collections::BTreeMap<String, String>,
    max_bytes: usize,
) -> Result<IncomingEvent, DecodeError> {
    if body.len() > max_bytes {
        return Err(DecodeError::TooLarge {
            size: body.len(),
            max: max_bytes,
        });
    }
    // Control characters (NUL above all) and values longer than an index key would make the
    // database refuse the inbox row; refuse them here, where the message is dead-lettered.
    let attribute = |name: &'static str| -> Result<Option<String>, DecodeError> {
        match attribute(name) {
            Some(v) => check_attribute(name, &v).map(|()| Some(v)),
            None => Ok(None),
        }
    };
    // An optional attribute sent empty counts as absent.
    let optional = |name: &'static str| -> Result<Option<String>, DecodeError> {
        Ok(attribute(name)?.filter(|v| !v.is_empty()))
    };
    let required = |name: &'static str| -> Result<String, DecodeError> {
        attribute(name)?
            .filter(|v| !v.is_empty())
            .ok_or(DecodeError::Missing(name))
    };
    let spec = required(attr::SPECVERSION)?;
    if spec != SPEC_VERSION {
        return Err(DecodeError::SpecVersion(excerpt(&spec)));
    }
    let id = required(attr::ID)?;
    let event_id = uuid::Uuid::parse_str(&id).map_err(|_| DecodeError::Invalid {
        name: attr::ID,
        value: excerpt(&id),
    })?;
    let int = |name: &'static str| -> Result<i64, DecodeError> {
        let v = required(name)?;
        v.parse::<i64>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or(DecodeError::Invalid {
                name,
                value: excerpt(&v),
            })
    };
    let aggregate_version = int(attr::AGGREGATE_VERSION)?;
    let schema_version =
        i32::try_from(int(attr::SCHEMA_VERSION)?).map_err(|_| DecodeError::Invalid {
            name: attr::SCHEMA_VERSION,
            value: "out of range".into(),
        })?;
    let aggregate_id = required(attr::AGGREGATE_ID)?;
    let fingerprint = crate::Fingerprint::of(&body);
    if let Some(expected) = attribute(attr::PAYLOAD_SHA256)?
        && !expected.eq_ignore_ascii_case(&fingerprint.to_hex())
    {
        return Err(DecodeError::FingerprintMismatch {
            expected: excerpt(&expected),
            actual: fingerprint.to_hex(),
        });
    }
    // Not used (it repeats the aggregate id), but bounded like every attribute.
    optional(attr::SUBJECT)?;
    let time = match attribute(attr::TIME)? {
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(&t)
                .map_err(|_| DecodeError::Invalid {
                    name: attr::TIME,
                    value: excerpt(&t),
                })?
                .with_timezone(&chrono::Utc),
        ),
        None => None,
    };
    let content_type = match content_type.filter(|c| !c.is_empty()) {
        Some(c) => {
            check_attribute(attr::DATA_CONTENT_TYPE, &c)?;
            c
        }
        None => attribute(attr::DATA_CONTENT_TYPE)?
            .unwrap_or_else(|| "application/octet-stream".to_owned()),
    };
    Ok(IncomingEvent {
        event_id,
        event_type: required(attr::TYPE)?,
        source: optional(attr::SOURCE)?.unwrap_or_default(),
        aggregate_type: required(attr::AGGREGATE_TYPE)?,
        partition_key: optional(attr::PARTITION_KEY)?.unwrap_or_else(|| aggregate_id.clone()),
        aggregate_id,
        aggregate_version,
        schema_version,
        time,
        payload: crate::Payload::bytes(content_type, body),
        fingerprint,
        headers,
    })
}

/// What a message says about which event it is, as far as it can be read: the identity a
/// consumer dead letter keeps, so an operator finds a malformed message by the event id or
/// aggregate a producer gives them.
///
/// Each field is read on its own: an attribute that is missing, repeated, not text, holds a
/// control character, is longer than [`MAX_ATTRIBUTE_CHARS`] or does not parse is `None`, and
/// the others are kept. So every value here can be stored in a text column.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventIdentity {
    /// `id`, when it is a UUID.
    pub event_id: Option<crate::EventId>,
    /// `aggregatetype`.
    pub aggregate_type: Option<String>,
    /// `aggregateid`.
    pub aggregate_id: Option<String>,
    /// `aggregateversion`, when it is a positive integer.
    pub aggregate_version: Option<i64>,
    /// `type`.
    pub event_type: Option<String>,
}

impl EventIdentity {
    /// The identity of a decoded event: every field present.
    pub fn of(event: &IncomingEvent) -> Self {
        Self {
            event_id: Some(event.event_id),
            aggregate_type: Some(event.aggregate_type.clone()),
            aggregate_id: Some(event.aggregate_id.clone()),
            aggregate_version: Some(event.aggregate_version),
            event_type: Some(event.event_type.clone()),
        }
    }

    /// True when nothing could be read.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Reads what it can of a message's identity (see [`EventIdentity`]) through the same
/// `attribute` lookup a transport passes to [`decode`]: for a message [`decode`] refused, the
/// attributes that are still readable.
pub fn identify(attribute: impl Fn(&'static str) -> Option<String>) -> EventIdentity {
    let text = |name: &'static str| {
        attribute(name).filter(|v| !v.is_empty() && check_attribute(name, v).is_ok())
    };
    EventIdentity {
        event_id: text(attr::ID).and_then(|v| uuid::Uuid::parse_str(&v).ok()),
        aggregate_type: text(attr::AGGREGATE_TYPE),
        aggregate_id: text(attr::AGGREGATE_ID),
        aggregate_version: text(attr::AGGREGATE_VERSION)
            .and_then(|v| v.parse::<i64>().ok())
            .filter(|n| *n >= 1),
        event_type: text(attr::TYPE),
    }
}

/// Checks a relay's configured CloudEvents `source`: see [`check_configured`].
///
/// # Errors
/// A [`ConfigError`](crate::ConfigError) for key `source` saying which rule is broken.
pub fn check_source(source: &str) -> Result<(), crate::ConfigError> {
    check_configured("source", source)
}

/// Checks a configured value that travels as, or beside, an event attribute and is part of an
/// inbox key (a relay's `source`, a consumer's name): not blank, no control characters, at most
/// [`MAX_ATTRIBUTE_CHARS`] characters. Consumers refuse (dead-letter) an event breaking these
/// rules, and the inbox could not index a longer name, so configuration must never hold one.
///
/// # Errors
/// A [`ConfigError`](crate::ConfigError) for `key` saying which rule is broken.
pub fn check_configured(key: &'static str, value: &str) -> Result<(), crate::ConfigError> {
    let refuse = |reason: String| Err(crate::ConfigError::new(key, reason));
    if value.trim().is_empty() {
        return refuse("must not be empty".into());
    }
    if value.chars().any(char::is_control) {
        return refuse("must not contain control characters".into());
    }
    let len = value.chars().count();
    if len > MAX_ATTRIBUTE_CHARS {
        return refuse(format!(
            "must be at most {MAX_ATTRIBUTE_CHARS} characters (got {len}): consumers refuse longer attributes"
        ));
    }
    Ok(())
}

/// Refuses an attribute value with a control character or longer than
/// [`MAX_ATTRIBUTE_CHARS`].
fn check_attribute(name: &'static str, value: &str) -> Result<(), DecodeError> {
    if value.chars().any(char::is_control) {
        return Err(DecodeError::Invalid {
            name,
            value: excerpt(value),
        });
    }
    let len = value.chars().count();
    if len > MAX_ATTRIBUTE_CHARS {
        return Err(DecodeError::TooLong {
            name,
            len,
            max: MAX_ATTRIBUTE_CHARS,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;
    use crate::{Fingerprint, OutboxMessage, Payload};

    #[test]
    fn the_attribute_header_macro_names_every_attribute() {
        for name in attr::ALL {
            assert_eq!(
                crate::attribute_header!("p-", name),
                Some(format!("p-{name}").as_str())
            );
        }
        assert_eq!(crate::attribute_header!("p-", "nope"), None);
    }

    #[test]
    fn a_destination_template_is_expanded_in_one_pass() {
        let mut m = OutboxMessage {
            aggregate_type: "pay ment".into(),
            aggregate_id: "{event_type}".into(),
            event_type: "Created".into(),
            ..message()
        };
        let underscores = |v: &str| v.replace(' ', "_");
        assert_eq!(
            destination(
                &m,
                "{aggregate_type}.{event_type}.{aggregate_id}",
                underscores
            ),
            "pay_ment.Created.{event_type}",
            "a value is not expanded again"
        );
        assert_eq!(destination(&m, "fixed", underscores), "fixed");
        assert_eq!(
            destination(&m, "{x}.{event_type}{", underscores),
            "{x}.Created{"
        );
        assert_eq!(destination(&m, "", underscores), "");
        let calls = std::cell::Cell::new(0);
        let counted = |v: &str| {
            calls.set(calls.get() + 1);
            v.to_owned()
        };
        assert_eq!(destination(&m, "ev.{event_type}", counted), "ev.Created");
        assert_eq!(
            calls.get(),
            1,
            "sanitize runs for the placeholders present only"
        );
        m.destination = Some("override".into());
        assert_eq!(destination(&m, "{event_type}", underscores), "override");
    }

    fn message() -> OutboxMessage {
        OutboxMessage {
            id: 1,
            event_id: uuid::Uuid::now_v7(),
            aggregate_type: "payment".into(),
            aggregate_id: "p-1".into(),
            aggregate_version: 3,
            event_type: "PaymentCreated".into(),
            schema_version: 2,
            payload: Payload::json(&serde_json::json!({"a": 1})).unwrap(),
            fingerprint: Fingerprint::of(br#"{"a":1}"#),
            headers: BTreeMap::new(),
            destination: None,
            partition_key: None,
            created_at: chrono::Utc::now(),
            attempts: 0,
        }
    }

    #[test]
    fn a_relay_source_is_bounded_like_every_attribute() {
        assert!(check_source(DEFAULT_SOURCE).is_ok());
        assert!(check_source(&"𠀀".repeat(MAX_ATTRIBUTE_CHARS)).is_ok());
        for bad in [
            String::new(),
            " ".into(),
            "/a\0b".into(),
            "/".repeat(MAX_ATTRIBUTE_CHARS + 1),
        ] {
            assert_eq!(check_source(&bad).unwrap_err().key, "source", "{bad:?}");
        }
    }

    #[test]
    fn encode_then_decode_round_trips() {
        let m = message();
        let attrs: HashMap<&str, String> = attributes(&m, DEFAULT_SOURCE).into_iter().collect();
        let e = decode(
            |n| attrs.get(n).cloned(),
            Some("application/json".into()),
            m.payload.bytes.clone(),
            BTreeMap::new(),
            1 << 20,
        )
        .unwrap();
        assert_eq!(e.event_id, m.event_id);
        assert_eq!((e.aggregate_version, e.schema_version), (3, 2));
        assert_eq!(e.fingerprint, m.fingerprint);
        assert_eq!(e.partition_key, "p-1");
        assert_eq!(e.payload, m.payload);
    }

    #[test]
    fn decode_names_the_problem() {
        let m = message();
        let base: HashMap<&str, String> = attributes(&m, DEFAULT_SOURCE).into_iter().collect();
        let run = |f: &dyn Fn(&mut HashMap<&str, String>), body: &[u8]| {
            let mut a = base.clone();
            f(&mut a);
            decode(
                |n| a.get(n).cloned(),
                None,
                bytes::Bytes::copy_from_slice(body),
                BTreeMap::new(),
                64,
            )
            .unwrap_err()
        };
        let ok_body = br#"{"a":1}"#;
        assert_eq!(
            run(
                &|a| {
                    a.remove("id");
                },
                ok_body
            ),
            DecodeError::Missing("id")
        );
        assert!(matches!(
            run(
                &|a| {
                    a.insert("id", "nope".into());
                },
                ok_body
            ),
            DecodeError::Invalid { name: "id", .. }
        ));
        assert!(matches!(
            run(
                &|a| {
                    a.insert("aggregateversion", "0".into());
                },
                ok_body
            ),
            DecodeError::Invalid {
                name: "aggregateversion",
                ..
            }
        ));
        assert!(matches!(
            run(
                &|a| {
                    a.insert("specversion", "0.3".into());
                },
                ok_body
            ),
            DecodeError::SpecVersion(_)
        ));
        assert!(matches!(
            run(&|_| {}, br#"{"a":2}"#),
            DecodeError::FingerprintMismatch { .. }
        ));
        assert!(matches!(
            run(&|_| {}, &[b'x'; 65]),
            DecodeError::TooLarge { size: 65, max: 64 }
        ));
    }

    fn decode_with(
        f: impl Fn(&mut HashMap<&str, String>),
        content_type: Option<&str>,
    ) -> Result<IncomingEvent, DecodeError> {
        let m = message();
        let mut a: HashMap<&str, String> = attributes(&m, DEFAULT_SOURCE).into_iter().collect();
        f(&mut a);
        decode(
            |n| a.get(n).cloned(),
            content_type.map(str::to_owned),
            m.payload.bytes.clone(),
            BTreeMap::new(),
            1 << 20,
        )
    }

    #[test]
    fn every_attribute_is_bounded() {
        let widest = "𠀀".repeat(MAX_ATTRIBUTE_CHARS);
        let e = decode_with(
            |a| {
                a.insert("aggregateid", widest.clone());
                a.insert("aggregatetype", widest.clone());
            },
            None,
        )
        .expect("the longest attributes a producer may write decode");
        assert_eq!(e.aggregate_id.len(), 4 * MAX_ATTRIBUTE_CHARS);
        for name in [
            attr::TYPE,
            attr::SOURCE,
            attr::SUBJECT,
            attr::AGGREGATE_TYPE,
            attr::AGGREGATE_ID,
            attr::PARTITION_KEY,
            attr::DATA_CONTENT_TYPE,
        ] {
            let long = "a".repeat(MAX_ATTRIBUTE_CHARS + 1);
            assert_eq!(
                decode_with(|a| drop(a.insert(name, long.clone())), None).unwrap_err(),
                DecodeError::TooLong {
                    name,
                    len: MAX_ATTRIBUTE_CHARS + 1,
                    max: MAX_ATTRIBUTE_CHARS
                },
                "{name}"
            );
            assert_eq!(
                decode_with(|a| drop(a.insert(name, "a\0b\u{1b}".into())), None).unwrap_err(),
                DecodeError::Invalid {
                    name,
                    value: "a?b?".into()
                },
                "{name}"
            );
        }
        assert_eq!(
            decode_with(|_| {}, Some("application/json\0")).unwrap_err(),
            DecodeError::Invalid {
                name: attr::DATA_CONTENT_TYPE,
                value: "application/json?".into()
            }
        );
        let huge = "x".repeat(10_000);
        assert!(matches!(
            decode_with(|a| drop(a.insert(attr::SUBJECT, huge.clone())), None),
            Err(DecodeError::TooLong { len: 10_000, .. })
        ));
    }

    #[test]
    fn empty_optional_attributes_count_as_absent() {
        let e = decode_with(
            |a| {
                a.insert(attr::PARTITION_KEY, String::new());
                a.insert(attr::SOURCE, String::new());
                a.insert(attr::SUBJECT, String::new());
            },
            Some(""),
        )
        .unwrap();
        assert_eq!(e.partition_key, "p-1", "the aggregate id");
        assert_eq!(e.source, "");
        assert_eq!(e.payload.content_type.0, "application/octet-stream");
        assert_eq!(
            decode_with(|a| drop(a.insert(attr::TYPE, String::new())), None).unwrap_err(),
            DecodeError::Missing(attr::TYPE)
        );
    }

    #[test]
    fn excerpts_are_printable_and_short() {
        assert_eq!(excerpt("a\0\r\nb"), "a???b");
        assert_eq!(excerpt(&"é".repeat(100)).chars().count(), 64);
    }

    #[test]
    fn identify_keeps_each_readable_attribute_of_a_refused_message() {
        let id = uuid::Uuid::now_v7();
        let mut attrs: HashMap<&'static str, String> = HashMap::new();
        attrs.insert(attr::ID, id.to_string());
        attrs.insert(attr::AGGREGATE_TYPE, "payment".into());
        attrs.insert(attr::AGGREGATE_ID, "p\0-1".into());
        attrs.insert(attr::AGGREGATE_VERSION, "0".into());
        attrs.insert(attr::TYPE, "x".repeat(MAX_ATTRIBUTE_CHARS + 1));
        let identity = identify(|n| attrs.get(n).cloned());
        assert_eq!(
            identity,
            EventIdentity {
                event_id: Some(id),
                aggregate_type: Some("payment".into()),
                aggregate_id: None,
                aggregate_version: None,
                event_type: None,
            }
        );
        attrs.insert(attr::ID, "not-a-uuid".into());
        attrs.insert(attr::AGGREGATE_VERSION, "7".into());
        let identity = identify(|n| attrs.get(n).cloned());
        assert_eq!(
            (identity.event_id, identity.aggregate_version),
            (None, Some(7))
        );
        assert!(identify(|_| None).is_empty());
    }
}
