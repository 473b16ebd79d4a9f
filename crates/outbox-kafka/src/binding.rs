//! The Kafka wire binding, both ways: an [`OutboxMessage`] as a record (topic, key, headers,
//! value; the CloudEvents format described in the crate docs, "Wire format", or the Debezium
//! format of [`crate::debezium`]), and a record received back as a [`RawMessage`] and an
//! [`IncomingEvent`] (see [`crate::source`], "Decoding"). The header-name rules of both
//! directions live here: the names a user header may not take ([`RESERVED_HEADERS`]) and the
//! ones a reader does not hand to the application ([`PROTOCOL_HEADERS`]).

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::Bytes;
use outbox_core::consumer::{HEADER_KEY_ESCAPE, RawMessage};
use outbox_core::wire::{self, DecodeError, EventIdentity, IncomingEvent, attr};
use outbox_core::{OutboxMessage, PublishError, PublishErrorKind, ReservedHeaders};
use rdkafka::message::{BorrowedMessage, Message as _};

use crate::config::KafkaConfig;
use crate::debezium::{self, Headers, RecordParts, WireFormat};
use crate::topic;

/// Prefix of the CloudEvents attribute headers (Kafka protocol binding).
pub const CE_PREFIX: &str = "ce_";
/// Header carrying the payload media type (the binding's `datacontenttype`).
pub const CONTENT_TYPE_HEADER: &str = "content-type";

/// The header names the CloudEvents format sets itself, so that a user header may not take one
/// (any case): the binding's prefix [`CE_PREFIX`], the `ce-` of the other bindings (so that no
/// reader of either convention mistakes a user header for an attribute), and
/// [`CONTENT_TYPE_HEADER`]. [`BROKER`](crate::BROKER) gives them to the registry, so producers
/// refuse them at enqueue. (The Debezium format's `id` header depends on the configuration; it is
/// refused at publish only, see [`crate::debezium`].)
pub const RESERVED_HEADERS: ReservedHeaders = ReservedHeaders {
    prefixes: &[CE_PREFIX, "ce-"],
    names: &[CONTENT_TYPE_HEADER],
};

/// The headers a reader takes as the binding's own, not the application's (any case): the
/// CloudEvents attributes (`ce_*`) and [`CONTENT_TYPE_HEADER`]. Every other header reaches the
/// handler as a user header ([`IncomingEvent::headers`]).
pub(crate) const PROTOCOL_HEADERS: ReservedHeaders = ReservedHeaders {
    prefixes: &[CE_PREFIX],
    names: &[CONTENT_TYPE_HEADER],
};

/// Room a record takes beyond its key, value and headers (record and batch framing), so the
/// size check before sending errs on the safe side of librdkafka's own.
const RECORD_OVERHEAD: usize = 128;

/// The topic `message` is published to: its destination override, or the configuration's
/// topic template with legal placeholder values.
///
/// # Errors
/// [`PublishErrorKind::Invalid`] when the result is not a legal topic name.
pub(crate) fn topic_of(
    message: &OutboxMessage,
    config: &KafkaConfig,
) -> Result<String, PublishError> {
    let topic = match config.format {
        WireFormat::Cloudevents => {
            wire::destination(message, config.topic_template(), topic::sanitize_token)
        }
        WireFormat::Debezium => wire::destination(message, config.topic_template(), str::to_owned),
    };
    topic::check_name(&topic).map_err(|why| {
        PublishError::new(
            PublishErrorKind::Invalid,
            format!("event {}: {why}", message.event_id),
        )
    })?;
    Ok(topic)
}

/// A message's record, ready to be handed to librdkafka.
pub(crate) struct Record<'m> {
    pub(crate) topic: String,
    pub(crate) parts: RecordParts<'m>,
}

/// The record of `message`: its topic, key, headers and value in the configured format, its
/// size checked against `max_bytes` (`message.max.bytes`, before any topic is looked up or
/// created).
///
/// # Errors
/// [`PublishErrorKind::Invalid`] for a topic, header or value the format cannot carry,
/// [`PublishErrorKind::TooLarge`] for a record over `max_bytes`.
pub(crate) fn record_of<'m>(
    message: &'m OutboxMessage,
    config: &'m KafkaConfig,
    max_bytes: usize,
) -> Result<Record<'m>, PublishError> {
    let topic = topic_of(message, config)?;
    let parts = match config.format {
        WireFormat::Cloudevents => RecordParts {
            key: message.partition_key(),
            headers: header_parts(message, &config.source)?,
            value: Some(Cow::Borrowed(&message.payload.bytes[..])),
        },
        WireFormat::Debezium => {
            debezium::record(message, config.debezium_payload.unwrap_or_default())?
        }
    };
    let size = parts.key.len()
        + parts.value.as_ref().map_or(0, |v| v.len())
        + parts
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.len())
            .sum::<usize>()
        + RECORD_OVERHEAD;
    if size > max_bytes {
        return Err(PublishError::new(
            PublishErrorKind::TooLarge,
            format!(
                "event {}: the record is {size} bytes (payload {} + key + headers), more \
                 than message.max.bytes of {max_bytes}",
                message.event_id,
                message.payload.bytes.len()
            ),
        ));
    }
    Ok(Record { topic, parts })
}

