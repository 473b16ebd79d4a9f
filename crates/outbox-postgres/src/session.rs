//! Leases tied to a live database session (G12): a relay's aggregates are taken over the moment
//! its session ends, not when their lease's clock runs out.
//!
//! # How it works
//!
//! A relay runs one [`PgSession`] and hands it to its store ([`crate::PgStore::with_session`]).
//! The session is a dedicated connection, outside the pool, that
//!
//! * takes a number from `lease_owner_seq` (its *owner*), holds the advisory lock
//!   `(class, owner)` in shared mode for as long as it lives (`class` is derived from the schema
//!   name, [`PgSession::lock_class`]), and registers the owner in `lease_owners` (schema 13);
//! * every [`SessionConfig::interval`] runs the **sweep**: each registered owner whose lock
//!   nobody holds (an exclusive `pg_try_advisory_xact_lock` succeeds) is gone, because the lock
//!   ends with the session that held it (the process died, its connection was cut or
//!   terminated). Such an owner is deleted and its live leases expired in one transaction (the
//!   expiry's snapshot taken once the owner's lock is held), and the relays are woken
//!   (`NOTIFY`): their next claims take the aggregates over, counting a takeover as a clock
//!   expiry does. Leases keep their tokens: every settle of the old owner stays fenced. A sweep
//!   that finds nobody gone is one statement over the small `lease_owners` table.
//!
//! Every lease a claim writes names the owner, and the claim's transaction first takes the same
//! lock in shared mode, then leases only while the owner is still registered. A sweep cannot
//! declare an owner gone while one of its claims is open (the claim's lock is held), and a claim
//! that starts after the sweep leases nothing: no lease can name an owner after it was swept.
//!
//! # The owner stops when it cannot know
//!
//! The sweep's answer is also the session's proof of life: a sweep sent at `t` and answered
//! means the session was alive after `t`, so a takeover (which needs it gone) comes after `t`.
//! Each answer [`Liveness::confirm`]s that publishes may start until `t + window`
//! ([`SessionConfig::window`]); the publish engine starts none after that, so a slow answer
//! pauses the publishes. A sweep that fails, or is not answered within
//! [`SessionConfig::server_timeout`], ends the session ([`Liveness::lose`]): its batches start
//! no publish again, and the keeper connects a new session, a new owner; the old owner's leases
//! are swept like any other's (by this relay's new session too).
//!
//! So a relay whose session ended starts no publish more than `window` after the database saw
//! it end (after `interval` plus the time to notice the error, normally), and survivors take its
//! aggregates over one sweep after the database saw it end. A publish already in flight at the
//! takeover may still reach the broker (up to `publish_timeout` later): a copy of an event the
//! survivor also publishes, never an event before its predecessor (each relay publishes an
//! aggregate's events one after another from its lowest unpublished one), and absorbed by the
//! inbox; what each broker shows is in the guide's failover chapter.
//!
//! # When the database cannot tell
//!
//! A holder cut off by the network, alive but unreachable, keeps its session open on the server
//! until the server notices. The session asks the server for TCP keepalives and a user timeout
//! of [`SessionConfig::server_timeout`], so the server closes it after about that time (Linux
//! servers; ignored over a Unix socket). Until then the clock-based lease stays the bound. The
//! holder itself stops starting publishes after `window`, long before.
//!
//! A session needs a direct connection or a session-mode pooler: a transaction-mode pooler
//! (PgBouncer's default `pool_mode = transaction`) would hand the lock's backend to others.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::{ConfigError, Liveness, StoreError, StoreErrorKind};
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::schema::{Schema, TAKEOVER};

/// Metric names of the session keeper.
pub mod metric {
    /// Gauge: 1 while this relay's database session is alive and confirmed, 0 otherwise.
    pub const SESSION_UP: &str = "outbox_relay_session_up";
    /// Counter: sessions of this relay that ended under it (failed or timed-out proofs of
    /// life); each means its batches stopped starting publishes and a new session began.
    pub const SESSIONS_LOST: &str = "outbox_relay_sessions_lost_total";
    /// Counter: leases this relay's sweeps expired because their owner's session had ended.
    pub const LEASES_ORPHANED: &str = "outbox_leases_orphaned_total";
}

