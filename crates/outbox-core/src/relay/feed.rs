//! [`Feed`] and its values: the contract is in [`Feed`]'s docs (this module is private).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::StoreError;
use crate::message::OutboxMessage;
use crate::store::{
    ClaimParams, ClaimScope, ClaimedBatch, FailureParams, LeaseToken, Liveness, MarkParams,
    OutboxStats, OutboxStore, ReleaseParams, Takeover, UndecodableRow,
};

/// A batch of pending events handed to the publish engine.
#[derive(Debug, Clone)]
pub struct FeedBatch<T> {
    /// The feed's handle for settling this batch (a lease token, a log position ...).
    pub ticket: T,
    /// The events, sorted by aggregate (type, id) and then version; for each aggregate the first
    /// one is its lowest unpublished version and the rest follow without gaps.
    pub messages: Vec<OutboxMessage>,
    /// When the feed's ownership of these events may end (a lease measured locally from before
    /// the claim, so never later than the database's). The engine starts no publish that could
    /// still run at that moment. `None`: no time limit.
    pub owned_until: Option<Instant>,
    /// Aggregates taken over from an owner that never settled them (lease feeds; empty for
    /// feeds without leases). The engine publishes such an aggregate's head alone, and
    /// dead-letters a head taken over too often ([`super::RelayConfig::poison_after_takeovers`]).
    pub takeovers: Vec<Takeover>,
    /// Events of this batch that cannot be published as stored ([`UndecodableRow`]): the
    /// engine dead-letters each with its reason (in [`Settlement::failed`]) and gives back
    /// the events of its aggregate in `messages` after it. Part of the batch like the rest:
    /// while it is out, no other batch holds their aggregates.
    pub undecodable: Vec<UndecodableRow>,
    /// The liveness of the session the feed's ownership is tied to ([`Liveness`]): the engine
    /// starts a publish only while it allows. `None`: ownership ends by `owned_until` only.
    pub liveness: Option<Arc<Liveness>>,
}

/// A failed publish and the engine's decision about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedRow {
    /// The row's id.
    pub id: i64,
    /// The error text to keep (`last_error`), attempt number included.
    pub error: String,
    /// `Some(delay)`: pending again after `delay`. `None`: dead-letter it now.
    pub retry_after: Option<Duration>,
}

/// What happened to each row of a batch. Every row of the batch is in exactly one list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Rows the broker acknowledged durably.
    pub published: Vec<i64>,
    /// Rows whose publish failed.
    pub failed: Vec<FailedRow>,
    /// Rows not attempted (behind a failure of their aggregate, or out of ownership time).
    pub not_attempted: Vec<i64>,
}

/// What a feed did with a [`Settlement`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettleReport {
    /// Acknowledged rows confirmed as sent.
    pub marked: usize,
    /// Acknowledged or failed rows whose write was refused because the batch's ownership was
    /// lost; they will be handed out again (same event id) by whoever owns them now.
    pub lease_lost: usize,
    /// Failed rows scheduled for a retry.
    pub retried: usize,
    /// Failed rows dead-lettered.
    pub dead_lettered: usize,
    /// Rows given back unattempted.
    pub released: usize,
}

/// Where the relay's pending events come from.
///
/// How the relay finds pending events and confirms what happened to them: the [`Feed`] seam.
///
/// The publish engine ([`super::Relay`]) does not know where events come from. A feed hands it
/// batches of pending events and later receives the batch's [`Settlement`]: which rows the broker
/// acknowledged, which failed (with the engine's decision: retry after a delay, or dead letter),
/// and which were not attempted. Publishing, ordering, the failure policy and metrics stay in the
/// engine; a feed only claims and confirms.
///
/// * [`PollingFeed`] claims rows from an [`OutboxStore`] under a lease and settles them with
///   fenced writes (mark, record failure, release).
/// * A log-based feed (change data capture) streams committed inserts and confirms its log
///   position once every event up to it was acknowledged; it plugs in here without touching the
///   engine.
///
/// # What a feed must guarantee
///
/// * Only committed events are handed out (G2), each aggregate's events in version order, the
///   first one of each aggregate being its lowest unpublished version.
/// * While a batch is out, no other batch (of this or another relay) holds the same aggregate's
///   events, until [`FeedBatch::owned_until`] has passed or its [`FeedBatch::liveness`] no
///   longer allows a publish to start.
/// * [`Feed::settle`] confirms a row as sent only for the ids in [`Settlement::published`] (G3);
///   every other row of the batch stays pending, so it is handed out again later with the same
///   event id (G4).
pub trait Feed: Send + Sync + 'static {
    /// The handle of one batch.
    type Ticket: Send + Sync + 'static;

    /// The next batch of at most `max_rows` events; empty when nothing is pending.
    ///
    /// # Errors
    /// [`StoreError`]; kind `Unavailable` on an outage (the relay waits and retries).
    fn next_batch(
        &self,
        max_rows: usize,
    ) -> impl Future<Output = Result<FeedBatch<Self::Ticket>, StoreError>> + Send;

    /// Records the outcome of a batch. Called exactly once per non-empty batch, after its last
    /// publish ended.
    ///
    /// # Errors
    /// [`StoreError`] on an outage: nothing more is confirmed, so the rows not yet confirmed are
    /// handed out again later (same event ids).
    fn settle(
        &self,
        ticket: Self::Ticket,
        settlement: &Settlement,
    ) -> impl Future<Output = Result<SettleReport, StoreError>> + Send;

    /// Waits until new events may be pending or `timeout` passed. The default sleeps; feeds with
    /// a wake-up channel return early.
    fn wait_for_work(&self, timeout: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(timeout)
    }

    /// The outbox's numbers for the relay's gauges, when the feed can count them (`None`: the
    /// gauges are left alone).
    ///
    /// # Errors
    /// [`StoreError`] on an outage.
    fn stats(&self) -> impl Future<Output = Result<Option<OutboxStats>, StoreError>> + Send {
        async { Ok(None) }
    }
}

