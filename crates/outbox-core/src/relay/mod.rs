//! The relay: the publish engine ([`Relay`]) between a [`Feed`] (where pending events come
//! from) and a [`Transport`] (the broker).
//!
//! One loop per worker: take a batch from the feed, publish each aggregate's run of versions in
//! order (different aggregates concurrently), and hand the outcome back to the feed, which
//! confirms what the broker acknowledged, schedules a retry (with backoff) or a dead letter for
//! what failed, and gives back what was not attempted. The polling feed ([`PollingFeed`]) claims
//! rows from an [`OutboxStore`] under a lease; other feeds (change data capture) plug in through
//! [`Feed`] without touching publishing, ordering, the failure policy or the metrics.
//!
//! # Ordering and leases
//!
//! A feed only hands out an aggregate's lowest unpublished versions, and only to one live
//! batch at a time. Within a batch the relay publishes one aggregate's messages strictly one
//! after another: version `n + 1` is sent only after the broker acknowledged `n`. When a
//! publish fails, the rest of that aggregate's run is released untouched (the key is parked,
//! the other aggregates go on).
//!
//! A polling claim's lease is measured locally from *before* the claim was sent, so the local
//! deadline ([`FeedBatch::owned_until`]) is never later than the database's. The relay starts a publish only while at least
//! `publish_timeout + lease_safety_margin` of the lease remains, and every publish is cut at
//! `publish_timeout`. So once a lease can have expired in the database, this relay has no
//! publish of those rows in progress and starts none: a relay that takes the aggregate over
//! cannot be overtaken by a stale one. Marks are fenced by the lease token in the database; a
//! stale mark changes nothing.
//!
//! A store may also tie a claim to a session that can end before the lease's clock does
//! ([`FeedBatch::liveness`], e.g. the relay's database session): another relay then takes
//! the aggregates over as soon as the session is gone, and the engine starts a publish only
//! while the session's [`Liveness`](crate::Liveness) allows it. The old owner's publishes can
//! then overlap the new owner's by at most the session's window (plus one publish in flight),
//! which gives copies, never a first delivery out of order: each relay publishes an aggregate's
//! run from its lowest unpublished version, each version after the previous one's
//! acknowledgement.
//!
//! # Saying why it is stuck
//!
//! The relay records its failed claims and settles, its failed publishes (the transport's
//! error), its dead letters and its lost leases, and its progress (rows published or
//! dead-lettered), in its [`Relay::health`] ([`crate::health`]): the heartbeat writes it down,
//! and [`metric::ERRORS`] and [`metric::LAST_PROGRESS`] export it.

mod activity;
mod feed;
mod health;
pub mod log;
mod publish;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

pub use activity::{BACKLOG_FRESH_FOR, InFlight, PublishActivity, Route};
pub use feed::{FailedRow, Feed, FeedBatch, PollingFeed, PollingTicket, SettleReport, Settlement};

use crate::backoff::Backoff;
use crate::crash;
use crate::error::{ConfigError, StoreError};
use crate::health::{Health, TroubleKind};
use crate::message::OutboxMessage;
use crate::store::{OutboxStore, Takeover, UndecodableRow};
use crate::transport::Transport;

