//! The consumer engine: for each delivery, begin a transaction, record the inbox identity, run
//! the user's handler on that same transaction, commit, and only then acknowledge (G5, G6).
//! Written once against [`InboxStore`] and [`DeliverySource`].
//!
//! # What happens to each delivery
//!
//! | situation | database | broker |
//! |---|---|---|
//! | new event, handler `Ok` | inbox row + effect committed | ack after commit |
//! | redelivery (same fingerprint) | nothing | ack (counted as duplicate) |
//! | older version under the ordering guard | inbox row marked `stale` | ack |
//! | same id, different payload | conflict row committed (never the effect) | ack after recording (default) or hold (nack with `conflict_hold_delay`, it keeps coming back until an operator resolves it) |
//! | gap under `OrderingGuard::Wait` | rolled back | nack after `gap_delay` |
//! | handler `Transient` | rolled back | nack with backoff; after `max_attempts` deliveries: dead letter, then ack |
//! | handler `Permanent` | rolled back, dead letter committed | ack after the dead letter committed |
//! | malformed message | dead letter with the decode error committed | ack after commit |
//! | database outage (`StoreErrorKind::Unavailable`) | rolled back | nack with backoff, however often: never dead-lettered (redelivered, absorbed if it had committed) |
//! | the database refused the values (`InvalidData`: bytes it cannot store, a key over an index's limit) | rolled back, dead letter committed at once | ack after the dead letter committed |
//! | any other database error (`Contention`: a deadlock or serialization failure; `Constraint`, `PermissionDenied`, `Schema`, `Other`) | rolled back | nack with backoff; after `max_attempts` deliveries: dead letter, then ack |
//!
//! A crash anywhere before the commit rolls everything back and the broker redelivers; a crash
//! after the commit and before the ack leads to a redelivery that the inbox absorbs. Dead
//! letters are never counted as processed; `requeue` makes the engine apply them again, through
//! the inbox, so a requeued event still has at most one effect.
//!
//! # No input stalls the consumer
//!
//! Whatever a delivery holds, it ends applied, absorbed, or dead-lettered; only a database
//! outage makes it wait. The cap of `max_attempts` counts deliveries: the broker's count
//! ([`Delivery::delivery_count`]) where it has one, else the engine's own count of deliveries of
//! the same raw message (by SHA-256 of body, headers and content type; the last
//! [`LOCAL_COUNT_CAPACITY`] messages, forgotten on restart).
//!
//! A dead letter keeps everything the transport could read ([`RawMessage`]: body, headers, and
//! content type byte for byte, the broker's metadata), the decoded event's fields when there
//! are any, and the reason, with control characters escaped and cut to [`MAX_REASON_CHARS`].
//! If the database refuses the dead letter with the decoded fields, it is written again with
//! the raw message alone. A dead letter that cannot be written at all (the table missing, a
//! grant missing) leaves the delivery to be sent back: nothing is acknowledged without a record,
//! and the error is logged.
//!
//! # Batching
//!
//! With `batch_size > 1` several deliveries share one transaction (one commit, then all acks),
//! with no savepoints on the happy path. When one delivery must be rolled back (a handler
//! error, an ordering gap) the whole batch is rolled back and redone one transaction per
//! delivery, so the others still commit and only the failing one is retried or dead-lettered.
//! (A savepoint per delivery would cost two extra round trips each; W4 measured it.)
//! Without the ordering guard the batch's inbox rows are written with one statement and the
//! handler gets all new events of the batch in one [`Handler::handle_many`] call, which a
//! handler can override to write its effects with one statement too.
//!
//! # Acknowledgements run beside the next batch
//!
//! [`Consumer::run`] sends a committed batch's acks (and nacks) in a task of their own and goes
//! on to take the next batch; before it settles that one it waits for the acks of the batch
//! before, so at most one committed batch's acks are in flight (besides the nacks of a batch
//! that failed on the database, sent at once) and none is left behind at shutdown. The
//! guarantee is unchanged: the effects are committed before any ack is sent, and an ack that is
//! lost only makes the broker deliver the event again, which the inbox absorbs. What changes is
//! the latency: a broker's ack confirmation (a round trip) no longer stands between one batch's
//! commit and the next batch. [`Consumer::run_batch`] still returns only after its acks.
//!
//! # Saying why it is stuck
//!
//! The engine records in its [`ConsumerStats::health`] ([`crate::health`]) its source's
//! errors (closed by the next read that succeeds), its database's errors, every failed
//! handler call (a batch's `handle_many` that fails counts once, and each redo that fails
//! again), its dead letters once committed, and its progress: a batch that settled deliveries
//! for good (applied, absorbed, recorded as a conflict, dead-lettered) or requeued dead
//! letters. A heartbeat with the consumer's stats writes it down; [`metric::ERRORS`] and
//! [`metric::LAST_PROGRESS`] export it.
//!
//! # Where the code is
//!
//! This file holds the [`Consumer`] with its run loop ([`Consumer::run`],
//! [`Consumer::run_batch`]) and what a batch reports; its submodules hold the rest:
//! `batch` (one batch: take, decide, commit, settle), `apply` (one event through the inbox and
//! the handler), `dead_letter` (writing dead letters, database errors per delivery),
//! `requeue` (requeued dead letters), `attempts` (counting deliveries), `pause` (an
//! operator's pause), `config` ([`ConsumerConfig`]), `handler` ([`Handler`]) and [`metric`].
//!
//! [`Delivery::delivery_count`]: super::Delivery::delivery_count
//! [`RawMessage`]: super::RawMessage

