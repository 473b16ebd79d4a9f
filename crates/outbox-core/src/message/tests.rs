use super::*;

fn msg() -> NewMessage {
    NewMessage::new(
        "payment",
        "p1",
        1,
        "PaymentCreated",
        Payload::json(&1).unwrap(),
    )
}

#[test]
fn headers_from_json_names_the_header_that_is_not_a_string() {
    let ok = headers_from_json(serde_json::json!({"traceparent": "00-ab", "x": ""})).unwrap();
    assert_eq!(ok.len(), 2);
    for (value, kind) in [
        (serde_json::json!(null), "null"),
        (serde_json::json!(7), "a number"),
        (serde_json::json!({"a": "b"}), "an object"),
        (serde_json::json!(["a"]), "an array"),
        (serde_json::json!(true), "a boolean"),
    ] {
        let e = headers_from_json(serde_json::json!({"traceparent": value})).unwrap_err();
        assert_eq!(
            e,
            format!("header `traceparent` is {kind}: every header value must be a string")
        );
    }
    let e = headers_from_json(serde_json::json!(["a"])).unwrap_err();
    assert!(e.contains("is an array, not an object"), "{e}");
}

#[test]
fn stored_keeps_every_field_the_producer_set() {
    let m = msg()
        .with_schema_version(2)
        .with_destination("d")
        .with_partition_key("k")
        .with_header("h", "v");
    let at = Utc::now();
    let row = m.clone().stored(9, at);
    assert_eq!((row.id, row.created_at, row.attempts), (9, at, 0));
    assert_eq!(row.fingerprint, Fingerprint::of(&m.payload.bytes));
    assert_eq!(
        (row.event_id, row.aggregate_version, row.schema_version),
        (m.event_id, 1, 2)
    );
    assert_eq!(
        (row.aggregate_type, row.aggregate_id, row.event_type),
        (m.aggregate_type, m.aggregate_id, m.event_type)
    );
    assert_eq!(
        (row.payload, row.headers, row.destination, row.partition_key),
        (m.payload, m.headers, m.destination, m.partition_key)
    );
}

#[test]
fn check_publishable_refuses_what_no_binding_can_carry() {
    let row = |f: &dyn Fn(&mut OutboxMessage)| {
        let mut m = msg().stored(1, Utc::now());
        f(&mut m);
        m.check_publishable()
    };
    assert_eq!(row(&|_| {}), Ok(()));
    // Not JSON although it says so: published (the payload is not parsed).
    assert_eq!(
        row(&|m| m.payload.bytes = bytes::Bytes::from_static(b"{")),
        Ok(())
    );
    assert!(matches!(
        row(&|m| {
            m.headers.insert("x y".into(), "x".into());
        }),
        Err(MessageError::BadHeaderName(_))
    ));
    assert!(matches!(
        row(&|m| {
            m.headers.insert("x".into(), "a\r\nb".into());
        }),
        Err(MessageError::BadHeaderValue(_))
    ));
    assert!(matches!(
        row(&|m| m.payload.content_type = ContentType("text/plain\n".into())),
        Err(MessageError::BadContentType { .. })
    ));
    assert!(matches!(
        row(&|m| m.destination = Some(String::new())),
        Err(MessageError::BadLength { .. })
    ));
    // Consumers refuse a control character in an attribute: the relay does not send one.
    for f in [
        &(|m: &mut OutboxMessage| m.aggregate_id = "p\r\n-1".into()) as &dyn Fn(&mut _),
        &|m: &mut OutboxMessage| m.aggregate_type = "pay\u{1b}".into(),
        &|m: &mut OutboxMessage| m.event_type = "E\u{85}".into(),
        &|m: &mut OutboxMessage| m.partition_key = Some("k\t".into()),
        &|m: &mut OutboxMessage| m.destination = Some("a\nb".into()),
    ] {
        assert!(matches!(row(f), Err(MessageError::ControlCharacter { .. })));
    }
}

/// A made-up binding's reservations: `acme-*` attribute headers and its own `x-acme`.
const ACME: ReservedHeaders = ReservedHeaders {
    prefixes: &["acme-"],
    names: &["x-acme"],
};
const OTHER: ReservedHeaders = ReservedHeaders {
    prefixes: &["other_"],
    names: &[],
};

#[test]
fn reserved_names_are_refused_only_when_reserved() {
    let bad = |r: Result<(), MessageError>| matches!(r, Err(MessageError::BadHeaderName(_)));
    for name in [
        "acme-id",
        "ACME-Type",
        "x-acme",
        "X-Acme",
        "other_x",
        "OTHER_",
    ] {
        let m = msg().with_header(name, "x");
        // The core reserves nothing of its own.
        assert_eq!(m.validate(), Ok(()), "{name}");
        assert!(bad(m.validate_reserving(&[ACME, OTHER])), "{name}");
        let row = m.clone().stored(1, Utc::now());
        assert_eq!(row.check_publishable(), Ok(()), "{name}");
        assert!(
            bad(row.check_publishable_reserving(&[OTHER, ACME])),
            "{name}"
        );
    }
    for name in ["acme", "x-acme-2", "xacme-", "other", "traceparent"] {
        let m = msg().with_header(name, "x");
        assert_eq!(m.validate_reserving(&[ACME, OTHER]), Ok(()), "{name}");
    }
    assert!(ReservedHeaders::NONE == ReservedHeaders::default());
    assert!(!ReservedHeaders::NONE.reserves(""));
}

