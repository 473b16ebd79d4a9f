//! The operator's reads and actions as a contract every store implements: dead letters
//! (outbox and consumer), inbox conflicts, work items, pauses, replays, traces, the running
//! processes and routes, and the audit of every action. The CLI's `status`, `dead-letters`,
//! `conflicts`, `effects`, `audit`, `trace`, `pause` and `replay` commands and the web console
//! (`outbox-console`) are written against these traits only, so they work on any store and
//! never disagree about a number or about what an action does.
//!
//! The contract is split by topic, one trait per file ([`OverviewOps`], [`DeadLetterOps`],
//! [`ConflictOps`], [`WorkItemOps`], [`AuditOps`], [`TraceOps`], [`ReplayOps`],
//! [`ProcessOps`], [`PauseOps`]); [`OperatorStore`] is all of them, implemented for every type
//! that implements each. `use outbox_core::operator::prelude::*` brings the traits into scope.
//!
//! What every implementation guarantees (the testkit's `operator_suite!` checks it):
//!
//! * **Every action is audited**: the change and its [`AuditEntry`] commit together, and a
//!   refused action changes nothing and records nothing (it is logged).
//! * **Actions are the core's, changes the store's**: each action (requeue, discard, resolve,
//!   pause, resume, replay, replay range) is a provided method that names its [`Action`],
//!   checks the request where that needs no store (a reason, a target's form, the ids, a
//!   version or a range), calls the store's `apply_*` hook and logs the outcome once. A store
//!   implements only the hooks: the change and its audit record in one transaction, and the
//!   refusals only it can make (a row's state, a lease held, published rows not kept). Only the
//!   core makes an [`Action`] and only it logs one, so a hook never runs on an unchecked
//!   request, no outcome is logged twice, and a new store's actions are named as every other
//!   store's.
//! * **Pages are bounded**: a list takes a limit of 1 to [`MAX_LIST`]; a group read looks at
//!   most [`GROUP_SCAN`] rows and says when it stopped (`complete`).
//! * **Errors are classed** ([`OperatorErrorKind`]) so that a caller maps them (the console to
//!   HTTP statuses) without reading messages.
//! * **Reasons group alike failures**: a dead letter's reason key is its error text with
//!   numbers and UUIDs replaced by `#`, cut at 200 characters ([`reason_key`]); a store that
//!   computes it in its database computes exactly this.

mod audit;
mod conflicts;
mod dead_letters;
mod overview;
mod pauses;
mod processes;
mod replay;
mod trace;
mod work_items;

use serde::Serialize;

use crate::{StoreError, StoreErrorKind};

pub use audit::{Action, Actor, AuditEntry, AuditOps};
pub use conflicts::{
    ConflictDetail, ConflictFilter, ConflictOps, ConflictView, ConflictsResolved,
    check_conflicts_request, conflicts_selection, no_such_conflicts,
};
pub use dead_letters::{
    ConsumerDeadLetterDetail, ConsumerDeadLetterGroup, ConsumerDeadLetterGroups,
    ConsumerDeadLetterView, ConsumerSelection, DeadLetterDetail, DeadLetterFilter, DeadLetterGroup,
    DeadLetterGroups, DeadLetterOps, DeadLetterSelection, DeadLetterView, Discarded, GROUP_SCAN,
    reason_key,
};
pub use overview::{Overview, OverviewOps, WorkItems};
pub use pauses::{Pause, PauseOps, PauseTarget, route_key};
pub use processes::{
    ACTIVITY_MINUTES, Activity, ActivityKind, ActivitySeries, ConsumerView, Instance, MINUTES,
    MinuteCount, OUTBOX_SERIES, ProcessOps, RouteView, Routes, heartbeat_status, minute_slot,
};
pub use replay::{
    MAX_RANGE_AGGREGATES, MAX_RANGE_EVENTS, RangePlan, RangeSelection, ReplayOps, ReplayPlan,
    ReplayRequest, ReplaySelection, Replayable,
};
pub use trace::{
    AggregateTrace, ConsumerProgress, DiscardedEvent, EventTrace, InboxRecord, TraceOps,
    TracedEvent,
};
pub use work_items::{
    Resolution, WorkItemOps, WorkItemRow, no_work_item, not_reconcilable, work_item_selection,
};

