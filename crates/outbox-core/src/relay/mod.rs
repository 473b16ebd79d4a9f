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

mod feed;
mod publish;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use feed::{FailedRow, Feed, FeedBatch, PollingFeed, SettleReport, Settlement};

use crate::backoff::Backoff;
use crate::crash;
use crate::error::{ConfigError, StoreError};
use crate::store::OutboxStore;
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
}

/// Relay settings. Defaults suit a service publishing up to tens of thousands of events a
/// second from one PostgreSQL database.
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
    /// How often the pending / oldest-age / dead gauges are refreshed.
    pub stats_interval: Duration,
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

/// The publish engine: a [`Feed`] on one side, a [`Transport`] on the other.
pub struct Relay<F, T> {
    feed: Arc<F>,
    transport: Arc<T>,
    config: RelayConfig,
}

impl<S: OutboxStore, T: Transport> Relay<PollingFeed<S>, T> {
    /// A polling relay: claims from `store` with the lease and per-aggregate cap of `config`.
    ///
    /// # Errors
    /// [`ConfigError`] when the configuration is inconsistent.
    pub fn new(store: Arc<S>, transport: Arc<T>, config: RelayConfig) -> Result<Self, ConfigError> {
        let feed = PollingFeed::new(store, config.max_per_aggregate, config.lease);
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
        })
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
        let batch = self.feed.next_batch(self.config.batch_size).await?;
        let mut outcome = BatchOutcome {
            claimed: batch.messages.len(),
            ..BatchOutcome::default()
        };
        if batch.messages.is_empty() {
            return Ok(outcome);
        }
        // The last moment a publish may start and still end before the ownership can end.
        let last_start = batch.owned_until.map(|until| {
            until
                .checked_sub(self.config.publish_timeout + self.config.lease_safety_margin)
                .unwrap_or_else(std::time::Instant::now)
        });
        let settlement =
            publish::publish_batch(&*self.transport, &self.config, &batch.messages, last_start)
                .await;
        for failed in &settlement.failed {
            match failed.retry_after {
                None => warn!(row = failed.id, error = %failed.error,
                    "message dead-lettered; its aggregate waits behind it"),
                Some(retry_after) => debug!(row = failed.id, error = %failed.error, ?retry_after,
                    "publish failed; will retry"),
            }
        }
        let report = self.feed.settle(batch.ticket, &settlement).await?;
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

    /// Refreshes the pending / oldest-age / dead gauges once (when the feed can count).
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
        Ok(())
    }

    /// Runs until `shutdown` is cancelled: `workers` batch loops plus the gauge refresher. A
    /// batch in progress when `shutdown` fires is finished (published rows are settled), then
    /// the call returns. Feed outages are logged and waited out; they never end the loop.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
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
                if let Err(e) = relay.refresh_gauges().await {
                    warn!(error = %e, "could not refresh outbox gauges");
                }
                tokio::select! {
                    () = stats_shutdown.cancelled() => break,
                    () = tokio::time::sleep(relay.config.stats_interval) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_refuses_lease_shorter_than_publish_window() {
        let c = RelayConfig {
            lease: Duration::from_secs(5),
            publish_timeout: Duration::from_secs(10),
            ..RelayConfig::default()
        };
        let e = c.validate().unwrap_err();
        assert_eq!(e.key, "lease");
        assert!(RelayConfig::default().validate().is_ok());
    }
}

/// Pure-logic tests of the engine against in-memory fakes (named as such). The real store and
/// brokers are exercised by the integration suites of the store and transport crates.
#[cfg(test)]
mod fake_tests {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Mutex;

    use bytes::Bytes;
    use chrono::Utc;

    use super::*;
    use crate::error::StoreError;
    use crate::message::OutboxMessage;
    use crate::message::{ContentType, Fingerprint, Payload};
    use crate::store::{
        ClaimParams, ClaimedBatch, DeadLetter, DeadLetterListParams, FailureParams, LeaseToken,
        MarkParams, OutboxStats, ReleaseParams, RequeueParams,
    };
    use crate::transport::{PublishError, PublishErrorKind, PublishReceipt};
    use std::time::Instant;

    #[derive(Clone)]
    struct FakeRow {
        msg: OutboxMessage,
        dead: bool,
        lease: Option<(i64, Instant)>,
        available: Instant,
    }

    /// In-memory fake of the store contract (heads, runs, leases, fencing).
    #[derive(Default)]
    struct FakeStore {
        rows: Mutex<Vec<FakeRow>>,
        next_token: Mutex<i64>,
    }

