//! The AMQP 0-9-1 rendering of an [`OutboxMessage`]: routing key, properties and headers.
//!
//! Pure functions, no I/O: everything that can be refused without asking the broker is refused
//! here, before a byte is sent. (lapin writes a short string longer than 255 bytes with a
//! truncated length prefix in release builds, which corrupts the frame and kills the whole
//! connection, so every short string is checked.)

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use outbox_core::{OutboxMessage, PublishError, PublishErrorKind, ReservedHeaders, wire};

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

fn short(field: &str, value: &str) -> Result<ShortString, PublishError> {
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

    for (name, value) in wire::attributes(msg, &config.source) {
        let key = format!("{CLOUDEVENTS_HEADER_PREFIX}{name}");
        table_bytes += shortstr_bytes(&key) + 1 + 4 + value.len();
        headers.insert(
            short("header name", &key)?,
            AMQPValue::LongString(LongString::from(value)),
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
        let key = short(&format!("header name `{name}`"), name)?;
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::{TimeZone, Utc};
    use outbox_core::{Fingerprint, Payload};

    use super::*;

    fn msg() -> OutboxMessage {
        let payload = Payload::json(&serde_json::json!({"amount": 100})).unwrap();
        OutboxMessage {
            id: 1,
            event_id: uuid::Uuid::now_v7(),
            aggregate_type: "payment".into(),
            aggregate_id: "pay 42".into(),
            aggregate_version: 3,
            event_type: "Payment Created".into(),
            schema_version: 1,
            fingerprint: payload.fingerprint(),
            payload,
            headers: BTreeMap::from([("traceparent".to_owned(), "00-abc-def-01".to_owned())]),
            destination: None,
            partition_key: None,
            created_at: Utc.with_ymd_and_hms(2024, 5, 6, 7, 8, 9).unwrap(),
            attempts: 0,
        }
    }

    fn header<'a>(p: &'a BasicProperties, name: &str) -> &'a AMQPValue {
        p.headers()
            .as_ref()
            .unwrap()
            .inner()
            .get(name)
            .unwrap_or_else(|| panic!("missing header {name}"))
    }

    #[test]
    fn envelope_carries_properties_and_every_attribute() {
        let m = msg();
        let e = envelope(&m, &RabbitConfig::default()).unwrap();
        assert_eq!(e.routing_key.as_str(), "payment.Payment_Created");
        let p = &e.properties;
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(
            p.message_id().as_ref().unwrap().as_str(),
            m.event_id.to_string()
        );
        assert_eq!(
            p.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "Payment Created");
        assert_eq!(*p.timestamp(), Some(1_714_979_289));
        assert_eq!(*p.app_id(), None);
        for (name, value) in wire::attributes(&m, wire::DEFAULT_SOURCE) {
            assert_eq!(
                header(p, &format!("cloudEvents_{name}")),
                &AMQPValue::LongString(value.into())
            );
        }
        assert_eq!(
            header(p, "traceparent"),
            &AMQPValue::LongString("00-abc-def-01".into())
        );
        assert_eq!(p.headers().as_ref().unwrap().inner().len(), 13);
        let again = envelope(&m, &RabbitConfig::default()).unwrap();
        assert_eq!(again.properties, e.properties);
        assert_eq!(again.routing_key, e.routing_key);
    }

    #[test]
    fn destination_override_and_limits() {
        let mut m = msg();
        m.destination = Some("custom.key".into());
        let e = envelope(&m, &RabbitConfig::default()).unwrap();
        assert_eq!(e.routing_key.as_str(), "custom.key");

        m.destination = Some("k".repeat(256));
        let err = envelope(&m, &RabbitConfig::default()).unwrap_err();
        assert_eq!(err.kind, PublishErrorKind::Invalid);
        assert!(!err.is_retryable());

        let mut m = msg();
        m.event_type = "é".repeat(200); // 400 bytes
        let err = envelope(&m, &RabbitConfig::default()).unwrap_err();
        assert_eq!(err.kind, PublishErrorKind::Invalid);

        for name in ["cloudEvents_id", "CLOUDEVENTS-x", "cloudevents"] {
            let mut m = msg();
            m.headers.insert(name.into(), "spoof".into());
            let err = envelope(&m, &RabbitConfig::default()).unwrap_err();
            assert_eq!(err.kind, PublishErrorKind::Invalid, "{name}");
        }
    }

    #[test]
    fn every_header_the_transport_sets_is_reserved() {
        let mut m = msg();
        m.headers.clear();
        let e = envelope(&m, &RabbitConfig::default()).unwrap();
        let headers = e.properties.headers().as_ref().unwrap().inner();
        assert!(!headers.is_empty());
        for name in headers.keys() {
            assert!(RESERVED_HEADERS.reserves(name.as_str()), "{name}");
        }
        for name in ["traceparent", "content-type", "ce-id", "x-cloudevents"] {
            assert!(!RESERVED_HEADERS.reserves(name), "{name}");
        }
    }

    #[test]
    fn sanitize_replaces_whitespace_and_controls_only() {
        assert_eq!(
            sanitize_routing_key_part("a b\tc\nd\u{0}e.f-g"),
            "a_b_c_d_e.f-g"
        );
        assert_eq!(sanitize_routing_key_part("zahlung-ü"), "zahlung-ü");
    }

    #[test]
    fn fingerprint_header_matches_payload() {
        let m = msg();
        let e = envelope(&m, &RabbitConfig::default()).unwrap();
        assert_eq!(
            header(&e.properties, "cloudEvents_payloadsha256"),
            &AMQPValue::LongString(Fingerprint::of(&m.payload.bytes).to_hex().into())
        );
    }
}
