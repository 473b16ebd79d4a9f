//! The ack-first source: the mistake "acknowledge before commit" (guarantee G6), built on
//! purpose so the crash matrix can show that it detects it. Only `outbox demo-consumer` with
//! `OUTBOX_TEST_ACK_BEFORE_COMMIT=1` (a test tool of the `harness` build) selects it.

use outbox_core::broker::BoxSource;
use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceError};
use outbox_core::{DecodeError, IncomingEvent};

/// Test-only source that acknowledges every delivery the moment it arrives, before the consumer
/// has even begun its transaction: the mistake "ack before commit" (guarantee G6), built on purpose
/// so the crash matrix can show that it detects it. Only `OUTBOX_TEST_ACK_BEFORE_COMMIT=1` selects it.
pub struct AckFirstSource(pub BoxSource);

/// A delivery whose broker acknowledgement was already sent; its own ack and nack do nothing.
pub struct AckedDelivery {
    event: Result<IncomingEvent, DecodeError>,
    raw: RawMessage,
    count: Option<u32>,
}

impl Delivery for AckedDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        &self.event
    }
    fn raw(&self) -> &RawMessage {
        &self.raw
    }
    fn delivery_count(&self) -> Option<u32> {
        self.count
    }
    async fn ack(self) -> Result<(), SourceError> {
        Ok(())
    }
    async fn nack(self, _delay: std::time::Duration) -> Result<(), SourceError> {
        Ok(())
    }
}

impl DeliverySource for AckFirstSource {
    type Delivery = AckedDelivery;
    async fn next_batch(
        &mut self,
        max: usize,
        wait: std::time::Duration,
    ) -> Result<Vec<AckedDelivery>, SourceError> {
        let mut out = Vec::new();
        for d in self.0.next_batch(max, wait).await? {
            let acked = AckedDelivery {
                event: d.event().clone(),
                raw: d.raw().clone(),
                count: d.delivery_count(),
            };
            d.ack().await?;
            out.push(acked);
        }
        Ok(out)
    }
    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        self.0.lag().await
    }
    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        self.0.decode(raw)
    }
    fn identify(&self, raw: &RawMessage) -> outbox_core::EventIdentity {
        self.0.identify(raw)
    }
    async fn release(&mut self) {
        self.0.release().await;
    }
}
