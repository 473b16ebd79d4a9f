//! The binding both ways: what is published, and what a reader makes of a delivery.

use std::collections::BTreeMap;

use chrono::{TimeZone, Utc};
use lapin::types::{FieldArray, LongString};
use outbox_core::{Fingerprint, Payload};

use super::*;

#[test]
fn every_attribute_header_is_the_prefix_and_the_name() {
    for name in wire::attr::ALL {
        assert_eq!(
            attribute_header(name),
            format!("{CLOUDEVENTS_HEADER_PREFIX}{name}")
        );
    }
    assert_eq!(attribute_header("other"), "cloudEvents_other");
}

#[test]
fn a_user_header_name_over_a_short_string_is_invalid() {
    let mut m = msg();
    m.headers.insert("h".repeat(300), "v".into());
    let e = envelope(&m, &RabbitConfig::default()).unwrap_err();
    assert_eq!(e.kind, PublishErrorKind::Invalid);
    assert!(e.message.contains("is 300 bytes"), "{}", e.message);
}

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

#[test]
fn header_values_as_text() {
    assert_eq!(
        value_text(&AMQPValue::LongString(LongString::from("zahlung-ü"))),
        "zahlung-ü"
    );
    assert_eq!(
        value_text(&AMQPValue::LongString(LongString::from(vec![b'a', 0xff]))),
        "a\u{fffd}"
    );
    assert_eq!(value_text(&AMQPValue::ShortString("s".into())), "s");
    assert_eq!(value_text(&AMQPValue::LongLongInt(-3)), "-3");
    assert_eq!(value_text(&AMQPValue::Boolean(true)), "true");
    assert_eq!(decimal_text(12345, 2), "123.45");
    assert_eq!(decimal_text(5, 3), "0.005");
    assert_eq!(decimal_text(7, 0), "7");
    assert!(!value_text(&AMQPValue::FieldArray(FieldArray::default())).is_empty());
    assert_eq!(
        header_value(&AMQPValue::LongString(LongString::from(vec![b'a', 0xff]))),
        Err(Bytes::from_static(&[b'a', 0xff])),
        "bytes that are not UTF-8 are kept as bytes"
    );
    assert_eq!(
        header_value(&AMQPValue::LongString(LongString::from("a\0b"))),
        Ok("a\0b".to_owned())
    );
}

#[test]
fn an_attribute_that_is_not_text_is_invalid_and_kept_as_bytes() {
    let body = Bytes::from_static(b"{}");
    let p = props(vec![
        (
            "cloudEvents_specversion",
            AMQPValue::LongString("1.0".into()),
        ),
        (
            "cloudEvents_aggregateid",
            AMQPValue::LongString(LongString::from(vec![b'p', 0xfe, 0xff])),
        ),
        ("trace", AMQPValue::ByteArray(vec![0xc3, 0x28].into())),
    ])
    .with_message_id("m-1".into())
    .with_timestamp(7);
    let raw = raw_message(&p, body);
    assert_eq!(
        raw.binary_headers["cloudEvents_aggregateid"],
        Bytes::from_static(&[b'p', 0xfe, 0xff])
    );
    assert!(!raw.headers.contains_key("cloudEvents_aggregateid"));
    assert_eq!(
        raw.binary_headers["trace"],
        Bytes::from_static(&[0xc3, 0x28])
    );
    assert_eq!(raw.metadata["message_id"], "m-1");
    assert_eq!(raw.metadata["timestamp"], "7");
    assert_eq!(
        decode_raw(&raw, 1024).unwrap_err(),
        DecodeError::Invalid {
            name: "aggregateid",
            value: "not UTF-8 text (3 bytes)".into()
        }
    );
}

/// A header value of `levels` tables, each the only entry of the one around it.
fn nested(levels: usize) -> AMQPValue {
    let mut value = AMQPValue::LongString("bottom".into());
    for _ in 0..levels {
        let mut table = FieldTable::default();
        table.insert("n".into(), value);
        value = AMQPValue::FieldTable(table);
    }
    value
}

