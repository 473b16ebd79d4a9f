//! Running a relay on PostgreSQL is one library call, in either mode: [`PgRelay`] makes the
//! start-up checks, ties the leases to a live session, elects a lease reaper, writes the
//! heartbeat, and runs the core's [`Relay`] over the polling feed ([`RelayMode::Polling`]) or
//! over the CDC feed with its slot handling ([`RelayMode::Cdc`]) until the shutdown token is
//! cancelled. `outbox relay` is this call with its configuration parsed; a service that embeds
//! the relay makes the same call and gets the same checks.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool, transport: std::sync::Arc<impl outbox_core::Transport>)
//! # -> Result<(), outbox_postgres::relay::RelayError> {
//! use outbox_core::relay::RelayConfig;
//! use outbox_postgres::relay::{PgRelay, RelayMode};
//! use outbox_postgres::{PgStore, PgStoreConfig};
//! let store = PgStore::new(pool, PgStoreConfig::default());
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! PgRelay::new(store, RelayConfig::default(), RelayMode::Polling)
//!     .run(transport, shutdown)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! **Start-up checks** ([`PgRelay::check`], made again by [`PgRelay::run`]): the schema is at
//! this release's version; the pool's role holds every grant the relay needs (the error names
//! each missing one, rather than the first claim failing); in mark mode, the mark-mode indexes
//! (a warning only: a relay started before `outbox migrate` built them still delivers); in CDC
//! mode, the publication of the outbox table exists and the slot exists (or is created when
//! [`CdcRelayOptions::create_slot`]).
//!
//! **While it runs**: with a live session ([`PgRelay::with_live_session`], the default), the
//! relay claims over a pool of its own, opened with the given pool's connect options and size
//! plus the server-side timeouts that end its connections when it is cut off
//! ([`session::relay_connect_options`]); the given pool is left as it is (a service may share
//! it with its producers), and the store's settings are kept. Every claim is tied to the session
//! ([`PgSession`]); one relay per schema is elected to delete leases that expired
//! [`PgRelay::with_lease_reaper`] ago (crashed relays'); a heartbeat (`instances`, name
//! `polling` or `cdc`) carries the relay's publishes per route and its health. A CDC relay also
//! writes a log message every [`CdcRelayOptions::heartbeat_every`] (so an idle outbox on a busy
//! database does not keep the WAL) and looks at its slot every 2 s: the slot's lag goes to the
//! [`cdc::metric`] gauges, and a slot dropped or invalidated stops the relay with
//! [`RelayError::SlotLost`] (never a silent continuation). On shutdown, the batches in flight
//! settle, the heartbeat records the stop, a CDC relay confirms its last position, and the live
//! session resigns (what is left is taken over at once).

use std::sync::Arc;
use std::time::Duration;

use outbox_core::health::Readiness;
use outbox_core::maintenance::{Maintainer, MaintenanceConfig};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::{ConfigError, StoreError, Transport};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cdc::{self, CdcConfig, CdcError, CdcFeed};
use crate::heartbeat::{Heartbeat, InstanceKind, InvalidName};
use crate::permission::Component;
use crate::roles::{RolesError, check_privileges};
use crate::session::{self, PgSession, SessionConfig};
use crate::{ClaimWindow, OnPublish, PgStore};

/// Relay leases that expired this long ago belong to crashed relays: the elected reaper
/// deletes them (the default of [`PgRelay::with_lease_reaper`]).
pub const LEASE_REAP_AFTER: Duration = Duration::from_secs(600);

/// How often a CDC relay looks at its slot.
const SLOT_WATCH: Duration = Duration::from_secs(2);

/// How a relay finds the rows to publish.
#[derive(Debug, Clone)]
pub enum RelayMode {
    /// Claims committed rows from the table under leases (several relays share the work).
    Polling,
    /// Streams committed inserts from a logical replication slot (one relay streams; others
    /// wait for the slot).
    Cdc(CdcRelayOptions),
}