    impl FakeStore {
        fn with(events: &[(&str, i64)]) -> Self {
            let s = Self::default();
            for (i, (agg, v)) in events.iter().enumerate() {
                s.rows.lock().unwrap().push(FakeRow {
                    msg: OutboxMessage {
                        id: i as i64 + 1,
                        event_id: uuid::Uuid::now_v7(),
                        aggregate_type: "t".into(),
                        aggregate_id: (*agg).into(),
                        aggregate_version: *v,
                        event_type: "E".into(),
                        schema_version: 1,
                        payload: Payload {
                            content_type: ContentType::json(),
                            bytes: Bytes::from_static(b"{}"),
                        },
                        fingerprint: Fingerprint::of(b"{}"),
                        headers: BTreeMap::new(),
                        destination: None,
                        partition_key: None,
                        created_at: Utc::now(),
                        attempts: 0,
                    },
                    dead: false,
                    lease: None,
                    available: Instant::now(),
                });
            }
            s
        }
        fn remaining(&self) -> usize {
            self.rows.lock().unwrap().len()
        }
        fn dead(&self) -> usize {
            self.rows.lock().unwrap().iter().filter(|r| r.dead).count()
        }
    }

    impl OutboxStore for FakeStore {
        async fn claim_batch(&self, p: ClaimParams) -> Result<ClaimedBatch, StoreError> {
            let mut rows = self.rows.lock().unwrap();
            let mut token = self.next_token.lock().unwrap();
            *token += 1;
            let now = Instant::now();
            let mut by_agg: HashMap<String, Vec<usize>> = HashMap::new();
            for (i, r) in rows.iter().enumerate() {
                by_agg
                    .entry(r.msg.aggregate_id.clone())
                    .or_default()
                    .push(i);
            }
            let mut picked = Vec::new();
            let mut aggs: Vec<_> = by_agg.into_values().collect();
            aggs.sort_by_key(|ix| ix.iter().map(|&i| rows[i].msg.id).min());
            for mut ix in aggs {
                ix.sort_by_key(|&i| rows[i].msg.aggregate_version);
                let head = &rows[ix[0]];
                let live = |r: &FakeRow| r.lease.is_some_and(|(_, until)| until > now);
                if head.dead || live(head) || head.available > now {
                    continue;
                }
                for &i in ix.iter().take(p.max_per_aggregate) {
                    if rows[i].dead || picked.len() >= p.max_rows {
                        break;
                    }
                    picked.push(i);
                }
            }
            let mut messages = Vec::new();
            for i in picked {
                rows[i].lease = Some((*token, now + p.lease));
                messages.push(rows[i].msg.clone());
            }
            messages.sort_by(|a, b| {
                (&a.aggregate_id, a.aggregate_version).cmp(&(&b.aggregate_id, b.aggregate_version))
            });
            Ok(ClaimedBatch {
                token: LeaseToken(*token),
                messages,
            })
        }

        async fn mark_published(&self, p: MarkParams<'_>) -> Result<u64, StoreError> {
            let mut rows = self.rows.lock().unwrap();
            let before = rows.len();
            rows.retain(|r| {
                !(p.ids.contains(&r.msg.id) && r.lease.map(|l| l.0) == Some(p.token.0))
            });
            Ok((before - rows.len()) as u64)
        }

        async fn record_failure(&self, p: FailureParams<'_>) -> Result<bool, StoreError> {
            let mut rows = self.rows.lock().unwrap();
            let Some(r) = rows
                .iter_mut()
                .find(|r| r.msg.id == p.id && r.lease.map(|l| l.0) == Some(p.token.0))
            else {
                return Ok(false);
            };
            r.msg.attempts += 1;
            r.lease = None;
            match p.retry_after {
                Some(d) => r.available = Instant::now() + d,
                None => r.dead = true,
            }
            Ok(true)
        }

        async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, StoreError> {
            let mut rows = self.rows.lock().unwrap();
            let mut n = 0;
            for r in rows.iter_mut() {
                if p.ids.contains(&r.msg.id) && r.lease.map(|l| l.0) == Some(p.token.0) {
                    r.lease = None;
                    n += 1;
                }
            }
            Ok(n)
        }

        async fn stats(&self) -> Result<OutboxStats, StoreError> {
            Ok(OutboxStats::default())
        }

        async fn dead_letter_list(
            &self,
            _: DeadLetterListParams,
        ) -> Result<Vec<DeadLetter>, StoreError> {
            Ok(Vec::new())
        }

        async fn dead_letter_requeue(&self, _: RequeueParams) -> Result<u64, StoreError> {
            Ok(0)
        }
    }

    /// Fake broker: records what it acknowledged, fails scripted (aggregate, version) pairs.
    #[derive(Default)]
    struct FakeTransport {
        acked: Mutex<Vec<(String, i64)>>,
        fail: Mutex<HashMap<(String, i64), (PublishErrorKind, u32)>>,
        delay: Duration,
    }

    impl FakeTransport {
        fn failing(agg: &str, v: i64, kind: PublishErrorKind, times: u32) -> Self {
            let t = Self::default();
            t.fail
                .lock()
                .unwrap()
                .insert((agg.into(), v), (kind, times));
            t
        }
        fn acked_for(&self, agg: &str) -> Vec<i64> {
            self.acked
                .lock()
                .unwrap()
                .iter()
                .filter(|(a, _)| a == agg)
                .map(|(_, v)| *v)
                .collect()
        }
    }

