//! The type-erased transport, delivery source and delivery the [`Registry`](super::Registry)
//! hands out: they implement the same traits as the concrete ones, so the engines run on them
//! unchanged; the cost is one boxed future per publish or delivery operation.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::consumer::{Delivery, DeliverySource, RawMessage, SourceError};
use crate::message::OutboxMessage;
use crate::transport::{PublishError, PublishReceipt, Transport};
use crate::wire::{DecodeError, EventIdentity, IncomingEvent};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A boxed, sendable stream.
pub type BoxStream<'a, T> = Pin<Box<dyn futures::Stream<Item = T> + Send + 'a>>;

trait DynTransport: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn publish<'a>(
        &'a self,
        message: &'a OutboxMessage,
    ) -> BoxFuture<'a, Result<PublishReceipt, PublishError>>;
    fn ordered_pipelining(&self) -> bool;
    fn publish_run<'a>(
        &'a self,
        run: &'a [OutboxMessage],
    ) -> BoxStream<'a, Result<PublishReceipt, PublishError>>;
}

impl<T: Transport> DynTransport for T {
    fn name(&self) -> &'static str {
        Transport::name(self)
    }
    fn publish<'a>(
        &'a self,
        message: &'a OutboxMessage,
    ) -> BoxFuture<'a, Result<PublishReceipt, PublishError>> {
        Box::pin(Transport::publish(self, message))
    }
    fn ordered_pipelining(&self) -> bool {
        Transport::ordered_pipelining(self)
    }
    fn publish_run<'a>(
        &'a self,
        run: &'a [OutboxMessage],
    ) -> BoxStream<'a, Result<PublishReceipt, PublishError>> {
        Box::pin(Transport::publish_run(self, run))
    }
}

/// Any [`Transport`], chosen at runtime.
pub struct BoxTransport(Box<dyn DynTransport>);

impl BoxTransport {
    /// Erases `transport`'s type.
    pub fn new<T: Transport>(transport: T) -> Self {
        Self(Box::new(transport))
    }
}

impl std::fmt::Debug for BoxTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BoxTransport").field(&self.0.name()).finish()
    }
}

impl Transport for BoxTransport {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        self.0.publish(message).await
    }

    fn ordered_pipelining(&self) -> bool {
        self.0.ordered_pipelining()
    }

    fn publish_run<'a>(
        &'a self,
        run: &'a [OutboxMessage],
    ) -> impl futures::Stream<Item = Result<PublishReceipt, PublishError>> + Send + 'a {
        self.0.publish_run(run)
    }
}

trait DynDelivery: Send + Sync + 'static {
    fn event(&self) -> &Result<IncomingEvent, DecodeError>;
    fn raw(&self) -> &RawMessage;
    fn delivery_count(&self) -> Option<u32>;
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>>;
    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>>;
}

impl<D: Delivery> DynDelivery for D {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        Delivery::event(self)
    }
    fn raw(&self) -> &RawMessage {
        Delivery::raw(self)
    }
    fn delivery_count(&self) -> Option<u32> {
        Delivery::delivery_count(self)
    }
    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(Delivery::ack(*self))
    }
    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), SourceError>> {
        Box::pin(Delivery::nack(*self, delay))
    }
}

/// A delivery of a [`BoxSource`].
pub struct BoxDelivery(Box<dyn DynDelivery>);

impl Delivery for BoxDelivery {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        self.0.event()
    }
    fn raw(&self) -> &RawMessage {
        self.0.raw()
    }
    fn delivery_count(&self) -> Option<u32> {
        self.0.delivery_count()
    }
    async fn ack(self) -> Result<(), SourceError> {
        self.0.ack().await
    }
    async fn nack(self, delay: Duration) -> Result<(), SourceError> {
        self.0.nack(delay).await
    }
}

trait DynSource: Send + Sync + 'static {
    fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> BoxFuture<'_, Result<Vec<BoxDelivery>, SourceError>>;
    fn lag(&mut self) -> BoxFuture<'_, Result<Option<u64>, SourceError>>;
    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError>;
    fn identify(&self, raw: &RawMessage) -> EventIdentity;
    fn release(&mut self) -> BoxFuture<'_, ()>;
}

impl<S: DeliverySource + Sync> DynSource for S {
    fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> BoxFuture<'_, Result<Vec<BoxDelivery>, SourceError>> {
        Box::pin(async move {
            let batch = DeliverySource::next_batch(self, max, wait).await?;
            Ok(batch
                .into_iter()
                .map(|d| BoxDelivery(Box::new(d)))
                .collect())
        })
    }
    fn lag(&mut self) -> BoxFuture<'_, Result<Option<u64>, SourceError>> {
        Box::pin(DeliverySource::lag(self))
    }
    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        DeliverySource::decode(self, raw)
    }
    fn identify(&self, raw: &RawMessage) -> EventIdentity {
        DeliverySource::identify(self, raw)
    }
    fn release(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(DeliverySource::release(self))
    }
}

/// Any [`DeliverySource`], chosen at runtime.
pub struct BoxSource(Box<dyn DynSource>);

impl BoxSource {
    /// Erases `source`'s type. The source must be `Sync` (the consumer engine shares it across
    /// the futures of one batch).
    pub fn new<S: DeliverySource + Sync>(source: S) -> Self {
        Self(Box::new(source))
    }
}

impl std::fmt::Debug for BoxSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BoxSource")
    }
}

impl DeliverySource for BoxSource {
    type Delivery = BoxDelivery;

    async fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<BoxDelivery>, SourceError> {
        self.0.next_batch(max, wait).await
    }

    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        self.0.lag().await
    }

    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        self.0.decode(raw)
    }

    fn identify(&self, raw: &RawMessage) -> EventIdentity {
        self.0.identify(raw)
    }

    async fn release(&mut self) {
        self.0.release().await;
    }
}