mod apply;
mod attempts;
mod batch;
mod config;
mod dead_letter;
mod handler;
/// Metric names of the consumer engine (label `consumer`).
pub mod metric;
mod pause;
mod requeue;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

pub use attempts::LOCAL_COUNT_CAPACITY;
pub use config::{ConflictPolicy, ConsumerConfig};
pub use dead_letter::MAX_REASON_CHARS;
pub(crate) use dead_letter::printable;
pub use handler::{Handler, HandlerError};
pub use pause::PAUSE_CHECK_INTERVAL;

use super::source::{DeliverySource, SourceError};
use super::stats::ConsumerStats;
use super::store::InboxStore;
use crate::error::{ConfigError, StoreError};

/// Counts of one [`Consumer::run_batch`] call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerReport {
    /// Deliveries received.
    pub received: usize,
    /// Effects committed.
    pub processed: usize,
    /// Redeliveries absorbed.
    pub duplicates: usize,
    /// Stale versions absorbed.
    pub stale: usize,
    /// Conflicts recorded.
    pub conflicts: usize,
    /// Dead letters written.
    pub dead_lettered: usize,
    /// Negative acknowledgements.
    pub nacked: usize,
    /// Requeued dead letters applied (or absorbed) this call.
    pub requeued_resolved: usize,
}

impl std::ops::AddAssign<&ConsumerReport> for ConsumerReport {
    /// Adds every count of `other` (totals over several batches), each saturating at
    /// `usize::MAX` (never a panic, never a count torn half-way).
    fn add_assign(&mut self, other: &ConsumerReport) {
        let ConsumerReport {
            received,
            processed,
            duplicates,
            stale,
            conflicts,
            dead_lettered,
            nacked,
            requeued_resolved,
        } = other;
        self.received = self.received.saturating_add(*received);
        self.processed = self.processed.saturating_add(*processed);
        self.duplicates = self.duplicates.saturating_add(*duplicates);
        self.stale = self.stale.saturating_add(*stale);
        self.conflicts = self.conflicts.saturating_add(*conflicts);
        self.dead_lettered = self.dead_lettered.saturating_add(*dead_lettered);
        self.nacked = self.nacked.saturating_add(*nacked);
        self.requeued_resolved = self.requeued_resolved.saturating_add(*requeued_resolved);
    }
}