    impl Transport for FakeTransport {
        fn name(&self) -> &'static str {
            "fake"
        }
        async fn publish(&self, m: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            let key = (m.aggregate_id.clone(), m.aggregate_version);
            if let Some((kind, left)) = self.fail.lock().unwrap().get_mut(&key)
                && *left > 0
            {
                *left -= 1;
                return Err(PublishError::new(*kind, "scripted failure"));
            }
            self.acked.lock().unwrap().push(key);
            Ok(PublishReceipt::default())
        }
    }

    fn fast_config() -> RelayConfig {
        RelayConfig {
            backoff: Backoff {
                base: Duration::from_millis(1),
                max: Duration::from_millis(2),
            },
            ..RelayConfig::default()
        }
    }

    fn relay(
        store: FakeStore,
        transport: FakeTransport,
        config: RelayConfig,
    ) -> Relay<PollingFeed<FakeStore>, FakeTransport> {
        Relay::new(Arc::new(store), Arc::new(transport), config).unwrap()
    }

    #[tokio::test]
    async fn a_failure_parks_its_aggregate_and_the_others_flow() {
        let r = relay(
            FakeStore::with(&[("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]),
            FakeTransport::failing("a", 2, PublishErrorKind::Unavailable, 1),
            fast_config(),
        );
        let o = r.run_batch().await.unwrap();
        assert_eq!(
            (
                o.claimed,
                o.published,
                o.retried,
                o.released,
                o.dead_lettered
            ),
            (5, 3, 1, 1, 0)
        );
        assert_eq!(
            r.transport.acked_for("a"),
            vec![1],
            "a3 must not overtake a2"
        );
        assert_eq!(r.transport.acked_for("b"), vec![1, 2]);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let o = r.run_batch().await.unwrap();
        assert_eq!(o.published, 2);
        assert_eq!(r.transport.acked_for("a"), vec![1, 2, 3]);
        assert_eq!(r.store().remaining(), 0);
    }

    #[tokio::test]
    async fn a_permanent_error_dead_letters_at_once_and_blocks_only_its_key() {
        let r = relay(
            FakeStore::with(&[("a", 1), ("a", 2), ("b", 1)]),
            FakeTransport::failing("a", 1, PublishErrorKind::TooLarge, u32::MAX),
            fast_config(),
        );
        let o = r.run_batch().await.unwrap();
        assert_eq!((o.published, o.dead_lettered, o.released), (1, 1, 1));
        tokio::time::sleep(Duration::from_millis(5)).await;
        let o = r.run_batch().await.unwrap();
        assert_eq!(o.claimed, 0, "a2 waits behind the dead letter");
        assert_eq!(r.store().dead(), 1);
        assert!(r.transport.acked_for("a").is_empty());
    }

    #[tokio::test]
    async fn retryable_errors_dead_letter_after_max_attempts() {
        let r = relay(
            FakeStore::with(&[("a", 1)]),
            FakeTransport::failing("a", 1, PublishErrorKind::Unavailable, u32::MAX),
            RelayConfig {
                max_attempts: 3,
                ..fast_config()
            },
        );
        for _ in 0..2 {
            assert_eq!(r.run_batch().await.unwrap().retried, 1);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(r.run_batch().await.unwrap().dead_lettered, 1);
        assert_eq!(r.store().dead(), 1);
    }

    #[tokio::test]
    async fn no_publish_starts_once_the_lease_could_expire() {
        let events: Vec<(&str, i64)> = (1..=20).map(|v| ("a", v)).collect();
        let r = relay(
            FakeStore::with(&events),
            FakeTransport {
                delay: Duration::from_millis(20),
                ..FakeTransport::default()
            },
            RelayConfig {
                lease: Duration::from_millis(300),
                publish_timeout: Duration::from_millis(100),
                lease_safety_margin: Duration::from_millis(50),
                ..fast_config()
            },
        );
        let started = Instant::now();
        let o = r.run_batch().await.unwrap();
        assert!(o.published > 0 && o.published < 20, "{o:?}");
        assert_eq!(o.published + o.released, 20);
        // The last publish began before lease - publish_timeout - margin = 150 ms.
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            r.transport.acked_for("a"),
            (1..=o.published as i64).collect::<Vec<_>>()
        );
        let o2 = r.run_batch().await.unwrap();
        assert!(
            o2.published > 0,
            "released rows are claimable again at once"
        );
    }

    #[tokio::test]
    async fn a_mark_after_takeover_is_counted_as_lease_lost() {
        let store = FakeStore::with(&[("a", 1)]);
        let stale = store
            .claim_batch(ClaimParams {
                max_rows: 10,
                max_per_aggregate: 10,
                lease: Duration::ZERO,
            })
            .await
            .unwrap();
        let fresh = store
            .claim_batch(ClaimParams {
                max_rows: 10,
                max_per_aggregate: 10,
                lease: Duration::from_secs(9),
            })
            .await
            .unwrap();
        assert_eq!(fresh.messages.len(), 1);
        let ids = [stale.messages[0].id];
        assert_eq!(
            store
                .mark_published(MarkParams {
                    token: stale.token,
                    ids: &ids
                })
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            store
                .mark_published(MarkParams {
                    token: fresh.token,
                    ids: &ids
                })
                .await
                .unwrap(),
            1
        );
    }
}
