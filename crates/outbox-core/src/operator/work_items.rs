//! Remote effects (work items) as the operator reads and settles them.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Action, Actor, OperatorError};
use crate::effect::EffectsStats;

/// One work item with every column an operator needs.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkItemRow {
    /// Row id.
    pub id: i64,
    /// Kind of effect.
    pub kind: String,
    /// The key sent to the provider.
    pub idempotency_key: String,
    /// What to do.
    pub payload: serde_json::Value,
    /// SHA-256 of the payload's canonical form, as the store computes it to compare payloads
    /// under one key (hex when serialised).
    #[serde(serialize_with = "hex_bytes")]
    pub payload_sha256: Vec<u8>,
    /// The event that caused the work.
    pub event_id: Option<Uuid>,
    /// The consumer that wrote it.
    pub consumer_name: Option<String>,
    /// The state's stored name (see [`WorkItemState::as_str`](crate::effect::WorkItemState::as_str)).
    pub state: String,
    /// Calls made so far.
    pub attempts: i32,
    /// Lookups made so far.
    pub lookups: i32,
    /// Token of the current lease (call or lookup), if any.
    pub lease_token: Option<i64>,
    /// End of the current lease, if any.
    pub lease_until: Option<DateTime<Utc>>,
    /// When the next call (pending) or lookup (unknown) is due.
    pub next_attempt_at: DateTime<Utc>,
    /// Since when the outcome is unknown (set while `unknown`).
    pub unknown_since: Option<DateTime<Utc>>,
    /// The provider's reference, once succeeded.
    pub reference: Option<String>,
    /// The latest error or reason.
    pub last_error: Option<String>,
    /// Enqueued at.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// When it reached `succeeded` or `failed`.
    pub resolved_at: Option<DateTime<Utc>>,
}

fn hex_bytes<S: serde::Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&hex::encode(bytes))
}

/// An operator's decision about a work item ([`WorkItemOps::resolve_work_item`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The operator confirmed with the provider that the effect happened. Only from `unknown`.
    Succeeded {
        /// The provider's reference.
        reference: String,
    },
    /// The operator confirmed that it did not happen and must not. Only from `unknown`.
    Failed {
        /// Why.
        reason: String,
    },
    /// Call the provider again, with the same key. From `unknown` (the operator knows the
    /// provider has no record) or `failed`.
    Resend,
}

impl Resolution {
    /// The resolution's name, as the audit record keeps it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Succeeded { .. } => "succeeded",
            Self::Failed { .. } => "failed",
            Self::Resend => "resend",
        }
    }

    /// The selection of this resolution of the work item `id`, as the audit record keeps it.
    pub fn audit_selection(&self, id: i64) -> serde_json::Value {
        serde_json::json!({ "work_item": id, "resolution": self.name() })
    }
}

/// The selection of an action on the work item `id` (a reconciliation), as the audit record
/// keeps it.
pub fn work_item_selection(id: i64) -> serde_json::Value {
    serde_json::json!({ "work_item": id })
}

/// The refusal (`NotFound`) of a reconciliation of a work item that does not exist.
pub fn no_work_item(operation: &'static str, id: i64) -> OperatorError {
    OperatorError::not_found(operation, format!("no work item {id}"))
}

/// The refusal (`Refused`) of a reconciliation of the work item `id`, whose outcome is not
/// unknown: it is in `state` (the state's stored name).
pub fn not_reconcilable(operation: &'static str, id: i64, state: &str) -> OperatorError {
    OperatorError::refused(
        operation,
        format!("work item {id} is {state}: only an unknown outcome is reconciled"),
    )
}

/// Work items.
///
/// The actions are provided: each names its [`Action`], runs the store's `apply_*` hook and logs the outcome, so every
/// store audits, refuses and logs alike. A store implements the reads and the hooks.
pub trait WorkItemOps: Sync {
    /// Remote effects by state (settled ones included), for `kind` or for every kind.
    ///
    /// # Errors
    /// [`OperatorError`]: the store's failure.
    fn work_item_stats(
        &self,
        kind: Option<&str>,
    ) -> impl Future<Output = Result<EffectsStats, OperatorError>> + Send;

    /// Work items, in `state` or in every state, oldest first, at most `limit` (1 to
    /// [`MAX_LIST`](super::MAX_LIST)).
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` for an unknown state or a `limit` out of
    /// range; otherwise the store's failure.
    fn work_items(
        &self,
        state: Option<&str>,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<WorkItemRow>, OperatorError>> + Send;

    /// Settles a work item by hand, or sends it again ([`Resolution`]), with the audit record;
    /// returns the row as it is now.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `NotFound` (no such item), `Refused` (its state does not
    /// allow this resolution; nothing changed), `PermissionDenied` (the role may only read),
    /// or the store's failure.
    fn resolve_work_item(
        &self,
        id: i64,
        resolution: Resolution,
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<WorkItemRow, OperatorError>> + Send {
        async move {
            let selection = resolution.audit_selection(id);
            let action = Action::new("resolve work item", actor, selection, reason);
            let result = self.apply_resolve_work_item(&action, id, resolution).await;
            action.logged(result, |_| 1)
        }
    }

    /// The store's part of [`resolve_work_item`](Self::resolve_work_item): the resolution and
    /// `action`'s audit record in one transaction (a lookup in flight fenced off). Logs
    /// nothing.
    ///
    /// # Errors
    /// As [`resolve_work_item`](Self::resolve_work_item).
    fn apply_resolve_work_item(
        &self,
        action: &Action<'_>,
        id: i64,
        resolution: Resolution,
    ) -> impl Future<Output = Result<WorkItemRow, OperatorError>> + Send;

    /// "Reconcile now": the next lookup of a work item whose outcome is unknown is due at
    /// once (a running executor looks it up on its next claim), with the audit record.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `NotFound` (no such item), `Refused` when its outcome is not
    /// `unknown`, `PermissionDenied` (the role may only read), or the store's failure.
    fn reconcile_work_item(
        &self,
        id: i64,
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<(), OperatorError>> + Send {
        async move {
            let action = Action::new(
                "reconcile work item",
                actor,
                work_item_selection(id),
                reason,
            );
            let result = self.apply_reconcile_work_item(&action, id).await;
            action.logged(result, |()| 1)
        }
    }

    /// The store's part of [`reconcile_work_item`](Self::reconcile_work_item): the lookup made
    /// due and `action`'s audit record, in one transaction. Logs nothing.
    ///
    /// # Errors
    /// As [`reconcile_work_item`](Self::reconcile_work_item).
    fn apply_reconcile_work_item(
        &self,
        action: &Action<'_>,
        id: i64,
    ) -> impl Future<Output = Result<(), OperatorError>> + Send;
}
