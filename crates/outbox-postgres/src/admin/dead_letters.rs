//! Outbox and consumer dead letters as the operator works with them: filtered, grouped by
//! reason, read whole, requeued or discarded by ids, by filter or all, each action audited.
//!
//! **Reasons** are grouped as ServicePulse groups failures: by the error text with its
//! numbers and UUIDs replaced by `#` and cut at 200 characters, so that
//! "publish timed out after 5000 ms (event 1f0e…)" of a thousand rows is one group. The key is
//! computed by the database, so a group's key selects exactly its rows in a filter.
//!
//! **Destination** in a filter is the row's own `destination` (the producer's override); rows
//! without one go where the relay's topic template sends their aggregate type, so filter those
//! by `aggregate_type`. **Time** is the event's `created_at` (when the producer wrote it).
//!
//! Every read walks the dead rows through their partial index (migration 7); groups read at
//! most [`GROUP_SCAN`] of them and say so (`complete`) when there may be more. A filter by
//! reason computes the key of each dead row it reads (no index holds it): dead letters are few
//! next to the outbox, and the read stops at the page's limit.

use chrono::{DateTime, Utc};
use outbox_core::EventId;
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{Postgres, Row};

/// The reason key of a dead letter's error text, `{err}` being the column (see the module
/// docs).
const REASON_KEY: &str = "left(regexp_replace(coalesce({err}, ''), \
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9]+', '#', 'g'), 200)";

/// The most dead letters one group read looks at: computing the reason key costs about 7 µs
/// a row here (710 ms for 100,000 dead letters on a 10-million-row outbox), and the page reads
/// the groups every 5 s.
pub const GROUP_SCAN: i64 = 10_000;

/// The conditions of the outbox's dead rows a [`DeadLetterSelection`] selects (binds `$1` to
/// `$7`; a condition whose value is not given is left out of the statement, so that each
/// shape of filter gets its own plan and an id lookup goes through the event-id index).
const MATCH: [&str; 7] = [
    "e.event_id = ANY($1)",
    "e.aggregate_type = $2",
    "e.event_type = $3",
    "e.destination = $4",
    "{reason} = $5",
    "e.created_at >= $6",
    "e.created_at < $7",
];

const LIST: &str = "SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, \
    e.event_type, e.attempts, e.last_error, e.created_at, \
    (SELECT count(*) FROM {s}.events b WHERE b.aggregate_type = e.aggregate_type \
       AND b.aggregate_id = e.aggregate_id AND b.aggregate_version > e.aggregate_version \
       AND b.state = 'pending'), \
    e.destination, e.content_type, e.schema_version, {reason} \
    FROM {s}.events e WHERE {match} ORDER BY e.id LIMIT $8";

const GROUPS: &str = "SELECT reason, count(*), min(created_at), max(created_at), \
    (array_agg(DISTINCT aggregate_type))[1:10], (array_agg(DISTINCT event_type))[1:10], \
    (array_agg(last_error ORDER BY id))[1] \
    FROM (SELECT e.id, e.created_at, e.aggregate_type, e.event_type, e.last_error, \
      {reason} AS reason FROM {s}.events e WHERE {match} ORDER BY e.id LIMIT $8) d \
    GROUP BY reason ORDER BY count(*) DESC, reason";

const DETAIL: &str = "SELECT e.payload, e.headers, e.partition_key, e.payload_sha256 \
    FROM {s}.events e WHERE e.event_id = $1 AND e.state = 'dead'";

const REQUEUE: &str = "UPDATE {s}.events e SET state = 'pending', attempts = 0, \
    available_at = now() WHERE {match}";

