//! The overview and the processes (routes, consumers) of the [`MemoryStore`].

use std::collections::BTreeMap;

use chrono::Utc;
use outbox_core::OutboxStats;
use outbox_core::operator::{
    ActivityKind, ConsumerView, Counting, Instance, MINUTES, MinuteCount, OperatorError, Overview,
    OverviewOps, ProcessOps, RouteView, Routes, check_bound, route_key,
};

use super::{SCHEMA, count, is_open, work_stats};
use crate::memory::{MemoryStore, OutboxRow, RowState, age, lock};

impl OverviewOps for MemoryStore {
    /// Always ready: the fake has no connection and no schema to check.
    async fn ready(&self) -> Result<(), OperatorError> {
        Ok(())
    }

    /// The overview numbers; the schema is named `memory`, and `published_retained` is 0 (the
    /// fake deletes a row when it is published).
    async fn overview_counting(&self, counting: Counting) -> Result<Overview, OperatorError> {
        let bound = counting.bound("overview")?;
        let cap = |n: i64| bound.map_or(n, |b| n.min(b));
        let now = Utc::now();
        let (mut pending, mut in_flight, mut retrying, mut dead, mut published) = (0, 0, 0, 0, 0);
        let mut oldest: Option<std::time::Duration> = None;
        {
            let o = lock(&self.inner.outbox);
            for r in o.rows.values() {
                match r.state {
                    RowState::Pending => {
                        pending += 1;
                        retrying += i64::from(r.msg.attempts > 0);
                        let leased = o
                            .leases
                            .get(&(r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
                            .is_some_and(|l| l.until > now);
                        in_flight += i64::from(leased);
                        let a = age(r.msg.created_at);
                        oldest = match (bound, oldest) {
                            // Bounded: the age of the first pending row in the table's order.
                            (Some(_), Some(first)) => Some(first),
                            (_, o) => Some(o.map_or(a, |o| o.max(a))),
                        };
                    }
                    RowState::Dead => dead += 1,
                    RowState::Published => published += 1,
                }
            }
        }
        let (inbox_conflicts, consumer_dead_letters) = {
            let c = lock(&self.inner.consumer);
            (
                count(
                    c.conflicts
                        .iter()
                        .filter(|c| c.resolved_at.is_none())
                        .count(),
                ),
                count(c.dead.values().filter(|d| is_open(d)).count()),
            )
        };
        let outbox = OutboxStats {
            pending: cap(pending),
            oldest_pending_age: oldest,
            in_flight: cap(in_flight),
            retrying: cap(retrying),
            dead: cap(dead),
            published_retained: cap(published),
        };
        let mut effects = work_stats(&lock(&self.inner.work), None);
        effects.failed = cap(effects.failed);
        Ok(Overview::from_counts(
            SCHEMA,
            bound,
            &outbox,
            inbox_conflicts,
            consumer_dead_letters,
            &effects,
        ))
    }
}
impl ProcessOps for MemoryStore {
    /// Always empty: no process reports a heartbeat to the fake.
    async fn instances(&self) -> Result<Vec<Instance>, OperatorError> {
        Ok(Vec::new())
    }

    /// The routes' pending and dead counts as the PostgreSQL store reads them (among the oldest
    /// `bound` pending rows and the oldest `bound` dead ones); the publish rates are zeros (no
    /// relay reports activity to the fake).
    async fn routes(&self, bound: i64) -> Result<Routes, OperatorError> {
        check_bound("routes", bound)?;
        let take = usize::try_from(bound).unwrap_or(usize::MAX);
        let mut by_key: BTreeMap<String, RouteView> = BTreeMap::new();
        let (mut heads, mut deads) = (0, 0);
        {
            let o = lock(&self.inner.outbox);
            let key =
                |r: &OutboxRow| route_key(r.msg.destination.as_deref(), &r.msg.aggregate_type);
            for r in o
                .rows
                .values()
                .filter(|r| r.state == RowState::Pending)
                .take(take)
            {
                heads += 1;
                let k = key(r);
                let v = by_key
                    .entry(k.clone())
                    .or_insert_with(|| RouteView::of_key(&k));
                v.pending += 1;
                v.oldest_pending_age_seconds = v
                    .oldest_pending_age_seconds
                    .max(age(r.msg.created_at).as_secs_f64());
            }
            for r in o
                .rows
                .values()
                .filter(|r| r.state == RowState::Dead)
                .take(take)
            {
                deads += 1;
                let k = key(r);
                by_key
                    .entry(k.clone())
                    .or_insert_with(|| RouteView::of_key(&k))
                    .dead_letters += 1;
            }
        }
        let complete = heads < take && deads < take;
        Ok(Routes::busiest_first(
            by_key.into_values().collect(),
            bound,
            complete,
        ))
    }

    /// The consumers the fake knows of (a pause, an open dead letter, an open conflict), with
    /// their open dead letters and conflicts; no instance is up, no lag is known and the rates
    /// are zeros (no engine reports a heartbeat to the fake).
    async fn consumers(&self) -> Result<Vec<ConsumerView>, OperatorError> {
        let mut by_name: BTreeMap<String, ConsumerView> = BTreeMap::new();
        let view = |name: &str| ConsumerView {
            name: name.to_owned(),
            instances_up: 0,
            lag: None,
            paused: false,
            dead_letters: 0,
            conflicts: 0,
            processed_per_minute: vec![0; MINUTES],
        };
        {
            let c = lock(&self.inner.consumer);
            for d in c.dead.values().filter(|d| is_open(d)) {
                by_name
                    .entry(d.consumer.clone())
                    .or_insert_with(|| view(&d.consumer))
                    .dead_letters += 1;
            }
            for x in c.conflicts.iter().filter(|x| x.resolved_at.is_none()) {
                by_name
                    .entry(x.consumer.clone())
                    .or_insert_with(|| view(&x.consumer))
                    .conflicts += 1;
            }
        }
        for (kind, name) in lock(&self.inner.ops).pauses.keys() {
            if *kind == "consumer" {
                by_name
                    .entry(name.clone())
                    .or_insert_with(|| view(name))
                    .paused = true;
            }
        }
        Ok(by_name.into_values().take(1000).collect())
    }

    /// None: no engine reports a heartbeat, and so no activity, to the fake.
    async fn activity_counts(
        &self,
        _kind: ActivityKind,
        _minutes: usize,
    ) -> Result<Vec<MinuteCount>, OperatorError> {
        Ok(Vec::new())
    }
}
