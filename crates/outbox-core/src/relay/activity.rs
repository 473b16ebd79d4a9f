//! What a relay published, per route, since it started: the numbers a heartbeat writes down
//! so that an operator sees publish rates per destination (the console's overview).
//!
//! A **route** is where a row goes as the database knows it: its own `destination` when the
//! producer set one, otherwise its aggregate type (which the transport's topic template turns
//! into a destination). The relay counts a row once the broker confirmed it, once per batch
//! (one lock per batch, not per message).
//!
//! It also knows what the relay holds right now: the batches it took from its feed and has
//! not settled yet ([`PublishActivity::in_flight`]). For the polling feed these are the
//! relay's leases, one per aggregate, so an operator sees which relay holds how much and for
//! how long (a relay stuck with old claims shows here before its leases expire).
//!
//! And the outbox's numbers as the relay's gauges last read them ([`PublishActivity::backlog`]:
//! pending rows, the oldest one's age, dead letters), so that its heartbeat records them per
//! minute for the console's charts without a query of its own.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::message::OutboxMessage;
use crate::store::OutboxStats;

/// How long a gauge reading stays current for [`PublishActivity::backlog`]: a relay that could
/// not read the outbox for longer (an outage) reports nothing rather than an old number.
pub const BACKLOG_FRESH_FOR: Duration = Duration::from_secs(60);

/// Where a row goes, as the database knows it: exactly one of the two is set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Route {
    /// The row's own destination (the producer's override).
    pub destination: Option<String>,
    /// The aggregate type, for a row without a destination (routed by the topic template).
    pub aggregate_type: Option<String>,
}

impl Route {
    /// The route of `message`.
    pub fn of(message: &OutboxMessage) -> Self {
        match &message.destination {
            Some(d) => Self {
                destination: Some(d.clone()),
                aggregate_type: None,
            },
            None => Self {
                destination: None,
                aggregate_type: Some(message.aggregate_type.clone()),
            },
        }
    }
}

/// Broker-confirmed publishes per route since the relay started (cumulative counts; a
/// reader takes differences).
#[derive(Debug, Default)]
pub struct PublishActivity {
    counts: Mutex<HashMap<Route, u64>>,
    held: Mutex<Held>,
    backlog: Mutex<Option<(OutboxStats, Instant)>>,
}

/// The batches taken and not settled yet, by a number of this relay's own.
#[derive(Debug, Default)]
struct Held {
    next: u64,
    batches: HashMap<u64, HeldBatch>,
}

#[derive(Debug)]
struct HeldBatch {
    aggregates: usize,
    rows: usize,
    since: Instant,
}

/// What a relay holds right now: the batches it took and has not settled (for the polling
/// feed, its leases).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct InFlight {
    /// Batches taken and not settled.
    pub batches: usize,
    /// Distinct aggregates in them (the polling feed leases each one).
    pub aggregates: usize,
    /// Rows in them.
    pub rows: usize,
    /// How long the oldest of them has been held, whole milliseconds; `None` when none is.
    pub oldest_ms: Option<u64>,
}

/// A batch counted in [`PublishActivity::in_flight`] until it is dropped (settled, or given
/// up on an error).
#[derive(Debug)]
pub(super) struct Holding<'a> {
    activity: &'a PublishActivity,
    id: u64,
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        let mut held = self.activity.held.lock().unwrap_or_else(|p| p.into_inner());
        held.batches.remove(&self.id);
    }
}

impl PublishActivity {
    /// Counts `published` (row ids) among `messages`.
    pub(super) fn record(&self, messages: &[OutboxMessage], published: &[i64]) {
        if published.is_empty() {
            return;
        }
        let published: std::collections::HashSet<i64> = published.iter().copied().collect();
        let mut batch: HashMap<Route, u64> = HashMap::new();
        for m in messages.iter().filter(|m| published.contains(&m.id)) {
            *batch.entry(Route::of(m)).or_default() += 1;
        }
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        for (route, n) in batch {
            *counts.entry(route).or_default() += n;
        }
    }

    /// The cumulative counts now.
    pub fn snapshot(&self) -> HashMap<Route, u64> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every publish counted, all routes together.
    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    /// Counts `messages`, a batch just taken, as held until the guard is dropped.
    pub(super) fn hold(&self, messages: &[OutboxMessage]) -> Holding<'_> {
        let aggregates = messages
            .iter()
            .map(|m| (&m.aggregate_type, &m.aggregate_id))
            .collect::<HashSet<_>>()
            .len();
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let id = held.next;
        held.next += 1;
        held.batches.insert(
            id,
            HeldBatch {
                aggregates,
                rows: messages.len(),
                since: Instant::now(),
            },
        );
        Holding { activity: self, id }
    }

    /// Keeps `stats`, the outbox's numbers the relay's gauges just read.
    pub(crate) fn record_backlog(&self, stats: OutboxStats) {
        *self.backlog.lock().unwrap_or_else(|p| p.into_inner()) = Some((stats, Instant::now()));
    }

    /// The outbox's numbers as the relay's gauges last read them, when that was at most
    /// [`BACKLOG_FRESH_FOR`] ago (`None` before the first reading, once readings have failed
    /// for longer, and for a feed that cannot count).
    pub fn backlog(&self) -> Option<OutboxStats> {
        let backlog = self.backlog.lock().unwrap_or_else(|p| p.into_inner());
        backlog
            .as_ref()
            .filter(|(_, at)| at.elapsed() <= BACKLOG_FRESH_FOR)
            .map(|(stats, _)| stats.clone())
    }

    /// What the relay holds now.
    pub fn in_flight(&self) -> InFlight {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        held.batches.values().fold(InFlight::default(), |acc, b| {
            let age = now.saturating_duration_since(b.since);
            InFlight {
                batches: acc.batches + 1,
                aggregates: acc.aggregates + b.aggregates,
                rows: acc.rows + b.rows,
                oldest_ms: Some(
                    acc.oldest_ms
                        .unwrap_or(0)
                        .max(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
                ),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: i64, aggregate: &str) -> OutboxMessage {
        crate::relay::tests::row(id, aggregate, id)
    }

    #[test]
    fn the_backlog_is_the_last_reading() {
        let activity = PublishActivity::default();
        assert_eq!(activity.backlog(), None);
        let reading = |dead| OutboxStats {
            dead,
            ..OutboxStats::default()
        };
        activity.record_backlog(reading(3));
        activity.record_backlog(reading(5));
        assert_eq!(activity.backlog().map(|b| b.dead), Some(5));
    }

    #[test]
    fn a_batch_is_held_until_its_guard_is_dropped() {
        let activity = PublishActivity::default();
        assert_eq!(activity.in_flight(), InFlight::default());
        let first = activity.hold(&[message(1, "a"), message(2, "a"), message(3, "b")]);
        let second = activity.hold(&[message(4, "c")]);
        let now = activity.in_flight();
        assert_eq!((now.batches, now.aggregates, now.rows), (2, 3, 4));
        assert!(now.oldest_ms.is_some());
        drop(first);
        let now = activity.in_flight();
        assert_eq!((now.batches, now.aggregates, now.rows), (1, 1, 1));
        drop(second);
        assert_eq!(activity.in_flight(), InFlight::default());
    }
}
