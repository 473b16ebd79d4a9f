//! Heartbeats: each running relay, consumer or executor process writes down that it is alive,
//! with its own numbers, so that an operator sees which processes are up, late or gone, and
//! how fast each route publishes (the console's overview; `outbox_postgres::admin`).
//!
//! `outbox relay` and `outbox effects run` run one. A service that embeds a consumer (or a
//! relay) starts its own:
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool, shutdown: tokio_util::sync::CancellationToken) {
//! use outbox_postgres::heartbeat::{Heartbeat, InstanceKind};
//! use outbox_postgres::Schema;
//! # fn consumer() -> std::sync::Arc<outbox_core::consumer::ConsumerStats> { unimplemented!() }
//! // `consumer.stats()` of the service's `PgConsumer`: its lag and throughput on the console.
//! let beat = Heartbeat::new(pool, Schema::default(), InstanceKind::Consumer, "ledger")
//!     .expect("a valid name")
//!     .with_consumer(consumer());
//! tokio::spawn(beat.run(shutdown));
//! # }
//! ```
//!
//! Every [`Heartbeat::interval`] (5 s by default) the process upserts its row of
//! `{schema}.instances` (one statement) and, for a relay, adds what it published since the
//! last beat to this minute's row of each route in `{schema}.activity` (one statement), and for
//! a consumer ([`Heartbeat::with_consumer`]) the effects it committed. About
//! once a minute a relay also deletes instance rows whose heartbeat is a day old and activity
//! rows two hours old (a consumer's or an executor's grants allow inserting rows and updating
//! their beat columns only, no deletes). A beat that fails (the database is down, a grant is missing) is logged and
//! retried at the next one: a heartbeat never stops the work it reports on. On shutdown the
//! row gets `stopped_at`, so a clean stop reads as stopped, not gone.
//!
//! The console reads a process as **up** while its last heartbeat is at most two intervals
//! old, **late** up to six, **gone** after that (or **stopped**).
//!
//! A relay's or a consumer's heartbeat also says why it is stuck: with
//! [`Heartbeat::with_health`] (a consumer's comes with [`Heartbeat::with_consumer`]) the stats
//! hold `health`, the engine's [`HealthReport`](outbox_core::health::HealthReport): its state
//! (`working`, `idle`, `degraded`, `failing`), its last error with its kind and age, its errors
//! in the last minute and its last progress. `outbox status` and the console show it.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::consumer::ConsumerStats;
use outbox_core::health::Health;
use outbox_core::relay::PublishActivity;
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::schema::Schema;

const BEAT: &str = "INSERT INTO {s}.instances (instance_id, kind, name, host, pid, version, \
    interval_ms, stats) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
    ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = now(), stats = EXCLUDED.stats, \
    stopped_at = NULL";

const ACTIVITY: &str = "INSERT INTO {s}.activity AS a (minute, kind, name, count) \
    SELECT date_trunc('minute', now()), $3, n, c FROM UNNEST($1::text[], $2::int8[]) AS u(n, c) \
    ON CONFLICT (minute, kind, name) DO UPDATE SET count = a.count + EXCLUDED.count";

const STOPPED: &str = "UPDATE {s}.instances SET stopped_at = now(), heartbeat_at = now(), \
    stats = $2 WHERE instance_id = $1";

const SWEEP_INSTANCES: &str =
    "DELETE FROM {s}.instances WHERE heartbeat_at < now() - interval '1 day'";
const SWEEP_ACTIVITY: &str = "DELETE FROM {s}.activity WHERE minute < now() - interval '2 hours'";

/// The key of the stats under which [`Heartbeat::with_health`] writes the engine's
/// [`HealthReport`](outbox_core::health::HealthReport).
pub const HEALTH: &str = "health";

/// What kind of process beats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceKind {
    /// A relay (`name`: its configured name, `relay` by default).
    Relay,
    /// A consumer (`name`: the consumer's name).
    Consumer,
    /// A remote-effect executor (`name`: the work-item kind).
    Executor,
}

impl InstanceKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Relay => "relay",
            Self::Consumer => "consumer",
            Self::Executor => "executor",
        }
    }
}

