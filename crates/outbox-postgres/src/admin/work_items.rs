//! Work items on PostgreSQL: the operator's reads and resolutions go through [`PgEffects`]
//! (`crate::effects`), in the action's transaction with its audit record.
//!
//! [`PgEffects`]: crate::effects::PgEffects

use outbox_core::effect::EffectsStats;
use outbox_core::operator::{
    Action, OperatorError, Resolution, WorkItemOps, WorkItemRow, check_limit, no_work_item,
    not_reconcilable,
};
use sqlx::AssertSqlSafe;

use super::effects_err;
use crate::permission::pool_role;
use crate::store::PgStore;

/// A work item's state.
const WORK_ITEM_STATE: &str = "SELECT state FROM {s}.work_items WHERE id = $1";

/// "Reconcile now": an unknown outcome's next lookup is due at once.
const RECONCILE_NOW: &str = "UPDATE {s}.work_items SET next_attempt_at = now(), \
    updated_at = now() WHERE id = $1 AND state = 'unknown'";

impl WorkItemOps for PgStore {
    async fn work_item_stats(&self, kind: Option<&str>) -> Result<EffectsStats, OperatorError> {
        self.effects()
            .stats(self.pool(), kind)
            .await
            .map_err(|e| effects_err("work items", e))
    }

    async fn work_items(
        &self,
        state: Option<&str>,
        limit: i64,
    ) -> Result<Vec<WorkItemRow>, OperatorError> {
        check_limit("work items", limit)?;
        self.effects()
            .list(self.pool(), state, limit)
            .await
            .map_err(|e| effects_err("work items", e))
    }

    async fn apply_resolve_work_item(
        &self,
        action: &Action<'_>,
        id: i64,
        resolution: Resolution,
    ) -> Result<WorkItemRow, OperatorError> {
        let mut tx = self.begin_action(action).await?;
        let result = self
            .effects()
            .resolve_in(&mut tx, &pool_role(self.pool()), id, resolution)
            .await
            .map(|row| (1, row))
            .map_err(|e| effects_err(action.operation(), e));
        let result = match result {
            Ok((n, row)) => Ok((n, Some(row))),
            Err(e) => Err(e),
        };
        self.finish_action_with(tx, action, result)
            .await
            .map(|row| row.expect("a resolved work item"))
    }

    async fn apply_reconcile_work_item(
        &self,
        action: &Action<'_>,
        id: i64,
    ) -> Result<(), OperatorError> {
        let mut tx = self.begin_action(action).await?;
        let result = match sqlx::query(AssertSqlSafe(self.render(RECONCILE_NOW)))
            .bind(id)
            .execute(&mut *tx)
            .await
        {
            Ok(r) if r.rows_affected() == 1 => Ok(1),
            Ok(_) => {
                let state: Result<Option<String>, _> =
                    sqlx::query_scalar(AssertSqlSafe(self.render(WORK_ITEM_STATE)))
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await;
                Err(match state {
                    Ok(None) => no_work_item(action.operation(), id),
                    Ok(Some(state)) => not_reconcilable(action.operation(), id, &state),
                    Err(e) => self.action_error(action.operation(), e),
                })
            }
            Err(e) => Err(self.action_error(action.operation(), e)),
        };
        self.finish_action(tx, action, result).await.map(|_| ())
    }
}