/// True for a user header name that would collide with a header this transport sets.
fn is_reserved_header(name: &str) -> bool {
    RESERVED_HEADERS.reserves(name)
}

/// The headers `message` is published with (CloudEvents `source` = `source`), in order:
/// `ce_<attribute>` for every CloudEvents attribute (values as UTF-8 text, unescaped),
/// `content-type`, then the user headers unchanged.
///
/// # Errors
/// [`PublishErrorKind::Invalid`] when a user header name collides with a header set here
/// (`ce_*`, `ce-*`, `content-type`, any case).
pub fn wire_headers(
    message: &OutboxMessage,
    source: &str,
) -> Result<Vec<(String, String)>, PublishError> {
    Ok(header_parts(message, source)?
        .into_iter()
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect())
}

/// [`wire_headers`] as the record carries them: constant names, and values borrowed from
/// `message` and `source` where they hold them, so a publish copies each value once (into
/// librdkafka's headers) and formats no name.
///
/// # Errors
/// As [`wire_headers`].
fn header_parts<'m>(
    message: &'m OutboxMessage,
    source: &'m str,
) -> Result<Headers<'m>, PublishError> {
    let mut pairs: Headers<'m> = wire::attribute_values(message, source)
        .into_iter()
        .map(|(name, value)| (attribute_header(name), value))
        .collect();
    pairs.reserve(1 + message.headers.len());
    pairs.push((
        Cow::Borrowed(CONTENT_TYPE_HEADER),
        Cow::Borrowed(message.payload.content_type.0.as_str()),
    ));
    for (name, value) in &message.headers {
        if is_reserved_header(name) {
            return Err(PublishError::new(
                PublishErrorKind::Invalid,
                format!(
                    "event {}: user header `{}` collides with a header of the Kafka binding",
                    message.event_id,
                    name.escape_debug()
                ),
            ));
        }
        pairs.push((Cow::Borrowed(name.as_str()), Cow::Borrowed(value.as_str())));
    }
    Ok(pairs)
}

/// The header of the CloudEvents attribute `name`: [`CE_PREFIX`] and the name, a constant for
/// every attribute [`wire::attribute_values`] gives.
fn attribute_header(name: &'static str) -> Cow<'static, str> {
    match outbox_core::attribute_header!("ce_", name) {
        Some(header) => Cow::Borrowed(header),
        None => Cow::Owned(format!("{CE_PREFIX}{name}")),
    }
}

/// A message as received: value, every header, the content type, and where it was read.
pub(crate) fn raw_of(message: &BorrowedMessage<'_>) -> RawMessage {
    let (headers, binary_headers) = match message.headers() {
        Some(headers) => headers_of(headers.iter_raw().map(|h| (h.key, h.value))),
        None => Default::default(),
    };
    let content_type = wire::header_ci(&headers, CONTENT_TYPE_HEADER);
    let mut metadata = BTreeMap::from([
        ("topic".to_owned(), message.topic().to_owned()),
        ("partition".to_owned(), message.partition().to_string()),
        ("offset".to_owned(), message.offset().to_string()),
    ]);
    if let Some(ms) = message.timestamp().to_millis() {
        metadata.insert("timestamp_ms".to_owned(), ms.to_string());
    }
    if let Some(key) = message.key() {
        metadata.insert("key".to_owned(), String::from_utf8_lossy(key).into_owned());
    }
    RawMessage {
        payload: Bytes::copy_from_slice(message.payload().unwrap_or_default()),
        headers,
        content_type,
        binary_headers,
        metadata,
    }
}

/// A record's headers, names and values as bytes, in their order, sorted into the text headers
/// and the binary ones of a [`RawMessage`]: a header whose name and value are UTF-8 text is
/// text (a null value counts as empty text); any other is kept byte for byte among the binary
/// headers, a name that is not UTF-8 under [`RawMessage::header_key`]. A name sent several
/// times is kept as its values joined by `, `, binary as soon as one of them is.
fn headers_of<'a>(
    headers: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) -> (BTreeMap<String, String>, BTreeMap<String, Bytes>) {
    let mut text: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut binary: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (name, value) in headers {
        let value = value.unwrap_or_default();
        let key = RawMessage::header_key(name);
        let name_is_text = key.as_bytes() == name;
        match std::str::from_utf8(value) {
            Ok(s) if name_is_text && !binary.contains_key(key.as_ref()) => {
                text.entry(key.into_owned()).or_default().push(s.to_owned());
            }
            _ => {
                // Not text (or repeated with a value that is not): byte for byte.
                let earlier = text.remove(key.as_ref());
                let bytes = binary.entry(key.into_owned()).or_default();
                if let Some(earlier) = earlier {
                    *bytes = earlier.join(", ").into_bytes();
                }
                if !bytes.is_empty() {
                    bytes.extend_from_slice(b", ");
                }
                bytes.extend_from_slice(value);
            }
        }
    }
    let text = text
        .into_iter()
        .map(|(name, values)| (name, values.join(", ")))
        .collect();
    let binary = binary
        .into_iter()
        .map(|(name, value)| (name, Bytes::from(value)))
        .collect();
    (text, binary)
}