#[test]
fn messages_that_break_amqp_rules_are_refused_with_the_place() {
    let mut x_death = FieldTable::default();
    x_death.insert("count".into(), AMQPValue::LongLongInt(1));
    let fine = props(vec![
        ("cloudEvents_aggregateversion", AMQPValue::LongLongInt(4)),
        ("cloudEvents_schemaversion", AMQPValue::ShortShortUInt(1)),
        (
            "cloudEvents_aggregateid",
            AMQPValue::ByteArray(b"p-1".to_vec().into()),
        ),
        (
            "x-death",
            AMQPValue::FieldArray(vec![AMQPValue::FieldTable(x_death)].into()),
        ),
        ("deep-enough", nested(MAX_HEADER_DEPTH)),
        ("control\n", AMQPValue::Void),
        ("user-typed", AMQPValue::Double(1.5)),
    ])
    .with_message_id("m-1".into())
    .with_correlation_id("line\nbreak".into());
    let raw = raw_message(&fine, Bytes::new());
    assert_eq!(raw.metadata.get(PROTOCOL_ERROR_KEY), None, "{raw:?}");
    assert_eq!(delivery_fault("outbox", "payment.p-1"), None);

    let mut nul_inside = FieldTable::default();
    nul_inside.insert("a\0b".into(), AMQPValue::Boolean(true));
    let cases = [
        (
            fine.clone()
                .with_content_type("application/\u{fffd}".into()),
            "the content type `application/\u{fffd}` is not UTF-8 text",
        ),
        (
            fine.clone().with_message_id("m\0".into()),
            "the property `message_id` `m?` holds a NUL byte",
        ),
        (
            fine.clone().with_type("T\u{fffd}".into()),
            "the property `type` `T\u{fffd}` is not UTF-8 text",
        ),
        (
            props(vec![("", AMQPValue::LongString("x".into()))]),
            "a header has an empty name",
        ),
        (
            props(vec![("n\u{fffd}", AMQPValue::LongString("x".into()))]),
            "the header name `n\u{fffd}` is not UTF-8 text",
        ),
        (
            props(vec![(
                "t",
                AMQPValue::FieldArray(vec![AMQPValue::FieldTable(nul_inside)].into()),
            )]),
            "the header name `a?b` holds a NUL byte",
        ),
        (
            props(vec![("deep", nested(MAX_HEADER_DEPTH + 1))]),
            "the header `deep` nests tables or arrays deeper than 16 levels",
        ),
        (
            props(vec![("cloudEvents_id", AMQPValue::LongInt(5))]),
            "the CloudEvents attribute `id` (header `cloudEvents_id`) is an AMQP long-int, not a string",
        ),
        (
            props(vec![("cloudEvents_aggregateid", nested(1))]),
            "the CloudEvents attribute `aggregateid` (header `cloudEvents_aggregateid`) is an AMQP field table, not a string",
        ),
        (
            props(vec![("cloudEvents_time", AMQPValue::Timestamp(1))]),
            "the CloudEvents attribute `time` (header `cloudEvents_time`) is an AMQP timestamp, not a string",
        ),
        (
            props(vec![("cloudEvents_subject", AMQPValue::Void)]),
            "the CloudEvents attribute `subject` (header `cloudEvents_subject`) is an AMQP void, not a string",
        ),
    ];
    for (properties, reason) in cases {
        let raw = raw_message(&properties, Bytes::from_static(b"{}"));
        assert_eq!(
            raw.metadata.get(PROTOCOL_ERROR_KEY).map(String::as_str),
            Some(reason)
        );
        assert_eq!(
            decode_raw(&raw, 1024),
            Err(DecodeError::Protocol(reason.to_owned())),
            "a stored copy decodes the same way"
        );
    }
    assert_eq!(
        delivery_fault("outbox", "payment.\u{fffd}").as_deref(),
        Some("the routing key `payment.\u{fffd}` is not UTF-8 text")
    );
    assert_eq!(
        delivery_fault("out\0box", "payment").as_deref(),
        Some("the exchange `out?box` holds a NUL byte")
    );
}