/// The activity key of a route: `destination:<d>` or `type:<aggregate type>`.
pub fn route_key(route: &outbox_core::relay::Route) -> String {
    match (&route.destination, &route.aggregate_type) {
        (Some(d), _) => format!("destination:{d}"),
        (None, Some(t)) => format!("type:{t}"),
        (None, None) => "type:".to_owned(),
    }
}

/// A name that cannot be recorded (empty, or longer than 255 characters).
#[derive(Debug, thiserror::Error)]
#[error("a heartbeat's name must have 1 to 255 characters, not {0:?}")]
pub struct InvalidName(pub String);

/// One process's heartbeat (see the module docs).
pub struct Heartbeat {
    pool: PgPool,
    schema: Schema,
    kind: InstanceKind,
    name: String,
    instance_id: Uuid,
    interval: Duration,
    activity: Option<Arc<PublishActivity>>,
    consumer: Option<Arc<ConsumerStats>>,
    health: Option<Arc<Health>>,
    stats: Option<Box<dyn Fn() -> serde_json::Value + Send + Sync>>,
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("instance_id", &self.instance_id)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl Heartbeat {
    /// A heartbeat of a `kind` process called `name`, every 5 s, under a new instance id.
    ///
    /// # Errors
    /// [`InvalidName`] for an empty name or one longer than 255 characters.
    pub fn new(
        pool: PgPool,
        schema: Schema,
        kind: InstanceKind,
        name: impl Into<String>,
    ) -> Result<Self, InvalidName> {
        let name = name.into();
        if name.is_empty() || name.chars().count() > 255 {
            return Err(InvalidName(name));
        }
        Ok(Self {
            pool,
            schema,
            kind,
            name,
            instance_id: Uuid::now_v7(),
            interval: Duration::from_secs(5),
            activity: None,
            consumer: None,
            health: None,
            stats: None,
        })
    }

    /// Beats every `interval` instead (at least 100 ms).
    #[must_use]
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(100));
        self
    }

    /// Writes what a relay published per route (its [`Relay::activity`](outbox_core::relay::Relay::activity)),
    /// and what it holds now (`in_flight`: batches, aggregates, rows and the oldest one's age
    /// in ms; for the polling relay, its leases).
    #[must_use]
    pub fn with_publish_activity(mut self, activity: Arc<PublishActivity>) -> Self {
        self.activity = Some(activity);
        self
    }

    /// Reports a consumer engine's own numbers ([`Consumer::stats`](outbox_core::consumer::Consumer::stats)):
    /// its counts, the source's lag and whether it is paused go into the instance's stats,
    /// and what it settled since the last beat (effects committed from deliveries, and
    /// requeued dead letters settled) into this minute's `activity` row of kind `consume`:
    /// the console's lag and throughput per consumer. The heartbeat takes the consumer's own
    /// name ([`ConsumerStats::name`]), the one its pauses and its inbox go by, whatever name
    /// it was built with. Its [`ConsumerStats::health`] goes in too
    /// ([`Heartbeat::with_health`]).
    #[must_use]
    pub fn with_consumer(mut self, stats: Arc<ConsumerStats>) -> Self {
        self.name = stats.name().to_owned();
        self.health = Some(stats.health());
        self.consumer = Some(stats);
        self
    }

    /// Writes what an engine says about itself (a relay's
    /// [`Relay::health`](outbox_core::relay::Relay::health)) into the stats as `health`: its
    /// state, last error, error rate and last progress ([`outbox_core::health`]).
    #[must_use]
    pub fn with_health(mut self, health: Arc<Health>) -> Self {
        self.health = Some(health);
        self
    }

    /// Reports these numbers with every beat (shown beside the process).
    #[must_use]
    pub fn with_stats(
        mut self,
        stats: impl Fn() -> serde_json::Value + Send + Sync + 'static,
    ) -> Self {
        self.stats = Some(Box::new(stats));
        self
    }

    /// This process's instance id (its row's key).
    pub fn instance_id(&self) -> Uuid {
        self.instance_id
    }

    /// The interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    fn stats(&self) -> serde_json::Value {
        let mut stats = self
            .stats
            .as_ref()
            .map_or_else(|| serde_json::json!({}), |f| f());
        if let (Some(activity), Some(map)) = (&self.activity, stats.as_object_mut()) {
            map.insert("published".into(), activity.total().into());
            if let Ok(in_flight) = serde_json::to_value(activity.in_flight()) {
                map.insert("in_flight".into(), in_flight);
            }
        }
        if let (Some(consumer), Some(map)) = (&self.consumer, stats.as_object_mut())
            && let Ok(serde_json::Value::Object(numbers)) =
                serde_json::to_value(consumer.snapshot())
        {
            map.extend(numbers);
        }
        if let (Some(health), Some(map)) = (&self.health, stats.as_object_mut())
            && let Ok(report) = serde_json::to_value(health.report())
        {
            map.insert(HEALTH.into(), report);
        }
        stats
    }

    /// Beats until `shutdown`, then records the stop.
    pub async fn run(self, shutdown: CancellationToken) {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "unknown".to_owned());
        let mut reported = std::collections::HashMap::new();
        let mut consumed = 0;
        let mut beats: u64 = 0;
        loop {
            if let Err(e) = self.beat(&host, &mut reported, &mut consumed, beats).await {
                tracing::warn!(error = %e, kind = self.kind.as_str(), name = %self.name,
                    "heartbeat not written; retrying at the next one");
            }
            beats += 1;
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.interval) => {}
            }
        }
        let _ = self.beat(&host, &mut reported, &mut consumed, 1).await;
        if let Err(e) = sqlx::query(AssertSqlSafe(self.schema.render(STOPPED)))
            .bind(self.instance_id)
            .bind(self.stats())
            .execute(&self.pool)
            .await
        {
            tracing::warn!(error = %e, "heartbeat: the stop was not recorded");
        }
    }

    /// One beat: the instance row, the activity since the last beat, and a sweep every 12th.
    async fn beat(
        &self,
        host: &str,
        reported: &mut std::collections::HashMap<outbox_core::relay::Route, u64>,
        consumed: &mut u64,
        n: u64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(self.schema.render(BEAT)))
            .bind(self.instance_id)
            .bind(self.kind.as_str())
            .bind(&self.name)
            .bind(host)
            .bind(i32::try_from(std::process::id()).unwrap_or(-1))
            .bind(env!("CARGO_PKG_VERSION"))
            .bind(i32::try_from(self.interval.as_millis()).unwrap_or(i32::MAX))
            .bind(self.stats())
            .execute(&self.pool)
            .await?;
        if let Some(activity) = &self.activity {
            let now = activity.snapshot();
            let (mut names, mut counts) = (Vec::new(), Vec::new());
            for (route, total) in &now {
                let delta = total - reported.get(route).copied().unwrap_or(0);
                if delta > 0 {
                    names.push(route_key(route));
                    counts.push(i64::try_from(delta).unwrap_or(i64::MAX));
                }
            }
            if !names.is_empty() {
                sqlx::query(AssertSqlSafe(self.schema.render(ACTIVITY)))
                    .bind(names)
                    .bind(counts)
                    .bind("publish")
                    .execute(&self.pool)
                    .await?;
            }
            // Only once written: a failed beat's publishes go into the next one.
            *reported = now;
        }
        if let Some(consumer) = &self.consumer {
            let n = consumer.snapshot();
            let total = n.processed + n.requeued_resolved;
            let delta = total.saturating_sub(*consumed);
            if delta > 0 {
                sqlx::query(AssertSqlSafe(self.schema.render(ACTIVITY)))
                    .bind(vec![self.name.clone()])
                    .bind(vec![i64::try_from(delta).unwrap_or(i64::MAX)])
                    .bind("consume")
                    .execute(&self.pool)
                    .await?;
            }
            *consumed = total;
        }
        // Only relays sweep (the consumer's and the executor's grants stop at their own row).
        if self.kind == InstanceKind::Relay && n.is_multiple_of(12) {
            for sweep in [SWEEP_INSTANCES, SWEEP_ACTIVITY] {
                sqlx::query(AssertSqlSafe(self.schema.render(sweep)))
                    .execute(&self.pool)
                    .await?;
            }
        }
        Ok(())
    }
}
