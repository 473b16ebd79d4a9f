//! Outbox and consumer dead letters as the operator works with them: filtered, grouped by
//! reason, read whole, requeued or discarded by ids, by filter or all, each action audited.
//! One model for both sides: the outbox's dead rows (an event the relay could not publish)
//! and the consumers' dead letters (a message a consumer could not decode or apply).
//!
//! **Reasons** are grouped as ServicePulse groups failures: by the error text with its
//! numbers and UUIDs replaced by `#` and cut at 200 characters ([`reason_key`]), so that
//! "publish timed out after 5000 ms (event 1f0e…)" of a thousand rows is one group; a group's
//! key selects exactly its rows in a filter.
//!
//! **Destination** in a filter is the row's own `destination` (the producer's override); rows
//! without one go where the relay's topic template sends their aggregate type, so filter those
//! by `aggregate_type`. **Time** is the event's `created_at` (when the producer wrote it).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Action, Actor, OperatorError, PayloadView, require_reason};
use crate::EventId;

/// The longest reason key, in characters.
const REASON_KEY_CHARS: usize = 200;

/// The reason key of an error text: every UUID (8-4-4-4-12 hex digits) and every run of
/// decimal digits replaced by `#`, the result cut at 200 characters. A missing error is the
/// empty key.
pub fn reason_key(error: Option<&str>) -> String {
    let chars: Vec<char> = error.unwrap_or("").chars().collect();
    let is_uuid = |at: usize| {
        const GROUPS: [usize; 5] = [8, 4, 4, 4, 12];
        let mut i = at;
        for (n, len) in GROUPS.iter().enumerate() {
            if n > 0 {
                if chars.get(i) != Some(&'-') {
                    return false;
                }
                i += 1;
            }
            for _ in 0..*len {
                if !chars.get(i).is_some_and(char::is_ascii_hexdigit) {
                    return false;
                }
                i += 1;
            }
        }
        true
    };
    let mut key = String::new();
    let mut i = 0;
    while i < chars.len() {
        if is_uuid(i) {
            key.push('#');
            i += 36;
        } else if chars[i].is_ascii_digit() {
            key.push('#');
            while chars.get(i).is_some_and(char::is_ascii_digit) {
                i += 1;
            }
        } else {
            key.push(chars[i]);
            i += 1;
        }
    }
    key.chars().take(REASON_KEY_CHARS).collect()
}

/// Which outbox dead letters a read or an action is about (every field optional; all given
/// must hold). See the module docs for what each field compares.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterFilter {
    /// The aggregate type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_type: Option<String>,
    /// The event type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// The row's own destination (the producer's override).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// A reason group's key ([`DeadLetterGroup::reason`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_group: Option<String>,
    /// Written by the producer at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<DateTime<Utc>>,
    /// Written by the producer before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<DateTime<Utc>>,
}

/// Which outbox dead letters an action takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterSelection {
    /// These event ids (ids that are not dead letters are skipped, and not counted).
    Ids(Vec<EventId>),
    /// Every dead letter matching the filter, decided by the store in the action itself (what
    /// matches when it runs, not when a list was read).
    Matching(DeadLetterFilter),
    /// Every dead letter.
    All,
}

/// Which consumer dead letters a read or an action is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerSelection {
    /// Only this consumer's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// Only these ids; `None` takes every one that matches the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<i64>>,
    /// Only this reason group ([`ConsumerDeadLetterGroup::reason`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_group: Option<String>,
}

/// An outbox dead letter as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterView {
    /// Event id.
    pub event_id: EventId,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Version.
    pub aggregate_version: i64,
    /// Event type.
    pub event_type: String,
    /// Attempts made.
    pub attempts: i32,
    /// The last error.
    pub last_error: Option<String>,
    /// When the producer wrote it.
    pub created_at: DateTime<Utc>,
    /// Events of the same aggregate waiting behind it.
    pub blocked_behind: i64,
    /// The producer's destination override, if any.
    pub destination: Option<String>,
    /// The payload's content type.
    pub content_type: String,
    /// The payload's schema version.
    pub schema_version: i32,
    /// Its reason group's key.
    pub reason: String,
}

