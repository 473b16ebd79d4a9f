//! The Debezium-compatible wire format ([`WireFormat::Debezium`]): records shaped as Debezium's
//! Outbox Event Router (`io.debezium.transforms.outbox.EventRouter`) emits them with its
//! defaults, so that consumers built for a Debezium outbox read the relay's records unchanged.
//!
//! | record part | router default                                      | this format                                   |
//! |-------------|-----------------------------------------------------|-----------------------------------------------|
//! | topic       | `outbox.event.<aggregatetype>`, the value's case kept, nothing replaced | [`KafkaConfig::topic_template`](crate::KafkaConfig::topic_template), default `outbox.event.{aggregate_type}`, placeholders inserted as they are; a name Kafka refuses is an `Invalid` publish (dead-lettered with the reason), never rewritten |
//! | key         | `aggregateid` (`table.field.event.key`)             | the partition key (the aggregate id unless the row overrides it), UTF-8, as Kafka Connect's `StringConverter` writes it |
//! | header `id` | the event id column, as text                        | the event id, lower-case hyphenated UUID      |
//! | other headers | only the `header` placements of `table.fields.additional.placement` | the row's user headers (the Debezium bridge of `outbox-postgres` puts the placed columns there); a user header named `id` is refused (`Invalid`) |
//! | value       | the payload column as it is                         | [`DebeziumPayload`]: the payload bytes as they are (default), as a JSON string, or expanded JSON |
//! | empty payload | null value (`route.tombstone.on.empty.payload=false` with a string or binary converter) | null value (`as-is`), the JSON `null` otherwise |
//! | timestamp   | the connector's processing time, or `table.field.event.timestamp` | the row's created_at (the mapped timestamp column, else the producer transaction's time) |
//!
//! No CloudEvents headers and no `content-type` are sent: the router sends none. A consumer of
//! this toolkit reads the CloudEvents format; this format is for consumers built for Debezium.

use std::borrow::Cow;

use outbox_core::OutboxMessage;
use outbox_core::{PublishError, PublishErrorKind};
use serde::Deserialize;

/// The header carrying the event id, as the router names it.
pub const ID_HEADER: &str = "id";

/// Topic template of the Debezium format: the router's `route.topic.replacement` default,
/// `outbox.event.${routedByValue}` with `route.by.field=aggregatetype`.
pub const DEFAULT_TOPIC_TEMPLATE: &str = "outbox.event.{aggregate_type}";

/// How the records are shaped (`[kafka] format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WireFormat {
    /// CloudEvents Kafka protocol binding, binary mode (`ce_*` headers): what this toolkit's
    /// consumers read. The default.
    #[default]
    Cloudevents,
    /// Debezium's Outbox Event Router with its defaults; see [the module](self).
    Debezium,
}

/// The record value in the Debezium format (`[kafka] debezium_payload`): which of the router's
/// outputs to match, as it depends on Kafka Connect's value converter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DebeziumPayload {
    /// The payload bytes as stored: the router with `value.converter=StringConverter` (a text
    /// or JSON column; for `jsonb` the text PostgreSQL gives it, which the Debezium bridge
    /// stores) or `BinaryDataConverter` (a `bytea` column). An empty payload is a null value.
    /// The default.
    #[default]
    AsIs,
    /// The payload as one JSON string: the router with `JsonConverter` and
    /// `schemas.enable=false` (the value of the router's documentation's first example,
    /// `"{\"id\": 1, ...}"`). A payload that is not UTF-8 is an `Invalid` publish.
    JsonString,
    /// A JSON payload expanded into JSON: the router with `table.expand.json.payload=true`,
    /// `JsonConverter` and `schemas.enable=false`, written compactly with the members in
    /// their order. A payload that does not start with `{` or `[` or does not parse is sent
    /// as a JSON string, as the router leaves it. Numbers pass through a 64-bit float or
    /// integer (as the router's Jackson parser reads them, except integers beyond 64 bits,
    /// which the router keeps exact).
    ExpandedJson,
}

/// A record's headers in order, as (name, value) text, borrowed where the message holds them.
pub type Headers<'a> = Vec<(Cow<'a, str>, Cow<'a, str>)>;

/// The parts of a record: key, headers and value (the topic comes from the template).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordParts<'a> {
    /// The record key.
    pub key: &'a str,
    /// Headers in order: `id`, then the user headers.
    pub headers: Headers<'a>,
    /// The value; `None` is a null value.
    pub value: Option<Cow<'a, [u8]>>,
}

fn invalid(message: &OutboxMessage, why: impl std::fmt::Display) -> PublishError {
    PublishError::new(
        PublishErrorKind::Invalid,
        format!("event {}: {why}", message.event_id),
    )
}

