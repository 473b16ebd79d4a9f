//! The AMQP 0-9-1 wire binding, both ways: an [`OutboxMessage`] as a routing key, properties
//! and headers (the format described in the crate docs, "Wire format"), and a delivery back as
//! a [`RawMessage`] and an [`IncomingEvent`] (see [`crate::source`], "Decoding" and "Messages
//! that break AMQP's rules"). The header-name rules of both directions live here: the names a
//! user header may not take ([`RESERVED_HEADERS`]) and the ones a reader does not hand to the
//! application ([`PROTOCOL_HEADERS`]).
//!
//! Pure functions, no I/O: everything that can be refused without asking the broker is refused
//! here, before a byte is sent. (lapin writes a short string longer than 255 bytes with a
//! truncated length prefix in release builds, which corrupts the frame and kills the whole
//! connection, so every short string is checked.)

use std::borrow::Cow;

use bytes::Bytes;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use outbox_core::consumer::RawMessage;
use outbox_core::wire::{self, DecodeError, EventIdentity, IncomingEvent};
use outbox_core::{OutboxMessage, PublishError, PublishErrorKind, ReservedHeaders};

use crate::config::{MAX_SHORT_STRING, RabbitConfig};

/// Header name prefix of the CloudEvents AMQP binding.
pub const CLOUDEVENTS_HEADER_PREFIX: &str = "cloudEvents_";

/// The header names this transport sets itself, so that a user header may not take one: every
/// name starting with `cloudEvents`, in any case (the binding's attributes are exactly
/// [`CLOUDEVENTS_HEADER_PREFIX`]`<name>`, and a user header in another case or separator would
/// only confuse a reader). The content type, the event id and the event type travel as AMQP
/// properties, which no header shadows. [`BROKER`](crate::BROKER) gives them to the registry,
/// so producers refuse them at enqueue.
pub const RESERVED_HEADERS: ReservedHeaders = ReservedHeaders {
    prefixes: &["cloudevents"],
    names: &[],
};

/// The headers a reader takes as the binding's own, not the application's: every name
/// starting with [`CLOUDEVENTS_HEADER_PREFIX`], in any case. The binding's attributes are
/// `cloudEvents_*`, exactly; a header with the prefix in another case is not one, yet reserved
/// all the same (producers may not send one), so it is not handed to the application as a user
/// header either.
pub(crate) const PROTOCOL_HEADERS: ReservedHeaders = ReservedHeaders {
    prefixes: &[CLOUDEVENTS_HEADER_PREFIX],
    names: &[],
};

/// AMQP delivery mode "persistent".
pub const DELIVERY_MODE_PERSISTENT: u8 = 2;

/// Frame header (type, channel, size) plus frame-end octet.
const FRAME_OVERHEAD: usize = 7 + 1;
/// Content header payload before the property list: class id, weight, body size, flags.
const CONTENT_HEADER_FIXED: usize = 2 + 2 + 8 + 2;

/// What goes on the wire for one message, apart from the body.
#[derive(Debug, Clone)]
pub(crate) struct Envelope {
    pub(crate) routing_key: ShortString,
    pub(crate) properties: BasicProperties,
    /// Size of the content header frame these properties produce, in bytes. AMQP requires it
    /// to fit in one frame (`frame_max`), or the broker closes the connection.
    pub(crate) header_frame_bytes: usize,
}

