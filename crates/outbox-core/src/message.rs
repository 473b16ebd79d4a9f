//! The message model: what a producer enqueues ([`NewMessage`]) and what the relay reads back
//! ([`OutboxMessage`]).

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The identity of one event. Chosen by the producer (UUIDv7 by default), stored with the row
/// and carried unchanged by every publish and republish.
pub type EventId = Uuid;

/// The W3C trace-context header name carried in [`NewMessage::headers`].
pub const TRACEPARENT_HEADER: &str = "traceparent";

/// Longest accepted header name.
pub const MAX_HEADER_NAME_LEN: usize = 128;

const MAX_NAME_LEN: usize = 255;

/// Why a [`NewMessage`] was refused before it reached the database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// A required text field is empty or too long.
    #[error("field `{field}` must be 1..={max} characters, got {len}")]
    BadLength {
        /// The field's name.
        field: &'static str,
        /// Its length in characters.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A text field holds a control character (NUL, CR, LF, ESC ...): it travels as a
    /// CloudEvents attribute or a subject, where consumers refuse it
    /// ([`crate::wire::decode`]) and a protocol could be split by it.
    #[error("field `{field}` has a control character")]
    ControlCharacter {
        /// The field's name.
        field: &'static str,
    },
    /// `aggregate_version` must be at least 1.
    #[error("aggregate_version must be >= 1, got {0}")]
    BadVersion(i64),
    /// `schema_version` must be at least 1.
    #[error("schema_version must be >= 1, got {0}")]
    BadSchemaVersion(i32),
    /// A header name is not an HTTP-style token, or is one a transport's binding reserves for
    /// the headers it sets itself ([`ReservedHeaders`]).
    #[error(
        "header name `{0}` is invalid: use 1..=128 ASCII letters, digits or -_. and no name a transport reserves for its own headers"
    )]
    BadHeaderName(String),
    /// A header value contains a control character (CR, LF, NUL ...).
    #[error("header `{0}` has a control character in its value")]
    BadHeaderValue(String),
    /// The JSON payload could not be serialised.
    #[error("payload is not serialisable as JSON: {0}")]
    Json(String),
    /// The content type is not a printable-ASCII media type `type/subtype[; parameters]`.
    /// `content_type` is the refused value with control and non-ASCII characters escaped.
    #[error("content type `{content_type}` is invalid: {reason}")]
    BadContentType {
        /// The refused value, escaped and cut to 64 characters.
        content_type: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The content type says JSON (`application/json`, `text/json`, `…+json`) but the payload
    /// does not parse as one JSON document.
    #[error("payload is declared `{content_type}` but is not valid JSON: {error}")]
    PayloadNotJson {
        /// The declared content type.
        content_type: String,
        /// The parser's message (line and column).
        error: String,
    },
    /// The payload is larger than [`MessageLimits::max_payload_bytes`](crate::limits::MessageLimits::max_payload_bytes).
    #[error("payload is {size} bytes, over the limit of {max} bytes (max_payload_bytes)")]
    PayloadTooLarge {
        /// The payload's size in bytes.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// More headers than [`MessageLimits::max_headers`](crate::limits::MessageLimits::max_headers).
    #[error("message has {count} headers, over the limit of {max} (max_headers)")]
    TooManyHeaders {
        /// Headers on the message.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// One header value is longer than
    /// [`MessageLimits::max_header_value_bytes`](crate::limits::MessageLimits::max_header_value_bytes).
    #[error(
        "header `{name}` value is {len} bytes, over the limit of {max} bytes (max_header_value_bytes)"
    )]
    HeaderValueTooLong {
        /// The header's name.
        name: String,
        /// The value's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// All header names and values together are larger than
    /// [`MessageLimits::max_headers_bytes`](crate::limits::MessageLimits::max_headers_bytes).
    #[error("headers are {size} bytes in total, over the limit of {max} bytes (max_headers_bytes)")]
    HeadersTooLarge {
        /// Sum of the names' and values' lengths in bytes.
        size: usize,
        /// The limit.
        max: usize,
    },
}

/// A payload's media type, e.g. `application/json`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContentType(pub String);

impl ContentType {
    /// `application/json`.
    pub fn json() -> Self {
        Self("application/json".to_owned())
    }

    /// True when the media type says the payload is JSON: `application/json`, `text/json` or
    /// a `+json` structured syntax (`application/cloudevents+json`), parameters and case
    /// ignored. [`NewMessage::validate`] then requires one valid JSON document.
    pub fn is_json(&self) -> bool {
        let essence = self
            .0
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
    }
}

impl fmt::Display for ContentType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The exact payload bytes and their media type. The bytes are stored and published unchanged;
/// the [`Fingerprint`] is computed over them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// Media type published as the CloudEvents `datacontenttype`.
    pub content_type: ContentType,
    /// The exact bytes.
    pub bytes: Bytes,
}

