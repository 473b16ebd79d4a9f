//! Replay: one aggregate's published events, or those written in a time range, republished
//! with their original ids, as far as the outbox still holds them.
//!
//! Only mark mode keeps published rows (`relay.on_publish = "mark"`, until `outbox cleanup
//! --published-keep-secs` deletes them); in delete mode the outbox holds nothing to replay and a
//! replay is refused, naming the broker's own retention as the place to replay from.
//!
//! A replay makes an aggregate's published rows from a version on pending again (attempts
//! reset), in one transaction with its audit record, and wakes the relays: a polling relay
//! republishes them under their original event ids, in version order, ahead of the
//! aggregate's later pending versions. Their original publish time is kept (the relay does not
//! overwrite it when it marks them again), so retention deletes them when it would have, and
//! the inbox's keep, which covers that retention, still recognises them: consumers with an
//! inbox see redeliveries, not second effects; a consumer that lost its state, or a new one,
//! gets them again.
//!
//! **Order.** The transaction first locks the aggregate's unpublished rows (a claim in progress
//! is waited for; a later one skips the aggregate until the replay commits), then refuses when
//! a relay holds a live lease on the aggregate (it may be publishing a later version right
//! now: retry once it settled). A CDC relay streams inserts only and would publish a newer
//! version straight from the log ahead of the replayed ones: a replay is refused while one
//! reports a live heartbeat (run the polling relay for the replay).
//!
//! **The replay horizon.** A replay never replays part of what was asked: it is refused when
//! the aggregate's lowest version still held (in any state) is above the first version asked,
//! or when the versions from there to the newest held are not all held (retention or a
//! discard left a gap), or when nothing of the aggregate is held. The refusal names what is
//! held. [`ReplayPlan`] (a dry run) says how many rows a replay would take and changes
//! nothing; a replay given `expect_events` (the dry run's count) is refused when the count
//! changed meanwhile, and any replay is rolled back when fewer rows changed than planned.
//!
//! **A time range** ([`RangeSelection`], `Admin::replay_range`): the events written in
//! `[created_after, created_before)` that were published, of one aggregate type or destination
//! when given, across aggregates. Two rules keep it whole and ordered:
//!
//! * *Per-aggregate extension.* For each aggregate with a published event in the range, the
//!   replay takes that aggregate's published events from its first one in the range through
//!   its newest, later ones (after the range, whatever their route) included. A consumer that
//!   rebuilds its state from the replay then ends at each aggregate's newest version, in
//!   version order, instead of at a version the aggregate has since left behind. The plan
//!   counts the events in the range and the ones the extension adds.
//! * *The replay horizon.* Retention (`outbox cleanup --published-keep-secs`) raises a mark to
//!   the newest write time (`created_at`) among the rows it deleted (`retention_marks`, schema
//!   11), so any event written after the mark is still held: a range that starts after the
//!   mark is complete; one that starts at or before it is refused, naming the mark. The mark
//!   starts at the time schema 11 was migrated (earlier deletions left no trace). What it does
//!   not see: a relay in delete mode, or a producer deleting its own rows
//!   (`delete_in_transaction`), removes rows without raising it. Run every relay of a schema in
//!   mark mode, as the console's configuration says, and after switching a schema from delete
//!   to mark mode raise the mark by hand (`UPDATE <schema>.retention_marks SET through = now()`).
//!   The per-aggregate gap check above applies to each aggregate too.
//!
//! The guards of a single aggregate hold for the whole set (locks, live leases, a CDC relay,
//! the dry-run count). A range is at most [`MAX_RANGE_AGGREGATES`] aggregates and
//! [`MAX_RANGE_EVENTS`] events in one transaction; a bigger one is refused, to be split.
//!
//! Cost: the aggregate's rows through the (aggregate, version) unique index; a time range reads
//! the published rows of the range by `created_at` (mark mode's `published_at` index does not
//! serve it: a sequential read of the table on a large outbox, acceptable for an occasional
//! operator action; narrow it by aggregate type or destination).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What to replay: one aggregate's published events from `from_version` (1 when absent) on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplaySelection {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// The first version to replay (1 when absent).
    #[serde(default)]
    pub from_version: Option<i64>,
}

/// What a replay takes, or took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayPlan {
    /// Rows it republishes (a dry run: would republish).
    pub events: i64,
    /// The aggregate's lowest version still held, in any state.
    pub lowest_version_held: Option<i64>,
    /// Its newest version held.
    pub newest_version_held: Option<i64>,
    /// When the first row replayed was first published.
    pub first_published_at: Option<DateTime<Utc>>,
    /// `true` for a dry run (nothing changed).
    pub dry_run: bool,
}

/// The aggregate's unpublished rows, locked: a claim in progress is waited for, a later one
/// skips the aggregate until the replay commits.
pub(super) const LOCK: &str = "SELECT 1 FROM {s}.events WHERE aggregate_type = $1 \
    AND aggregate_id = $2 AND state <> 'published' FOR UPDATE";

/// A live relay lease on the aggregate.
pub(super) const LEASED: &str = "SELECT EXISTS (SELECT 1 FROM {s}.leases \
    WHERE aggregate_type = $1 AND aggregate_id = $2 AND lease_until > now())";