/// The polling feed: claims rows from an [`OutboxStore`] under a lease, settles them with writes
/// fenced by the lease token.
///
/// # Solo takeovers
///
/// With [`PollingFeed::with_solo_takeovers`] (what the relay does when the poison-row rule is
/// on), normal claims are [`ClaimScope::Free`]: they take an aggregate over from an expired
/// lease only the first time (so a crashed relay's aggregates go out again at full speed).
/// An aggregate whose takeover expired unsettled too is handed out alone, its head row only,
/// by a [`ClaimScope::TakeOver`] claim, one aggregate per batch. A relay that crashes while it
/// publishes such a batch held nothing else, so the next count is that row's alone; the
/// innocent aggregates of a batch that crashed twice go out one by one and count 2 at most.
#[derive(Debug)]
pub struct PollingFeed<S> {
    store: std::sync::Arc<S>,
    max_per_aggregate: usize,
    lease: Duration,
    /// How often to look for expired leases when the last look found none (`None`: normal
    /// claims take them over with the rest).
    solo_takeovers: Option<Duration>,
    next_takeover_check: std::sync::Mutex<Instant>,
    /// Shared by normal batches, exclusive for a solo takeover from before its claim to its
    /// settle: while a solo batch is out, no other batch of this process is, so a crash then
    /// is that row's alone.
    gate: std::sync::Arc<tokio::sync::RwLock<()>>,
}

/// The ticket of a [`PollingFeed`] batch: its lease token, and with solo takeovers the
/// process-wide guard the batch holds until it is settled.
#[derive(Debug)]
pub struct PollingTicket {
    /// The claim's lease token.
    pub token: LeaseToken,
    _guard: Option<BatchGuard>,
}

#[derive(Debug)]
#[allow(dead_code)] // held for its drop only
enum BatchGuard {
    Shared(tokio::sync::OwnedRwLockReadGuard<()>),
    Solo(tokio::sync::OwnedRwLockWriteGuard<()>),
}

impl<S> PollingFeed<S> {
    /// A feed over `store` claiming at most `max_per_aggregate` rows of one aggregate per batch,
    /// under a lease of `lease`.
    pub fn new(store: std::sync::Arc<S>, max_per_aggregate: usize, lease: Duration) -> Self {
        Self {
            store,
            max_per_aggregate,
            lease,
            solo_takeovers: None,
            next_takeover_check: std::sync::Mutex::new(Instant::now()),
            gate: Default::default(),
        }
    }

    /// Takes aggregates over from repeatedly expired leases one at a time (see the type's
    /// docs), looking for them at most every `check_every` while none are found, and at every
    /// batch while they are. A look is the store's cheap [`OutboxStore::takeovers_waiting`];
    /// only when it finds some does the claim wait until this process's other batches are
    /// settled (the relay looks every [`super::SOLO_TAKEOVER_CHECK`]).
    #[must_use]
    pub fn with_solo_takeovers(mut self, check_every: Duration) -> Self {
        self.solo_takeovers = Some(check_every);
        self
    }

    fn takeover_due(&self) -> bool {
        self.solo_takeovers.is_some()
            && Instant::now()
                >= *self
                    .next_takeover_check
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
    }

