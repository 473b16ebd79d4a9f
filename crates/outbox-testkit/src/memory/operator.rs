//! The operator contract ([`outbox_core::operator`]) for the [`MemoryStore`], with the same
//! refusals, counts and audit records as the PostgreSQL store, as far as the fake models the
//! data.
//!
//! Every action changes the store and appends its [`AuditEntry`] under the same locks (the
//! data's, then the operator state's, always in that order: outbox, consumer side, work items,
//! operator state), so a reader never sees one without the other; a refused action changes
//! nothing, records nothing, and is logged ([`log_action`]). Actions on the consumer side also
//! hold the transaction lock, as a consumer's transaction would, so that no open transaction
//! commits over them.
//!
//! What the fake does not model, and what it answers instead (what an empty database answers):
//!
//! * **Heartbeats and activity**: no process reports to it, so [`ProcessOps::instances`] is
//!   empty, every consumer has no instance up and no lag, and every per-minute series is zeros.
//! * **Kept published rows**: it deletes a row when it is published (delete mode), so
//!   `published_retained` is 0 and every replay is refused (`Refused`), as the PostgreSQL store
//!   refuses it in delete mode.
//! * **Roles**: every caller may read and act (no `PermissionDenied`); the audit's `db_role` is
//!   [`DB_ROLE`].
//! * **Log-streaming relays**: there are none, so a route pause is never refused for one.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use chrono::{DateTime, Utc};
use outbox_core::EventId;
use outbox_core::consumer::{ConsumerDeadLetterState, RawMessage};
use outbox_core::effect::{EffectsStats, WorkItemState};
use outbox_core::operator::{
    Actor, AggregateTrace, AuditEntry, AuditOps, ConflictDetail, ConflictOps, ConflictView,
    ConflictsResolved, ConsumerDeadLetterDetail, ConsumerDeadLetterGroup, ConsumerDeadLetterGroups,
    ConsumerDeadLetterView, ConsumerProgress, ConsumerSelection, ConsumerView, Counting,
    DeadLetterDetail, DeadLetterFilter, DeadLetterGroup, DeadLetterGroups, DeadLetterOps,
    DeadLetterSelection, DeadLetterView, Discarded, DiscardedEvent, EventTrace, GROUP_SCAN,
    InboxRecord, Instance, MAX_LIST, MINUTES, OperatorError, Overview, OverviewOps, Pause,
    PauseOps, PauseTarget, PayloadView, ProcessOps, RangePlan, RangeSelection, ReplayOps,
    ReplayPlan, ReplaySelection, Resolution, RouteView, Routes, TraceOps, TracedEvent, WorkItemOps,
    WorkItemRow, WorkItems, check_bound, check_limit, log_action, reason_key, require_reason,
    route_key,
};
use serde_json::Value;

use super::{
    ConflictRow, DeadLetterRow, MemoryStore, OutboxRow, RowState, WorkRow, WorkState, age, lock,
};

/// The database role the audit records name: the fake has no roles.
pub const DB_ROLE: &str = "memory";

/// The schema the overview names: the fake has no schema.
const SCHEMA: &str = "memory";

/// Why every replay is refused.
const NO_PUBLISHED_ROWS: &str = "the memory store keeps no published events (it deletes a row \
    when it is published, as delete mode does): nothing can be replayed from it; replay from the \
    broker's retention";

/// A pause in force.
#[derive(Debug, Clone)]
struct PauseRow {
    paused_at: DateTime<Utc>,
    /// Its audit record (0 for a test's shortcut, [`MemoryStore::set_consumer_paused`]).
    audit_id: i64,
}

/// A discarded dead letter, kept whole with the audit record of its discard.
#[derive(Debug, Clone)]
struct Discard {
    row: OutboxRow,
    discarded_at: DateTime<Utc>,
    audit_id: i64,
}

/// What the operator contract adds to the store: the audit records (append-only, ids
/// increasing), the pauses in force and the discarded events. Locked last.
#[derive(Debug, Default)]
pub(super) struct OpsState {
    audit: Vec<AuditEntry>,
    /// By (kind, name): `route` or `consumer`, and the route's key or the consumer's name.
    pauses: BTreeMap<(&'static str, String), PauseRow>,
    discarded: Vec<Discard>,
}

impl OpsState {
    /// The keys of the paused routes.
    pub(super) fn paused_routes(&self) -> HashSet<String> {
        self.pauses
            .keys()
            .filter(|(kind, _)| *kind == "route")
            .map(|(_, name)| name.clone())
            .collect()
    }

    /// Whether the consumer `name` is paused.
    pub(super) fn consumer_paused(&self, name: &str) -> bool {
        self.pauses.contains_key(&("consumer", name.to_owned()))
    }

    /// Pauses or resumes the consumer `name` without an audit record (a test's shortcut).
    pub(super) fn set_consumer_paused(&mut self, name: &str, paused: bool) {
        let key = ("consumer", name.to_owned());
        if paused {
            self.pauses.entry(key).or_insert(PauseRow {
                paused_at: Utc::now(),
                audit_id: 0,
            });
        } else {
            self.pauses.remove(&key);
        }
    }