/// Every operator trait in scope: `use outbox_core::operator::prelude::*`.
pub mod prelude {
    pub use super::{
        AuditOps, ConflictOps, DeadLetterOps, OperatorStore, OverviewOps, PauseOps, ProcessOps,
        ReplayOps, Replayable, TraceOps, WorkItemOps,
    };
}

/// Declares [`OperatorStore`] as all of the topics' traits, and implements it for every type
/// that implements them (the bounds written once).
macro_rules! operator_store {
    ($($topic:ident),+ $(,)?) => {
        /// The whole operator contract: what the console and the CLI need of a store.
        /// Implemented for every type that implements each topic's trait.
        pub trait OperatorStore: $($topic +)+ Clone + Send + Sync + 'static {}

        impl<T> OperatorStore for T where T: $($topic +)+ Clone + Send + Sync + 'static {}
    };
}

operator_store!(
    OverviewOps,
    DeadLetterOps,
    ConflictOps,
    WorkItemOps,
    AuditOps,
    TraceOps,
    ReplayOps,
    ProcessOps,
    PauseOps,
);

/// The largest page of dead letters one call returns.
pub const MAX_LIST: i64 = 10_000;

/// How [`OverviewOps::overview_counting`] counts the outbox's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    /// Every row: its cost grows with the backlog (seconds at millions of pending rows).
    /// What `outbox status` does.
    Exact,
    /// Each count stops at this many rows, so that the overview costs milliseconds at any
    /// backlog size; a count equal to the bound means "at least". What the console does.
    UpTo(i64),
}

impl Counting {
    /// The bound each count stops at: `None` for [`Counting::Exact`].
    ///
    /// # Errors
    /// [`OperatorError`] of kind `InvalidRequest` in `operation` for a bound below 1
    /// ([`check_bound`]).
    pub fn bound(self, operation: &'static str) -> Result<Option<i64>, OperatorError> {
        match self {
            Self::Exact => Ok(None),
            Self::UpTo(bound) => check_bound(operation, bound).map(|()| Some(bound)),
        }
    }
}

/// What went wrong in an operator read or action.
#[derive(Debug, thiserror::Error)]
#[error("{operation}: {message}")]
pub struct OperatorError {
    /// What was being done (`overview`, `dead letters`, `requeue`, ...).
    pub operation: &'static str,
    /// The class of the failure, for a caller that maps it (the console to an HTTP status).
    pub kind: OperatorErrorKind,
    /// The store's message.
    pub message: String,
}

/// The class of an [`OperatorError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OperatorErrorKind {
    /// The database could not be reached; retry later.
    Unavailable,
    /// The connected role lacks a grant (the message names it); a read-only operator role
    /// trying an action gets this.
    PermissionDenied,
    /// The schema is missing or at another version: run `outbox migrate`.
    Schema,
    /// The request itself is invalid (a page size out of range, an unknown state name).
    InvalidRequest,
    /// What the request names does not exist (a work item id).
    NotFound,
    /// The row's state does not allow the action (a work item that is not `unknown` settled
    /// by hand); nothing was changed.
    Refused,
    /// Anything else the database reported.
    Other,
}

/// A payload as the console shows it: as text when it reads as text (UTF-8, no control
/// characters but whitespace), else as hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PayloadView {
    /// Its size in bytes.
    pub size: usize,
    /// SHA-256 of the bytes, hex.
    pub sha256: String,
    /// The bytes as text, when they are UTF-8.
    pub text: Option<String>,
    /// The bytes as hex, when they are not UTF-8.
    pub hex: Option<String>,
}

impl PayloadView {
    /// The view of `bytes`.
    pub fn of(bytes: Vec<u8>) -> Self {
        use sha2::Digest as _;
        let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
        let size = bytes.len();
        // Text only when it reads as text: UTF-8 without control characters other than
        // whitespace (a NUL or an escape is binary to a reader, and hex shows it).
        let printable = |t: &str| {
            !t.chars()
                .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
        };
        match String::from_utf8(bytes) {
            Ok(text) if printable(&text) => Self {
                size,
                sha256,
                text: Some(text),
                hex: None,
            },
            Ok(text) => Self {
                size,
                sha256,
                text: None,
                hex: Some(hex::encode(text.into_bytes())),
            },
            Err(e) => Self {
                size,
                sha256,
                text: None,
                hex: Some(hex::encode(e.into_bytes())),
            },
        }
    }
}

