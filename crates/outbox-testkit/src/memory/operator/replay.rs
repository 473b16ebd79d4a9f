//! Replays of the [`MemoryStore`]: always refused (it keeps no published rows).

use outbox_core::operator::{
    Actor, OperatorError, RangePlan, RangeSelection, ReplayOps, ReplayPlan, ReplaySelection,
};

use super::{NO_PUBLISHED_ROWS, logged};
use crate::memory::MemoryStore;

impl ReplayOps for MemoryStore {
    /// Always refused (`Refused`): the fake keeps no published rows (see the module docs).
    async fn replay(
        &self,
        which: &ReplaySelection,
        _dry_run: bool,
        _expect_events: Option<i64>,
        actor: &Actor,
        reason: &str,
    ) -> Result<ReplayPlan, OperatorError> {
        let selection = serde_json::to_value(which).unwrap_or_default();
        let refused = Err(OperatorError::refused("replay", NO_PUBLISHED_ROWS));
        logged(
            actor,
            "replay",
            &selection,
            reason,
            refused,
            |p: &ReplayPlan| u64::try_from(p.events).unwrap_or(0),
        )
    }

    /// Always refused (`Refused`): the fake keeps no published rows (see the module docs).
    async fn replay_range(
        &self,
        which: &RangeSelection,
        _dry_run: bool,
        _expect_events: Option<i64>,
        actor: &Actor,
        reason: &str,
    ) -> Result<RangePlan, OperatorError> {
        let selection = serde_json::to_value(which).unwrap_or_default();
        let refused = Err(OperatorError::refused("replay range", NO_PUBLISHED_ROWS));
        logged(
            actor,
            "replay range",
            &selection,
            reason,
            refused,
            |p: &RangePlan| u64::try_from(p.events).unwrap_or(0),
        )
    }
}