/// Makes one template value routing-key safe: whitespace and control characters become `_`.
pub fn sanitize_routing_key_part(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

fn invalid(message: String) -> PublishError {
    PublishError::new(PublishErrorKind::Invalid, message)
}

fn short(field: impl std::fmt::Display, value: &str) -> Result<ShortString, PublishError> {
    ShortString::try_new(value).map_err(|_| {
        invalid(format!(
            "{field} is {} bytes; AMQP allows at most {MAX_SHORT_STRING}",
            value.len()
        ))
    })
}

fn shortstr_bytes(s: &str) -> usize {
    1 + s.len()
}

/// The header of the CloudEvents attribute `name`: [`CLOUDEVENTS_HEADER_PREFIX`] and the name,
/// a constant for every attribute [`wire::attribute_values`] gives.
fn attribute_header(name: &'static str) -> Cow<'static, str> {
    match outbox_core::attribute_header!("cloudEvents_", name) {
        Some(header) => Cow::Borrowed(header),
        None => Cow::Owned(format!("{CLOUDEVENTS_HEADER_PREFIX}{name}")),
    }
}

/// Builds the routing key, properties and headers of `msg`. Never alters `msg`; the same
/// message always gives the same envelope.
pub(crate) fn envelope(
    msg: &OutboxMessage,
    config: &RabbitConfig,
) -> Result<Envelope, PublishError> {
    let routing_key =
        wire::destination(msg, &config.routing_key_template, sanitize_routing_key_part);
    let routing_key = short("routing key", &routing_key)?;

    let mut props_bytes = 0usize;
    let mut table_bytes = 4usize;
    let mut headers = FieldTable::default();

    for (name, value) in wire::attribute_values(msg, &config.source) {
        let key = attribute_header(name);
        table_bytes += shortstr_bytes(&key) + 1 + 4 + value.len();
        headers.insert(
            short("header name", &key)?,
            AMQPValue::LongString(LongString::from(value.as_bytes())),
        );
    }
    for (name, value) in &msg.headers {
        // Producers that reserve the registry's header names cannot create these; other
        // producers (plain SQL, one that reserves nothing) can, and a user header must never
        // shadow a CloudEvents attribute.
        if name.is_empty() || RESERVED_HEADERS.reserves(name) {
            return Err(invalid(format!(
                "header name `{name}` is empty or uses the reserved `cloudEvents` prefix"
            )));
        }
        // The field's name is formatted only if the check fails.
        let key = short(format_args!("header name `{name}`"), name)?;
        table_bytes += shortstr_bytes(name) + 1 + 4 + value.len();
        headers.insert(
            key,
            AMQPValue::LongString(LongString::from(value.as_bytes())),
        );
    }
    props_bytes += table_bytes;

    let content_type = msg.payload.content_type.0.as_str();
    let message_id = msg.event_id.hyphenated().to_string();
    let timestamp = u64::try_from(msg.created_at.timestamp()).map_err(|_| {
        invalid(format!(
            "created_at {} is before the Unix epoch",
            msg.created_at
        ))
    })?;

    let mut properties = BasicProperties::default()
        .with_delivery_mode(DELIVERY_MODE_PERSISTENT)
        .with_message_id(short("message_id", &message_id)?)
        .with_content_type(short("content type", content_type)?)
        .with_type(short("event type", &msg.event_type)?)
        .with_timestamp(timestamp)
        .with_headers(headers);
    props_bytes += 1 // delivery mode
        + shortstr_bytes(&message_id)
        + shortstr_bytes(content_type)
        + shortstr_bytes(&msg.event_type)
        + 8; // timestamp
    if let Some(app_id) = &config.app_id {
        properties = properties.with_app_id(short("app_id", app_id)?);
        props_bytes += shortstr_bytes(app_id);
    }

    Ok(Envelope {
        routing_key,
        properties,
        header_frame_bytes: FRAME_OVERHEAD + CONTENT_HEADER_FIXED + props_bytes,
    })
}

/// The [`RawMessage::metadata`] key under which a delivery that breaks AMQP's rules keeps why
/// (see [Messages that break AMQP's rules](crate::source#messages-that-break-amqps-rules));
/// decoding such a message fails with [`DecodeError::Protocol`] and that reason.
pub const PROTOCOL_ERROR_KEY: &str = "protocol_error";

/// The [`RawMessage::metadata`] key listing (separated by spaces) the CloudEvents attribute
/// headers of a delivery whose AMQP type is not text; they are left out of its identity (see
/// [`DeliverySource::identify`](outbox_core::consumer::DeliverySource::identify)). The first
/// one's reason is under [`PROTOCOL_ERROR_KEY`].
pub const REFUSED_ATTRIBUTES_KEY: &str = "protocol_error_attributes";

/// Deepest nesting of field tables and arrays in a header value this source accepts (a table
/// in a header is level 1).
pub const MAX_HEADER_DEPTH: usize = 16;

/// The CloudEvents attributes that may be carried as an AMQP integer (the CloudEvents
/// `Integer` type); every other attribute must be a string.
const INTEGER_ATTRIBUTES: [&str; 2] = [wire::attr::AGGREGATE_VERSION, wire::attr::SCHEMA_VERSION];

/// Renders an AMQP header value as text for [`RawMessage::headers`].
pub(crate) fn value_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_owned(),
        AMQPValue::ByteArray(b) => String::from_utf8_lossy(b.as_slice()).into_owned(),
        AMQPValue::Boolean(b) => b.to_string(),
        AMQPValue::ShortShortInt(n) => n.to_string(),
        AMQPValue::ShortShortUInt(n) => n.to_string(),
        AMQPValue::ShortInt(n) => n.to_string(),
        AMQPValue::ShortUInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::Float(n) => n.to_string(),
        AMQPValue::Double(n) => n.to_string(),
        AMQPValue::Timestamp(n) => n.to_string(),
        AMQPValue::DecimalValue(d) => decimal_text(d.value, d.scale),
        AMQPValue::Void => String::new(),
        other @ (AMQPValue::FieldArray(_) | AMQPValue::FieldTable(_)) => format!("{other:?}"),
    }
}

