//! The database side of the relay: one trait every store implements.
//!
//! Methods are named noun-then-verb and take a params struct each, so a store can grow options
//! without breaking callers. Every state change after a claim is *fenced* by the claim's
//! [`LeaseToken`]: once another relay re-claimed a row (after this lease expired) the old token
//! matches nothing, so a stale worker can neither mark, fail nor release it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::message::{EventId, OutboxMessage};

/// The fencing token of one claim: unique, increasing, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseToken(pub i64);

/// Parameters of [`OutboxStore::claim_batch`](crate::OutboxStore::claim_batch).
#[derive(Debug, Clone)]
pub struct ClaimParams {
    /// At most this many rows in total.
    pub max_rows: usize,
    /// At most this many rows of one aggregate (a contiguous run of versions).
    pub max_per_aggregate: usize,
    /// How long the claim owns its rows. After that another relay may take them over.
    pub lease: Duration,
    /// Which aggregates the claim may take.
    pub scope: ClaimScope,
}

/// Which aggregates a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimScope {
    /// Free aggregates and those whose lease expired, taken over with the rest: the claim of a
    /// relay without the poison-row rule.
    #[default]
    All,
    /// Free aggregates, and those whose lease expired unsettled for the first time (taken
    /// over with the rest, counting 1). An aggregate whose lease was itself a takeover and
    /// expired unsettled again is left to a [`ClaimScope::TakeOver`] claim.
    Free,
    /// One aggregate taken over again after a takeover that was not settled either, its head
    /// row alone, so that whatever happens to the relay while it publishes that row is that
    /// row's doing (the poison-row rule,
    /// [`crate::relay::RelayConfig::poison_after_takeovers`]). `max_rows` and
    /// `max_per_aggregate` are ignored. Also deletes such leases with nothing to take over
    /// (no unpublished row left, a dead head, a head in backoff: a failure its holder
    /// recorded) among the oldest it looks at, so a `Free` claim is not kept off those
    /// aggregates.
    TakeOver,
}

/// The rows one claim owns, sorted by `(aggregate_type, aggregate_id, aggregate_version)`.
#[derive(Debug, Clone)]
pub struct ClaimedBatch {
    /// The fencing token to pass to every later call about these rows.
    pub token: LeaseToken,
    /// The claimed rows. For each aggregate they are the lowest unpublished versions, in order,
    /// without gaps; the first one is its aggregate's head (nothing lower is unpublished).
    pub messages: Vec<OutboxMessage>,
    /// Aggregates this claim took over from a lease that expired unsettled (see
    /// [`Takeover`]); empty in the normal case.
    pub takeovers: Vec<Takeover>,
    /// Claimed rows that could not be read as a message the relay can publish (see
    /// [`UndecodableRow`]); empty in the normal case. They are claimed like the rest: each is
    /// settled through this claim's token (the relay dead-letters it), and the rows of its
    /// aggregate in `messages` after it are not published.
    pub undecodable: Vec<UndecodableRow>,
    /// The liveness of the claim's owner, when the store ties its leases to something that can
    /// end before their clock does (the relay's database session); `None`: the lease
    /// ends by its clock only.
    pub liveness: Option<Arc<Liveness>>,
}

/// What the holder of a claim knows of its own ownership, when the store ties it to a live
/// session (a store crate's session keeper): another relay may take the claim's aggregates over
/// the moment the session ends, long before the lease's clock runs out.
///
/// The session keeper proves the session alive at intervals and [`Liveness::confirm`]s, each
/// time, the moment until which a publish may still start: the proof's *send* time plus a
/// window. A proof answered means the session was alive after it was sent, so a takeover (which
/// needs the session gone) comes later than that send; the holder starts nothing after the
/// window, so its publishes overlap a survivor's by at most the window. Once the keeper knows
/// the session is gone ([`Liveness::lose`]), nothing starts again under this value: a new
/// session is a new owner, with a new `Liveness`.
#[derive(Debug)]
pub struct Liveness {
    base: Instant,
    /// Nanoseconds after `base` before which a publish may start; [`LOST`] once lost.
    until: AtomicU64,
}

