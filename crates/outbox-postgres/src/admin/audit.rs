//! The record of the operator's actions: who, when, what, why, and how many rows it changed.
//!
//! Every action of [`Admin`](super::Admin) writes one row into `{schema}.audit` in the
//! transaction that does it (schema version 8), so an action and its record commit together or
//! not at all; it also logs one line at `info` under the target `outbox::audit` (failures,
//! which change nothing and write no row, at `warn`). The database role acting needs the
//! operator grants, which include inserting audit rows and nothing else on that table: a
//! record cannot be changed or deleted through the tools.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection, Row};

use super::{AdminError, AdminErrorKind};
use crate::schema::Schema;

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

/// Who acts, as the audit record names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    name: String,
    via: String,
    credential: Option<String>,
}

impl Actor {
    /// `name` acting through `via` (`cli`, `console`, or a service's own name).
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` when `name` is empty or longer than 255
    /// characters, or `via` empty or longer than 64.
    pub fn new(name: impl Into<String>, via: impl Into<String>) -> Result<Self, AdminError> {
        let (name, via) = (name.into(), via.into());
        let bad = |what: &str| AdminError {
            operation: "audit",
            kind: AdminErrorKind::InvalidRequest,
            message: what.to_owned(),
        };
        if name.trim().is_empty() || name.chars().count() > 255 {
            return Err(bad("an actor's name must have 1 to 255 characters"));
        }
        if via.trim().is_empty() || via.chars().count() > 64 {
            return Err(bad("an actor's `via` must have 1 to 64 characters"));
        }
        Ok(Self {
            name,
            via,
            credential: None,
        })
    }

    /// How the actor proved who they are (the console token's fingerprint); recorded beside
    /// the name, which is otherwise only what the actor said.
    #[must_use]
    pub fn with_credential(mut self, credential: impl Into<String>) -> Self {
        self.credential = Some(credential.into());
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Through what.
    pub fn via(&self) -> &str {
        &self.via
    }

    /// The credential's fingerprint, if one was checked.
    pub fn credential(&self) -> Option<&str> {
        self.credential.as_deref()
    }
}

/// One recorded action.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditEntry {
    /// Record id (newest is largest).
    pub id: i64,
    /// When, by the database clock.
    pub at: DateTime<Utc>,
    /// Who, as the tool knew them.
    pub actor: String,
    /// Through what (`cli`, `console`, ...).
    pub via: String,
    /// The credential's fingerprint, when the tool checked one.
    pub credential: Option<String>,
    /// The database role that made the change.
    pub db_role: String,
    /// What (`requeue dead letters`, `discard dead letters`, `resolve work item`, ...).
    pub action: String,
    /// What it selected: ids, a filter, or `{"all": true}`.
    pub selection: serde_json::Value,
    /// Why, as the actor said.
    pub reason: String,
    /// How many rows it changed.
    pub affected: i64,
}

/// Writes the record of an action on the action's own connection (its transaction); returns
/// the record's id.
pub(super) async fn record(
    conn: &mut PgConnection,
    schema: &Schema,
    actor: &Actor,
    action: &str,
    selection: &serde_json::Value,
    reason: &str,
    affected: u64,
) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar(AssertSqlSafe(schema.render(INSERT)))
        .bind(&actor.name)
        .bind(&actor.via)
        .bind(&actor.credential)
        .bind(action)
        .bind(selection)
        .bind(reason)
        .bind(i64::try_from(affected).unwrap_or(i64::MAX))
        .fetch_one(conn)
        .await
}

/// The log line of an action (target `outbox::audit`).
pub(super) fn log(
    actor: &Actor,
    action: &str,
    selection: &serde_json::Value,
    reason: &str,
    outcome: Result<u64, &AdminError>,
) {
    let (name, via, credential) = (
        actor.name.as_str(),
        actor.via.as_str(),
        actor.credential.as_deref().unwrap_or(""),
    );
    match outcome {
        Ok(n) => tracing::info!(
            target: "outbox::audit", actor = name, via, credential, action, %selection, reason,
            affected = n, "operator action"
        ),
        Err(e) => tracing::warn!(
            target: "outbox::audit", actor = name, via, credential, action, %selection, reason,
            error = %e, "operator action failed"
        ),
    }
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