impl Payload {
    /// Serialises `value` as JSON (`application/json`).
    ///
    /// # Errors
    /// [`MessageError::Json`] when `serde_json` refuses the value (a map with non-string keys,
    /// a failing `Serialize` impl).
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Self, MessageError> {
        let bytes = serde_json::to_vec(value).map_err(|e| MessageError::Json(e.to_string()))?;
        Ok(Self {
            content_type: ContentType::json(),
            bytes: Bytes::from(bytes),
        })
    }

    /// Raw bytes with an explicit media type (protobuf, avro, text ...).
    pub fn bytes(content_type: impl Into<String>, bytes: impl Into<Bytes>) -> Self {
        Self {
            content_type: ContentType(content_type.into()),
            bytes: bytes.into(),
        }
    }

    /// The SHA-256 fingerprint of the exact bytes.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.bytes)
    }
}

/// SHA-256 of a payload's exact bytes. Stored with the outbox row (a store may compute it
/// itself, so that plain-SQL producers get it too) and compared by the consumer inbox to tell a
/// redelivery from a conflicting reuse of an event id.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// Fingerprint of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// Parses the 32 raw bytes stored in the database.
    ///
    /// Returns `None` when `raw` is not exactly 32 bytes long.
    pub fn from_slice(raw: &[u8]) -> Option<Self> {
        raw.try_into().ok().map(Self)
    }

    /// Lower-case hex, as carried on the wire.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// An event to enqueue in the caller's transaction.
///
/// ```
/// use outbox_core::{NewMessage, Payload};
/// let msg = NewMessage::new(
///     "payment",
///     "pay-42",
///     1,
///     "PaymentCreated",
///     Payload::json(&serde_json::json!({"amount": 100})).unwrap(),
/// )
/// .with_header("tenant", "acme");
/// assert!(msg.validate().is_ok());
/// assert_eq!(msg.event_id.get_version_num(), 7);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    /// Chosen here, once: UUIDv7 unless set with [`NewMessage::with_event_id`].
    pub event_id: EventId,
    /// E.g. `payment`. Events are ordered per `(aggregate_type, aggregate_id)`.
    pub aggregate_type: String,
    /// The aggregate's identity.
    pub aggregate_id: String,
    /// Monotonic per aggregate, starting at 1, committed in version order. See `AggregateRow`
    /// and `next_aggregate_version` in the store crate.
    pub aggregate_version: i64,
    /// E.g. `PaymentCreated`; published as the CloudEvents `type`.
    pub event_type: String,
    /// Version of the payload's schema; consumers refuse versions they do not know.
    pub schema_version: i32,
    /// The payload.
    pub payload: Payload,
    /// Extra headers published with the message, e.g. [`TRACEPARENT_HEADER`].
    pub headers: BTreeMap<String, String>,
    /// Overrides the transport's default subject / routing key for this event.
    pub destination: Option<String>,
    /// Overrides the partition key (defaults to `aggregate_id`).
    pub partition_key: Option<String>,
}

