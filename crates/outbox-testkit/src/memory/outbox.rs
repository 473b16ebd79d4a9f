//! The outbox side of the [`MemoryStore`]: the producer's writes, [`OutboxStore`] (claims,
//! relay leases, settling), and the relay leases a fixture ages.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::{
    ClaimParams, ClaimScope, ClaimedBatch, FailureParams, LeaseToken, MarkParams, NewMessage,
    OutboxMessage, OutboxStats, OutboxStore, ReleaseParams, StoreError, Takeover,
};

use super::{
    Lease, MemoryEnqueueError, MemoryStore, OutboxRow, OutboxState, RowState, age, chrono, lock,
};

/// The row of `m` under `id`: everything the producer wrote, moved out of a copy.
fn to_row(id: i64, m: &NewMessage) -> OutboxRow {
    OutboxRow {
        msg: m.clone().stored(id, Utc::now()),
        state: RowState::Pending,
        available_at: Utc::now(),
        last_error: None,
    }
}

impl MemoryStore {
    /// Writes outbox rows as one committed producer transaction.
    ///
    /// # Errors
    /// [`MemoryEnqueueError`]; nothing is written then.
    pub fn enqueue(&self, messages: &[NewMessage]) -> Result<(), MemoryEnqueueError> {
        let ids: Vec<i64> = messages
            .iter()
            .map(|_| self.inner.next_id.fetch_add(1, Ordering::Relaxed))
            .collect();
        self.insert_rows(&ids, messages)
    }

    /// Starts a producer transaction that takes its row ids now and becomes visible only at
    /// [`HeldEnqueue::commit`]: a transaction that commits after later ones, with lower ids.
    pub fn enqueue_held(&self, messages: Vec<NewMessage>) -> HeldEnqueue {
        let ids = messages
            .iter()
            .map(|_| self.inner.next_id.fetch_add(1, Ordering::Relaxed))
            .collect();
        HeldEnqueue {
            store: self.clone(),
            ids,
            messages,
        }
    }

    fn insert_rows(&self, ids: &[i64], messages: &[NewMessage]) -> Result<(), MemoryEnqueueError> {
        for m in messages {
            m.validate()?;
        }
        let mut o = lock(&self.inner.outbox);
        let mut seen_ids = HashSet::new();
        let mut seen_versions = HashSet::new();
        for m in messages {
            let version = (
                m.aggregate_type.clone(),
                m.aggregate_id.clone(),
                m.aggregate_version,
            );
            let id_taken = o.rows.values().any(|r| r.msg.event_id == m.event_id);
            if id_taken || !seen_ids.insert(m.event_id) {
                return Err(MemoryEnqueueError::DuplicateEventId(m.event_id));
            }
            let version_taken = o.rows.values().any(|r| {
                r.msg.aggregate_type == version.0
                    && r.msg.aggregate_id == version.1
                    && r.msg.aggregate_version == version.2
            });
            if version_taken || !seen_versions.insert(version.clone()) {
                return Err(MemoryEnqueueError::VersionConflict(
                    version.0, version.1, version.2,
                ));
            }
        }
        for (id, m) in ids.iter().zip(messages) {
            o.rows.insert(*id, to_row(*id, m));
        }
        drop(o);
        self.inner.wake.notify_waiters();
        Ok(())
    }

    /// Outbox rows not yet published (pending and dead).
    pub fn outbox_len(&self) -> usize {
        lock(&self.inner.outbox)
            .rows
            .values()
            .filter(|r| r.state != RowState::Published)
            .count()
    }

    /// Ends every live relay lease (as if the relay holding it stalled past it).
    pub fn expire_relay_leases(&self) {
        for lease in lock(&self.inner.outbox).leases.values_mut() {
            lease.until = Utc::now() - chrono::Duration::milliseconds(1);
        }
    }

    /// Moves every relay lease's end back by `by` (to test reaping).
    pub fn age_relay_leases(&self, by: Duration) {
        for lease in lock(&self.inner.outbox).leases.values_mut() {
            lease.until -= chrono(by);
        }
    }

    /// Relay leases held right now (live or expired).
    pub fn relay_lease_count(&self) -> usize {
        lock(&self.inner.outbox).leases.len()
    }
}

/// A producer transaction of [`MemoryStore::enqueue_held`], not yet committed.
#[derive(Debug)]
pub struct HeldEnqueue {
    store: MemoryStore,
    ids: Vec<i64>,
    messages: Vec<NewMessage>,
}

impl HeldEnqueue {
    /// The row ids taken at the start.
    pub fn ids(&self) -> &[i64] {
        &self.ids
    }