/// Why the engine stopped a batch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The broker side failed.
    #[error("broker: {0}")]
    Source(#[from] SourceError),
    /// The database failed; the batch's deliveries were negatively acknowledged.
    #[error("database: {0}")]
    Store(#[from] StoreError),
}

/// Runs a [`Handler`] over a [`DeliverySource`] with a store's inbox in between.
pub struct Consumer<S: InboxStore, Src: DeliverySource, H: Handler<S::Conn>> {
    store: Arc<S>,
    source: Src,
    handler: Arc<H>,
    config: ConsumerConfig,
    /// When requeued dead letters were last looked for, and whether the last batch was empty.
    last_requeue_check: Option<Instant>,
    idle: bool,
    /// Whether an operator paused the consumer, and when the store was last asked.
    paused: bool,
    last_pause_check: Option<Instant>,
    /// The running numbers, shared with reporters ([`Consumer::stats`]).
    stats: Arc<ConsumerStats>,
    /// Deliveries seen per raw message, for sources that do not count them.
    local_counts: Mutex<HashMap<[u8; 32], u32>>,
}

impl<S: InboxStore, Src: DeliverySource, H: Handler<S::Conn>> Consumer<S, Src, H> {
    /// A consumer `config.name` reading from `source`, recording in `store`.
    ///
    /// # Errors
    /// A [`ConfigError`] when `config` is refused ([`ConsumerConfig::validate`]).
    pub fn new(
        store: impl Into<Arc<S>>,
        source: Src,
        handler: H,
        config: ConsumerConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let stats = Arc::new(ConsumerStats::new(config.name.clone()));
        Ok(Self {
            store: store.into(),
            source,
            handler: Arc::new(handler),
            config,
            last_requeue_check: None,
            idle: true,
            paused: false,
            last_pause_check: None,
            stats,
            local_counts: Mutex::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Processes one batch of deliveries, and requeued dead letters when the consumer is idle
    /// or they were last looked for `housekeeping_interval` ago. Returns what happened; an
    /// empty report when nothing arrived within `batch_wait`.
    ///
    /// # Errors
    /// [`ConsumerError`]; after a database error the batch's deliveries were negatively
    /// acknowledged (they come back and are absorbed if they had committed).
    pub async fn run_batch(&mut self) -> Result<ConsumerReport, ConsumerError> {
        let (report, settle) = self.take_batch().await?;
        if let Some(settle) = settle {
            settle.await;
        }
        self.stats.add(&report);
        Ok(report)
    }

    /// The running numbers of this consumer (received, processed, dead-lettered, the
    /// source's lag, paused), for a reporter such as a heartbeat; updated after every batch.
    pub fn stats(&self) -> Arc<ConsumerStats> {
        Arc::clone(&self.stats)
    }

    async fn housekeeping(&mut self) {
        let name = self.config.name.clone();
        // A paused consumer leaves its source alone (a source may reconnect and take
        // deliveries to read its lag): the last lag reported stands until it is resumed.
        let lag = if self.paused {
            Ok(None)
        } else {
            self.source.lag().await
        };
        match lag {
            Ok(Some(lag)) => {
                self.stats.set_lag(lag);
                metrics::gauge!(metric::LAG, "consumer" => name.clone()).set(lag as f64)
            }
            Ok(None) => {}
            Err(e) => warn!(consumer = %name, error = %e, "could not read consumer lag"),
        }
        if let Ok(n) = self.store.consumer_dead_letter_count(&name).await {
            metrics::gauge!(metric::DEAD_LETTERS, "consumer" => name).set(n as f64);
        }
    }

    /// Gives back what the source received ahead of the batches it handed out
    /// ([`DeliverySource::release`]). [`Consumer::run`] does it itself; a caller driving the
    /// consumer with [`Consumer::run_batch`] calls it before dropping the consumer, so those
    /// messages come again soon (after a short delay the source chooses) rather than after the
    /// broker's ack wait. Harmless at any time: the next batch asks the source for messages
    /// again.
    pub async fn release(&mut self) {
        self.source.release().await;
    }

    /// Runs until `shutdown` is cancelled; a batch in progress is finished (committed and
    /// acknowledged) first, then what the source received ahead is released
    /// ([`DeliverySource::release`]; also after an error and while paused). Broker and
    /// database errors are logged and waited out.
    pub async fn run(mut self, shutdown: CancellationToken) {
        // Exported from the start at 0, so that an alert on its increase sees the first one.
        metrics::counter!(metric::CONFLICTS, "consumer" => self.config.name.clone()).increment(0);
        // From the start too: "lag and no progress" counts from it.
        self.stats.health.export();
        let mut last_housekeeping = Instant::now() - self.config.housekeeping_interval;
        let mut failures = 0;
        // The acks of the batch before, sent while the next batch is taken and applied: a
        // committed batch is done for the inbox, its acks only spare the broker a redelivery,
        // so they need not hold up the next batch. At most one batch settles at a time.
        let mut settling: Option<tokio::task::JoinHandle<()>> = None;
        while !shutdown.is_cancelled() {
            if last_housekeeping.elapsed() >= self.config.housekeeping_interval {
                self.housekeeping().await;
                last_housekeeping = Instant::now();
            }
            // Not raced against `shutdown`: a batch is bounded by `batch_wait` plus its
            // handlers, and is always finished (committed, then acknowledged).
            match self.take_batch().await {
                Ok((report, settle)) => {
                    self.stats.add(&report);
                    failures = 0;
                    if let Some(settle) = settle {
                        if let Some(before) = settling.take() {
                            self.settled(before).await;
                        }
                        settling = Some(tokio::spawn(settle));
                    }
                }
                Err(e) => {
                    failures += 1;
                    let wait = self.config.backoff.delay(failures);
                    warn!(consumer = %self.config.name, error = %e, ?wait, "consumer error; retrying");
                    // Nothing is taken while waiting: what the source received ahead goes back
                    // to the broker (another instance may take it) instead of piling up here.
                    self.source.release().await;
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = shutdown.cancelled() => break,
                    }
                }
            }
        }
        if let Some(last) = settling {
            self.settled(last).await;
        }
        // What the source received ahead goes back to the broker now, not after its ack wait.
        self.source.release().await;
    }

    /// Waits for a batch's acks sent in their own task. A panic there (in a source's ack) is
    /// logged, not swallowed: the batch was committed, so its deliveries only come back and
    /// are absorbed by the inbox.
    async fn settled(&self, settling: tokio::task::JoinHandle<()>) {
        if let Err(e) = settling.await {
            error!(consumer = %self.config.name, error = %e, "the acks of a committed batch failed; the broker will redeliver and the inbox absorbs it");
        }
    }
}