/// The [`Fields`] of a [`NewMessage`] or an [`OutboxMessage`] (the same names on both), with
/// the header names `reserved`.
macro_rules! fields_of {
    ($m:expr, $reserved:expr) => {
        Fields {
            aggregate_type: &$m.aggregate_type,
            aggregate_id: &$m.aggregate_id,
            aggregate_version: $m.aggregate_version,
            event_type: &$m.event_type,
            schema_version: $m.schema_version,
            content_type: &$m.payload.content_type.0,
            destination: $m.destination.as_deref(),
            partition_key: $m.partition_key.as_deref(),
            headers: &$m.headers,
            reserved: $reserved,
        }
    };
}

impl NewMessage {
    /// A message with a fresh UUIDv7 event id, schema version 1 and no headers.
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        aggregate_version: i64,
        event_type: impl Into<String>,
        payload: Payload,
    ) -> Self {
        Self {
            event_id: Uuid::now_v7(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            aggregate_version,
            event_type: event_type.into(),
            schema_version: 1,
            payload,
            headers: BTreeMap::new(),
            destination: None,
            partition_key: None,
        }
    }

    /// Uses a caller-chosen event id (e.g. derived from a command id).
    pub fn with_event_id(mut self, event_id: EventId) -> Self {
        self.event_id = event_id;
        self
    }

    /// Sets the payload schema version.
    pub fn with_schema_version(mut self, v: i32) -> Self {
        self.schema_version = v;
        self
    }

    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Carries a W3C `traceparent` (and optional `tracestate`) so the consumer can continue the
    /// producer's trace.
    pub fn with_trace_context(
        mut self,
        traceparent: impl Into<String>,
        tracestate: Option<String>,
    ) -> Self {
        self.headers
            .insert(TRACEPARENT_HEADER.to_owned(), traceparent.into());
        if let Some(ts) = tracestate {
            self.headers.insert("tracestate".to_owned(), ts);
        }
        self
    }

    /// Carries the span context of `cx` as W3C `traceparent` (and `tracestate` when not empty),
    /// so consumers continue the producer's trace. An invalid (absent) span context leaves the
    /// message unchanged. With `tracing-opentelemetry`, pass `tracing::Span::current().context()`.
    #[cfg(feature = "opentelemetry")]
    pub fn with_otel_context(self, cx: &opentelemetry::Context) -> Self {
        use opentelemetry::trace::TraceContextExt;
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return self;
        }
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        );
        let state = sc.trace_state().header();
        self.with_trace_context(traceparent, (!state.is_empty()).then_some(state))
    }

    /// [`NewMessage::with_otel_context`] with the current OpenTelemetry context.
    #[cfg(feature = "opentelemetry")]
    pub fn with_current_otel_context(self) -> Self {
        self.with_otel_context(&opentelemetry::Context::current())
    }

    /// Overrides the destination (subject / routing key) for this event.
    pub fn with_destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = Some(destination.into());
        self
    }

    /// Overrides the partition key.
    pub fn with_partition_key(mut self, key: impl Into<String>) -> Self {
        self.partition_key = Some(key.into());
        self
    }

    /// Checks field lengths, versions, header names and values, the content type (a printable
    /// media type), and that a payload whose content type says JSON is one valid JSON
    /// document. Size limits are [`MessageLimits::check`](crate::limits::MessageLimits::check)'s.
    ///
    /// No header name is reserved here: the core knows no binding. A producer refuses the names
    /// of the brokers its events may meet with [`NewMessage::validate_reserving`].
    ///
    /// # Errors
    /// The first [`MessageError`] found.
    pub fn validate(&self) -> Result<(), MessageError> {
        self.validate_reserving(&[])
    }

    /// [`NewMessage::validate`], and no header name that one of `reserved` reserves
    /// ([`MessageError::BadHeaderName`]). A producer that does not know which broker will carry
    /// the event passes every broker's reservations: the union over a registry
    /// ([`Registry::reserved_headers`](crate::broker::Registry::reserved_headers)), or its
    /// store's own rule.
    ///
    /// ```
    /// use outbox_core::{MessageError, NewMessage, Payload, ReservedHeaders};
    /// // The reservations of a made-up binding that writes `acme-*` headers and `x-acme`.
    /// const ACME: ReservedHeaders = ReservedHeaders { prefixes: &["acme-"], names: &["x-acme"] };
    /// let msg = NewMessage::new("payment", "p-1", 1, "PaymentCreated", Payload::json(&1).unwrap())
    ///     .with_header("ACME-Id", "spoofed");
    /// assert!(msg.validate().is_ok());
    /// assert!(matches!(msg.validate_reserving(&[ACME]), Err(MessageError::BadHeaderName(_))));
    /// ```
    ///
    /// # Errors
    /// The first [`MessageError`] found.
    pub fn validate_reserving(&self, reserved: &[ReservedHeaders]) -> Result<(), MessageError> {
        check_fields(fields_of!(self, reserved))?;
        if self.payload.content_type.is_json() {
            serde_json::from_slice::<serde::de::IgnoredAny>(&self.payload.bytes).map_err(|e| {
                MessageError::PayloadNotJson {
                    content_type: self.payload.content_type.0.clone(),
                    error: e.to_string(),
                }
            })?;
        }
        Ok(())
    }

    /// The row a store holds for this message once written under storage id `id` at
    /// `created_at`: every field the producer set, unchanged, with the [`Fingerprint`] of the
    /// payload's exact bytes and no failed attempts yet. It validates nothing (see
    /// [`NewMessage::validate`]).
    ///
    /// ```
    /// use outbox_core::{NewMessage, Payload};
    /// let msg = NewMessage::new("payment", "p-1", 1, "PaymentCreated", Payload::json(&1).unwrap())
    ///     .with_header("tenant", "acme");
    /// let now = chrono::Utc::now();
    /// let row = msg.clone().stored(7, now);
    /// assert_eq!((row.id, row.event_id, row.created_at), (7, msg.event_id, now));
    /// assert_eq!(row.fingerprint, msg.payload.fingerprint());
    /// assert_eq!((row.attempts, row.partition_key()), (0, "p-1"));
    /// assert_eq!(row.headers, msg.headers);
    /// ```
    pub fn stored(self, id: i64, created_at: DateTime<Utc>) -> OutboxMessage {
        OutboxMessage {
            id,
            event_id: self.event_id,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            aggregate_version: self.aggregate_version,
            event_type: self.event_type,
            schema_version: self.schema_version,
            fingerprint: self.payload.fingerprint(),
            payload: self.payload,
            headers: self.headers,
            destination: self.destination,
            partition_key: self.partition_key,
            created_at,
            attempts: 0,
        }
    }
}

