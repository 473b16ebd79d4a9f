//! The broker side of a consumer: one trait pair every transport implements, so the inbox
//! runner (in the store crate) works the same over every broker.
//!
//! # Contract (checked by each transport's tests)
//!
//! * A [`Delivery`] is acknowledged only by [`Delivery::ack`], which the runner calls after
//!   the inbox + effect transaction committed. Dropping a delivery without ack or nack must
//!   leave it to be redelivered (by the broker's own rule: an ack wait expiring, the channel
//!   closing).
//! * [`Delivery::nack`] asks for a redelivery after `delay` where the broker supports a delay
//!   (a negative acknowledgement that carries a delay); otherwise the transport requeues it
//!   after waiting, bounded.
//! * [`Delivery::event`] is the decoded wire format, or why the message is malformed; a
//!   malformed message is still a delivery (the runner dead-letters it, then acks it).
//! * [`Delivery::raw`] is the message as received, everything the transport could read: the
//!   body, every header (values that are not UTF-8 text byte for byte, in
//!   [`RawMessage::binary_headers`]), the content type, and the broker's metadata. A dead
//!   letter keeps all of it.
//! * [`DeliverySource::decode`] decodes a stored [`RawMessage`] exactly as a live delivery
//!   would be decoded, so a requeued consumer dead letter is processed like the original.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;

use crate::wire::{DecodeError, EventIdentity, IncomingEvent};

/// A message as received, kept for dead letters: the body, every protocol header, the content
/// type, and what the broker said about the delivery.
///
/// Nothing here is trusted: any field may hold control characters, NUL included, or be of any
/// length the broker let through. A store keeps it byte for byte (see
/// [`InboxStore::consumer_dead_letter_insert`](super::InboxStore::consumer_dead_letter_insert)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawMessage {
    /// The body.
    pub payload: Bytes,
    /// Every header whose value is UTF-8 text, protocol names (e.g. `ce-id`, `cloudEvents_id`),
    /// values as received.
    pub headers: BTreeMap<String, String>,
    /// The protocol's content type, if any.
    pub content_type: Option<String>,
    /// Every header whose value is *not* valid UTF-8, byte for byte (a protocol's header value
    /// may carry any bytes), and every header whose *name* is not (a protocol's header name may
    /// be bytes on the wire), under the key [`RawMessage::header_key`] gives its name. A header
    /// is either here or in `headers`, never in both; a decoder refuses a CloudEvents attribute
    /// found here.
    pub binary_headers: BTreeMap<String, Bytes>,
    /// What the broker said about the delivery (subject or routing key, stream or exchange,
    /// sequences, message properties), for the operator reading a dead letter.
    /// Never decoded.
    pub metadata: BTreeMap<String, String>,
}

/// Starts the key of a header whose name is not kept as it is (see [`RawMessage::header_key`]).
/// Chosen because a header name can hardly hold it (a client library that reads names as C
/// strings cannot); a name that does start with it is escaped like any other, so keys stay
/// lossless.
pub const HEADER_KEY_ESCAPE: char = '\0';

impl RawMessage {
    /// A binding's first check: [`DecodeError::TooLarge`] when the body is over `max_bytes`
    /// (before any header is looked at, so an oversize message is refused as such).
    ///
    /// # Errors
    /// [`DecodeError::TooLarge`] with the body's size and the bound.
    pub fn check_size(&self, max_bytes: usize) -> Result<(), DecodeError> {
        if self.payload.len() > max_bytes {
            return Err(DecodeError::TooLarge {
                size: self.payload.len(),
                max: max_bytes,
            });
        }
        Ok(())
    }