/// [`Liveness::until`] of a lost session.
const LOST: u64 = u64::MAX;

impl Default for Liveness {
    fn default() -> Self {
        Self::new()
    }
}

impl Liveness {
    /// Not yet confirmed: [`Liveness::may_start`] is false until the first
    /// [`Liveness::confirm`].
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            until: AtomicU64::new(0),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(LOST - 1)
    }

    /// Publishes may start until `until` (never moves it back; does nothing once lost).
    pub fn confirm(&self, until: Instant) {
        let n = self.nanos(until).min(LOST - 1);
        let _ = self
            .until
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                (cur != LOST && n > cur).then_some(n)
            });
    }

    /// The session is gone: no publish starts under it again.
    pub fn lose(&self) {
        self.until.store(LOST, Ordering::Release);
    }

    /// Whether the session is known to be gone.
    pub fn is_lost(&self) -> bool {
        self.until.load(Ordering::Acquire) == LOST
    }

    /// Whether a publish may start at `now`: the session is not known to be gone, and its last
    /// proof of life is recent enough.
    pub fn may_start(&self, now: Instant) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until != LOST && self.nanos(now) < until
    }
}

/// A claimed row that cannot be published as it is stored: a column that does not decode (a
/// header value that is not a string) or a value no broker binding can carry (a header name
/// that is not a token, a content type with a control character). A plain-SQL producer can
/// write one where the store's constraints did not stop it (rows older than them). The relay
/// dead-letters it with `reason` at once, never retries it, and its aggregate waits behind it
/// as behind any dead letter; the row keeps every column as the producer wrote it, for the
/// operator to fix and requeue.
///
/// A store reports a row this way only when it can read its id and aggregate key; a row that
/// cannot even be told apart is a store error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndecodableRow {
    /// The row's id.
    pub id: i64,
    /// The event id, when it could be read.
    pub event_id: Option<EventId>,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Version within the aggregate.
    pub aggregate_version: i64,
    /// What is wrong with it, naming the column (and header).
    pub reason: String,
}

/// A claim took an aggregate over from a lease that expired without being settled: the relay
/// holding it died, froze or lost the database before it could release it.
///
/// `count` is how many times in a row the aggregate's lease was taken over while this same
/// row was its head: 1 the first time, +1 at each takeover with the same head, back to 1
/// when the head changed (something was published in between). A settled claim ends the
/// lease, and with it the count. A head that keeps its relays from settling (a row that
/// crashes the relay process) is how the publish engine recognises a poison row
/// ([`crate::relay::RelayConfig::poison_after_takeovers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Takeover {
    /// The aggregate's head row (the `id` of its first message in the batch).
    pub head: i64,
    /// Consecutive takeovers with this head, at least 1.
    pub count: u32,
    /// How long the aggregate had been without a live owner when this claim took it: since
    /// the store saw its holder's session end, or since the lease ran out (`None` when the
    /// store cannot tell).
    pub orphaned_for: Option<Duration>,
}

/// Parameters of [`OutboxStore::mark_published`](crate::OutboxStore::mark_published).
#[derive(Debug, Clone)]
pub struct MarkParams<'a> {
    /// The claim's token.
    pub token: LeaseToken,
    /// Rows the broker acknowledged.
    pub ids: &'a [i64],
}

/// Parameters of [`OutboxStore::record_failure`](crate::OutboxStore::record_failure).
#[derive(Debug, Clone)]
pub struct FailureParams<'a> {
    /// The claim's token.
    pub token: LeaseToken,
    /// The row whose publish failed.
    pub id: i64,
    /// The error, kept as `last_error`.
    pub error: &'a str,
    /// `Some(delay)`: pending again after `delay`. `None`: dead-letter it now.
    pub retry_after: Option<Duration>,
}

/// Parameters of [`OutboxStore::release`](crate::OutboxStore::release).
#[derive(Debug, Clone)]
pub struct ReleaseParams<'a> {
    /// The claim's token.
    pub token: LeaseToken,
    /// Rows claimed but not attempted (behind a failure, or out of lease time); may be empty.
    pub ids: &'a [i64],
}

