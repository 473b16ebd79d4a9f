//! Maintenance jobs, run by one elected instance: inbox retention that cannot delete a dedup
//! identity inside the replay horizon (G9), deletion of old settled work items, retention of
//! published outbox rows (stores that keep them, in a mark mode), and reaping of
//! relay leases left behind by crashed relays. Written once against [`MaintenanceStore`].
//!
//! An inbox row is what makes a redelivery harmless. Deleting it while the same event can still
//! arrive again (the broker still holds it, the outbox can still republish it, an operator can
//! still requeue it) would let that event apply twice. So the retention must be at least the
//! *replay horizon*: the longest of those windows. [`InboxRetention::validate`] refuses a
//! configuration that breaks this, naming both numbers; the [`Maintainer`] deletes old rows in
//! small batches, and only on the one instance that won the election.
//!
//! # Election
//!
//! Every process may run a maintainer; each round, a maintainer asks its store to elect it on a
//! dedicated session ([`MaintenanceStore::maintainer_elect`], e.g. a database session holding an
//! advisory lock). Leadership lives as long as that session: if the leader dies or its
//! connection breaks, the store releases it and another instance takes over at its next round. A
//! leader that loses its session stops deleting at once (its next statement fails) and competes
//! again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::error::{ConfigError, StoreError};

/// The windows during which an already-processed event can be delivered again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayHorizon {
    /// How long the broker keeps messages a consumer may re-read (a stream's maximum age, a
    /// replayable queue's retention). Use the stream's configured value, not a hope.
    pub broker_retention: Duration,
    /// How long published outbox rows are kept and can be republished (mark mode, replays).
    pub outbox_retention: Duration,
    /// How long after failing a dead letter (outbox or consumer) may still be requeued.
    pub dead_letter_requeue_window: Duration,
}

impl ReplayHorizon {
    /// The longest window and its name.
    pub fn longest(&self) -> (Duration, &'static str) {
        [
            (self.broker_retention, "broker_retention"),
            (self.outbox_retention, "outbox_retention"),
            (
                self.dead_letter_requeue_window,
                "dead_letter_requeue_window",
            ),
        ]
        .into_iter()
        .max_by_key(|(d, _)| *d)
        .expect("three candidates")
    }
}

/// Why a retention configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsafe inbox retention: keep = {keep_secs} s is shorter than the replay horizon {horizon_secs} s ({horizon_name}); an event replayed after its inbox identity was deleted would apply twice. Raise the retention to at least {horizon_secs} s or shorten {horizon_name}"
)]
pub struct RetentionError {
    /// The configured retention, seconds.
    pub keep_secs: u64,
    /// The replay horizon, seconds.
    pub horizon_secs: u64,
    /// Which window sets the horizon.
    pub horizon_name: &'static str,
}

/// Inbox retention: how long identities are kept, and the horizon that keep must cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxRetention {
    /// Keep inbox identities at least this long after they were received.
    pub keep: Duration,
    /// The replay horizon it must cover.
    pub horizon: ReplayHorizon,
}

impl InboxRetention {
    /// Refuses a retention shorter than the replay horizon.
    ///
    /// # Errors
    /// [`RetentionError`] naming both numbers.
    pub fn validate(&self) -> Result<(), RetentionError> {
        let (horizon, name) = self.horizon.longest();
        if self.keep < horizon {
            return Err(RetentionError {
                keep_secs: self.keep.as_secs(),
                horizon_secs: horizon.as_secs(),
                horizon_name: name,
            });
        }
        Ok(())
    }
}

/// What the [`Maintainer`] does each round, on the elected instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaintenanceConfig {
    /// Delete inbox identities older than the retention's `keep` (refused inside the horizon).
    pub inbox: Option<InboxRetention>,
    /// Delete `succeeded` work items resolved more than this long ago. Items in any other state
    /// (pending, in progress, unknown, and failed ones an operator may still resend) are kept.
    pub work_items_keep: Option<Duration>,
    /// Delete published outbox rows kept by the store (in a mark mode) that were
    /// published more than this long ago. Pending and dead rows are never touched. With
    /// [`MaintenanceConfig::inbox`] set, it may not exceed the horizon's `outbox_retention`:
    /// a published row can be replayed while it is kept, so the inbox must remember it as long.
    pub published_keep: Option<Duration>,
    /// Delete relay leases that expired more than this long ago (left by crashed relays; a live
    /// relay deletes its own when it settles a batch).
    pub lease_reap_after: Option<Duration>,
    /// Rows deleted per statement (short transactions, little lock time).
    pub batch_size: i64,
    /// Pause between rounds.
    pub interval: Duration,
}

impl Default for MaintenanceConfig {
    /// Nothing enabled; batches of 1,000 every 60 s.
    fn default() -> Self {
        Self {
            inbox: None,
            work_items_keep: None,
            published_keep: None,
            lease_reap_after: None,
            batch_size: 1000,
            interval: Duration::from_secs(60),
        }
    }
}

