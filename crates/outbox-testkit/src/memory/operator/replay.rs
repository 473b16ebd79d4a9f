//! Replays of the [`MemoryStore`]: always refused (it keeps no published rows).

use outbox_core::operator::{
    Action, Actor, OperatorError, RangePlan, RangeSelection, ReplayOps, ReplayPlan, ReplaySelection,
};

use super::NO_PUBLISHED_ROWS;
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
        let action = Action::new("replay", actor, which.audit_selection(), reason);
        Err(action.fail(OperatorError::refused("replay", NO_PUBLISHED_ROWS)))
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
        let action = Action::new("replay range", actor, which.audit_selection(), reason);
        Err(action.fail(OperatorError::refused("replay range", NO_PUBLISHED_ROWS)))
    }
}
