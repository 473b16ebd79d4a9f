//! The record of the operator's actions: who, when, what, why, and how many rows it changed.
//!
//! Every action of the operator contract writes one [`AuditEntry`] in the transaction that
//! does it, so an action and its record commit together or not at all; it also logs one line
//! at `info` under the target `outbox::audit` (failures, which change nothing and write no
//! record, at `warn`): the core's provided action methods write that line, never a store. A store keeps the records append-only for the tools: a
//! record cannot be changed or deleted through them.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::OperatorError;

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
    /// [`OperatorError`] of kind `InvalidRequest` when `name` is empty or longer than 255
    /// characters, or `via` empty or longer than 64.
    pub fn new(name: impl Into<String>, via: impl Into<String>) -> Result<Self, OperatorError> {
        let (name, via) = (name.into(), via.into());
        let bad = |what: &str| OperatorError::invalid("audit", what);
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

/// The audit records.
pub trait AuditOps {
    /// The audit records, newest first, older than record `before` when given, at most
    /// `limit` (1 to [`MAX_LIST`](super::MAX_LIST)).
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// store's failure.
    fn audit(
        &self,
        before: Option<i64>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<AuditEntry>, OperatorError>> + Send;
}

/// One operator action as its audit record and its log line name it: what (`operation`), who
/// (`actor`), on what (`selection`) and why (`reason`).
///
/// Only the core makes one: each provided action method of the operator traits names its
/// action, checks the request (a refusal is logged once and returned; nothing was changed or
/// recorded), hands the action to the store's `apply_*` hook, which makes the change with the
/// audit record it reads from here, and logs the outcome once, the rows changed or why it
/// failed. A store can neither make an action (so none reaches a hook unchecked) nor log one
/// (so no line is written twice, and every store's lines are the same).
#[derive(Debug, Clone, PartialEq)]
pub struct Action<'a> {
    operation: &'static str,
    actor: &'a Actor,
    selection: serde_json::Value,
    reason: &'a str,
}

impl<'a> Action<'a> {
    /// The action `operation` (`requeue dead letters`, `pause`, ...) by `actor` on `selection`
    /// (ids, a filter, a target: what the audit record keeps), for `reason`.
    pub(crate) fn new(
        operation: &'static str,
        actor: &'a Actor,
        selection: serde_json::Value,
        reason: &'a str,
    ) -> Self {
        Self {
            operation,
            actor,
            selection,
            reason,
        }
    }

    /// What is done: the audit record's `action`, and the `operation` of its errors.
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// Who acts.
    pub fn actor(&self) -> &'a Actor {
        self.actor
    }

    /// What it selects, as the audit record keeps it.
    pub fn selection(&self) -> &serde_json::Value {
        &self.selection
    }

    /// Why, as the actor said.
    pub fn reason(&self) -> &'a str {
        self.reason
    }

    /// The request's check passed through: a refusal is logged (once, at `warn`) and returned.
    ///
    /// # Errors
    /// The error of `checked` (a refused request: nothing was changed or recorded), logged.
    pub(crate) fn check(&self, checked: Result<(), OperatorError>) -> Result<(), OperatorError> {
        checked.map_err(|e| self.fail(e))
    }

    /// Logs the failure `error` of this action (at `warn`) and returns it.
    fn fail(&self, error: OperatorError) -> OperatorError {
        log_action(
            self.actor,
            self.operation,
            &self.selection,
            self.reason,
            Err(&error),
        );
        error
    }

    /// Logs the outcome of this action, `affected` telling the rows it changed, and returns it.
    ///
    /// # Errors
    /// The error of `result` (the action failed: nothing was changed or recorded), logged.
    pub(crate) fn logged<T>(
        &self,
        result: Result<T, OperatorError>,
        affected: impl FnOnce(&T) -> u64,
    ) -> Result<T, OperatorError> {
        log_action(
            self.actor,
            self.operation,
            &self.selection,
            self.reason,
            result.as_ref().map(affected),
        );
        result
    }
}

/// The log line of an action (target `outbox::audit`): `outcome` is the rows it changed, or
/// why it failed.
fn log_action(
    actor: &Actor,
    action: &str,
    selection: &serde_json::Value,
    reason: &str,
    outcome: Result<u64, &OperatorError>,
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
