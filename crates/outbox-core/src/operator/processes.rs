//! The running processes (their heartbeats) and the routes' and consumers' numbers: what the
//! console's overview shows beside the totals.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::OperatorError;
use crate::health::HealthReport;

/// One consumer's numbers on the console.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerView {
    /// The consumer's name (its inbox key).
    pub name: String,
    /// Its processes whose heartbeat is up.
    pub instances_up: i64,
    /// Messages waiting for it at the broker, the largest its running engines last reported
    /// (their heartbeats); `None` when none reports one.
    pub lag: Option<i64>,
    /// Whether an operator paused it.
    pub paused: bool,
    /// Its open (not resolved) dead letters.
    pub dead_letters: i64,
    /// Its open (not resolved) inbox conflicts, as the overview counts them.
    pub conflicts: i64,
    /// Effects committed per minute, oldest first, the last being this minute so far
    /// ([`MINUTES`] entries), summed over its heartbeats.
    pub processed_per_minute: Vec<i64>,
}

/// How many minutes of publish rates a route shows.
pub const MINUTES: usize = 15;

/// A process as its heartbeat shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Instance {
    /// Its instance id (new at every start).
    pub instance_id: Uuid,
    /// `relay`, `consumer` or `executor`.
    pub kind: String,
    /// The relay's name, the consumer's name, the executor's work-item kind.
    pub name: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id there.
    pub pid: i32,
    /// The toolkit's version it runs.
    pub version: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// The age of that heartbeat, by the database clock, seconds.
    pub heartbeat_age_seconds: f64,
    /// The interval it announced, milliseconds.
    pub interval_ms: i32,
    /// `up` (a heartbeat within two intervals), `late` (within six), `gone` (older), or
    /// `stopped` (it recorded a clean stop).
    pub status: &'static str,
    /// Its own numbers (a relay: `published` since it started, `in_flight`; a consumer: its
    /// counts, `lag`, `paused`).
    pub stats: serde_json::Value,
    /// What its engine said about itself at its last heartbeat (a relay's or a consumer's:
    /// a store's heartbeat), its ages as of now: why it is stuck, when
    /// it is. `None` for a process that does not report one. Taken out of `stats`.
    pub health: Option<HealthReport>,
}

/// One route's numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteView {
    /// The rows' own destination, when they have one.
    pub destination: Option<String>,
    /// Otherwise their aggregate type (the relay's topic template makes the destination).
    pub aggregate_type: Option<String>,
    /// Pending rows (among the oldest [`Routes::counted_up_to`] pending rows of all routes).
    pub pending: i64,
    /// Age of its oldest pending row, seconds (0 when none).
    pub oldest_pending_age_seconds: f64,
    /// Dead letters (among the oldest [`Routes::counted_up_to`]).
    pub dead_letters: i64,
    /// Broker-confirmed publishes per minute, oldest first, the last being this minute so far
    /// ([`MINUTES`] entries), summed over every relay's heartbeat.
    pub published_per_minute: Vec<i64>,
}

/// The routes' numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Routes {
    /// Busiest (most pending) first.
    pub routes: Vec<RouteView>,
    /// The pending and dead counts read at most this many rows each.
    pub counted_up_to: i64,
    /// Whether every pending row and every dead letter was read (the counts are exact).
    pub complete: bool,
}

impl RouteView {
    /// An empty view of the route `key` ([`route_key`](super::pauses::route_key)'s form; a
    /// key without a prefix is taken as an aggregate type).
    pub fn of_key(key: &str) -> Self {
        let (destination, aggregate_type) = match key.split_once(':') {
            Some(("destination", d)) => (Some(d.to_owned()), None),
            Some((_, t)) => (None, Some(t.to_owned())),
            None => (None, Some(key.to_owned())),
        };
        Self {
            destination,
            aggregate_type,
            pending: 0,
            oldest_pending_age_seconds: 0.0,
            dead_letters: 0,
            published_per_minute: vec![0; MINUTES],
        }
    }
}

impl Routes {
    /// The routes of `views`, busiest (most pending, then most dead) first.
    pub fn busiest_first(mut views: Vec<RouteView>, counted_up_to: i64, complete: bool) -> Self {
        views.sort_by(|a, b| {
            b.pending
                .cmp(&a.pending)
                .then(b.dead_letters.cmp(&a.dead_letters))
        });
        Self {
            routes: views,
            counted_up_to,
            complete,
        }
    }
}

/// The index of a count `minutes_ago` in a [`MINUTES`] series (oldest first, this minute
/// last); `None` outside the window.
pub fn minute_slot(minutes_ago: i64) -> Option<usize> {
    usize::try_from(minutes_ago)
        .ok()
        .filter(|ago| *ago < MINUTES)
        .map(|ago| MINUTES - 1 - ago)
}

/// The longest window [`ProcessOps::activity`] reads: the heartbeats keep two hours of
/// activity.
pub const ACTIVITY_MINUTES: usize = 120;