/// The discard, its audit record and the copy in one statement: the copy names the record.
const DISCARD: &str = "WITH d AS (DELETE FROM {s}.events e WHERE {match} \
      RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type, \
        e.schema_version, e.content_type, e.payload, e.headers, e.destination, e.partition_key, \
        e.created_at, e.attempts, e.last_error), \
    a AS (INSERT INTO {s}.audit (actor, via, credential, action, selection, reason, affected) \
      SELECT $8, $9, $10, 'discard dead letters', $11, $12, count(*) FROM d RETURNING id), \
    c AS (INSERT INTO {s}.discarded_events (event_id, aggregate_type, aggregate_id, \
        aggregate_version, event_type, schema_version, content_type, payload, headers, \
        destination, partition_key, created_at, attempts, last_error, audit_id) \
      SELECT d.*, a.id FROM d CROSS JOIN a RETURNING 1) \
    SELECT (SELECT count(*) FROM c), (SELECT id FROM a)";

/// The conditions of the consumer dead letters a [`ConsumerSelection`] selects (`$1` to `$3`,
/// left out when not given), among those in `{states}`.
const CONSUMER_MATCH: [&str; 3] = ["c.consumer_name = $1", "c.id = ANY($2)", "{reason} = $3"];

const CONSUMER_LIST: &str = "SELECT c.id, c.consumer_name, c.event_id, c.aggregate_type, \
    c.aggregate_id, c.aggregate_version, c.event_type, c.error, c.attempts, c.state, \
    c.created_at, {reason} FROM {s}.consumer_dead_letters c WHERE {match} ORDER BY c.id LIMIT $4";

const CONSUMER_GROUPS: &str = "SELECT consumer_name, reason, count(*), min(created_at), \
    max(created_at), (array_agg(error ORDER BY id))[1] \
    FROM (SELECT c.id, c.consumer_name, c.created_at, c.error, {reason} AS reason \
      FROM {s}.consumer_dead_letters c WHERE {match} ORDER BY c.id LIMIT $4) d \
    GROUP BY consumer_name, reason ORDER BY count(*) DESC, consumer_name, reason";

const CONSUMER_DETAIL: &str = "SELECT c.payload, c.headers, c.content_type \
    FROM {s}.consumer_dead_letters c WHERE c.id = $1";

const CONSUMER_REQUEUE: &str = "UPDATE {s}.consumer_dead_letters c SET state = 'requeued', \
    updated_at = now() WHERE {match}";

const CONSUMER_DISCARD: &str = "UPDATE {s}.consumer_dead_letters c SET state = 'resolved', \
    updated_at = now() WHERE {match}";

/// `template` with its `{match}` (`matcher`, with its own `{reason}`) and `{reason}` filled in.
fn sql(template: &str, matcher: &str, err_column: &str) -> String {
    let reason = REASON_KEY.replace("{err}", err_column);
    template
        .replace("{match}", matcher)
        .replace("{reason}", &reason)
}

/// `template` for the dead letters `which` selects.
pub(super) fn outbox_sql(template: &str, which: &DeadLetterSelection) -> String {
    let none = DeadLetterFilter::default();
    let (ids, f) = match which {
        DeadLetterSelection::Ids(_) => (true, &none),
        DeadLetterSelection::Matching(f) => (false, f),
        DeadLetterSelection::All => (false, &none),
    };
    let given = [
        ids,
        f.aggregate_type.is_some(),
        f.event_type.is_some(),
        f.destination.is_some(),
        f.reason_group.is_some(),
        f.created_after.is_some(),
        f.created_before.is_some(),
    ];
    let mut matcher = vec!["e.state = 'dead'"];
    matcher.extend(MATCH.iter().zip(given).filter(|(_, g)| *g).map(|(c, _)| *c));
    sql(template, &matcher.join(" AND "), "e.last_error")
}

