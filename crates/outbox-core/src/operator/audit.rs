//! The record of the operator's actions: who, when, what, why, and how many rows it changed.
//!
//! Every action of the operator contract writes one [`AuditEntry`] in the transaction that
//! does it, so an action and its record commit together or not at all; it also logs one line
//! at `info` under the target `outbox::audit` ([`log_action`]; failures, which change nothing
//! and write no record, at `warn`). A store keeps the records append-only for the tools: a
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

/// The log line of an action (target `outbox::audit`): `outcome` is the rows it changed, or
/// why it failed. Every store's actions log through this, so the line is the same everywhere.
pub fn log_action(
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
