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

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::source::{Delivery, DeliverySource, RawMessage, SourceError};
use super::stats::ConsumerStats;
use super::store::{
    ConsumerDeadLetterState, InboxOutcome, InboxStore, NewConsumerDeadLetter, OrderingGuard,
};
use crate::backoff::Backoff;
use crate::crash;
use crate::error::ConfigError;
use crate::error::{StoreError, StoreErrorKind};
use crate::health::TroubleKind;
use crate::wire::{EventIdentity, IncomingEvent};

/// Longest dead-letter reason stored, in characters (a database error may quote a long value).
pub const MAX_REASON_CHARS: usize = 1024;

/// Raw messages whose deliveries the engine counts itself, for sources that cannot tell
/// ([`Delivery::delivery_count`] is `None`).
pub const LOCAL_COUNT_CAPACITY: usize = 10_000;

/// How often, at most, the engine asks its store whether the consumer is paused
/// ([`InboxStore::consumer_paused`]): a pause or a resume holds within this time, plus the
/// batch in progress.
pub const PAUSE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Metric names of the consumer engine (label `consumer`).
pub mod metric {
    /// Counter: events whose effect was committed.
    pub const PROCESSED: &str = "outbox_consumer_processed_total";
    /// Counter: redeliveries absorbed by the inbox.
    pub const DUPLICATES: &str = "outbox_consumer_duplicates_total";
    /// Counter: older versions absorbed by the ordering guard.
    pub const STALE: &str = "outbox_consumer_stale_total";
    /// Counter: same id, different payload.
    pub const CONFLICTS: &str = "outbox_consumer_conflicts_total";
    /// Counter: deliveries dead-lettered (label `reason`: `malformed`, `permanent`, `attempts`
    /// (transient handler errors), `refused` (the database refused the values), `database`
    /// (other database errors, after `max_attempts` deliveries)).
    pub const DEAD_LETTERED: &str = "outbox_consumer_dead_lettered_total";
    /// Counter: negative acknowledgements (transient errors, gaps, database errors).
    pub const RETRIES: &str = "outbox_consumer_retries_total";
    /// Histogram: seconds per handler call: one event's [`Handler::handle`], or one batch's
    /// [`Handler::handle_many`] on the batch path (so it grows with the batch size).
    pub const HANDLER_SECONDS: &str = "outbox_consumer_handler_seconds";
    /// Gauge: messages waiting for this consumer (broker's view).
    pub const LAG: &str = "outbox_consumer_lag";
    /// Gauge: open consumer dead letters.
    pub const DEAD_LETTERS: &str = "outbox_consumer_dead_letters";
    /// Gauge: 1 while an operator paused the consumer, else 0.
    pub const PAUSED: &str = "outbox_consumer_paused";
    /// Counter: the consumer's errors by kind (label `kind`: `source`, `store`, `handler`,
    /// `dead_letter`; [`crate::health::TroubleKind`]).
    pub const ERRORS: &str = "outbox_consumer_errors_total";
    /// Gauge: unix time, seconds, of the consumer's last progress (deliveries settled for
    /// good); its start until the first. With [`LAG`] above 0, a value that stops moving means
    /// the consumer is stuck: its heartbeat says why.
    pub const LAST_PROGRESS: &str = "outbox_consumer_last_progress_timestamp_seconds";
}

/// A handler error, saying whether a retry can help.
///
/// Any error type converts into it with `?` as [`HandlerError::Transient`] (deadlocks,
/// serialization failures, a connection lost mid-handler all pass with a retry); return
/// [`HandlerError::Permanent`] yourself for what can never succeed. Like `anyhow::Error`, this
/// type does not implement [`std::error::Error`] itself, which is what makes that conversion
/// possible; it implements [`std::fmt::Display`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerError {
    /// May succeed later (a lock timeout, a dependency briefly down): redelivered with backoff.
    Transient(String),
    /// Will never succeed for this event (unknown schema version, invalid business state):
    /// dead-lettered at once.
    Permanent(String),
}

impl HandlerError {
    /// A permanent error with `reason`.
    pub fn permanent(reason: impl std::fmt::Display) -> Self {
        Self::Permanent(reason.to_string())
    }

    /// A transient error with `reason`.
    pub fn transient(reason: impl std::fmt::Display) -> Self {
        Self::Transient(reason.to_string())
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transient(m) => write!(f, "transient: {m}"),
            Self::Permanent(m) => write!(f, "permanent: {m}"),
        }
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    /// Errors inside a handler are transient unless the handler says otherwise.
    fn from(e: E) -> Self {
        Self::Transient(e.to_string())
    }
}

