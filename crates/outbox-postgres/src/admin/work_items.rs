//! Work items on PostgreSQL: the operator's reads and resolutions go through [`PgEffects`]
//! (`crate::effects`), in the action's transaction with its audit record.
//!
//! [`PgEffects`]: crate::effects::PgEffects

use outbox_core::effect::EffectsStats;
use outbox_core::operator::{
    Action, Actor, OperatorError, Resolution, WorkItemOps, WorkItemRow, check_limit, no_work_item,
    not_reconcilable, work_item_selection,
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

    async fn resolve_work_item(
        &self,
        id: i64,
        resolution: Resolution,
        actor: &Actor,
        reason: &str,
    ) -> Result<WorkItemRow, OperatorError> {
        const OP: &str = "resolve work item";
        let action = Action::new(OP, actor, resolution.audit_selection(id), reason);
        let mut tx = self.begin_action(&action).await?;
        let result = self
            .effects()
            .resolve_in(&mut tx, &pool_role(self.pool()), id, resolution)
            .await
            .map(|row| (1, row))
            .map_err(|e| effects_err(OP, e));
        let result = match result {
            Ok((n, row)) => Ok((n, Some(row))),
            Err(e) => Err(e),
        };
        self.finish_action_with(tx, &action, result)
            .await
            .map(|row| row.expect("a resolved work item"))
    }

    async fn reconcile_work_item(
        &self,
        id: i64,
        actor: &Actor,
        reason: &str,
    ) -> Result<(), OperatorError> {
        const OP: &str = "reconcile work item";
        let action = Action::new(OP, actor, work_item_selection(id), reason);
        let mut tx = self.begin_action(&action).await?;
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
                    Ok(None) => no_work_item(OP, id),
                    Ok(Some(state)) => not_reconcilable(OP, id, &state),
                    Err(e) => self.action_error(OP, e),
                })
            }
            Err(e) => Err(self.action_error(OP, e)),
        };
        self.finish_action(tx, &action, result).await.map(|_| ())
    }
}