/// `template` for the consumer dead letters `which` selects, among those in `states` (an SQL
/// list).
pub(super) fn consumer_sql(template: &str, which: &ConsumerSelection, states: &str) -> String {
    let given = [
        which.consumer.is_some(),
        which.ids.is_some(),
        which.reason_group.is_some(),
    ];
    let in_states = format!("c.state IN ({states})");
    let mut matcher = vec![in_states.as_str()];
    matcher.extend(
        CONSUMER_MATCH
            .iter()
            .zip(given)
            .filter(|(_, g)| *g)
            .map(|(c, _)| *c),
    );
    sql(template, &matcher.join(" AND "), "c.error")
}

pub(super) const OUTBOX_LIST: &str = LIST;
pub(super) const OUTBOX_GROUPS: &str = GROUPS;
pub(super) const OUTBOX_DETAIL: &str = DETAIL;
pub(super) const OUTBOX_REQUEUE: &str = REQUEUE;
pub(super) const OUTBOX_DISCARD: &str = DISCARD;
pub(super) const CONSUMER_LIST_SQL: &str = CONSUMER_LIST;
pub(super) const CONSUMER_GROUPS_SQL: &str = CONSUMER_GROUPS;
pub(super) const CONSUMER_DETAIL_SQL: &str = CONSUMER_DETAIL;
pub(super) const CONSUMER_REQUEUE_SQL: &str = CONSUMER_REQUEUE;
pub(super) const CONSUMER_DISCARD_SQL: &str = CONSUMER_DISCARD;

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
    /// Every dead letter matching the filter, in one statement on the server.
    Matching(DeadLetterFilter),
    /// Every dead letter.
    All,
}

impl DeadLetterSelection {
    /// The selection as the audit record keeps it.
    pub(super) fn to_json(&self) -> serde_json::Value {
        match self {
            Self::Ids(ids) => serde_json::json!({ "event_ids": ids }),
            Self::Matching(f) => serde_json::json!({ "filter": f }),
            Self::All => serde_json::json!({ "all": true }),
        }
    }

    /// Binds `$1` to `$7` of [`MATCH`].
    pub(super) fn bind<'q>(
        &self,
        q: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        let none = DeadLetterFilter::default();
        let (ids, f) = match self {
            Self::Ids(ids) => (Some(ids.clone()), &none),
            Self::Matching(f) => (None, f),
            Self::All => (None, &none),
        };
        q.bind(ids)
            .bind(f.aggregate_type.clone())
            .bind(f.event_type.clone())
            .bind(f.destination.clone())
            .bind(f.reason_group.clone())
            .bind(f.created_after)
            .bind(f.created_before)
    }
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

impl ConsumerSelection {
    /// Binds `$1` to `$3` of the consumer matcher.
    pub(super) fn bind<'q>(
        &self,
        q: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        q.bind(self.consumer.clone())
            .bind(self.ids.clone())
            .bind(self.reason_group.clone())
    }
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

