//! The operator contract ([`outbox_core::operator`]) for the [`MemoryStore`], with the same
//! refusals, counts and audit records as the PostgreSQL store, as far as the fake models the
//! data.
//!
//! Every action changes the store and appends its [`AuditEntry`] under the same locks (the
//! data's, then the operator state's, always in that order: outbox, consumer side, work items,
//! operator state), so a reader never sees one without the other; a refused action changes
//! nothing, records nothing, and is logged once ([`Action::check`]). Actions on the consumer
//! side also hold the transaction lock, as a consumer's transaction would, so that no open
//! transaction commits over them.
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
//!
//! One file per topic: the overview and the processes (`overview.rs`), dead letters
//! (`dead_letters.rs`), conflicts (`conflicts.rs`), work items (`work_items.rs`), the audit and
//! traces (`trace.rs`), replays (`replay.rs`) and pauses (`pauses.rs`); this file holds the
//! operator's state (audit records, pauses, discarded events) and what every topic shares.
//!
//! [`MemoryStore`]: super::MemoryStore
//! [`ProcessOps::instances`]: outbox_core::operator::ProcessOps::instances

use std::collections::{BTreeMap, HashSet};

use chrono::{DateTime, Utc};
use outbox_core::consumer::ConsumerDeadLetterState;
use outbox_core::operator::{Action, AuditEntry};

use super::{DeadLetterRow, OutboxRow};

mod conflicts;
mod dead_letters;
mod overview;
mod pauses;
mod replay;
mod trace;
mod work_items;

pub(super) use work_items::work_stats;

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
    ///
    /// [`MemoryStore::set_consumer_paused`]: super::MemoryStore::set_consumer_paused
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

    /// Appends the record of `action`, which changed `affected` rows; returns its id.
    fn record(&mut self, action: &Action<'_>, affected: u64) -> i64 {
        let id = self.audit.last().map_or(1, |a| a.id + 1);
        let actor = action.actor();
        self.audit.push(AuditEntry {
            id,
            at: Utc::now(),
            actor: actor.name().to_owned(),
            via: actor.via().to_owned(),
            credential: actor.credential().map(str::to_owned),
            db_role: DB_ROLE.to_owned(),
            action: action.operation().to_owned(),
            selection: action.selection().clone(),
            reason: action.reason().to_owned(),
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

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn is_open(d: &DeadLetterRow) -> bool {
    d.state != ConsumerDeadLetterState::Resolved
}