/// A CDC relay's settings.
#[derive(Debug, Clone)]
pub struct CdcRelayOptions {
    /// The database URL of the replication connection (a role with `REPLICATION`).
    pub database_url: String,
    /// The slot, the publication and the stream's bounds.
    pub cdc: CdcConfig,
    /// Create the slot when it is missing (the first start). Without it a missing slot refuses
    /// the start ([`RelayError::NoSlot`]): a slot that existed before was dropped, and events
    /// committed meanwhile were never streamed.
    pub create_slot: bool,
    /// A log message this often, so that the slot advances while the outbox is idle; `None`
    /// writes none.
    pub heartbeat_every: Option<Duration>,
}

/// Why a relay could not start, or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The database is unreachable, or the schema is missing or at another version.
    #[error("cannot start the relay")]
    Store(#[source] StoreError),
    /// The pool's role lacks grants the relay needs (the source names each).
    #[error("cannot start the relay")]
    Privileges(#[from] RolesError),
    /// A setting is invalid.
    #[error("invalid relay configuration")]
    Config(#[from] ConfigError),
    /// The live session could not be started.
    #[error("cannot start the relay's database session")]
    Session(#[source] StoreError),
    /// The relay's pool for its live session could not be opened.
    #[error("cannot start the relay")]
    Database(#[from] sqlx::Error),
    /// The heartbeat's name was refused.
    #[error("cannot start the relay")]
    Heartbeat(#[from] InvalidName),
    /// CDC: the publication of the outbox table does not exist.
    #[error(
        "cannot start the CDC relay: publication `{publication}` of {schema}.events does not \
         exist; run `outbox migrate` with relay.mode = \"cdc\""
    )]
    NoPublication {
        /// The publication's name.
        publication: String,
        /// The schema.
        schema: String,
    },
    /// CDC: the slot does not exist and was not to be created.
    #[error(
        "cannot start the CDC relay: replication slot `{slot}` does not exist. On the first \
         start, pass --create-slot. If it existed before, it was dropped: recover as the guide \
         says (docs/guide/src/relay.md, \"a lost slot\"): drain with the polling relay, then \
         start again with --create-slot"
    )]
    NoSlot {
        /// The slot's name.
        slot: String,
    },
    /// CDC: the slot could not be created.
    #[error("cannot create the CDC relay's slot")]
    CreateSlot(#[source] CdcError),
    /// CDC: the publication or the slot could not be read.
    #[error("cannot start the CDC relay")]
    Cdc(#[from] CdcError),
    /// CDC: the slot was dropped or invalidated while the relay ran; it stopped.
    #[error(
        "the CDC relay stopped: {reason}. Recover as the guide says (docs/guide/src/relay.md, \
         \"a lost slot\")"
    )]
    SlotLost {
        /// What happened to the slot.
        reason: String,
    },
}

/// A relay over a [`PgStore`], ready to [`run`](Self::run) (see the module docs).
#[derive(Debug)]
pub struct PgRelay {
    /// Whether [`PgRelay::check`] passed: [`PgRelay::run`] does not make the checks again.
    checked: std::sync::atomic::AtomicBool,
    store: PgStore,
    config: RelayConfig,
    mode: RelayMode,
    session: Option<SessionConfig>,
    claim_window: bool,
    lease_reap_after: Option<Duration>,
    readiness: Readiness,
}

impl PgRelay {
    /// A relay over `store` in `mode`, with a live session of the default settings, no claim
    /// window, and the lease reaper at [`LEASE_REAP_AFTER`].
    pub fn new(store: PgStore, config: RelayConfig, mode: RelayMode) -> Self {
        Self {
            checked: std::sync::atomic::AtomicBool::new(false),
            store,
            config,
            mode,
            session: Some(SessionConfig::default()),
            claim_window: false,
            lease_reap_after: Some(LEASE_REAP_AFTER),
            readiness: Readiness::new(),
        }
    }

    /// The relay's readiness (a clonable handle; take it before [`run`](Self::run)): `starting`
    /// until the checks passed and the engine runs, then ready once its first claim went through
    /// (a CDC relay's: its replication stream answered) and unless its health is `failing`,
    /// and `stopped` once `run` returns. `outbox relay` serves it as `GET /readyz`.
    pub fn readiness(&self) -> Readiness {
        self.readiness.clone()
    }

    /// The live session's settings; `None` ties no lease to a session (a crashed relay's
    /// leases then wait for their expiry; needed behind a pooler that refuses the session's
    /// start-up options).
    #[must_use]
    pub fn with_live_session(mut self, session: Option<SessionConfig>) -> Self {
        self.session = session;
        self
    }

    /// Claims through the claim window ([`ClaimWindow`], polling mode); the store's own
    /// setting is kept when this is off.
    #[must_use]
    pub fn with_claim_window(mut self, on: bool) -> Self {
        self.claim_window = on;
        self
    }

    /// How long after their expiry the elected reaper deletes crashed relays' leases; `None`
    /// runs no reaper.
    #[must_use]
    pub fn with_lease_reaper(mut self, after: Option<Duration>) -> Self {
        self.lease_reap_after = after;
        self
    }

    /// The start-up checks (see the module docs); creates the CDC slot when asked to.
    ///
    /// # Errors
    /// [`RelayError::Store`] (unreachable, schema), [`RelayError::Privileges`] (naming every
    /// missing grant), [`RelayError::NoPublication`], [`RelayError::NoSlot`],
    /// [`RelayError::Cdc`].
    pub async fn check(&self) -> Result<(), RelayError> {
        let store = &self.store;
        store.check().await.map_err(RelayError::Store)?;
        check_privileges(store.pool(), store.schema(), Component::Relay).await?;
        if store.config().on_publish == OnPublish::Mark {
            warn_missing_mark_mode_indexes(store).await;
        }
        if let RelayMode::Cdc(options) = &self.mode {
            check_slot(store, options).await?;
        }
        self.checked
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Runs the relay until `shutdown` is cancelled (see the module docs), after
    /// [`check`](Self::check) unless it passed already. `shutdown` itself is only watched: a
    /// relay that stops on its own (an invalid configuration, a lost slot) returns its error
    /// and cancels nothing the caller shares with other work.
    ///
    /// # Errors
    /// What [`check`](Self::check) returns; [`RelayError::Session`] or
    /// [`RelayError::Database`] when the live session cannot start; [`RelayError::Config`] for
    /// an invalid relay configuration; [`RelayError::SlotLost`] when a CDC relay's slot was
    /// dropped or invalidated while it ran.
    pub async fn run<T: Transport>(
        self,
        transport: Arc<T>,
        shutdown: CancellationToken,
    ) -> Result<(), RelayError> {
        // Not ready once `run` returns, however it returns (an error, a panic, a drop).
        let _stopped = StoppedOnDrop(self.readiness.clone());
        if !self.checked.load(std::sync::atomic::Ordering::Relaxed) {
            self.check().await?;
        }
        // The relay's own stop: the caller's token stops it, and a relay that stops on its
        // own stops its helpers, not the caller's other work.
        let shutdown = shutdown.child_token();
        let (store, session) = match self.session {
            Some(config) => live_session(self.store, config).await?,
            None => (self.store, None),
        };
        let store = if self.claim_window {
            store.with_claim_window(ClaimWindow::default())
        } else {
            store
        };
        let store = Arc::new(store);
        let reaping = match self.lease_reap_after {
            Some(after) => {
                let reaper = Maintainer::<PgStore>::new(
                    Arc::clone(&store),
                    MaintenanceConfig {
                        lease_reap_after: Some(after),
                        ..Default::default()
                    },
                )?;
                Some(tokio::spawn(reaper.run(shutdown.clone())))
            }
            None => None,
        };
        let ready = &self.readiness;
        let result = match self.mode {
            RelayMode::Polling => {
                run_polling(&store, transport, self.config, ready, shutdown.clone()).await
            }
            RelayMode::Cdc(options) => {
                run_cdc(
                    &store,
                    transport,
                    self.config,
                    options,
                    ready,
                    shutdown.clone(),
                )
                .await
            }
        };
        shutdown.cancel();
        if let Some(reaping) = reaping {
            let _ = reaping.await;
        }
        // After the last batch was settled: what is left is taken over at once.
        if let Some(session) = session {
            session.close().await;
        }
        result
    }
}

/// Marks a relay's readiness `stopped` when dropped.
struct StoppedOnDrop(Readiness);

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        self.0.stopped();
    }
}