/// Settings of a [`PgSession`].
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// How often the session proves itself alive and sweeps the owners that are gone: the
    /// larger part of the failover time after a crash.
    pub interval: Duration,
    /// How long after a proof of life was sent the relay may still start publishes without the
    /// next one answered: the longest a relay whose session ended goes on starting publishes.
    pub window: Duration,
    /// TCP keepalive and user timeout asked of the server for the session's connection: how
    /// long the server takes, about, to end the session of a holder cut off by the network.
    pub server_timeout: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(100),
            window: Duration::from_secs(1),
            server_timeout: Duration::from_secs(5),
        }
    }
}

impl SessionConfig {
    /// Checks the settings against each other.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad key: a zero interval, a window not longer than two
    /// intervals (every answer a little late would then pause the publishes), a server timeout
    /// under 2 s (the keepalive's granularity is a second).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.interval.is_zero() {
            return Err(ConfigError::new("interval", "must be positive"));
        }
        if self.window <= self.interval * 2 {
            return Err(ConfigError::new(
                "window",
                format!(
                    "must be longer than 2 x interval = {:?}, got {:?}",
                    self.interval * 2,
                    self.window
                ),
            ));
        }
        if self.server_timeout < Duration::from_secs(2) {
            return Err(ConfigError::new(
                "server_timeout",
                format!("must be at least 2 s, got {:?}", self.server_timeout),
            ));
        }
        Ok(())
    }
}

/// `options` for the connections of a relay whose leases a [`PgSession`] ties to its session:
/// the server ends a connection that stays idle inside a transaction, or whose peer stops
/// answering, after about `config.server_timeout` (`idle_in_transaction_session_timeout`, TCP
/// keepalives and user timeout). Without them, a relay cut off by the network in the middle of
/// a claim would keep that claim's row locks, and its aggregates, until the server's TCP stack
/// gave up (two hours by Linux's defaults), whatever the leases say.
pub fn relay_connect_options(
    options: &PgConnectOptions,
    config: &SessionConfig,
) -> PgConnectOptions {
    let secs = config.server_timeout.as_secs().max(2);
    let idle = (secs / 3).max(1);
    options.clone().options([
        (
            "idle_in_transaction_session_timeout",
            format!("{}", config.server_timeout.as_millis()),
        ),
        ("tcp_keepalives_idle", idle.to_string()),
        ("tcp_keepalives_interval", "1".to_owned()),
        ("tcp_keepalives_count", (secs - idle).max(1).to_string()),
        (
            "tcp_user_timeout",
            format!("{}", config.server_timeout.as_millis()),
        ),
    ])
}

const NEXT_OWNER: &str = "SELECT nextval('{s}.lease_owner_seq')::int4";
const LOCK: &str = "SELECT pg_try_advisory_lock_shared($1, $2)";
const REGISTER: &str = "INSERT INTO {s}.lease_owners (owner, pid) VALUES ($1, pg_backend_pid())";

/// The sweep's look (see the module docs), in a statement of its own: the owners whose lock
/// nobody holds. A failed try holds nothing; a successful one is released with the statement.
/// `$1` class, `$2` this session's owner (never tried: a backend's own shared lock does not
/// conflict with its exclusive try). The one statement of a sweep that finds nobody gone: a
/// look at the small `lease_owners` table.
const GONE: &str = "SELECT o.owner FROM {s}.lease_owners o \
    WHERE CASE WHEN o.owner = $2 THEN false ELSE pg_try_advisory_xact_lock($1, o.owner) END";

/// The sweep's removal, first statement of its transaction: the owners still gone, deleted,
/// their locks held until the commit.
const REMOVE: &str = "DELETE FROM {s}.lease_owners o \
    WHERE o.owner = ANY($3) \
      AND CASE WHEN o.owner = $2 THEN false ELSE pg_try_advisory_xact_lock($1, o.owner) END \
    RETURNING o.owner";