/// Metric names exported by the relay (through the `metrics` facade).
pub mod metric {
    /// Counter: messages the broker acknowledged. Label `transport`.
    pub const PUBLISHED: &str = "outbox_published_total";
    /// Counter: failed publish attempts. Labels `transport`, `kind`.
    pub const PUBLISH_FAILURES: &str = "outbox_publish_failures_total";
    /// Counter: messages moved to the dead-letter state.
    pub const DEAD_LETTERED: &str = "outbox_dead_lettered_total";
    /// Counter: acknowledgements in which the broker reported a duplicate event id.
    pub const BROKER_DUPLICATES: &str = "outbox_broker_duplicates_total";
    /// Counter: rows whose mark or failure record was refused because the lease was lost.
    pub const LEASE_LOST: &str = "outbox_lease_lost_total";
    /// Histogram: seconds from sending a message to its durable acknowledgement.
    pub const PUBLISH_LATENCY: &str = "outbox_publish_latency_seconds";
    /// Gauge: pending rows (not published, not dead).
    pub const PENDING: &str = "outbox_pending";
    /// Gauge: age in seconds of the oldest pending row (0 when none).
    pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
    /// Gauge: dead letters.
    pub const DEAD_LETTERS: &str = "outbox_dead_letters";
    /// Gauge: pending rows that failed at least once.
    pub const RETRYING: &str = "outbox_retrying";
    /// Counter: aggregates taken over from a lease that expired unsettled (the relay holding
    /// it crashed, froze or lost the database). Steady growth means relays die mid-batch.
    pub const TAKEOVERS: &str = "outbox_lease_takeovers_total";
    /// Histogram: seconds from the moment the store could hand a taken-over aggregate to
    /// another relay (a sweep found its holder's database session gone, or its lease ran out)
    /// to the end of the batch that published its head again: how fast the survivors react,
    /// per aggregate. Not in it: how long the holder had been dead before that (the sweep's
    /// interval for a closed connection, the server's timeout for a vanished host; W7 in
    /// BENCHMARKS.md measures from the kill).
    pub const TAKEOVER_SECONDS: &str = "outbox_takeover_seconds";
    /// Counter: rows dead-lettered because they cannot be published as stored
    /// ([`crate::UndecodableRow`]: a header value that is not a string, a header name that is
    /// not a token ...). Also counted in [`DEAD_LETTERED`]. Any increase means a producer
    /// writes rows the outbox's rules refuse.
    pub const UNDECODABLE: &str = "outbox_undecodable_rows_total";
    /// Counter: the relay's errors by kind (label `kind`: `claim`, `publish`, `settle`,
    /// `lease_lost`, `dead_letter`; [`crate::health::TroubleKind`]). A batch's failed publishes
    /// count one each, like [`PUBLISH_FAILURES`].
    pub const ERRORS: &str = "outbox_relay_errors_total";
    /// Gauge: unix time, seconds, of the relay's last progress (a row published or
    /// dead-lettered); the relay's start until its first. With [`PENDING`] above 0, a value
    /// that stops moving means the relay is stuck: its heartbeat says why.
    pub const LAST_PROGRESS: &str = "outbox_relay_last_progress_timestamp_seconds";
}

/// Relay settings. Defaults suit a service publishing up to tens of thousands of events a
/// second from one database.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows per batch.
    pub batch_size: usize,
    /// Rows of one aggregate per claim (polling feed).
    pub max_per_aggregate: usize,
    /// Lease length of a claim (polling feed).
    pub lease: Duration,
    /// A publish not acknowledged within this time counts as failed (outcome unknown: the row
    /// is retried with the same event id).
    pub publish_timeout: Duration,
    /// Extra time kept between the last publish start and the lease end, covering clock rate
    /// differences and scheduling delays.
    pub lease_safety_margin: Duration,
    /// Publishes in flight at once within a batch (across different aggregates).
    pub max_in_flight: usize,
    /// Concurrent claim loops in this relay process.
    pub workers: usize,
    /// Longest wait between claims when idle (a wake-up ends it early).
    pub poll_interval: Duration,
    /// Failed attempts after which a message is dead-lettered.
    pub max_attempts: i32,
    /// Backoff between attempts of one message.
    pub backoff: Backoff,
    /// How often the pending / oldest-age / dead gauges are refreshed, at most: the statement
    /// behind them counts the backlog, so its cost grows with it, and after a costly count the
    /// next one waits [`STATS_SPACING`] times as long as it took, up to [`STATS_MAX_WAIT`].
    pub stats_interval: Duration,
    /// Poison rows: the takeover at which a head row is dead-lettered instead of published.
    /// A takeover happens when the relay holding an aggregate ended without settling it
    /// (crashed, froze, lost the database). The first takeover goes with a normal claim (a
    /// crashed relay's aggregates are republished at full speed). If that one is not settled
    /// either, the aggregate is handed out alone, its head row only
    /// ([`PollingFeed::with_solo_takeovers`]), so a relay that dies again held only that row;
    /// each takeover with the same head counts one more. At `poison_after_takeovers` the row
    /// is dead-lettered with the reason and its aggregate waits behind it (requeue it once the
    /// cause is fixed): a row that crashes the relay process parks itself instead of the
    /// fleet. An innocent row that shared a batch with it counts at most 2, so the limit must
    /// be at least 3; with 3, the poison is parked after three crashes. `0` turns the rule off
    /// (every takeover then goes with a normal claim). Every relay of a fleet should use the
    /// same value. Polling feed only: the CDC feed has no leases.
    pub poison_after_takeovers: u32,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 1000,
            max_per_aggregate: 100,
            lease: Duration::from_secs(30),
            publish_timeout: Duration::from_secs(10),
            lease_safety_margin: Duration::from_secs(1),
            max_in_flight: 512,
            workers: 2,
            poll_interval: Duration::from_millis(250),
            max_attempts: 12,
            backoff: Backoff::default(),
            stats_interval: Duration::from_secs(5),
            poison_after_takeovers: 5,
        }
    }
}