/// What [`ProcessOps::activity`] charts: work counted per minute (publishes, applied events),
/// or a level read every beat (lag, the oldest pending row's age, dead letters), of which a
/// minute keeps the highest reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActivityKind {
    /// The relays' broker-confirmed publishes, per route (`destination:` and the rows'
    /// destination, or `type:` and their aggregate type: [`route_key`](super::route_key)).
    Publish,
    /// The consumers' committed effects, per consumer.
    Consume,
    /// A level: each consumer's lag (messages its source holds for it beyond what it has
    /// taken), the highest any of its processes read in the minute.
    Lag,
    /// A level: the age of the oldest pending outbox row, whole seconds, as the relays' gauges
    /// read it (one series, [`OUTBOX_SERIES`]).
    OldestPendingAge,
    /// A level: the outbox's dead letters, as the relays' gauges count them (one series,
    /// [`OUTBOX_SERIES`]).
    DeadLetters,
}

/// The name of the series of a level that belongs to the outbox table as a whole (the oldest
/// pending age and the dead letters): every relay reads the same table.
pub const OUTBOX_SERIES: &str = "outbox";

impl ActivityKind {
    /// Every kind.
    pub const ALL: [ActivityKind; 5] = [
        Self::Publish,
        Self::Consume,
        Self::Lag,
        Self::OldestPendingAge,
        Self::DeadLetters,
    ];

    /// The kind as the heartbeats record it: `publish`, `consume`, `lag`,
    /// `oldest_pending_age` or `dead_letters`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Publish => "publish",
            Self::Consume => "consume",
            Self::Lag => "lag",
            Self::OldestPendingAge => "oldest_pending_age",
            Self::DeadLetters => "dead_letters",
        }
    }

    /// Whether this is a level (a minute keeps its highest reading; readings do not add up)
    /// rather than work counted (a minute's counts add up).
    pub fn is_level(self) -> bool {
        matches!(self, Self::Lag | Self::OldestPendingAge | Self::DeadLetters)
    }
}

/// A minute of one series as a store keeps it: `count` of `name`'s, `minutes_ago` minutes
/// before the current minute (0: the current minute so far): work summed over the processes
/// that reported it, or a level's highest reading ([`ActivityKind::is_level`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinuteCount {
    /// The route key or the consumer's name.
    pub name: String,
    /// Whole minutes before the current one.
    pub minutes_ago: i64,
    /// The work done in that minute, or the level's highest reading.
    pub count: i64,
}

/// One route's or consumer's work per minute, or one level's highest reading per minute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ActivitySeries {
    /// The route key, the consumer's name, or [`OUTBOX_SERIES`].
    pub name: String,
    /// Per minute, oldest first, the last being the current minute so far (one per minute of
    /// the window); 0 for a minute with nothing recorded.
    pub per_minute: Vec<i64>,
    /// The window's sum for work counted; `None` for a level, whose readings do not add up.
    pub total: Option<i64>,
    /// The window's largest minute: the busiest minute's work, or the level's highest reading.
    pub peak: i64,
}

/// The work of one kind per minute over a window, or a level's readings: the console's
/// activity charts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Activity {
    /// What was counted or read.
    pub kind: ActivityKind,
    /// Whether it is a level ([`ActivityKind::is_level`]).
    pub level: bool,
    /// The window, in minutes (the length of every series).
    pub minutes: usize,
    /// Busiest first (the largest total, then the highest peak; for a level, the highest
    /// peak), then by name.
    pub series: Vec<ActivitySeries>,
}

impl Activity {
    /// The series of `counts` over the last `minutes` minutes; counts outside the window are
    /// left out, counts of one name and minute are added (for a level, the highest is kept).
    /// Each series holds `minutes` numbers: [`ProcessOps::activity`] checks the window (at
    /// most [`ACTIVITY_MINUTES`]) first.
    pub fn of(kind: ActivityKind, minutes: usize, counts: Vec<MinuteCount>) -> Self {
        let level = kind.is_level();
        let mut by_name: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
        for c in counts {
            let Some(ago) = usize::try_from(c.minutes_ago).ok().filter(|a| *a < minutes) else {
                continue;
            };
            let series = by_name.entry(c.name).or_insert_with(|| vec![0; minutes]);
            let slot = &mut series[minutes - 1 - ago];
            *slot = match level {
                true => (*slot).max(c.count),
                false => slot.saturating_add(c.count),
            };
        }
        let mut series: Vec<ActivitySeries> = by_name
            .into_iter()
            .map(|(name, per_minute)| ActivitySeries {
                total: (!level).then(|| per_minute.iter().fold(0i64, |a, b| a.saturating_add(*b))),
                peak: per_minute.iter().copied().max().unwrap_or(0),
                name,
                per_minute,
            })
            .collect();
        series.sort_by(|a, b| {
            (b.total, b.peak)
                .cmp(&(a.total, a.peak))
                .then_with(|| a.name.cmp(&b.name))
        });
        Self {
            kind,
            level,
            minutes,
            series,
        }
    }
}

