//! [`FakeSource`]: a queue of deliveries with redelivery on nack or drop, and the wire form
//! it carries.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceError, SourceErrorKind};
use outbox_core::{
    DecodeError, EventIdentity, Fingerprint, IncomingEvent, OutboxMessage, Payload, wire,
};
use uuid::Uuid;

use super::lock;

/// The wire form of `m` as the fake source carries it: CloudEvents attributes as `ce-<name>`
/// headers, the payload as the body.
pub fn wire_message(m: &OutboxMessage) -> RawMessage {
    let mut headers: BTreeMap<String, String> = wire::attributes(m, "/test")
        .into_iter()
        .map(|(k, v)| (format!("ce-{k}"), v))
        .collect();
    for (k, v) in &m.headers {
        headers.insert(k.clone(), v.clone());
    }
    RawMessage {
        payload: m.payload.bytes.clone(),
        headers,
        content_type: Some(m.payload.content_type.0.clone()),
        ..RawMessage::default()
    }
}

/// An event `event_id` of aggregate `payment/aggregate_id` at `version` with a JSON `body`, as a
/// stored row would carry it.
pub fn event_message(
    event_id: Uuid,
    aggregate_id: &str,
    version: i64,
    body: &str,
) -> OutboxMessage {
    OutboxMessage {
        id: 0,
        event_id,
        aggregate_type: "payment".into(),
        aggregate_id: aggregate_id.into(),
        aggregate_version: version,
        event_type: "PaymentCreated".into(),
        schema_version: 1,
        payload: Payload::bytes("application/json", Bytes::from(body.to_owned())),
        fingerprint: Fingerprint::of(body.as_bytes()),
        headers: BTreeMap::new(),
        destination: None,
        partition_key: None,
        created_at: chrono::Utc::now(),
        attempts: 0,
    }
}

/// A `ce-` attribute of what [`wire_message`] wrote.
fn wire_attribute(raw: &RawMessage, name: &str) -> Option<String> {
    raw.headers.get(&format!("ce-{name}")).cloned()
}

/// Decodes what [`wire_message`] wrote, with a 1 MiB body limit.
pub fn decode_wire(raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
    wire::decode(
        |n| wire_attribute(raw, n),
        raw.content_type.clone(),
        raw.payload.clone(),
        BTreeMap::new(),
        1 << 20,
    )
}

#[derive(Debug, Default)]
struct Queue {
    ready: VecDeque<(RawMessage, u32)>,
    acked: usize,
    nacked: usize,
    unsettled: usize,
    /// Deliveries say nothing about their count (a broker that cannot tell).
    uncounted: bool,
    /// How long an ack takes (a broker's confirmation round trip).
    ack_delay: Option<Duration>,
    /// The most deliveries still unsettled when a batch was asked for.
    unsettled_at_fetch: usize,
    /// Calls of [`DeliverySource::release`].
    releases: usize,
    /// The most deliveries still unsettled when the source was released.
    unsettled_at_release: usize,
    /// Reads still to fail ([`FakeSource::fail_reads`]), with the error's text.
    failing_reads: Option<(u32, String)>,
}

/// A fake broker queue: [`FakeSource::push`] adds messages; a nack puts a delivery back with its
/// count + 1 (the delay is not waited for), a delivery dropped without ack or nack comes back
/// the same way (a crashed consumer's unacknowledged message).
#[derive(Debug, Clone, Default)]
pub struct FakeSource {
    queue: Arc<Mutex<Queue>>,
}

impl FakeSource {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty queue whose deliveries do not tell their count
    /// ([`Delivery::delivery_count`] is `None`), as a broker without one.
    pub fn without_counts() -> Self {
        let source = Self::default();
        lock(&source.queue).uncounted = true;
        source
    }

    /// An empty queue whose acks each take `delay` before they count (a broker confirming
    /// them over the network).
    pub fn with_ack_delay(delay: Duration) -> Self {
        let source = Self::default();
        lock(&source.queue).ack_delay = Some(delay);
        source
    }

    /// The most deliveries that were handed out and still unsettled when a batch was asked
    /// for: above zero when the consumer took a batch while the acks of the one before were
    /// still on their way.
    pub fn unsettled_at_fetch(&self) -> usize {
        lock(&self.queue).unsettled_at_fetch
    }