fn decimal_text(value: u32, scale: u8) -> String {
    let digits = value.to_string();
    let scale = usize::from(scale);
    if scale == 0 {
        return digits;
    }
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = padded.split_at(padded.len() - scale);
    format!("{int}.{frac}")
}

/// An AMQP header value as [`RawMessage`] keeps it: its text, or the bytes of a long string or
/// byte array that is not valid UTF-8.
pub(crate) fn header_value(value: &AMQPValue) -> Result<String, Bytes> {
    let bytes = match value {
        AMQPValue::LongString(s) => s.as_bytes(),
        AMQPValue::ByteArray(b) => b.as_slice(),
        other => return Ok(value_text(other)),
    };
    String::from_utf8(bytes.to_vec()).map_err(|e| Bytes::from(e.into_bytes()))
}

/// The message as received: body, every header (text, or bytes when not UTF-8), content type,
/// and the message properties as metadata.
pub(crate) fn raw_message(properties: &BasicProperties, body: Bytes) -> RawMessage {
    let mut raw = RawMessage {
        payload: body,
        content_type: properties
            .content_type()
            .as_ref()
            .map(|c| c.as_str().to_owned()),
        ..RawMessage::default()
    };
    if let Some(table) = properties.headers() {
        for (name, value) in table.inner() {
            let name = name.as_str().to_owned();
            match header_value(value) {
                Ok(text) => {
                    raw.headers.insert(name, text);
                }
                Err(bytes) => {
                    raw.binary_headers.insert(name, bytes);
                }
            }
        }
    }
    let text = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_owned());
    let number = |v: Option<u64>| v.map(|n| n.to_string());
    for (key, value) in [
        ("message_id", text(properties.message_id())),
        ("type", text(properties.kind())),
        ("timestamp", number(*properties.timestamp())),
        ("app_id", text(properties.app_id())),
        ("user_id", text(properties.user_id())),
        ("correlation_id", text(properties.correlation_id())),
        ("reply_to", text(properties.reply_to())),
        ("expiration", text(properties.expiration())),
        ("content_encoding", text(properties.content_encoding())),
        ("cluster_id", text(properties.cluster_id())),
        (
            "delivery_mode",
            number(properties.delivery_mode().map(u64::from)),
        ),
        ("priority", number(properties.priority().map(u64::from))),
    ] {
        if let Some(value) = value {
            raw.metadata.insert(key.to_owned(), value);
        }
    }
    if let Some(fault) = properties_fault(properties) {
        raw.metadata.insert(PROTOCOL_ERROR_KEY.to_owned(), fault);
    }
    let refused: Vec<String> = properties
        .headers()
        .as_ref()
        .map(attribute_type_faults)
        .unwrap_or_default()
        .into_iter()
        .map(|(header, _)| header)
        .collect();
    if !refused.is_empty() {
        raw.metadata
            .insert(REFUSED_ATTRIBUTES_KEY.to_owned(), refused.join(" "));
    }
    raw
}

