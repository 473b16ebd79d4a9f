//! Work items of the [`MemoryStore`] as the operator sees them: counted, listed, resolved by
//! hand, reconciled.

use chrono::{DateTime, Utc};
use outbox_core::effect::{EffectsStats, WorkItemState};
use outbox_core::operator::{
    Action, OperatorError, Resolution, WorkItemOps, WorkItemRow, no_work_item, not_reconcilable,
    page_size,
};

use crate::memory::{MemoryStore, WorkRow, WorkState, age, lock};

pub(super) fn work_item_row(r: &WorkRow) -> WorkItemRow {
    WorkItemRow {
        id: r.item.id,
        kind: r.item.kind.clone(),
        idempotency_key: r.item.idempotency_key.clone(),
        payload: r.item.payload.clone(),
        payload_sha256: r.payload_fingerprint.0.to_vec(),
        event_id: r.item.event_id,
        consumer_name: r.consumer_name.clone(),
        state: r.state.as_str().to_owned(),
        attempts: r.item.attempts,
        lookups: r.lookups,
        lease_token: r.lease.map(|(token, _)| token),
        lease_until: r.lease.map(|(_, until)| until),
        next_attempt_at: r.next_attempt_at,
        unknown_since: r.unknown_since,
        reference: r.reference.clone(),
        last_error: r.last_error.clone(),
        created_at: r.item.created_at,
        updated_at: r.updated_at,
        resolved_at: r.resolved_at,
    }
}

/// Work items by state (every state), for `kind` or all kinds.
pub(in crate::memory) fn work_stats(w: &WorkState, kind: Option<&str>) -> EffectsStats {
    let mut s = EffectsStats::default();
    let oldest = |o: Option<std::time::Duration>, since: DateTime<Utc>| {
        let a = age(since);
        Some(o.map_or(a, |o| o.max(a)))
    };
    for r in w
        .items
        .values()
        .filter(|r| kind.is_none_or(|k| k == r.item.kind))
    {
        match r.state {
            WorkItemState::Pending => {
                s.pending += 1;
                s.oldest_pending_age = oldest(s.oldest_pending_age, r.item.created_at);
            }
            WorkItemState::InProgress => s.in_progress += 1,
            WorkItemState::Unknown => {
                s.unknown += 1;
                if let Some(since) = r.unknown_since {
                    s.oldest_unknown_age = oldest(s.oldest_unknown_age, since);
                }
            }
            WorkItemState::Succeeded => s.succeeded += 1,
            WorkItemState::Failed => s.failed += 1,
        }
    }
    s
}
impl WorkItemOps for MemoryStore {
    async fn work_item_stats(&self, kind: Option<&str>) -> Result<EffectsStats, OperatorError> {
        Ok(work_stats(&lock(&self.inner.work), kind))
    }

    async fn work_items(
        &self,
        state: Option<&str>,
        limit: i64,
    ) -> Result<Vec<WorkItemRow>, OperatorError> {
        let take = page_size("work items", limit)?;
        let state = match state {
            None => None,
            Some(name) => Some(WorkItemState::parse(name).ok_or_else(|| {
                let names: Vec<&str> = WorkItemState::ALL.iter().map(|s| s.as_str()).collect();
                OperatorError::invalid(
                    "work items",
                    format!(
                        "invalid `state`: `{name}` is not one of {}",
                        names.join(", ")
                    ),
                )
            })?),
        };
        Ok(lock(&self.inner.work)
            .items
            .values()
            .filter(|r| state.is_none_or(|s| s == r.state))
            .take(take)
            .map(work_item_row)
            .collect())
    }

    async fn apply_resolve_work_item(
        &self,
        action: &Action<'_>,
        id: i64,
        resolution: Resolution,
    ) -> Result<WorkItemRow, OperatorError> {
        let op = action.operation();
        {
            let mut w = lock(&self.inner.work);
            match w.items.get_mut(&id) {
                None => Err(OperatorError::not_found(
                    op,
                    format!("work item {id} does not exist"),
                )),
                Some(r) => {
                    let allowed = match resolution {
                        Resolution::Succeeded { .. } | Resolution::Failed { .. } => {
                            r.state == WorkItemState::Unknown
                        }
                        Resolution::Resend => {
                            matches!(r.state, WorkItemState::Unknown | WorkItemState::Failed)
                        }
                    };
                    if allowed {
                        let now = Utc::now();
                        match &resolution {
                            Resolution::Succeeded { reference } => {
                                r.state = WorkItemState::Succeeded;
                                r.reference = Some(reference.clone());
                                r.resolved_at = Some(now);
                            }
                            Resolution::Failed { reason } => {
                                r.state = WorkItemState::Failed;
                                r.last_error = Some(reason.clone());
                                r.resolved_at = Some(now);
                            }
                            Resolution::Resend => {
                                r.state = WorkItemState::Pending;
                                r.last_error = Some("resend requested by an operator".to_owned());
                                r.next_attempt_at = now;
                                r.unknown_since = None;
                                r.resolved_at = None;
                            }
                        }
                        // Clearing the lease fences off a lookup in flight.
                        r.lease = None;
                        r.updated_at = now;
                        lock(&self.inner.ops).record(action, 1);
                        Ok(work_item_row(r))
                    } else {
                        Err(OperatorError::refused(
                            op,
                            format!(
                                "work item {id} is `{}`: {} is not allowed from this state",
                                r.state.as_str(),
                                resolution.name()
                            ),
                        ))
                    }
                }
            }
        }
    }

    async fn apply_reconcile_work_item(
        &self,
        action: &Action<'_>,
        id: i64,
    ) -> Result<(), OperatorError> {
        let op = action.operation();
        let mut w = lock(&self.inner.work);
        match w.items.get_mut(&id) {
            None => Err(no_work_item(op, id)),
            Some(r) if r.state == WorkItemState::Unknown => {
                let now = Utc::now();
                r.next_attempt_at = now;
                r.updated_at = now;
                lock(&self.inner.ops).record(action, 1);
                Ok(())
            }
            Some(r) => Err(not_reconcilable(op, id, r.state.as_str())),
        }
    }
}