#[test]
fn a_refused_message_keeps_its_readable_identity_but_no_rendered_attribute() {
    let id = uuid::Uuid::now_v7();
    let mut identity = vec![
        (
            "cloudEvents_id",
            AMQPValue::LongString(id.to_string().into()),
        ),
        (
            "cloudEvents_aggregatetype",
            AMQPValue::LongString("pay".into()),
        ),
        ("cloudEvents_aggregateversion", AMQPValue::LongLongInt(3)),
    ];
    identity.push(("n\u{fffd}", AMQPValue::Boolean(true)));
    let raw = raw_message(&props(identity.clone()), Bytes::new());
    assert!(raw.metadata.contains_key(PROTOCOL_ERROR_KEY));
    assert_eq!(raw.metadata.get(REFUSED_ATTRIBUTES_KEY), None);
    let read = identify_raw(&raw);
    assert_eq!(
        (
            read.event_id,
            read.aggregate_type.as_deref(),
            read.aggregate_version
        ),
        (Some(id), Some("pay"), Some(3))
    );

    identity.pop();
    identity.push(("cloudEvents_aggregateid", nested(1)));
    identity.push(("cloudEvents_type", AMQPValue::Boolean(true)));
    let raw = raw_message(&props(identity), Bytes::new());
    assert_eq!(
        raw.metadata.get(REFUSED_ATTRIBUTES_KEY).map(String::as_str),
        Some("cloudEvents_type cloudEvents_aggregateid")
    );
    assert!(
        raw.headers["cloudEvents_aggregateid"].contains("FieldTable"),
        "the header is kept, as its debug text"
    );
    let read = identify_raw(&raw);
    assert_eq!(read.event_id, Some(id));
    assert_eq!(
        read.aggregate_id, None,
        "a table's debug text is no aggregate id"
    );
    assert_eq!(read.event_type, None);
}

fn props(headers: Vec<(&str, AMQPValue)>) -> BasicProperties {
    let mut table = FieldTable::default();
    for (k, v) in headers {
        table.insert(k.into(), v);
    }
    BasicProperties::default()
        .with_headers(table)
        .with_content_type("application/json".into())
}

