//! Inbox conflicts: the same event id arrived at a consumer with another payload than the
//! first time (G5's loud failure), as the operator reads and resolves them.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{Action, Actor, MAX_LIST, OperatorError, PayloadView, require_reason};
use crate::EventId;

/// An inbox conflict as the operator sees it: the same event id arrived at a consumer with
/// another payload than the first time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConflictView {
    /// The conflict's id.
    pub id: i64,
    /// The consumer that saw it.
    pub consumer_name: String,
    /// The event id.
    pub event_id: EventId,
    /// SHA-256 of the payload recorded first, hex.
    pub stored_sha256: String,
    /// SHA-256 of the conflicting payload, hex.
    pub received_sha256: String,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Aggregate version.
    pub aggregate_version: i64,
    /// Event type.
    pub event_type: String,
    /// How often this exact conflicting payload arrived.
    pub occurrences: i32,
    /// First seen.
    pub first_seen: DateTime<Utc>,
    /// Last seen.
    pub last_seen: DateTime<Utc>,
    /// When an operator resolved it ([`ConflictOps::resolve_conflicts`]); `None` while open. The
    /// same conflicting payload arriving again reopens it.
    pub resolved_at: Option<DateTime<Utc>>,
    /// Who resolved it (the audit record's actor).
    pub resolved_by: Option<String>,
    /// Why (the audit record's reason).
    pub resolution_reason: Option<String>,
}

/// What [`ConflictOps::resolve_conflicts`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ConflictsResolved {
    /// Conflicts resolved by this call (ids already resolved are not counted).
    pub resolved: u64,
    /// The audit record (written even when every id was resolved already).
    pub audit_id: i64,
}

/// A conflict with its payloads, as far as this database holds them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConflictDetail {
    /// The conflict.
    #[serde(flatten)]
    pub conflict: ConflictView,
    /// The conflicting payload, as received.
    pub received_payload: PayloadView,
    /// The first payload (the one the consumer applied), when this database still holds the
    /// producer's row with that fingerprint; the inbox keeps only the fingerprint.
    pub first_payload: Option<PayloadView>,
}

/// Which inbox conflicts a list takes ([`ConflictOps::conflicts`]); the default takes all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConflictFilter {
    /// Only the conflicts of this event id.
    pub event_id: Option<EventId>,
    /// Only the open ones (not resolved).
    pub open_only: bool,
}

impl ConflictFilter {
    /// The open conflicts of every event.
    pub const OPEN: Self = Self {
        event_id: None,
        open_only: true,
    };

    /// Every conflict of `event_id`, resolved or not.
    pub fn of(event_id: EventId) -> Self {
        Self {
            event_id: Some(event_id),
            open_only: false,
        }
    }

    /// Whether a conflict of `event_id`, resolved or not, is selected.
    pub fn matches(&self, event_id: EventId, resolved: bool) -> bool {
        self.event_id.is_none_or(|e| e == event_id) && !(self.open_only && resolved)
    }
}

/// The selection of a resolution of the conflicts `ids`, as the audit record keeps it.
pub fn conflicts_selection(ids: &[i64]) -> serde_json::Value {
    serde_json::json!({ "conflicts": ids })
}

/// Checks a request to resolve the conflicts `ids` ([`ConflictOps::resolve_conflicts`]): 1 to
/// [`MAX_LIST`] ids, and a reason.
///
/// # Errors
/// [`OperatorError`] of kind `InvalidRequest` for no ids or too many, or no reason.
pub fn check_conflicts_request(
    operation: &'static str,
    ids: &[i64],
    reason: &str,
) -> Result<(), OperatorError> {
    if ids.is_empty() || ids.len() > usize::try_from(MAX_LIST).unwrap_or(usize::MAX) {
        return Err(OperatorError::invalid(
            operation,
            format!("give 1 to {MAX_LIST} conflict ids, not {}", ids.len()),
        ));
    }
    require_reason(operation, reason)
}

/// The refusal (`NotFound`) of a resolution none of whose `ids` is an inbox conflict.
pub fn no_such_conflicts(operation: &'static str, ids: &[i64]) -> OperatorError {
    OperatorError::not_found(
        operation,
        format!("none of the ids {ids:?} is an inbox conflict"),
    )
}

/// Inbox conflicts.
///
/// The action ([`resolve_conflicts`](Self::resolve_conflicts)) is provided: it names its
/// [`Action`], checks the request ([`check_conflicts_request`]), runs the store's `apply_*`
/// hook and logs the outcome, so every store audits, refuses and logs alike. A store
/// implements the reads and the hooks.
pub trait ConflictOps: Sync {
    /// Inbox conflicts that `filter` selects, newest first, at most `limit` (1 to
    /// [`MAX_LIST`](super::MAX_LIST)).
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` for a `limit` out of range; otherwise the
    /// store's failure.
    fn conflicts(
        &self,
        filter: ConflictFilter,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<ConflictView>, OperatorError>> + Send;

    /// Resolves the inbox conflicts `ids` (1 to [`MAX_LIST`](super::MAX_LIST) of them): an
    /// operator looked at each and dealt with its cause. Nothing is applied or undone: the
    /// consumer's effect stays the first payload's, and a conflict only leaves the open list
    /// (the overview's count, the console's list, `outbox conflicts list --open`), with the
    /// audit record naming the actor and `reason`. Ids already resolved are left as they are
    /// (not counted), and the record is written even then. The conflicting payload arriving
    /// again reopens a conflict, whoever sends it: a producer re-sending, the broker
    /// redelivering a message whose acknowledgement was lost, or, under
    /// `ConflictPolicy::Hold`, the held message coming back after each hold delay.
    ///
    /// The library never applies the conflicting payload: the consumer's inbox holds one
    /// effect per event id (G5), and a second effect under the same id would be the double
    /// effect the inbox exists to prevent.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` (no ids, too many, or no reason), `NotFound`
    /// (none of the ids is a conflict), `PermissionDenied` when the role may only read;
    /// otherwise the store's failure. Nothing changed then.
    fn resolve_conflicts(
        &self,
        ids: &[i64],
        actor: &Actor,
        reason: &str,
    ) -> impl Future<Output = Result<ConflictsResolved, OperatorError>> + Send {
        async move {
            let action = Action::new("resolve conflicts", actor, conflicts_selection(ids), reason);
            action.check(check_conflicts_request(action.operation(), ids, reason))?;
            let result = self.apply_resolve_conflicts(&action, ids).await;
            action.logged(result, |r| r.resolved)
        }
    }

    /// The store's part of [`resolve_conflicts`](Self::resolve_conflicts), called once the
    /// request was checked: in one transaction, `action`'s audit record (written even when
    /// every id was resolved already) and the open conflicts among `ids` marked resolved under
    /// it. Logs nothing.
    ///
    /// # Errors
    /// As [`resolve_conflicts`](Self::resolve_conflicts).
    fn apply_resolve_conflicts(
        &self,
        action: &Action<'_>,
        ids: &[i64],
    ) -> impl Future<Output = Result<ConflictsResolved, OperatorError>> + Send;

    /// One conflict with its payloads: the conflicting one, and the first one where the store
    /// still holds it. Needs a role that may read payloads.
    ///
    /// # Errors
    /// [`OperatorError`] of kind `NotFound` (no such conflict), `PermissionDenied` under a
    /// role that may not read payloads, or the store's failure.
    fn conflict(
        &self,
        id: i64,
    ) -> impl Future<Output = Result<ConflictDetail, OperatorError>> + Send;
}
