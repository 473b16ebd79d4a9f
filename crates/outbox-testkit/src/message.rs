//! [`OutboxMessage`]s for tests, as the relay would hand them to a transport.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use outbox_core::{NewMessage, OutboxMessage, Payload};

/// A W3C trace context carried as a user header by [`rich`].
pub const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// Now, to the microsecond: the precision the wire format carries (`time`), so a decoded time
/// equals the message's.
pub fn now_micros() -> DateTime<Utc> {
    let now = Utc::now();
    DateTime::from_timestamp_micros(now.timestamp_micros()).unwrap_or(now)
}

/// A `payment` / `PaymentCreated` event of `aggregate_id` at `version` with a JSON `body`, a
/// fresh UUIDv7 event id, schema version 1, no headers and no overrides.
pub fn event(aggregate_id: &str, version: i64, body: impl Into<Bytes>) -> OutboxMessage {
    let payload = Payload::bytes("application/json", body.into());
    NewMessage::new("payment", aggregate_id, version, "PaymentCreated", payload)
        .stored(version, now_micros())
}

/// [`event`] with a payload of `len` bytes (`x` repeated, content type
/// `application/octet-stream`).
pub fn sized(aggregate_id: &str, version: i64, len: usize) -> OutboxMessage {
    with_payload(
        event(aggregate_id, version, Bytes::new()),
        Payload::bytes("application/octet-stream", vec![b'x'; len]),
    )
}

/// `message` with another payload, its fingerprint recomputed.
pub fn with_payload(mut message: OutboxMessage, payload: Payload) -> OutboxMessage {
    message.fingerprint = payload.fingerprint();
    message.payload = payload;
    message
}

/// An event whose every field exercises the wire encoding: non-ASCII, spaces, quotes and `%` in
/// the aggregate id and event type, a partition key override, versions above 1, a JSON body
/// with non-ASCII text and irregular spacing, and two user headers (`traceparent`, and
/// `tenant` with a space).
pub fn rich() -> OutboxMessage {
    let body = "{\"amount\": 100,  \"currency\":\"EUR\",\"note\":\"café ✓\"}";
    let mut m = event("Konto 42/ä \"x\" 100%", 12, body.as_bytes().to_vec());
    m.aggregate_type = "zahlung".to_owned();
    m.event_type = "Zahlung.Erstellt-ü €".to_owned();
    m.schema_version = 3;
    m.partition_key = Some("merchant-9".to_owned());
    m.headers
        .insert("traceparent".to_owned(), TRACEPARENT.to_owned());
    m.headers
        .insert("tenant".to_owned(), "acme corp".to_owned());
    m
}

#[cfg(test)]
mod tests {
    use outbox_core::Fingerprint;

    use super::*;

    #[test]
    fn fingerprints_match_payloads() {
        for m in [event("a", 1, &b"{}"[..]), sized("a", 2, 10), rich()] {
            assert_eq!(m.fingerprint, Fingerprint::of(&m.payload.bytes));
        }
        assert_eq!(sized("a", 1, 7).payload.bytes.len(), 7);
        assert_ne!(
            event("a", 1, &b"{}"[..]).event_id,
            event("a", 1, &b"{}"[..]).event_id
        );
        assert_eq!(rich().created_at.timestamp_subsec_nanos() % 1000, 0);
    }
}