/// The fields every message must have right to be published, whoever wrote it.
struct Fields<'a> {
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    aggregate_version: i64,
    event_type: &'a str,
    schema_version: i32,
    content_type: &'a str,
    destination: Option<&'a str>,
    partition_key: Option<&'a str>,
    headers: &'a BTreeMap<String, String>,
    reserved: &'a [ReservedHeaders],
}

/// Checks [`Fields`]: lengths, versions, the content type, every header. The payload is not
/// looked at.
fn check_fields(f: Fields<'_>) -> Result<(), MessageError> {
    check_text("aggregate_type", f.aggregate_type)?;
    check_text("aggregate_id", f.aggregate_id)?;
    check_text("event_type", f.event_type)?;
    check_len("content_type", f.content_type)?;
    check_content_type(f.content_type)?;
    if let Some(d) = f.destination {
        check_text("destination", d)?;
    }
    if let Some(k) = f.partition_key {
        check_text("partition_key", k)?;
    }
    if f.aggregate_version < 1 {
        return Err(MessageError::BadVersion(f.aggregate_version));
    }
    if f.schema_version < 1 {
        return Err(MessageError::BadSchemaVersion(f.schema_version));
    }
    for (name, value) in f.headers {
        validate_header(name, value)?;
        if f.reserved.iter().any(|r| r.reserves(name)) {
            return Err(MessageError::BadHeaderName(name.clone()));
        }
    }
    Ok(())
}