pub(super) fn view(r: &PgRow) -> Result<DeadLetterView, sqlx::Error> {
    Ok(DeadLetterView {
        event_id: r.try_get(0)?,
        aggregate_type: r.try_get(1)?,
        aggregate_id: r.try_get(2)?,
        aggregate_version: r.try_get(3)?,
        event_type: r.try_get(4)?,
        attempts: r.try_get(5)?,
        last_error: r.try_get(6)?,
        created_at: r.try_get(7)?,
        blocked_behind: r.try_get(8)?,
        destination: r.try_get(9)?,
        content_type: r.try_get(10)?,
        schema_version: r.try_get(11)?,
        reason: r.try_get(12)?,
    })
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

pub(super) fn group(r: &PgRow) -> Result<DeadLetterGroup, sqlx::Error> {
    Ok(DeadLetterGroup {
        reason: r.try_get(0)?,
        count: r.try_get(1)?,
        first_created_at: r.try_get(2)?,
        last_created_at: r.try_get(3)?,
        aggregate_types: r.try_get(4)?,
        event_types: r.try_get(5)?,
        example_error: r.try_get(6)?,
    })
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

pub(super) fn consumer_group(r: &PgRow) -> Result<ConsumerDeadLetterGroup, sqlx::Error> {
    Ok(ConsumerDeadLetterGroup {
        consumer_name: r.try_get(0)?,
        reason: r.try_get(1)?,
        count: r.try_get(2)?,
        first_at: r.try_get(3)?,
        last_at: r.try_get(4)?,
        example_error: r.try_get(5)?,
    })
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
    pub dead_letter: outbox_core::consumer::ConsumerDeadLetter,
    /// Its reason group's key.
    pub reason: String,
}

pub(super) fn consumer_view(r: &PgRow) -> Result<ConsumerDeadLetterView, sqlx::Error> {
    Ok(ConsumerDeadLetterView {
        dead_letter: crate::consumer::dead_letter_from_row(r)?,
        reason: r.try_get(11)?,
    })
}

/// A payload as the console shows it: as text when it reads as text (UTF-8, no control
/// characters but whitespace), else as hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PayloadView {
    /// Its size in bytes.
    pub size: usize,
    /// SHA-256 of the bytes, hex.
    pub sha256: String,
    /// The bytes as text, when they are UTF-8.
    pub text: Option<String>,
    /// The bytes as hex, when they are not UTF-8.
    pub hex: Option<String>,
}

impl PayloadView {
    /// The view of `bytes`.
    pub fn of(bytes: Vec<u8>) -> Self {
        use sha2::Digest as _;
        let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
        let size = bytes.len();
        // Text only when it reads as text: UTF-8 without control characters other than
        // whitespace (a NUL or an escape is binary to a reader, and hex shows it).
        let printable = |t: &str| {
            !t.chars()
                .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        };
        match String::from_utf8(bytes) {
            Ok(text) if printable(&text) => Self {
                size,
                sha256,
                text: Some(text),
                hex: None,
            },
            Ok(text) => Self {
                size,
                sha256,
                text: None,
                hex: Some(hex::encode(text.into_bytes())),
            },
            Err(e) => Self {
                size,
                sha256,
                text: None,
                hex: Some(hex::encode(e.into_bytes())),
            },
        }
    }
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
    /// Dead letters discarded (copied into `discarded_events`, removed from the outbox).
    pub discarded: u64,
    /// The audit record naming them.
    pub audit_id: i64,
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_placeholder_is_filled_and_only_given_conditions_are_in_the_statement() {
        use super::{ConsumerSelection, DeadLetterFilter, DeadLetterSelection};
        let by_reason = DeadLetterSelection::Matching(DeadLetterFilter {
            reason_group: Some("x".into()),
            ..DeadLetterFilter::default()
        });
        for which in [
            DeadLetterSelection::All,
            DeadLetterSelection::Ids(vec![]),
            by_reason.clone(),
        ] {
            for t in [super::LIST, super::GROUPS, super::REQUEUE, super::DISCARD] {
                let s = super::outbox_sql(t, &which);
                assert!(!s.contains("{match}") && !s.contains("{reason}") && !s.contains("{err}"));
                assert!(s.contains("e.state = 'dead'"));
                assert_eq!(
                    s.contains("ANY($1)"),
                    matches!(which, DeadLetterSelection::Ids(_))
                );
                assert_eq!(s.contains("= $5"), which == by_reason);
            }
        }
        let one = ConsumerSelection {
            consumer: Some("ledger".into()),
            ..ConsumerSelection::default()
        };
        for t in [
            super::CONSUMER_LIST,
            super::CONSUMER_GROUPS,
            super::CONSUMER_REQUEUE,
            super::CONSUMER_DISCARD,
        ] {
            let s = super::consumer_sql(t, &one, "'dead'");
            assert!(!s.contains("{match}") && !s.contains("{reason}") && !s.contains("{err}"));
            assert!(s.contains("c.state IN ('dead')") && s.contains("c.consumer_name = $1"));
            assert!(!s.contains("ANY($2)") && !s.contains("= $3"));
        }
    }
}