    /// Makes the next `n` reads ([`DeliverySource::next_batch`]) fail as a broker outage
    /// saying `message`.
    pub fn fail_reads(&self, n: u32, message: &str) {
        lock(&self.queue).failing_reads = Some((n, message.to_owned()));
    }

    /// Adds a message at the end of the queue (first delivery).
    pub fn push(&self, raw: RawMessage) {
        lock(&self.queue).ready.push_back((raw, 1));
    }

    /// Adds the wire form of `m`.
    pub fn push_message(&self, m: &OutboxMessage) {
        self.push(wire_message(m));
    }

    /// Acknowledged deliveries so far.
    pub fn acked(&self) -> usize {
        lock(&self.queue).acked
    }

    /// Negative acknowledgements so far.
    pub fn nacked(&self) -> usize {
        lock(&self.queue).nacked
    }

    /// Messages waiting to be delivered (not counting deliveries handed out and unsettled).
    pub fn ready(&self) -> usize {
        lock(&self.queue).ready.len()
    }

    /// Deliveries handed out and neither acknowledged, nor negatively acknowledged, nor dropped.
    pub fn unsettled(&self) -> usize {
        lock(&self.queue).unsettled
    }

    /// How many times [`DeliverySource::release`] was called (the fake holds nothing ahead,
    /// so it only counts them).
    pub fn releases(&self) -> usize {
        lock(&self.queue).releases
    }

    /// The most deliveries handed out and still unsettled when the source was released: 0
    /// when every release came after the batches before it were settled.
    pub fn unsettled_at_release(&self) -> usize {
        lock(&self.queue).unsettled_at_release
    }
}

/// A delivery of the [`FakeSource`].
#[derive(Debug)]
pub struct FakeDelivery {
    raw: RawMessage,
    event: Result<IncomingEvent, DecodeError>,
    count: u32,
    queue: Arc<Mutex<Queue>>,
    settled: bool,
}

impl Drop for FakeDelivery {
    fn drop(&mut self) {
        if !self.settled {
            let mut q = lock(&self.queue);
            q.unsettled -= 1;
            q.ready.push_back((self.raw.clone(), self.count + 1));
        }
    }
}

impl Delivery for FakeDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        &self.event
    }
    fn raw(&self) -> &RawMessage {
        &self.raw
    }
    fn delivery_count(&self) -> Option<u32> {
        (!lock(&self.queue).uncounted).then_some(self.count)
    }
    async fn ack(mut self) -> Result<(), SourceError> {
        let delay = lock(&self.queue).ack_delay;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        self.settled = true;
        let mut q = lock(&self.queue);
        q.unsettled -= 1;
        q.acked += 1;
        Ok(())
    }
    async fn nack(mut self, _delay: Duration) -> Result<(), SourceError> {
        self.settled = true;
        let mut q = lock(&self.queue);
        q.unsettled -= 1;
        q.nacked += 1;
        q.ready.push_back((self.raw.clone(), self.count + 1));
        Ok(())
    }
}

impl DeliverySource for FakeSource {
    type Delivery = FakeDelivery;

    async fn next_batch(
        &mut self,
        max: usize,
        _wait: Duration,
    ) -> Result<Vec<FakeDelivery>, SourceError> {
        let mut q = lock(&self.queue);
        if let Some((n, message)) = q.failing_reads.take() {
            if n > 1 {
                q.failing_reads = Some((n - 1, message.clone()));
            }
            if n > 0 {
                return Err(SourceError::new(SourceErrorKind::Unavailable, message));
            }
        }
        q.unsettled_at_fetch = q.unsettled_at_fetch.max(q.unsettled);
        let mut out = Vec::new();
        while out.len() < max {
            let Some((raw, count)) = q.ready.pop_front() else {
                break;
            };
            q.unsettled += 1;
            out.push(FakeDelivery {
                event: decode_wire(&raw),
                raw,
                count,
                queue: Arc::clone(&self.queue),
                settled: false,
            });
        }
        Ok(out)
    }

    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        let q = lock(&self.queue);
        Ok(Some((q.ready.len() + q.unsettled) as u64))
    }

    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        decode_wire(raw)
    }

    fn identify(&self, raw: &RawMessage) -> EventIdentity {
        wire::identify(|n| wire_attribute(raw, n))
    }

    async fn release(&mut self) {
        let mut q = lock(&self.queue);
        q.releases += 1;
        q.unsettled_at_release = q.unsettled_at_release.max(q.unsettled);
    }
}
