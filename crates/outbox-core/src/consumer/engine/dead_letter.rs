//! Dead letters: writing one in a transaction of its own (its reason made [`printable`]; again
//! with the raw message alone when the database refuses the event's values; never an ack
//! without a record), and what a database error on one delivery leads to.

use tracing::{error, warn};

use super::apply::Verdict;
use super::{Consumer, Handler};
use crate::consumer::source::{Delivery, DeliverySource, RawMessage};
use crate::consumer::store::{InboxStore, NewConsumerDeadLetter};
use crate::error::{StoreError, StoreErrorKind};
use crate::health::TroubleKind;
use crate::wire::{EventIdentity, IncomingEvent};

/// Longest dead-letter reason stored, in characters (a database error may quote a long value).
pub const MAX_REASON_CHARS: usize = 1024;

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

impl<S: InboxStore, Src: DeliverySource, H: Handler<S::Conn>> Consumer<S, Src, H> {
    /// The identity a dead letter of `raw` keeps: the decoded `event`'s, or what the source can
    /// still read of a malformed message.
    pub(super) fn identity(
        &self,
        raw: &RawMessage,
        event: Option<&IncomingEvent>,
    ) -> EventIdentity {
        match event {
            Some(event) => EventIdentity::of(event),
            None => self.source.identify(raw),
        }
    }

    /// Writes a dead letter on `conn`; `error` is made [`printable`] first.
    pub(super) async fn insert_dead_letter(
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
    pub(super) async fn park(
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
    pub(super) async fn after_store_error(
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_printable_and_bounded() {
        assert_eq!(printable("bad\0value\n"), "bad\\u{0}value\\u{a}");
        let long = printable(&"x".repeat(MAX_REASON_CHARS + 10));
        assert_eq!(long.chars().count(), MAX_REASON_CHARS + 1);
        assert!(long.ends_with('…'));
        assert_eq!(printable("fine"), "fine");
    }
}