    /// Commits: the rows become visible.
    ///
    /// # Errors
    /// [`MemoryEnqueueError`].
    pub fn commit(self) -> Result<(), MemoryEnqueueError> {
        self.store.insert_rows(&self.ids, &self.messages)
    }
}

/// An aggregate: its type and id.
type Aggregate = (String, String);

impl OutboxStore for MemoryStore {
    /// A row whose route an operator paused is not handed out: an aggregate whose head is on
    /// a paused route waits, and a run stops before its first row on one (per-aggregate
    /// order), as the PostgreSQL claim does.
    async fn claim_batch(&self, p: ClaimParams) -> Result<ClaimedBatch, StoreError> {
        let token = self.token();
        let now = Utc::now();
        // Read before the outbox is locked (the operator's lock is taken last everywhere): a
        // pause holds from the next claim on.
        let paused_routes = lock(&self.inner.ops).paused_routes();
        let paused = |r: &OutboxRow| {
            !paused_routes.is_empty()
                && paused_routes.contains(&outbox_core::operator::route_key(
                    r.msg.destination.as_deref(),
                    &r.msg.aggregate_type,
                ))
        };
        let mut o = lock(&self.inner.outbox);
        let by_agg = unpublished_by_aggregate(&o);
        if p.scope == ClaimScope::TakeOver {
            drop_leases_with_nothing_to_take_over(&mut o, &by_agg, now, &paused);
        }
        let heads = claimable_heads(&o, by_agg, p.scope, now, &paused);
        let (mut messages, takeovers) = take_runs(&mut o, heads, &p, token, now, &paused);
        messages.sort_by(|a, b| {
            (&a.aggregate_type, &a.aggregate_id, a.aggregate_version).cmp(&(
                &b.aggregate_type,
                &b.aggregate_id,
                b.aggregate_version,
            ))
        });
        Ok(ClaimedBatch {
            token: LeaseToken(token),
            messages,
            takeovers,
            undecodable: Vec::new(),
            liveness: None,
        })
    }

