//! The running processes (heartbeats, `crate::heartbeat`) and the routes' numbers: what the
//! console's overview shows beside the totals.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use outbox_core::health::HealthReport;
use outbox_core::operator::{
    ActivityKind, ConsumerView, Instance, MINUTES, MinuteCount, OperatorError, ProcessOps,
    RouteView, Routes, check_bound, heartbeat_status, minute_slot,
};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use super::{op_err, trace};
use crate::store::PgStore;

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

/// Builds the consumers from their rows and their `consume` rates.
fn consumers_of(rows: &[PgRow], rates: &[PgRow]) -> Result<Vec<ConsumerView>, sqlx::Error> {
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
        if let Some(slot) = minute_slot(i64::from(ago)) {
            out.push((r.try_get(0)?, slot, r.try_get(2)?));
        }
    }
    Ok(out)
}

fn instance(r: &PgRow) -> Result<Instance, sqlx::Error> {
    let interval_ms: i32 = r.try_get(8)?;
    let stopped: Option<DateTime<Utc>> = r.try_get(10)?;
    let age: f64 = r.try_get(11)?;
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
    let status = heartbeat_status(stopped.is_some(), age, interval_ms);
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

/// Builds the routes from the counts' rows and the rates' rows.
fn routes_of(counts: &[PgRow], rates: &[PgRow], bound: i64) -> Result<Routes, sqlx::Error> {
    let mut by_key: BTreeMap<String, RouteView> = BTreeMap::new();
    let mut complete = true;
    for r in counts {
        let key: String = r.try_get(0)?;
        let v = by_key
            .entry(key.clone())
            .or_insert_with(|| RouteView::of_key(&key));
        v.pending = r.try_get(1)?;
        v.oldest_pending_age_seconds = r.try_get(2)?;
        v.dead_letters = r.try_get(3)?;
        complete = r.try_get(4)?;
    }
    for (key, slot, count) in per_minute(rates)? {
        let v = by_key
            .entry(key.clone())
            .or_insert_with(|| RouteView::of_key(&key));
        v.published_per_minute[slot] += count;
    }
    Ok(Routes::busiest_first(
        by_key.into_values().collect(),
        bound,
        complete,
    ))
}

impl ProcessOps for PgStore {
    async fn instances(&self) -> Result<Vec<Instance>, OperatorError> {
        trace::rows(self.pool(), self.schema(), INSTANCES, |q| q, instance)
            .await
            .map_err(|e| op_err("instances", e))
    }

    async fn routes(&self, bound: i64) -> Result<Routes, OperatorError> {
        const OP: &str = "routes";
        check_bound(OP, bound)?;
        let counts = sqlx::query(AssertSqlSafe(
            self.render(&ROUTES.replace("{key}", &crate::sql::route_key(""))),
        ))
        .bind(bound)
        .fetch_all(self.pool())
        .await
        .map_err(|e| op_err(OP, e))?;
        let rates =
            (self.rates(ActivityKind::Publish, MINUTES).await).map_err(|e| op_err(OP, e))?;
        routes_of(&counts, &rates, bound).map_err(|e| op_err(OP, e))
    }

    async fn consumers(&self) -> Result<Vec<ConsumerView>, OperatorError> {
        const OP: &str = "consumers";
        let rows = sqlx::query(AssertSqlSafe(self.render(CONSUMERS)))
            .fetch_all(self.pool())
            .await
            .map_err(|e| op_err(OP, e))?;
        let rates =
            (self.rates(ActivityKind::Consume, MINUTES).await).map_err(|e| op_err(OP, e))?;
        consumers_of(&rows, &rates).map_err(|e| op_err(OP, e))
    }

    async fn activity_counts(
        &self,
        kind: ActivityKind,
        minutes: usize,
    ) -> Result<Vec<MinuteCount>, OperatorError> {
        let rows = (self.rates(kind, minutes).await).map_err(|e| op_err("activity", e))?;
        rows.iter()
            .map(|r| {
                Ok(MinuteCount {
                    name: r.try_get(0)?,
                    minutes_ago: i64::from(r.try_get::<i32, _>(1)?),
                    count: r.try_get(2)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(|e| op_err("activity", e))
    }
}

impl PgStore {
    /// The `kind` activity of the last `minutes` minutes ([`RATES`]).
    pub(super) async fn rates(
        &self,
        kind: ActivityKind,
        minutes: usize,
    ) -> Result<Vec<sqlx::postgres::PgRow>, sqlx::Error> {
        sqlx::query(AssertSqlSafe(self.render(RATES)))
            .bind(i32::try_from(minutes).unwrap_or(i32::MAX))
            .bind(kind.as_str())
            .fetch_all(self.pool())
            .await
    }
}
