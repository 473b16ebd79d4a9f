//! Replay: published events republished with their original ids, as far as the outbox still
//! holds them.
//!
//! Only mark mode keeps published rows (`relay.on_publish = "mark"`, until `outbox cleanup
//! --published-keep-secs` deletes them); in delete mode the outbox holds nothing to replay and a
//! replay is refused, naming the broker's own retention as the place to replay from.
//!
//! A replay makes the selected published rows pending again (attempts reset, `published_at`
//! cleared), as a dead-letter requeue does, in one statement with its audit record, and wakes
//! the relays: they republish them under their original event ids, each aggregate's versions
//! in order, ahead of any later pending version of the same aggregate. Consumers with an inbox
//! see redeliveries (no second effect); a consumer that lost its state, or a new one reading
//! the broker, gets them again.
//!
//! **The replay horizon**: a replay never silently replays part of what was asked. An
//! aggregate's replay from version `v` is refused when its lowest published version still held
//! is above `v` (retention deleted the earlier ones); a time range is refused when it starts
//! before the oldest published row still held. The refusal names the horizon; narrow the
//! request to it. [`ReplayPlan`] (a dry run) says how many rows a replay would take and where
//! the horizon is, and changes nothing.
//!
//! Cost: an aggregate's rows through the (aggregate, version) unique index; a time range
//! through mark mode's index of published rows by `published_at`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What to replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ReplaySelection {
    /// One aggregate's published events from `from_version` (1 when absent) on.
    Aggregate {
        /// Aggregate type.
        aggregate_type: String,
        /// Aggregate id.
        aggregate_id: String,
        /// The first version to replay.
        #[serde(default)]
        from_version: Option<i64>,
    },
    /// The events published in `[from, to)`, of one aggregate type when given.
    Published {
        /// From this time on.
        from: DateTime<Utc>,
        /// Before this time.
        to: DateTime<Utc>,
        /// Only this aggregate type.
        #[serde(default)]
        aggregate_type: Option<String>,
    },
}

/// What a replay takes, or took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayPlan {
    /// Rows it republishes (a dry run: would republish).
    pub events: i64,
    /// The oldest published row still held, for a time range; the aggregate's lowest held
    /// published version's publish time, for an aggregate. `None` when none is held.
    pub horizon: Option<DateTime<Utc>>,
    /// For an aggregate: its lowest published version still held.
    pub lowest_version_held: Option<i64>,
    /// `true` for a dry run (nothing changed).
    pub dry_run: bool,
}

/// The aggregate's published rows from `$3` on: how many, its lowest held version and that
/// row's publish time.
pub(super) const AGGREGATE_PLAN: &str = "SELECT \
      count(*) FILTER (WHERE aggregate_version >= $3), min(aggregate_version), \
      min(published_at) FILTER (WHERE aggregate_version = (SELECT min(aggregate_version) \
        FROM {s}.events WHERE aggregate_type = $1 AND aggregate_id = $2 AND state = 'published')) \
    FROM {s}.events WHERE aggregate_type = $1 AND aggregate_id = $2 AND state = 'published'";

pub(super) const AGGREGATE_REPLAY: &str = "UPDATE {s}.events SET state = 'pending', \
    attempts = 0, available_at = now(), published_at = NULL \
    WHERE aggregate_type = $1 AND aggregate_id = $2 AND state = 'published' \
      AND aggregate_version >= $3";

/// The published rows of `[$1, $2)` (of type `$3`, when not null), and the oldest held one's
/// publish time.
pub(super) const RANGE_PLAN: &str = "SELECT \
      (SELECT count(*) FROM {s}.events WHERE state = 'published' AND published_at >= $1 \
         AND published_at < $2 AND ($3::text IS NULL OR aggregate_type = $3)), \
      (SELECT min(published_at) FROM {s}.events WHERE state = 'published')";

pub(super) const RANGE_REPLAY: &str = "UPDATE {s}.events SET state = 'pending', \
    attempts = 0, available_at = now(), published_at = NULL \
    WHERE state = 'published' AND published_at >= $1 AND published_at < $2 \
      AND ($3::text IS NULL OR aggregate_type = $3)";
