//! A [`DeliverySource`] that shows what passes through another one: each fetch and each
//! delivery's settlement, handed to a [`Tap`]. The benchmarks time a consumer's phases with it,
//! tests record which events were delivered, acknowledged and refused; neither rewrites the
//! forwarding of every source and delivery method to do so.
//!
//! A tap only watches: the inner source's batches, events, raw messages, delivery counts and
//! the outcome of every ack and nack pass through unchanged.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::consumer::{Delivery, DeliverySource, RawMessage, SourceError};
use outbox_core::{DecodeError, EventIdentity, IncomingEvent};

/// What a [`Tapped`] source tells. Every hook but [`Tap::fetched`] has a default that does
/// nothing.
pub trait Tap: Send + Sync + 'static {
    /// What a delivery carries from its batch to its settlement (a batch number, a key).
    type Mark: Send + Sync + 'static;

    /// Called before each `next_batch` of the inner source.
    fn fetching(&self) {}

    /// Called after a `next_batch` that returned `batch` (possibly empty), which began at
    /// `started`: one mark per delivery, in order. A failed fetch is not shown.
    fn fetched<D: Delivery>(&self, started: Instant, batch: &[D]) -> Vec<Self::Mark>;

    /// Called just before the delivery `delivery` of `mark` is acknowledged.
    fn acking<D: Delivery>(&self, _mark: &Self::Mark, _delivery: &D) {}

    /// Called once the acknowledgement of `mark` returned `result`; `took` runs from just
    /// before [`Tap::acking`] (so it includes that hook's own work) to the inner ack's return.
    fn acked(&self, _mark: Self::Mark, _took: Duration, _result: &Result<(), SourceError>) {}

    /// Called just before the delivery of `mark` is refused (`nack`).
    fn nacking(&self, _mark: Self::Mark) {}
}

/// The source `S` with the tap `T` on it.
pub struct Tapped<S, T> {
    inner: S,
    tap: Arc<T>,
}

impl<S: DeliverySource, T: Tap> Tapped<S, T> {
    /// `inner` with `tap` on it.
    pub fn new(inner: S, tap: Arc<T>) -> Self {
        Self { inner, tap }
    }

    /// The tap, to read what it gathered.
    pub fn tap(&self) -> Arc<T> {
        Arc::clone(&self.tap)
    }
}

/// A delivery of a [`Tapped`] source.
pub struct TappedDelivery<D, T: Tap> {
    inner: D,
    tap: Arc<T>,
    mark: T::Mark,
}

impl<S: DeliverySource, T: Tap> DeliverySource for Tapped<S, T> {
    type Delivery = TappedDelivery<S::Delivery, T>;

    async fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Self::Delivery>, SourceError> {
        self.tap.fetching();
        let started = Instant::now();
        let batch = self.inner.next_batch(max, wait).await?;
        let marks = self.tap.fetched(started, &batch);
        assert_eq!(marks.len(), batch.len(), "a tap marks every delivery");
        Ok(batch
            .into_iter()
            .zip(marks)
            .map(|(inner, mark)| TappedDelivery {
                inner,
                tap: Arc::clone(&self.tap),
                mark,
            })
            .collect())
    }

    async fn lag(&mut self) -> Result<Option<u64>, SourceError> {
        self.inner.lag().await
    }

    fn decode(&self, raw: &RawMessage) -> Result<IncomingEvent, DecodeError> {
        self.inner.decode(raw)
    }

    fn identify(&self, raw: &RawMessage) -> EventIdentity {
        self.inner.identify(raw)
    }

    async fn release(&mut self) {
        self.inner.release().await;
    }
}

impl<D: Delivery, T: Tap> Delivery for TappedDelivery<D, T> {
    fn event(&self) -> &Result<IncomingEvent, DecodeError> {
        self.inner.event()
    }

    fn raw(&self) -> &RawMessage {
        self.inner.raw()
    }

    fn delivery_count(&self) -> Option<u32> {
        self.inner.delivery_count()
    }

    async fn ack(self) -> Result<(), SourceError> {
        let Self { inner, tap, mark } = self;
        let started = Instant::now();
        tap.acking(&mark, &inner);
        let result = inner.ack().await;
        tap.acked(mark, started.elapsed(), &result);
        result
    }

    async fn nack(self, delay: Duration) -> Result<(), SourceError> {
        let Self { inner, tap, mark } = self;
        tap.nacking(mark);
        inner.nack(delay).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::fakes::FakeSource;

    /// Records every hook call by the event's aggregate id.
    #[derive(Default)]
    struct Calls(Mutex<Vec<String>>);

    impl Tap for Calls {
        type Mark = String;
        fn fetching(&self) {
            self.0.lock().unwrap().push("fetching".into());
        }
        fn fetched<D: Delivery>(&self, _started: Instant, batch: &[D]) -> Vec<String> {
            let ids: Vec<String> = batch
                .iter()
                .map(|d| d.event().as_ref().unwrap().aggregate_id.clone())
                .collect();
            self.0.lock().unwrap().push(format!("fetched {ids:?}"));
            ids
        }
        fn acking<D: Delivery>(&self, mark: &String, _delivery: &D) {
            self.0.lock().unwrap().push(format!("acking {mark}"));
        }
        fn acked(&self, mark: String, _took: Duration, result: &Result<(), SourceError>) {
            let ok = result.is_ok();
            self.0.lock().unwrap().push(format!("acked {mark} {ok}"));
        }
        fn nacking(&self, mark: String) {
            self.0.lock().unwrap().push(format!("nacking {mark}"));
        }
    }

    #[tokio::test]
    async fn every_fetch_and_settlement_reaches_the_tap_and_passes_through() {
        let fake = FakeSource::new();
        fake.push_message(&crate::message::event("a", 1, "{}"));
        fake.push_message(&crate::message::event("b", 1, "{}"));
        let calls = Arc::new(Calls::default());
        let mut source = Tapped::new(fake.clone(), Arc::clone(&calls));
        let mut batch = source
            .next_batch(10, Duration::from_millis(10))
            .await
            .unwrap();
        assert_eq!(batch.len(), 2);
        let b = batch.pop().unwrap();
        let a = batch.pop().unwrap();
        assert_eq!(a.event().as_ref().unwrap().aggregate_id, "a");
        a.ack().await.unwrap();
        b.nack(Duration::ZERO).await.unwrap();
        assert_eq!(
            *calls.0.lock().unwrap(),
            [
                "fetching",
                r#"fetched ["a", "b"]"#,
                "acking a",
                "acked a true",
                "nacking b"
            ]
        );
        assert_eq!(fake.acked(), 1, "the ack reached the inner source");
        assert_eq!(fake.nacked(), 1, "the nack reached the inner source");
    }
}