/// The heartbeat status of a process: `stopped` when it recorded a clean stop, else `up` (its
/// last heartbeat within two intervals), `late` (within six) or `gone`.
pub fn heartbeat_status(stopped: bool, age_seconds: f64, interval_ms: i32) -> &'static str {
    let interval = f64::from(interval_ms) / 1000.0;
    match stopped {
        true => "stopped",
        false if age_seconds <= 2.0 * interval => "up",
        false if age_seconds <= 6.0 * interval => "late",
        false => "gone",
    }
}

/// The running processes, routes and consumers.
pub trait ProcessOps: Sync {
    /// The processes that run a heartbeat (relays, consumers, executors), with their status
    /// ([`heartbeat_status`]). At most 1,000, by kind and name.
    ///
    /// # Errors
    /// [`OperatorError`]: the store's failure.
    fn instances(&self) -> impl Future<Output = Result<Vec<Instance>, OperatorError>> + Send;

    /// Per route (the rows' destination, or their aggregate type): pending rows and the oldest
    /// one's age among the oldest `bound` pending rows, dead letters among the oldest `bound`,
    /// and the publishes per minute of the last [`MINUTES`] minutes, busiest first.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` for a bound below 1; otherwise the store's
    /// failure.
    fn routes(&self, bound: i64) -> impl Future<Output = Result<Routes, OperatorError>> + Send;

    /// Per consumer known to the store (a heartbeat, a pause, an open dead letter or conflict,
    /// recent activity): its processes up, its lag and the effects it committed per minute
    /// over the last [`MINUTES`] minutes as its engines report them, whether it is paused, its
    /// open dead letters and conflicts. At most 1,000 consumers, by name.
    ///
    /// # Errors
    /// [`OperatorError`]: the store's failure.
    fn consumers(&self) -> impl Future<Output = Result<Vec<ConsumerView>, OperatorError>> + Send;

    /// The work of `kind` per minute over the last `minutes` minutes (1 to
    /// [`ACTIVITY_MINUTES`]), per route or consumer, busiest first ([`Activity::of`] of the
    /// store's [`activity_counts`](Self::activity_counts)).
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` for a window out of range; otherwise the
    /// store's failure.
    fn activity(
        &self,
        kind: ActivityKind,
        minutes: usize,
    ) -> impl Future<Output = Result<Activity, OperatorError>> + Send {
        async move {
            if !(1..=ACTIVITY_MINUTES).contains(&minutes) {
                return Err(OperatorError::invalid(
                    "activity",
                    format!("the window must be 1 to {ACTIVITY_MINUTES} minutes, not {minutes}"),
                ));
            }
            let counts = self.activity_counts(kind, minutes).await?;
            Ok(Activity::of(kind, minutes, counts))
        }
    }

    /// The store's part of [`activity`](Self::activity): the counts of `kind` its processes
    /// recorded in the last `minutes` minutes (a store no process reports to has none).
    ///
    /// # Errors
    /// [`OperatorError`]: the store's failure.
    fn activity_counts(
        &self,
        kind: ActivityKind,
        minutes: usize,
    ) -> impl Future<Output = Result<Vec<MinuteCount>, OperatorError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(name: &str, minutes_ago: i64, count: i64) -> MinuteCount {
        MinuteCount {
            name: name.to_owned(),
            minutes_ago,
            count,
        }
    }

    /// Each series as (name, per minute, total, peak).
    fn rows(a: &Activity) -> Vec<(&str, &[i64], Option<i64>, i64)> {
        a.series
            .iter()
            .map(|s| (s.name.as_str(), &s.per_minute[..], s.total, s.peak))
            .collect()
    }

    #[test]
    fn activity_places_counts_by_minute_and_leaves_out_the_rest() {
        let counts = vec![
            count("b", 0, 7),
            count("a", 0, 1),
            count("b", 4, 11),
            count("b", 4, 2),
            count("b", 5, 99),
            count("a", -1, 99),
        ];
        let a = Activity::of(ActivityKind::Publish, 5, counts);
        assert_eq!(a.minutes, 5);
        assert!(!a.level);
        assert_eq!(
            rows(&a),
            [
                ("b", &[13, 0, 0, 0, 7][..], Some(20), 13),
                ("a", &[0, 0, 0, 0, 1][..], Some(1), 1)
            ]
        );
    }

    #[test]
    fn a_level_keeps_each_minutes_highest_reading_and_has_no_total() {
        // Three readings in this minute, one two minutes ago; another consumer's, one of them
        // out of the window.
        let ledger = [(0, 3), (0, 40), (0, 9), (2, 5)].map(|(ago, n)| count("ledger", ago, n));
        let audit = [(1, 41), (9, 1000)].map(|(ago, n)| count("audit", ago, n));
        let a = Activity::of(
            ActivityKind::Lag,
            3,
            [ledger.to_vec(), audit.to_vec()].concat(),
        );
        assert!(a.level);
        assert_eq!(
            rows(&a),
            [
                ("audit", &[0, 41, 0][..], None, 41),
                ("ledger", &[5, 0, 40][..], None, 40)
            ]
        );
    }
}