/// An RFC 9110 `token` character.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Checks a media type: printable ASCII only (no CR, LF, NUL or other control character that
/// could split a protocol header), and `type/subtype` made of tokens before any `;` parameters.
fn check_content_type(value: &str) -> Result<(), MessageError> {
    let bad = |reason| MessageError::BadContentType {
        content_type: value.escape_default().take(64).collect(),
        reason,
    };
    if !value.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return Err(bad(
            "only printable ASCII is allowed (no control or non-ASCII characters)",
        ));
    }
    let essence = value.split(';').next().unwrap_or("").trim();
    let ok = essence.split_once('/').is_some_and(|(t, s)| {
        !t.is_empty() && !s.is_empty() && t.bytes().all(is_tchar) && s.bytes().all(is_tchar)
    });
    if !ok {
        return Err(bad(
            "must be a media type `type/subtype`, e.g. `application/json`",
        ));
    }
    Ok(())
}

/// [`check_len`], and no control character: the text travels as an attribute or a subject.
fn check_text(field: &'static str, value: &str) -> Result<(), MessageError> {
    check_len(field, value)?;
    if value.chars().any(char::is_control) {
        return Err(MessageError::ControlCharacter { field });
    }
    Ok(())
}

fn check_len(field: &'static str, value: &str) -> Result<(), MessageError> {
    let len = value.chars().count();
    if len == 0 || len > MAX_NAME_LEN {
        return Err(MessageError::BadLength {
            field,
            len,
            max: MAX_NAME_LEN,
        });
    }
    Ok(())
}

/// Header names a transport's wire binding writes itself, so that a producer's own header may
/// not take one: prefixes and whole names, compared ignoring ASCII case.
///
/// The core reserves none. Each transport crate declares its binding's in its registry entry
/// ([`BrokerEntry::reserved_headers`](crate::broker::BrokerEntry::reserved_headers)) and refuses
/// them when it publishes; a check that does not know which broker will carry a message (a
/// producer's enqueue, a store reading its rows back) refuses those of every broker it may
/// meet ([`NewMessage::validate_reserving`], [`OutboxMessage::check_publishable_reserving`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReservedHeaders {
    /// Reserved prefixes (a binding's attribute prefix, such as CloudEvents' `ce-`).
    pub prefixes: &'static [&'static str],
    /// Reserved whole names.
    pub names: &'static [&'static str],
}

impl ReservedHeaders {
    /// Nothing reserved: a binding that carries its attributes in native protocol properties.
    pub const NONE: Self = Self {
        prefixes: &[],
        names: &[],
    };

    /// Whether `name` starts with one of the prefixes or is one of the names, in any ASCII
    /// case.
    ///
    /// ```
    /// use outbox_core::ReservedHeaders;
    /// let r = ReservedHeaders { prefixes: &["acme-"], names: &["x-acme"] };
    /// assert!(r.reserves("Acme-Id") && r.reserves("X-ACME"));
    /// assert!(!r.reserves("acme") && !r.reserves("x-acme-2") && !r.reserves("traceparent"));
    /// ```
    pub fn reserves(&self, name: &str) -> bool {
        let name = name.as_bytes();
        self.prefixes.iter().any(|p| {
            name.get(..p.len())
                .is_some_and(|head| head.eq_ignore_ascii_case(p.as_bytes()))
        }) || self
            .names
            .iter()
            .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
    }
}