impl MaintenanceConfig {
    /// How old rows of `what` must be to be deleted; `None` when that job is off.
    fn keep(&self, what: Purge) -> Option<Duration> {
        match what {
            Purge::Inbox => self.inbox.map(|r| r.keep),
            Purge::WorkItems => self.work_items_keep,
            Purge::Published => self.published_keep,
            Purge::Leases => self.lease_reap_after,
        }
    }

    /// Checks the values.
    ///
    /// # Errors
    /// [`ConfigError`]: key `inbox.keep` for a retention inside the replay horizon (the reason
    /// is the [`RetentionError`] naming both numbers), `published_keep` longer than the
    /// horizon's `outbox_retention`, `batch_size` below 1, `interval` zero.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(r) = &self.inbox {
            r.validate()
                .map_err(|e| ConfigError::new("inbox.keep", e.to_string()))?;
            if let Some(keep) = self.published_keep
                && keep > r.horizon.outbox_retention
            {
                return Err(ConfigError::new(
                    "published_keep",
                    format!(
                        "published outbox rows are kept {} s, longer than the replay horizon's \
                         outbox_retention of {} s: a row replayed after the inbox forgot its \
                         event would apply twice. Set outbox_retention to at least {} s",
                        keep.as_secs(),
                        r.horizon.outbox_retention.as_secs(),
                        keep.as_secs()
                    ),
                ));
            }
        }
        if self.batch_size < 1 {
            return Err(ConfigError::new("batch_size", "must be at least 1"));
        }
        if self.interval.is_zero() {
            return Err(ConfigError::new("interval", "must be positive"));
        }
        Ok(())
    }
}

/// The store side of maintenance. Every delete works in batches of at most `limit` rows.
pub trait MaintenanceStore: Send + Sync + 'static {
    /// A dedicated session that carries leadership (for example a database connection outside
    /// the pool, holding a session-level lock).
    type Session: Send;

    /// Opens a session.
    ///
    /// # Errors
    /// [`StoreError`], kind `Unavailable` on an outage.
    fn maintenance_session(&self)
    -> impl Future<Output = Result<Self::Session, StoreError>> + Send;

    /// Makes `session` the maintainer if no other session is; true when it is (now or already).
    ///
    /// # Errors
    /// [`StoreError`]; the session should be dropped and a new one opened.
    fn maintainer_elect<'a>(
        &'a self,
        session: &'a mut Self::Session,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send + 'a;

    /// Deletes up to `limit` rows of `what` older than `older_than` (which rows, and what a
    /// purge never touches, is said on each [`Purge`]); returns how many it deleted. The
    /// [`Maintainer`] calls it again until a batch comes back short of `limit`.
    ///
    /// # Errors
    /// [`StoreError`] when the store could not run the delete: kind `Unavailable` on an outage
    /// or a broken session, `PermissionDenied` when the store's role lacks the maintainer's
    /// grants. The session should then be dropped and a new one opened.
    fn purge<'a>(
        &'a self,
        session: &'a mut Self::Session,
        what: Purge,
        older_than: Duration,
        limit: i64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send + 'a;
}

/// What one [`MaintenanceStore::purge`] deletes: one job of a maintenance round. Every store
/// handles all of them (hence no `#[non_exhaustive]`: a new one must reach every store).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purge {
    /// Inbox identities received more than `older_than` ago.
    Inbox,
    /// `succeeded` work items resolved more than `older_than` ago; items in any other state
    /// (pending, in progress, unknown, failed) are kept.
    WorkItems,
    /// Published outbox rows published more than `older_than` ago: never a pending or dead row,
    /// and never waiting on a relay's locks. A store that deletes rows when they are published
    /// has none and returns 0.
    Published,
    /// Relay leases that expired more than `older_than` ago (left by crashed relays; a live
    /// relay deletes its own when it settles a batch).
    Leases,
}

impl Purge {
    /// Every purge, in the order a [`Maintainer`] round runs them.
    pub const ALL: [Purge; 4] = [
        Purge::Inbox,
        Purge::WorkItems,
        Purge::Published,
        Purge::Leases,
    ];
}

/// Runs the maintenance jobs of a [`MaintenanceConfig`] on exactly one instance at a time.
pub struct Maintainer<S> {
    store: Arc<S>,
    config: MaintenanceConfig,
}

impl<S> std::fmt::Debug for Maintainer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maintainer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What one election + maintenance round deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Inbox identities.
    pub inbox: u64,
    /// Settled work items.
    pub work_items: u64,
    /// Published outbox rows.
    pub published: u64,
    /// Relay leases.
    pub leases: u64,
}

impl RoundReport {
    /// Rows deleted in all.
    pub fn total(&self) -> u64 {
        self.inbox + self.work_items + self.published + self.leases
    }