#[test]
fn raw_and_decoded_agree_and_split_headers() {
    let id = uuid::Uuid::now_v7().to_string();
    let body = Bytes::from_static(br#"{"a":1}"#);
    let sha = outbox_core::Fingerprint::of(&body).to_hex();
    let p = props(vec![
        (
            "cloudEvents_specversion",
            AMQPValue::LongString("1.0".into()),
        ),
        ("cloudEvents_id", AMQPValue::LongString(id.as_str().into())),
        ("cloudEvents_type", AMQPValue::ShortString("T".into())),
        (
            "cloudEvents_aggregatetype",
            AMQPValue::LongString("pay".into()),
        ),
        (
            "cloudEvents_aggregateid",
            AMQPValue::LongString("p-ü".into()),
        ),
        // Another producer may send numbers as numbers.
        ("cloudEvents_aggregateversion", AMQPValue::LongLongInt(4)),
        (
            "cloudEvents_schemaversion",
            AMQPValue::LongString("1".into()),
        ),
        (
            "cloudEvents_payloadsha256",
            AMQPValue::LongString(sha.as_str().into()),
        ),
        ("traceparent", AMQPValue::LongString("00-1-2-01".into())),
        ("x-delivery-count", AMQPValue::LongLongInt(2)),
    ]);
    let raw = raw_message(&p, body.clone());
    assert_eq!(raw.content_type.as_deref(), Some("application/json"));
    assert_eq!(raw.headers["cloudEvents_aggregateversion"], "4");
    let e = decode_raw(&raw, 1024).unwrap();
    assert_eq!(e.event_id.to_string(), id);
    assert_eq!(e.aggregate_id, "p-ü");
    assert_eq!(e.aggregate_version, 4);
    assert_eq!(e.payload.bytes, body);
    assert_eq!(e.headers.len(), 2, "{:?}", e.headers);
    assert_eq!(e.headers["traceparent"], "00-1-2-01");
    assert!(matches!(
        decode_raw(&raw, 3),
        Err(DecodeError::TooLarge { size: 7, max: 3 })
    ));
}

/// The decoders at this boundary, over generated hostile input (outbox_testkit::fuzz): the
/// CloudEvents attributes of a raw message, and the whole way from AMQP properties with a
/// header table of any types and depth.
mod fuzz {
    use lapin::types::{AMQPValue, DecimalValue, FieldArray, FieldTable, LongString};
    use outbox_testkit::fuzz::proptest::prelude::*;
    use outbox_testkit::fuzz::{self, check_decoded, check_identity, check_refused};

    use super::*;

    #[test]
    fn attributes_of_any_raw_message() {
        fuzz::check_decoder(
            CLOUDEVENTS_HEADER_PREFIX,
            str::to_owned,
            |raw| decode_raw(raw, 1 << 20),
            identify_raw,
        );
    }

    fn value() -> impl Strategy<Value = AMQPValue> {
        let leaf = prop_oneof![
            any::<bool>().prop_map(AMQPValue::Boolean),
            any::<i8>().prop_map(AMQPValue::ShortShortInt),
            any::<u8>().prop_map(AMQPValue::ShortShortUInt),
            any::<i16>().prop_map(AMQPValue::ShortInt),
            any::<u16>().prop_map(AMQPValue::ShortUInt),
            any::<i32>().prop_map(AMQPValue::LongInt),
            any::<u32>().prop_map(AMQPValue::LongUInt),
            any::<i64>().prop_map(AMQPValue::LongLongInt),
            any::<f32>().prop_map(AMQPValue::Float),
            any::<f64>().prop_map(AMQPValue::Double),
            (any::<u8>(), any::<u32>())
                .prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
            fuzz::hostile_text(12).prop_map(|s| AMQPValue::ShortString(ShortString::from(s))),
            fuzz::hostile_text(12).prop_map(|s| AMQPValue::LongString(LongString::from(s))),
            prop::collection::vec(any::<u8>(), 0..12)
                .prop_map(|b| AMQPValue::LongString(LongString::from(b))),
            any::<u64>().prop_map(AMQPValue::Timestamp),
            prop::collection::vec(any::<u8>(), 0..12).prop_map(|b| AMQPValue::ByteArray(b.into())),
            Just(AMQPValue::Void),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
                prop::collection::btree_map(fuzz::hostile_text(6), inner, 0..4).prop_map(|m| {
                    let mut t = FieldTable::default();
                    for (k, v) in m {
                        t.insert(ShortString::from(k), v);
                    }
                    AMQPValue::FieldTable(t)
                }),
            ]
        })
    }

    /// A header table: the CloudEvents attributes of a valid event, some as another type
    /// or another value, beside random headers of every type.
    fn table() -> impl Strategy<Value = FieldTable> {
        let attribute = prop_oneof![
            4 => Just(None),
            1 => value().prop_map(Some),
        ];
        (
            prop::collection::vec(attribute, wire::attr::ALL.len()),
            prop::collection::btree_map(fuzz::hostile_text(8), value(), 0..4),
            1i64..100,
        )
            .prop_map(|(replaced, others, version)| {
                let id = uuid::Uuid::now_v7().to_string();
                let valid = |name: &str| -> Option<String> {
                    Some(match name {
                        "specversion" => "1.0".into(),
                        "id" => id.clone(),
                        "type" => "PaymentCreated".into(),
                        "aggregatetype" => "payment".into(),
                        "aggregateid" | "subject" | "partitionkey" => "p-1".into(),
                        "aggregateversion" => version.to_string(),
                        "schemaversion" => "1".into(),
                        _ => return None,
                    })
                };
                let mut t = FieldTable::default();
                for (k, v) in others {
                    t.insert(ShortString::from(k), v);
                }
                for (name, replacement) in wire::attr::ALL.iter().zip(replaced) {
                    let header = ShortString::from(format!("{CLOUDEVENTS_HEADER_PREFIX}{name}"));
                    match (replacement, valid(name)) {
                        (Some(v), _) => {
                            t.insert(header, v);
                        }
                        (None, Some(text)) => {
                            t.insert(header, AMQPValue::LongString(LongString::from(text)));
                        }
                        (None, None) => {}
                    }
                }
                t
            })
    }

    #[test]
    fn any_amqp_properties_and_header_table() {
        let counts = std::cell::Cell::new((0u32, 0u32));
        fuzz::runner()
            .run(
                &(
                    table(),
                    prop::option::of(fuzz::hostile_text(20)),
                    prop::option::of(fuzz::hostile_text(20)),
                    prop::collection::vec(any::<u8>(), 0..32),
                ),
                |(table, content_type, message_id, body)| {
                    let mut properties = BasicProperties::default().with_headers(table);
                    if let Some(c) = content_type {
                        properties = properties.with_content_type(ShortString::from(c));
                    }
                    if let Some(m) = message_id {
                        properties = properties.with_message_id(ShortString::from(m));
                    }
                    let raw = raw_message(&properties, Bytes::from(body));
                    let decoded = decode_raw(&raw, 1 << 20);
                    match &decoded {
                        Ok(event) => check_decoded(&raw, event, CLOUDEVENTS_HEADER_PREFIX)?,
                        Err(e) => check_refused(e)?,
                    }
                    check_identity(&identify_raw(&raw), decoded.as_ref().ok())?;
                    let (ok, refused) = counts.get();
                    counts.set(if decoded.is_ok() {
                        (ok + 1, refused)
                    } else {
                        (ok, refused + 1)
                    });
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        let (ok, refused) = counts.get();
        assert!(ok > 0 && refused > 0, "{ok} decoded, {refused} refused");
    }
}