/// Numbers for metrics and `outbox status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutboxStats {
    /// Rows not yet published and not dead (includes in-flight and retrying rows).
    pub pending: i64,
    /// Age of the oldest pending row, by the database clock.
    pub oldest_pending_age: Option<Duration>,
    /// Pending rows currently under a live lease.
    pub in_flight: i64,
    /// Pending rows that failed at least once.
    pub retrying: i64,
    /// Dead letters.
    pub dead: i64,
    /// Rows kept as published (mark mode only; 0 in delete mode).
    pub published_retained: i64,
}

/// The relay's view of the outbox table (the polling feed claims through it).
///
/// # What a claim must guarantee
///
/// * Only rows of committed transactions are returned (the database's visibility rules).
/// * A row is returned only if every lower version of its aggregate is published, or is
///   returned in the same batch before it, and its aggregate has no live lease held by another
///   claim. Dead letters block their aggregate.
/// * Rows in backoff (`retry_after` not yet elapsed) are not returned.
/// * A row whose route is paused ([`crate::operator::PauseOps`], [`crate::operator::route_key`])
///   is not returned, and its aggregate's later rows wait behind it whatever their route; a
///   run stops before its first paused row. The store reads the pauses inside the claim itself,
///   not from [`ClaimParams`]: a pause committed before the claim holds from that claim on, with
///   no window between a relay reading the pauses and claiming. A relay that streams the log
///   instead of claiming holds the same rule in its scheduler ([`crate::relay::log`]).
/// * Concurrent claims from several relays never return the same aggregate twice while a lease
///   is live.
/// * A claim that takes an aggregate over from an expired, unsettled lease reports it in
///   [`ClaimedBatch::takeovers`], counting consecutive takeovers with the same head row; a
///   release ends the count.
pub trait OutboxStore: Send + Sync + 'static {
    /// Claims up to `max_rows` rows under a new lease.
    ///
    /// # Errors
    /// [`StoreError`] with kind `Unavailable` on an outage; the relay waits and retries.
    fn claim_batch(
        &self,
        params: ClaimParams,
    ) -> impl Future<Output = Result<ClaimedBatch, StoreError>> + Send;

    /// Marks rows as published (deletes them, or flags them, per the store's configuration).
    /// Only rows still owned by `token` change; the return value counts them, so a count lower
    /// than `ids.len()` means another relay took some over (their republish is deduplicated
    /// downstream by event id).
    ///
    /// # Errors
    /// [`StoreError`] on an outage. Nothing was marked then; the rows will be republished.
    fn mark_published(
        &self,
        params: MarkParams<'_>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Records a failed publish: backoff then pending again, or dead letter. Returns false when
    /// the lease was lost (nothing changed).
    ///
    /// # Errors
    /// [`StoreError`] on an outage.
    fn record_failure(
        &self,
        params: FailureParams<'_>,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Ends a claim: gives up whatever `token` still holds (`ids` are the rows that were not
    /// attempted), after its marks and failure records were written. The relay calls it once
    /// per claimed batch, last. Returns how many rows or leases were released (store-specific).
    ///
    /// # Errors
    /// [`StoreError`] on an outage; the lease then simply expires.
    fn release(
        &self,
        params: ReleaseParams<'_>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Counts for metrics and the CLI.
    ///
    /// # Errors
    /// [`StoreError`] on an outage.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, StoreError>> + Send;

    /// Waits until new work may be available or `timeout` passed. The default sleeps; stores
    /// with a wake-up channel return early when a producer signalled.
    fn wait_for_work(&self, timeout: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(timeout)
    }

    /// Whether a [`ClaimScope::TakeOver`] claim may find something now: a lease that was
    /// itself a takeover and has no live owner. A cheap look, so that the relay can check
    /// often (a crashed relay's twice-taken aggregates wait for it) without holding its other
    /// batches back for the exclusive claim each time. The default says yes (the claim then
    /// looks for itself).
    ///
    /// # Errors
    /// [`StoreError`] on an outage.
    fn takeovers_waiting(&self) -> impl Future<Output = Result<bool, StoreError>> + Send {
        async { Ok(true) }
    }
}
