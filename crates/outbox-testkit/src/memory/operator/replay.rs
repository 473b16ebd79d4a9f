//! Replays of the [`MemoryStore`]: always refused (it keeps no published rows).

use outbox_core::operator::{
    Action, OperatorError, RangePlan, RangeSelection, ReplayOps, ReplayPlan, ReplaySelection,
};

use super::NO_PUBLISHED_ROWS;
use crate::memory::MemoryStore;

impl ReplayOps for MemoryStore {
    /// Always refused (`Refused`): the fake keeps no published rows (see the module docs).
    async fn apply_replay(
        &self,
        action: &Action<'_>,
        _which: &ReplaySelection,
        _dry_run: bool,
        _expect_events: Option<i64>,
    ) -> Result<ReplayPlan, OperatorError> {
        Err(OperatorError::refused(
            action.operation(),
            NO_PUBLISHED_ROWS,
        ))
    }

    /// Always refused (`Refused`): the fake keeps no published rows (see the module docs).
    async fn apply_replay_range(
        &self,
        action: &Action<'_>,
        _which: &RangeSelection,
        _dry_run: bool,
        _expect_events: Option<i64>,
    ) -> Result<RangePlan, OperatorError> {
        Err(OperatorError::refused(
            action.operation(),
            NO_PUBLISHED_ROWS,
        ))
    }
}
