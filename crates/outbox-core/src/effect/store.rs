//! [`WorkItemStore`] and its values: the contract is in [`WorkItemStore`]'s docs (this module is private).

use std::future::Future;
use std::time::Duration;

use super::WorkItem;
use crate::error::StoreError;
use crate::store::LeaseToken;

/// The states of a work item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkItemState {
    /// Waiting for a call (new, not sent, or resent).
    Pending,
    /// Claimed by an executor that is calling the provider.
    InProgress,
    /// Done; the provider's reference is kept. Terminal.
    Succeeded,
    /// Refused by the provider or given up. Terminal (an operator may resend).
    Failed,
    /// Outcome not known; reconciliation or an operator settles it.
    Unknown,
}

impl WorkItemState {
    /// Every state.
    pub const ALL: [Self; 5] = [
        Self::Pending,
        Self::InProgress,
        Self::Succeeded,
        Self::Failed,
        Self::Unknown,
    ];

    /// The stored name: `pending`, `in_progress`, `succeeded`, `failed`, `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InProgress => "in_progress",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Unknown => "unknown",
        }
    }

    /// The state named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// What a claim is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimPurpose {
    /// Due `pending` items, to call the provider: they become `in_progress`, `attempts + 1`.
    Call,
    /// Due `unknown` items without a live lease, to look them up: they stay `unknown`.
    Lookup,
}

/// Parameters of [`WorkItemStore::work_item_claim`].
#[derive(Debug, Clone, Copy)]
pub struct WorkItemClaimParams<'a> {
    /// Only items of this kind.
    pub kind: &'a str,
    /// Calls or lookups.
    pub purpose: ClaimPurpose,
    /// At most this many, the longest due first.
    pub limit: usize,
    /// How long the claim owns them.
    pub lease: Duration,
}

/// An item claimed by an executor.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedWorkItem {
    /// The item, as the provider sees it.
    pub item: WorkItem,
    /// Lookups made so far.
    pub lookups: i32,
    /// The token that fences the claim's writes.
    pub token: LeaseToken,
}

/// The result to write for a claimed item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkItemUpdate {
    /// Done, with the provider's reference.
    Succeeded {
        /// The provider's reference.
        reference: String,
    },
    /// Refused or given up.
    Failed {
        /// Why.
        reason: String,
    },
    /// Call again after `delay` (not sent, or not found by a lookup with resend on).
    Pending {
        /// Why (kept as the last error).
        reason: String,
        /// When the next call is due.
        delay: Duration,
    },
    /// Outcome unknown: look it up after `delay`.
    Unknown {
        /// Why (kept as the last error).
        reason: String,
        /// When the next lookup is due.
        delay: Duration,
    },
}

/// Parameters of [`WorkItemStore::work_item_record`].
#[derive(Debug, Clone)]
pub struct WorkItemRecordParams<'a> {
    /// The item.
    pub id: i64,
    /// The claim's token.
    pub token: LeaseToken,
    /// The state the item was claimed in (`InProgress` for calls, `Unknown` for lookups).
    pub claimed_in: WorkItemState,
    /// What to write.
    pub update: &'a WorkItemUpdate,
    /// Lookups to add to the count (1 after a lookup, 0 after a call).
    pub lookups_add: i32,
}

/// Counts per state, for one kind or all, with the ages operators alert on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EffectsStats {
    /// Items waiting for a call.
    pub pending: i64,
    /// Items being called.
    pub in_progress: i64,
    /// The reconciliation backlog.
    pub unknown: i64,
    /// Settled as done.
    pub succeeded: i64,
    /// Settled as failed.
    pub failed: i64,
    /// How long the oldest `unknown` item has been unknown; `None` without unknown items.
    pub oldest_unknown_age: Option<Duration>,
    /// How long ago the oldest `pending` item was enqueued; `None` without pending items.
    pub oldest_pending_age: Option<Duration>,
}

/// The executor's view of the work-item table.
///
/// The database side of remote effects: the [`WorkItemStore`] trait the executor runs against.
///
/// Writing a work item happens in the consumer's own transaction with the store crate's API
/// ([`NewWorkItem`](super::NewWorkItem)); this trait is what the executor needs
/// afterwards: claim due items under a lease, write results fenced by that lease, send items
/// whose lease expired to `unknown`, and count the open backlog.
///
/// # What an implementation must guarantee (checked by the store conformance suite)
///
/// * A claim takes each due item at most once while its lease is live (concurrent executors
///   skip each other's items), gives it a fresh, never reused token, and for calls counts the
///   attempt (`attempts + 1`) and moves it to `in_progress`.
/// * [`WorkItemStore::work_item_record`] changes the item only if it is still in the state it was
///   claimed in and still holds the claim's token; otherwise it changes nothing and returns
///   `false`.
/// * Expiry moves `in_progress` items whose lease ended to `unknown`, never back to `pending`.
pub trait WorkItemStore: Send + Sync + 'static {
    /// Moves `in_progress` items of `kind` whose lease ended to `unknown`, to be looked up after
    /// `reconcile_after`, with `reason` as the last error. Returns their ids.
    ///
    /// # Errors
    /// [`StoreError`].
    fn work_item_expire<'a>(
        &'a self,
        kind: &'a str,
        reconcile_after: Duration,
        reason: &'a str,
    ) -> impl Future<Output = Result<Vec<i64>, StoreError>> + Send + 'a;

    /// Claims due items under a fresh lease.
    ///
    /// # Errors
    /// [`StoreError`].
    fn work_item_claim<'a>(
        &'a self,
        params: WorkItemClaimParams<'a>,
    ) -> impl Future<Output = Result<Vec<ClaimedWorkItem>, StoreError>> + Send + 'a;

    /// Writes a claimed item's result, fenced by its token and claimed state. Returns `false`
    /// (and changes nothing) when the claim no longer owns the item.
    ///
    /// # Errors
    /// [`StoreError`]; nothing was written.
    fn work_item_record<'a>(
        &'a self,
        params: WorkItemRecordParams<'a>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// The open states only (pending, in progress, unknown, with the oldest unknown and pending
    /// ages; `succeeded` and `failed` are 0), cheap whatever the settled history: the executor's
    /// gauges.
    ///
    /// # Errors
    /// [`StoreError`].
    fn work_item_backlog<'a>(
        &'a self,
        kind: Option<&'a str>,
    ) -> impl Future<Output = Result<EffectsStats, StoreError>> + Send + 'a;
}
