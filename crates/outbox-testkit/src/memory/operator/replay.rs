//! Replays of the [`MemoryStore`]: always refused (it keeps no published rows).

use outbox_core::operator::{
    Action, OperatorError, RangePlan, RangeSelection, ReplayOps, ReplayPlan, ReplayRequest,
    ReplaySelection,
};

use super::NO_PUBLISHED_ROWS;
use crate::memory::MemoryStore;

impl ReplayOps for MemoryStore {
    /// Always refused (`Refused`): the fake keeps no published rows (see the module docs).
    async fn apply_replay(
        &self,
        request: &ReplayRequest<'_, ReplaySelection>,
    ) -> Result<ReplayPlan, OperatorError> {
        refused(request.action)
    }

    /// Always refused (`Refused`): the fake keeps no published rows (see the module docs).
    async fn apply_replay_range(
        &self,
        request: &ReplayRequest<'_, RangeSelection>,
    ) -> Result<RangePlan, OperatorError> {
        refused(request.action)
    }
}

/// Every replay's answer here: the fake keeps no published rows.
fn refused<T>(action: &Action<'_>) -> Result<T, OperatorError> {
    Err(OperatorError::refused(
        action.operation(),
        NO_PUBLISHED_ROWS,
    ))
}