    /// The last step of a binding's decode, once its own checks passed: the content type (the
    /// protocol's, else the header `content_type_header`; empty counts as none), the user
    /// headers ([`RawMessage::user_headers`] without the names `protocol` reserves), and
    /// [`crate::wire::decode`] with the CloudEvents attributes `attribute` reads.
    ///
    /// # Errors
    /// [`crate::wire::decode`]'s [`DecodeError`]s.
    pub fn decode_binary(
        &self,
        attribute: impl Fn(&'static str) -> Option<String>,
        content_type_header: &str,
        protocol: &crate::ReservedHeaders,
        max_bytes: usize,
    ) -> Result<IncomingEvent, DecodeError> {
        let content_type = self
            .content_type
            .clone()
            .or_else(|| self.header(content_type_header))
            .filter(|c| !c.trim().is_empty());
        crate::wire::decode(
            attribute,
            content_type,
            self.payload.clone(),
            self.user_headers(protocol),
            max_bytes,
        )
    }

    /// The text header `name`, in any case (`headers`); several matches joined with `, `.
    pub fn header(&self, name: &str) -> Option<String> {
        crate::wire::header_ci(&self.headers, name)
    }

    /// The first CloudEvents attribute (`{prefix}{attribute}`, in any case) whose value is not
    /// UTF-8 text ([`RawMessage::binary_headers`]): a decoder refuses the message, naming it
    /// with its value's excerpt (`not UTF-8 text: …`).
    pub fn binary_attribute(&self, prefix: &str) -> Option<DecodeError> {
        crate::wire::attr::ALL.iter().find_map(|&name| {
            let header = format!("{prefix}{name}");
            self.binary_headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(&header))
                .map(|(_, value)| DecodeError::Invalid {
                    name,
                    value: crate::wire::not_text(value),
                })
        })
    }

    /// The headers a decoder hands to the application: every text header, and every binary
    /// one with U+FFFD for the bytes that are not UTF-8 (its bytes stay in this message), but
    /// the names `protocol` reserves (the binding's own).
    pub fn user_headers(&self, protocol: &crate::ReservedHeaders) -> BTreeMap<String, String> {
        let binary_as_text = self
            .binary_headers
            .iter()
            .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()));
        self.headers
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .chain(binary_as_text)
            .filter(|(name, _)| !protocol.reserves(name))
            .collect()
    }

    /// The key under which the header named `name` (bytes, as the broker gave them) is kept in
    /// [`RawMessage::headers`] or [`RawMessage::binary_headers`]: the name itself when it is
    /// UTF-8 text not starting with [`HEADER_KEY_ESCAPE`] (every name but hostile ones);
    /// otherwise [`HEADER_KEY_ESCAPE`] followed by the name with each byte that is not UTF-8,
    /// and each `%`, written `%XX` (upper-case hex). Lossless:
    /// [`RawMessage::header_name`] gives the bytes back, so a store keeps the exact name.
    pub fn header_key(name: &[u8]) -> Cow<'_, str> {
        match std::str::from_utf8(name) {
            Ok(text) if !text.starts_with(HEADER_KEY_ESCAPE) => Cow::Borrowed(text),
            _ => {
                let mut key = String::with_capacity(name.len() * 3 + 1);
                key.push(HEADER_KEY_ESCAPE);
                for chunk in name.utf8_chunks() {
                    for c in chunk.valid().chars() {
                        if c == '%' {
                            key.push_str("%25");
                        } else {
                            key.push(c);
                        }
                    }
                    for b in chunk.invalid() {
                        key.push_str(&format!("%{b:02X}"));
                    }
                }
                Cow::Owned(key)
            }
        }
    }

    /// The header name, as bytes, kept under `key`: the inverse of [`RawMessage::header_key`].
    /// A key that `header_key` cannot have made is its own name.
    pub fn header_name(key: &str) -> Cow<'_, [u8]> {
        let Some(escaped) = key.strip_prefix(HEADER_KEY_ESCAPE) else {
            return Cow::Borrowed(key.as_bytes());
        };
        let bytes = escaped.as_bytes();
        let mut name = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' {
                let Some(b) = bytes
                    .get(i + 1..i + 3)
                    .and_then(|hex| std::str::from_utf8(hex).ok())
                    .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                else {
                    return Cow::Borrowed(key.as_bytes());
                };
                name.push(b);
                i += 3;
            } else {
                name.push(bytes[i]);
                i += 1;
            }
        }
        if Self::header_key(&name) == key {
            Cow::Owned(name)
        } else {
            Cow::Borrowed(key.as_bytes())
        }
    }
}

/// Why the broker side failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct SourceError {
    /// The kind.
    pub kind: SourceErrorKind,
    /// Details.
    pub message: String,
}

/// Kinds of [`SourceError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceErrorKind {
    /// Connection lost or broker down: wait and retry.
    Unavailable,
    /// Anything else (missing stream/queue, permissions).
    Other,
}

