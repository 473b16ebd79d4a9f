//! The record of the operator's actions: who, when, what, why, and how many rows it changed.
//!
//! Every action of the operator contract writes one row into `{schema}.audit` in the
//! transaction that does it (schema version 8), so an action and its record commit together or
//! not at all; it also logs one line at `info` under the target `outbox::audit` (failures,
//! which change nothing and write no row, at `warn`). The database role acting needs the
//! operator grants, which include inserting audit rows and nothing else on that table: a
//! record cannot be changed or deleted through the tools.

use outbox_core::operator::{Action, AuditEntry, AuditOps, OperatorError, check_limit};
use sqlx::{AssertSqlSafe, PgConnection, Row};

use super::op_err;
use crate::schema::Schema;
use crate::store::PgStore;

const INSERT: &str = "INSERT INTO {s}.audit \
    (actor, via, credential, action, selection, reason, affected) \
    VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id";

const LIST: &str = "SELECT id, at, actor, via, credential, db_role, action, selection, reason, \
    affected FROM {s}.audit WHERE ($1::int8 IS NULL OR id < $1) ORDER BY id DESC LIMIT $2";

/// Records that name an event id in their selection (`"event_ids": [...]`), and the record of
/// its discard (which may have selected it by a filter), newest first.
const OF_EVENT: &str = "SELECT id, at, actor, via, credential, db_role, action, selection, \
    reason, affected FROM {s}.audit WHERE selection -> 'event_ids' ? $1 \
    OR id IN (SELECT audit_id FROM {s}.discarded_events WHERE event_id = $2) \
    ORDER BY id DESC LIMIT 100";

/// Writes the record of `action`, which changed `affected` rows, on the action's own connection
/// (its transaction); returns the record's id.
pub(super) async fn record(
    conn: &mut PgConnection,
    schema: &Schema,
    action: &Action<'_>,
    affected: u64,
) -> Result<i64, sqlx::Error> {
    let actor = action.actor();
    sqlx::query_scalar(AssertSqlSafe(schema.render(INSERT)))
        .bind(actor.name())
        .bind(actor.via())
        .bind(actor.credential())
        .bind(action.operation())
        .bind(action.selection())
        .bind(action.reason())
        .bind(i64::try_from(affected).unwrap_or(i64::MAX))
        .fetch_one(conn)
        .await
}

fn entry(r: &sqlx::postgres::PgRow) -> Result<AuditEntry, sqlx::Error> {
    Ok(AuditEntry {
        id: r.try_get(0)?,
        at: r.try_get(1)?,
        actor: r.try_get(2)?,
        via: r.try_get(3)?,
        credential: r.try_get(4)?,
        db_role: r.try_get(5)?,
        action: r.try_get(6)?,
        selection: r.try_get(7)?,
        reason: r.try_get(8)?,
        affected: r.try_get(9)?,
    })
}

/// Records newest first, at most `limit`, older than record `before` when given.
pub(super) async fn list<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    schema: &Schema,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<AuditEntry>, sqlx::Error> {
    sqlx::query(AssertSqlSafe(schema.render(LIST)))
        .bind(before)
        .bind(limit)
        .fetch_all(executor)
        .await?
        .iter()
        .map(entry)
        .collect()
}

/// Records whose selection names `event_id`, and its discard's, newest first (at most 100).
pub(super) async fn of_event<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    schema: &Schema,
    event_id: uuid::Uuid,
) -> Result<Vec<AuditEntry>, sqlx::Error> {
    sqlx::query(AssertSqlSafe(schema.render(OF_EVENT)))
        .bind(event_id.to_string())
        .bind(event_id)
        .fetch_all(executor)
        .await?
        .iter()
        .map(entry)
        .collect()
}

impl AuditOps for PgStore {
    async fn audit(
        &self,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AuditEntry>, OperatorError> {
        check_limit("audit", limit)?;
        list(self.pool(), self.schema(), before, limit)
            .await
            .map_err(|e| op_err("audit", e))
    }
}
