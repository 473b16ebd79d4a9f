//! Heartbeats: each running relay, consumer or executor process writes down that it is alive,
//! with its own numbers, so that an operator sees which processes are up, late or gone, and
//! how fast each route publishes (the operator contract's processes and routes,
//! [`crate::operator::ProcessOps`]).
//!
//! [`Heartbeat`] is the loop, written once; a store writes what it says through [`HeartbeatStore`]
//! (PostgreSQL's: `outbox_postgres::heartbeat`). Every [`Heartbeat::interval`] (5 s by default) the
//! process upserts its instance row (one statement) and writes its activity into this minute's
//! rows (one statement): for a relay, what it published since the last beat per route, and the
//! oldest pending age and the dead letters as its gauges last read them
//! ([`PublishActivity::backlog`]); for a consumer ([`Heartbeat::with_consumer`]), the effects it
//! committed and its lag. Work adds up; a level keeps the minute's highest reading, so the
//! console charts both per minute ([`ActivityKind`]). About once a minute a relay
//! also sweeps instance rows whose heartbeat is a day old and activity rows two hours old (a
//! consumer's or an executor's grants allow writing their own rows only, no deletes). A beat that
//! fails (the database is down, a grant is missing) is logged and retried at the next one: a
//! heartbeat never stops the work it reports on. On shutdown the row is marked stopped, so a clean
//! stop reads as stopped, not gone.
//!
//! An operator reads a process as **up** while its last heartbeat is at most two intervals
//! old, **late** up to six, **gone** after that (or **stopped**).
//!
//! A relay's or a consumer's heartbeat also says why it is stuck: with
//! [`Heartbeat::with_health`] (a consumer's comes with [`Heartbeat::with_consumer`]) the stats
//! hold [`HEALTH`], the engine's [`HealthReport`](crate::health::HealthReport): its state
//! (`working`, `idle`, `degraded`, `failing`), its last error with its kind and age, its errors
//! in the last minute and its last progress.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::consumer::ConsumerStats;
use crate::error::StoreError;
use crate::health::Health;
use crate::operator::{ActivityKind, OUTBOX_SERIES};
use crate::relay::{PublishActivity, Route};

/// The key of the stats under which [`Heartbeat::with_health`] writes the engine's
/// [`HealthReport`](crate::health::HealthReport).
pub const HEALTH: &str = "health";

/// Every this many beats a relay sweeps old instance and activity rows (once a minute at the
/// default interval).
const SWEEP_EVERY: u64 = 12;

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

/// The activity key of a route: `destination:<d>` or `type:<aggregate type>`
/// ([`crate::operator::route_key`]'s form).
pub fn route_key(route: &Route) -> String {
    crate::operator::route_key(
        route.destination.as_deref(),
        route.aggregate_type.as_deref().unwrap_or(""),
    )
}

/// A name that cannot be recorded (empty, or longer than 255 characters).
#[derive(Debug, thiserror::Error)]
#[error("a heartbeat's name must have 1 to 255 characters, not {0:?}")]
pub struct InvalidName(pub String);

/// One beat's instance row.
#[derive(Debug, Clone)]
pub struct Beat<'a> {
    /// The process's instance id (the row's key).
    pub instance_id: Uuid,
    /// What kind of process it is.
    pub kind: InstanceKind,
    /// Its name.
    pub name: &'a str,
    /// The host it runs on.
    pub host: &'a str,
    /// Its process id (-1 when it does not fit).
    pub pid: i32,
    /// The toolkit's version.
    pub version: &'a str,
    /// Its heartbeat interval, in milliseconds.
    pub interval_ms: i32,
    /// Its numbers ([`Heartbeat::with_stats`] and the rest).
    pub stats: serde_json::Value,
}

