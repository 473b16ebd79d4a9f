//! Replay: one aggregate's published events republished with their original ids, as far as
//! the outbox still holds them.
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
//! Not built: replay of a time range across aggregates (it needs a retention high-water mark
//! to know its horizon, and per-aggregate extension to keep order).
//!
//! Cost: the aggregate's rows through the (aggregate, version) unique index.

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
