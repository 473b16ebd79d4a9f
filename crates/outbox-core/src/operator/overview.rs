//! The numbers of `outbox status` and of the console's overview.

use serde::Serialize;

use super::{Counting, OperatorError};
use crate::OutboxStats;
use crate::effect::EffectsStats;

/// The numbers of `outbox status` and of the console's overview.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Overview {
    /// The schema read.
    pub schema: String,
    /// `null` when every count is exact; else the bound each outbox count stopped at (a count
    /// equal to it means at least that many; [`Counting::UpTo`]).
    pub counted_up_to: Option<i64>,
    /// Outbox rows not yet published and not dead (in flight and retrying included).
    pub pending: i64,
    /// Age of the oldest pending row by the database clock, seconds (0 when none).
    pub oldest_pending_age_seconds: f64,
    /// Pending rows under a live lease.
    pub in_flight: i64,
    /// Pending rows that failed at least once.
    pub retrying: i64,
    /// Outbox dead letters (each blocks its aggregate until requeued).
    pub dead_letters: i64,
    /// Rows kept as published (mark mode; 0 in delete mode).
    pub published_retained: i64,
    /// Open inbox conflicts (same event id, different payload; not resolved by an operator).
    pub inbox_conflicts: i64,
    /// Consumer dead letters not resolved.
    pub consumer_dead_letters: i64,
    /// Remote effects by state.
    pub work_items: WorkItems,
}

/// Remote effects (work items) by state, in an [`Overview`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkItems {
    /// Not started, or due for a retry.
    pub pending: i64,
    /// Claimed by an executor right now.
    pub in_progress: i64,
    /// Sent, outcome unknown: waiting for reconciliation.
    pub unknown: i64,
    /// Age of the oldest unknown outcome, seconds (0 when none).
    pub oldest_unknown_age_seconds: f64,
    /// Failed for good.
    pub failed: i64,
}

impl Overview {
    /// The overview of the store whose schema is `schema` from its counts: the outbox's
    /// (`outbox`, counted up to `counted_up_to` when given, [`Counting::bound`]), the open inbox
    /// conflicts, the consumer dead letters not resolved, and the work items by state
    /// (`work_items`). Ages are in seconds, 0 when there is nothing of the kind.
    pub fn from_counts(
        schema: impl Into<String>,
        counted_up_to: Option<i64>,
        outbox: &OutboxStats,
        inbox_conflicts: i64,
        consumer_dead_letters: i64,
        work_items: &EffectsStats,
    ) -> Self {
        Self {
            schema: schema.into(),
            counted_up_to,
            pending: outbox.pending,
            oldest_pending_age_seconds: seconds(outbox.oldest_pending_age),
            in_flight: outbox.in_flight,
            retrying: outbox.retrying,
            dead_letters: outbox.dead,
            published_retained: outbox.published_retained,
            inbox_conflicts,
            consumer_dead_letters,
            work_items: WorkItems::from(work_items),
        }
    }
}

impl From<&EffectsStats> for WorkItems {
    /// The open work items by state and the failed ones (the settled `succeeded` are left out).
    fn from(s: &EffectsStats) -> Self {
        Self {
            pending: s.pending,
            in_progress: s.in_progress,
            unknown: s.unknown,
            oldest_unknown_age_seconds: seconds(s.oldest_unknown_age),
            failed: s.failed,
        }
    }
}

/// An age in seconds, 0 without one.
fn seconds(age: Option<std::time::Duration>) -> f64 {
    age.map_or(0.0, |d| d.as_secs_f64())
}

/// The overview: is the store there, and what is waiting, stuck or failed.
pub trait OverviewOps {
    /// Checks that the store answers and its schema is at this release's version (a readiness
    /// probe).
    ///
    /// # Errors
    /// [`OperatorError`] of kind `Unavailable`, `Schema` or `PermissionDenied`.
    fn ready(&self) -> impl Future<Output = Result<(), OperatorError>> + Send;

    /// The overview numbers, the outbox's counted as `counting` says: [`Counting::Exact`]
    /// reads every pending row; [`Counting::UpTo`] stops each count at its bound, so that the
    /// overview costs the same at any backlog.
    ///
    /// # Errors
    /// [`OperatorError`]: the store is unreachable, the role cannot read, the schema is
    /// missing, or (`InvalidRequest`) a bound below 1.
    fn overview_counting(
        &self,
        counting: Counting,
    ) -> impl Future<Output = Result<Overview, OperatorError>> + Send;

    /// The overview numbers, every count exact.
    ///
    /// # Errors
    /// As [`overview_counting`](Self::overview_counting).
    fn overview(&self) -> impl Future<Output = Result<Overview, OperatorError>> + Send {
        self.overview_counting(Counting::Exact)
    }
}
