//! Timing decorators around [`OutboxStore`] and [`Transport`]: where a relay batch spends its time
//! (claim SQL, publishing, mark SQL), measured without touching the relay; and, for W3, when
//! each event's publish was confirmed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::{
    ClaimParams, ClaimedBatch, FailureParams, MarkParams, OutboxMessage, OutboxStats, OutboxStore,
    PublishError, PublishReceipt, ReleaseParams, StoreError, Transport,
};

use crate::common::{mean, percentile};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What the store decorator saw.
#[derive(Default)]
pub struct StoreStats {
    /// (duration, rows) of every claim that returned rows.
    claims: Mutex<Vec<(Duration, usize)>>,
    /// Claims that returned nothing.
    empty_claims: AtomicU64,
    /// (duration, rows marked) of every mark.
    marks: Mutex<Vec<(Duration, u64)>>,
    /// Claim end -> mark start of each batch (the publish phase).
    publish_phase: Mutex<Vec<Duration>>,
    claim_done: Mutex<HashMap<i64, Instant>>,
    /// Rows marked published so far.
    pub marked: AtomicU64,
    /// When the latest mark returned.
    pub last_mark: Mutex<Option<Instant>>,
    failures: AtomicU64,
    released: AtomicU64,
}

/// A [`OutboxStore`] that times every call of the inner one.
pub struct TimedStore<S> {
    inner: S,
    pub stats: Arc<StoreStats>,
}

impl<S> TimedStore<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            stats: Arc::default(),
        }
    }
}

impl<S: OutboxStore> OutboxStore for TimedStore<S> {
    async fn claim_batch(&self, params: ClaimParams) -> Result<ClaimedBatch, StoreError> {
        let t = Instant::now();
        let r = self.inner.claim_batch(params).await;
        let now = Instant::now();
        if let Ok(b) = &r {
            if b.messages.is_empty() {
                self.stats.empty_claims.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats
                    .claims
                    .lock()
                    .unwrap()
                    .push((now - t, b.messages.len()));
                self.stats.claim_done.lock().unwrap().insert(b.token.0, now);
            }
        }
        r
    }

    async fn mark_published(&self, params: MarkParams<'_>) -> Result<u64, StoreError> {
        let t = Instant::now();
        if let Some(c) = self
            .stats
            .claim_done
            .lock()
            .unwrap()
            .remove(&params.token.0)
        {
            self.stats.publish_phase.lock().unwrap().push(t - c);
        }
        let r = self.inner.mark_published(params).await;
        let now = Instant::now();
        if let Ok(n) = &r {
            self.stats.marks.lock().unwrap().push((now - t, *n));
            *self.stats.last_mark.lock().unwrap() = Some(now);
            self.stats.marked.fetch_add(*n, Ordering::SeqCst);
        }
        r
    }

    async fn record_failure(&self, params: FailureParams<'_>) -> Result<bool, StoreError> {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        self.inner.record_failure(params).await
    }

    async fn release(&self, params: ReleaseParams<'_>) -> Result<u64, StoreError> {
        self.stats
            .released
            .fetch_add(params.ids.len() as u64, Ordering::Relaxed);
        self.inner.release(params).await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        self.inner.stats().await
    }

    async fn wait_for_work(&self, timeout: Duration) {
        self.inner.wait_for_work(timeout).await
    }
}

/// What the transport decorator saw.
#[derive(Default)]
pub struct TransportStats {
    /// Latency of every publish call, microseconds.
    latencies_us: Mutex<Vec<u32>>,
    errors: AtomicU64,
    in_flight: AtomicI64,
    max_in_flight: AtomicI64,
    /// Sum over publishes of the in-flight count seen at start (for the mean concurrency).
    in_flight_sum: AtomicU64,
    /// When each event's first successful publish returned (recorded with `record_confirms`).
    confirmed_at: Mutex<HashMap<uuid::Uuid, Instant>>,
    record_confirms: bool,
}

impl TransportStats {
    /// The end of one publish (of `message`, when known): its latency `us` and result.
    fn done(&self, us: u32, message: Option<&OutboxMessage>, ok: bool) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !ok {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latencies_us.lock().unwrap().push(us);
        if ok
            && self.record_confirms
            && let Some(message) = message
        {
            self.confirmed_at
                .lock()
                .unwrap()
                .entry(message.event_id)
                .or_insert_with(Instant::now);
        }
    }

    /// When each event's publish was first confirmed (empty unless the transport was
    /// [`TimedTransport::stamping`]).
    pub fn take_confirm_times(&self) -> HashMap<uuid::Uuid, Instant> {
        std::mem::take(&mut *self.confirmed_at.lock().unwrap())
    }
}

/// A [`Transport`] that times every publish of the inner one.
pub struct TimedTransport<T> {
    inner: Arc<T>,
    pub stats: Arc<TransportStats>,
}

impl<T> TimedTransport<T> {
    pub fn new(inner: Arc<T>) -> Self {
        Self {
            inner,
            stats: Arc::default(),
        }
    }

