//! Paused routes and consumers (schema version 10): what an operator stopped on purpose.
//!
//! What each stops is told at [`PauseTarget`]. The claim statement reads `pauses` itself
//! (`crate::sql`), so a route pause holds from the next claim on. Costs: a claim from the
//! table's start walks past the paused route's pending rows (about 2 µs a row: 2 s for a
//! million); with the claim window on ([`crate::ClaimWindow`], off by default) a slow claim
//! moves the next claims' start past them, so only one claim in a while pays it (BENCHMARKS.md,
//! "A paused route's cost"). The CDC relay reads `pauses` when its stream starts and at least
//! once a second, and leaves a paused route's aggregates pending in the table
//! (`outbox_core::relay::log`); the resume's wake-up starts its new session.

use outbox_core::operator::{Action, OperatorError, Pause, PauseOps, PauseTarget};
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Row};

use super::{audit, op_err, trace};
use crate::store::PgStore;

/// Every pause in force, with who and why.
pub(super) const LIST: &str = "SELECT p.kind, p.name, p.paused_at, p.audit_id, a.actor, a.reason \
    FROM {s}.pauses p LEFT JOIN {s}.audit a ON a.id = p.audit_id ORDER BY p.kind, p.name";

/// Pauses `$1`/`$2` under the audit record `$3`; no row when it is paused already.
pub(super) const INSERT: &str = "INSERT INTO {s}.pauses (kind, name, audit_id) \
    VALUES ($1, $2, $3) ON CONFLICT (kind, name) DO NOTHING";

/// Resumes `$1`/`$2`.
pub(super) const DELETE: &str = "DELETE FROM {s}.pauses WHERE kind = $1 AND name = $2";

fn pause(r: &PgRow) -> Result<Pause, sqlx::Error> {
    Ok(Pause {
        kind: r.try_get(0)?,
        name: r.try_get(1)?,
        paused_at: r.try_get(2)?,
        audit_id: r.try_get(3)?,
        actor: r.try_get(4)?,
        reason: r.try_get(5)?,
    })
}

impl PauseOps for PgStore {
    async fn pauses(&self) -> Result<Vec<Pause>, OperatorError> {
        trace::rows(self.pool(), self.schema(), LIST, |q| q, pause)
            .await
            .map_err(|e| op_err("pauses", e))
    }

    async fn apply_pause(
        &self,
        action: &Action<'_>,
        target: &PauseTarget,
    ) -> Result<Pause, OperatorError> {
        const OP: &str = "pause";
        let mut tx = self.begin_action(action).await?;
        let err = |e| self.action_error(OP, e);
        let audit_id = audit::record(&mut tx, self.schema(), action, 1)
            .await
            .map_err(err)?;
        let inserted = sqlx::query(AssertSqlSafe(self.render(INSERT)))
            .bind(target.kind())
            .bind(target.name())
            .bind(audit_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
        if inserted == 0 {
            return Err(target.paused_already(OP));
        }
        let paused_at = sqlx::query_scalar(AssertSqlSafe(
            self.render("SELECT paused_at FROM {s}.pauses WHERE kind = $1 AND name = $2"),
        ))
        .bind(target.kind())
        .bind(target.name())
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit()
            .await
            .map(|()| Pause::new(target, action, paused_at, audit_id))
            .map_err(|e| op_err(OP, e))
    }

    async fn apply_resume(
        &self,
        action: &Action<'_>,
        target: &PauseTarget,
    ) -> Result<(), OperatorError> {
        const OP: &str = "resume";
        let mut tx = self.begin_action(action).await?;
        let result = match sqlx::query(AssertSqlSafe(self.render(DELETE)))
            .bind(target.kind())
            .bind(target.name())
            .execute(&mut *tx)
            .await
        {
            Ok(r) if r.rows_affected() == 0 => Err(target.not_paused(OP)),
            Ok(r) => self
                .wake_relays(&mut tx)
                .await
                .map(|_| r.rows_affected())
                .map_err(|e| self.action_error(OP, e)),
            Err(e) => Err(self.action_error(OP, e)),
        };
        self.finish_action(tx, action, result).await.map(|_| ())
    }
}
