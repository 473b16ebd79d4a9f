//! Malformed messages: each a delivery whose event is the exact decode error, with its raw
//! message kept, none holding back the valid event behind it.

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use outbox_core::consumer::{Delivery, DeliverySource, RawMessage};
use outbox_core::wire::{self, DecodeError};
use outbox_core::{Fingerprint, Payload};

use super::steps::*;
use super::{DELIVERY_WITHIN, SourceHarness, SourceSettings};
use crate::message;

/// What a malformed message must decode to.
#[derive(Debug)]
enum Expected {
    /// Exactly this error.
    Exactly(DecodeError),
    /// [`DecodeError::Invalid`] naming this attribute (the value shown depends on the protocol).
    InvalidAttribute(&'static str),
}

impl Expected {
    fn is(&self, got: &DecodeError) -> bool {
        match self {
            Self::Exactly(e) => e == got,
            Self::InvalidAttribute(name) => {
                matches!(got, DecodeError::Invalid { name: n, .. } if n == name)
            }
        }
    }
}

impl From<DecodeError> for Expected {
    fn from(e: DecodeError) -> Self {
        Self::Exactly(e)
    }
}

/// A malformed message: what it is, the message as sent, and the error it must decode to.
type Malformed = (&'static str, RawMessage, Expected);

/// Builds the malformed messages of
/// [`malformed_messages_are_deliveries_and_do_not_block`], each with the error it must decode
/// to.
fn malformed<H: SourceHarness>(h: &H, max_message_bytes: usize) -> anyhow::Result<Vec<Malformed>> {
    let mut cases = vec![no_attributes()];
    cases.extend(missing_and_invalid_attributes(h)?);
    cases.extend(altered_bodies(h, max_message_bytes)?);
    cases.extend(attributes_no_decoder_may_take(h)?);
    Ok(cases)
}

/// The wire form of event `version` of aggregate `poison`.
fn encoded<H: SourceHarness>(h: &H, version: i64) -> anyhow::Result<RawMessage> {
    h.encode(&message::event("poison", version, &b"{\"x\":1}"[..]))
}

/// [`encoded`], with CloudEvents attribute `attribute` set to `value` (removed for `None`).
fn altered<H: SourceHarness>(
    h: &H,
    version: i64,
    attribute: &str,
    value: Option<&str>,
) -> anyhow::Result<RawMessage> {
    let mut raw = encoded(h, version)?;
    let header = h.attribute_header(attribute);
    ensure!(
        raw.headers.contains_key(&header),
        "the harness encodes no header `{header}` for attribute `{attribute}`"
    );
    match value {
        Some(v) => raw.headers.insert(header, v.to_owned()),
        None => raw.headers.remove(&header),
    };
    Ok(raw)
}

/// A message without any CloudEvents attribute.
fn no_attributes() -> Malformed {
    (
        "no CloudEvents attributes at all",
        RawMessage {
            payload: Bytes::from_static(b"plain text, no CloudEvents headers"),
            ..RawMessage::default()
        },
        DecodeError::Missing("specversion").into(),
    )
}

/// No id, an id that is not a UUID, a bad aggregate version, an unknown spec version.
fn missing_and_invalid_attributes<H: SourceHarness>(h: &H) -> anyhow::Result<Vec<Malformed>> {
    Ok(vec![
        (
            "no id",
            altered(h, 2, "id", None)?,
            DecodeError::Missing("id").into(),
        ),
        (
            "an id that is not a UUID",
            altered(h, 3, "id", Some("not-a-uuid"))?,
            DecodeError::Invalid {
                name: "id",
                value: "not-a-uuid".to_owned(),
            }
            .into(),
        ),
        (
            "a bad aggregate version",
            altered(h, 4, "aggregateversion", Some("zero"))?,
            DecodeError::Invalid {
                name: "aggregateversion",
                value: "zero".to_owned(),
            }
            .into(),
        ),
        (
            "an unknown spec version",
            altered(h, 5, "specversion", Some("0.3"))?,
            DecodeError::SpecVersion("0.3".to_owned()).into(),
        ),
    ])
}

/// A body that is not the fingerprinted one, and a body over the limit.
fn altered_bodies<H: SourceHarness>(
    h: &H,
    max_message_bytes: usize,
) -> anyhow::Result<Vec<Malformed>> {
    let mut tampered = encoded(h, 6)?;
    let sent_fingerprint = Fingerprint::of(&tampered.payload);
    tampered.payload = Bytes::from_static(b"{\"x\":999}");
    let big_len = max_message_bytes + 1000;
    let big = h.encode(&message::sized("poison", 7, big_len))?;
    Ok(vec![
        (
            "a body that is not the fingerprinted one",
            tampered,
            DecodeError::FingerprintMismatch {
                expected: sent_fingerprint.to_hex(),
                actual: Fingerprint::of(b"{\"x\":999}").to_hex(),
            }
            .into(),
        ),
        (
            "a body over the limit",
            big,
            DecodeError::TooLarge {
                size: big_len,
                max: max_message_bytes,
            }
            .into(),
        ),
    ])
}

/// Attribute values no decoder may take: an empty event type, an aggregate id over the
/// attribute limit, a NUL in the aggregate type and in the content type, an aggregate id that
/// is not UTF-8.
fn attributes_no_decoder_may_take<H: SourceHarness>(h: &H) -> anyhow::Result<Vec<Malformed>> {
    let too_long = "x".repeat(wire::MAX_ATTRIBUTE_CHARS + 45);
    let bad_type = "application/json\0; charset=x";
    let mut nul_content_type = encoded(h, 11)?;
    nul_content_type.content_type = Some(bad_type.to_owned());
    for (name, value) in &mut nul_content_type.headers {
        if name.eq_ignore_ascii_case("content-type") {
            bad_type.clone_into(value);
        }
    }
    let mut not_utf8 = encoded(h, 12)?;
    h.set_attribute_bytes(&mut not_utf8, "aggregateid", b"p-\xff\xfe");
    Ok(vec![
        (
            "an empty event type",
            altered(h, 9, "type", Some(""))?,
            DecodeError::Missing("type").into(),
        ),
        (
            "an aggregate id over the attribute limit",
            altered(h, 10, "aggregateid", Some(&too_long))?,
            DecodeError::TooLong {
                name: "aggregateid",
                len: too_long.len(),
                max: wire::MAX_ATTRIBUTE_CHARS,
            }
            .into(),
        ),
        (
            "a NUL in the aggregate type",
            altered(h, 13, "aggregatetype", Some("pay\0ment"))?,
            DecodeError::Invalid {
                name: "aggregatetype",
                value: "pay?ment".to_owned(),
            }
            .into(),
        ),
        (
            "a NUL in the content type",
            nul_content_type,
            DecodeError::Invalid {
                name: "datacontenttype",
                value: wire::excerpt(bad_type),
            }
            .into(),
        ),
        (
            "an aggregate id that is not UTF-8",
            not_utf8,
            Expected::InvalidAttribute("aggregateid"),
        ),
    ])
}

/// Poison messages published before a valid event are each a delivery, in publish order, whose
/// event is the exact [`DecodeError`], whose raw message is the one sent (body, content type,
/// headers), and which [`DeliverySource::decode`] judges the same way; the valid event behind
/// them is delivered and decoded. Once all are acknowledged, lag is 0.
///
/// # Errors
/// The first broken expectation.
pub async fn malformed_messages_are_deliveries_and_do_not_block<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings {
        max_message_bytes: 1024,
        ..SourceSettings::default()
    };
    let mut source = h.source(&settings).await?;
    let cases = malformed(h, settings.max_message_bytes)?;
    for (what, raw, _) in &cases {
        h.publish_raw(raw)
            .await
            .with_context(|| format!("publishing {what}"))?;
    }
    let valid = message::with_payload(
        message::event("poison", 8, Bytes::new()),
        Payload::bytes("application/json", &b"{\"ok\":true}"[..]),
    );
    h.publish(&valid).await?;

    let got = receive(&mut source, cases.len() + 1, DELIVERY_WITHIN).await?;
    for ((what, sent, expected), d) in cases.iter().zip(&got) {
        ensure!(
            d.event().as_ref().err().is_some_and(|e| expected.is(e)),
            "{what}: delivered as {:?}, expected {expected:?} (deliveries come in publish \
             order)",
            d.event()
        );
        let raw = d.raw();
        ensure!(
            raw.payload == sent.payload,
            "{what}: the raw body was not kept"
        );
        ensure!(
            raw.content_type == sent.content_type,
            "{what}: raw content type {:?}, sent {:?}",
            raw.content_type,
            sent.content_type
        );
        for (name, value) in &sent.headers {
            ensure!(
                raw.headers.get(name) == Some(value),
                "{what}: raw header `{name}` is {:?}, sent {value:?}",
                raw.headers.get(name)
            );
        }
        ensure!(
            raw.binary_headers == sent.binary_headers,
            "{what}: raw binary headers {:?}, sent {:?}",
            raw.binary_headers,
            sent.binary_headers
        );
        ensure!(
            source.decode(raw) == *d.event(),
            "{what}: decoding the kept raw message gives {:?}",
            source.decode(raw)
        );
    }
    let last = got.last().context("no deliveries")?;
    check_event(event_of(last)?, &valid).context("the valid event behind the poison")?;
    ensure!(
        source.decode(last.raw()).as_ref() == Ok(event_of(last)?),
        "decoding the valid event's raw message differs"
    );
    ack_all(got).await?;
    check_lag(&mut source, &caps, 0, 0, "all acknowledged").await
}
