//! Requeued dead letters: an operator sends a dead letter back, and the engine applies it
//! again through the inbox (so a requeued event still has at most one effect).

use std::time::Instant;

use tracing::warn;

use super::apply::{Applied, Verdict};
use super::{Consumer, Handler, metric, printable};
use crate::consumer::source::DeliverySource;
use crate::consumer::store::{ConsumerDeadLetterState, InboxStore};
use crate::error::{StoreError, StoreErrorKind};
use crate::health::TroubleKind;

impl<S: InboxStore, Src: DeliverySource, H: Handler<S::Conn>> Consumer<S, Src, H> {
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

    /// Requeued dead letters: looked for whenever the consumer is idle, and at least every
    /// `housekeeping_interval` under load (one indexed query). Returns how many were settled.
    pub(super) async fn requeued_housekeeping(&mut self) -> usize {
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
}
