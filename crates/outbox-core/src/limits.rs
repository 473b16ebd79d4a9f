//! [`MessageLimits`]: the size bounds a producer enforces before an event reaches the outbox
//! table.
//!
//! Without them one runaway producer (a payload built from an unbounded list, a header copied
//! from an untrusted request) could write rows of any size: they bloat the table, stall the
//! relay on a message no broker accepts, and only fail far from the code that made them. The
//! store's `enqueue` refuses such a message at once with a [`MessageError`] naming the limit.

use serde::Deserialize;

use crate::message::{MessageError, NewMessage};

/// Size bounds checked at enqueue time. Every field has a default; a deployment that needs
/// larger events raises the one limit it needs.
///
/// The defaults:
///
/// | limit | default | why |
/// |---|---|---|
/// | `max_payload_bytes` | 4 MiB | an integration event is a fact, not a file; four times the 1 MiB a broker commonly accepts by default, so a larger limit there is a deliberate choice on both sides |
/// | `max_headers` | 64 | trace context and a few routing headers need a handful |
/// | `max_header_value_bytes` | 8 KiB | the W3C `baggage` limit (8,192 bytes) fits |
/// | `max_headers_bytes` | 32 KiB | names and values together; a broker may count headers into its message size limit |
///
/// A transport refuses at publish what its broker cannot carry (each transport crate states its
/// own limit); these bounds make the common case fail at enqueue instead, in the producer's code.
///
/// ```
/// use outbox_core::limits::MessageLimits;
/// use outbox_core::{MessageError, NewMessage, Payload};
///
/// let limits = MessageLimits { max_payload_bytes: 1024, ..MessageLimits::default() };
/// let big = NewMessage::new("payment", "p-1", 1, "PaymentCreated",
///     Payload::bytes("application/octet-stream", vec![0u8; 2048]));
/// assert_eq!(limits.check(&big), Err(MessageError::PayloadTooLarge { size: 2048, max: 1024 }));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MessageLimits {
    /// Largest payload, in bytes. Default 4 MiB.
    pub max_payload_bytes: usize,
    /// Most headers on one message. Default 64.
    pub max_headers: usize,
    /// Longest header value, in bytes. Default 8 KiB.
    pub max_header_value_bytes: usize,
    /// Largest sum of all header names and values, in bytes. Default 32 KiB.
    pub max_headers_bytes: usize,
}

impl Default for MessageLimits {
    fn default() -> Self {
        Self {
            max_payload_bytes: 4 * 1024 * 1024,
            max_headers: 64,
            max_header_value_bytes: 8 * 1024,
            max_headers_bytes: 32 * 1024,
        }
    }
}

impl MessageLimits {
    /// Checks `message` against every limit.
    ///
    /// # Errors
    /// The first limit exceeded: [`MessageError::PayloadTooLarge`],
    /// [`MessageError::TooManyHeaders`], [`MessageError::HeaderValueTooLong`] or
    /// [`MessageError::HeadersTooLarge`].
    pub fn check(&self, message: &NewMessage) -> Result<(), MessageError> {
        let size = message.payload.bytes.len();
        if size > self.max_payload_bytes {
            return Err(MessageError::PayloadTooLarge {
                size,
                max: self.max_payload_bytes,
            });
        }
        let count = message.headers.len();
        if count > self.max_headers {
            return Err(MessageError::TooManyHeaders {
                count,
                max: self.max_headers,
            });
        }
        let mut total = 0usize;
        for (name, value) in &message.headers {
            if value.len() > self.max_header_value_bytes {
                return Err(MessageError::HeaderValueTooLong {
                    name: name.clone(),
                    len: value.len(),
                    max: self.max_header_value_bytes,
                });
            }
            total = total.saturating_add(name.len()).saturating_add(value.len());
        }
        if total > self.max_headers_bytes {
            return Err(MessageError::HeadersTooLarge {
                size: total,
                max: self.max_headers_bytes,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Payload;

    fn msg(payload: usize) -> NewMessage {
        NewMessage::new(
            "payment",
            "p1",
            1,
            "PaymentCreated",
            Payload::bytes("application/octet-stream", vec![b'x'; payload]),
        )
    }

    #[test]
    fn each_limit_is_enforced_at_its_edge() {
        let l = MessageLimits {
            max_payload_bytes: 10,
            max_headers: 2,
            max_header_value_bytes: 5,
            max_headers_bytes: 12,
        };
        assert_eq!(l.check(&msg(10)), Ok(()));
        assert_eq!(
            l.check(&msg(11)),
            Err(MessageError::PayloadTooLarge { size: 11, max: 10 })
        );
        let two = msg(1).with_header("a", "12345").with_header("b", "1");
        assert_eq!(l.check(&two), Ok(()));
        assert_eq!(
            l.check(&two.clone().with_header("c", "")),
            Err(MessageError::TooManyHeaders { count: 3, max: 2 })
        );
        assert_eq!(
            l.check(&msg(1).with_header("a", "123456")),
            Err(MessageError::HeaderValueTooLong {
                name: "a".into(),
                len: 6,
                max: 5
            })
        );
        assert_eq!(
            l.check(&msg(1).with_header("aaaa", "12345").with_header("bbbb", "1")),
            Err(MessageError::HeadersTooLarge { size: 14, max: 12 })
        );
    }

    #[test]
    fn defaults_fit_trace_context_and_refuse_the_oversized() {
        let d = MessageLimits::default();
        let traced = msg(1000).with_trace_context(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            Some("vendor=x".repeat(60)),
        );
        assert_eq!(d.check(&traced), Ok(()));
        assert!(matches!(
            d.check(&msg(4 * 1024 * 1024 + 1)),
            Err(MessageError::PayloadTooLarge { .. })
        ));
        let e = d.check(&msg(4 * 1024 * 1024 + 1)).unwrap_err().to_string();
        assert!(
            e.contains("max_payload_bytes") && e.contains("4194304"),
            "{e}"
        );
    }

    #[test]
    fn deserialises_with_defaults_and_refuses_unknown_keys() {
        let l: MessageLimits = serde_json::from_str(r#"{"max_headers": 3}"#).unwrap();
        assert_eq!(l.max_headers, 3);
        assert_eq!(
            l.max_payload_bytes,
            MessageLimits::default().max_payload_bytes
        );
        assert!(serde_json::from_str::<MessageLimits>(r#"{"max_header": 3}"#).is_err());
    }
}