/// The user's effect. It runs on the transaction that also holds the inbox row (`conn`, the
/// store's connection type: `sqlx::PgConnection` for PostgreSQL); it must not commit, and it
/// must not call remote services whose effect cannot be rolled back (write a work item instead,
/// see [`crate::effect`]). It may run more than once for one event (redeliveries, and in batch
/// mode a redo after another delivery's rollback); only a committed run counts. A panic inside
/// `handle` is caught: it counts as [`HandlerError::Transient`] (`handler panicked: …`), its
/// writes roll back, and the delivery is dead-lettered after `max_attempts` like any other
/// transient failure.
pub trait Handler<C>: Send + Sync + 'static {
    /// Applies `event` using `conn`.
    ///
    /// # Errors
    /// [`HandlerError`]: transient errors are retried, permanent ones dead-lettered.
    fn handle<'a>(
        &'a self,
        conn: &'a mut C,
        event: &'a IncomingEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;

    /// Applies several new events, in the order given, on one transaction. The engine's batch
    /// path (`batch_size > 1`, [`OrderingGuard::Off`]) calls it once per batch of two or more
    /// deliveries with every event the inbox found new, instead of [`Handler::handle`] per
    /// event (a batch of one delivery goes through `handle`). Override it to write a
    /// batch's effects with fewer statements (one multi-row `INSERT … SELECT FROM UNNEST(…)`):
    /// round trips inside the transaction are most of a consumer's latency, and a batch's
    /// transaction holds its deliveries until the commit.
    ///
    /// It must have exactly the effect of calling `handle` for each event in turn: when it
    /// fails (or panics), the whole batch is rolled back and redone one transaction per
    /// delivery with `handle`, which then decides each delivery's fate (a retry, a dead
    /// letter). The default calls `handle` for each event and stops at the first error.
    ///
    /// # Errors
    /// [`HandlerError`]: any error only triggers the redo one delivery at a time.
    fn handle_many<'a>(
        &'a self,
        conn: &'a mut C,
        events: &'a [&'a IncomingEvent],
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a
    where
        C: Send,
    {
        async move {
            for event in events {
                self.handle(conn, event).await?;
            }
            Ok(())
        }
    }
}

/// What to do with a delivery whose id is known with a different payload.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConflictPolicy {
    /// Record the conflict (table, metric, CLI), then acknowledge (default): the conflict is
    /// kept for the contract's owner and the stream moves on.
    #[default]
    AckAfterRecording,
    /// Record it, then negatively acknowledge with `conflict_hold_delay`: the message keeps
    /// coming back (and `occurrences` grows) until an operator deals with it.
    Hold,
}

/// Settings of a [`Consumer`].
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// The consumer's name: the inbox key is `(name, event_id)`.
    pub name: String,
    /// Ordering guard.
    pub ordering: OrderingGuard,
    /// Deliveries per transaction (1 = one transaction per delivery).
    pub batch_size: usize,
    /// Longest wait for the first delivery of a batch.
    pub batch_wait: Duration,
    /// Deliveries of one message before a transient handler error or a database error (other
    /// than an outage) dead-letters it.
    pub max_attempts: u32,
    /// Redelivery delay after a transient error, by attempt.
    pub backoff: Backoff,
    /// Redelivery delay while the ordering guard waits for a missing version.
    pub gap_delay: Duration,
    /// Conflict handling.
    pub conflict_policy: ConflictPolicy,
    /// Redelivery delay of a held conflict.
    pub conflict_hold_delay: Duration,
    /// How often, at least, requeued dead letters are looked for under load (always when
    /// idle), and how often the lag and dead-letter gauges are refreshed.
    pub housekeeping_interval: Duration,
}

impl ConsumerConfig {
    /// Defaults for a consumer called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ordering: OrderingGuard::Off,
            batch_size: 1,
            batch_wait: Duration::from_millis(500),
            max_attempts: 10,
            backoff: Backoff {
                base: Duration::from_millis(200),
                max: Duration::from_secs(60),
            },
            gap_delay: Duration::from_secs(1),
            conflict_policy: ConflictPolicy::AckAfterRecording,
            conflict_hold_delay: Duration::from_secs(60),
            housekeeping_interval: Duration::from_secs(5),
        }
    }

    /// Checks every setting. The name is bounded like an event attribute (1 to
    /// [`MAX_ATTRIBUTE_CHARS`](crate::wire::MAX_ATTRIBUTE_CHARS) characters, no control
    /// characters): it is part of every inbox key, and a name the database cannot index would
    /// make every delivery a dead letter.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first offending field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        crate::wire::check_configured("name", &self.name)?;
        if self.batch_size == 0 {
            return Err(ConfigError::new("batch_size", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::new("max_attempts", "must be at least 1"));
        }
        Ok(())
    }
}

/// What the engine decided for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Processed,
    Duplicate,
    Stale,
    Conflict,
    /// Conflict recorded, delivery sent back after the delay (`ConflictPolicy::Hold`).
    ConflictHeld(Duration),
    /// Dead letter written (reason label).
    DeadLettered(&'static str),
    Nack(Duration),
}