    /// The store.
    pub fn store(&self) -> &std::sync::Arc<S> {
        &self.store
    }

    /// Pushes the next solo-takeover look `check_every` away.
    fn takeover_checked(&self) {
        if let Some(every) = self.solo_takeovers {
            *self
                .next_takeover_check
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Instant::now() + every;
        }
    }
}

impl<S: OutboxStore> PollingFeed<S> {
    /// Whether a solo-takeover claim is worth its exclusive turn: the store's cheap look
    /// ([`OutboxStore::takeovers_waiting`]). When it says no, the next look is `check_every`
    /// away.
    async fn takeover_candidates(&self) -> Result<bool, StoreError> {
        let waiting = self.store.takeovers_waiting().await?;
        if !waiting {
            self.takeover_checked();
        }
        Ok(waiting)
    }
}

impl<S: OutboxStore> Feed for PollingFeed<S> {
    type Ticket = PollingTicket;

    async fn next_batch(&self, max_rows: usize) -> Result<FeedBatch<PollingTicket>, StoreError> {
        // Measured before the claim is sent: the local deadline is never later than the
        // database's `now() + lease`.
        let mut started = Instant::now();
        // A solo takeover, when one is due. Claimed only once this process's other batches
        // are settled (new ones wait), so that nothing else can be caught in its crash.
        if self.takeover_due() && self.takeover_candidates().await? {
            let exclusive = std::sync::Arc::clone(&self.gate).write_owned().await;
            started = Instant::now();
            let batch = self
                .store
                .claim_batch(ClaimParams {
                    max_rows: 1,
                    max_per_aggregate: 1,
                    lease: self.lease,
                    scope: ClaimScope::TakeOver,
                })
                .await?;
            if !batch.messages.is_empty() || !batch.undecodable.is_empty() {
                return Ok(FeedBatch {
                    ticket: PollingTicket {
                        token: batch.token,
                        _guard: Some(BatchGuard::Solo(exclusive)),
                    },
                    messages: batch.messages,
                    owned_until: Some(started + self.lease),
                    takeovers: batch.takeovers,
                    undecodable: batch.undecodable,
                    liveness: batch.liveness,
                });
            }
            self.takeover_checked();
        }
        let guard = match self.solo_takeovers {
            Some(_) => Some(BatchGuard::Shared(
                std::sync::Arc::clone(&self.gate).read_owned().await,
            )),
            None => None,
        };
        started = started.max(Instant::now());
        let ClaimedBatch {
            token,
            messages,
            takeovers,
            undecodable,
            liveness,
        } = self
            .store
            .claim_batch(ClaimParams {
                max_rows,
                max_per_aggregate: self.max_per_aggregate,
                lease: self.lease,
                scope: if self.solo_takeovers.is_some() {
                    ClaimScope::Free
                } else {
                    ClaimScope::All
                },
            })
            .await?;
        Ok(FeedBatch {
            ticket: PollingTicket {
                token,
                _guard: guard,
            },
            messages,
            owned_until: Some(started + self.lease),
            takeovers,
            undecodable,
            liveness,
        })
    }

    async fn settle(
        &self,
        ticket: PollingTicket,
        settlement: &Settlement,
    ) -> Result<SettleReport, StoreError> {
        let token = ticket.token;
        let mut report = SettleReport::default();
        if !settlement.published.is_empty() {
            let marked = self
                .store
                .mark_published(MarkParams {
                    token,
                    ids: &settlement.published,
                })
                .await? as usize;
            report.marked = marked;
            report.lease_lost = settlement.published.len() - marked.min(settlement.published.len());
        }
        for failed in &settlement.failed {
            let owned = self
                .store
                .record_failure(FailureParams {
                    token,
                    id: failed.id,
                    error: &failed.error,
                    retry_after: failed.retry_after,
                })
                .await?;
            match (owned, failed.retry_after) {
                (false, _) => report.lease_lost += 1,
                (true, Some(_)) => report.retried += 1,
                (true, None) => report.dead_lettered += 1,
            }
        }
        // Always last: ends the claim, so the aggregates are free for the next claim at once.
        self.store
            .release(ReleaseParams {
                token,
                ids: &settlement.not_attempted,
            })
            .await?;
        report.released = settlement.not_attempted.len();
        Ok(report)
    }

    fn wait_for_work(&self, timeout: Duration) -> impl Future<Output = ()> + Send {
        self.store.wait_for_work(timeout)
    }

    async fn stats(&self) -> Result<Option<OutboxStats>, StoreError> {
        self.store.stats().await.map(Some)
    }
}
