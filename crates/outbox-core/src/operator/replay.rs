//! Replays of published events under their original ids ([`ReplayOps`]).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Action, Actor, OperatorError, require_reason};

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

impl ReplaySelection {
    /// The checks of the selection that need no store: a first version of at least 1.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` in `operation`.
    pub fn check(&self, operation: &'static str) -> Result<(), OperatorError> {
        match self.from_version {
            Some(from) if from < 1 => Err(OperatorError::invalid(
                operation,
                format!("versions start at 1, not {from}"),
            )),
            _ => Ok(()),
        }
    }
}

/// A replay needs a reason ([`require_reason`], kept in the audit record); a dry run, which
/// records nothing, does not.
fn replay_reason(
    operation: &'static str,
    dry_run: bool,
    reason: &str,
) -> Result<(), OperatorError> {
    if dry_run {
        Ok(())
    } else {
        require_reason(operation, reason)
    }
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

/// Most aggregates one time-range replay takes.
pub const MAX_RANGE_AGGREGATES: i64 = 10_000;

/// Most events one time-range replay takes.
pub const MAX_RANGE_EVENTS: i64 = 100_000;

/// What to replay: the published events written in `[created_after, created_before)`, of
/// `aggregate_type` and/or `destination` when given, each aggregate extended to its newest
/// version (see [`ReplayOps`]).
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

impl RangeSelection {
    /// The checks of the selection that need no store: a range that is not empty.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` in `operation`.
    pub fn check(&self, operation: &'static str) -> Result<(), OperatorError> {
        if self.created_after < self.created_before {
            return Ok(());
        }
        Err(OperatorError::invalid(
            operation,
            format!(
                "an empty range: created_after {} is not before created_before {}",
                self.created_after.to_rfc3339(),
                self.created_before.to_rfc3339()
            ),
        ))
    }
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
    /// The replay horizon: ranges must start after it (`None` when the store keeps no
    /// horizon, see its docs).
    pub horizon: Option<DateTime<Utc>>,
    /// `true` for a dry run (nothing changed).
    pub dry_run: bool,
}

/// Replays: one aggregate's published events, or those written in a time range, republished
/// with their original ids, as far as the store still holds them.
///
/// What every store guarantees:
///
/// * Only a store that keeps published rows (mark mode) can replay; otherwise a replay is
///   refused (`Refused`), naming the broker's own retention as the place to replay from.
/// * A replay makes an aggregate's published rows from a version on pending again (attempts
///   reset), in one transaction with its audit record, and wakes the relays: they republish
///   them under their original event ids, in version order, ahead of the aggregate's later
///   pending versions. Their original publish time is kept, so retention deletes them when it
///   would have, and the consumers' inboxes still recognise them: consumers with an inbox see
///   redeliveries, not second effects.
/// * **Order**: a replay is refused while a relay holds a live lease on the aggregate, and
///   while a relay runs that streams the log (it would publish a newer version ahead of the
///   replayed ones).
/// * **The replay horizon**: a replay never replays part of what was asked. It is refused when
///   the aggregate's lowest version still held is above the first version asked, when the
///   versions from there to the newest held are not all held, or when nothing of the aggregate
///   is held (`NotFound`). A time range is refused when it starts at or before the horizon
///   (the newest write time among the published rows retention deleted).
/// * A dry run ([`ReplayPlan`], [`RangePlan`]) changes nothing; a replay given
///   `expect_events` (the dry run's count) is refused when the count changed meanwhile
///   ([`count_changed`](super::count_changed)).
/// * **A time range** ([`RangeSelection`]) takes, for each aggregate with a published event in
///   `[created_after, created_before)`, that aggregate's published events from its first one
///   in the range through its newest (per-aggregate extension), at most
///   [`MAX_RANGE_AGGREGATES`] aggregates and [`MAX_RANGE_EVENTS`] events.
pub trait ReplayOps: Sync {
    /// Replays the published events `which` selects with their original ids (see the
    /// trait docs): one aggregate from a version ([`ReplaySelection`], a [`ReplayPlan`]), or
    /// those written in a time range, each aggregate extended to its newest version
    /// ([`RangeSelection`], a [`RangePlan`]). With `dry_run`, only says what it would take;
    /// otherwise makes them pending again, with the audit record, and wakes the relays.
    /// `expect_events` (the dry run's count) refuses the replay when the count changed.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `Refused` when the store keeps no published rows, beyond the
    /// replay horizon, while a relay holds the aggregate or a log-streaming relay runs, when
    /// the count changed, or for a range that takes more than [`MAX_RANGE_AGGREGATES`]
    /// aggregates or [`MAX_RANGE_EVENTS`] events (nothing changed; the message says why);
    /// `NotFound` when nothing of the aggregate is held; `InvalidRequest` for a version below
    /// 1, an empty range, or no reason; `PermissionDenied` when the role may not act;
    /// otherwise the store's failure.
    fn replay<W: Replayable>(
        &self,
        which: &W,
        dry_run: bool,
        expect_events: Option<i64>,
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<W::Plan, OperatorError>> + Send {
        async move {
            let action = Action::new(W::OPERATION, actor, which.audit_selection(), reason);
            action.check(which.check_selection(action.operation()))?;
            action.check(replay_reason(action.operation(), dry_run, reason))?;
            let request = ReplayRequest {
                action: &action,
                which,
                dry_run,
                expect_events,
            };
            let result = W::apply(self, &request).await;
            // A dry run changes nothing and is not an action: its plan is not logged (its
            // refusals are, as every refusal is).
            match result {
                Ok(plan) if dry_run => Ok(plan),
                result => action.logged(result, |p| u64::try_from(W::events(p)).unwrap_or(0)),
            }
        }
    }

    /// The store's part of a replay of one aggregate, called once the request was checked:
    /// the store's refusals (published rows not kept, a lease held, a log-streaming relay
    /// running, the replay horizon, a count changed), then, unless it is a dry run, the rows
    /// made pending with the action's audit record in one transaction and the relays woken.
    /// Logs nothing.
    ///
    /// # Errors
    /// As [`replay`](Self::replay).
    fn apply_replay(
        &self,
        request: &ReplayRequest<'_, ReplaySelection>,
    ) -> impl Future<Output = Result<ReplayPlan, OperatorError>> + Send;

    /// The store's part of a time-range replay, as [`apply_replay`](Self::apply_replay) is of
    /// a replay of one aggregate.
    ///
    /// # Errors
    /// As [`replay`](Self::replay).
    fn apply_replay_range(
        &self,
        request: &ReplayRequest<'_, RangeSelection>,
    ) -> impl Future<Output = Result<RangePlan, OperatorError>> + Send;
}

/// A replay request once checked, as a store's hook takes it.
#[derive(Debug)]
pub struct ReplayRequest<'r, W> {
    /// The action: its operation, actor, reason and audit selection.
    pub action: &'r Action<'r>,
    /// What it replays.
    pub which: &'r W,
    /// Only say what it would take; change nothing, record nothing.
    pub dry_run: bool,
    /// The dry run's count: refuse (`Refused`) when it changed meanwhile
    /// ([`count_changed`](super::count_changed)).
    pub expect_events: Option<i64>,
}

impl<W> Clone for ReplayRequest<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W> Copy for ReplayRequest<'_, W> {}

mod sealed {
    pub trait Sealed {}
}

/// What [`ReplayOps::replay`] takes: [`ReplaySelection`] (one aggregate from a version) or
/// [`RangeSelection`] (a time range). Sealed: each kind has its own store hook.
pub trait Replayable: Serialize + Sync + Sized + sealed::Sealed {
    /// What the replay takes, or took.
    type Plan: Send;

    /// The operation's name, in the audit record and the log.
    const OPERATION: &'static str;

    /// The selection as the audit record keeps it.
    fn audit_selection(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    /// The checks of the selection that need no store.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` in `operation`.
    fn check_selection(&self, operation: &'static str) -> Result<(), OperatorError>;

    /// The rows a plan republishes (or would).
    fn events(plan: &Self::Plan) -> i64;

    /// Runs this kind's store hook.
    fn apply<S: ReplayOps + ?Sized>(
        store: &S,
        request: &ReplayRequest<'_, Self>,
    ) -> impl Future<Output = Result<Self::Plan, OperatorError>> + Send;
}

/// [`Replayable`] for a selection type: its plan, operation name and store hook.
macro_rules! replayable {
    ($which:ty, $plan:ty, $operation:literal, $hook:ident) => {
        impl sealed::Sealed for $which {}

        impl Replayable for $which {
            type Plan = $plan;
            const OPERATION: &'static str = $operation;

            fn check_selection(&self, operation: &'static str) -> Result<(), OperatorError> {
                self.check(operation)
            }

            fn events(plan: &$plan) -> i64 {
                plan.events
            }

            fn apply<S: ReplayOps + ?Sized>(
                store: &S,
                request: &ReplayRequest<'_, Self>,
            ) -> impl Future<Output = Result<$plan, OperatorError>> + Send {
                store.$hook(request)
            }
        }
    };
}

replayable!(ReplaySelection, ReplayPlan, "replay", apply_replay);
replayable!(
    RangeSelection,
    RangePlan,
    "replay range",
    apply_replay_range
);
