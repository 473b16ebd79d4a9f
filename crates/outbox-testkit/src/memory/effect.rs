//! Work items of the [`MemoryStore`]: [`WorkItemStore`] (claims, leases, records), the items a
//! handler writes with its transaction, and what a fixture reads and ages there.

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use outbox_core::effect::{
    ClaimPurpose, ClaimedWorkItem, EffectsStats, NewWorkItem, WorkItem, WorkItemClaimParams,
    WorkItemRecordParams, WorkItemState, WorkItemStore, WorkItemUpdate,
};
use outbox_core::{Fingerprint, LeaseToken, StoreError, StoreErrorKind};

use super::{MemoryConn, MemoryStore, WorkRow, chrono, lock, operator};

impl MemoryStore {
    /// Moves every work item's due time back by `by`, and its resolution and unknown times
    /// too: what was due later is due now, what was settled is older.
    pub fn age_work_items(&self, by: Duration) {
        for row in lock(&self.inner.work).items.values_mut() {
            row.next_attempt_at -= chrono(by);
            row.resolved_at = row.resolved_at.map(|t| t - chrono(by));
            row.unknown_since = row.unknown_since.map(|t| t - chrono(by));
        }
    }

    /// Ends every live lease of work items (as if their executor stalled past it).
    pub fn expire_work_item_leases(&self) {
        for row in lock(&self.inner.work).items.values_mut() {
            if let Some((token, _)) = row.lease {
                row.lease = Some((token, Utc::now() - chrono::Duration::milliseconds(1)));
            }
        }
    }

    /// Every work item, by id.
    pub fn work_item_views(&self) -> Vec<crate::fixture::WorkItemView> {
        lock(&self.inner.work)
            .items
            .values()
            .map(|r| crate::fixture::WorkItemView {
                id: r.item.id,
                state: r.state,
                attempts: r.item.attempts,
                lookups: r.lookups,
                reference: r.reference.clone(),
                last_error: r.last_error.clone(),
            })
            .collect()
    }

    /// Writes `items` (a committed transaction's).
    pub(super) fn enqueue_work_items(&self, items: Vec<NewWorkItem>) {
        let mut w = lock(&self.inner.work);
        for item in items {
            let id = self.inner.next_work_id.fetch_add(1, Ordering::Relaxed);
            let fingerprint = Fingerprint::of(item.payload.to_string().as_bytes());
            w.items.insert(
                id,
                WorkRow {
                    consumer_name: item.consumer_name,
                    item: WorkItem {
                        id,
                        kind: item.kind,
                        idempotency_key: item.idempotency_key,
                        payload: item.payload,
                        event_id: item.event_id,
                        attempts: 0,
                        created_at: Utc::now(),
                    },
                    payload_fingerprint: fingerprint,
                    state: WorkItemState::Pending,
                    lookups: 0,
                    lease: None,
                    next_attempt_at: Utc::now(),
                    unknown_since: None,
                    resolved_at: None,
                    reference: None,
                    last_error: None,
                    updated_at: Utc::now(),
                },
            );
        }
    }
}

impl MemoryConn {
    /// Writes a work item with this transaction. An item whose key is already stored (or
    /// written earlier in this transaction) with the same kind and payload is a redelivery and
    /// is not written again; with another kind or payload it is refused.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Constraint` for a key used with another payload.
    pub fn enqueue_work_item(
        &mut self,
        store: &MemoryStore,
        item: NewWorkItem,
    ) -> Result<(), StoreError> {
        item.validate()
            .map_err(|e| StoreError::new(StoreErrorKind::InvalidData, e.to_string()))?;
        let fp = Fingerprint::of(item.payload.to_string().as_bytes());
        let stored = lock(&store.inner.work)
            .items
            .values()
            .find(|r| r.item.idempotency_key == item.idempotency_key)
            .map(|r| (r.item.kind.clone(), r.payload_fingerprint));
        let pending = self
            .work_items
            .iter()
            .find(|w| w.idempotency_key == item.idempotency_key)
            .map(|w| {
                (
                    w.kind.clone(),
                    Fingerprint::of(w.payload.to_string().as_bytes()),
                )
            });
        match stored.or(pending) {
            Some((kind, f)) if kind == item.kind && f == fp => Ok(()),
            Some(_) => Err(StoreError::new(
                StoreErrorKind::Constraint,
                format!(
                    "idempotency key `{}` names a work item with another payload",
                    item.idempotency_key
                ),
            )),
            None => {
                self.work_items.push(item);
                Ok(())
            }
        }
    }
}