impl RelayConfig {
    /// Checks the settings against each other.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, reason: String| Err(ConfigError::new(key, reason));
        if self.batch_size == 0 {
            return bad("batch_size", "must be at least 1".into());
        }
        if self.max_per_aggregate == 0 {
            return bad("max_per_aggregate", "must be at least 1".into());
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight", "must be at least 1".into());
        }
        if self.workers == 0 {
            return bad("workers", "must be at least 1".into());
        }
        if self.max_attempts < 1 {
            return bad("max_attempts", "must be at least 1".into());
        }
        if self.publish_timeout.is_zero() {
            return bad("publish_timeout", "must be positive".into());
        }
        let needed = self.publish_timeout * 2 + self.lease_safety_margin;
        if self.lease < needed {
            return bad(
                "lease",
                format!(
                    "must be at least 2 x publish_timeout + lease_safety_margin = {needed:?}, got {:?}",
                    self.lease
                ),
            );
        }
        if self.poll_interval.is_zero() {
            return bad(
                "poll_interval",
                "must be positive (zero would claim in a busy loop)".into(),
            );
        }
        if matches!(self.poison_after_takeovers, 1 | 2) {
            return bad(
                "poison_after_takeovers",
                format!(
                    "must be 0 (off) or at least 3, got {}: a row that only shared a batch with \
                     a poison row is taken over twice",
                    self.poison_after_takeovers
                ),
            );
        }
        if self.stats_interval.is_zero() {
            return bad(
                "stats_interval",
                "must be positive (zero would count the table in a busy loop)".into(),
            );
        }
        if !self.backoff.is_valid() {
            return bad("backoff", "base must be positive and not above max".into());
        }
        Ok(())
    }
}

/// What one batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows the broker acknowledged and that were marked.
    pub published: usize,
    /// Rows whose mark or failure record was refused (lease lost): they will be republished.
    pub lease_lost: usize,
    /// Rows that failed and will be retried.
    pub retried: usize,
    /// Rows dead-lettered.
    pub dead_lettered: usize,
    /// Rows released unattempted.
    pub released: usize,
}

/// Records [`metric::TAKEOVER_SECONDS`] for each aggregate `batch` took over whose head was
/// published: how long it had been ownerless when claimed, plus the time since the claim.
fn record_takeover_times(takeovers: &[Takeover], claimed_for: Duration, published: &[i64]) {
    for t in takeovers {
        if let Some(orphaned) = t.orphaned_for
            && published.contains(&t.head)
        {
            metrics::histogram!(metric::TAKEOVER_SECONDS)
                .record((orphaned + claimed_for).as_secs_f64());
        }
    }
}

