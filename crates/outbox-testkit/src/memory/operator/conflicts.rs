//! Inbox conflicts of the [`MemoryStore`]: listed, read, resolved.

use chrono::Utc;
use outbox_core::operator::{
    Action, ConflictDetail, ConflictFilter, ConflictOps, ConflictView, ConflictsResolved,
    OperatorError, PayloadView, no_such_conflicts, page_size,
};

use super::OpsState;
use crate::memory::{ConflictRow, MemoryStore, lock};

pub(super) fn conflict_view(c: &ConflictRow, ops: &OpsState) -> ConflictView {
    let resolution = c.resolved_audit_id.and_then(|id| ops.entry(id));
    ConflictView {
        id: c.id,
        consumer_name: c.consumer.clone(),
        event_id: c.event_id,
        stored_sha256: c.stored.to_hex(),
        received_sha256: c.received.to_hex(),
        aggregate_type: c.aggregate_type.clone(),
        aggregate_id: c.aggregate_id.clone(),
        aggregate_version: c.aggregate_version,
        event_type: c.event_type.clone(),
        occurrences: i32::try_from(c.occurrences).unwrap_or(i32::MAX),
        first_seen: c.first_seen,
        last_seen: c.last_seen,
        resolved_at: c.resolved_at,
        resolved_by: resolution.map(|a| a.actor.clone()),
        resolution_reason: resolution.map(|a| a.reason.clone()),
    }
}
impl ConflictOps for MemoryStore {
    async fn conflicts(
        &self,
        filter: ConflictFilter,
        limit: i64,
    ) -> Result<Vec<ConflictView>, OperatorError> {
        let take = page_size("conflicts", limit)?;
        let mut rows: Vec<ConflictRow> = lock(&self.inner.consumer)
            .conflicts
            .iter()
            .filter(|c| filter.matches(c.event_id, c.resolved_at.is_some()))
            .cloned()
            .collect();
        rows.sort_by_key(|c| std::cmp::Reverse(c.id));
        rows.truncate(take);
        let ops = lock(&self.inner.ops);
        Ok(rows.iter().map(|c| conflict_view(c, &ops)).collect())
    }

    async fn apply_resolve_conflicts(
        &self,
        action: &Action<'_>,
        ids: &[i64],
    ) -> Result<ConflictsResolved, OperatorError> {
        let _tx = self.inner.tx_lock.lock().await;
        let mut c = lock(&self.inner.consumer);
        let open: Vec<usize> = (0..c.conflicts.len())
            .filter(|i| {
                let x = &c.conflicts[*i];
                ids.contains(&x.id) && x.resolved_at.is_none()
            })
            .collect();
        if open.is_empty() && !c.conflicts.iter().any(|x| ids.contains(&x.id)) {
            Err(no_such_conflicts(action.operation(), ids))
        } else {
            // Recorded even when every id was resolved already: every action is audited.
            let resolved = open.len() as u64;
            let audit_id = lock(&self.inner.ops).record(action, resolved);
            let now = Utc::now();
            for i in open {
                c.conflicts[i].resolved_at = Some(now);
                c.conflicts[i].resolved_audit_id = Some(audit_id);
            }
            Ok(ConflictsResolved { resolved, audit_id })
        }
    }

    /// The first payload is found while the outbox holds the producer's row with the first
    /// fingerprint (pending or dead: the fake deletes published rows).
    async fn conflict(&self, id: i64) -> Result<ConflictDetail, OperatorError> {
        let row = lock(&self.inner.consumer)
            .conflicts
            .iter()
            .find(|c| c.id == id)
            .cloned()
            .ok_or_else(|| OperatorError::not_found("conflict", format!("no conflict {id}")))?;
        let first_payload = lock(&self.inner.outbox)
            .rows
            .values()
            .find(|r| r.msg.event_id == row.event_id && r.msg.fingerprint == row.stored)
            .map(|r| PayloadView::of(r.msg.payload.bytes.to_vec()));
        let conflict = conflict_view(&row, &lock(&self.inner.ops));
        Ok(ConflictDetail {
            conflict,
            received_payload: PayloadView::of(row.payload.to_vec()),
            first_payload,
        })
    }
}