/// Outbox dead letters that share a reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterGroup {
    /// The reason key (a filter's `reason_group` selects exactly this group).
    pub reason: String,
    /// How many (among those read).
    pub count: i64,
    /// The oldest one's creation time.
    pub first_created_at: DateTime<Utc>,
    /// The newest one's creation time.
    pub last_created_at: DateTime<Utc>,
    /// Their aggregate types (at most 10).
    pub aggregate_types: Vec<String>,
    /// Their event types (at most 10).
    pub event_types: Vec<String>,
    /// The oldest one's error text, as it was.
    pub example_error: Option<String>,
}

/// The reason groups of the dead letters matching a filter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterGroups {
    /// Largest group first.
    pub groups: Vec<DeadLetterGroup>,
    /// `false` when [`GROUP_SCAN`] or more dead letters matched: the groups then count the
    /// oldest [`GROUP_SCAN`] only.
    pub complete: bool,
}

/// Consumer dead letters that share a consumer and a reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerDeadLetterGroup {
    /// The consumer.
    pub consumer_name: String,
    /// The reason key (a selection's `reason_group` selects exactly this group).
    pub reason: String,
    /// How many (among those read).
    pub count: i64,
    /// The oldest one's time.
    pub first_at: DateTime<Utc>,
    /// The newest one's time.
    pub last_at: DateTime<Utc>,
    /// The oldest one's error text, as it was.
    pub example_error: String,
}

/// The (consumer, reason) groups of consumer dead letters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerDeadLetterGroups {
    /// Largest group first.
    pub groups: Vec<ConsumerDeadLetterGroup>,
    /// `false` when [`GROUP_SCAN`] or more matched: the groups then count the oldest
    /// [`GROUP_SCAN`] only.
    pub complete: bool,
}

/// A consumer dead letter with its reason group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerDeadLetterView {
    /// The dead letter.
    #[serde(flatten)]
    pub dead_letter: crate::consumer::ConsumerDeadLetter,
    /// Its reason group's key.
    pub reason: String,
}

/// An outbox dead letter whole: its row, payload and headers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetterDetail {
    /// The row.
    #[serde(flatten)]
    pub dead_letter: DeadLetterView,
    /// The payload.
    pub payload: PayloadView,
    /// The producer's headers.
    pub headers: serde_json::Value,
    /// The partition key, when the producer set one.
    pub partition_key: Option<String>,
}

/// A consumer dead letter whole: its row, the payload and headers as received.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerDeadLetterDetail {
    /// The row.
    #[serde(flatten)]
    pub dead_letter: ConsumerDeadLetterView,
    /// The payload as received.
    pub payload: PayloadView,
    /// The headers as received.
    pub headers: serde_json::Value,
    /// The content type as received.
    pub content_type: Option<String>,
}

/// What a discard did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Discarded {
    /// Dead letters discarded (kept as discarded events, removed from the outbox).
    pub discarded: u64,
    /// The audit record naming them.
    pub audit_id: i64,
}

/// The most dead letters one group read looks at: a store computes the reason key of each one
/// it reads, so a group read is bounded (the console reads the groups every 5 s).
pub const GROUP_SCAN: i64 = 10_000;

impl DeadLetterSelection {
    /// The selection as the audit record keeps it.
    pub fn audit_selection(&self) -> serde_json::Value {
        match self {
            Self::Ids(ids) => serde_json::json!({ "event_ids": ids }),
            Self::Matching(f) => serde_json::json!({ "filter": f }),
            Self::All => serde_json::json!({ "all": true }),
        }
    }
}

