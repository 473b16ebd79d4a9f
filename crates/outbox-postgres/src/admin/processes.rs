//! The running processes (heartbeats, `crate::heartbeat`) and the routes' numbers: what the
//! console's overview shows beside the totals.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use outbox_core::health::HealthReport;
use serde::Serialize;
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

pub(super) const INSTANCES: &str = "SELECT instance_id, kind, name, host, pid, version, \
    started_at, heartbeat_at, interval_ms, stats, stopped_at, \
    EXTRACT(EPOCH FROM now() - heartbeat_at)::float8 \
    FROM {s}.instances ORDER BY kind, name, started_at DESC LIMIT 1000";

/// Pending rows per route among the oldest `$1` pending ones, dead letters per route among the
/// oldest `$1`, and whether the pending head held every pending row.
pub(super) const ROUTES: &str = "WITH head AS ( \
      SELECT destination, aggregate_type, created_at FROM {s}.events \
      WHERE state = 'pending' ORDER BY id LIMIT $1), \
    dead AS ( \
      SELECT destination, aggregate_type FROM {s}.events \
      WHERE state = 'dead' ORDER BY id LIMIT $1), \
    p AS (SELECT {key} AS key, count(*) AS n, \
            EXTRACT(EPOCH FROM now() - min(created_at))::float8 AS oldest FROM head GROUP BY 1), \
    d AS (SELECT {key} AS key, count(*) AS n FROM dead GROUP BY 1) \
    SELECT coalesce(p.key, d.key), coalesce(p.n, 0), coalesce(p.oldest, 0), coalesce(d.n, 0), \
      (SELECT count(*) FROM head) < $1 AND (SELECT count(*) FROM dead) < $1 \
    FROM p FULL JOIN d ON d.key = p.key";

/// Counts per name and minute of one kind of activity (`$2`: `publish` per route, `consume`
/// per consumer) over the last `$1` minutes (this one included).
pub(super) const RATES: &str = "SELECT name, \
      (EXTRACT(EPOCH FROM date_trunc('minute', now()) - minute) / 60)::int4, count \
    FROM {s}.activity WHERE kind = $2 \
      AND minute > date_trunc('minute', now()) - make_interval(mins => $1)";

/// Every consumer known to this database (a heartbeat, a pause, an open dead letter, a
/// conflict, recent activity), at most 1,000 by name, with: its processes up (a heartbeat
/// within two intervals), the largest lag their engines last reported, whether it is paused,
/// its open dead letters and its open (not resolved) conflicts.
pub(super) const CONSUMERS: &str = "WITH names AS ( \
      SELECT name FROM {s}.instances WHERE kind = 'consumer' \
      UNION SELECT name FROM {s}.pauses WHERE kind = 'consumer' \
      UNION SELECT consumer_name FROM {s}.consumer_dead_letters WHERE state <> 'resolved' \
      UNION SELECT consumer_name FROM {s}.inbox_conflicts WHERE resolved_at IS NULL \
      UNION SELECT name FROM {s}.activity WHERE kind = 'consume' \
    ), live AS ( \
      SELECT name, stats FROM {s}.instances WHERE kind = 'consumer' AND stopped_at IS NULL \
        AND heartbeat_at > now() - make_interval(secs => interval_ms * 2 / 1000.0) \
    ) \
    SELECT n.name, \
      (SELECT count(*) FROM live l WHERE l.name = n.name), \
      (SELECT max((l.stats ->> 'lag')::int8) FROM live l WHERE l.name = n.name \
         AND jsonb_typeof(l.stats -> 'lag') = 'number'), \
      EXISTS (SELECT 1 FROM {s}.pauses p WHERE p.kind = 'consumer' AND p.name = n.name), \
      (SELECT count(*) FROM {s}.consumer_dead_letters d \
         WHERE d.consumer_name = n.name AND d.state <> 'resolved'), \
      (SELECT count(*) FROM {s}.inbox_conflicts c \
         WHERE c.consumer_name = n.name AND c.resolved_at IS NULL) \
    FROM names n ORDER BY n.name LIMIT 1000";

/// One consumer's numbers on the console.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerView {
    /// The consumer's name (its inbox key).
    pub name: String,
    /// Its processes whose heartbeat is up.
    pub instances_up: i64,
    /// Messages waiting for it at the broker, the largest its running engines last reported
    /// (`Heartbeat::with_consumer`); `None` when none reports one.
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