impl SourceError {
    /// Builds an error.
    pub fn new(kind: SourceErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// One message delivered to a consumer.
pub trait Delivery: Send + Sync + 'static {
    /// The decoded event, or why it is malformed.
    fn event(&self) -> &Result<IncomingEvent, DecodeError>;

    /// The message as received.
    fn raw(&self) -> &RawMessage;

    /// How many times this message was delivered (1 = first), when the broker or transport
    /// can tell.
    fn delivery_count(&self) -> Option<u32>;

    /// Acknowledges: the broker will not deliver it again.
    ///
    /// # Errors
    /// [`SourceError`]; the message will then be redelivered and absorbed by the inbox.
    fn ack(self) -> impl Future<Output = Result<(), SourceError>> + Send;

    /// Negative acknowledgement: deliver again after `delay`.
    ///
    /// # Errors
    /// [`SourceError`]; the message will be redelivered after the broker's ack wait anyway.
    fn nack(self, delay: Duration) -> impl Future<Output = Result<(), SourceError>> + Send;
}

/// Where a consumer's deliveries come from (a durable consumer of a stream, a queue, a member
/// of a consumer group).
pub trait DeliverySource: Send + 'static {
    /// The delivery type.
    type Delivery: Delivery;

    /// Up to `max` deliveries; waits at most `wait` for the first and returns an empty batch
    /// when none came.
    ///
    /// # Errors
    /// [`SourceError`]; the runner waits and calls again.
    fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<Self::Delivery>, SourceError>> + Send;

    /// Messages waiting for this consumer (not yet delivered or not yet acknowledged), when
    /// the broker can tell: the consumer-lag metric.
    ///
    /// # Errors
    /// [`SourceError`].
    fn lag(&mut self) -> impl Future<Output = Result<Option<u64>, SourceError>> + Send;

    /// Decodes a stored raw message as a live delivery would be decoded.
    ///
    /// # Errors
    /// [`DecodeError`] when it is malformed.
    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError>;

    /// What a stored raw message says about its identity, read attribute by attribute as
    /// [`DeliverySource::decode`] would read them ([`crate::wire::identify`]): for a message
    /// that does not decode, the event id and aggregate its dead letter keeps, so an operator
    /// can find it by the id a producer gives them. (No default: a wrapping source must pass
    /// it on, and a source that cannot read its attributes returns
    /// `EventIdentity::default()`.)
    fn identify(&self, raw: &RawMessage) -> EventIdentity;

    /// Gives back what the source received ahead of the batches it handed out (a source that
    /// prefetches), so the broker delivers it again soon (after a short delay the source chooses)
    /// instead of after its ack wait, and stops asking for more until the next
    /// [`DeliverySource::next_batch`]. The runner calls it when `run` stops, while it is
    /// paused and after an error. Deliveries already handed out are not affected. Best
    /// effort: what cannot be given back comes again after the ack wait, as a dropped delivery
    /// does. Harmless at any time. The default holds nothing ahead and does nothing.
    fn release(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_key_keeps_any_name_losslessly() {
        let names: [&[u8]; 9] = [
            b"traceparent",
            b"ce_id",
            b"100%",
            b"",
            b"\xff\xfe",
            b"ce_\xffid%",
            b"\0starts-with-nul",
            b"caf\xc3\xa9",
            b"\xc3",
        ];
        for name in names {
            let key = RawMessage::header_key(name);
            assert_eq!(
                RawMessage::header_name(&key).as_ref(),
                name,
                "{name:?} as {key:?}"
            );
        }
        // Text names stay as they are; the others are marked and escaped.
        assert_eq!(RawMessage::header_key(b"100%"), "100%");
        assert_eq!(RawMessage::header_key("café".as_bytes()), "café");
        assert_eq!(RawMessage::header_key(b"\xff\xfe"), "\0%FF%FE");
        assert_eq!(RawMessage::header_key(b"ce_\xffid%"), "\0ce_%FFid%25");
        assert_eq!(RawMessage::header_key(b"\0x"), "\0\0x");
    }

    #[test]
    fn a_key_no_escape_made_is_its_own_name() {
        for key in ["\0%4", "\0%zz", "\0%41", "\0+F", "\0%+F", "\0"] {
            assert_eq!(
                RawMessage::header_name(key).as_ref(),
                key.as_bytes(),
                "{key:?}"
            );
        }
    }
}
