//! Counting the deliveries of a message, for the cap of `max_attempts`: the broker's count
//! where it has one, else the engine's own, by digest of the raw message (the last
//! [`LOCAL_COUNT_CAPACITY`] messages, forgotten on restart).

use super::{Consumer, Handler};
use crate::consumer::source::{Delivery, DeliverySource, RawMessage};
use crate::consumer::store::InboxStore;

/// Raw messages whose deliveries the engine counts itself, for sources that cannot tell
/// ([`Delivery::delivery_count`] is `None`).
pub const LOCAL_COUNT_CAPACITY: usize = 10_000;

/// SHA-256 of everything a raw message holds that identifies it: body, headers, content type.
fn digest(raw: &RawMessage) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(&raw.payload);
    for (name, value) in &raw.headers {
        field(name.as_bytes());
        field(value.as_bytes());
    }
    for (name, value) in &raw.binary_headers {
        field(name.as_bytes());
        field(value);
    }
    field(raw.content_type.as_deref().unwrap_or_default().as_bytes());
    h.finalize().into()
}

impl<S: InboxStore, Src: DeliverySource, H: Handler<S::Conn>> Consumer<S, Src, H> {
    /// Deliveries of `d` so far, this one included: the broker's count, else the engine's own.
    pub(super) fn attempts(&self, d: &Src::Delivery) -> u32 {
        if let Some(n) = d.delivery_count() {
            return n.max(1);
        }
        let key = digest(d.raw());
        let mut counts = self.local_counts.lock().unwrap_or_else(|p| p.into_inner());
        if counts.len() >= LOCAL_COUNT_CAPACITY && !counts.contains_key(&key) {
            // Forgetting all is the simple bound; counts of messages still failing restart.
            counts.clear();
        }
        let n = counts.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// Forgets the engine's own count of a delivery that was settled for good.
    pub(super) fn forget(&self, d: &Src::Delivery) {
        if d.delivery_count().is_none() {
            self.local_counts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&digest(d.raw()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_covers_every_part_of_the_message() {
        let raw = RawMessage {
            payload: bytes::Bytes::from_static(b"body"),
            headers: [("a".to_owned(), "1".to_owned())].into(),
            content_type: Some("text/plain".into()),
            ..RawMessage::default()
        };
        let mut other = raw.clone();
        other.headers.insert("a".into(), "2".into());
        let mut binary = raw.clone();
        binary
            .binary_headers
            .insert("b".into(), bytes::Bytes::from_static(&[0xff]));
        let mut typed = raw.clone();
        typed.content_type = None;
        let d = digest(&raw);
        assert_eq!(d, digest(&raw.clone()));
        for changed in [other, binary, typed] {
            assert_ne!(d, digest(&changed));
        }
        let mut metadata = raw.clone();
        metadata.metadata.insert("delivered".into(), "2".into());
        assert_eq!(d, digest(&metadata), "broker metadata changes per delivery");
    }
}
