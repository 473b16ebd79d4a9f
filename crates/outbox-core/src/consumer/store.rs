//! [`InboxStore`] and its values: the contract is in [`InboxStore`]'s docs (this module is private).

use std::future::Future;
use std::ops::DerefMut;

use chrono::{DateTime, Utc};

use super::source::RawMessage;
use crate::error::StoreError;
use crate::message::Fingerprint;
use crate::wire::{EventIdentity, IncomingEvent};

/// What to do with an event whose version is not the next one of its aggregate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OrderingGuard {
    /// No ordering check: every new event is applied (default).
    #[default]
    Off,
    /// Track the last applied version per aggregate. An older or equal version is absorbed
    /// as `Stale`; a gap (`version > last + 1`, or a first-seen aggregate not at version 1)
    /// returns `Gap`: roll back and let the broker redeliver it later, after the missing
    /// versions arrived.
    Wait,
    /// Track versions; absorb older ones as `Stale`, but apply across a gap (the consumer
    /// joined the stream mid-way, or tolerates gaps), moving the mark to the new version.
    ApplyAnyway,
}

impl OrderingGuard {
    /// What the guard makes of `version` of an aggregate whose last applied version is
    /// `last_applied` (0: none yet): [`InboxOutcome::New`] (apply it, and record `version` as
    /// the last applied), [`InboxOutcome::Stale`] (an older or equal version: absorb it) or,
    /// under [`OrderingGuard::Wait`] only, [`InboxOutcome::Gap`] (a version in between is
    /// missing). [`OrderingGuard::Off`] applies everything.
    ///
    /// The one statement of the ordering rules: a store reads and locks the aggregate's mark,
    /// asks this, and writes what it says (mark the row stale, or move the mark).
    pub fn judge(self, last_applied: i64, version: i64) -> InboxOutcome {
        match self {
            Self::Off => InboxOutcome::New,
            _ if version <= last_applied => InboxOutcome::Stale { last_applied },
            Self::Wait if version > last_applied.saturating_add(1) => {
                InboxOutcome::Gap { last_applied }
            }
            Self::Wait | Self::ApplyAnyway => InboxOutcome::New,
        }
    }
}

/// What recording a delivery in the inbox found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxOutcome {
    /// First time: apply the effect in this transaction, then commit, then acknowledge.
    New,
    /// Already recorded with the same fingerprint: skip the effect, commit, acknowledge.
    Duplicate,
    /// Already recorded with a *different* payload fingerprint: never apply. The conflict was
    /// written in this transaction: commit it, then follow the consumer's conflict policy.
    Conflict {
        /// The fingerprint recorded first.
        stored: Fingerprint,
    },
    /// The ordering guard absorbed an older version: no effect; recorded as `stale`.
    Stale {
        /// The last version applied for the aggregate.
        last_applied: i64,
    },
    /// The ordering guard (policy `Wait`) saw a gap: roll back, redeliver later.
    Gap {
        /// The last version applied for the aggregate (0: none yet).
        last_applied: i64,
    },
}

impl InboxOutcome {
    /// True only for [`InboxOutcome::New`]: the one case where the effect must run.
    pub fn should_apply(&self) -> bool {
        matches!(self, Self::New)
    }

    /// What a delivery is whose event id the inbox already holds with fingerprint `stored`:
    /// [`InboxOutcome::Duplicate`] when the payload is the same, otherwise
    /// [`InboxOutcome::Conflict`] (which the store then records). The one statement of the
    /// rule; every store calls it.
    pub fn seen_again(stored: Fingerprint, received: Fingerprint) -> Self {
        if stored == received {
            Self::Duplicate
        } else {
            Self::Conflict { stored }
        }
    }
}

/// The state of a consumer dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerDeadLetterState {
    /// Parked, waiting for an operator.
    Dead,
    /// Handed back by an operator: the consumer applies it through its inbox.
    Requeued,
    /// Applied (or absorbed) after a requeue.
    Resolved,
}