/// Builds the consumers from their rows and their `consume` rates.
pub(super) fn consumers(rows: &[PgRow], rates: &[PgRow]) -> Result<Vec<ConsumerView>, sqlx::Error> {
    let mut by_name: BTreeMap<String, ConsumerView> = BTreeMap::new();
    for r in rows {
        let name: String = r.try_get(0)?;
        by_name.insert(
            name.clone(),
            ConsumerView {
                name,
                instances_up: r.try_get(1)?,
                lag: r.try_get(2)?,
                paused: r.try_get(3)?,
                dead_letters: r.try_get(4)?,
                conflicts: r.try_get(5)?,
                processed_per_minute: vec![0; MINUTES],
            },
        );
    }
    for (name, slot, count) in per_minute(rates)? {
        if let Some(v) = by_name.get_mut(&name) {
            v.processed_per_minute[slot] += count;
        }
    }
    Ok(by_name.into_values().collect())
}

/// The rows of [`RATES`] as (name, index in a [`MINUTES`] series, count), dropping rows
/// outside the window.
fn per_minute(rates: &[PgRow]) -> Result<Vec<(String, usize, i64)>, sqlx::Error> {
    let mut out = Vec::with_capacity(rates.len());
    for r in rates {
        let ago: i32 = r.try_get(1)?;
        if let Ok(ago) = usize::try_from(ago)
            && ago < MINUTES
        {
            out.push((r.try_get(0)?, MINUTES - 1 - ago, r.try_get(2)?));
        }
    }
    Ok(out)
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
    /// `crate::heartbeat::Heartbeat::with_health`), its ages as of now: why it is stuck, when
    /// it is. `None` for a process that does not report one. Taken out of `stats`.
    pub health: Option<HealthReport>,
}

pub(super) fn instance(r: &PgRow) -> Result<Instance, sqlx::Error> {
    let interval_ms: i32 = r.try_get(8)?;
    let stopped: Option<DateTime<Utc>> = r.try_get(10)?;
    let age: f64 = r.try_get(11)?;
    let interval = f64::from(interval_ms) / 1000.0;
    let mut stats: serde_json::Value = r.try_get(9)?;
    // A report this version cannot read (another version's) is left in the stats.
    let health = stats
        .get(crate::heartbeat::HEALTH)
        .and_then(|h| serde_json::from_value::<HealthReport>(h.clone()).ok())
        .map(|h| h.aged(age));
    if health.is_some()
        && let Some(map) = stats.as_object_mut()
    {
        map.remove(crate::heartbeat::HEALTH);
    }
    let status = match stopped {
        Some(_) => "stopped",
        None if age <= 2.0 * interval => "up",
        None if age <= 6.0 * interval => "late",
        None => "gone",
    };
    Ok(Instance {
        instance_id: r.try_get(0)?,
        kind: r.try_get(1)?,
        name: r.try_get(2)?,
        host: r.try_get(3)?,
        pid: r.try_get(4)?,
        version: r.try_get(5)?,
        started_at: r.try_get(6)?,
        heartbeat_at: r.try_get(7)?,
        heartbeat_age_seconds: age,
        interval_ms,
        status,
        stats,
        health,
    })
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

/// Builds the routes from the counts' rows and the rates' rows.
pub(super) fn routes(counts: &[PgRow], rates: &[PgRow], bound: i64) -> Result<Routes, sqlx::Error> {
    let mut by_key: BTreeMap<String, RouteView> = BTreeMap::new();
    let mut complete = true;
    let view = |key: &str| {
        let (destination, aggregate_type) = match key.split_once(':') {
            Some(("destination", d)) => (Some(d.to_owned()), None),
            Some((_, t)) => (None, Some(t.to_owned())),
            None => (None, Some(key.to_owned())),
        };
        RouteView {
            destination,
            aggregate_type,
            pending: 0,
            oldest_pending_age_seconds: 0.0,
            dead_letters: 0,
            published_per_minute: vec![0; MINUTES],
        }
    };
    for r in counts {
        let key: String = r.try_get(0)?;
        let v = by_key.entry(key.clone()).or_insert_with(|| view(&key));
        v.pending = r.try_get(1)?;
        v.oldest_pending_age_seconds = r.try_get(2)?;
        v.dead_letters = r.try_get(3)?;
        complete = r.try_get(4)?;
    }
    for (key, slot, count) in per_minute(rates)? {
        let v = by_key.entry(key.clone()).or_insert_with(|| view(&key));
        v.published_per_minute[slot] += count;
    }
    let mut routes: Vec<RouteView> = by_key.into_values().collect();
    routes.sort_by(|a, b| {
        b.pending
            .cmp(&a.pending)
            .then(b.dead_letters.cmp(&a.dead_letters))
    });
    Ok(Routes {
        routes,
        counted_up_to: bound,
        complete,
    })
}
