//! Maintenance of the [`MemoryStore`]: [`MaintenanceStore`] (the elected maintainer's
//! sessions, and the purges it runs).

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::StoreError;
use outbox_core::effect::WorkItemState;
use outbox_core::maintenance::{MaintenanceStore, Purge};

use super::{Lease, MemoryStore, WorkRow, chrono, lock};

/// The time `ago` before now: a purge's cutoff.
fn before(ago: Duration) -> DateTime<Utc> {
    Utc::now() - chrono(ago)
}

/// A purge's batch: the keys of the first `limit` entries `old` yields (none for a limit below
/// 1), cloned off the map they come from so that it can delete them.
fn first<'m, K: Clone + 'm, V: 'm>(
    old: impl Iterator<Item = (&'m K, &'m V)>,
    limit: i64,
) -> Vec<K> {
    old.take(usize::try_from(limit).unwrap_or(0))
        .map(|(k, _)| k.clone())
        .collect()
}

/// Deletes each key of a purge's batch with `delete`; returns how many it deleted.
fn purged<K>(batch: Vec<K>, delete: impl FnMut(&K)) -> u64 {
    batch.iter().for_each(delete);
    batch.len() as u64
}

/// A maintenance session of the [`MemoryStore`]; leadership ends when it is dropped.
#[derive(Debug)]
pub struct MemorySession {
    id: u64,
    store: MemoryStore,
}

impl Drop for MemorySession {
    fn drop(&mut self) {
        let mut leader = lock(&self.store.inner.leader);
        if *leader == Some(self.id) {
            *leader = None;
        }
    }
}

impl MaintenanceStore for MemoryStore {
    type Session = MemorySession;

    async fn maintenance_session(&self) -> Result<MemorySession, StoreError> {
        Ok(MemorySession {
            id: self.inner.sessions.fetch_add(1, Ordering::Relaxed),
            store: self.clone(),
        })
    }

    async fn maintainer_elect<'a>(
        &'a self,
        session: &'a mut MemorySession,
    ) -> Result<bool, StoreError> {
        let mut leader = lock(&self.inner.leader);
        match *leader {
            Some(id) => Ok(id == session.id),
            None => {
                *leader = Some(session.id);
                Ok(true)
            }
        }
    }

    async fn purge<'a>(
        &'a self,
        _session: &'a mut MemorySession,
        what: Purge,
        older_than: Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        // The inbox belongs to the consumer's transactions, which write their whole state back
        // on commit: wait for the open one.
        let _tx = match what {
            Purge::Inbox => Some(self.inner.tx_lock.lock().await),
            _ => None,
        };
        let cutoff = before(older_than);
        Ok(match what {
            Purge::Inbox => {
                let mut c = lock(&self.inner.consumer);
                let old = first(
                    c.inbox.iter().filter(|(_, r)| r.received_at < cutoff),
                    limit,
                );
                purged(old, |k| {
                    c.inbox.remove(k);
                    c.stale.remove(k);
                })
            }
            Purge::WorkItems => {
                let mut w = lock(&self.inner.work);
                let settled = |r: &WorkRow| {
                    r.state == WorkItemState::Succeeded && r.resolved_at.is_some_and(|t| t < cutoff)
                };
                let old = first(w.items.iter().filter(|(_, r)| settled(r)), limit);
                purged(old, |id| {
                    w.items.remove(id);
                })
            }
            // Nothing to purge: this fake deletes a row when it is published (delete mode only).
            Purge::Published => 0,
            Purge::Leases => {
                let mut o = lock(&self.inner.outbox);
                let reapable = |l: &Lease| l.until < cutoff && l.takeovers == 0;
                let old = first(o.leases.iter().filter(|(_, l)| reapable(l)), limit);
                purged(old, |k| {
                    o.leases.remove(k);
                })
            }
        })
    }
}