    /// A [`TimedTransport`] that also remembers when each event's publish was confirmed (see
    /// [`TransportStats::take_confirm_times`]).
    pub fn stamping(inner: Arc<T>) -> Self {
        Self {
            inner,
            stats: Arc::new(TransportStats {
                record_confirms: true,
                ..TransportStats::default()
            }),
        }
    }
}

impl<T: Transport> Transport for TimedTransport<T> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        let s = &self.stats;
        let now_in = s.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        s.max_in_flight.fetch_max(now_in, Ordering::Relaxed);
        s.in_flight_sum.fetch_add(now_in as u64, Ordering::Relaxed);
        let t = Instant::now();
        let r = self.inner.publish(message).await;
        let us = u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX);
        s.done(us, Some(message), r.is_ok());
        r
    }

    fn ordered_pipelining(&self) -> bool {
        self.inner.ordered_pipelining()
    }

    /// Each message of the run counts as one publish, from the run's start to its result.
    fn publish_run<'a>(
        &'a self,
        run: &'a [OutboxMessage],
    ) -> impl futures::Stream<Item = Result<PublishReceipt, PublishError>> + Send + 'a {
        use futures::StreamExt as _;
        let s = &self.stats;
        let n = run.len() as i64;
        let now_in = s.in_flight.fetch_add(n, Ordering::Relaxed) + n;
        s.max_in_flight.fetch_max(now_in, Ordering::Relaxed);
        s.in_flight_sum
            .fetch_add((now_in * n) as u64, Ordering::Relaxed);
        let t = Instant::now();
        let mut guard = RunInFlight {
            stats: Arc::clone(s),
            left: n,
        };
        self.inner.publish_run(run).map(move |r| {
            let us = u32::try_from(t.elapsed().as_micros()).unwrap_or(u32::MAX);
            // The run's results come in its order.
            let message = run.get((n - guard.left) as usize);
            guard.left -= 1;
            guard.stats.done(us, message, r.is_ok());
            r
        })
    }
}

/// The messages of a run without a result yet; no longer in flight once the run's stream is
/// dropped (the transport may take only part of a run).
struct RunInFlight {
    stats: Arc<TransportStats>,
    left: i64,
}

impl Drop for RunInFlight {
    fn drop(&mut self) {
        self.stats.in_flight.fetch_sub(self.left, Ordering::Relaxed);
    }
}

/// A summary of one relay drain, for the "where does the time go" table.
#[derive(Debug, Clone, Default)]
pub struct Breakdown {
    pub batches: usize,
    pub empty_claims: u64,
    pub rows_per_batch: f64,
    pub claim_ms_mean: f64,
    pub claim_ms_p50: f64,
    pub claim_ms_max: f64,
    pub claim_ms_total: f64,
    pub publish_phase_ms_mean: f64,
    pub publish_phase_ms_total: f64,
    pub mark_ms_mean: f64,
    pub mark_ms_total: f64,
    pub publish_us_p50: f64,
    pub publish_us_p99: f64,
    pub publishes: usize,
    pub publish_errors: u64,
    pub mean_in_flight: f64,
    pub max_in_flight: i64,
    pub failures: u64,
    pub released: u64,
}

pub fn breakdown(store: &StoreStats, transport: &TransportStats) -> Breakdown {
    let claims = store.claims.lock().unwrap();
    let mut claim_ms: Vec<f64> = claims.iter().map(|(d, _)| ms(*d)).collect();
    claim_ms.sort_by(f64::total_cmp);
    let rows: Vec<f64> = claims.iter().map(|(_, n)| *n as f64).collect();
    let phases: Vec<f64> = store
        .publish_phase
        .lock()
        .unwrap()
        .iter()
        .map(|d| ms(*d))
        .collect();
    let marks: Vec<f64> = store
        .marks
        .lock()
        .unwrap()
        .iter()
        .map(|(d, _)| ms(*d))
        .collect();
    let mut lat: Vec<f64> = transport
        .latencies_us
        .lock()
        .unwrap()
        .iter()
        .map(|u| f64::from(*u))
        .collect();
    lat.sort_by(f64::total_cmp);
    let publishes = lat.len();
    Breakdown {
        batches: claims.len(),
        empty_claims: store.empty_claims.load(Ordering::Relaxed),
        rows_per_batch: mean(&rows),
        claim_ms_mean: mean(&claim_ms),
        claim_ms_p50: percentile(&claim_ms, 0.5),
        claim_ms_max: claim_ms.last().copied().unwrap_or(f64::NAN),
        claim_ms_total: claim_ms.iter().sum(),
        publish_phase_ms_mean: mean(&phases),
        publish_phase_ms_total: phases.iter().sum(),
        mark_ms_mean: mean(&marks),
        mark_ms_total: marks.iter().sum(),
        publish_us_p50: percentile(&lat, 0.5),
        publish_us_p99: percentile(&lat, 0.99),
        publishes,
        publish_errors: transport.errors.load(Ordering::Relaxed),
        mean_in_flight: if publishes == 0 {
            0.0
        } else {
            transport.in_flight_sum.load(Ordering::Relaxed) as f64 / publishes as f64
        },
        max_in_flight: transport.max_in_flight.load(Ordering::Relaxed),
        failures: store.failures.load(Ordering::Relaxed),
        released: store.released.load(Ordering::Relaxed),
    }
}
