//! The inbox runner: for each delivery, begin a transaction, record the inbox identity, run
//! the user's handler on that same transaction, commit, and only then acknowledge (G5, G6).
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
//! | database error | rolled back | nack with backoff (redelivered, absorbed if it had committed) |
//!
//! A crash anywhere before the commit rolls everything back and the broker redelivers; a crash
//! after the commit and before the ack leads to a redelivery that the inbox absorbs. Dead
//! letters are never counted as processed; `requeue` makes the runner apply them again, through
//! the inbox, so a requeued event still has at most one effect.
//!
//! # Batching
//!
//! With `batch_size > 1` several deliveries share one transaction (one commit, then all acks),
//! with no savepoints on the happy path. When one delivery must be rolled back (a handler
//! error, an ordering gap) the whole batch is rolled back and redone one transaction per
//! delivery, so the others still commit and only the failing one is retried or dead-lettered.
//! (A savepoint per delivery would cost two extra round trips each; W4 measured it.)

use futures::FutureExt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::consumer::{Delivery, DeliverySource, RawMessage};
use outbox_core::relay::Backoff;
use outbox_core::{IncomingEvent, crash};
use sqlx::{Acquire, AssertSqlSafe, PgConnection, PgPool, Row};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, warn};

use crate::inbox::{InboxOutcome, OrderingGuard, PgInbox};
use crate::schema::Schema;

/// Consumer: the inbox row was written, the handler has not run.
pub const CRASH_AFTER_INBOX: &str = "consumer.after_inbox";
/// Consumer: the handler's effect was written, not committed.
pub const CRASH_AFTER_EFFECT: &str = "consumer.after_effect";
/// Consumer: committed, not acknowledged.
pub const CRASH_AFTER_COMMIT: &str = "consumer.after_commit";

/// Metric names of the consumer runner (label `consumer`).
pub mod metric {
    /// Counter: events whose effect was committed.
    pub const PROCESSED: &str = "outbox_consumer_processed_total";
    /// Counter: redeliveries absorbed by the inbox.
    pub const DUPLICATES: &str = "outbox_consumer_duplicates_total";
    /// Counter: older versions absorbed by the ordering guard.
    pub const STALE: &str = "outbox_consumer_stale_total";
    /// Counter: same id, different payload.
    pub const CONFLICTS: &str = "outbox_consumer_conflicts_total";
    /// Counter: deliveries dead-lettered (label `reason`: malformed, permanent, attempts).
    pub const DEAD_LETTERED: &str = "outbox_consumer_dead_lettered_total";
    /// Counter: negative acknowledgements (transient errors, gaps, database errors).
    pub const RETRIES: &str = "outbox_consumer_retries_total";
    /// Histogram: seconds spent in the handler.
    pub const HANDLER_SECONDS: &str = "outbox_consumer_handler_seconds";
    /// Gauge: messages waiting for this consumer (broker's view).
    pub const LAG: &str = "outbox_consumer_lag";
    /// Gauge: open consumer dead letters.
    pub const DEAD_LETTERS: &str = "outbox_consumer_dead_letters";
}

/// A handler error, saying whether a retry can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// May succeed later (a lock timeout, a dependency briefly down): redelivered with backoff.
    #[error("transient: {0}")]
    Transient(String),
    /// Will never succeed for this event (unknown schema version, invalid business state):
    /// dead-lettered at once.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl From<sqlx::Error> for HandlerError {
    /// Database errors inside a handler are transient (deadlocks, serialization failures,
    /// connection loss); a handler that knows better maps them itself.
    fn from(e: sqlx::Error) -> Self {
        Self::Transient(e.to_string())
    }
}

/// The user's effect. It runs on the transaction that also holds the inbox row; it must not
/// commit, and it must not call remote services whose effect cannot be rolled back (write a
/// work item instead, see [`crate::effects`]). It may run more than once for one event
/// (redeliveries, and in batch mode a redo after another delivery's rollback); only a committed
/// run counts. A panic inside `handle` is caught: it counts as
/// [`HandlerError::Transient`] (`handler panicked: …`), its writes roll back, and the delivery
/// is dead-lettered after `max_attempts` like any other transient failure.
pub trait Handler: Send + Sync + 'static {
    /// Applies `event` using `tx`.
    ///
    /// # Errors
    /// [`HandlerError`]: transient errors are retried, permanent ones dead-lettered.
    fn handle<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        event: &'a IncomingEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;
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