/// A CDC relay with a live heartbeat (within six of its intervals).
pub(super) const CDC_RUNNING: &str = "SELECT EXISTS (SELECT 1 FROM {s}.instances \
    WHERE kind = 'relay' AND name = 'cdc' AND stopped_at IS NULL \
      AND heartbeat_at > now() - make_interval(secs => interval_ms * 6 / 1000.0))";

/// The published rows from `$3` on, the lowest and newest versions held (any state), how many
/// versions from `$3` on are held, and the first replayed row's publish time.
pub(super) const PLAN: &str = "SELECT \
      count(*) FILTER (WHERE state = 'published' AND aggregate_version >= $3), \
      min(aggregate_version), max(aggregate_version), \
      count(*) FILTER (WHERE aggregate_version >= $3), \
      min(published_at) FILTER (WHERE state = 'published' AND aggregate_version >= $3) \
    FROM {s}.events WHERE aggregate_type = $1 AND aggregate_id = $2";

/// The replay; `published_at` is kept (see the module docs).
pub(super) const REPLAY: &str = "UPDATE {s}.events SET state = 'pending', attempts = 0, \
    available_at = now() \
    WHERE aggregate_type = $1 AND aggregate_id = $2 AND state = 'published' \
      AND aggregate_version >= $3";

/// Most aggregates one time-range replay takes.
pub const MAX_RANGE_AGGREGATES: i64 = 10_000;
/// Most events one time-range replay takes.
pub const MAX_RANGE_EVENTS: i64 = 100_000;

/// What to replay: the published events written in `[created_after, created_before)`, of
/// `aggregate_type` and/or `destination` when given, each aggregate extended to its newest
/// version (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RangeSelection {
    /// Written at or after this time.
    pub created_after: DateTime<Utc>,
    /// Written before this time.
    pub created_before: DateTime<Utc>,
    /// Only this aggregate type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_type: Option<String>,
    /// Only events with this destination override.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
}

/// What a time-range replay takes, or took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RangePlan {
    /// Rows it republishes (a dry run: would republish), extension included.
    pub events: i64,
    /// Of those, the ones written in the range.
    pub in_range: i64,
    /// Aggregates it touches.
    pub aggregates: i64,
    /// The replay horizon: ranges must start after it (`None` only when its `retention_marks` row was removed by hand: schema 11 seeds it at the migration).
    pub horizon: Option<DateTime<Utc>>,
    /// `true` for a dry run (nothing changed).
    pub dry_run: bool,
}

/// The replay horizon of a time range.
pub(super) const HORIZON: &str = "SELECT through FROM {s}.retention_marks WHERE what = 'published'";

/// The aggregates with a published event in the range `$1`..`$2` (of type `$3`, destination
/// `$4` when not null), each with its first version there and how many of its events are
/// there; at most `$5` of them (one more than a replay takes tells it is too big).
pub(super) const RANGE_AGGREGATES: &str = "SELECT aggregate_type, aggregate_id, \
      min(aggregate_version), count(*) \
    FROM {s}.events WHERE state = 'published' AND created_at >= $1 AND created_at < $2 \
      AND ($3::text IS NULL OR aggregate_type = $3) \
      AND ($4::text IS NULL OR destination = $4) \
    GROUP BY aggregate_type, aggregate_id LIMIT $5";

/// The aggregates `$1`/`$2` (from version `$3`), as a relation `a(t, i, v)`.
const AGGREGATES: &str = "unnest($1::text[], $2::text[], $3::bigint[]) AS a(t, i, v)";

/// Locks the unpublished rows of the aggregates `$1`/`$2` (as [`LOCK`] does for one).
pub(super) fn range_lock() -> String {
    format!(
        "SELECT 1 FROM {{s}}.events e JOIN {AGGREGATES} ON e.aggregate_type = a.t \
         AND e.aggregate_id = a.i WHERE e.state <> 'published' FOR UPDATE OF e"
    )
}

/// The first of the aggregates `$1`/`$2` a relay holds a live lease on.
pub(super) fn range_leased() -> String {
    format!(
        "SELECT l.aggregate_type, l.aggregate_id FROM {{s}}.leases l JOIN {AGGREGATES} \
         ON l.aggregate_type = a.t AND l.aggregate_id = a.i WHERE l.lease_until > now() LIMIT 1"
    )
}

/// Per aggregate: the published rows from its version `$3` on, and whether the versions from
/// there to its newest are all held; the first aggregate with a gap, if any.
pub(super) fn range_plan() -> String {
    format!(
        "WITH p AS (SELECT a.t, a.i, \
           count(*) FILTER (WHERE e.state = 'published') AS published, \
           count(*) AS held, max(e.aggregate_version) - a.v + 1 AS span \
         FROM {AGGREGATES} JOIN {{s}}.events e ON e.aggregate_type = a.t \
           AND e.aggregate_id = a.i AND e.aggregate_version >= a.v GROUP BY a.t, a.i, a.v) \
         SELECT coalesce(sum(published), 0)::bigint, \
           (SELECT t || '/' || i FROM p WHERE held <> span LIMIT 1) FROM p"
    )
}

/// The time-range replay; `published_at` is kept.
pub(super) fn range_replay() -> String {
    format!(
        "UPDATE {{s}}.events e SET state = 'pending', attempts = 0, available_at = now() \
         FROM {AGGREGATES} WHERE e.aggregate_type = a.t AND e.aggregate_id = a.i \
           AND e.state = 'published' AND e.aggregate_version >= a.v"
    )
}