/// The sweep's expiry, second statement of the transaction, so its snapshot is taken once the
/// removed owners' locks are held: a claim of theirs that committed before is seen (and its
/// leases expired), one after waits for the commit and then finds its owner gone. Wakes the
/// relays when something expired (`$2` the channel).
const ORPHAN: &str = "WITH orphaned AS ( \
      UPDATE {s}.leases l SET lease_until = least(l.lease_until, now()), orphaned_at = now() \
      WHERE l.owner = ANY($1) AND l.lease_until > now() \
      RETURNING 1 \
    ), woken AS ( \
      SELECT pg_notify($2, '{takeover}') FROM (SELECT 1 FROM orphaned LIMIT 1) x \
    ) \
    SELECT (SELECT count(*) FROM orphaned), (SELECT count(*) FROM woken)";

/// A clean stop: this owner's live leases expired (normally none: the relay settled its
/// batches) and its row deleted, relays woken.
const RESIGN: &str = "WITH orphaned AS ( \
      UPDATE {s}.leases l SET lease_until = least(l.lease_until, now()), orphaned_at = now() \
      WHERE l.owner = $1 AND l.lease_until > now() RETURNING 1 \
    ), gone AS ( \
      DELETE FROM {s}.lease_owners WHERE owner = $1 RETURNING 1 \
    ), woken AS ( \
      SELECT pg_notify($2, '{takeover}') FROM (SELECT 1 FROM orphaned LIMIT 1) x \
    ) \
    SELECT (SELECT count(*) FROM orphaned), (SELECT count(*) FROM gone), \
      (SELECT count(*) FROM woken)";

/// The current session: its owner number and liveness.
#[derive(Debug, Clone)]
struct Current {
    owner: i32,
    liveness: Arc<Liveness>,
}