    /// Appends the record of an action; returns its id.
    fn record(
        &mut self,
        actor: &Actor,
        action: &str,
        selection: &Value,
        reason: &str,
        affected: u64,
    ) -> i64 {
        let id = self.audit.last().map_or(1, |a| a.id + 1);
        self.audit.push(AuditEntry {
            id,
            at: Utc::now(),
            actor: actor.name().to_owned(),
            via: actor.via().to_owned(),
            credential: actor.credential().map(str::to_owned),
            db_role: DB_ROLE.to_owned(),
            action: action.to_owned(),
            selection: selection.clone(),
            reason: reason.to_owned(),
            affected: i64::try_from(affected).unwrap_or(i64::MAX),
        });
        id
    }

    /// The record `id`, if any.
    fn entry(&self, id: i64) -> Option<&AuditEntry> {
        self.audit
            .binary_search_by_key(&id, |a| a.id)
            .ok()
            .map(|i| &self.audit[i])
    }
}

/// Logs the outcome of an action ([`log_action`]), `affected` telling the rows it changed.
fn logged<T>(
    actor: &Actor,
    action: &str,
    selection: &Value,
    reason: &str,
    result: Result<T, OperatorError>,
    affected: impl FnOnce(&T) -> u64,
) -> Result<T, OperatorError> {
    log_action(
        actor,
        action,
        selection,
        reason,
        result.as_ref().map(affected),
    );
    result
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn row_reason(r: &OutboxRow) -> String {
    reason_key(r.last_error.as_deref())
}

/// Whether the outbox row `r` is a dead letter `which` selects.
fn selects(which: &DeadLetterSelection, r: &OutboxRow) -> bool {
    r.state == RowState::Dead
        && match which {
            DeadLetterSelection::Ids(ids) => ids.contains(&r.msg.event_id),
            DeadLetterSelection::Matching(f) => matches_filter(f, r),
            DeadLetterSelection::All => true,
        }
}

fn matches_filter(f: &DeadLetterFilter, r: &OutboxRow) -> bool {
    f.matches(
        &r.msg.aggregate_type,
        &r.msg.event_type,
        r.msg.destination.as_deref(),
        &row_reason(r),
        r.msg.created_at,
    )
}

/// Whether the consumer dead letter `d` (id `id`) matches `which` (its state aside).
fn consumer_selects(which: &ConsumerSelection, id: i64, d: &DeadLetterRow) -> bool {
    which.consumer.as_deref().is_none_or(|c| c == d.consumer)
        && which.ids.as_ref().is_none_or(|ids| ids.contains(&id))
        && which
            .reason_group
            .as_deref()
            .is_none_or(|r| r == reason_key(Some(&d.error)))
}

fn is_open(d: &DeadLetterRow) -> bool {
    d.state != ConsumerDeadLetterState::Resolved
}

fn dead_letter_view(rows: &BTreeMap<i64, OutboxRow>, r: &OutboxRow) -> DeadLetterView {
    let m = &r.msg;
    let blocked_behind = rows
        .values()
        .filter(|b| {
            b.state == RowState::Pending
                && b.msg.aggregate_type == m.aggregate_type
                && b.msg.aggregate_id == m.aggregate_id
                && b.msg.aggregate_version > m.aggregate_version
        })
        .count();
    DeadLetterView {
        event_id: m.event_id,
        aggregate_type: m.aggregate_type.clone(),
        aggregate_id: m.aggregate_id.clone(),
        aggregate_version: m.aggregate_version,
        event_type: m.event_type.clone(),
        attempts: m.attempts,
        last_error: r.last_error.clone(),
        created_at: m.created_at,
        blocked_behind: count(blocked_behind),
        destination: m.destination.clone(),
        content_type: m.payload.content_type.0.clone(),
        schema_version: m.schema_version,
        reason: row_reason(r),
    }
}

fn state_name(state: RowState) -> &'static str {
    match state {
        RowState::Pending => "pending",
        RowState::Dead => "dead",
        RowState::Published => "published",
    }
}

fn traced(r: &OutboxRow) -> TracedEvent {
    let m = &r.msg;
    TracedEvent {
        id: m.id,
        event_id: m.event_id,
        aggregate_type: m.aggregate_type.clone(),
        aggregate_id: m.aggregate_id.clone(),
        aggregate_version: m.aggregate_version,
        event_type: m.event_type.clone(),
        schema_version: m.schema_version,
        content_type: m.payload.content_type.0.clone(),
        payload_sha256: m.fingerprint.to_hex(),
        destination: m.destination.clone(),
        partition_key: m.partition_key.clone(),
        created_at: m.created_at,
        state: state_name(r.state).to_owned(),
        attempts: m.attempts,
        available_at: r.available_at,
        last_error: r.last_error.clone(),
        // Never set: a published row is deleted.
        published_at: None,
    }
}

fn discarded_event(d: &Discard) -> DiscardedEvent {
    let m = &d.row.msg;
    DiscardedEvent {
        event_id: m.event_id,
        aggregate_type: m.aggregate_type.clone(),
        aggregate_id: m.aggregate_id.clone(),
        aggregate_version: m.aggregate_version,
        event_type: m.event_type.clone(),
        created_at: m.created_at,
        attempts: m.attempts,
        last_error: d.row.last_error.clone(),
        discarded_at: d.discarded_at,
        audit_id: d.audit_id,
    }
}

fn conflict_view(c: &ConflictRow, ops: &OpsState) -> ConflictView {
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

fn work_item_row(r: &WorkRow) -> WorkItemRow {
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
pub(super) fn work_stats(w: &WorkState, kind: Option<&str>) -> EffectsStats {
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

/// Text a PostgreSQL text column can hold: NUL shows as U+FFFD (what the PostgreSQL store
/// shows of a consumer dead letter's headers).
fn readable(s: &str) -> String {
    s.replace('\0', "\u{FFFD}")
}

/// A received message's headers as one JSON object of text (binary values lossily).
fn headers_json(raw: &RawMessage) -> Value {
    let map: BTreeMap<String, String> = raw
        .headers
        .iter()
        .map(|(k, v)| (readable(k), readable(v)))
        .chain(
            raw.binary_headers
                .iter()
                .map(|(k, v)| (readable(k), readable(&String::from_utf8_lossy(v)))),
        )
        .collect();
    serde_json::to_value(map).unwrap_or_default()
}

impl OverviewOps for MemoryStore {
    /// Always ready: the fake has no connection and no schema to check.
    async fn ready(&self) -> Result<(), OperatorError> {
        Ok(())
    }

    /// The overview numbers; the schema is named `memory`, and `published_retained` is 0 (the
    /// fake deletes a row when it is published).
    async fn overview_counting(&self, counting: Counting) -> Result<Overview, OperatorError> {
        let bound = match counting {
            Counting::Exact => None,
            Counting::UpTo(bound) => {
                check_bound("overview", bound)?;
                Some(bound)
            }
        };
        let cap = |n: i64| bound.map_or(n, |b| n.min(b));
        let now = Utc::now();
        let (mut pending, mut in_flight, mut retrying, mut dead, mut published) = (0, 0, 0, 0, 0);
        let mut oldest: Option<std::time::Duration> = None;
        {
            let o = lock(&self.inner.outbox);
            for r in o.rows.values() {
                match r.state {
                    RowState::Pending => {
                        pending += 1;
                        retrying += i64::from(r.msg.attempts > 0);
                        let leased = o
                            .leases
                            .get(&(r.msg.aggregate_type.clone(), r.msg.aggregate_id.clone()))
                            .is_some_and(|l| l.until > now);
                        in_flight += i64::from(leased);
                        let a = age(r.msg.created_at);
                        oldest = match (bound, oldest) {
                            // Bounded: the age of the first pending row in the table's order.
                            (Some(_), Some(first)) => Some(first),
                            (_, o) => Some(o.map_or(a, |o| o.max(a))),
                        };
                    }
                    RowState::Dead => dead += 1,
                    RowState::Published => published += 1,
                }
            }
        }
        let (inbox_conflicts, consumer_dead_letters) = {
            let c = lock(&self.inner.consumer);
            (
                count(
                    c.conflicts
                        .iter()
                        .filter(|c| c.resolved_at.is_none())
                        .count(),
                ),
                count(c.dead.values().filter(|d| is_open(d)).count()),
            )
        };
        let effects = work_stats(&lock(&self.inner.work), None);
        Ok(Overview {
            schema: SCHEMA.to_owned(),
            counted_up_to: bound,
            pending: cap(pending),
            oldest_pending_age_seconds: oldest.map_or(0.0, |d| d.as_secs_f64()),
            in_flight: cap(in_flight),
            retrying: cap(retrying),
            dead_letters: cap(dead),
            published_retained: cap(published),
            inbox_conflicts,
            consumer_dead_letters,
            work_items: WorkItems {
                pending: effects.pending,
                in_progress: effects.in_progress,
                unknown: effects.unknown,
                oldest_unknown_age_seconds: effects
                    .oldest_unknown_age
                    .map_or(0.0, |d| d.as_secs_f64()),
                failed: cap(effects.failed),
            },
        })
    }
}

impl DeadLetterOps for MemoryStore {
    async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<DeadLetterView>, OperatorError> {
        check_limit("dead letters", limit)?;
        let o = lock(&self.inner.outbox);
        Ok(o.rows
            .values()
            .filter(|r| r.state == RowState::Dead && matches_filter(filter, r))
            .take(usize::try_from(limit).unwrap_or(0))
            .map(|r| dead_letter_view(&o.rows, r))
            .collect())
    }

    async fn dead_letter_groups(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<DeadLetterGroups, OperatorError> {
        struct Acc {
            count: i64,
            first: DateTime<Utc>,
            last: DateTime<Utc>,
            types: BTreeSet<String>,
            events: BTreeSet<String>,
            example: Option<String>,
        }
        let mut by_reason: BTreeMap<String, Acc> = BTreeMap::new();
        let mut read = 0;
        {
            let o = lock(&self.inner.outbox);
            let scan = usize::try_from(GROUP_SCAN).unwrap_or(usize::MAX);
            for r in o
                .rows
                .values()
                .filter(|r| r.state == RowState::Dead && matches_filter(filter, r))
                .take(scan)
            {
                read += 1;
                let at = r.msg.created_at;
                let acc = by_reason.entry(row_reason(r)).or_insert_with(|| Acc {
                    count: 0,
                    first: at,
                    last: at,
                    types: BTreeSet::new(),
                    events: BTreeSet::new(),
                    // The oldest one's (rows are read in the table's order).
                    example: r.last_error.clone(),
                });
                acc.count += 1;
                acc.first = acc.first.min(at);
                acc.last = acc.last.max(at);
                acc.types.insert(r.msg.aggregate_type.clone());
                acc.events.insert(r.msg.event_type.clone());
            }
        }
        let mut groups: Vec<DeadLetterGroup> = by_reason
            .into_iter()
            .map(|(reason, a)| DeadLetterGroup {
                reason,
                count: a.count,
                first_created_at: a.first,
                last_created_at: a.last,
                aggregate_types: a.types.into_iter().take(10).collect(),
                event_types: a.events.into_iter().take(10).collect(),
                example_error: a.example,
            })
            .collect();
        // Largest first, then by reason (the map's order; the sort is stable).
        groups.sort_by_key(|g| std::cmp::Reverse(g.count));
        Ok(DeadLetterGroups {
            groups,
            complete: read < GROUP_SCAN,
        })
    }

    async fn dead_letter(&self, event_id: EventId) -> Result<DeadLetterDetail, OperatorError> {
        let o = lock(&self.inner.outbox);
        let r = o
            .rows
            .values()
            .find(|r| r.state == RowState::Dead && r.msg.event_id == event_id)
            .ok_or_else(|| {
                OperatorError::not_found(
                    "dead letter",
                    format!("{event_id} is not an outbox dead letter"),
                )
            })?;
        Ok(DeadLetterDetail {
            dead_letter: dead_letter_view(&o.rows, r),
            payload: PayloadView::of(r.msg.payload.bytes.to_vec()),
            headers: serde_json::to_value(&r.msg.headers).unwrap_or_default(),
            partition_key: r.msg.partition_key.clone(),
        })
    }

    async fn requeue_dead_letters(
        &self,
        which: &DeadLetterSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<u64, OperatorError> {
        const OP: &str = "requeue dead letters";
        let selection = which.audit_selection();
        let n = {
            let mut o = lock(&self.inner.outbox);
            let now = Utc::now();
            let mut n = 0;
            for r in o.rows.values_mut().filter(|r| selects(which, r)) {
                r.state = RowState::Pending;
                r.msg.attempts = 0;
                r.available_at = now;
                n += 1;
            }
            lock(&self.inner.ops).record(actor, OP, &selection, reason, n);
            n
        };
        if n > 0 {
            self.inner.wake.notify_waiters();
        }
        logged(actor, OP, &selection, reason, Ok(n), |n| *n)
    }

    async fn discard_dead_letters(
        &self,
        which: &DeadLetterSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<Discarded, OperatorError> {
        const OP: &str = "discard dead letters";
        let selection = which.audit_selection();
        let result = require_reason(OP, reason).map(|()| {
            let mut o = lock(&self.inner.outbox);
            let ids: Vec<i64> = o
                .rows
                .iter()
                .filter(|(_, r)| selects(which, r))
                .map(|(id, _)| *id)
                .collect();
            let removed: Vec<OutboxRow> = ids.iter().filter_map(|id| o.rows.remove(id)).collect();
            let discarded = removed.len() as u64;
            let mut ops = lock(&self.inner.ops);
            let audit_id = ops.record(actor, OP, &selection, reason, discarded);
            let discarded_at = Utc::now();
            ops.discarded.extend(removed.into_iter().map(|row| Discard {
                row,
                discarded_at,
                audit_id,
            }));
            Discarded {
                discarded,
                audit_id,
            }
        });
        // The events that waited behind the discarded ones may be claimed now.
        if result.as_ref().is_ok_and(|d| d.discarded > 0) {
            self.inner.wake.notify_waiters();
        }
        logged(actor, OP, &selection, reason, result, |d| d.discarded)
    }

    async fn consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        limit: i64,
    ) -> Result<Vec<ConsumerDeadLetterView>, OperatorError> {
        check_limit("consumer dead letters", limit)?;
        let c = lock(&self.inner.consumer);
        Ok(c.dead
            .iter()
            .filter(|(id, d)| is_open(d) && consumer_selects(which, **id, d))
            .take(usize::try_from(limit).unwrap_or(0))
            .map(|(id, d)| ConsumerDeadLetterView {
                dead_letter: d.view(*id),
                reason: reason_key(Some(&d.error)),
            })
            .collect())
    }

    async fn consumer_dead_letter_groups(
        &self,
        which: &ConsumerSelection,
    ) -> Result<ConsumerDeadLetterGroups, OperatorError> {
        let mut by_key: BTreeMap<(String, String), ConsumerDeadLetterGroup> = BTreeMap::new();
        let mut read = 0;
        {
            let c = lock(&self.inner.consumer);
            let scan = usize::try_from(GROUP_SCAN).unwrap_or(usize::MAX);
            for (_, d) in c
                .dead
                .iter()
                .filter(|(id, d)| is_open(d) && consumer_selects(which, **id, d))
                .take(scan)
            {
                read += 1;
                let key = (d.consumer.clone(), reason_key(Some(&d.error)));
                let g = by_key
                    .entry(key.clone())
                    .or_insert_with(|| ConsumerDeadLetterGroup {
                        consumer_name: key.0,
                        reason: key.1,
                        count: 0,
                        first_at: d.created_at,
                        last_at: d.created_at,
                        example_error: d.error.clone(),
                    });
                g.count += 1;
                g.first_at = g.first_at.min(d.created_at);
                g.last_at = g.last_at.max(d.created_at);
            }
        }
        let mut groups: Vec<ConsumerDeadLetterGroup> = by_key.into_values().collect();
        groups.sort_by_key(|g| std::cmp::Reverse(g.count));
        Ok(ConsumerDeadLetterGroups {
            groups,
            complete: read < GROUP_SCAN,
        })
    }

    async fn consumer_dead_letter(
        &self,
        id: i64,
    ) -> Result<ConsumerDeadLetterDetail, OperatorError> {
        let c = lock(&self.inner.consumer);
        let d = c.dead.get(&id).ok_or_else(|| {
            OperatorError::not_found(
                "consumer dead letter",
                format!("no consumer dead letter {id}"),
            )
        })?;
        Ok(ConsumerDeadLetterDetail {
            dead_letter: ConsumerDeadLetterView {
                dead_letter: d.view(id),
                reason: reason_key(Some(&d.error)),
            },
            payload: PayloadView::of(d.raw.payload.to_vec()),
            headers: headers_json(&d.raw),
            content_type: d.raw.content_type.as_deref().map(readable),
        })
    }

    async fn requeue_consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<u64, OperatorError> {
        const OP: &str = "requeue consumer dead letters";
        self.consumer_action(OP, ConsumerDeadLetterState::Requeued, which, actor, reason)
            .await
    }

    async fn discard_consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<u64, OperatorError> {
        const OP: &str = "discard consumer dead letters";
        let selection = serde_json::to_value(which).unwrap_or_default();
        if let Err(e) = require_reason(OP, reason) {
            return logged(actor, OP, &selection, reason, Err(e), |n: &u64| *n);
        }
        self.consumer_action(OP, ConsumerDeadLetterState::Resolved, which, actor, reason)
            .await
    }
}

impl MemoryStore {
    /// Moves the consumer dead letters `which` selects from `dead` to `to`, with the audit
    /// record, under the transaction lock (no consumer transaction is open meanwhile).
    async fn consumer_action(
        &self,
        operation: &'static str,
        to: ConsumerDeadLetterState,
        which: &ConsumerSelection,
        actor: &Actor,
        reason: &str,
    ) -> Result<u64, OperatorError> {
        let selection = serde_json::to_value(which).unwrap_or_default();
        let _tx = self.inner.tx_lock.lock().await;
        let n = {
            let mut guard = lock(&self.inner.consumer);
            let c = &mut *guard;
            c.updates += 1;
            let stamp = c.updates;
            let mut n = 0;
            for (id, d) in c.dead.iter_mut() {
                if d.state == ConsumerDeadLetterState::Dead && consumer_selects(which, *id, d) {
                    d.state = to;
                    d.updated = stamp;
                    n += 1;
                }
            }
            lock(&self.inner.ops).record(actor, operation, &selection, reason, n);
            n
        };
        logged(actor, operation, &selection, reason, Ok(n), |n| *n)
    }
}

impl ConflictOps for MemoryStore {
    async fn conflicts(
        &self,
        event_id: Option<EventId>,
        open_only: bool,
        limit: i64,
    ) -> Result<Vec<ConflictView>, OperatorError> {
        check_limit("conflicts", limit)?;
        let mut rows: Vec<ConflictRow> = lock(&self.inner.consumer)
            .conflicts
            .iter()
            .filter(|c| event_id.is_none_or(|e| e == c.event_id))
            .filter(|c| !open_only || c.resolved_at.is_none())
            .cloned()
            .collect();
        rows.sort_by_key(|c| std::cmp::Reverse(c.id));
        rows.truncate(usize::try_from(limit).unwrap_or(0));
        let ops = lock(&self.inner.ops);
        Ok(rows.iter().map(|c| conflict_view(c, &ops)).collect())
    }

    async fn resolve_conflicts(
        &self,
        ids: &[i64],
        actor: &Actor,
        reason: &str,
    ) -> Result<ConflictsResolved, OperatorError> {
        const OP: &str = "resolve conflicts";
        let selection = serde_json::json!({ "conflicts": ids });
        let max = usize::try_from(MAX_LIST).unwrap_or(usize::MAX);
        let checked = if ids.is_empty() || ids.len() > max {
            Err(OperatorError::invalid(
                OP,
                format!("give 1 to {MAX_LIST} conflict ids, not {}", ids.len()),
            ))
        } else {
            require_reason(OP, reason)
        };
        if let Err(e) = checked {
            return logged(actor, OP, &selection, reason, Err(e), |r| r.resolved);
        }
        let _tx = self.inner.tx_lock.lock().await;
        let result = {
            let mut c = lock(&self.inner.consumer);
            let open: Vec<usize> = (0..c.conflicts.len())
                .filter(|i| {
                    let x = &c.conflicts[*i];
                    ids.contains(&x.id) && x.resolved_at.is_none()
                })
                .collect();
            if open.is_empty() && !c.conflicts.iter().any(|x| ids.contains(&x.id)) {
                Err(OperatorError::not_found(
                    OP,
                    format!("none of the ids {ids:?} is an inbox conflict"),
                ))
            } else {
                // Recorded even when every id was resolved already: every action is audited.
                let resolved = open.len() as u64;
                let audit_id =
                    lock(&self.inner.ops).record(actor, OP, &selection, reason, resolved);
                let now = Utc::now();
                for i in open {
                    c.conflicts[i].resolved_at = Some(now);
                    c.conflicts[i].resolved_audit_id = Some(audit_id);
                }
                Ok(ConflictsResolved { resolved, audit_id })
            }
        };
        logged(actor, OP, &selection, reason, result, |r| r.resolved)
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

impl WorkItemOps for MemoryStore {
    async fn work_item_stats(&self, kind: Option<&str>) -> Result<EffectsStats, OperatorError> {
        Ok(work_stats(&lock(&self.inner.work), kind))
    }

    async fn work_items(
        &self,
        state: Option<&str>,
        limit: i64,
    ) -> Result<Vec<WorkItemRow>, OperatorError> {
        check_limit("work items", limit)?;
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
            .take(usize::try_from(limit).unwrap_or(0))
            .map(work_item_row)
            .collect())
    }

    async fn resolve_work_item(
        &self,
        id: i64,
        resolution: Resolution,
        actor: &Actor,
        reason: &str,
    ) -> Result<WorkItemRow, OperatorError> {
        const OP: &str = "resolve work item";
        let selection = serde_json::json!({ "work_item": id, "resolution": resolution.name() });
        let result = {
            let mut w = lock(&self.inner.work);
            match w.items.get_mut(&id) {
                None => Err(OperatorError::not_found(
                    OP,
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
                        lock(&self.inner.ops).record(actor, OP, &selection, reason, 1);
                        Ok(work_item_row(r))
                    } else {
                        Err(OperatorError::refused(
                            OP,
                            format!(
                                "work item {id} is `{}`: {} is not allowed from this state",
                                r.state.as_str(),
                                resolution.name()
                            ),
                        ))
                    }
                }
            }
        };
        logged(actor, OP, &selection, reason, result, |_| 1)
    }

    async fn reconcile_work_item(
        &self,
        id: i64,
        actor: &Actor,
        reason: &str,
    ) -> Result<(), OperatorError> {
        const OP: &str = "reconcile work item";
        let selection = serde_json::json!({ "work_item": id });
        let result = {
            let mut w = lock(&self.inner.work);
            match w.items.get_mut(&id) {
                None => Err(OperatorError::not_found(OP, format!("no work item {id}"))),
                Some(r) if r.state == WorkItemState::Unknown => {
                    let now = Utc::now();
                    r.next_attempt_at = now;
                    r.updated_at = now;
                    lock(&self.inner.ops).record(actor, OP, &selection, reason, 1);
                    Ok(())
                }
                Some(r) => Err(OperatorError::refused(
                    OP,
                    format!(
                        "work item {id} is {}: only an unknown outcome is reconciled",
                        r.state.as_str()
                    ),
                )),
            }
        };
        logged(actor, OP, &selection, reason, result, |()| 1)
    }
}

impl AuditOps for MemoryStore {
    async fn audit(
        &self,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<AuditEntry>, OperatorError> {
        check_limit("audit", limit)?;
        Ok(lock(&self.inner.ops)
            .audit
            .iter()
            .rev()
            .filter(|a| before.is_none_or(|b| a.id < b))
            .take(usize::try_from(limit).unwrap_or(0))
            .cloned()
            .collect())
    }
}

impl TraceOps for MemoryStore {
    async fn trace_event(&self, event_id: EventId) -> Result<EventTrace, OperatorError> {
        let outbox = lock(&self.inner.outbox)
            .rows
            .values()
            .find(|r| r.msg.event_id == event_id)
            .map(traced);
        let (mut inbox, conflicts, consumer_dead_letters) = {
            let c = lock(&self.inner.consumer);
            let inbox: Vec<InboxRecord> = c
                .inbox
                .iter()
                .filter(|((_, e), _)| *e == event_id)
                .map(|(key, row)| InboxRecord {
                    consumer_name: key.0.clone(),
                    payload_sha256: row.fingerprint.to_hex(),
                    outcome: if c.stale.contains(key) {
                        "stale"
                    } else {
                        "applied"
                    }
                    .to_owned(),
                    received_at: row.received_at,
                    aggregate_version: row.aggregate_version,
                })
                .collect();
            let mut conflicts: Vec<ConflictRow> = c
                .conflicts
                .iter()
                .filter(|x| x.event_id == event_id)
                .cloned()
                .collect();
            conflicts.sort_by_key(|c| std::cmp::Reverse(c.id));
            let dead = c
                .dead
                .iter()
                .filter(|(_, d)| d.identity.event_id == Some(event_id))
                .map(|(id, d)| d.view(*id))
                .collect();
            (inbox, conflicts, dead)
        };
        inbox.sort_by(|a, b| {
            (a.received_at, &a.consumer_name).cmp(&(b.received_at, &b.consumer_name))
        });
        let work_items = lock(&self.inner.work)
            .items
            .values()
            .filter(|r| r.item.event_id == Some(event_id))
            .map(work_item_row)
            .collect();
        let ops = lock(&self.inner.ops);
        let discards: Vec<&Discard> = ops
            .discarded
            .iter()
            .filter(|d| d.row.msg.event_id == event_id)
            .collect();
        let discard_audits: HashSet<i64> = discards.iter().map(|d| d.audit_id).collect();
        let id_text = event_id.to_string();
        let names = |a: &AuditEntry| {
            a.selection
                .get("event_ids")
                .and_then(Value::as_array)
                .is_some_and(|ids| ids.iter().any(|v| v.as_str() == Some(&id_text)))
        };
        let audit = ops
            .audit
            .iter()
            .rev()
            .filter(|a| names(a) || discard_audits.contains(&a.id))
            .take(100)
            .cloned()
            .collect();
        Ok(EventTrace {
            event_id,
            outbox,
            discarded: discards
                .iter()
                .max_by_key(|d| d.audit_id)
                .map(|d| discarded_event(d)),
            inbox,
            conflicts: conflicts.iter().map(|c| conflict_view(c, &ops)).collect(),
            consumer_dead_letters,
            work_items,
            audit,
        })
    }

    async fn trace_aggregate(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        limit: i64,
    ) -> Result<AggregateTrace, OperatorError> {
        check_limit("trace", limit)?;
        let take = usize::try_from(limit).unwrap_or(0);
        let of = |t: &str, i: &str| t == aggregate_type && i == aggregate_id;
        let mut outbox: Vec<TracedEvent> = lock(&self.inner.outbox)
            .rows
            .values()
            .filter(|r| of(&r.msg.aggregate_type, &r.msg.aggregate_id))
            .map(traced)
            .collect();
        outbox.sort_by_key(|e| e.aggregate_version);
        outbox.truncate(take);
        let mut discarded: Vec<DiscardedEvent> = lock(&self.inner.ops)
            .discarded
            .iter()
            .filter(|d| of(&d.row.msg.aggregate_type, &d.row.msg.aggregate_id))
            .map(discarded_event)
            .collect();
        discarded.sort_by_key(|d| d.aggregate_version);
        discarded.truncate(take);
        let mut consumers: Vec<ConsumerProgress> = lock(&self.inner.consumer)
            .aggregates
            .iter()
            .filter(|((_, t, i), _)| of(t, i))
            .map(|((consumer, _, _), last)| ConsumerProgress {
                consumer_name: consumer.clone(),
                last_version: *last,
            })
            .collect();
        consumers.sort_by(|a, b| a.consumer_name.cmp(&b.consumer_name));
        Ok(AggregateTrace {
            aggregate_type: aggregate_type.to_owned(),
            aggregate_id: aggregate_id.to_owned(),
            outbox,
            discarded,
            consumers,
        })
    }
}

impl ReplayOps for MemoryStore {
    /// Always refused (`Refused`): the fake keeps no published rows (see the module docs).
    async fn replay(
        &self,
        which: &ReplaySelection,
        _dry_run: bool,
        _expect_events: Option<i64>,
        actor: &Actor,
        reason: &str,
    ) -> Result<ReplayPlan, OperatorError> {
        let selection = serde_json::to_value(which).unwrap_or_default();
        let refused = Err(OperatorError::refused("replay", NO_PUBLISHED_ROWS));
        logged(
            actor,
            "replay",
            &selection,
            reason,
            refused,
            |p: &ReplayPlan| u64::try_from(p.events).unwrap_or(0),
        )
    }

    /// Always refused (`Refused`): the fake keeps no published rows (see the module docs).
    async fn replay_range(
        &self,
        which: &RangeSelection,
        _dry_run: bool,
        _expect_events: Option<i64>,
        actor: &Actor,
        reason: &str,
    ) -> Result<RangePlan, OperatorError> {
        let selection = serde_json::to_value(which).unwrap_or_default();
        let refused = Err(OperatorError::refused("replay range", NO_PUBLISHED_ROWS));
        logged(
            actor,
            "replay range",
            &selection,
            reason,
            refused,
            |p: &RangePlan| u64::try_from(p.events).unwrap_or(0),
        )
    }
}

impl ProcessOps for MemoryStore {
    /// Always empty: no process reports a heartbeat to the fake.
    async fn instances(&self) -> Result<Vec<Instance>, OperatorError> {
        Ok(Vec::new())
    }

    /// The routes' pending and dead counts as the PostgreSQL store reads them (among the oldest
    /// `bound` pending rows and the oldest `bound` dead ones); the publish rates are zeros (no
    /// relay reports activity to the fake).
    async fn routes(&self, bound: i64) -> Result<Routes, OperatorError> {
        check_bound("routes", bound)?;
        let take = usize::try_from(bound).unwrap_or(usize::MAX);
        let mut by_key: BTreeMap<String, RouteView> = BTreeMap::new();
        let (mut heads, mut deads) = (0, 0);
        {
            let o = lock(&self.inner.outbox);
            let key =
                |r: &OutboxRow| route_key(r.msg.destination.as_deref(), &r.msg.aggregate_type);
            for r in o
                .rows
                .values()
                .filter(|r| r.state == RowState::Pending)
                .take(take)
            {
                heads += 1;
                let k = key(r);
                let v = by_key
                    .entry(k.clone())
                    .or_insert_with(|| RouteView::of_key(&k));
                v.pending += 1;
                v.oldest_pending_age_seconds = v
                    .oldest_pending_age_seconds
                    .max(age(r.msg.created_at).as_secs_f64());
            }
            for r in o
                .rows
                .values()
                .filter(|r| r.state == RowState::Dead)
                .take(take)
            {
                deads += 1;
                let k = key(r);
                by_key
                    .entry(k.clone())
                    .or_insert_with(|| RouteView::of_key(&k))
                    .dead_letters += 1;
            }
        }
        let complete = heads < take && deads < take;
        Ok(Routes::busiest_first(
            by_key.into_values().collect(),
            bound,
            complete,
        ))
    }

    /// The consumers the fake knows of (a pause, an open dead letter, an open conflict), with
    /// their open dead letters and conflicts; no instance is up, no lag is known and the rates
    /// are zeros (no engine reports a heartbeat to the fake).
    async fn consumers(&self) -> Result<Vec<ConsumerView>, OperatorError> {
        let mut by_name: BTreeMap<String, ConsumerView> = BTreeMap::new();
        let view = |name: &str| ConsumerView {
            name: name.to_owned(),
            instances_up: 0,
            lag: None,
            paused: false,
            dead_letters: 0,
            conflicts: 0,
            processed_per_minute: vec![0; MINUTES],
        };
        {
            let c = lock(&self.inner.consumer);
            for d in c.dead.values().filter(|d| is_open(d)) {
                by_name
                    .entry(d.consumer.clone())
                    .or_insert_with(|| view(&d.consumer))
                    .dead_letters += 1;
            }
            for x in c.conflicts.iter().filter(|x| x.resolved_at.is_none()) {
                by_name
                    .entry(x.consumer.clone())
                    .or_insert_with(|| view(&x.consumer))
                    .conflicts += 1;
            }
        }
        for (kind, name) in lock(&self.inner.ops).pauses.keys() {
            if *kind == "consumer" {
                by_name
                    .entry(name.clone())
                    .or_insert_with(|| view(name))
                    .paused = true;
            }
        }
        Ok(by_name.into_values().take(1000).collect())
    }
}

impl PauseOps for MemoryStore {
    /// Every pause in force, by kind (consumers, then routes) and name.
    async fn pauses(&self) -> Result<Vec<Pause>, OperatorError> {
        let ops = lock(&self.inner.ops);
        let mut pauses = Vec::with_capacity(ops.pauses.len());
        for kind in ["consumer", "route"] {
            for ((_, name), p) in ops.pauses.iter().filter(|((k, _), _)| *k == kind) {
                let record = ops.entry(p.audit_id);
                pauses.push(Pause {
                    kind: kind.to_owned(),
                    name: name.clone(),
                    paused_at: p.paused_at,
                    audit_id: p.audit_id,
                    actor: record.map(|a| a.actor.clone()),
                    reason: record.map(|a| a.reason.clone()),
                });
            }
        }
        Ok(pauses)
    }

    /// Pauses a route or a consumer; never refused for a log-streaming relay (the fake has
    /// none).
    async fn pause(
        &self,
        target: &PauseTarget,
        actor: &Actor,
        reason: &str,
    ) -> Result<Pause, OperatorError> {
        const OP: &str = "pause";
        let selection = serde_json::to_value(target).unwrap_or_default();
        let result = target.check_pause(OP, reason).and_then(|()| {
            let mut ops = lock(&self.inner.ops);
            let key = (target.kind(), target.name().to_owned());
            if ops.pauses.contains_key(&key) {
                return Err(OperatorError::refused(
                    OP,
                    format!("{} {} is paused already", target.kind(), target.name()),
                ));
            }
            let audit_id = ops.record(actor, OP, &selection, reason, 1);
            let paused_at = Utc::now();
            ops.pauses.insert(
                key,
                PauseRow {
                    paused_at,
                    audit_id,
                },
            );
            Ok(Pause {
                kind: target.kind().to_owned(),
                name: target.name().to_owned(),
                paused_at,
                audit_id,
                actor: Some(actor.name().to_owned()),
                reason: Some(reason.to_owned()),
            })
        });
        logged(actor, OP, &selection, reason, result, |_| 1)
    }

    async fn resume(
        &self,
        target: &PauseTarget,
        actor: &Actor,
        reason: &str,
    ) -> Result<(), OperatorError> {
        const OP: &str = "resume";
        let selection = serde_json::to_value(target).unwrap_or_default();
        let result = target.check(OP).and_then(|()| {
            let mut ops = lock(&self.inner.ops);
            match ops
                .pauses
                .remove(&(target.kind(), target.name().to_owned()))
            {
                None => Err(OperatorError::not_found(
                    OP,
                    format!("{} {} is not paused", target.kind(), target.name()),
                )),
                Some(_) => {
                    ops.record(actor, OP, &selection, reason, 1);
                    Ok(())
                }
            }
        });
        // A resumed route's rows may be claimed now.
        if result.is_ok() && matches!(target, PauseTarget::Route(_)) {
            self.inner.wake.notify_waiters();
        }
        logged(actor, OP, &selection, reason, result, |()| 1)
    }
}