/// The polling relay until `shutdown`.
async fn run_polling<T: Transport>(
    store: &Arc<PgStore>,
    transport: Arc<T>,
    config: RelayConfig,
    ready: &Readiness,
    shutdown: CancellationToken,
) -> Result<(), RelayError> {
    let beat = heartbeat(store, "polling")?;
    let relay = Arc::new(Relay::new(Arc::clone(store), transport, config)?);
    // Stopped after the relay, so its last beat counts the last batch settled.
    let beat_stop = CancellationToken::new();
    let beat = tokio::spawn(
        beat.with_publish_activity(relay.activity())
            .with_health(relay.health())
            .run(beat_stop.clone()),
    );
    ready.started(relay.health());
    info!(schema = %store.schema(), "relay started");
    relay.run(shutdown).await;
    beat_stop.cancel();
    let _ = beat.await;
    Ok(())
}

/// The CDC relay until `shutdown`, or until its slot is lost.
async fn run_cdc<T: Transport>(
    store: &Arc<PgStore>,
    transport: Arc<T>,
    config: RelayConfig,
    options: CdcRelayOptions,
    ready: &Readiness,
    shutdown: CancellationToken,
) -> Result<(), RelayError> {
    let (pool, schema) = (store.pool().clone(), store.schema().clone());
    let slot = options.cdc.slot_name(&schema);
    let mut feed = CdcFeed::new(
        &options.database_url,
        pool.clone(),
        schema.clone(),
        options.cdc,
        store.config().on_publish,
    )
    .with_catch_up_claims(config.max_per_aggregate, config.lease);
    if let Some(session) = store.session() {
        feed = feed.with_session(session.clone());
    }
    let feed = Arc::new(feed);
    let relay = Arc::new(Relay::with_feed(Arc::clone(&feed), transport, config)?);
    if let Some(every) = options.heartbeat_every {
        tokio::spawn(log_heartbeats(pool.clone(), every, shutdown.clone()));
    }
    let watch = tokio::spawn(watch_slot(
        pool.clone(),
        slot.clone(),
        Arc::clone(&feed),
        shutdown.clone(),
    ));
    let beat_stop = CancellationToken::new();
    let beat = tokio::spawn(
        heartbeat(store, "cdc")?
            .with_publish_activity(relay.activity())
            .with_health(relay.health())
            .run(beat_stop.clone()),
    );
    ready.started(relay.health());
    info!(schema = %schema, %slot, "CDC relay started");
    relay.run(shutdown.clone()).await;
    shutdown.cancel();
    beat_stop.cancel();
    let _ = beat.await;
    // The last confirmed position reaches the server before the connection closes.
    if let Err(e) = feed.shutdown().await {
        warn!(error = %e, "closing the replication stream");
    }
    match watch.await {
        Ok(Some(reason)) => Err(RelayError::SlotLost { reason }),
        _ => Ok(()),
    }
}

