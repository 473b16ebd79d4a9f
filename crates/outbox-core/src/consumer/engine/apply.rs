//! One event through the inbox, on a transaction the caller holds: the inbox records it and
//! decides, and a new event goes to the [`Handler`] (timed, its panics caught). What comes
//! out is a [`Verdict`] per delivery, and whether the transaction's writes are kept.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tracing::{debug, error, warn};

use super::{ConflictPolicy, Consumer, Handler, HandlerError, metric};
use crate::consumer::source::DeliverySource;
use crate::consumer::store::{InboxOutcome, InboxStore};
use crate::crash;
use crate::error::StoreError;
use crate::health::TroubleKind;
use crate::wire::IncomingEvent;

/// What the engine decided for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
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
pub(super) struct Applied {
    pub(super) verdict: Verdict,
    pub(super) keep: bool,
    pub(super) dead_reason: Option<String>,
}

impl<S: InboxStore, Src: DeliverySource, H: Handler<S::Conn>> Consumer<S, Src, H> {
    /// Applies one decoded event on `conn`.
    pub(super) async fn apply(
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
    pub(super) async fn apply_outcome(
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
    pub(super) async fn call_handler(
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
}