/// A CloudEvents attribute's text header, by its bare name. A header whose AMQP type was
/// refused (see [`REFUSED_ATTRIBUTES_KEY`]) is not read: its text is a rendering (a table's debug
/// notation, a boolean's `true`), not a value the producer gave.
fn attribute(raw: &RawMessage, name: &str) -> Option<String> {
    let header = format!("{CLOUDEVENTS_HEADER_PREFIX}{name}");
    let refused = raw
        .metadata
        .get(REFUSED_ATTRIBUTES_KEY)
        .is_some_and(|list| list.split(' ').any(|h| h == header));
    if refused {
        return None;
    }
    raw.headers.get(&header).cloned()
}

/// What [`decode_raw`] would read of a message's identity, attribute by attribute
/// ([`wire::identify`]): the event id and aggregate a malformed message's dead letter keeps.
/// An attribute found only among the binary headers is not read.
pub(crate) fn identify_raw(raw: &RawMessage) -> EventIdentity {
    wire::identify(|name| attribute(raw, name))
}

/// What is wrong with a short string by AMQP's rules (UTF-8, no NUL), if anything. lapin's
/// codec reads bytes that are not UTF-8 as U+FFFD, so a U+FFFD sent as such is refused too.
fn short_string_fault(s: &str) -> Option<&'static str> {
    if s.contains(char::REPLACEMENT_CHARACTER) {
        Some("is not UTF-8 text")
    } else if s.contains('\0') {
        Some("holds a NUL byte")
    } else {
        None
    }
}

/// The first way the exchange or routing key of a delivery break AMQP's rules.
pub(crate) fn delivery_fault(exchange: &str, routing_key: &str) -> Option<String> {
    [("exchange", exchange), ("routing key", routing_key)]
        .into_iter()
        .find_map(|(what, value)| {
            short_string_fault(value)
                .map(|fault| format!("the {what} `{}` {fault}", wire::excerpt(value)))
        })
}

/// The first way a message's properties and header table break AMQP's rules or carry a
/// CloudEvents attribute as a type that is not text; see [`crate::source`], "Messages that
/// break AMQP's rules".
fn properties_fault(properties: &BasicProperties) -> Option<String> {
    if let Some(content_type) = properties.content_type()
        && content_type.as_str().contains(char::REPLACEMENT_CHARACTER)
    {
        return Some(format!(
            "the content type `{}` is not UTF-8 text",
            wire::excerpt(content_type.as_str())
        ));
    }
    for (name, value) in [
        ("content_encoding", properties.content_encoding()),
        ("correlation_id", properties.correlation_id()),
        ("reply_to", properties.reply_to()),
        ("expiration", properties.expiration()),
        ("message_id", properties.message_id()),
        ("type", properties.kind()),
        ("user_id", properties.user_id()),
        ("app_id", properties.app_id()),
        ("cluster_id", properties.cluster_id()),
    ] {
        if let Some(value) = value
            && let Some(fault) = short_string_fault(value.as_str())
        {
            return Some(format!(
                "the property `{name}` `{}` {fault}",
                wire::excerpt(value.as_str())
            ));
        }
    }
    let table = properties.headers().as_ref()?;
    for (name, value) in table.inner() {
        if let Some(fault) = header_fault(name.as_str(), value) {
            return Some(fault);
        }
    }
    attribute_type_faults(table)
        .into_iter()
        .next()
        .map(|(_, fault)| fault)
}

/// Every CloudEvents attribute header of `table` carried as a type that is not text (an integer
/// is text for `aggregateversion` and `schemaversion`), with the reason.
fn attribute_type_faults(table: &FieldTable) -> Vec<(String, String)> {
    wire::attr::ALL.into_iter().filter_map(|name| {
        let header = format!("{CLOUDEVENTS_HEADER_PREFIX}{name}");
        let value = table.inner().get(header.as_str())?;
        let text = matches!(
            value,
            AMQPValue::LongString(_) | AMQPValue::ShortString(_) | AMQPValue::ByteArray(_)
        );
        let integer = matches!(
            value,
            AMQPValue::ShortShortInt(_)
                | AMQPValue::ShortShortUInt(_)
                | AMQPValue::ShortInt(_)
                | AMQPValue::ShortUInt(_)
                | AMQPValue::LongInt(_)
                | AMQPValue::LongUInt(_)
                | AMQPValue::LongLongInt(_)
        );
        let allowed = text || (integer && INTEGER_ATTRIBUTES.contains(&name));
        (!allowed).then(|| {
            let fault = format!(
                "the CloudEvents attribute `{name}` (header `{header}`) is an AMQP {}, not a string",
                type_name(value)
            );
            (header, fault)
        })
    })
    .collect()
}