/// The CDC start-up checks: the publication exists, the slot exists or is created.
async fn check_slot(store: &PgStore, options: &CdcRelayOptions) -> Result<(), RelayError> {
    let (pool, schema) = (store.pool(), store.schema());
    let slot = options.cdc.slot_name(schema);
    let publication = options.cdc.publication_name(schema);
    if !cdc::publication_exists(pool, schema, &publication).await? {
        return Err(RelayError::NoPublication {
            publication,
            schema: schema.as_str().to_owned(),
        });
    }
    if options.create_slot {
        if cdc::create_slot(pool, &slot)
            .await
            .map_err(RelayError::CreateSlot)?
        {
            info!(%slot, "replication slot created: events committed from now on are streamed");
        }
    } else if cdc::slot_state(pool, &slot).await?.is_none() {
        return Err(RelayError::NoSlot { slot });
    }
    Ok(())
}

/// A log message every `every` until `stop` (the slot advances while the outbox is idle).
async fn log_heartbeats(pool: sqlx::PgPool, every: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(every) => {}
        }
        if let Err(e) = cdc::heartbeat(&pool).await {
            warn!(error = %e, "could not write a CDC heartbeat");
        }
    }
}

/// Looks at the slot every [`SLOT_WATCH`] until `stop`: sets the lag gauges, and cancels
/// `stop` with the reason when the slot was dropped or invalidated.
async fn watch_slot(
    pool: sqlx::PgPool,
    slot: String,
    feed: Arc<CdcFeed>,
    stop: CancellationToken,
) -> Option<String> {
    loop {
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(SLOT_WATCH) => {}
        }
        metrics::gauge!(cdc::metric::SLOT_LAG_SECONDS).set(feed.lag().as_secs_f64());
        match cdc::slot_state(&pool, &slot).await {
            Ok(None) => {
                stop.cancel();
                return Some(format!("replication slot `{slot}` was dropped"));
            }
            Ok(Some(s)) if s.wal_status == "lost" => {
                stop.cancel();
                return Some(format!(
                    "replication slot `{slot}` was invalidated (wal_status lost: the server \
                     removed WAL it still needed, see max_slot_wal_keep_size)"
                ));
            }
            Ok(Some(s)) => {
                metrics::gauge!(cdc::metric::SLOT_RETAINED).set(s.retained_bytes as f64);
                metrics::gauge!(cdc::metric::SLOT_LAG).set(s.lag_bytes as f64);
            }
            Err(e) => warn!(error = %e, "could not read the slot's state"),
        }
    }
}

