//! One batch: taken from the source, decided and committed (all deliveries in one
//! transaction, or one transaction per delivery once one of them must be rolled back), then
//! settled with the broker (acks and nacks, after the commit) and counted.

use std::future::Future;

use tracing::{debug, error, warn};

use super::apply::{Applied, Verdict};
use super::{Consumer, ConsumerError, ConsumerReport, Handler, metric};
use crate::consumer::source::{Delivery, DeliverySource};
use crate::consumer::store::{InboxOutcome, InboxStore, OrderingGuard};
use crate::crash;
use crate::error::StoreError;
use crate::health::TroubleKind;
use crate::wire::IncomingEvent;

impl<S: InboxStore, Src: DeliverySource, H: Handler<S::Conn>> Consumer<S, Src, H> {
    /// Takes a batch, decides and commits it, and returns its counts with the settling of its
    /// deliveries (acks and nacks, still to be awaited); no settling when nothing arrived.
    pub(super) async fn take_batch(
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

    /// Writes and commits; returns one verdict per delivery (`attempts` holds each one's
    /// delivery count). Nothing is acknowledged here.
    ///
    /// # Errors
    /// Only an outage ([`StoreErrorKind::Unavailable`]): every other database error is decided
    /// per delivery.
    ///
    /// [`StoreErrorKind::Unavailable`]: crate::error::StoreErrorKind::Unavailable
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