/// What is wrong with the header `name` (its name, or the names and nesting inside a table or
/// array value), if anything.
fn header_fault(name: &str, value: &AMQPValue) -> Option<String> {
    fn name_fault(name: &str) -> Option<String> {
        if name.is_empty() {
            return Some("a header has an empty name".to_owned());
        }
        short_string_fault(name)
            .map(|fault| format!("the header name `{}` {fault}", wire::excerpt(name)))
    }
    /// `value` is at nesting level `level` (a header value is level 0).
    fn inside(header: &str, value: &AMQPValue, level: usize) -> Option<String> {
        let deeper = |level: usize| {
            (level > MAX_HEADER_DEPTH).then(|| {
                format!(
                    "the header `{}` nests tables or arrays deeper than {MAX_HEADER_DEPTH} levels",
                    wire::excerpt(header)
                )
            })
        };
        match value {
            AMQPValue::FieldTable(table) => deeper(level + 1).or_else(|| {
                table.inner().iter().find_map(|(name, value)| {
                    name_fault(name.as_str()).or_else(|| inside(header, value, level + 1))
                })
            }),
            AMQPValue::FieldArray(array) => deeper(level + 1).or_else(|| {
                array
                    .as_slice()
                    .iter()
                    .find_map(|value| inside(header, value, level + 1))
            }),
            _ => None,
        }
    }
    name_fault(name).or_else(|| inside(name, value, 0))
}

/// The AMQP name of a field value's type, for reasons.
fn type_name(value: &AMQPValue) -> &'static str {
    match value {
        AMQPValue::Boolean(_) => "boolean",
        AMQPValue::ShortShortInt(_) => "short-short-int",
        AMQPValue::ShortShortUInt(_) => "short-short-uint",
        AMQPValue::ShortInt(_) => "short-int",
        AMQPValue::ShortUInt(_) => "short-uint",
        AMQPValue::LongInt(_) => "long-int",
        AMQPValue::LongUInt(_) => "long-uint",
        AMQPValue::LongLongInt(_) => "long-long-int",
        AMQPValue::Float(_) => "float",
        AMQPValue::Double(_) => "double",
        AMQPValue::DecimalValue(_) => "decimal",
        AMQPValue::ShortString(_) => "short string",
        AMQPValue::LongString(_) => "long string",
        AMQPValue::FieldArray(_) => "field array",
        AMQPValue::Timestamp(_) => "timestamp",
        AMQPValue::FieldTable(_) => "field table",
        AMQPValue::ByteArray(_) => "byte array",
        AMQPValue::Void => "void",
    }
}

/// Decodes the wire format from a raw message; the one decoding path for live and stored
/// messages.
pub(crate) fn decode_raw(raw: &RawMessage, max_bytes: usize) -> Result<IncomingEvent, DecodeError> {
    if let Some(fault) = raw.metadata.get(PROTOCOL_ERROR_KEY) {
        return Err(DecodeError::Protocol(fault.clone()));
    }
    for name in wire::attr::ALL {
        if let Some(bytes) = raw
            .binary_headers
            .get(&format!("{CLOUDEVENTS_HEADER_PREFIX}{name}"))
        {
            return Err(DecodeError::Invalid {
                name,
                value: format!("not UTF-8 text ({} bytes)", bytes.len()),
            });
        }
    }
    let binary_as_text = raw
        .binary_headers
        .iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(v).into_owned()));
    let user_headers = raw
        .headers
        .iter()
        .map(|(k, v)| (k, v.clone()))
        .chain(binary_as_text)
        // Not the binding's (`cloudEvents_*`, any case: PROTOCOL_HEADERS).
        .filter(|(k, _)| !PROTOCOL_HEADERS.reserves(k))
        .map(|(k, v)| (k.clone(), v))
        .collect();
    wire::decode(
        |name| attribute(raw, name),
        raw.content_type.clone(),
        raw.payload.clone(),
        user_headers,
        max_bytes,
    )
}

/// `x-delivery-count` (previous deliveries, quorum queues), when present and numeric.
#[cfg(test)]
mod tests;