/// Checks one user header's syntax; the transports rely on this to build protocol headers
/// safely. Reserved names are the caller's ([`ReservedHeaders`]).
///
/// # Errors
/// [`MessageError::BadHeaderName`] or [`MessageError::BadHeaderValue`].
pub(crate) fn validate_header(name: &str, value: &str) -> Result<(), MessageError> {
    let ok_name = !name.is_empty()
        && name.len() <= MAX_HEADER_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !ok_name {
        return Err(MessageError::BadHeaderName(name.to_owned()));
    }
    if value.chars().any(|c| c.is_control()) {
        return Err(MessageError::BadHeaderValue(name.to_owned()));
    }
    Ok(())
}

/// A row's headers as stored in a JSON column (an object of strings), for a store's decoder.
///
/// # Errors
/// What is wrong, naming the header, when the value is not an object or a header's value is
/// not a string (`null`, a number, an array, an object): such a row cannot be published as it
/// is ([`crate::UndecodableRow`]).
pub fn headers_from_json(value: serde_json::Value) -> Result<BTreeMap<String, String>, String> {
    let kind = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    };
    let serde_json::Value::Object(map) = value else {
        return Err(format!(
            "column `headers` is {}, not an object of strings",
            kind(&value)
        ));
    };
    map.into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(v) => Ok((name, v)),
            other => Err(format!(
                "header `{}` is {}: every header value must be a string",
                name.escape_default().take(128).collect::<String>(),
                kind(&other)
            )),
        })
        .collect()
}

/// A committed outbox row as the relay claimed it. Every field is exactly what the producer
/// stored; a republish after a crash carries the same values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// Storage id: an internal handle for marking, never an ordering or identity promise.
    pub id: i64,
    /// The producer's event id.
    pub event_id: EventId,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Version within the aggregate.
    pub aggregate_version: i64,
    /// Event type.
    pub event_type: String,
    /// Payload schema version.
    pub schema_version: i32,
    /// The payload.
    pub payload: Payload,
    /// SHA-256 of the payload bytes, as stored.
    pub fingerprint: Fingerprint,
    /// Extra headers.
    pub headers: BTreeMap<String, String>,
    /// Destination override.
    pub destination: Option<String>,
    /// Partition key override.
    pub partition_key: Option<String>,
    /// When the producer's transaction wrote the row (database clock).
    pub created_at: DateTime<Utc>,
    /// Failed publish attempts so far.
    pub attempts: i32,
}

impl OutboxMessage {
    /// The partition / ordering key: the override, or the aggregate id.
    pub fn partition_key(&self) -> &str {
        self.partition_key.as_deref().unwrap_or(&self.aggregate_id)
    }

    /// Checks that the row can be published as it is: the rules of [`NewMessage::validate`]
    /// but the payload's (field lengths, versions, a printable media type, header names and
    /// values). An enqueue never writes a row that breaks them, and a store's own constraints
    /// may refuse one from any other producer; a row that still does (written before those
    /// constraints, or by hand) is dead-lettered by the relay with this reason instead of being
    /// sent to a broker that would misread or refuse it. The payload is not parsed: that would
    /// cost every event a parse, and a consumer dead-letters a payload it cannot read.
    ///
    /// # Errors
    /// The first [`MessageError`] found.
    pub fn check_publishable(&self) -> Result<(), MessageError> {
        self.check_publishable_reserving(&[])
    }

    /// [`OutboxMessage::check_publishable`], and no header name that one of `reserved`
    /// reserves: what a store that reads rows for any broker refuses (the same set its
    /// producers refuse).
    ///
    /// # Errors
    /// The first [`MessageError`] found.
    pub fn check_publishable_reserving(
        &self,
        reserved: &[ReservedHeaders],
    ) -> Result<(), MessageError> {
        check_fields(fields_of!(self, reserved))
    }
}

#[cfg(test)]
mod tests;