/// Rows of a batch the engine does not publish because their head is a poison row.
#[derive(Debug, Default, PartialEq)]
struct SetAside {
    /// Poison heads, dead-lettered with the reason.
    failed: Vec<FailedRow>,
    /// Rows of their aggregates behind them: given back.
    not_attempted: Vec<i64>,
}

/// Applies the poison-row rule ([`RelayConfig::poison_after_takeovers`]) to a batch: a head
/// taken over `poison_after` times in a row is dead-lettered, with the rest of its aggregate's
/// run given back. Returns what to publish, in the batch's order, and what was set aside.
/// With the rule off (`0`) everything is published.
fn set_aside_takeovers(
    messages: &[OutboxMessage],
    takeovers: &[Takeover],
    poison_after: u32,
) -> (Vec<OutboxMessage>, SetAside) {
    metrics::counter!(metric::TAKEOVERS).increment(takeovers.len() as u64);
    let most = takeovers.iter().map(|t| t.count).max().unwrap_or(0);
    if takeovers.len() == 1 && most > 1 {
        let head = messages.iter().find(|m| m.id == takeovers[0].head);
        warn!(
            event_id = ?head.map(|m| m.event_id),
            takeovers = most,
            limit = poison_after,
            "taken over alone again: the relays that held this event ended without settling it"
        );
    } else {
        warn!(
            aggregates = takeovers.len(),
            "taken over from a relay that ended without settling them (crashed, froze or lost \
             the database)"
        );
    }
    let mut aside = SetAside::default();
    let mut publish = Vec::with_capacity(messages.len());
    for run in publish::split_runs(messages) {
        let head = &messages[run.start];
        let takeover = takeovers.iter().find(|t| t.head == head.id);
        let Some(takeover) = takeover.filter(|t| poison_after > 0 && t.count >= poison_after)
        else {
            publish.extend_from_slice(&messages[run]);
            continue;
        };
        error!(
            event_id = %head.event_id,
            aggregate_type = %head.aggregate_type,
            aggregate_id = %head.aggregate_id,
            version = head.aggregate_version,
            takeovers = takeover.count,
            "poison row: every relay that held this event alone ended without settling it; \
             dead-lettered so that the rest of the outbox moves on"
        );
        aside.failed.push(FailedRow {
            id: head.id,
            error: format!(
                "poison row: taken over {} times in a row without being settled (each relay \
                 holding it crashed, froze or lost the database before it could settle); \
                 requeue it once the cause is fixed",
                takeover.count
            ),
            retry_after: None,
        });
        aside
            .not_attempted
            .extend(messages[run.start + 1..run.end].iter().map(|m| m.id));
    }
    (publish, aside)
}

/// Sets aside the rows of a batch that cannot be published as stored: each is dead-lettered
/// with its reason (into `aside.failed`), and the rows of its aggregate after it are given back
/// (into `aside.not_attempted`), as behind any dead letter. Returns what is left to publish, in
/// the batch's order.
fn set_aside_undecodable(
    messages: &[OutboxMessage],
    undecodable: &[UndecodableRow],
    aside: &mut SetAside,
) -> Vec<OutboxMessage> {
    metrics::counter!(metric::UNDECODABLE).increment(undecodable.len() as u64);
    for row in undecodable {
        error!(
            row = row.id,
            event_id = ?row.event_id,
            aggregate_type = %row.aggregate_type,
            aggregate_id = %row.aggregate_id,
            version = row.aggregate_version,
            reason = %row.reason,
            "a row that cannot be published as stored: dead-lettered; its aggregate waits behind it"
        );
        aside.failed.push(FailedRow {
            id: row.id,
            error: format!(
                "cannot be published as stored: {}; correct the row, then requeue it",
                row.reason
            ),
            retry_after: None,
        });
    }
    let behind = |m: &OutboxMessage| {
        undecodable.iter().any(|u| {
            u.aggregate_version < m.aggregate_version
                && u.aggregate_id == m.aggregate_id
                && u.aggregate_type == m.aggregate_type
        })
    };
    let mut publish = Vec::with_capacity(messages.len());
    for m in messages {
        if behind(m) {
            aside.not_attempted.push(m.id);
        } else {
            publish.push(m.clone());
        }
    }
    publish
}