/// What [`decode_raw`] would read of a message's identity, attribute by attribute
/// ([`wire::identify`]): the event id and aggregate a malformed message's dead letter keeps.
/// An attribute found only among the binary headers is not read.
pub fn identify_raw(raw: &RawMessage) -> EventIdentity {
    wire::identify(|name| raw.header(&format!("{CE_PREFIX}{name}")))
}

/// Decodes a message as received (live, or kept in a dead letter) from the CloudEvents Kafka
/// binding.
///
/// # Errors
/// [`DecodeError`] naming the first problem; an attribute found only among the binary headers
/// is [`DecodeError::Invalid`].
pub fn decode_raw(raw: &RawMessage, max_bytes: usize) -> Result<IncomingEvent, DecodeError> {
    raw.check_size(max_bytes)?;
    if let Some(key) = raw
        .binary_headers
        .keys()
        .find(|k| RawMessage::header_name(k).as_ref() != k.as_bytes())
    {
        let shown = key.strip_prefix(HEADER_KEY_ESCAPE).unwrap_or(key);
        return Err(DecodeError::Protocol(format!(
            "the header name `{}` is not UTF-8 text",
            wire::excerpt(shown)
        )));
    }
    if let Some((_, value)) = raw
        .binary_headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(CONTENT_TYPE_HEADER))
    {
        return Err(DecodeError::Invalid {
            name: attr::DATA_CONTENT_TYPE,
            value: wire::not_text(value),
        });
    }
    if let Some(refused) = raw.binary_attribute(CE_PREFIX) {
        return Err(refused);
    }
    // A user header whose value is not UTF-8 reaches the handler with U+FFFD for the bytes
    // that are not (as on RabbitMQ); its bytes stay in the raw message.
    raw.decode_binary(
        |name| raw.header(&format!("{CE_PREFIX}{name}")),
        CONTENT_TYPE_HEADER,
        &PROTOCOL_HEADERS,
        max_bytes,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_attribute_header_is_the_prefix_and_the_name() {
        for name in attr::ALL {
            assert_eq!(attribute_header(name), format!("{CE_PREFIX}{name}"));
        }
        assert_eq!(
            attribute_header("other"),
            "ce_other",
            "a new attribute is still named"
        );
    }

    /// A record's headers, as (name, value) byte pairs.
    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

    /// The record the transport would send for a fresh event.
    fn record() -> (OutboxMessage, Pairs) {
        let msg = outbox_testkit::message::event("pay-1", 1, &br#"{"amount":1}"#[..]);
        let headers = crate::wire_headers(&msg, outbox_core::wire::DEFAULT_SOURCE)
            .expect("headers")
            .into_iter()
            .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
            .collect();
        (msg, headers)
    }

    fn raw(msg: &OutboxMessage, headers: &Pairs) -> RawMessage {
        let (headers, binary_headers) = headers_of(
            headers
                .iter()
                .map(|(n, v)| (n.as_slice(), Some(v.as_slice()))),
        );
        RawMessage {
            payload: msg.payload.bytes.clone(),
            content_type: wire::header_ci(&headers, CONTENT_TYPE_HEADER),
            headers,
            binary_headers,
            ..RawMessage::default()
        }
    }

    #[test]
    fn a_header_name_that_is_not_utf8_is_kept_exactly_and_makes_the_message_malformed() {
        let (msg, mut headers) = record();
        headers.push((b"\xff\xfe".to_vec(), b"text".to_vec()));
        headers.push((b"x-\xc3".to_vec(), b"\xff".to_vec()));
        let raw = raw(&msg, &headers);
        let names: Vec<Vec<u8>> = raw
            .binary_headers
            .keys()
            .map(|k| RawMessage::header_name(k).into_owned())
            .collect();
        assert_eq!(names, vec![b"\xff\xfe".to_vec(), b"x-\xc3".to_vec()]);
        assert_eq!(
            raw.binary_headers[&*RawMessage::header_key(b"x-\xc3")],
            &b"\xff"[..]
        );
        assert!(
            raw.headers.contains_key("ce_id"),
            "the readable rest: {raw:?}"
        );
        let err = decode_raw(&raw, 1 << 20).expect_err("malformed");
        assert_eq!(
            err,
            DecodeError::Protocol("the header name `%FF%FE` is not UTF-8 text".into())
        );
        assert!(!err.to_string().chars().any(char::is_control), "{err}");
    }

    #[test]
    fn a_value_that_is_not_utf8_is_malformed_on_an_attribute_and_lossy_on_a_user_header() {
        let (msg, headers) = record();
        let mut user = headers.clone();
        user.push((b"x-trace".to_vec(), b"a\xffb".to_vec()));
        let event = decode_raw(&raw(&msg, &user), 1 << 20).expect("a user header's bytes");
        assert_eq!(event.event_id, msg.event_id);
        assert_eq!(event.headers["x-trace"], "a\u{FFFD}b");

        for name in ["ce_type", "content-type"] {
            let mut hostile = headers.clone();
            for (n, v) in &mut hostile {
                if n == name.as_bytes() {
                    v.push(0xff);
                }
            }
            let raw = raw(&msg, &hostile);
            assert!(raw.binary_headers.contains_key(name), "{raw:?}");
            let err = decode_raw(&raw, 1 << 20).expect_err(name);
            assert!(
                matches!(&err, DecodeError::Invalid { value, .. } if value.starts_with("not UTF-8 text: `")),
                "{name}: {err}"
            );
        }
    }

    #[test]
    fn a_repeated_name_is_joined_and_binary_once_any_value_is() {
        let pairs: [(&[u8], Option<&[u8]>); 4] = [
            (b"x", Some(b"1")),
            (b"x", Some(b"\xff")),
            (b"y", None),
            (b"y", Some(b"2")),
        ];
        let (text, binary) = headers_of(pairs.into_iter());
        assert_eq!(text, BTreeMap::from([("y".to_owned(), ", 2".to_owned())]));
        assert_eq!(binary["x"], &b"1, \xff"[..]);
    }

    /// The decoder properties of `outbox_testkit::fuzz` over the Kafka binding.
    #[test]
    fn attributes_of_any_raw_message() {
        outbox_testkit::fuzz::check_decoder(
            CE_PREFIX,
            str::to_owned,
            |raw| decode_raw(raw, 1 << 20),
            identify_raw,
        );
    }

    /// Records as librdkafka hands them out: a valid event's headers with names and values of
    /// any bytes mixed in (null values too). Sorting them never panics and keeps every name
    /// (its bytes come back from its key); decoding returns, a refusal's reason is printable
    /// and bounded, and a name that is not UTF-8 is always refused.
    #[test]
    fn headers_of_any_bytes() {
        use outbox_testkit::fuzz::proptest::prelude::*;
        use outbox_testkit::fuzz::{self, check_decoded, check_identity, check_refused};

        let bytes = |max: usize| prop::collection::vec(any::<u8>(), 0..max);
        let extra = prop::collection::vec((bytes(8), prop::option::of(bytes(8))), 0..4);
        let (msg, wire) = record();
        fuzz::runner()
            .run(&extra, |extra| {
                let mut pairs: Vec<(Vec<u8>, Option<Vec<u8>>)> = wire
                    .iter()
                    .map(|(n, v)| (n.clone(), Some(v.clone())))
                    .collect();
                pairs.extend(extra.iter().cloned());
                let (headers, binary_headers) =
                    headers_of(pairs.iter().map(|(n, v)| (n.as_slice(), v.as_deref())));
                let kept: std::collections::BTreeSet<Vec<u8>> = headers
                    .keys()
                    .chain(binary_headers.keys())
                    .map(|k| RawMessage::header_name(k).into_owned())
                    .collect();
                let given: std::collections::BTreeSet<Vec<u8>> =
                    pairs.iter().map(|(n, _)| n.clone()).collect();
                prop_assert_eq!(kept, given);
                let raw = RawMessage {
                    payload: msg.payload.bytes.clone(),
                    content_type: wire::header_ci(&headers, CONTENT_TYPE_HEADER),
                    headers,
                    binary_headers,
                    ..RawMessage::default()
                };
                let decoded = decode_raw(&raw, 1 << 20);
                match &decoded {
                    Ok(event) => check_decoded(&raw, event, CE_PREFIX)?,
                    Err(e) => check_refused(e)?,
                }
                check_identity(&identify_raw(&raw), decoded.as_ref().ok())?;
                if extra.iter().any(|(n, _)| std::str::from_utf8(n).is_err()) {
                    prop_assert!(decoded.is_err(), "a name that is not UTF-8 was accepted");
                }
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