#[derive(Debug)]
struct Inner {
    current: Mutex<Option<Current>>,
    class: i32,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

/// A relay's live database session (see the [module docs](self)). Cheap to clone; the keeper
/// task runs until [`PgSession::close`] or until the last clone is dropped.
#[derive(Debug, Clone)]
pub struct PgSession {
    inner: Arc<Inner>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl PgSession {
    /// Connects the first session (with `options`, the pool's own:
    /// `pool.connect_options()`) and starts the keeper.
    ///
    /// # Errors
    /// [`StoreError`]: kind `Unavailable` when the first session cannot be opened in time (the
    /// database is down or unreachable), `Schema` when the schema predates version 13,
    /// `PermissionDenied` when the role lacks the relay's grants on `lease_owners`; invalid
    /// settings ([`SessionConfig::validate`]) as kind `Other`, naming the key.
    pub async fn start(
        options: &PgConnectOptions,
        schema: Schema,
        config: SessionConfig,
    ) -> Result<Self, StoreError> {
        config.validate().map_err(|e| {
            StoreError::new(
                StoreErrorKind::Other,
                format!("invalid session settings: {e}"),
            )
        })?;
        let keeper = Keeper {
            options: relay_connect_options(options, &config)
                .application_name("outbox relay session"),
            class: Self::lock_class(&schema),
            sql: Statements::new(&schema),
            channel: schema.wakeup_channel(),
            config,
        };
        let (conn, current) = keeper.open().await?;
        let inner = Arc::new(Inner {
            current: Mutex::new(Some(current)),
            class: keeper.class,
            stop: CancellationToken::new(),
            task: Mutex::new(None),
        });
        metrics::gauge!(metric::SESSION_UP).set(1.0);
        let weak = Arc::downgrade(&inner);
        let stop = inner.stop.clone();
        let task = tokio::spawn(keeper.run(conn, weak, stop));
        *inner.task.lock().unwrap_or_else(|e| e.into_inner()) = Some(task);
        Ok(Self { inner })
    }

    /// The advisory lock class of `schema`'s owners: the first 31 bits of a hash of the
    /// schema's name (FNV-1a), so that each schema's owners have their own locks. Advisory
    /// locks of the two-`int4` form; an application that uses the same form with the same class
    /// would share them.
    pub fn lock_class(schema: &Schema) -> i32 {
        let mut h: u32 = 0x811c_9dc5;
        for b in b"outbox.lease_owner:"
            .iter()
            .chain(schema.as_str().as_bytes())
        {
            h ^= u32::from(*b);
            h = h.wrapping_mul(0x0100_0193);
        }
        i32::try_from(h & 0x7fff_ffff).unwrap_or(0)
    }

    /// The advisory lock class of this session's schema.
    pub fn class(&self) -> i32 {
        self.inner.class
    }

    /// The owner number of the live session and its liveness; `None` while the keeper is
    /// connecting a new one.
    pub fn current(&self) -> Option<(i32, Arc<Liveness>)> {
        let current = self.inner.current.lock().unwrap_or_else(|e| e.into_inner());
        current
            .as_ref()
            .filter(|c| !c.liveness.is_lost())
            .map(|c| (c.owner, Arc::clone(&c.liveness)))
    }

    /// Ends the session cleanly: expires whatever leases its owner still holds (normally
    /// none: call it after the relay settled its last batch), deletes its owner row and closes
    /// the connection, so that other relays take over at once. Idempotent.
    pub async fn close(&self) {
        self.inner.stop.cancel();
        let task = self
            .inner
            .task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// The session's statements, rendered for the schema.
#[derive(Debug)]
struct Statements {
    next_owner: Arc<str>,
    register: Arc<str>,
    gone: Arc<str>,
    remove: Arc<str>,
    orphan: Arc<str>,
    resign: Arc<str>,
}

impl Statements {
    fn new(schema: &Schema) -> Self {
        let r = |t: &str| schema.render(&t.replace("{takeover}", TAKEOVER));
        Self {
            next_owner: r(NEXT_OWNER),
            register: r(REGISTER),
            gone: r(GONE),
            remove: r(REMOVE),
            orphan: r(ORPHAN),
            resign: r(RESIGN),
        }
    }
}

/// The keeper task's state.
struct Keeper {
    options: PgConnectOptions,
    class: i32,
    sql: Statements,
    channel: String,
    config: SessionConfig,
}

impl Keeper {
    /// Opens a session: connects, asks for the server's timeouts, takes an owner number and
    /// its lock, registers it. Bounded by `server_timeout`.
    async fn open(&self) -> Result<(PgConnection, Current), StoreError> {
        let started = Instant::now();
        let opened = tokio::time::timeout(self.config.server_timeout, async {
            let mut conn = self.options.connect().await?;
            loop {
                let owner: i32 =
                    sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.sql.next_owner)))
                        .fetch_one(&mut conn)
                        .await?;
                let locked: bool = sqlx::query_scalar(LOCK)
                    .bind(self.class)
                    .bind(owner)
                    .fetch_one(&mut conn)
                    .await?;
                if !locked {
                    // A number still locked by a sweep of its earlier holder (the sequence
                    // wrapped): take the next.
                    continue;
                }
                sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.register)))
                    .bind(owner)
                    .execute(&mut conn)
                    .await?;
                return Ok::<_, sqlx::Error>((conn, owner));
            }
        })
        .await;
        let (conn, owner) = match opened {
            Ok(Ok(opened)) => opened,
            Ok(Err(e)) => return Err(crate::error::store_error("relay session", e)),
            Err(_) => {
                return Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    format!(
                        "relay session: no session within {:?}",
                        self.config.server_timeout
                    ),
                ));
            }
        };
        let liveness = Arc::new(Liveness::new());
        liveness.confirm(started + self.config.window);
        info!(
            owner,
            "relay session started: its leases are taken over as soon as it ends"
        );
        Ok((conn, Current { owner, liveness }))
    }

    /// One sweep, which is also the proof of life. `Ok(orphaned leases)`.
    async fn sweep(&self, conn: &mut PgConnection, owner: i32) -> Result<i64, sqlx::Error> {
        let gone: Vec<i32> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.sql.gone)))
            .bind(self.class)
            .bind(owner)
            .fetch_all(&mut *conn)
            .await?;
        metrics::gauge!(metric::SESSION_UP).set(1.0);
        if gone.is_empty() {
            return Ok(0);
        }
        let mut tx = conn.begin().await?;
        let removed: Vec<i32> = sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.sql.remove)))
            .bind(self.class)
            .bind(owner)
            .bind(&gone)
            .fetch_all(&mut *tx)
            .await?;
        let row = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.orphan)))
            .bind(&removed)
            .bind(&self.channel)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        let orphaned: i64 = row.try_get(0)?;
        if !removed.is_empty() {
            info!(
                owners = ?removed,
                leases = orphaned,
                "relay sessions ended: their leases expired for takeover"
            );
            metrics::counter!(metric::LEASES_ORPHANED).increment(orphaned.max(0) as u64);
        }
        Ok(orphaned)
    }

    async fn run(self, conn: PgConnection, inner: std::sync::Weak<Inner>, stop: CancellationToken) {
        let set_current = |c: Option<Current>| {
            if let Some(inner) = inner.upgrade() {
                *inner.current.lock().unwrap_or_else(|e| e.into_inner()) = c;
            }
        };
        let mut current = match inner.upgrade() {
            Some(i) => i.current.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            None => None,
        };
        let mut conn = Some(conn);
        loop {
            let Some(c) = current.clone() else {
                // Between sessions: a new one, after a pause.
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(self.config.interval) => {}
                }
                match self.open().await {
                    Ok((new_conn, new_current)) => {
                        conn = Some(new_conn);
                        current = Some(new_current.clone());
                        set_current(Some(new_current));
                        metrics::gauge!(metric::SESSION_UP).set(1.0);
                    }
                    Err(e) => {
                        warn!(error = %e, "relay session: could not open a new one; retrying")
                    }
                }
                continue;
            };
            tokio::select! {
                () = stop.cancelled() => {
                    if let Some(mut conn) = conn.take() {
                        self.resign(&mut conn, c.owner).await;
                        let _ = conn.close().await;
                    }
                    c.liveness.lose();
                    metrics::gauge!(metric::SESSION_UP).set(0.0);
                    return;
                }
                () = tokio::time::sleep(self.config.interval) => {}
            }
            let Some(active) = conn.as_mut() else {
                current = None;
                continue;
            };
            let sent = Instant::now();
            // A slow answer pauses the publishes (the window lapses) without ending the
            // session; no answer within the server's own timeout ends it.
            let result =
                tokio::time::timeout(self.config.server_timeout, self.sweep(active, c.owner)).await;
            match result {
                Ok(Ok(_)) => c.liveness.confirm(sent + self.config.window),
                failed => {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {:?}", self.config.server_timeout),
                    };
                    c.liveness.lose();
                    metrics::gauge!(metric::SESSION_UP).set(0.0);
                    metrics::counter!(metric::SESSIONS_LOST).increment(1);
                    warn!(
                        owner = c.owner,
                        error = %why,
                        "relay session lost: its batches start no more publishes (other relays \
                         take its leases over); opening a new session"
                    );
                    // Dropped, not closed: the connection may be cut.
                    conn = None;
                    current = None;
                    set_current(None);
                }
            }
        }
    }

    /// A clean stop's last statement, best effort (a failure leaves the owner to the others'
    /// sweeps once the connection closes).
    async fn resign(&self, conn: &mut PgConnection, owner: i32) {
        let q = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.resign)))
            .bind(owner)
            .bind(&self.channel)
            .fetch_one(conn);
        match tokio::time::timeout(self.config.window, q).await {
            Ok(Ok(row)) => {
                let orphaned: i64 = row.try_get(0).unwrap_or(0);
                info!(owner, leases = orphaned, "relay session closed");
            }
            Ok(Err(e)) => warn!(owner, error = %e, "relay session: could not resign cleanly"),
            Err(_) => warn!(owner, "relay session: no answer to its resignation"),
        }
    }
}