impl ConsumerDeadLetterState {
    /// The stored name: `dead`, `requeued` or `resolved`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Dead => "dead",
            Self::Requeued => "requeued",
            Self::Resolved => "resolved",
        }
    }
}

/// A delivery the consumer could not apply, to be kept for an operator.
#[derive(Debug, Clone, Copy)]
pub struct NewConsumerDeadLetter<'a> {
    /// The consumer.
    pub consumer: &'a str,
    /// The message as received (body and headers kept as they came).
    pub raw: &'a RawMessage,
    /// Which event it is, as far as it could be read: every field of a decoded event, the
    /// readable attributes of a malformed one ([`DeliverySource::identify`](super::DeliverySource::identify)),
    /// nothing when the database refused those values before. Each field holds text without
    /// control characters, at most [`MAX_ATTRIBUTE_CHARS`](crate::wire::MAX_ATTRIBUTE_CHARS)
    /// characters long.
    pub identity: &'a EventIdentity,
    /// Why it was dead-lettered.
    pub error: &'a str,
    /// Deliveries / attempts so far.
    pub attempts: u32,
}

/// A dead letter an operator requeued, taken (and locked) by the consumer to apply it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequeuedDeadLetter {
    /// The dead letter's id.
    pub id: i64,
    /// The message as it was received.
    pub raw: RawMessage,
    /// Attempts so far.
    pub attempts: i32,
}

/// A consumer dead letter as operators see it (serialised as the console's API shows it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
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
    pub created_at: DateTime<Utc>,
}