/// What applying one event decided: the verdict, whether the transaction's writes are kept,
/// and the dead-letter reason when one is due.
struct Applied {
    verdict: Verdict,
    keep: bool,
    dead_reason: Option<String>,
}

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
    /// Adds every count of `other` (totals over several batches).
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
        self.received += received;
        self.processed += processed;
        self.duplicates += duplicates;
        self.stale += stale;
        self.conflicts += conflicts;
        self.dead_lettered += dead_lettered;
        self.nacked += nacked;
        self.requeued_resolved += requeued_resolved;
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

/// A dead-letter reason that any store can keep: control characters escaped (`\u{0}`), at
/// most [`MAX_REASON_CHARS`] characters.
pub(crate) fn printable(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(MAX_REASON_CHARS));
    for (i, c) in reason.chars().enumerate() {
        if i == MAX_REASON_CHARS {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// SHA-256 of everything a raw message holds that identifies it: body, headers, content type.
fn digest(raw: &RawMessage) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut field = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    field(&raw.payload);
    for (name, value) in &raw.headers {
        field(name.as_bytes());
        field(value.as_bytes());
    }
    for (name, value) in &raw.binary_headers {
        field(name.as_bytes());
        field(value);
    }
    field(raw.content_type.as_deref().unwrap_or_default().as_bytes());
    h.finalize().into()
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

    /// Deliveries of `d` so far, this one included: the broker's count, else the engine's own.
    fn attempts(&self, d: &Src::Delivery) -> u32 {
        if let Some(n) = d.delivery_count() {
            return n.max(1);
        }
        let key = digest(d.raw());
        let mut counts = self.local_counts.lock().unwrap_or_else(|p| p.into_inner());
        if counts.len() >= LOCAL_COUNT_CAPACITY && !counts.contains_key(&key) {
            // Forgetting all is the simple bound; counts of messages still failing restart.
            counts.clear();
        }
        let n = counts.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// Forgets the engine's own count of a delivery that was settled for good.
    fn forget(&self, d: &Src::Delivery) {
        if d.delivery_count().is_none() {
            self.local_counts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&digest(d.raw()));
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// Applies one decoded event on `conn`.
    async fn apply(
        &self,
        conn: &mut S::Conn,
        event: &IncomingEvent,
        delivery_count: u32,
    ) -> Result<Applied, StoreError> {
        let outcome = self
            .store
            .inbox_record(conn, &self.config.name, self.config.ordering, event)
            .await?;
        Ok(self
            .apply_outcome(conn, event, delivery_count, outcome)
            .await)
    }

    /// The part of [`Self::apply`] after the inbox decided: run the handler for a new event.
    async fn apply_outcome(
        &self,
        conn: &mut S::Conn,
        event: &IncomingEvent,
        delivery_count: u32,
        outcome: InboxOutcome,
    ) -> Applied {
        let name = &self.config.name;
        let applied = |verdict, keep, dead_reason| Applied {
            verdict,
            keep,
            dead_reason,
        };
        match outcome {
            InboxOutcome::New => {
                crash::hit(crash::CONSUMER_AFTER_INBOX);
                let result = self
                    .call_handler(self.handler.handle(conn, event), Some(event))
                    .await;
                match result {
                    Ok(()) => {
                        crash::hit(crash::CONSUMER_AFTER_EFFECT);
                        applied(Verdict::Processed, true, None)
                    }
                    Err(HandlerError::Permanent(m)) => applied(
                        Verdict::DeadLettered("permanent"),
                        false,
                        Some(format!("permanent handler error: {m}")),
                    ),
                    Err(HandlerError::Transient(m))
                        if delivery_count >= self.config.max_attempts =>
                    {
                        applied(
                            Verdict::DeadLettered("attempts"),
                            false,
                            Some(format!(
                                "transient handler error after {delivery_count} deliveries: {m}"
                            )),
                        )
                    }
                    Err(HandlerError::Transient(m)) => {
                        debug!(consumer = %name, event_id = %event.event_id, error = %m, "transient handler error; redelivering");
                        applied(
                            Verdict::Nack(self.config.backoff.delay(delivery_count as i32)),
                            false,
                            None,
                        )
                    }
                }
            }
            InboxOutcome::Duplicate => applied(Verdict::Duplicate, true, None),
            InboxOutcome::Stale { .. } => applied(Verdict::Stale, true, None),
            InboxOutcome::Conflict { stored } => {
                warn!(consumer = %name, event_id = %event.event_id, stored = %stored, received = %event.fingerprint,
                    "CONFLICT: event id reused with a different payload; recorded, not applied");
                // Recorded (committed) either way; `Hold` then sends it back to the broker so it
                // keeps coming (and `occurrences` grows) until an operator deals with it.
                let verdict = match self.config.conflict_policy {
                    ConflictPolicy::AckAfterRecording => Verdict::Conflict,
                    ConflictPolicy::Hold => Verdict::ConflictHeld(self.config.conflict_hold_delay),
                };
                applied(verdict, true, None)
            }
            InboxOutcome::Gap { last_applied } => {
                debug!(consumer = %name, event_id = %event.event_id, last_applied, "ordering gap; redelivering later");
                applied(Verdict::Nack(self.config.gap_delay), false, None)
            }
        }
    }

    /// Runs a handler call, timed. A panicking handler must not take the engine down with it
    /// (nor silently stop consumption): its panic becomes [`HandlerError::Transient`]
    /// (`handler panicked: …`), so its writes roll back, and after `max_attempts` deliveries the
    /// delivery is dead-lettered. `event` names the event in the log (none for a batch).
    async fn call_handler(
        &self,
        call: impl Future<Output = Result<(), HandlerError>>,
        event: Option<&IncomingEvent>,
    ) -> Result<(), HandlerError> {
        let name = &self.config.name;
        let started = Instant::now();
        let result = match std::panic::AssertUnwindSafe(call).catch_unwind().await {
            Ok(r) => r,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".to_owned());
                let event_id = event.map(|e| e.event_id.to_string());
                error!(consumer = %name, event_id = event_id.as_deref().unwrap_or("(batch)"), panic = %what,
                    "handler panicked; treating it as a transient failure");
                Err(HandlerError::Transient(format!("handler panicked: {what}")))
            }
        };
        metrics::histogram!(metric::HANDLER_SECONDS, "consumer" => name.clone())
            .record(started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            self.stats.health.failed(TroubleKind::Handler, 1, e);
        }
        result
    }

    /// The identity a dead letter of `raw` keeps: the decoded `event`'s, or what the source can
    /// still read of a malformed message.
    fn identity(&self, raw: &RawMessage, event: Option<&IncomingEvent>) -> EventIdentity {
        match event {
            Some(event) => EventIdentity::of(event),
            None => self.source.identify(raw),
        }
    }

    /// Writes a dead letter on `conn`; `error` is made [`printable`] first.
    async fn insert_dead_letter(
        &self,
        conn: &mut S::Conn,
        raw: &RawMessage,
        identity: &EventIdentity,
        error: &str,
        attempts: u32,
    ) -> Result<(), StoreError> {
        self.store
            .consumer_dead_letter_insert(
                conn,
                NewConsumerDeadLetter {
                    consumer: &self.config.name,
                    raw,
                    identity,
                    error: &printable(error),
                    attempts,
                },
            )
            .await
    }

    /// Dead-letters `d` in a transaction of its own and says so, with the reason `label` for
    /// the metric. With the identity of the decoded `event` first (of a malformed message:
    /// what its source could still read, [`DeliverySource::identify`]); when the database
    /// refuses that row (the event's own values), again with the raw message alone. When no dead letter can be
    /// written (other than in an outage, which is returned), the delivery is sent back: it is
    /// never acknowledged without a record.
    async fn park(
        &self,
        d: &Src::Delivery,
        event: Option<&IncomingEvent>,
        reason: &str,
        attempts: u32,
        label: &'static str,
    ) -> Result<Verdict, StoreError> {
        let name = &self.config.name;
        let mut identity = self.identity(d.raw(), event);
        loop {
            let written = async {
                let mut tx = self.store.begin().await?;
                self.insert_dead_letter(&mut tx, d.raw(), &identity, reason, attempts)
                    .await?;
                self.store.commit(tx).await
            }
            .await;
            match written {
                Ok(()) => {
                    self.stats
                        .health
                        .failed(TroubleKind::DeadLetter, 1, &reason);
                    return Ok(Verdict::DeadLettered(label));
                }
                Err(e) if e.is_retryable() => return Err(e),
                Err(e) if !identity.is_empty() && e.kind() == StoreErrorKind::InvalidData => {
                    warn!(consumer = %name, error = %e, "the database refused the dead letter with the event's identity; keeping the raw message alone");
                    identity = EventIdentity::default();
                }
                Err(e) if e.kind() == StoreErrorKind::Contention => {
                    warn!(consumer = %name, error = %e,
                        "the dead letter lost to a concurrent transaction; the delivery is sent back");
                    return Ok(Verdict::Nack(self.config.backoff.delay(attempts as i32)));
                }
                Err(e) => {
                    error!(consumer = %name, error = %e, reason = %printable(reason),
                        "cannot write the dead letter; the delivery is sent back");
                    // A missing table or grant keeps the delivery coming back: say so.
                    self.stats.health.failed(
                        TroubleKind::Store,
                        1,
                        &format_args!("cannot write the dead letter ({reason}): {e}"),
                    );
                    return Ok(Verdict::Nack(self.config.backoff.delay(attempts as i32)));
                }
            }
        }
    }

    /// What a database error `e` on one delivery (attempt `attempts`) leads to: an outage is
    /// returned (the batch waits); refused values are dead-lettered at once; anything else is
    /// sent back until `max_attempts`, then dead-lettered.
    async fn after_store_error(
        &self,
        d: &Src::Delivery,
        event: Option<&IncomingEvent>,
        attempts: u32,
        e: StoreError,
    ) -> Result<Verdict, StoreError> {
        let name = &self.config.name;
        if e.kind() != StoreErrorKind::Unavailable {
            // An outage is returned, and recorded once for the batch.
            self.stats.health.failed(TroubleKind::Store, 1, &e);
        }
        match e.kind() {
            StoreErrorKind::Unavailable => Err(e),
            StoreErrorKind::InvalidData => {
                warn!(consumer = %name, error = %e, "the database refused the delivery; dead-lettering it");
                let reason = format!("refused by the database: {e}");
                self.park(d, event, &reason, attempts, "refused").await
            }
            _ if attempts >= self.config.max_attempts => {
                error!(consumer = %name, error = %e, attempts, "database error at the last attempt; dead-lettering the delivery");
                let reason = format!("database error after {attempts} deliveries: {e}");
                self.park(d, event, &reason, attempts, "database").await
            }
            _ => {
                warn!(consumer = %name, error = %e, attempts, "database error; redelivering");
                Ok(Verdict::Nack(self.config.backoff.delay(attempts as i32)))
            }
        }
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

    /// Takes a batch, decides and commits it, and returns its counts with the settling of its
    /// deliveries (acks and nacks, still to be awaited); no settling when nothing arrived.
    async fn take_batch(
        &mut self,
    ) -> Result<
        (
            ConsumerReport,
            Option<impl Future<Output = ()> + Send + 'static>,
        ),
        ConsumerError,
    > {
        if self.check_paused().await {
            self.wait_paused().await;
            return Ok((ConsumerReport::default(), None));
        }
        let requeued_resolved = self.requeued_housekeeping().await;
        let deliveries = (self
            .source
            .next_batch(self.config.batch_size.max(1), self.config.batch_wait)
            .await)
            .inspect_err(|e| self.stats.health.failed(TroubleKind::Source, 1, e))?;
        self.stats.health.succeeded(TroubleKind::Source);
        let mut report = ConsumerReport {
            received: deliveries.len(),
            requeued_resolved,
            ..ConsumerReport::default()
        };
        self.idle = deliveries.is_empty();
        if deliveries.is_empty() {
            return Ok((report, None));
        }
        let attempts: Vec<u32> = deliveries.iter().map(|d| self.attempts(d)).collect();
        let verdicts = match self.decide(&deliveries, &attempts).await {
            Ok(v) => v,
            Err(e) => {
                self.stats.health.failed(TroubleKind::Store, 1, &e);
                error!(consumer = %self.config.name, error = %e, "database error; redelivering the batch");
                let delay = self.config.backoff.delay(1);
                futures::future::join_all(deliveries.into_iter().map(|d| d.nack(delay))).await;
                metrics::counter!(metric::RETRIES, "consumer" => self.config.name.clone())
                    .increment(report.received as u64);
                return Err(e.into());
            }
        };
        crash::hit(crash::CONSUMER_AFTER_COMMIT);
        if verdicts
            .iter()
            .any(|v| !matches!(v, Verdict::Nack(_) | Verdict::ConflictHeld(_)))
        {
            self.stats.health.progressed();
        }
        let name = self.config.name.clone();
        // Settle all deliveries of the batch concurrently: an ack waits for the broker's
        // confirmation and a nack may wait out its (capped) delay where the broker has no
        // delayed redelivery, so doing them one by
        // one would cost a round trip or a delay per delivery.
        let settles: Vec<_> = deliveries
            .into_iter()
            .zip(verdicts.iter())
            .map(|(d, v)| {
                let nack = match v {
                    Verdict::Nack(delay) | Verdict::ConflictHeld(delay) => Some(*delay),
                    _ => {
                        self.forget(&d);
                        None
                    }
                };
                async move {
                    match nack {
                        Some(delay) => d.nack(delay).await,
                        None => d.ack().await,
                    }
                }
            })
            .collect();
        let consumer = name.clone();
        let settle = async move {
            for result in futures::future::join_all(settles).await {
                if let Err(e) = result {
                    warn!(consumer = %consumer, error = %e, "ack/nack failed; the broker will redeliver and the inbox absorbs it");
                }
            }
        };
        count_verdicts(&mut report, verdicts, &name);
        Ok((report, Some(settle)))
    }

    /// Paused by an operator: nothing is taken from the source (the broker keeps it, and gets
    /// back what the source had received ahead) and no requeued dead letter is applied; the
    /// batch's wait passes idle (never less than 100 ms, whatever `batch_wait` says).
    async fn wait_paused(&mut self) {
        self.source.release().await;
        tokio::time::sleep(
            self.config
                .batch_wait
                .clamp(Duration::from_millis(100), PAUSE_CHECK_INTERVAL),
        )
        .await;
    }

    /// Requeued dead letters: looked for whenever the consumer is idle, and at least every
    /// `housekeeping_interval` under load (one indexed query). Returns how many were settled.
    async fn requeued_housekeeping(&mut self) -> usize {
        let due = self
            .last_requeue_check
            .is_none_or(|t| t.elapsed() >= self.config.housekeeping_interval);
        if !(self.idle || due) {
            return 0;
        }
        self.last_requeue_check = Some(Instant::now());
        match self.process_requeued().await {
            Ok(n) => {
                if n > 0 {
                    self.stats.health.progressed();
                }
                n
            }
            Err(e) => {
                warn!(consumer = %self.config.name, error = %e, "could not process requeued dead letters");
                0
            }
        }
    }

    /// Writes and commits; returns one verdict per delivery (`attempts` holds each one's
    /// delivery count). Nothing is acknowledged here.
    ///
    /// # Errors
    /// Only an outage ([`StoreErrorKind::Unavailable`]): every other database error is decided
    /// per delivery.
    async fn decide(
        &self,
        deliveries: &[Src::Delivery],
        attempts: &[u32],
    ) -> Result<Vec<Verdict>, StoreError> {
        if deliveries.len() > 1 {
            match self.decide_together(deliveries, attempts).await {
                Ok(Some(verdicts)) => return Ok(verdicts),
                Ok(None) => {
                    debug!(consumer = %self.config.name, "a delivery needed a rollback; redoing the batch one transaction per delivery")
                }
                Err(e) if e.is_retryable() => return Err(e),
                Err(e) => {
                    warn!(consumer = %self.config.name, error = %e, "the batch failed; redoing it one transaction per delivery")
                }
            }
        }
        let mut verdicts = Vec::with_capacity(deliveries.len());
        for (d, count) in deliveries.iter().zip(attempts) {
            verdicts.push(self.decide_one(d, *count).await?);
        }
        Ok(verdicts)
    }

    /// The batch's fast path: every delivery in one transaction, no savepoints. As soon as one
    /// delivery must be rolled back (handler error, ordering gap) the whole transaction is
    /// rolled back and `None` returned: the caller redoes the batch one delivery at a time, as
    /// it does after any database error here.
    async fn decide_together(
        &self,
        deliveries: &[Src::Delivery],
        attempts: &[u32],
    ) -> Result<Option<Vec<Verdict>>, StoreError> {
        let mut tx = self.store.begin().await?;
        let mut verdicts = Vec::with_capacity(deliveries.len());
        // Without the ordering guard the whole batch's inbox rows go in with one statement, and
        // the handler sees every new event of the batch in one call (`handle_many`).
        let batched = self.config.ordering == OrderingGuard::Off;
        let mut outcomes = if batched {
            let events: Vec<&IncomingEvent> = deliveries
                .iter()
                .filter_map(|d| d.event().as_ref().ok())
                .collect();
            self.store
                .inbox_record_many(&mut tx, &self.config.name, &events)
                .await?
                .into_iter()
        } else {
            Vec::new().into_iter()
        };
        let mut new_events: Vec<&IncomingEvent> = Vec::new();
        // Dead letters of this transaction, recorded once it committed.
        let mut dead: Vec<String> = Vec::new();
        for (d, &count) in deliveries.iter().zip(attempts) {
            let applied = match d.event() {
                Ok(event) if batched => {
                    let outcome = outcomes.next().expect("one outcome per decoded event");
                    if outcome == InboxOutcome::New {
                        // Processed if the batch's handler call succeeds; otherwise the whole
                        // batch is redone one delivery at a time.
                        new_events.push(event);
                        verdicts.push(Verdict::Processed);
                        continue;
                    }
                    self.apply_outcome(&mut tx, event, count, outcome).await
                }
                Ok(event) => self.apply(&mut tx, event, count).await?,
                Err(decode) => {
                    warn!(consumer = %self.config.name, error = %decode, "malformed message dead-lettered");
                    let reason = format!("malformed: {decode}");
                    let identity = self.identity(d.raw(), None);
                    self.insert_dead_letter(&mut tx, d.raw(), &identity, &reason, count)
                        .await?;
                    dead.push(reason);
                    verdicts.push(Verdict::DeadLettered("malformed"));
                    continue;
                }
            };
            if !applied.keep {
                self.store.rollback(tx).await?;
                return Ok(None);
            }
            verdicts.push(applied.verdict);
        }
        if !new_events.is_empty() {
            crash::hit(crash::CONSUMER_AFTER_INBOX);
            let result = self
                .call_handler(self.handler.handle_many(&mut tx, &new_events), None)
                .await;
            if let Err(e) = result {
                debug!(consumer = %self.config.name, error = %e, "the batch's handler call failed; redoing the batch one delivery at a time");
                self.store.rollback(tx).await?;
                return Ok(None);
            }
            crash::hit(crash::CONSUMER_AFTER_EFFECT);
        }
        self.store.commit(tx).await?;
        for reason in &dead {
            self.stats.health.failed(TroubleKind::DeadLetter, 1, reason);
        }
        Ok(Some(verdicts))
    }

    /// One try of `event` in a transaction of its own: committed when its writes are kept,
    /// rolled back otherwise.
    async fn attempt(&self, event: &IncomingEvent, attempts: u32) -> Result<Applied, StoreError> {
        let mut tx = self.store.begin().await?;
        let applied = self.apply(&mut tx, event, attempts).await?;
        if applied.keep {
            self.store.commit(tx).await?;
        } else {
            self.store.rollback(tx).await?;
        }
        Ok(applied)
    }

    /// One delivery in its own transaction; a dead letter, when one is due, in a fresh
    /// transaction after the rollback of the failed attempt.
    ///
    /// # Errors
    /// Only an outage.
    async fn decide_one(&self, d: &Src::Delivery, attempts: u32) -> Result<Verdict, StoreError> {
        let event = match d.event() {
            Ok(e) => e,
            Err(decode) => {
                warn!(consumer = %self.config.name, error = %decode, "malformed message dead-lettered");
                let reason = format!("malformed: {decode}");
                return self.park(d, None, &reason, attempts, "malformed").await;
            }
        };
        match self.attempt(event, attempts).await {
            Ok(Applied {
                verdict: Verdict::DeadLettered(label),
                dead_reason: Some(reason),
                ..
            }) => {
                warn!(consumer = %self.config.name, event_id = %event.event_id, error = %reason, "event dead-lettered");
                self.park(d, Some(event), &reason, attempts, label).await
            }
            Ok(applied) => Ok(applied.verdict),
            Err(e) => self.after_store_error(d, Some(event), attempts, e).await,
        }
    }

    /// Applies dead letters an operator requeued, through the inbox (so at most one effect),
    /// marking them resolved, or dead again with the new error. Each is taken and settled in its
    /// own transaction; when its handler's writes must be rolled back, the dead letter is
    /// settled in a second transaction.
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn process_requeued(&self) -> Result<usize, StoreError> {
        let mut resolved = 0;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            let mut tx = self.store.begin().await?;
            let taken = self
                .store
                .consumer_dead_letter_take_requeued(&mut tx, &self.config.name, 1)
                .await?;
            // A letter that is still waiting comes back last (stores order by last update);
            // meeting one again means every requeued letter was tried once this round.
            let Some(letter) = taken.into_iter().next().filter(|l| seen.insert(l.id)) else {
                self.store.rollback(tx).await?;
                break;
            };
            let (keep, state, error) = match self.source.decode(&letter.raw) {
                Err(e) => (
                    true,
                    ConsumerDeadLetterState::Dead,
                    Some(format!("malformed: {e}")),
                ),
                Ok(event) => {
                    let count = letter.attempts.max(0) as u32 + 1;
                    let applied = match self.apply(&mut tx, &event, count).await {
                        Ok(applied) => applied,
                        // An outage, or a deadlock / serialization failure: the transaction
                        // is dropped (rolled back), the letter stays requeued for next time.
                        Err(e) if e.is_retryable() || e.kind() == StoreErrorKind::Contention => {
                            return Err(e);
                        }
                        // Refused values or another database error: the letter goes back to
                        // `dead` with the reason, and the next requeued letter is tried.
                        Err(e) => Applied {
                            verdict: Verdict::DeadLettered("database"),
                            keep: false,
                            dead_reason: Some(format!("database error on requeue: {e}")),
                        },
                    };
                    let (state, error) = match applied.verdict {
                        Verdict::Processed | Verdict::Duplicate | Verdict::Stale => {
                            resolved += 1;
                            if applied.verdict == Verdict::Processed {
                                metrics::counter!(metric::PROCESSED, "consumer" => self.config.name.clone())
                                    .increment(1);
                            }
                            (ConsumerDeadLetterState::Resolved, None)
                        }
                        Verdict::Conflict | Verdict::ConflictHeld(_) => (
                            ConsumerDeadLetterState::Dead,
                            Some("conflict: event id known with another payload".to_owned()),
                        ),
                        Verdict::Nack(_) => (ConsumerDeadLetterState::Requeued, None),
                        Verdict::DeadLettered(_) => {
                            (ConsumerDeadLetterState::Dead, applied.dead_reason)
                        }
                    };
                    (applied.keep, state, error)
                }
            };
            if !keep {
                self.store.rollback(tx).await?;
                tx = self.store.begin().await?;
            }
            let error = error.as_deref().map(printable);
            self.store
                .consumer_dead_letter_settle(&mut tx, letter.id, state, error.as_deref())
                .await?;
            self.store.commit(tx).await?;
            if let (ConsumerDeadLetterState::Dead, Some(error)) = (state, &error) {
                self.stats.health.failed(TroubleKind::DeadLetter, 1, error);
            }
        }
        Ok(resolved)
    }

    /// Whether the consumer is paused: the store's answer, asked at most once per
    /// [`PAUSE_CHECK_INTERVAL`]. On a store error the last answer stands (logged): an outage
    /// neither pauses nor resumes a consumer.
    async fn check_paused(&mut self) -> bool {
        if self
            .last_pause_check
            .is_some_and(|t| t.elapsed() < PAUSE_CHECK_INTERVAL)
        {
            return self.paused;
        }
        let first = self.last_pause_check.is_none();
        self.last_pause_check = Some(Instant::now());
        match self.store.consumer_paused(&self.config.name).await {
            Ok(paused) => {
                if paused != self.paused || first {
                    if paused {
                        info!(consumer = %self.config.name, "paused by an operator: taking no deliveries until resumed");
                    } else if !first {
                        info!(consumer = %self.config.name, "resumed by an operator");
                    }
                    metrics::gauge!(metric::PAUSED, "consumer" => self.config.name.clone())
                        .set(if paused { 1.0 } else { 0.0 });
                }
                self.paused = paused;
                self.stats.set_paused(paused);
            }
            Err(e) => {
                warn!(consumer = %self.config.name, error = %e, "could not read whether the consumer is paused")
            }
        }
        self.paused
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

/// Counts a batch's verdicts into its report and the consumer's metrics.
fn count_verdicts(report: &mut ConsumerReport, verdicts: Vec<Verdict>, name: &str) {
    for v in verdicts {
        let label = ("consumer", name.to_owned());
        match v {
            Verdict::Processed => {
                report.processed += 1;
                metrics::counter!(metric::PROCESSED, &[label]).increment(1);
            }
            Verdict::Duplicate => {
                report.duplicates += 1;
                metrics::counter!(metric::DUPLICATES, &[label]).increment(1);
            }
            Verdict::Stale => {
                report.stale += 1;
                metrics::counter!(metric::STALE, &[label]).increment(1);
            }
            Verdict::Conflict | Verdict::ConflictHeld(_) => {
                report.conflicts += 1;
                metrics::counter!(metric::CONFLICTS, &[label]).increment(1);
            }
            Verdict::DeadLettered(reason) => {
                report.dead_lettered += 1;
                metrics::counter!(
                    metric::DEAD_LETTERED,
                    &[label, ("reason", reason.to_owned())]
                )
                .increment(1);
            }
            Verdict::Nack(_) => {
                report.nacked += 1;
                metrics::counter!(metric::RETRIES, &[label]).increment(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_config_is_checked_field_by_field() {
        assert_eq!(ConsumerConfig::new("billing").validate(), Ok(()));
        let widest = "𠀀".repeat(crate::wire::MAX_ATTRIBUTE_CHARS);
        assert_eq!(ConsumerConfig::new(widest).validate(), Ok(()));
        let refused = |c: ConsumerConfig| c.validate().unwrap_err().key;
        assert_eq!(refused(ConsumerConfig::new("")), "name");
        assert_eq!(refused(ConsumerConfig::new("  ")), "name");
        assert_eq!(refused(ConsumerConfig::new("a\0b")), "name");
        assert_eq!(
            refused(ConsumerConfig::new(
                "x".repeat(crate::wire::MAX_ATTRIBUTE_CHARS + 1)
            )),
            "name"
        );
        assert_eq!(
            refused(ConsumerConfig {
                batch_size: 0,
                ..ConsumerConfig::new("c")
            }),
            "batch_size"
        );
        assert_eq!(
            refused(ConsumerConfig {
                max_attempts: 0,
                ..ConsumerConfig::new("c")
            }),
            "max_attempts"
        );
    }

    #[test]
    fn reasons_are_printable_and_bounded() {
        assert_eq!(printable("bad\0value\n"), "bad\\u{0}value\\u{a}");
        let long = printable(&"x".repeat(MAX_REASON_CHARS + 10));
        assert_eq!(long.chars().count(), MAX_REASON_CHARS + 1);
        assert!(long.ends_with('…'));
        assert_eq!(printable("fine"), "fine");
    }

    #[test]
    fn the_digest_covers_every_part_of_the_message() {
        let raw = RawMessage {
            payload: bytes::Bytes::from_static(b"body"),
            headers: [("a".to_owned(), "1".to_owned())].into(),
            content_type: Some("text/plain".into()),
            ..RawMessage::default()
        };
        let mut other = raw.clone();
        other.headers.insert("a".into(), "2".into());
        let mut binary = raw.clone();
        binary
            .binary_headers
            .insert("b".into(), bytes::Bytes::from_static(&[0xff]));
        let mut typed = raw.clone();
        typed.content_type = None;
        let d = digest(&raw);
        assert_eq!(d, digest(&raw.clone()));
        for changed in [other, binary, typed] {
            assert_ne!(d, digest(&changed));
        }
        let mut metadata = raw.clone();
        metadata.metadata.insert("delivered".into(), "2".into());
        assert_eq!(d, digest(&metadata), "broker metadata changes per delivery");
    }
}
