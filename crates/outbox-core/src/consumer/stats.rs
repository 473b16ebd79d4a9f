//! A consumer engine's running numbers, shared with whatever reports them: a heartbeat that
//! writes them beside the process (a store crate's heartbeat),
//! so that the operator's console shows each consumer's lag and throughput as the engine
//! itself counts them, and, when it is stuck, why ([`ConsumerStats::health`]).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;

use super::engine::{ConsumerReport, metric};
use crate::health::Health;

/// Counters of one [`Consumer`](super::Consumer) since it was built, added after each batch
/// under a short lock (once a batch, never per message), so that a reader sees every count as
/// of the same batch.
/// Get it with [`Consumer::stats`](super::Consumer::stats).
#[derive(Debug)]
pub struct ConsumerStats {
    /// The consumer's name ([`ConsumerConfig::name`](super::ConsumerConfig::name)).
    name: String,
    /// Every batch's counts added up.
    totals: Mutex<ConsumerReport>,
    /// The source's last lag reading; -1 while unknown.
    lag: AtomicI64,
    paused: AtomicBool,
    pub(super) health: Arc<Health>,
}

impl ConsumerStats {
    /// Zero counts of the consumer `name`.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            health: Arc::new(Health::with_metrics(
                metric::ERRORS,
                metric::LAST_PROGRESS,
                vec![("consumer", name.clone())],
            )),
            name,
            totals: Mutex::new(ConsumerReport::default()),
            lag: AtomicI64::new(-1),
            paused: AtomicBool::new(false),
        }
    }
}

/// The numbers of [`ConsumerStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ConsumerStatsSnapshot {
    /// Deliveries taken from the source.
    pub received: u64,
    /// Effects committed from deliveries (requeued dead letters are in `requeued_resolved`).
    pub processed: u64,
    /// Redeliveries absorbed by the inbox.
    pub duplicates: u64,
    /// Stale versions absorbed (ordering guard).
    pub stale: u64,
    /// Conflicts recorded.
    pub conflicts: u64,
    /// Dead letters written.
    pub dead_lettered: u64,
    /// Deliveries sent back to the broker.
    pub nacked: u64,
    /// Requeued dead letters settled: applied, or absorbed as duplicates or stale versions.
    pub requeued_resolved: u64,
    /// Messages waiting for this consumer at the broker, as the source last read it
    /// (`None`: not read yet, or the source cannot tell).
    pub lag: Option<u64>,
    /// Whether an operator paused the consumer.
    pub paused: bool,
}

impl ConsumerStats {
    /// The consumer's name: the inbox key its pauses and its heartbeat go by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its last error, error rate and last progress ([`crate::health`]): the engine records
    /// its source's and its database's errors, its handlers' failures and its dead letters,
    /// and its progress (deliveries settled for good).
    pub fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// The numbers now.
    pub fn snapshot(&self) -> ConsumerStatsSnapshot {
        let t = self.totals().clone();
        let n = |count: usize| u64::try_from(count).unwrap_or(u64::MAX);
        ConsumerStatsSnapshot {
            received: n(t.received),
            processed: n(t.processed),
            duplicates: n(t.duplicates),
            stale: n(t.stale),
            conflicts: n(t.conflicts),
            dead_lettered: n(t.dead_lettered),
            nacked: n(t.nacked),
            requeued_resolved: n(t.requeued_resolved),
            lag: u64::try_from(self.lag.load(Ordering::Relaxed)).ok(),
            paused: self.paused.load(Ordering::Relaxed),
        }
    }

    /// Adds one batch's counts.
    pub(super) fn add(&self, r: &ConsumerReport) {
        *self.totals() += r;
    }

    /// The totals, locked. Nothing done under the lock panics (the addition saturates), so a
    /// poisoned lock's totals are whole.
    fn totals(&self) -> std::sync::MutexGuard<'_, ConsumerReport> {
        self.totals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_lag(&self, lag: u64) {
        self.lag
            .store(i64::try_from(lag).unwrap_or(i64::MAX), Ordering::Relaxed);
    }

    pub(super) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_add_up_and_lag_is_unknown_until_read() {
        let s = ConsumerStats::new("c");
        assert_eq!(s.name(), "c");
        assert_eq!(s.snapshot(), ConsumerStatsSnapshot::default());
        let r = ConsumerReport {
            received: 3,
            processed: 2,
            duplicates: 1,
            ..ConsumerReport::default()
        };
        s.add(&r);
        s.add(&r);
        s.set_lag(7);
        s.set_paused(true);
        let n = s.snapshot();
        assert_eq!(
            (n.received, n.processed, n.duplicates, n.lag, n.paused),
            (6, 4, 2, Some(7), true)
        );
    }
}
