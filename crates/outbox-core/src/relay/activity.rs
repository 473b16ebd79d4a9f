//! What a relay published, per route, since it started: the numbers a heartbeat writes down
//! so that an operator sees publish rates per destination (the console's overview).
//!
//! A **route** is where a row goes as the database knows it: its own `destination` when the
//! producer set one, otherwise its aggregate type (which the transport's topic template turns
//! into a destination). The relay counts a row once the broker confirmed it, once per batch
//! (one lock per batch, not per message).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::message::OutboxMessage;

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
}