impl WorkItemStore for MemoryStore {
    async fn work_item_expire<'a>(
        &'a self,
        kind: &'a str,
        reconcile_after: Duration,
        reason: &'a str,
    ) -> Result<Vec<i64>, StoreError> {
        let now = Utc::now();
        let mut w = lock(&self.inner.work);
        let mut ids = Vec::new();
        for r in w.items.values_mut() {
            let expired = r.lease.is_some_and(|(_, until)| until < now);
            if r.item.kind == kind && r.state == WorkItemState::InProgress && expired {
                r.state = WorkItemState::Unknown;
                r.unknown_since = Some(now);
                r.next_attempt_at = now + chrono(reconcile_after);
                r.lease = None;
                r.last_error = Some(reason.to_owned());
                r.updated_at = now;
                ids.push(r.item.id);
            }
        }
        Ok(ids)
    }

    async fn work_item_claim<'a>(
        &'a self,
        p: WorkItemClaimParams<'a>,
    ) -> Result<Vec<ClaimedWorkItem>, StoreError> {
        let now = Utc::now();
        let mut w = lock(&self.inner.work);
        let mut due: Vec<&mut WorkRow> = w
            .items
            .values_mut()
            .filter(|r| r.item.kind == p.kind && r.next_attempt_at <= now)
            .filter(|r| match p.purpose {
                ClaimPurpose::Call => r.state == WorkItemState::Pending,
                ClaimPurpose::Lookup => {
                    r.state == WorkItemState::Unknown
                        && r.lease.is_none_or(|(_, until)| until < now)
                }
            })
            .collect();
        due.sort_by_key(|r| (r.next_attempt_at, r.item.id));
        let mut claimed = Vec::new();
        for r in due.into_iter().take(p.limit) {
            let token = self.token();
            r.lease = Some((token, now + chrono(p.lease)));
            r.updated_at = now;
            if p.purpose == ClaimPurpose::Call {
                r.state = WorkItemState::InProgress;
                r.item.attempts += 1;
            }
            claimed.push(ClaimedWorkItem {
                item: r.item.clone(),
                lookups: r.lookups,
                token: LeaseToken(token),
            });
        }
        Ok(claimed)
    }

    async fn work_item_record<'a>(
        &'a self,
        p: WorkItemRecordParams<'a>,
    ) -> Result<bool, StoreError> {
        let now = Utc::now();
        let mut w = lock(&self.inner.work);
        let Some(r) = w.items.get_mut(&p.id) else {
            return Ok(false);
        };
        if r.state != p.claimed_in || r.lease.map(|(t, _)| t) != Some(p.token.0) {
            return Ok(false);
        }
        r.lookups += p.lookups_add;
        r.lease = None;
        r.updated_at = now;
        match p.update {
            WorkItemUpdate::Succeeded { reference } => {
                r.state = WorkItemState::Succeeded;
                r.reference = Some(reference.clone());
                r.unknown_since = None;
                r.resolved_at = Some(now);
            }
            WorkItemUpdate::Failed { reason } => {
                r.state = WorkItemState::Failed;
                r.last_error = Some(reason.clone());
                r.unknown_since = None;
                r.resolved_at = Some(now);
            }
            WorkItemUpdate::Pending { reason, delay } => {
                r.state = WorkItemState::Pending;
                r.last_error = Some(reason.clone());
                r.next_attempt_at = now + chrono(*delay);
                r.unknown_since = None;
            }
            WorkItemUpdate::Unknown { reason, delay } => {
                r.state = WorkItemState::Unknown;
                r.last_error = Some(reason.clone());
                r.next_attempt_at = now + chrono(*delay);
                r.unknown_since = Some(r.unknown_since.unwrap_or(now));
            }
        }
        Ok(true)
    }

    async fn work_item_backlog<'a>(
        &'a self,
        kind: Option<&'a str>,
    ) -> Result<EffectsStats, StoreError> {
        // The operator's counts, without the settled states.
        let all = operator::work_stats(&lock(&self.inner.work), kind);
        Ok(EffectsStats {
            succeeded: 0,
            failed: 0,
            ..all
        })
    }
}