/// Shapes `message` as the Outbox Event Router would emit it (all but the topic, which the
/// transport resolves from its template).
///
/// # Errors
/// [`PublishErrorKind::Invalid`] when a user header is named `id` (any case), or when
/// `payload` is [`DebeziumPayload::JsonString`] or [`DebeziumPayload::ExpandedJson`] and
/// the payload is not UTF-8.
pub fn record<'a>(
    message: &'a OutboxMessage,
    payload: DebeziumPayload,
) -> Result<RecordParts<'a>, PublishError> {
    let mut headers = Vec::with_capacity(1 + message.headers.len());
    headers.push((
        Cow::Borrowed(ID_HEADER),
        Cow::Owned(message.event_id.hyphenated().to_string()),
    ));
    for (name, value) in &message.headers {
        if name.eq_ignore_ascii_case(ID_HEADER) {
            return Err(invalid(
                message,
                "user header `id` collides with the Debezium format's event id header",
            ));
        }
        headers.push((Cow::Borrowed(name.as_str()), Cow::Borrowed(value.as_str())));
    }
    let bytes: &[u8] = &message.payload.bytes;
    // The router's test is `payload.toString().trim().isEmpty()`: text of only white space is
    // empty, bytes (a `bytea` column) never are; the bridge stores a NULL payload as no bytes.
    let binary = message
        .payload
        .content_type
        .0
        .starts_with("application/octet-stream");
    let empty = if binary {
        bytes.is_empty()
    } else {
        bytes.iter().all(u8::is_ascii_whitespace)
    };
    let value = match payload {
        DebeziumPayload::AsIs if empty => None,
        DebeziumPayload::AsIs => Some(Cow::Borrowed(bytes)),
        DebeziumPayload::JsonString | DebeziumPayload::ExpandedJson if empty => {
            Some(Cow::Borrowed(&b"null"[..]))
        }
        DebeziumPayload::JsonString | DebeziumPayload::ExpandedJson => {
            let text = std::str::from_utf8(bytes).map_err(|e| {
                invalid(
                    message,
                    format!("the payload is not UTF-8 text ({e}), so it has no JSON string form"),
                )
            })?;
            let expanded = (payload == DebeziumPayload::ExpandedJson)
                .then(|| expand(text))
                .flatten();
            Some(Cow::Owned(match expanded {
                Some(json) => json,
                None => serde_json::to_vec(text).expect("a string serializes"),
            }))
        }
    };
    Ok(RecordParts {
        key: message.partition_key(),
        headers,
        value,
    })
}

/// `text` as compact JSON when it is a JSON object or array (after leading whitespace), as the
/// router's expansion does; `None` when it is not, or does not parse.
fn expand(text: &str) -> Option<Vec<u8>> {
    if !text.trim_start().starts_with(['{', '[']) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len());
    let mut de = serde_json::Deserializer::from_str(text);
    serde_transcode::transcode(&mut de, &mut serde_json::Serializer::new(&mut out)).ok()?;
    de.end().ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::Payload;

    fn message(payload: &[u8]) -> OutboxMessage {
        let mut m = outbox_testkit::fakes::event_message(uuid::Uuid::now_v7(), "o-1", 1, "");
        m.aggregate_type = "Order".into();
        m.payload = Payload::bytes("application/json", payload.to_vec());
        m.headers.insert("eventType".into(), "OrderCreated".into());
        m
    }

    #[test]
    fn defaults_are_the_routers() {
        let m = message(br#"{"id": 1, "customerId": 123}"#);
        let r = record(&m, DebeziumPayload::AsIs).unwrap();
        assert_eq!(r.key, "o-1");
        assert_eq!(r.headers[0].0, "id");
        assert_eq!(r.headers[0].1, m.event_id.hyphenated().to_string());
        assert_eq!(r.headers[1], ("eventType".into(), "OrderCreated".into()));
        assert_eq!(
            r.value.as_deref(),
            Some(&br#"{"id": 1, "customerId": 123}"#[..])
        );
    }

    #[test]
    fn json_string_and_expanded_values() {
        let m = message(br#"{"id": 1, "customerId": 123, "a": [1.5, "x\"y"]}"#);
        let s = record(&m, DebeziumPayload::JsonString).unwrap();
        assert_eq!(
            s.value.as_deref(),
            Some(&br#""{\"id\": 1, \"customerId\": 123, \"a\": [1.5, \"x\\\"y\"]}""#[..])
        );
        let e = record(&m, DebeziumPayload::ExpandedJson).unwrap();
        assert_eq!(
            e.value.as_deref(),
            Some(&br#"{"id":1,"customerId":123,"a":[1.5,"x\"y"]}"#[..])
        );
        // Not an object or array, or not JSON: left a string, as the router leaves it.
        for text in ["plain text", "{not json", "42"] {
            let m = message(text.as_bytes());
            let e = record(&m, DebeziumPayload::ExpandedJson).unwrap();
            assert_eq!(e.value.unwrap().as_ref(), serde_json::to_vec(text).unwrap());
        }
    }

    #[test]
    fn empty_payloads_and_refusals() {
        let m = message(b"  ");
        assert_eq!(record(&m, DebeziumPayload::AsIs).unwrap().value, None);
        assert_eq!(
            record(&m, DebeziumPayload::JsonString)
                .unwrap()
                .value
                .as_deref(),
            Some(&b"null"[..])
        );
        let binary = message(&[0xff, 0xfe]);
        assert_eq!(
            record(&binary, DebeziumPayload::JsonString)
                .unwrap_err()
                .kind,
            PublishErrorKind::Invalid
        );
        assert!(record(&binary, DebeziumPayload::AsIs).is_ok());
        // Bytes are never "empty" to the router, white space or not.
        let mut spaces = message(b"  ");
        spaces.payload = Payload::bytes("application/octet-stream", b"  ".to_vec());
        assert_eq!(
            record(&spaces, DebeziumPayload::AsIs)
                .unwrap()
                .value
                .as_deref(),
            Some(&b"  "[..])
        );
        let mut clash = message(b"{}");
        clash.headers.insert("ID".into(), "x".into());
        assert_eq!(
            record(&clash, DebeziumPayload::AsIs).unwrap_err().kind,
            PublishErrorKind::Invalid
        );
    }
}
