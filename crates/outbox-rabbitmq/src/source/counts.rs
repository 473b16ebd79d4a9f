//! Delivery counts: how often a [`RabbitSource`](crate::RabbitSource) saw an event, from the
//! quorum queues' [`DELIVERY_COUNT_HEADER`], the `redelivered` flag and its own bounded memory
//! of event ids (see [`crate::source`], "Delivery counts").

use std::collections::{BTreeMap, HashMap};

use lapin::BasicProperties;
use lapin::types::AMQPValue;
use outbox_core::consumer::RawMessage;
use outbox_core::wire;

use crate::binding::CLOUDEVENTS_HEADER_PREFIX;

/// Most event ids whose delivery counts a [`RabbitSource`](crate::RabbitSource) remembers (see
/// [`crate::source`], "Delivery counts").
pub const DELIVERY_COUNT_CAPACITY: usize = 100_000;

/// The quorum-queue header counting previous deliveries.
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";

/// `x-delivery-count` (previous deliveries, quorum queues), when present and numeric.
pub(super) fn previous_deliveries(properties: &BasicProperties) -> Option<u32> {
    let value = properties
        .headers()
        .as_ref()?
        .inner()
        .get(DELIVERY_COUNT_HEADER)?;
    let n: i128 = match value {
        AMQPValue::ShortShortInt(n) => (*n).into(),
        AMQPValue::ShortShortUInt(n) => (*n).into(),
        AMQPValue::ShortInt(n) => (*n).into(),
        AMQPValue::ShortUInt(n) => (*n).into(),
        AMQPValue::LongInt(n) => (*n).into(),
        AMQPValue::LongUInt(n) => (*n).into(),
        AMQPValue::LongLongInt(n) => (*n).into(),
        AMQPValue::Timestamp(n) => (*n).into(),
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes())
            .ok()?
            .trim()
            .parse()
            .ok()?,
        AMQPValue::ShortString(s) => s.as_str().trim().parse().ok()?,
        _ => return None,
    };
    (n >= 0).then(|| u32::try_from(n).unwrap_or(u32::MAX))
}

/// The event id used to track redeliveries: the `cloudEvents_id` header, else `message_id`.
pub(super) fn tracking_key(raw: &RawMessage, properties: &BasicProperties) -> Option<String> {
    raw.headers
        .get(&format!("{CLOUDEVENTS_HEADER_PREFIX}{}", wire::attr::ID))
        .cloned()
        .or_else(|| {
            properties
                .message_id()
                .as_ref()
                .map(|m| m.as_str().to_owned())
        })
        .filter(|k| !k.is_empty())
}

/// Bounded map event id → deliveries seen by this source; oldest entries evicted first.
pub(super) struct DeliveryCounts {
    capacity: usize,
    next_seq: u64,
    by_key: HashMap<String, (u32, u64)>,
    by_age: BTreeMap<u64, String>,
}

impl DeliveryCounts {
    pub(super) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            next_seq: 0,
            by_key: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    /// Records one delivery and returns its count (1 = first).
    pub(super) fn observe(
        &mut self,
        key: Option<&str>,
        redelivered: bool,
        previous: Option<u32>,
    ) -> u32 {
        let from_header = previous.map_or(0, |p| p.saturating_add(1));
        let Some(key) = key else {
            return from_header.max(if redelivered { 2 } else { 1 });
        };
        let tracked = if redelivered {
            self.by_key
                .get(key)
                .map_or(2, |(n, _)| n.saturating_add(1))
                .max(2)
        } else {
            // Not redelivered: a new message (possibly a republish of the same event id).
            1
        };
        let count = tracked.max(from_header);
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some((_, old_seq)) = self.by_key.insert(key.to_owned(), (count, seq)) {
            self.by_age.remove(&old_seq);
        }
        self.by_age.insert(seq, key.to_owned());
        while self.by_key.len() > self.capacity {
            let Some((_, oldest)) = self.by_age.pop_first() else {
                break;
            };
            self.by_key.remove(&oldest);
        }
        count
    }

    /// Forgets an acknowledged event id.
    pub(super) fn forget(&mut self, key: &str) {
        if let Some((_, seq)) = self.by_key.remove(key) {
            self.by_age.remove(&seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use lapin::types::FieldTable;

    use super::*;

    #[test]
    fn the_quorum_header_and_the_event_id_are_read() {
        let mut table = FieldTable::default();
        table.insert("cloudEvents_id".into(), AMQPValue::LongString("e-1".into()));
        table.insert(DELIVERY_COUNT_HEADER.into(), AMQPValue::LongLongInt(2));
        let p = BasicProperties::default()
            .with_headers(table)
            .with_message_id("m-1".into());
        let raw = crate::binding::raw_message(&p, bytes::Bytes::new());
        assert_eq!(previous_deliveries(&p), Some(2));
        assert_eq!(tracking_key(&raw, &p).as_deref(), Some("e-1"));
        let bare = BasicProperties::default().with_message_id("m-1".into());
        let raw = crate::binding::raw_message(&bare, bytes::Bytes::new());
        assert_eq!(previous_deliveries(&bare), None);
        assert_eq!(tracking_key(&raw, &bare).as_deref(), Some("m-1"));
    }

    #[test]
    fn counts_track_redeliveries_bounded() {
        let mut c = DeliveryCounts::new(2);
        assert_eq!(c.observe(Some("a"), false, None), 1);
        assert_eq!(c.observe(Some("a"), true, None), 2);
        assert_eq!(c.observe(Some("a"), true, None), 3);
        // The quorum header wins when it says more.
        assert_eq!(c.observe(Some("a"), true, Some(9)), 10);
        // A fresh (not redelivered) copy of the same id starts again.
        assert_eq!(c.observe(Some("a"), false, None), 1);
        // Unknown to the map but redelivered: at least 2.
        assert_eq!(c.observe(Some("b"), true, None), 2);
        assert_eq!(c.observe(None, true, None), 2);
        assert_eq!(c.observe(None, false, None), 1);
        assert_eq!(c.observe(None, true, Some(4)), 5);
        // Capacity 2: "a" is the oldest and is evicted by "c".
        assert_eq!(c.observe(Some("c"), false, None), 1);
        assert_eq!(c.by_key.len(), 2);
        assert_eq!(c.by_age.len(), 2);
        assert_eq!(c.observe(Some("a"), true, None), 2);
        c.forget("a");
        c.forget("zzz");
        assert!(!c.by_key.contains_key("a"));
        assert_eq!(c.by_key.len(), c.by_age.len());
    }
}