/// Where heartbeats are written: a store's instance and activity rows.
///
/// Errors are [`StoreError`]s: the heartbeat logs them and tries again at its next beat.
pub trait HeartbeatStore: Send + Sync + 'static {
    /// Upserts the instance's row: its heartbeat is now, its stats are `beat.stats`, and it is
    /// not stopped.
    fn beat(&self, beat: &Beat<'_>) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Writes `entries` into this minute's activity rows, in one go: work counted
    /// ([`ActivityKind::Publish`] per route key, [`ActivityKind::Consume`] per consumer name) is
    /// added to its row; a level ([`ActivityKind::is_level`]) keeps the highest reading any
    /// process reported in the minute. Entries may repeat a kind and name: they are merged
    /// the same way.
    fn add_activity(
        &self,
        entries: Vec<ActivityEntry>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records the instance's stop (its last stats with it).
    fn stopped(
        &self,
        instance_id: Uuid,
        stats: serde_json::Value,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Deletes instance rows whose heartbeat is a day old and activity rows two hours old.
    fn sweep(&self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// What a beat adds to this minute's activity row of `kind` and `name`: work done since the
/// last beat, or a level's reading now ([`ActivityKind::is_level`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityEntry {
    /// What it counts or reads.
    pub kind: ActivityKind,
    /// The route key, the consumer's name, or [`OUTBOX_SERIES`].
    pub name: String,
    /// The work done, or the reading.
    pub value: i64,
}

/// An entry of `value` (saturated into an `i64`).
fn entry(kind: ActivityKind, name: String, value: u64) -> ActivityEntry {
    ActivityEntry {
        kind,
        name,
        value: i64::try_from(value).unwrap_or(i64::MAX),
    }
}

/// A source of extra numbers for each beat.
type StatsFn = Box<dyn Fn() -> serde_json::Value + Send + Sync>;

/// One process's heartbeat (see the module docs).
pub struct Heartbeat<S> {
    store: S,
    kind: InstanceKind,
    name: String,
    instance_id: Uuid,
    interval: Duration,
    activity: Option<Arc<PublishActivity>>,
    consumer: Option<Arc<ConsumerStats>>,
    health: Option<Arc<Health>>,
    stats: Option<StatsFn>,
}

impl<S> std::fmt::Debug for Heartbeat<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heartbeat")
            .field("kind", &self.kind)
            .field("name", &self.name)
            .field("instance_id", &self.instance_id)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// What the beats have written so far: the published totals per route and the consumed total.
#[derive(Debug, Default)]
struct Reported {
    published: HashMap<Route, u64>,
    consumed: u64,
}

impl<S: HeartbeatStore> Heartbeat<S> {
    /// A heartbeat of a `kind` process called `name`, written to `store`, every 5 s, under a
    /// new instance id.
    ///
    /// # Errors
    /// [`InvalidName`] for an empty name or one longer than 255 characters.
    pub fn new(store: S, kind: InstanceKind, name: impl Into<String>) -> Result<Self, InvalidName> {
        let name = name.into();
        if name.is_empty() || name.chars().count() > 255 {
            return Err(InvalidName(name));
        }
        Ok(Self {
            store,
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

    /// Writes what a relay published per route (its
    /// [`Relay::activity`](crate::relay::Relay::activity)), and what it holds now
    /// (`in_flight`: batches, aggregates, rows and the oldest one's age in ms; for the polling
    /// relay, its leases).
    #[must_use]
    pub fn with_publish_activity(mut self, activity: Arc<PublishActivity>) -> Self {
        self.activity = Some(activity);
        self
    }

    /// Reports a consumer engine's own numbers
    /// ([`Consumer::stats`](crate::consumer::Consumer::stats)): its counts, the source's lag
    /// and whether it is paused go into the instance's stats, and what it settled since the
    /// last beat (effects committed from deliveries, and requeued dead letters settled) into
    /// this minute's activity row of kind `consume`: the operator's lag and throughput per
    /// consumer. The heartbeat takes the consumer's own name ([`ConsumerStats::name`]), the one
    /// its pauses and its inbox go by, whatever name it was built with. Its
    /// [`ConsumerStats::health`] goes in too ([`Heartbeat::with_health`]).
    #[must_use]
    pub fn with_consumer(mut self, stats: Arc<ConsumerStats>) -> Self {
        self.name = stats.name().to_owned();
        self.health = Some(stats.health());
        self.consumer = Some(stats);
        self
    }

    /// Writes what an engine says about itself (a relay's
    /// [`Relay::health`](crate::relay::Relay::health)) into the stats as [`HEALTH`]: its
    /// state, last error, error rate and last progress ([`crate::health`]).
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
        let mut reported = Reported::default();
        let mut beats: u64 = 0;
        loop {
            if let Err(e) = self.beat(&host, &mut reported, beats).await {
                tracing::warn!(error = %e, kind = self.kind.as_str(), name = %self.name,
                    "heartbeat not written; retrying at the next one");
            }
            beats += 1;
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.interval) => {}
            }
        }
        let _ = self.beat(&host, &mut reported, 1).await;
        if let Err(e) = self.store.stopped(self.instance_id, self.stats()).await {
            tracing::warn!(error = %e, "heartbeat: the stop was not recorded");
        }
    }

    /// The levels of this beat: the relay's backlog as its gauges last read it, the
    /// consumer's lag once its source has reported one.
    fn levels(&self) -> Vec<ActivityEntry> {
        let mut levels = Vec::new();
        if let Some(backlog) = self.activity.as_ref().and_then(|a| a.backlog()) {
            let age = backlog.oldest_pending_age.unwrap_or_default().as_secs();
            let dead = u64::try_from(backlog.dead).unwrap_or(0);
            levels.push(entry(
                ActivityKind::OldestPendingAge,
                OUTBOX_SERIES.into(),
                age,
            ));
            levels.push(entry(ActivityKind::DeadLetters, OUTBOX_SERIES.into(), dead));
        }
        if let Some(lag) = self.consumer.as_ref().and_then(|c| c.snapshot().lag) {
            levels.push(entry(ActivityKind::Lag, self.name.clone(), lag));
        }
        levels
    }

    /// One beat: the instance row, the activity since the last beat, and a sweep every
    /// [`SWEEP_EVERY`]th (a relay's).
    async fn beat(&self, host: &str, reported: &mut Reported, n: u64) -> Result<(), StoreError> {
        self.store
            .beat(&Beat {
                instance_id: self.instance_id,
                kind: self.kind,
                name: &self.name,
                host,
                pid: i32::try_from(std::process::id()).unwrap_or(-1),
                version: env!("CARGO_PKG_VERSION"),
                interval_ms: i32::try_from(self.interval.as_millis()).unwrap_or(i32::MAX),
                stats: self.stats(),
            })
            .await?;
        let mut entries = Vec::new();
        let published = self.activity.as_ref().map(|a| a.snapshot());
        for (route, total) in published.iter().flatten() {
            let delta = total - reported.published.get(route).copied().unwrap_or(0);
            if delta > 0 {
                entries.push(entry(ActivityKind::Publish, route_key(route), delta));
            }
        }
        let consumed = self.consumer.as_ref().map(|c| {
            let numbers = c.snapshot();
            numbers.processed + numbers.requeued_resolved
        });
        let delta = consumed.map_or(0, |total| total.saturating_sub(reported.consumed));
        if delta > 0 {
            entries.push(entry(ActivityKind::Consume, self.name.clone(), delta));
        }
        entries.extend(self.levels());
        if !entries.is_empty() {
            self.store.add_activity(entries).await?;
        }
        // Only once written: a failed beat's work goes into the next one.
        if let Some(published) = published {
            reported.published = published;
        }
        if let Some(consumed) = consumed {
            reported.consumed = consumed;
        }
        // Only relays sweep (the consumer's and the executor's grants stop at their own row).
        if self.kind == InstanceKind::Relay && n.is_multiple_of(SWEEP_EVERY) {
            self.store.sweep().await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A fake store: records what the heartbeat writes.
    #[derive(Default)]
    struct FakeInstances {
        calls: Mutex<Vec<String>>,
        beats: tokio::sync::Notify,
    }

    impl HeartbeatStore for Arc<FakeInstances> {
        async fn beat(&self, beat: &Beat<'_>) -> Result<(), StoreError> {
            self.calls.lock().unwrap().push(format!(
                "beat {} {} {}",
                beat.kind.as_str(),
                beat.name,
                beat.stats["answer"]
            ));
            self.beats.notify_one();
            Ok(())
        }

        async fn add_activity(&self, entries: Vec<ActivityEntry>) -> Result<(), StoreError> {
            let entries: Vec<String> = entries
                .iter()
                .map(|e| format!("{} {}={}", e.kind.as_str(), e.name, e.value))
                .collect();
            self.calls
                .lock()
                .unwrap()
                .push(format!("activity {}", entries.join(", ")));
            Ok(())
        }

        async fn stopped(&self, _: Uuid, _: serde_json::Value) -> Result<(), StoreError> {
            self.calls.lock().unwrap().push("stopped".into());
            Ok(())
        }

        async fn sweep(&self) -> Result<(), StoreError> {
            self.calls.lock().unwrap().push("sweep".into());
            Ok(())
        }
    }

    #[test]
    fn a_name_must_have_1_to_255_characters() {
        let store = Arc::new(FakeInstances::default());
        assert!(Heartbeat::new(Arc::clone(&store), InstanceKind::Relay, "").is_err());
        assert!(Heartbeat::new(Arc::clone(&store), InstanceKind::Relay, "r".repeat(256)).is_err());
        assert!(Heartbeat::new(store, InstanceKind::Relay, "r".repeat(255)).is_ok());
    }

    #[tokio::test]
    async fn a_relay_beats_sweeps_at_its_first_beat_and_records_its_stop() {
        let store = Arc::new(FakeInstances::default());
        let beat = Heartbeat::new(Arc::clone(&store), InstanceKind::Relay, "relay")
            .unwrap()
            .with_interval(Duration::from_millis(100))
            .with_stats(|| serde_json::json!({ "answer": 42 }));
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(beat.run(shutdown.clone()));
        store.beats.notified().await;
        store.beats.notified().await;
        shutdown.cancel();
        running.await.unwrap();
        let calls = store.calls.lock().unwrap().clone();
        assert_eq!(calls[0], "beat relay relay 42");
        assert_eq!(calls[1], "sweep", "a relay sweeps at its first beat");
        assert_eq!(calls.last().map(String::as_str), Some("stopped"));
        assert_eq!(calls.iter().filter(|c| *c == "sweep").count(), 1);
    }

    #[test]
    fn a_beat_reads_the_relays_backlog_and_the_consumers_lag_as_levels() {
        let store = Arc::new(FakeInstances::default());
        let activity = Arc::new(PublishActivity::default());
        let relay = Heartbeat::new(Arc::clone(&store), InstanceKind::Relay, "relay")
            .unwrap()
            .with_publish_activity(Arc::clone(&activity));
        assert_eq!(relay.levels(), [], "no reading yet, no level");
        activity.record_backlog(crate::store::OutboxStats {
            dead: 4,
            oldest_pending_age: Some(Duration::from_millis(90_700)),
            ..Default::default()
        });
        let level = |kind, name: &str, value| entry(kind, name.to_owned(), value);
        assert_eq!(
            relay.levels(),
            [
                level(ActivityKind::OldestPendingAge, OUTBOX_SERIES, 90),
                level(ActivityKind::DeadLetters, OUTBOX_SERIES, 4)
            ]
        );

        let stats = Arc::new(ConsumerStats::new("ledger"));
        let consumer = Heartbeat::new(store, InstanceKind::Consumer, "any")
            .unwrap()
            .with_consumer(Arc::clone(&stats));
        assert_eq!(consumer.levels(), [], "no lag read yet, no level");
        stats.set_lag(7);
        assert_eq!(consumer.levels(), [level(ActivityKind::Lag, "ledger", 7)]);
    }

    #[test]
    fn a_route_key_names_the_destination_or_the_aggregate_type() {
        let with = |destination: Option<&str>, aggregate_type: Option<&str>| Route {
            destination: destination.map(str::to_owned),
            aggregate_type: aggregate_type.map(str::to_owned),
        };
        assert_eq!(
            route_key(&with(Some("payments"), None)),
            "destination:payments"
        );
        assert_eq!(route_key(&with(None, Some("order"))), "type:order");
        assert_eq!(route_key(&with(None, None)), "type:");
    }
}