/// The publish engine: a [`Feed`] on one side, a [`Transport`] on the other.
pub struct Relay<F, T> {
    feed: Arc<F>,
    transport: Arc<T>,
    config: RelayConfig,
    activity: Arc<PublishActivity>,
    health: Arc<Health>,
}

impl<S: OutboxStore, T: Transport> Relay<PollingFeed<S>, T> {
    /// A polling relay: claims from `store` with the lease and per-aggregate cap of `config`.
    ///
    /// # Errors
    /// [`ConfigError`] when the configuration is inconsistent.
    pub fn new(store: Arc<S>, transport: Arc<T>, config: RelayConfig) -> Result<Self, ConfigError> {
        let mut feed = PollingFeed::new(store, config.max_per_aggregate, config.lease);
        if config.poison_after_takeovers > 0 {
            feed = feed.with_solo_takeovers(SOLO_TAKEOVER_CHECK);
        }
        Self::with_feed(Arc::new(feed), transport, config)
    }

    /// The polling feed's store.
    pub fn store(&self) -> &Arc<S> {
        self.feed.store()
    }
}

impl<F: Feed, T: Transport> Relay<F, T> {
    /// A relay over any feed. `config.lease` and `config.max_per_aggregate` are the polling
    /// feed's; other feeds bring their own.
    ///
    /// # Errors
    /// [`ConfigError`] when the configuration is inconsistent.
    pub fn with_feed(
        feed: Arc<F>,
        transport: Arc<T>,
        config: RelayConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            feed,
            transport,
            config,
            activity: Arc::default(),
            health: Arc::new(Health::with_metrics(
                metric::ERRORS,
                metric::LAST_PROGRESS,
                Vec::new(),
            )),
        })
    }

    /// Its last error, error rate and last progress (for a heartbeat to write down; see
    /// [`crate::health`]).
    pub fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// What this relay published per route since it started (for a heartbeat to write down).
    pub fn activity(&self) -> Arc<PublishActivity> {
        Arc::clone(&self.activity)
    }

    /// The configuration.
    pub fn config(&self) -> &RelayConfig {
        &self.config
    }

    /// The feed.
    pub fn feed(&self) -> &Arc<F> {
        &self.feed
    }

    /// The transport.
    pub fn transport(&self) -> &Arc<T> {
        &self.transport
    }

    /// Takes, publishes and settles one batch.
    ///
    /// # Errors
    /// A [`StoreError`] from the feed. Published-but-unconfirmed rows are then handed out again
    /// later (same event id): after their lease expires, for the polling feed.
    pub async fn run_batch(&self) -> Result<BatchOutcome, StoreError> {
        let batch = (self.feed.next_batch(self.config.batch_size).await)
            .inspect_err(|e| self.health.failed(TroubleKind::Claim, 1, e))?;
        // A taken-over aggregate's wait: how long it had no owner at the claim (the store's
        // clock), then from here to the end of its publish.
        let claimed = std::time::Instant::now();
        self.health.succeeded(TroubleKind::Claim);
        let mut outcome = BatchOutcome {
            claimed: batch.messages.len() + batch.undecodable.len(),
            ..BatchOutcome::default()
        };
        if outcome.claimed == 0 {
            return Ok(outcome);
        }
        // Counted as held (the console's "in flight" per relay) until settled or given up.
        let _holding = self.activity.hold(&batch.messages);
        // The last moment a publish may start and still end before the ownership can end.
        let last_start = batch.owned_until.map(|until| {
            until
                .checked_sub(self.config.publish_timeout + self.config.lease_safety_margin)
                .unwrap_or_else(std::time::Instant::now)
        });
        // What is not published: rows that cannot be, and poison heads, with what waits
        // behind them. Both are rare; the normal batch is published as claimed.
        let mut aside = SetAside::default();
        let decodable;
        let mut messages: &[OutboxMessage] = &batch.messages;
        if !batch.undecodable.is_empty() {
            decodable = set_aside_undecodable(messages, &batch.undecodable, &mut aside);
            messages = &decodable;
        }
        let not_poison;
        if !batch.takeovers.is_empty() {
            let (publish, poison) = set_aside_takeovers(
                messages,
                &batch.takeovers,
                self.config.poison_after_takeovers,
            );
            aside.failed.extend(poison.failed);
            aside.not_attempted.extend(poison.not_attempted);
            not_poison = publish;
            messages = &not_poison;
        }
        let gate = publish::StartGate {
            last_start,
            liveness: batch.liveness.clone(),
        };
        let mut settlement =
            publish::publish_batch(&*self.transport, &self.config, messages, &gate).await;
        if !batch.takeovers.is_empty() {
            record_takeover_times(&batch.takeovers, claimed.elapsed(), &settlement.published);
        }
        if batch.liveness.as_ref().is_some_and(|l| l.is_lost())
            && !settlement.not_attempted.is_empty()
        {
            warn!(
                not_attempted = settlement.not_attempted.len(),
                "the database session this batch's leases are tied to ended: its remaining \
                 publishes were not started (another relay takes them over)"
            );
        }
        settlement.failed.extend(aside.failed);
        settlement.not_attempted.extend(aside.not_attempted);
        for failed in &settlement.failed {
            match failed.retry_after {
                None => warn!(row = failed.id, error = %failed.error,
                    "message dead-lettered; its aggregate waits behind it"),
                Some(retry_after) => debug!(row = failed.id, error = %failed.error, ?retry_after,
                    "publish failed; will retry"),
            }
        }
        let report = (self.feed.settle(batch.ticket, &settlement).await)
            .inspect_err(|e| self.health.failed(TroubleKind::Settle, 1, e))?;
        health::record(&self.health, &settlement, &report);
        self.activity.record(&batch.messages, &settlement.published);
        if !settlement.published.is_empty() {
            crash::hit(crash::RELAY_AFTER_MARK);
        }
        if report.lease_lost > 0 {
            warn!(
                lost = report.lease_lost,
                "lease lost before settling: another relay owns these rows and will republish them"
            );
            metrics::counter!(metric::LEASE_LOST).increment(report.lease_lost as u64);
        }
        if report.dead_lettered > 0 {
            metrics::counter!(metric::DEAD_LETTERED).increment(report.dead_lettered as u64);
        }
        outcome.published = report.marked;
        outcome.lease_lost = report.lease_lost;
        outcome.retried = report.retried;
        outcome.dead_lettered = report.dead_lettered;
        outcome.released = report.released;
        Ok(outcome)
    }

    /// Refreshes the pending / oldest-age / dead gauges once (when the feed can count), and
    /// keeps the reading for the heartbeat ([`PublishActivity::backlog`]).
    ///
    /// # Errors
    /// [`StoreError`] on an outage.
    pub async fn refresh_gauges(&self) -> Result<(), StoreError> {
        let Some(s) = self.feed.stats().await? else {
            return Ok(());
        };
        metrics::gauge!(metric::PENDING).set(s.pending as f64);
        metrics::gauge!(metric::OLDEST_PENDING_AGE)
            .set(s.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64()));
        metrics::gauge!(metric::DEAD_LETTERS).set(s.dead as f64);
        metrics::gauge!(metric::RETRYING).set(s.retrying as f64);
        self.activity.record_backlog(s);
        Ok(())
    }

    /// Runs until `shutdown` is cancelled: `workers` batch loops plus the gauge refresher. A
    /// batch in progress when `shutdown` fires is finished (published rows are settled), then
    /// the call returns. Feed outages are logged and waited out; they never end the loop.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        // Exported from the start at 0, so that an alert on its increase sees the first one.
        metrics::counter!(metric::TAKEOVERS).increment(0);
        // From the start too: "pending and no progress" counts from it.
        self.health.export();
        let mut tasks = tokio::task::JoinSet::new();
        for worker in 0..self.config.workers {
            let relay = Arc::clone(&self);
            let shutdown = shutdown.clone();
            tasks.spawn(async move { relay.worker_loop(worker, shutdown).await });
        }
        let relay = Arc::clone(&self);
        let stats_shutdown = shutdown.clone();
        tasks.spawn(async move {
            loop {
                let started = tokio::time::Instant::now();
                // Only a count that ran spaces the next one out: a failure (an outage, a pool
                // timeout) is retried at the interval.
                let wait = match relay.refresh_gauges().await {
                    Ok(()) => {
                        let took = started.elapsed();
                        let wait = stats_wait(relay.config.stats_interval, took);
                        if wait > relay.config.stats_interval {
                            debug!(
                                ?took,
                                ?wait,
                                "outbox gauges are costly; refreshing less often"
                            );
                        }
                        wait
                    }
                    Err(e) => {
                        warn!(error = %e, "could not refresh outbox gauges");
                        relay.config.stats_interval
                    }
                };
                tokio::select! {
                    () = stats_shutdown.cancelled() => break,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        });
        while tasks.join_next().await.is_some() {}
        info!("relay stopped");
    }

    async fn worker_loop(&self, worker: usize, shutdown: CancellationToken) {
        let mut outage = 0i32;
        while !shutdown.is_cancelled() {
            match self.run_batch().await {
                Ok(o) => {
                    outage = 0;
                    if o.claimed > 0 {
                        debug!(worker, ?o, "batch done");
                        continue;
                    }
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = self.feed.wait_for_work(self.config.poll_interval) => {}
                    }
                }
                Err(e) => {
                    outage += 1;
                    let wait = Backoff::OUTAGE.delay(outage);
                    warn!(worker, error = %e, ?wait, "store error; retrying");
                    tokio::select! {
                        () = shutdown.cancelled() => break,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }
}

/// How often a polling relay with the poison-row rule looks for aggregates whose takeover was
/// not settled either ([`PollingFeed::with_solo_takeovers`]): a cheap look at the store, so
/// that an aggregate whose second holder died too waits a fraction of a second, not a quarter of
/// the lease.
pub const SOLO_TAKEOVER_CHECK: Duration = Duration::from_millis(250);

/// The gauges' refresh waits this many times as long as its last count took, up to
/// [`STATS_MAX_WAIT`].
///
/// The statement counts the whole backlog: a few milliseconds normally, but 1.3-10 s per count
/// at 1-10 million pending rows (W6 in docs/benchmarks-history.md), which at the default 5 s
/// interval kept one database connection counting most of the time, beside the claims, during
/// exactly the incident the backlog is. Spaced this way a count takes a twentieth of one
/// connection's time, or a seventh at worst under the cap.
pub const STATS_SPACING: u32 = 20;

/// The longest wait between two gauge refreshes (unless `stats_interval` is longer): how old
/// the pending and oldest-age gauges may get while a huge backlog makes each count costly.
pub const STATS_MAX_WAIT: Duration = Duration::from_secs(60);

/// The wait after a gauge refresh that took `took`: `interval`, or more for a costly count,
/// never more than the longer of `interval` and [`STATS_MAX_WAIT`].
fn stats_wait(interval: Duration, took: Duration) -> Duration {
    interval.max(took.saturating_mul(STATS_SPACING).min(STATS_MAX_WAIT))
}

#[cfg(test)]
mod tests;
