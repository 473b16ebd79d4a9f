//! [`FakeTransport`]: a broker that acknowledges, fails as scripted, and records what it
//! accepted.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use outbox_core::{OutboxMessage, PublishError, PublishErrorKind, PublishReceipt, Transport};

use super::lock;

/// A fake broker: acknowledges every publish (recording it) unless a failure is scripted for
/// the message's `(aggregate_id, version)`.
#[derive(Debug, Default)]
pub struct FakeTransport {
    acked: Mutex<Vec<OutboxMessage>>,
    fail: Mutex<HashMap<(String, i64), (PublishErrorKind, u32)>>,
    delay: Duration,
    /// `Some(window)`: declares ordered pipelining and takes at most `window` messages of a run
    /// at once (see [`FakeTransport::pipelined`]).
    pipeline: Option<usize>,
    /// The length of every run handed over by [`Transport::publish_run`].
    runs: Mutex<Vec<usize>>,
}

impl FakeTransport {
    /// A broker that acknowledges everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// A broker that takes `delay` for every publish.
    pub fn with_delay(delay: Duration) -> Self {
        Self {
            delay,
            ..Self::default()
        }
    }

    /// A broker with ordered pipelining: [`Transport::publish_run`] takes up to `window`
    /// messages of a run at once (one `delay` for all of them) and stores them as a gap-less
    /// prefix: a scripted failure stores nothing from that message on, like Kafka's idempotent
    /// producer with the gap-less guarantee.
    pub fn pipelined(window: usize) -> Self {
        Self {
            pipeline: Some(window),
            ..Self::default()
        }
    }

    /// [`FakeTransport::pipelined`] taking `delay` for every run.
    pub fn pipelined_with_delay(window: usize, delay: Duration) -> Self {
        Self {
            delay,
            ..Self::pipelined(window)
        }
    }

    /// The length of every run handed over at once, in order (pipelined brokers only).
    pub fn runs(&self) -> Vec<usize> {
        lock(&self.runs).clone()
    }

    /// Makes the next `times` publishes of `(aggregate_id, version)` fail with `kind`.
    pub fn fail(
        self,
        aggregate_id: &str,
        version: i64,
        kind: PublishErrorKind,
        times: u32,
    ) -> Self {
        lock(&self.fail).insert((aggregate_id.to_owned(), version), (kind, times));
        self
    }

    /// Versions of `aggregate_id` acknowledged, in acknowledgement order.
    pub fn acked_for(&self, aggregate_id: &str) -> Vec<i64> {
        lock(&self.acked)
            .iter()
            .filter(|m| m.aggregate_id == aggregate_id)
            .map(|m| m.aggregate_version)
            .collect()
    }

    /// Every acknowledged message, in order.
    pub fn acked(&self) -> Vec<OutboxMessage> {
        lock(&self.acked).clone()
    }
}

impl Transport for FakeTransport {
    fn name(&self) -> &'static str {
        "fake"
    }

    async fn publish(&self, m: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.store(m)
    }

    fn ordered_pipelining(&self) -> bool {
        self.pipeline.is_some()
    }

    fn publish_run<'a>(
        &'a self,
        run: &'a [OutboxMessage],
    ) -> impl futures::Stream<Item = Result<PublishReceipt, PublishError>> + Send + 'a {
        use futures::StreamExt as _;
        let taken = &run[..run.len().min(self.pipeline.unwrap_or(1))];
        lock(&self.runs).push(taken.len());
        futures::stream::once(async move {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            let mut results = Vec::with_capacity(taken.len());
            for m in taken {
                let r = self.store(m);
                let failed = r.is_err();
                results.push(r);
                if failed {
                    break;
                }
            }
            futures::stream::iter(results)
        })
        .flatten()
    }
}

impl FakeTransport {
    /// Stores `m` unless a failure is scripted for it.
    fn store(&self, m: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        let key = (m.aggregate_id.clone(), m.aggregate_version);
        if let Some((kind, left)) = lock(&self.fail).get_mut(&key)
            && *left > 0
        {
            *left -= 1;
            return Err(PublishError::new(*kind, "scripted failure"));
        }
        let mut acked = lock(&self.acked);
        let duplicate = acked.iter().any(|a| a.event_id == m.event_id);
        acked.push(m.clone());
        Ok(PublishReceipt { duplicate })
    }
}