    /// The count of `what`.
    fn count_mut(&mut self, what: Purge) -> &mut u64 {
        match what {
            Purge::Inbox => &mut self.inbox,
            Purge::WorkItems => &mut self.work_items,
            Purge::Published => &mut self.published,
            Purge::Leases => &mut self.leases,
        }
    }
}

impl<S: MaintenanceStore> Maintainer<S> {
    /// A maintainer; refuses an unsafe or inconsistent configuration.
    ///
    /// # Errors
    /// [`ConfigError`] from [`MaintenanceConfig::validate`].
    pub fn new(store: impl Into<Arc<S>>, config: MaintenanceConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            store: store.into(),
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MaintenanceConfig {
        &self.config
    }

    /// One election + maintenance round on `session`. Returns `Ok(None)` when another instance
    /// is the maintainer.
    ///
    /// # Errors
    /// [`StoreError`]; the session should then be dropped.
    pub async fn round(&self, session: &mut S::Session) -> Result<Option<RoundReport>, StoreError> {
        if !self.store.maintainer_elect(session).await? {
            return Ok(None);
        }
        let limit = self.config.batch_size;
        let mut report = RoundReport::default();
        for what in Purge::ALL {
            let Some(age) = self.config.keep(what) else {
                continue;
            };
            // Batches until one comes back short: each is its own statement, so a long purge
            // never holds locks for long.
            loop {
                let n = self.store.purge(session, what, age, limit).await?;
                *report.count_mut(what) += n;
                if n < limit as u64 {
                    break;
                }
            }
        }
        Ok(Some(report))
    }

    /// Opens a session and runs one round on it (a one-shot cleanup).
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn round_once(&self) -> Result<Option<RoundReport>, StoreError> {
        let mut session = self.store.maintenance_session().await?;
        self.round(&mut session).await
    }

    /// Runs rounds every `interval` until `shutdown`, keeping one session (and with it the
    /// leadership) across rounds and opening a new one after an error.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut session: Option<S::Session> = None;
        while !shutdown.is_cancelled() {
            if session.is_none() {
                match self.store.maintenance_session().await {
                    Ok(s) => session = Some(s),
                    Err(e) => warn!(error = %e, "maintainer cannot open its session"),
                }
            }
            if let Some(s) = session.as_mut() {
                match self.round(s).await {
                    Ok(Some(r)) if r.total() > 0 => info!(
                        inbox = r.inbox,
                        work_items = r.work_items,
                        published = r.published,
                        leases = r.leases,
                        "maintenance: old rows deleted"
                    ),
                    Ok(_) => {}
                    Err(e) => {
                        warn!(error = %e, "maintainer lost its session; competing again");
                        session = None;
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.config.interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(b: u64, o: u64, d: u64) -> ReplayHorizon {
        ReplayHorizon {
            broker_retention: Duration::from_secs(b),
            outbox_retention: Duration::from_secs(o),
            dead_letter_requeue_window: Duration::from_secs(d),
        }
    }

    #[test]
    fn retention_shorter_than_the_horizon_is_refused_with_both_numbers() {
        let r = InboxRetention {
            keep: Duration::from_secs(3600),
            horizon: h(86_400, 0, 7_200),
        };
        let e = r.validate().unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("3600") && text.contains("86400") && text.contains("broker_retention"),
            "{text}"
        );
        assert!(
            InboxRetention {
                keep: Duration::from_secs(86_400),
                ..r
            }
            .validate()
            .is_ok()
        );
        assert_eq!(
            h(1, 5, 3).longest(),
            (Duration::from_secs(5), "outbox_retention")
        );
        let c = MaintenanceConfig {
            inbox: Some(r),
            ..MaintenanceConfig::default()
        };
        let e = c.validate().unwrap_err();
        assert_eq!(e.key, "inbox.keep");
        assert!(e.to_string().contains("86400"), "{e}");
    }

    #[test]
    fn published_rows_kept_beyond_the_horizon_are_refused() {
        let inbox = InboxRetention {
            keep: Duration::from_secs(10 * 86_400),
            horizon: h(86_400, 3 * 86_400, 0),
        };
        let config = |published: u64| MaintenanceConfig {
            inbox: Some(inbox),
            published_keep: Some(Duration::from_secs(published)),
            ..MaintenanceConfig::default()
        };
        assert!(config(3 * 86_400).validate().is_ok());
        let e = config(5 * 86_400).validate().unwrap_err();
        assert_eq!(e.key, "published_keep");
        let text = e.to_string();
        assert!(text.contains("432000") && text.contains("259200"), "{text}");
        // Without an inbox there is nothing to outlive.
        let alone = MaintenanceConfig {
            inbox: None,
            ..config(5 * 86_400)
        };
        assert!(alone.validate().is_ok());
    }
}