/// `store` over a pool of its own whose connections the server ends when the relay is cut off
/// ([`session::relay_connect_options`]), with its claims tied to a new live session. The given
/// pool is left open (its other users keep it).
async fn live_session(
    store: PgStore,
    config: SessionConfig,
) -> Result<(PgStore, Option<PgSession>), RelayError> {
    let given = store.pool();
    let options = session::relay_connect_options(&given.connect_options(), &config);
    let pool = PgPoolOptions::new()
        .max_connections(given.options().get_max_connections())
        .min_connections(given.options().get_min_connections())
        .acquire_timeout(given.options().get_acquire_timeout())
        .idle_timeout(given.options().get_idle_timeout())
        .max_lifetime(given.options().get_max_lifetime())
        .connect_with(options)
        .await?;
    let session = PgSession::start(&given.connect_options(), store.schema().clone(), config)
        .await
        .map_err(RelayError::Session)?;
    let store = store.over_pool(pool).with_session(session.clone());
    Ok((store, Some(session)))
}

/// The relay's heartbeat (`crate::heartbeat`): the console shows it as up, late or gone, with
/// what it published per route.
fn heartbeat(store: &PgStore, name: &str) -> Result<Heartbeat, InvalidName> {
    Heartbeat::new(store.clone(), InstanceKind::Relay, name)
}

/// In mark mode without the mark-mode indexes (`crate::migrate::missing_mark_mode_indexes`),
/// claims and the retention round read past published rows, slower as they accumulate. Not a
/// refusal, but said at start-up, with the command that builds them.
async fn warn_missing_mark_mode_indexes(store: &PgStore) {
    match crate::missing_mark_mode_indexes(store.pool(), store.schema()).await {
        Ok(missing) if missing.is_empty() => {}
        Ok(missing) => warn!(
            missing = %missing.join(", "),
            "relay.on_publish = \"mark\" without the mark-mode indexes: claims and the \
             retention of published rows slow down as published rows accumulate. Build them \
             with `outbox migrate` (with this configuration), which creates them concurrently, \
             without stopping the relay"
        ),
        Err(e) => warn!(error = %e, "cannot check the mark-mode indexes"),
    }
}