impl OperatorError {
    /// An error of `kind` in `operation`.
    pub fn new(
        operation: &'static str,
        kind: OperatorErrorKind,
        message: impl Into<String>,
    ) -> Self {
        Self {
            operation,
            kind,
            message: message.into(),
        }
    }

    /// `InvalidRequest`: the request itself is wrong.
    pub fn invalid(operation: &'static str, message: impl Into<String>) -> Self {
        Self::new(operation, OperatorErrorKind::InvalidRequest, message)
    }

    /// `NotFound`: what the request names does not exist.
    pub fn not_found(operation: &'static str, message: impl Into<String>) -> Self {
        Self::new(operation, OperatorErrorKind::NotFound, message)
    }

    /// `Refused`: the state does not allow the action; nothing changed.
    pub fn refused(operation: &'static str, message: impl Into<String>) -> Self {
        Self::new(operation, OperatorErrorKind::Refused, message)
    }

    /// A store's error in `operation`, classed by its kind.
    pub fn store(operation: &'static str, e: &StoreError) -> Self {
        let kind = match e.kind() {
            StoreErrorKind::Unavailable => OperatorErrorKind::Unavailable,
            StoreErrorKind::PermissionDenied => OperatorErrorKind::PermissionDenied,
            StoreErrorKind::Schema => OperatorErrorKind::Schema,
            _ => OperatorErrorKind::Other,
        };
        Self::new(operation, kind, e.to_string())
    }
}

/// Refuses a `limit` outside 1 to [`MAX_LIST`] (`InvalidRequest`).
///
/// # Errors
/// [`OperatorError`] of kind `InvalidRequest`.
pub fn check_limit(operation: &'static str, limit: i64) -> Result<(), OperatorError> {
    if (1..=MAX_LIST).contains(&limit) {
        Ok(())
    } else {
        Err(OperatorError::invalid(
            operation,
            format!("limit must be between 1 and {MAX_LIST}, not {limit}"),
        ))
    }
}

/// [`check_limit`], and the limit as a number of items: for a store that takes a page from an
/// iterator (`.take(n)`).
///
/// # Errors
/// [`OperatorError`] of kind `InvalidRequest` for a `limit` outside 1 to [`MAX_LIST`].
pub fn page_size(operation: &'static str, limit: i64) -> Result<usize, OperatorError> {
    check_limit(operation, limit)?;
    Ok(usize::try_from(limit).unwrap_or(usize::MAX))
}

/// Refuses an action without a reason (`InvalidRequest`): the audit record keeps it.
///
/// # Errors
/// [`OperatorError`] of kind `InvalidRequest`.
pub fn require_reason(operation: &'static str, reason: &str) -> Result<(), OperatorError> {
    if reason.trim().is_empty() {
        Err(OperatorError::invalid(
            operation,
            format!("{operation} needs a reason (it is kept in the audit record)"),
        ))
    } else {
        Ok(())
    }
}

/// Refuses a count bound below 1 (`InvalidRequest`).
///
/// # Errors
/// [`OperatorError`] of kind `InvalidRequest`.
pub fn check_bound(operation: &'static str, bound: i64) -> Result<(), OperatorError> {
    if bound < 1 {
        Err(OperatorError::invalid(
            operation,
            format!("a count bound must be at least 1, not {bound}"),
        ))
    } else {
        Ok(())
    }
}

/// The refusal of a replay whose count is no longer the dry run's `expected`.
pub fn count_changed(expected: Option<i64>, events: i64) -> Option<String> {
    expected.filter(|e| *e != events).map(|expected| {
        format!("the replay would now take {events} event(s), not the {expected} expected: dry-run again")
    })
}

#[cfg(test)]
mod tests {
    use super::{Counting, MAX_LIST, OperatorErrorKind, page_size};

    #[test]
    fn a_count_bound_and_a_page_size_are_checked() {
        assert_eq!(Counting::Exact.bound("overview").unwrap(), None);
        assert_eq!(Counting::UpTo(5).bound("overview").unwrap(), Some(5));
        let e = Counting::UpTo(0).bound("overview").unwrap_err();
        assert_eq!(
            (e.operation, e.kind),
            ("overview", OperatorErrorKind::InvalidRequest)
        );
        assert_eq!(page_size("audit", MAX_LIST).unwrap(), 10_000);
        assert!(page_size("audit", 0).is_err() && page_size("audit", MAX_LIST + 1).is_err());
    }
}