impl ConsumerSelection {
    /// The selection as the audit record keeps it.
    pub fn audit_selection(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Puts the groups of one group read largest first (a stable sort: groups of one count keep the
/// order given) and says whether the read was complete: fewer than [`GROUP_SCAN`] rows read, each
/// read row being counted in exactly one group.
fn largest_first<G>(groups: &mut [G], count: impl Fn(&G) -> i64) -> bool {
    groups.sort_by_key(|g| std::cmp::Reverse(count(g)));
    let read: i64 = groups.iter().map(&count).sum();
    read < GROUP_SCAN
}

impl DeadLetterGroups {
    /// The groups of one group read of at most [`GROUP_SCAN`] dead letters (every one read
    /// counted in exactly one group): largest first, groups of one count in the order given (a
    /// store gives them by reason), `complete` when fewer than [`GROUP_SCAN`] were read.
    pub fn from_scan(mut groups: Vec<DeadLetterGroup>) -> Self {
        let complete = largest_first(&mut groups, |g| g.count);
        Self { groups, complete }
    }
}

impl ConsumerDeadLetterGroups {
    /// The groups of one group read of at most [`GROUP_SCAN`] consumer dead letters (every one
    /// read counted in exactly one group): largest first, groups of one count in the order given
    /// (a store gives them by consumer, then reason), `complete` when fewer than [`GROUP_SCAN`]
    /// were read.
    pub fn from_scan(mut groups: Vec<ConsumerDeadLetterGroup>) -> Self {
        let complete = largest_first(&mut groups, |g| g.count);
        Self { groups, complete }
    }
}

impl DeadLetterFilter {
    /// Whether a dead letter with these fields matches (every given field holds); `reason` is
    /// its [`reason_key`].
    pub fn matches(
        &self,
        aggregate_type: &str,
        event_type: &str,
        destination: Option<&str>,
        reason: &str,
        created_at: DateTime<Utc>,
    ) -> bool {
        self.aggregate_type
            .as_deref()
            .is_none_or(|t| t == aggregate_type)
            && self.event_type.as_deref().is_none_or(|t| t == event_type)
            && self
                .destination
                .as_deref()
                .is_none_or(|d| Some(d) == destination)
            && self.reason_group.as_deref().is_none_or(|r| r == reason)
            && self.created_after.is_none_or(|t| created_at >= t)
            && self.created_before.is_none_or(|t| created_at < t)
    }
}

/// Outbox and consumer dead letters.
///
/// The actions (`requeue_*`, `discard_*`) are provided: each names its [`Action`], checks the
/// request (a discard needs a reason), runs the store's `apply_*` hook and logs the outcome,
/// so every store audits, refuses and logs alike. A store implements the reads and the hooks.
pub trait DeadLetterOps: Sync {
    /// Outbox dead letters matching `filter`, oldest first, at most `limit` (1 to
    /// [`MAX_LIST`](super::MAX_LIST)).
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// store's failure.
    fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<DeadLetterView>, OperatorError>> + Send;

    /// The reason groups of the outbox dead letters matching `filter`, largest first. Reads at
    /// most [`GROUP_SCAN`] dead letters (the oldest).
    ///
    /// # Errors
    /// [`OperatorError`]: the store's failure.
    fn dead_letter_groups(
        &self,
        filter: &DeadLetterFilter,
    ) -> impl Future<Output = Result<DeadLetterGroups, OperatorError>> + Send;

    /// One outbox dead letter whole: its row, payload and headers. Needs a role that may read
    /// payloads.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `NotFound` when `event_id` is not a dead letter,
    /// `PermissionDenied` under a role that may not read payloads, or the store's failure.
    fn dead_letter(
        &self,
        event_id: EventId,
    ) -> impl Future<Output = Result<DeadLetterDetail, OperatorError>> + Send;

    /// Requeues the outbox dead letters `which` selects under their own event ids (the relay
    /// publishes them again, then the events of their aggregates that waited behind them),
    /// with the audit record, and wakes the relays. Returns how many.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `PermissionDenied` when the role may not act; otherwise the
    /// store's failure. Nothing was requeued or recorded then.
    fn requeue_dead_letters(
        &self,
        which: &DeadLetterSelection,
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<u64, OperatorError>> + Send {
        async move {
            let action = Action::new(
                "requeue dead letters",
                actor,
                which.audit_selection(),
                reason,
            );
            let result = self.apply_requeue_dead_letters(&action, which).await;
            action.logged(result, |n| *n)
        }
    }

    /// Discards the outbox dead letters `which` selects: they will never be published. Each
    /// is kept whole as a discarded event with the id of the audit record that names the actor
    /// and `reason`, and removed from the outbox; the events of their aggregates that waited
    /// behind them then move on.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` without a reason, `PermissionDenied` when
    /// the role may not act; otherwise the store's failure. Nothing was discarded or recorded
    /// then.
    fn discard_dead_letters(
        &self,
        which: &DeadLetterSelection,
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<Discarded, OperatorError>> + Send {
        async move {
            let action = Action::new(
                "discard dead letters",
                actor,
                which.audit_selection(),
                reason,
            );
            action.check(require_reason(action.operation(), reason))?;
            let result = self.apply_discard_dead_letters(&action, which).await;
            action.logged(result, |d| d.discarded)
        }
    }

    /// Consumer dead letters not resolved that `which` selects, oldest first, at most `limit`
    /// (1 to [`MAX_LIST`](super::MAX_LIST)).
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// store's failure.
    fn consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<ConsumerDeadLetterView>, OperatorError>> + Send;

    /// The (consumer, reason) groups of the consumer dead letters not resolved that `which`
    /// selects, largest first; reads at most [`GROUP_SCAN`] of them.
    ///
    /// # Errors
    /// [`OperatorError`]: the store's failure.
    fn consumer_dead_letter_groups(
        &self,
        which: &ConsumerSelection,
    ) -> impl Future<Output = Result<ConsumerDeadLetterGroups, OperatorError>> + Send;

    /// One consumer dead letter whole (any state), with the payload and headers as received.
    /// Needs a role that may read payloads.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `NotFound`, `PermissionDenied`, or the store's failure.
    fn consumer_dead_letter(
        &self,
        id: i64,
    ) -> impl Future<Output = Result<ConsumerDeadLetterDetail, OperatorError>> + Send;

    /// Marks the consumer dead letters `which` selects (in state `dead`) for their consumer to
    /// apply again through its inbox, with the audit record. Returns how many.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `PermissionDenied` when the role may only read; otherwise the
    /// store's failure (nothing was requeued).
    fn requeue_consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<u64, OperatorError>> + Send {
        async move {
            let action = Action::new(
                "requeue consumer dead letters",
                actor,
                which.audit_selection(),
                reason,
            );
            let result = self
                .apply_requeue_consumer_dead_letters(&action, which)
                .await;
            action.logged(result, |n| *n)
        }
    }

    /// Gives up the consumer dead letters `which` selects (in state `dead`): they become
    /// `resolved` and are never applied; the audit record keeps the actor and `reason`.
    /// Returns how many.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` without a reason, `PermissionDenied` when
    /// the role may only read; otherwise the store's failure (nothing changed).
    fn discard_consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<u64, OperatorError>> + Send {
        async move {
            let action = Action::new(
                "discard consumer dead letters",
                actor,
                which.audit_selection(),
                reason,
            );
            action.check(require_reason(action.operation(), reason))?;
            let result = self
                .apply_discard_consumer_dead_letters(&action, which)
                .await;
            action.logged(result, |n| *n)
        }
    }
    /// The store's part of [`requeue_dead_letters`](Self::requeue_dead_letters): requeues the
    /// outbox dead letters `which` selects, with `action`'s audit record in the same
    /// transaction, and wakes the relays when any was requeued. Logs nothing (the provided
    /// method does). Returns how many.
    ///
    /// # Errors
    /// As [`requeue_dead_letters`](Self::requeue_dead_letters).
    fn apply_requeue_dead_letters(
        &self,
        action: &Action<'_>,
        which: &DeadLetterSelection,
    ) -> impl Future<Output = Result<u64, OperatorError>> + Send;

    /// The store's part of [`discard_dead_letters`](Self::discard_dead_letters), called once
    /// the reason was checked: keeps each selected dead letter as a discarded event under
    /// `action`'s audit record and removes it from the outbox, in one transaction, and wakes
    /// the relays when any was discarded. Logs nothing.
    ///
    /// # Errors
    /// As [`discard_dead_letters`](Self::discard_dead_letters).
    fn apply_discard_dead_letters(
        &self,
        action: &Action<'_>,
        which: &DeadLetterSelection,
    ) -> impl Future<Output = Result<Discarded, OperatorError>> + Send;

    /// The store's part of
    /// [`requeue_consumer_dead_letters`](Self::requeue_consumer_dead_letters): marks the
    /// selected consumer dead letters (state `dead`) requeued, with `action`'s audit record in
    /// the same transaction. Logs nothing. Returns how many.
    ///
    /// # Errors
    /// As [`requeue_consumer_dead_letters`](Self::requeue_consumer_dead_letters).
    fn apply_requeue_consumer_dead_letters(
        &self,
        action: &Action<'_>,
        which: &ConsumerSelection,
    ) -> impl Future<Output = Result<u64, OperatorError>> + Send;

    /// The store's part of
    /// [`discard_consumer_dead_letters`](Self::discard_consumer_dead_letters), called once the
    /// reason was checked: marks the selected consumer dead letters (state `dead`) resolved,
    /// with `action`'s audit record in the same transaction. Logs nothing. Returns how many.
    ///
    /// # Errors
    /// As [`discard_consumer_dead_letters`](Self::discard_consumer_dead_letters).
    fn apply_discard_consumer_dead_letters(
        &self,
        action: &Action<'_>,
        which: &ConsumerSelection,
    ) -> impl Future<Output = Result<u64, OperatorError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::{ConsumerDeadLetterGroup, ConsumerDeadLetterGroups, GROUP_SCAN, reason_key};

    #[test]
    fn a_group_read_is_largest_first_in_the_given_order_and_complete_below_the_scan() {
        let at = chrono::Utc::now();
        let group = |reason: &str, count| ConsumerDeadLetterGroup {
            consumer_name: "ledger".into(),
            reason: reason.into(),
            count,
            first_at: at,
            last_at: at,
            example_error: String::new(),
        };
        let read =
            ConsumerDeadLetterGroups::from_scan(vec![group("a", 1), group("b", 2), group("c", 1)]);
        let reasons: Vec<&str> = read.groups.iter().map(|g| g.reason.as_str()).collect();
        assert_eq!((reasons, read.complete), (vec!["b", "a", "c"], true));
        let full =
            ConsumerDeadLetterGroups::from_scan(vec![group("a", GROUP_SCAN - 1), group("b", 1)]);
        assert!(!full.complete);
    }

    #[test]
    fn reason_keys_replace_uuids_and_numbers_and_stop_at_200_characters() {
        assert_eq!(
            reason_key(Some(
                "publish timed out after 5000 ms (event 1f0e8400-e29b-41d4-a716-446655440000)"
            )),
            "publish timed out after # ms (event #)"
        );
        assert_eq!(reason_key(None), "");
        assert_eq!(
            reason_key(Some("abc1f0e8400-e29b-41d4-a716-446655440000x")),
            "abc#x"
        );
        assert_eq!(reason_key(Some("v2 of 10")), "v# of #");
        assert_eq!(reason_key(Some(&"é".repeat(300))).chars().count(), 200);
    }
}