    async fn mark_published(&self, p: MarkParams<'_>) -> Result<u64, StoreError> {
        let mut o = lock(&self.inner.outbox);
        let mut n = 0;
        for id in p.ids {
            let owned = o.rows.get(id).is_some_and(|r| {
                o.leases
                    .get(&(r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
                    .is_some_and(|l| l.token == p.token.0)
            });
            if owned {
                o.rows.remove(id);
                n += 1;
            }
        }
        Ok(n)
    }

    async fn record_failure(&self, p: FailureParams<'_>) -> Result<bool, StoreError> {
        let mut o = lock(&self.inner.outbox);
        let Some(agg) = o
            .rows
            .get(&p.id)
            .map(|r| (r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
        else {
            return Ok(false);
        };
        if o.leases.get(&agg).is_none_or(|l| l.token != p.token.0) {
            return Ok(false);
        }
        let r = o.rows.get_mut(&p.id).expect("checked above");
        r.msg.attempts += 1;
        r.last_error = Some(p.error.to_owned());
        match p.retry_after {
            Some(d) => r.available_at = Utc::now() + chrono(d),
            None => r.state = RowState::Dead,
        }
        Ok(true)
    }

    async fn release(&self, p: ReleaseParams<'_>) -> Result<u64, StoreError> {
        let mut o = lock(&self.inner.outbox);
        let before = o.leases.len();
        o.leases.retain(|_, l| l.token != p.token.0);
        Ok((before - o.leases.len()) as u64)
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let o = lock(&self.inner.outbox);
        let now = Utc::now();
        let mut s = OutboxStats::default();
        for r in o.rows.values() {
            match r.state {
                RowState::Pending => {
                    s.pending += 1;
                    if r.msg.attempts > 0 {
                        s.retrying += 1;
                    }
                    let leased = o
                        .leases
                        .get(&(r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
                        .is_some_and(|l| l.until > now);
                    if leased {
                        s.in_flight += 1;
                    }
                    let a = age(r.msg.created_at);
                    s.oldest_pending_age = Some(s.oldest_pending_age.map_or(a, |o| o.max(a)));
                }
                RowState::Dead => s.dead += 1,
                RowState::Published => s.published_retained += 1,
            }
        }
        Ok(s)
    }

    async fn wait_for_work(&self, timeout: Duration) {
        let _ = tokio::time::timeout(timeout, self.inner.wake.notified()).await;
    }
}

/// Per aggregate, its unpublished rows (in id order).
fn unpublished_by_aggregate(o: &OutboxState) -> BTreeMap<Aggregate, Vec<i64>> {
    let mut by_agg: BTreeMap<Aggregate, Vec<i64>> = BTreeMap::new();
    for (id, r) in &o.rows {
        if r.state != RowState::Published {
            by_agg
                .entry((r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
                .or_default()
                .push(*id);
        }
    }
    by_agg
}

/// A takeover claim's first step: expired leases with nothing to take over go (no unpublished
/// row left, a dead head, a head in backoff, a head on a paused route: its count starts again).
fn drop_leases_with_nothing_to_take_over(
    o: &mut OutboxState,
    by_agg: &BTreeMap<Aggregate, Vec<i64>>,
    now: DateTime<Utc>,
    paused: &impl Fn(&OutboxRow) -> bool,
) {
    let rows = &o.rows;
    let takeable = |ids: &Vec<i64>| {
        ids.iter()
            .map(|id| &rows[id])
            .min_by_key(|r| r.msg.aggregate_version)
            .is_some_and(|h| h.state == RowState::Pending && h.available_at <= now && !paused(h))
    };
    let keep: HashSet<Aggregate> = by_agg
        .iter()
        .filter(|(_, ids)| takeable(ids))
        .map(|(agg, _)| agg.clone())
        .collect();
    o.leases
        .retain(|agg, l| l.until > now || l.takeovers == 0 || keep.contains(agg));
}

/// The aggregates whose head `scope` may claim now, each with its unpublished rows in version
/// order, in the order they are taken: by head row, or (a takeover) the one whose lease expired
/// first, its head alone.
fn claimable_heads(
    o: &OutboxState,
    by_agg: BTreeMap<Aggregate, Vec<i64>>,
    scope: ClaimScope,
    now: DateTime<Utc>,
    paused: &impl Fn(&OutboxRow) -> bool,
) -> Vec<(Aggregate, Vec<i64>)> {
    let mut heads: Vec<(Aggregate, Vec<i64>)> = Vec::new();
    for (agg, mut ids) in by_agg {
        ids.sort_by_key(|id| o.rows[id].msg.aggregate_version);
        let head = &o.rows[&ids[0]];
        let lease = o.leases.get(&agg);
        let eligible = match scope {
            ClaimScope::All => lease.is_none_or(|l| l.until <= now),
            ClaimScope::Free => lease.is_none_or(|l| l.until <= now && l.takeovers == 0),
            ClaimScope::TakeOver => lease.is_some_and(|l| l.until <= now && l.takeovers > 0),
        };
        if head.state == RowState::Pending && head.available_at <= now && eligible && !paused(head)
        {
            heads.push((agg, ids));
        }
    }
    if scope == ClaimScope::TakeOver {
        // One aggregate, its head alone: the lease that expired first.
        heads.sort_by_key(|(agg, ids)| (o.leases[agg].until, ids[0]));
        heads.truncate(1);
        for (_, ids) in &mut heads {
            ids.truncate(1);
        }
    } else {
        heads.sort_by_key(|(_, ids)| ids[0]);
    }
    heads
}

/// Takes each head's run (up to the caps, stopping before a row that is not pending or on a
/// paused route) under a new lease of `token`; returns the rows and the takeovers.
fn take_runs(
    o: &mut OutboxState,
    heads: Vec<(Aggregate, Vec<i64>)>,
    p: &ClaimParams,
    token: i64,
    now: DateTime<Utc>,
    paused: &impl Fn(&OutboxRow) -> bool,
) -> (Vec<OutboxMessage>, Vec<Takeover>) {
    let mut messages = Vec::new();
    let mut takeovers = Vec::new();
    for (agg, ids) in heads {
        if messages.len() >= p.max_rows {
            break;
        }
        let head = ids[0];
        // Only expired leases are left on the aggregates seen here: taking one over.
        let count = match o.leases.get(&agg) {
            Some(old) if old.head == head => old.takeovers + 1,
            Some(_) => 1,
            None => 0,
        };
        if count > 0 {
            takeovers.push(Takeover {
                head,
                count,
                orphaned_for: None,
            });
        }
        for (taken, id) in ids.into_iter().enumerate() {
            let r = &o.rows[&id];
            if r.state != RowState::Pending
                || paused(r)
                || taken >= p.max_per_aggregate
                || messages.len() >= p.max_rows
            {
                break;
            }
            messages.push(r.msg.clone());
        }
        o.leases.insert(
            agg,
            Lease {
                token,
                until: now + chrono(p.lease),
                head,
                takeovers: count,
            },
        );
    }
    (messages, takeovers)
}