#[test]
fn fingerprint_is_sha256_of_exact_bytes() {
    let fp = Fingerprint::of(b"abc");
    assert_eq!(
        fp.to_hex(),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_ne!(
        Fingerprint::of(b"{\"a\":1}"),
        Fingerprint::of(b"{\"a\": 1}")
    );
}

#[test]
fn validation_rejects_bad_fields() {
    assert!(msg().validate().is_ok());
    let mut m = msg();
    m.aggregate_version = 0;
    assert_eq!(m.validate(), Err(MessageError::BadVersion(0)));
    for name in ["", "a b", "a:b", "é", &"a".repeat(MAX_HEADER_NAME_LEN + 1)] {
        let m = msg().with_header(name, "x");
        assert!(
            matches!(m.validate(), Err(MessageError::BadHeaderName(_))),
            "{name:?}"
        );
    }
    let m = msg().with_header("x-acme", "text/plain");
    assert!(matches!(
        m.validate_reserving(&[ACME]),
        Err(MessageError::BadHeaderName(_))
    ));
    let m = msg().with_header("x", "a\r\nb");
    assert!(matches!(m.validate(), Err(MessageError::BadHeaderValue(_))));
    let mut m = msg();
    m.event_type = String::new();
    assert!(matches!(
        m.validate(),
        Err(MessageError::BadLength {
            field: "event_type",
            ..
        })
    ));
    let m = msg().with_header(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    assert!(m.validate().is_ok());
}

#[test]
fn content_types_must_be_printable_media_types() {
    for good in [
        "application/json",
        "application/octet-stream",
        "text/plain; charset=utf-8",
        "application/vnd.acme.payment+json;v=2",
    ] {
        let mut m = msg();
        m.payload.content_type = ContentType(good.to_owned());
        assert!(m.validate().is_ok(), "{good}");
    }
    for (bad, why) in [
        ("application/json\r\nX-Injected: 1", "printable ASCII"),
        ("text/plain\0", "printable ASCII"),
        ("text/pl\u{e4}in", "printable ASCII"),
        ("application/json\t", "printable ASCII"),
        ("json", "type/subtype"),
        ("application/", "type/subtype"),
        ("app lication/json", "type/subtype"),
    ] {
        let mut m = msg();
        m.payload.content_type = ContentType(bad.to_owned());
        match m.validate() {
            Err(MessageError::BadContentType {
                content_type,
                reason,
            }) => {
                assert!(reason.contains(why), "{bad:?}: {reason}");
                assert!(!content_type.contains('\n') && !content_type.contains('\0'));
            }
            other => panic!("{bad:?}: expected BadContentType, got {other:?}"),
        }
    }
}

#[test]
fn json_content_types_require_valid_json() {
    let json = |ct: &str, body: &str| {
        NewMessage::new(
            "payment",
            "p1",
            1,
            "PaymentCreated",
            Payload::bytes(ct, body.to_owned()),
        )
        .validate()
    };
    assert!(json("application/json", r#"{"a":[1,2]}"#).is_ok());
    assert!(json("application/cloudevents+json; charset=utf-8", "[]").is_ok());
    assert!(json("application/octet-stream", "{not json").is_ok());
    for (ct, body) in [
        ("application/json", "{not json"),
        ("Application/JSON", r#"{"a":1} trailing"#),
        ("text/json", ""),
        ("application/problem+json", "\u{0}"),
    ] {
        match json(ct, body) {
            Err(MessageError::PayloadNotJson {
                content_type,
                error,
            }) => {
                assert_eq!(content_type, ct);
                assert!(!error.is_empty());
            }
            other => panic!("{ct} {body:?}: expected PayloadNotJson, got {other:?}"),
        }
    }
    assert!(ContentType::json().is_json());
    assert!(!ContentType("application/jsonl".into()).is_json());
}

#[cfg(feature = "opentelemetry")]
#[test]
fn otel_context_becomes_traceparent() {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    let sc = SpanContext::new(
        TraceId::from_hex("0af7651916cd43dd8448eb211c80319c").unwrap(),
        SpanId::from_hex("b7ad6b7169203331").unwrap(),
        TraceFlags::SAMPLED,
        true,
        TraceState::from_key_value([("vendor", "x")]).unwrap(),
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(sc);
    let m = msg().with_otel_context(&cx);
    assert_eq!(
        m.headers.get(TRACEPARENT_HEADER).map(String::as_str),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert_eq!(
        m.headers.get("tracestate").map(String::as_str),
        Some("vendor=x")
    );
    assert!(
        msg()
            .with_otel_context(&opentelemetry::Context::new())
            .headers
            .is_empty()
    );
}

#[test]
fn event_ids_are_v7_and_distinct() {
    let a = msg();
    let b = msg();
    assert_ne!(a.event_id, b.event_id);
    assert_eq!(a.event_id.get_version_num(), 7);
}