/// Settings of a [`PgConsumer`].
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
    /// Deliveries of one event with transient errors before it is dead-lettered.
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
}

/// What the runner decided for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    Processed,
    Duplicate,
    Stale,
    Conflict,
    /// Dead letter written (reason label, message).
    DeadLettered(&'static str),
    Nack(Duration),
}

/// Counts of one [`PgConsumer::run_batch`] call.
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

/// Why the runner stopped a batch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumerError {
    /// The broker side failed.
    #[error("broker: {0}")]
    Source(#[from] outbox_core::consumer::SourceError),
    /// The database failed; the batch's deliveries were negatively acknowledged.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

const INSERT_DEAD: &str = "INSERT INTO {s}.consumer_dead_letters (consumer_name, event_id, \
    aggregate_type, aggregate_id, aggregate_version, event_type, content_type, payload, headers, \
    error, attempts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb, $10, $11)";
const TAKE_REQUEUED: &str = "SELECT id, payload, headers::text, content_type, attempts \
    FROM {s}.consumer_dead_letters WHERE consumer_name = $1 AND state = 'requeued' \
    ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED";
const SETTLE_REQUEUED: &str = "UPDATE {s}.consumer_dead_letters SET state = $2, error = \
    coalesce($3, error), attempts = attempts + 1, updated_at = now() WHERE id = $1";
const COUNT_DEAD: &str = "SELECT count(*) FROM {s}.consumer_dead_letters \
    WHERE consumer_name = $1 AND state <> 'resolved'";

/// Runs a [`Handler`] over a [`DeliverySource`] with the inbox in between.
pub struct PgConsumer<S: DeliverySource, H: Handler> {
    pool: PgPool,
    inbox: PgInbox,
    source: S,
    handler: Arc<H>,
    config: ConsumerConfig,
    insert_dead: Arc<str>,
    take_requeued: Arc<str>,
    settle_requeued: Arc<str>,
    count_dead: Arc<str>,
    /// When requeued dead letters were last looked for, and whether the last batch was empty.
    last_requeue_check: Option<Instant>,
    idle: bool,
}

/// Headers as a JSON object for the dead-letter row. PostgreSQL's jsonb cannot hold NUL, so
/// NUL characters (only ever in hostile or broken messages) are replaced by U+FFFD.
fn raw_headers_json(raw: &RawMessage) -> String {
    let clean = |s: &String| s.replace('\0', "\u{FFFD}");
    let headers: std::collections::BTreeMap<String, String> = raw
        .headers
        .iter()
        .map(|(k, v)| (clean(k), clean(v)))
        .collect();
    serde_json::to_string(&headers).unwrap_or_else(|_| "{}".to_owned())
}

impl<S: DeliverySource, H: Handler> PgConsumer<S, H> {
    /// A runner for `config.name` reading from `source`, writing to `schema` through `pool`.
    pub fn new(
        pool: PgPool,
        schema: Schema,
        source: S,
        handler: H,
        config: ConsumerConfig,
    ) -> Self {
        let quoted = format!("\"{}\"", schema.as_str());
        let r = |t: &str| -> Arc<str> { t.replace("{s}", &quoted).into() };
        Self {
            inbox: PgInbox::new(schema),
            pool,
            source,
            handler: Arc::new(handler),
            insert_dead: r(INSERT_DEAD),
            take_requeued: r(TAKE_REQUEUED),
            settle_requeued: r(SETTLE_REQUEUED),
            count_dead: r(COUNT_DEAD),
            last_requeue_check: None,
            idle: true,
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Applies one decoded event on `conn` (a transaction or savepoint). Returns the verdict
    /// and whether the writes must be kept (committed) or rolled back.
    async fn apply(
        &self,
        conn: &mut PgConnection,
        event: &IncomingEvent,
        delivery_count: u32,
    ) -> Result<(Verdict, bool, Option<String>), sqlx::Error> {
        let outcome = self
            .inbox
            .record(conn, &self.config.name, self.config.ordering, event)
            .await?;
        self.apply_outcome(conn, event, delivery_count, outcome)
            .await
    }

    /// The part of [`Self::apply`] after the inbox decided: run the handler for a new event.
    async fn apply_outcome(
        &self,
        conn: &mut PgConnection,
        event: &IncomingEvent,
        delivery_count: u32,
        outcome: InboxOutcome,
    ) -> Result<(Verdict, bool, Option<String>), sqlx::Error> {
        let name = &self.config.name;
        Ok(match outcome {
            InboxOutcome::New => {
                crash::hit(CRASH_AFTER_INBOX);
                let started = Instant::now();
                // A panicking handler must not take the runner down with it (nor silently
                // stop consumption): it counts as a transient failure of this delivery, its
                // writes roll back, and after `max_attempts` deliveries it is dead-lettered.
                let result = match std::panic::AssertUnwindSafe(self.handler.handle(conn, event))
                    .catch_unwind()
                    .await
                {
                    Ok(r) => r,
                    Err(panic) => {
                        let what = panic
                            .downcast_ref::<&str>()
                            .map(|s| (*s).to_owned())
                            .or_else(|| panic.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "non-string panic payload".to_owned());
                        error!(consumer = %name, event_id = %event.event_id, panic = %what,
                            "handler panicked; treating it as a transient failure of this delivery");
                        Err(HandlerError::Transient(format!("handler panicked: {what}")))
                    }
                };
                metrics::histogram!(metric::HANDLER_SECONDS, "consumer" => name.clone())
                    .record(started.elapsed().as_secs_f64());
                match result {
                    Ok(()) => {
                        crash::hit(CRASH_AFTER_EFFECT);
                        (Verdict::Processed, true, None)
                    }
                    Err(HandlerError::Permanent(m)) => (
                        Verdict::DeadLettered("permanent"),
                        false,
                        Some(format!("permanent handler error: {m}")),
                    ),
                    Err(HandlerError::Transient(m))
                        if delivery_count >= self.config.max_attempts =>
                    {
                        (
                            Verdict::DeadLettered("attempts"),
                            false,
                            Some(format!(
                                "transient handler error after {delivery_count} deliveries: {m}"
                            )),
                        )
                    }
                    Err(HandlerError::Transient(m)) => {
                        debug!(consumer = %name, event_id = %event.event_id, error = %m, "transient handler error; redelivering");
                        (
                            Verdict::Nack(self.config.backoff.delay(delivery_count as i32)),
                            false,
                            None,
                        )
                    }
                }
            }
            InboxOutcome::Duplicate => (Verdict::Duplicate, true, None),
            InboxOutcome::Stale { .. } => (Verdict::Stale, true, None),
            InboxOutcome::Conflict { stored } => {
                warn!(consumer = %name, event_id = %event.event_id, stored = %stored, received = %event.fingerprint,
                    "CONFLICT: event id reused with a different payload; recorded, not applied");
                (Verdict::Conflict, true, None)
            }
            InboxOutcome::Gap { last_applied } => {
                debug!(consumer = %name, event_id = %event.event_id, last_applied, "ordering gap; redelivering later");
                (Verdict::Nack(self.config.gap_delay), false, None)
            }
        })
    }

    async fn insert_dead_letter(
        &self,
        conn: &mut PgConnection,
        raw: &RawMessage,
        event: Option<&IncomingEvent>,
        error: &str,
        attempts: u32,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(AssertSqlSafe(Arc::clone(&self.insert_dead)))
            .bind(&self.config.name)
            .bind(event.map(|e| e.event_id))
            .bind(event.map(|e| e.aggregate_type.as_str()))
            .bind(event.map(|e| e.aggregate_id.as_str()))
            .bind(event.map(|e| e.aggregate_version))
            .bind(event.map(|e| e.event_type.as_str()))
            .bind(raw.content_type.as_deref())
            .bind(raw.payload.as_ref())
            .bind(raw_headers_json(raw))
            .bind(error)
            .bind(i32::try_from(attempts).unwrap_or(i32::MAX))
            .execute(conn)
            .await
            .map(|_| ())
    }

    /// Processes one batch of deliveries, and requeued dead letters when the consumer is idle
    /// or they were last looked for `housekeeping_interval` ago. Returns what happened; an
    /// empty report when nothing arrived within `batch_wait`.
    ///
    /// # Errors
    /// [`ConsumerError`]; after a database error the batch's deliveries were negatively
    /// acknowledged (they come back and are absorbed if they had committed).
    pub async fn run_batch(&mut self) -> Result<ConsumerReport, ConsumerError> {
        // Requeued dead letters: looked for whenever the consumer is idle, and at least every
        // `housekeeping_interval` under load (one indexed query).
        let mut requeued_resolved = 0;
        let due = self
            .last_requeue_check
            .is_none_or(|t| t.elapsed() >= self.config.housekeeping_interval);
        if self.idle || due {
            self.last_requeue_check = Some(Instant::now());
            match self.process_requeued().await {
                Ok(n) => requeued_resolved = n,
                Err(e) => {
                    warn!(consumer = %self.config.name, error = %e, "could not process requeued dead letters")
                }
            }
        }
        let deliveries = self
            .source
            .next_batch(self.config.batch_size.max(1), self.config.batch_wait)
            .await?;
        let mut report = ConsumerReport {
            received: deliveries.len(),
            requeued_resolved,
            ..ConsumerReport::default()
        };
        self.idle = deliveries.is_empty();
        if deliveries.is_empty() {
            return Ok(report);
        }
        let verdicts = match self.decide(&deliveries).await {
            Ok(v) => v,
            Err(e) => {
                error!(consumer = %self.config.name, error = %e, "database error; redelivering the batch");
                let delay = self.config.backoff.delay(1);
                futures::future::join_all(deliveries.into_iter().map(|d| d.nack(delay))).await;
                metrics::counter!(metric::RETRIES, "consumer" => self.config.name.clone())
                    .increment(report.received as u64);
                return Err(e.into());
            }
        };
        crash::hit(CRASH_AFTER_COMMIT);
        let name = self.config.name.clone();
        // Settle all deliveries of the batch concurrently: an ack waits for the broker's
        // confirmation and a RabbitMQ nack waits out its (capped) delay, so doing them one by
        // one would cost a round trip or a delay per delivery.
        let settles = deliveries
            .into_iter()
            .zip(verdicts.iter())
            .map(|(d, v)| async move {
                match v {
                    Verdict::Nack(delay) => d.nack(*delay).await,
                    _ => d.ack().await,
                }
            });
        for result in futures::future::join_all(settles).await {
            if let Err(e) = result {
                warn!(consumer = %name, error = %e, "ack/nack failed; the broker will redeliver and the inbox absorbs it");
            }
        }
        for v in verdicts {
            let label = ("consumer", name.clone());
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
                Verdict::Conflict => {
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
        Ok(report)
    }

    /// Writes and commits; returns one verdict per delivery. Nothing is acknowledged here.
    async fn decide(&self, deliveries: &[S::Delivery]) -> Result<Vec<Verdict>, sqlx::Error> {
        if deliveries.len() > 1 {
            if let Some(verdicts) = self.decide_together(deliveries).await? {
                return Ok(verdicts);
            }
            debug!(consumer = %self.config.name, "a delivery needed a rollback; redoing the batch one transaction per delivery");
        }
        let mut verdicts = Vec::with_capacity(deliveries.len());
        for d in deliveries {
            verdicts.push(self.decide_one(d).await?);
        }
        Ok(verdicts)
    }

    /// The batch's fast path: every delivery in one transaction, no savepoints. As soon as one
    /// delivery must be rolled back (handler error, ordering gap) the whole transaction is
    /// rolled back and `None` returned: the caller redoes the batch one delivery at a time.
    async fn decide_together(
        &self,
        deliveries: &[S::Delivery],
    ) -> Result<Option<Vec<Verdict>>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let mut verdicts = Vec::with_capacity(deliveries.len());
        // Without the ordering guard the whole batch's inbox rows go in with one statement.
        let mut outcomes = if self.config.ordering == OrderingGuard::Off {
            let events: Vec<&IncomingEvent> = deliveries
                .iter()
                .filter_map(|d| d.event().as_ref().ok())
                .collect();
            self.inbox
                .record_many(&mut tx, &self.config.name, &events)
                .await?
                .into_iter()
        } else {
            Vec::new().into_iter()
        };
        for d in deliveries {
            let count = d.delivery_count().unwrap_or(1);
            match d.event() {
                Ok(event) if self.config.ordering == OrderingGuard::Off => {
                    let outcome = outcomes.next().expect("one outcome per decoded event");
                    let (verdict, keep, _) =
                        self.apply_outcome(&mut tx, event, count, outcome).await?;
                    if !keep {
                        tx.rollback().await?;
                        return Ok(None);
                    }
                    verdicts.push(verdict);
                }
                Err(decode) => {
                    warn!(consumer = %self.config.name, error = %decode, "malformed message dead-lettered");
                    self.insert_dead_letter(
                        &mut tx,
                        d.raw(),
                        None,
                        &format!("malformed: {decode}"),
                        count,
                    )
                    .await?;
                    verdicts.push(Verdict::DeadLettered("malformed"));
                }
                Ok(event) => {
                    let (verdict, keep, _) = self.apply(&mut tx, event, count).await?;
                    if !keep {
                        tx.rollback().await?;
                        return Ok(None);
                    }
                    verdicts.push(verdict);
                }
            }
        }
        tx.commit().await?;
        Ok(Some(verdicts))
    }

    /// One delivery in its own transaction (a dead letter, when one is due, is committed in a
    /// fresh transaction after the rollback of the failed attempt).
    async fn decide_one(&self, d: &S::Delivery) -> Result<Verdict, sqlx::Error> {
        let count = d.delivery_count().unwrap_or(1);
        let mut tx = self.pool.begin().await?;
        let event = match d.event() {
            Ok(e) => e,
            Err(decode) => {
                warn!(consumer = %self.config.name, error = %decode, "malformed message dead-lettered");
                self.insert_dead_letter(
                    &mut tx,
                    d.raw(),
                    None,
                    &format!("malformed: {decode}"),
                    count,
                )
                .await?;
                tx.commit().await?;
                return Ok(Verdict::DeadLettered("malformed"));
            }
        };
        let (verdict, keep, dead_reason) = self.apply(&mut tx, event, count).await?;
        if !keep {
            tx.rollback().await?;
            tx = self.pool.begin().await?;
        }
        if let Some(reason) = dead_reason {
            warn!(consumer = %self.config.name, event_id = %event.event_id, error = %reason, "event dead-lettered");
            self.insert_dead_letter(&mut tx, d.raw(), Some(event), &reason, count)
                .await?;
        }
        tx.commit().await?;
        Ok(verdict)
    }

    /// Applies dead letters an operator requeued, through the inbox (so at most one effect),
    /// marking them resolved, or dead again with the new error.
    ///
    /// # Errors
    /// [`sqlx::Error`].
    pub async fn process_requeued(&self) -> Result<usize, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query(AssertSqlSafe(Arc::clone(&self.take_requeued)))
            .bind(&self.config.name)
            .bind(100_i64)
            .fetch_all(&mut *tx)
            .await?;
        let mut resolved = 0;
        for row in &rows {
            let id: i64 = row.try_get(0)?;
            let payload: Vec<u8> = row.try_get(1)?;
            let headers: String = row.try_get(2)?;
            let raw = RawMessage {
                payload: payload.into(),
                headers: serde_json::from_str(&headers).unwrap_or_default(),
                content_type: row.try_get(3)?,
            };
            let attempts: i32 = row.try_get(4)?;
            let (state, error) = match self.source.decode(&raw) {
                Err(e) => ("dead", Some(format!("malformed: {e}"))),
                Ok(event) => {
                    let mut sp = tx.begin().await?;
                    let (verdict, keep, reason) = self
                        .apply(&mut sp, &event, attempts.max(0) as u32 + 1)
                        .await?;
                    if keep {
                        sp.commit().await?;
                    } else {
                        sp.rollback().await?;
                    }
                    match verdict {
                        Verdict::Processed | Verdict::Duplicate | Verdict::Stale => {
                            resolved += 1;
                            if verdict == Verdict::Processed {
                                metrics::counter!(metric::PROCESSED, "consumer" => self.config.name.clone()).increment(1);
                            }
                            ("resolved", None)
                        }
                        Verdict::Conflict => (
                            "dead",
                            Some("conflict: event id known with another payload".to_owned()),
                        ),
                        Verdict::Nack(_) => ("requeued", None),
                        Verdict::DeadLettered(_) => ("dead", reason),
                    }
                }
            };
            sqlx::query(AssertSqlSafe(Arc::clone(&self.settle_requeued)))
                .bind(id)
                .bind(state)
                .bind(error)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(resolved)
    }

    async fn housekeeping(&mut self) {
        let name = self.config.name.clone();
        match self.source.lag().await {
            Ok(Some(lag)) => {
                metrics::gauge!(metric::LAG, "consumer" => name.clone()).set(lag as f64)
            }
            Ok(None) => {}
            Err(e) => warn!(consumer = %name, error = %e, "could not read consumer lag"),
        }
        if let Ok(n) = sqlx::query_scalar::<_, i64>(AssertSqlSafe(Arc::clone(&self.count_dead)))
            .bind(&name)
            .fetch_one(&self.pool)
            .await
        {
            metrics::gauge!(metric::DEAD_LETTERS, "consumer" => name).set(n as f64);
        }
    }

    /// Runs until `shutdown` is cancelled; a batch in progress is finished (committed and
    /// acknowledged) first. Broker and database errors are logged and waited out.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut last_housekeeping = Instant::now() - self.config.housekeeping_interval;
        let mut failures = 0;
        while !shutdown.is_cancelled() {
            if last_housekeeping.elapsed() >= self.config.housekeeping_interval {
                self.housekeeping().await;
                last_housekeeping = Instant::now();
            }
            // Not raced against `shutdown`: a batch is bounded by `batch_wait` plus its
            // handlers, and is always finished (committed, then acknowledged).
            match self.run_batch().await {
                Ok(_) => failures = 0,
                Err(e) => {
                    failures += 1;
                    let wait = self.config.backoff.delay(failures);
                    warn!(consumer = %self.config.name, error = %e, ?wait, "consumer error; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = shutdown.cancelled() => break,
                    }
                }
            }
        }
    }
}

/// A consumer dead letter, for the CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerDeadLetter {
    /// Row id (what `requeue` takes).
    pub id: i64,
    /// Consumer.
    pub consumer_name: String,
    /// Event id, when the message had a valid one.
    pub event_id: Option<uuid::Uuid>,
    /// Aggregate type.
    pub aggregate_type: Option<String>,
    /// Aggregate id.
    pub aggregate_id: Option<String>,
    /// Version.
    pub aggregate_version: Option<i64>,
    /// Event type.
    pub event_type: Option<String>,
    /// Why it was dead-lettered (latest).
    pub error: String,
    /// Deliveries / attempts so far.
    pub attempts: i32,
    /// `dead`, `requeued` or `resolved`.
    pub state: String,
    /// First dead-lettered.
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// Lists consumer dead letters that are not resolved, oldest first, optionally for one
/// consumer.
///
/// # Errors
/// [`sqlx::Error`].
pub async fn consumer_dead_letter_list<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    schema: &Schema,
    consumer: Option<&str>,
    limit: i64,
) -> Result<Vec<ConsumerDeadLetter>, sqlx::Error> {
    let sql = format!(
        "SELECT id, consumer_name, event_id, aggregate_type, aggregate_id, aggregate_version, \
         event_type, error, attempts, state, created_at FROM \"{}\".consumer_dead_letters \
         WHERE state <> 'resolved' AND ($1::text IS NULL OR consumer_name = $1) \
         ORDER BY id LIMIT $2",
        schema.as_str()
    );
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(consumer)
        .bind(limit)
        .fetch_all(executor)
        .await?;
    rows.iter()
        .map(|r| {
            Ok(ConsumerDeadLetter {
                id: r.try_get(0)?,
                consumer_name: r.try_get(1)?,
                event_id: r.try_get(2)?,
                aggregate_type: r.try_get(3)?,
                aggregate_id: r.try_get(4)?,
                aggregate_version: r.try_get(5)?,
                event_type: r.try_get(6)?,
                error: r.try_get(7)?,
                attempts: r.try_get(8)?,
                state: r.try_get(9)?,
                created_at: r.try_get(10)?,
            })
        })
        .collect()
}

/// Marks dead letters for the consumer runner to apply again (through the inbox). `ids: None`
/// requeues every open dead letter (of `consumer`, when given). Returns how many.
///
/// # Errors
/// [`sqlx::Error`].
pub async fn consumer_dead_letter_requeue<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    schema: &Schema,
    consumer: Option<&str>,
    ids: Option<&[i64]>,
) -> Result<u64, sqlx::Error> {
    let sql = format!(
        "UPDATE \"{}\".consumer_dead_letters SET state = 'requeued', updated_at = now() \
         WHERE state = 'dead' AND ($1::text IS NULL OR consumer_name = $1) \
         AND ($2::int8[] IS NULL OR id = ANY($2))",
        schema.as_str()
    );
    Ok(sqlx::query(AssertSqlSafe(sql))
        .bind(consumer)
        .bind(ids)
        .execute(executor)
        .await?
        .rows_affected())
}
