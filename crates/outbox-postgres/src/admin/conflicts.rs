//! Inbox conflicts on PostgreSQL (`inbox_conflicts`, resolved under an audit record).

use outbox_core::operator::{
    Action, ConflictDetail, ConflictFilter, ConflictOps, ConflictView, ConflictsResolved,
    OperatorError, PayloadView, check_limit, no_such_conflicts,
};
use sqlx::{AssertSqlSafe, Row};

use super::{audit, op_err, trace};
use crate::store::PgStore;

/// A conflict's columns as [`conflict_view`] reads them (`c` the conflict, `a` its
/// resolution's audit record).
const CONFLICT_COLUMNS: &str = "c.id, c.consumer_name, c.event_id, c.stored_sha256, \
    c.received_sha256, c.aggregate_type, c.aggregate_id, c.aggregate_version, c.event_type, \
    c.occurrences, c.first_seen, c.last_seen, c.resolved_at, a.actor, a.reason";

/// Inbox conflicts, newest first, of one event id (`$1`) or all (`NULL`), the open ones only
/// when `$3`.
const LIST_CONFLICTS: &str = "FROM {s}.inbox_conflicts c \
    LEFT JOIN {s}.audit a ON a.id = c.resolved_audit_id \
    WHERE ($1::uuid IS NULL OR c.event_id = $1) AND (NOT $3 OR c.resolved_at IS NULL) \
    ORDER BY c.id DESC LIMIT $2";

/// The open conflicts among the ids `$1`, locked for their resolution.
const LOCK_OPEN_CONFLICTS: &str = "SELECT id FROM {s}.inbox_conflicts \
    WHERE id = ANY($1) AND resolved_at IS NULL FOR UPDATE";

/// How many of the ids `$1` are conflicts at all.
const COUNT_CONFLICTS_OF: &str = "SELECT count(*) FROM {s}.inbox_conflicts WHERE id = ANY($1)";

/// Resolves the open conflicts among the ids `$1` under the audit record `$2`.
const RESOLVE_CONFLICTS: &str = "UPDATE {s}.inbox_conflicts \
    SET resolved_at = now(), resolved_audit_id = $2 WHERE id = ANY($1) AND resolved_at IS NULL";

/// One conflict's received payload, and the first payload where this database still holds the
/// producer's row with the first fingerprint (mark mode, or not yet published).
const CONFLICT_PAYLOADS: &str = "SELECT c.payload, \
    (SELECT e.payload FROM {s}.events e WHERE e.event_id = c.event_id \
       AND e.payload_sha256 = c.stored_sha256) \
    FROM {s}.inbox_conflicts c WHERE c.id = $1";

pub(super) fn conflict_view(r: &sqlx::postgres::PgRow) -> Result<ConflictView, sqlx::Error> {
    Ok(ConflictView {
        id: r.try_get(0)?,
        consumer_name: r.try_get(1)?,
        event_id: r.try_get(2)?,
        stored_sha256: hex::encode(r.try_get::<Vec<u8>, _>(3)?),
        received_sha256: hex::encode(r.try_get::<Vec<u8>, _>(4)?),
        aggregate_type: r.try_get(5)?,
        aggregate_id: r.try_get(6)?,
        aggregate_version: r.try_get(7)?,
        event_type: r.try_get(8)?,
        occurrences: r.try_get(9)?,
        first_seen: r.try_get(10)?,
        last_seen: r.try_get(11)?,
        resolved_at: r.try_get(12)?,
        resolved_by: r.try_get(13)?,
        resolution_reason: r.try_get(14)?,
    })
}

impl ConflictOps for PgStore {
    async fn conflicts(
        &self,
        filter: ConflictFilter,
        limit: i64,
    ) -> Result<Vec<ConflictView>, OperatorError> {
        check_limit("conflicts", limit)?;
        trace::rows(
            self.pool(),
            self.schema(),
            &format!("SELECT {CONFLICT_COLUMNS} {LIST_CONFLICTS}"),
            |q| q.bind(filter.event_id).bind(limit).bind(filter.open_only),
            conflict_view,
        )
        .await
        .map_err(|e| op_err("conflicts", e))
    }

    async fn apply_resolve_conflicts(
        &self,
        action: &Action<'_>,
        ids: &[i64],
    ) -> Result<ConflictsResolved, OperatorError> {
        const OP: &str = "resolve conflicts";
        let mut tx = self.begin_action(action).await?;
        let err = |e| self.action_error(OP, e);
        let open: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(self.render(LOCK_OPEN_CONFLICTS)))
            .bind(ids)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        if open.is_empty() {
            let known: i64 = sqlx::query_scalar(AssertSqlSafe(self.render(COUNT_CONFLICTS_OF)))
                .bind(ids)
                .fetch_one(&mut *tx)
                .await
                .map_err(err)?;
            if known == 0 {
                return Err(no_such_conflicts(OP, ids));
            }
        }
        // Recorded even when every id was resolved already: every action is in the audit.
        let resolved = u64::try_from(open.len()).unwrap_or(u64::MAX);
        let audit_id = audit::record(&mut tx, self.schema(), action, resolved)
            .await
            .map_err(err)?;
        sqlx::query(AssertSqlSafe(self.render(RESOLVE_CONFLICTS)))
            .bind(&open)
            .bind(audit_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit()
            .await
            .map(|()| ConflictsResolved { resolved, audit_id })
            .map_err(|e| op_err(OP, e))
    }

    async fn conflict(&self, id: i64) -> Result<ConflictDetail, OperatorError> {
        const OP: &str = "conflict";
        let conflict = trace::rows(
            self.pool(),
            self.schema(),
            &format!(
                "SELECT {CONFLICT_COLUMNS} FROM {{s}}.inbox_conflicts c \
                 LEFT JOIN {{s}}.audit a ON a.id = c.resolved_audit_id WHERE c.id = $1"
            ),
            |q| q.bind(id),
            conflict_view,
        )
        .await
        .map_err(|e| op_err(OP, e))?
        .pop()
        .ok_or_else(|| OperatorError::not_found(OP, format!("no conflict {id}")))?;
        let row = sqlx::query(AssertSqlSafe(self.render(CONFLICT_PAYLOADS)))
            .bind(id)
            .fetch_one(self.pool())
            .await
            .map_err(|e| self.action_error(OP, e))?;
        let decode = || -> Result<ConflictDetail, sqlx::Error> {
            Ok(ConflictDetail {
                conflict,
                received_payload: PayloadView::of(row.try_get(0)?),
                first_payload: row.try_get::<Option<Vec<u8>>, _>(1)?.map(PayloadView::of),
            })
        };
        decode().map_err(|e| op_err(OP, e))
    }
}