/// The consumer's view of its database: transactions, the inbox and its dead letters.
///
/// The database side of a consumer: the [`InboxStore`] trait a store crate implements, and the
/// values it speaks in.
///
/// An inbox store owns transactions on the consumer's own database. The consumer engine begins
/// one, records the delivery's identity `(consumer, event_id)` with its payload fingerprint in
/// it, lets the user's handler write its effect on the same transaction (the handler receives
/// [`InboxStore::Conn`], the database connection of the transaction), commits, and only
/// then acknowledges the broker.
///
/// # What an implementation must guarantee (checked by the store conformance suite)
///
/// * Recording is atomic with the transaction: a rolled-back transaction leaves no identity.
/// * Two transactions recording the same `(consumer, event_id)` meet: the second waits for the
///   first, then sees [`InboxOutcome::Duplicate`] (or `Conflict`) if it committed, or records the
///   event itself if it rolled back. A unique key under READ COMMITTED suffices for this.
/// * A known id with a different fingerprint is [`InboxOutcome::Conflict`], and the conflict is
///   written in the same transaction.
/// * With an ordering guard, versions per `(consumer, aggregate)` are tracked in the same
///   transaction, and the aggregate is locked until it ends.
pub trait InboxStore: Send + Sync + 'static {
    /// The connection the user's handler writes its effect on (the database driver's
    /// connection type).
    type Conn: Send;
    /// An open transaction; dereferences to its connection. Dropping it without
    /// [`InboxStore::commit`] rolls it back (as `sqlx::Transaction` does), so an error path may
    /// simply drop it.
    type Tx: DerefMut<Target = Self::Conn> + Send;

    /// Begins a transaction.
    ///
    /// # Errors
    /// [`StoreError`], kind `Unavailable` on an outage.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, StoreError>> + Send;

    /// Commits `tx`.
    ///
    /// # Errors
    /// [`StoreError`]; the outcome of the commit is then unknown to the caller, which must not
    /// acknowledge (a redelivery is absorbed if the commit did happen).
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Rolls `tx` back.
    ///
    /// # Errors
    /// [`StoreError`]; the transaction is gone either way.
    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records `event` for `consumer` on `conn` and says whether to apply its effect.
    ///
    /// # Errors
    /// [`StoreError`]; the transaction is then unusable and must be rolled back.
    fn inbox_record<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        consumer: &'a str,
        guard: OrderingGuard,
        event: &'a IncomingEvent,
    ) -> impl Future<Output = Result<InboxOutcome, StoreError>> + Send + 'a;

    /// Records several events without an ordering guard, one outcome per event in order, exactly
    /// as [`InboxStore::inbox_record`] called for each in turn would decide (an id repeated in
    /// the batch is `New` once, then `Duplicate` or `Conflict`).
    ///
    /// # Errors
    /// [`StoreError`]; the transaction must be rolled back.
    fn inbox_record_many<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        consumer: &'a str,
        events: &'a [&'a IncomingEvent],
    ) -> impl Future<Output = Result<Vec<InboxOutcome>, StoreError>> + Send + 'a;

    /// Writes a consumer dead letter on `conn`.
    ///
    /// # Errors
    /// [`StoreError`]; the transaction must be rolled back.
    fn consumer_dead_letter_insert<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        letter: NewConsumerDeadLetter<'a>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Takes up to `limit` dead letters of `consumer` that an operator requeued, least recently
    /// updated first (so one that is still waiting after a try goes to the back), locking them
    /// for this transaction (others skip them).
    ///
    /// # Errors
    /// [`StoreError`].
    fn consumer_dead_letter_take_requeued<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        consumer: &'a str,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<RequeuedDeadLetter>, StoreError>> + Send + 'a;

    /// Sets a requeued dead letter's state after the consumer tried it again (one more attempt;
    /// `error`, when given, replaces the reason). Changes nothing unless it is still `requeued`.
    ///
    /// # Errors
    /// [`StoreError`].
    fn consumer_dead_letter_settle<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        id: i64,
        state: ConsumerDeadLetterState,
        error: Option<&'a str>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// Open (not resolved) dead letters of `consumer`, for the dead-letter gauge.
    ///
    /// # Errors
    /// [`StoreError`].
    fn consumer_dead_letter_count<'a>(
        &'a self,
        consumer: &'a str,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send + 'a;

    /// Whether an operator paused `consumer` (the engine then takes no deliveries; it asks at
    /// most once per [`PAUSE_CHECK_INTERVAL`](super::PAUSE_CHECK_INTERVAL)). No
    /// default: a wrapper of another store must ask it, or a pause would silently not hold.
    ///
    /// # Errors
    /// [`StoreError`]; the engine then keeps the last answer and logs the error.
    fn consumer_paused<'a>(
        &'a self,
        consumer: &'a str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ordering_rules() {
        use InboxOutcome::{Gap, New, Stale};
        use OrderingGuard::{ApplyAnyway, Off, Wait};
        for (guard, last, v, want) in [
            (Off, 5, 1, New),
            (Off, 5, 9, New),
            (Wait, 0, 1, New),
            (Wait, 0, 2, Gap { last_applied: 0 }),
            (Wait, 4, 5, New),
            (Wait, 4, 4, Stale { last_applied: 4 }),
            (Wait, 4, 3, Stale { last_applied: 4 }),
            (Wait, 4, 7, Gap { last_applied: 4 }),
            (
                Wait,
                i64::MAX,
                i64::MAX,
                Stale {
                    last_applied: i64::MAX,
                },
            ),
            (ApplyAnyway, 4, 7, New),
            (ApplyAnyway, 0, 3, New),
            (ApplyAnyway, 4, 2, Stale { last_applied: 4 }),
        ] {
            assert_eq!(guard.judge(last, v), want, "{guard:?} last {last} v {v}");
        }
    }

    #[test]
    fn a_known_id_is_a_duplicate_or_a_conflict() {
        let a = Fingerprint::of(b"a");
        let b = Fingerprint::of(b"b");
        assert_eq!(InboxOutcome::seen_again(a, a), InboxOutcome::Duplicate);
        assert_eq!(
            InboxOutcome::seen_again(a, b),
            InboxOutcome::Conflict { stored: a }
        );
    }
}
