//! [`PgStore`]: the one PostgreSQL store. It implements every store trait of the core (the
//! relay's [`OutboxStore`] here; the inbox, work-item and maintenance stores in
//! [`crate::consumer`], [`crate::effects`] and [`crate::maintenance`]), so one value serves the
//! relay, the consumer engine, the effects executor and the maintainer.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use outbox_core::{
    ClaimParams, ClaimScope, ClaimedBatch, ContentType, FailureParams, Fingerprint, LeaseToken,
    Liveness, MarkParams, OutboxMessage, OutboxStats, OutboxStore, Payload, ReleaseParams,
    StoreError, StoreErrorKind, Takeover, UndecodableRow,
};
use sqlx::postgres::{PgListener, PgRow};
use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::sync::{Notify, OnceCell};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::warn;
use uuid::Uuid;

use crate::effects::PgEffects;
use crate::error::{store_error, store_error_as};
use crate::inbox::PgInbox;
use crate::permission::{Component, pool_role};
use crate::schema::{RESCAN, Schema, TAKEOVER};
use crate::session::PgSession;
use crate::sql::Sql;
use outbox_core::claim_window::{BEGINNING, ClaimWindow, Found, Window};

/// What happens to a row once the broker acknowledged it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnPublish {
    /// Delete the row (default): no dead tuples pile up in an UPDATE-marked hot table, the
    /// claim scan stays small.
    #[default]
    Delete,
    /// Keep the row with `state = 'published'` and `published_at`, for audit or replay. Needs
    /// its indexes ([`crate::migrate_mark_mode`]; without them claims slow down as published
    /// rows accumulate) and a retention job
    /// ([`MaintenanceConfig::published_keep`](outbox_core::maintenance::MaintenanceConfig::published_keep)).
    Mark,
}

/// Settings of a [`PgStore`].
#[derive(Debug, Clone, Default)]
pub struct PgStoreConfig {
    /// The schema holding the outbox tables.
    pub schema: Schema,
    /// Delete or mark published rows.
    pub on_publish: OnPublish,
}

/// The PostgreSQL store.
///
/// As the relay's [`OutboxStore`]: claims lock each aggregate's head row with `FOR UPDATE SKIP LOCKED` and take a lease row per
/// aggregate in `<schema>.leases` (token from a sequence, `lease_until`), so any number of relays
/// can share one database. Settle writes join on the lease token: a stale relay changes nothing. Only
/// committed rows are visible to a claim (G2). A claim reads from the table's start, so a row
/// whose transaction commits late (lower id, later commit) is taken by the next claim once it
/// is visible. With the claim window on ([`PgStore::with_claim_window`], off by default) and
/// the table's front blocked (a claim statement took over [`ClaimWindow::slow_claim`] walking
/// past rows it could not take, such as a paused route's), claims start past those rows, and
/// a row that becomes claimable before the start waits for the next walk from the start: ten
/// times the last such walk's time after it, within [`ClaimWindow::min_rescan`] and
/// [`ClaimWindow::max_rescan`], plus that walk.
///
/// Cheap to clone; clones share the pool and the wake-up listener, which stops when the last
/// clone is dropped.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    config: PgStoreConfig,
    sql: Arc<Sql>,
    inbox: PgInbox,
    effects: PgEffects,
    wakeups: Arc<OnceCell<Wakeups>>,
    rows_per_head_x100: Arc<AtomicU64>,
    window: Arc<Window>,
    /// Claims take heads with ids up to this one only ([`PgStore::with_claim_ceiling`]).
    ceiling: Option<i64>,
    /// `rescan` wake-ups received by the listener ([`PgStore::rescans`]).
    rescans: Arc<AtomicU64>,
    /// The live session its claims' leases are tied to ([`PgStore::with_session`]).
    session: Option<PgSession>,
}

/// The wake-up listener: its notifications, and the guard that stops its task when dropped.
#[derive(Debug)]
struct Wakeups {
    notify: Arc<Notify>,
    _stop: DropGuard,
}

impl PgStore {
    /// A store over `pool`.
    pub fn new(pool: PgPool, config: PgStoreConfig) -> Self {
        let sql = Arc::new(Sql::new(&config.schema));
        Self {
            pool,
            inbox: PgInbox::new(config.schema.clone()),
            effects: PgEffects::new(config.schema.clone()),
            config,
            sql,
            wakeups: Arc::new(OnceCell::new()),
            rows_per_head_x100: Arc::new(AtomicU64::new(100)),
            window: Arc::new(Window::new(None)),
            ceiling: None,
            rescans: Arc::new(AtomicU64::new(0)),
            session: None,
        }
    }

    /// This store over `pool` instead, its settings kept (claim window, ceiling, session); the
    /// wake-up listener starts anew on the new pool. What the relay does to put its claims on
    /// connections with its live session's server-side timeouts.
    pub(crate) fn over_pool(&self, pool: PgPool) -> Self {
        Self {
            pool,
            wakeups: Arc::new(OnceCell::new()),
            ..self.clone()
        }
    }

    /// This store's claims tied to `session` ([`crate::session`]): each lease names the
    /// session's owner, another relay takes it over as soon as the session ends (not when the
    /// lease runs out), and the publish engine starts no publish of a batch once its session is
    /// lost or unconfirmed for the session's window. What `outbox relay` does; without it leases
    /// end by their clock only. Claims while the session is being re-established fail as
    /// `Unavailable` (the relay waits and retries).
    #[must_use]
    pub fn with_session(mut self, session: PgSession) -> Self {
        self.session = Some(session);
        self
    }

    /// The live session this store's claims are tied to, if any.
    pub fn session(&self) -> Option<&PgSession> {
        self.session.as_ref()
    }

    /// This store with the claim window on ([`ClaimWindow`]; off by default): after a claim
    /// slower than [`ClaimWindow::slow_claim`], the next claims start past the rows it could
    /// not take, and one claim in a while walks from the table's start. For a table whose
    /// front is blocked for long (a paused route with a large backlog, many events behind dead
    /// letters); what it trades: a row that becomes claimable below the start waits up to
    /// [`ClaimWindow::max_rescan`] plus one walk (BENCHMARKS.md, "A paused route's cost").
    #[must_use]
    pub fn with_claim_window(mut self, window: ClaimWindow) -> Self {
        self.window = Arc::new(Window::new(Some(window)));
        // This store's own listener, feeding this window (a clone's would feed the other).
        self.wakeups = Arc::new(OnceCell::new());
        self
    }

    /// This store's [`ClaimScope::All`] claims taking only aggregates whose head (lowest
    /// unpublished version) has an id up to `ceiling`; the rest of a taken aggregate's run
    /// comes with it, whatever its ids. For a pass over the rows that existed at some moment,
    /// which ends even while producers write (the CDC relay's catch-up). The claim window is
    /// off for such claims; the other scopes are not bounded.
    #[must_use]
    pub fn with_claim_ceiling(mut self, ceiling: i64) -> Self {
        self.ceiling = Some(ceiling);
        self
    }

    /// How many `rescan` wake-ups (an operator made rows claimable wherever they lie: a
    /// requeue, a replay, a resume) this store's listener has received since it started
    /// ([`PgStore::listen`]), counting each time it listens again after a lost connection (a
    /// wake-up sent meanwhile is lost).
    pub(crate) fn rescans(&self) -> u64 {
        self.rescans.load(Ordering::Relaxed)
    }

    /// Starts this store's wake-up listener if it is not running.
    pub(crate) async fn listen(&self) {
        let _ = self.wakeup_notify().await;
    }

    /// A store over `pool` for `schema`, with the default settings otherwise (delete published
    /// rows).
    pub fn with_schema(pool: PgPool, schema: Schema) -> Self {
        Self::new(
            pool,
            PgStoreConfig {
                schema,
                ..PgStoreConfig::default()
            },
        )
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.config.schema
    }

    /// The inbox API of this store's schema.
    pub fn inbox(&self) -> &PgInbox {
        &self.inbox
    }

    /// The work-item API of this store's schema.
    pub fn effects(&self) -> &PgEffects {
        &self.effects
    }

    pub(crate) fn sql(&self) -> &Sql {
        &self.sql
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The configuration.
    pub fn config(&self) -> &PgStoreConfig {
        &self.config
    }

    pub(crate) fn q(&self, sql: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
        AssertSqlSafe(Arc::clone(sql))
    }

    /// Maps a driver error of `context` to a [`StoreError`]; a refused privilege names this
    /// store's role and the `component` whose grants the statement needs.
    pub(crate) fn err(
        &self,
        component: Component,
        context: &'static str,
    ) -> impl FnOnce(sqlx::Error) -> StoreError + '_ {
        move |e| store_error_as(Some(&pool_role(&self.pool)), Some(component), context, e)
    }

    /// Starts (once) a task that LISTENs on the schema's wake-up channel. The task ends, and
    /// gives its connection back, when the last clone of this store is dropped or when the pool
    /// is closed (so `pool.close().await` at shutdown never waits for it).
    async fn wakeup_notify(&self) -> Arc<Notify> {
        let wakeups = self
            .wakeups
            .get_or_init(|| async {
                let notify = Arc::new(Notify::new());
                let stop = CancellationToken::new();
                let pool = self.pool.clone();
                let channel = self.config.schema.wakeup_channel();
                let n = Arc::clone(&notify);
                let window = Arc::clone(&self.window);
                let rescans = Arc::clone(&self.rescans);
                let stopped = stop.clone();
                tokio::spawn(async move {
                    let listen = async {
                        let mut first = true;
                        loop {
                            match PgListener::connect_with(&pool).await {
                                Ok(mut l) => {
                                    if let Err(e) = l.listen(&channel).await {
                                        warn!(error = %e, "LISTEN failed; relying on polling");
                                    } else {
                                        // A `rescan` sent while no one listened is lost.
                                        window.rescan_now();
                                        if !std::mem::replace(&mut first, false) {
                                            rescans.fetch_add(1, Ordering::Relaxed);
                                        }
                                        while let Ok(note) = l.recv().await {
                                            // An operator made rows claimable wherever they
                                            // lie (requeue, replay, resume).
                                            if note.payload() == RESCAN {
                                                window.rescan_now();
                                                rescans.fetch_add(1, Ordering::Relaxed);
                                            } else if note.payload() == TAKEOVER {
                                                // Leases of a relay that is gone expired:
                                                // its aggregates may lie anywhere.
                                                window.rescan_now();
                                            }
                                            n.notify_waiters();
                                        }
                                    }
                                }
                                Err(e) => warn!(error = %e, "wake-up listener could not connect"),
                            }
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    };
                    tokio::select! {
                        () = stopped.cancelled() => {}
                        () = pool.close_event() => {}
                        () = listen => {}
                    }
                });
                Wakeups {
                    notify,
                    _stop: stop.drop_guard(),
                }
            })
            .await;
        Arc::clone(&wakeups.notify)
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Decodes one claimed row: the message, or, for a row that cannot be published as stored, why
/// ([`UndecodableRow`]). Only a row whose id or aggregate key cannot be read is an error, which
/// the table's types rule out.
fn decode_row(row: &PgRow) -> Result<Result<OutboxMessage, UndecodableRow>, sqlx::Error> {
    let id: i64 = row.try_get("id")?;
    let aggregate_type: String = row.try_get("aggregate_type")?;
    let aggregate_id: String = row.try_get("aggregate_id")?;
    let aggregate_version: i64 = row.try_get("aggregate_version")?;
    let event_id = row.try_get::<Uuid, _>("event_id");
    let message = (|| -> Result<OutboxMessage, String> {
        let column = |e: sqlx::Error| e.to_string();
        let headers: sqlx::types::Json<serde_json::Value> =
            row.try_get("headers").map_err(column)?;
        let headers = outbox_core::headers_from_json(headers.0)?;
        let sha: Vec<u8> = row.try_get("payload_sha256").map_err(column)?;
        let payload: Vec<u8> = row.try_get("payload").map_err(column)?;
        let fingerprint =
            Fingerprint::from_slice(&sha).unwrap_or_else(|| Fingerprint::of(&payload));
        let message = OutboxMessage {
            id,
            event_id: event_id.as_ref().map_err(ToString::to_string).cloned()?,
            aggregate_type: aggregate_type.clone(),
            aggregate_id: aggregate_id.clone(),
            aggregate_version,
            event_type: row.try_get("event_type").map_err(column)?,
            schema_version: row.try_get("schema_version").map_err(column)?,
            payload: Payload {
                content_type: ContentType(row.try_get("content_type").map_err(column)?),
                bytes: Bytes::from(payload),
            },
            fingerprint,
            headers,
            destination: row.try_get("destination").map_err(column)?,
            partition_key: row.try_get("partition_key").map_err(column)?,
            created_at: row
                .try_get::<DateTime<Utc>, _>("created_at")
                .map_err(column)?,
            attempts: row.try_get("attempts").map_err(column)?,
        };
        message
            .check_publishable_reserving(&[crate::RESERVED_HEADERS])
            .map_err(|e| e.to_string())?;
        Ok(message)
    })();
    Ok(message.map_err(|reason| UndecodableRow {
        id,
        event_id: event_id.ok(),
        aggregate_type,
        aggregate_id,
        aggregate_version,
        reason,
    }))
}

/// Drops, from `messages` (sorted by aggregate and version), each aggregate's rows from its
/// first one in `paused` on (rows whose route an operator paused): nothing of an aggregate
/// passes its paused row. The aggregate's lease stays with the claim until it is settled, as
/// for an aggregate the batch cap cut off.
fn cut_at_paused_routes(messages: &mut Vec<OutboxMessage>, paused: &HashSet<i64>) {
    let mut stopped: Option<(String, String)> = None;
    messages.retain(|m| {
        if let Some((t, i)) = &stopped
            && *t == m.aggregate_type
            && *i == m.aggregate_id
        {
            return false;
        }
        if paused.contains(&m.id) {
            stopped = Some((m.aggregate_type.clone(), m.aggregate_id.clone()));
            return false;
        }
        true
    });
}

/// One claim statement's inputs, as [`PgStore::claim_batch`] decided them.
struct Claim<'a> {
    params: &'a ClaimParams,
    max_rows: usize,
    /// The claim ceiling, for a [`ClaimScope::All`] claim.
    ceiling: Option<i64>,
    /// Whether the claim starts where the claim window says.
    windowed: bool,
    /// The window's start (the table's start when not windowed).
    start: i64,
    /// The live session's owner the leases name.
    owner: Option<i32>,
}

/// A claim's rows decoded: the events in aggregate and version order (runs cut before a
/// paused route), the rows that cannot be published as stored, and the takeovers.
struct Claimed {
    messages: Vec<OutboxMessage>,
    undecodable: Vec<UndecodableRow>,
    takeovers: Vec<Takeover>,
}

impl PgStore {
    /// The owner a claim's leases name and its liveness, when the claims are tied to a live
    /// session.
    ///
    /// # Errors
    /// `Unavailable` while the session is being re-established.
    fn claim_owner(&self) -> Result<(Option<i32>, Option<Arc<Liveness>>), StoreError> {
        match &self.session {
            Some(session) => match session.current() {
                Some((owner, liveness)) => Ok((Some(owner), Some(liveness))),
                None => Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "claim: the relay's database session is being re-established",
                )),
            },
            None => Ok((None, None)),
        }
    }

    /// Runs the claim statement in its transaction; returns its rows and, for a normal claim,
    /// how long the statement took (the claim window's measure).
    async fn run_claim(&self, c: &Claim<'_>) -> Result<(Vec<PgRow>, Duration), sqlx::Error> {
        let params = c.params;
        // Heads to lease: enough aggregates to fill the batch at the rows-per-aggregate seen in
        // the last claim, so a backlog of long runs does not lease (and scan) ten times more
        // aggregates than the batch can carry.
        let per_head = (self.rows_per_head_x100.load(Ordering::Relaxed).max(100) as usize)
            .min(params.max_per_aggregate.max(1) * 100);
        let heads = (c.max_rows * 100).div_ceil(per_head).clamp(1, c.max_rows);
        // With an owner, the claim's transaction first holds its lock in shared mode: no sweep
        // can declare it gone until the claim ends (`crate::session`).
        let begin = |base: &str| match (c.owner, &self.session) {
            (Some(owner), Some(session)) => format!(
                "{base}; SELECT pg_advisory_xact_lock_shared({}, {owner})",
                session.class()
            ),
            _ => base.to_owned(),
        };
        let query = match params.scope {
            ClaimScope::TakeOver => sqlx::query(self.q(&self.sql.claim_takeover))
                .bind(millis(params.lease))
                .bind(c.owner),
            scope => {
                let sql = match (scope == ClaimScope::Free, c.windowed) {
                    _ if c.ceiling.is_some() => &self.sql.claim_below,
                    (true, false) => &self.sql.claim_free,
                    (false, false) => &self.sql.claim,
                    (true, true) => &self.sql.claim_free_from,
                    (false, true) => &self.sql.claim_from,
                };
                let q = sqlx::query(self.q(sql))
                    .bind(i64::try_from(c.max_rows).unwrap_or(i64::MAX))
                    .bind(i64::try_from(params.max_per_aggregate).unwrap_or(i64::MAX))
                    .bind(millis(params.lease))
                    .bind(i64::try_from(heads).unwrap_or(i64::MAX))
                    .bind(c.owner);
                match c.ceiling {
                    Some(ceiling) => q.bind(ceiling),
                    None if c.windowed => q.bind(c.start),
                    None => q,
                }
            }
        };
        if params.scope == ClaimScope::TakeOver && c.owner.is_none() {
            // Reads the small leases table, which has no index on expiry: see CLAIM_BEGIN.
            return Ok((query.fetch_all(&self.pool).await?, Duration::ZERO));
        }
        let base = if params.scope == ClaimScope::TakeOver {
            "BEGIN"
        } else {
            crate::sql::CLAIM_BEGIN
        };
        let mut tx = self.pool.begin_with(AssertSqlSafe(begin(base))).await?;
        let started = std::time::Instant::now();
        let rows = query.fetch_all(&mut *tx).await?;
        let elapsed = match params.scope {
            ClaimScope::TakeOver => Duration::ZERO,
            _ => started.elapsed(),
        };
        tx.commit().await?;
        Ok((rows, elapsed))
    }

    /// Learns the rows per aggregate of a claim, for the next claim's number of heads.
    fn learn_rows_per_head(&self, messages: &[OutboxMessage]) {
        let aggregates = messages
            .windows(2)
            .filter(|w| {
                w[0].aggregate_type != w[1].aggregate_type || w[0].aggregate_id != w[1].aggregate_id
            })
            .count()
            + 1;
        let ratio = (messages.len() * 100 / aggregates) as u64;
        self.rows_per_head_x100.store(ratio, Ordering::Relaxed);
    }
}

/// A claim's rows decoded one at a time: a row that cannot be published as stored is set aside
/// with its reason (the relay dead-letters it), never a failed claim; a paused route's row is
/// neither handed out nor dead-lettered (it waits with its route), and its aggregate's run is
/// cut before it.
///
/// # Errors
/// [`StoreError`] when a column of the claim itself cannot be read.
fn claimed(rows: &[PgRow]) -> Result<Claimed, StoreError> {
    let column = |e| store_error("claim: decoding a row", e);
    let mut messages = Vec::with_capacity(rows.len());
    let mut undecodable = Vec::new();
    let mut takeovers = Vec::new();
    let mut paused = HashSet::new();
    for row in rows {
        let decoded = decode_row(row).map_err(column)?;
        let id = match &decoded {
            Ok(m) => m.id,
            Err(u) => u.id,
        };
        if row.try_get::<bool, _>("route_paused").map_err(column)? {
            paused.insert(id);
        }
        let count: i32 = row.try_get("lease_takeovers").map_err(column)?;
        let head: i64 = row.try_get("lease_head").map_err(column)?;
        if count > 0 && head == id {
            let orphaned_ms: Option<i32> = row.try_get("lease_orphaned_ms").map_err(column)?;
            takeovers.push(Takeover {
                head,
                count: u32::try_from(count).unwrap_or(u32::MAX),
                orphaned_for: orphaned_ms
                    .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            });
        }
        match decoded {
            Ok(m) => messages.push(m),
            Err(u) => undecodable.push(u),
        }
    }
    if !paused.is_empty() {
        undecodable.retain(|u| !paused.contains(&u.id));
    }
    messages.sort_by(|a, b| {
        (&a.aggregate_type, &a.aggregate_id, a.aggregate_version).cmp(&(
            &b.aggregate_type,
            &b.aggregate_id,
            b.aggregate_version,
        ))
    });
    if !paused.is_empty() {
        cut_at_paused_routes(&mut messages, &paused);
    }
    Ok(Claimed {
        messages,
        undecodable,
        takeovers,
    })
}

impl OutboxStore for PgStore {
    async fn claim_batch(&self, params: ClaimParams) -> Result<ClaimedBatch, StoreError> {
        let max_rows = params.max_rows.max(1);
        let ceiling = self.ceiling.filter(|_| params.scope == ClaimScope::All);
        let windowed =
            params.scope != ClaimScope::TakeOver && ceiling.is_none() && self.window.enabled();
        let (start, full) = if windowed {
            // Operators' `rescan` wake-ups reach the window from the first claim on.
            let _ = self.wakeup_notify().await;
            self.window.start()
        } else {
            (BEGINNING, true)
        };
        // The table's next id, read before the claim (so that rows committed while it runs
        // stay ahead of a start moved past an empty table), after a slow claim only.
        let next_id = if windowed && self.window.expect_slow() {
            sqlx::query_scalar::<_, i64>(self.q(&self.sql.next_id))
                .fetch_one(&self.pool)
                .await
                .ok()
        } else {
            None
        };
        let (owner, liveness) = self.claim_owner()?;
        let claim = Claim {
            params: &params,
            max_rows,
            ceiling,
            windowed,
            start,
            owner,
        };
        let (rows, elapsed) = self.run_claim(&claim).await.map_err(|e| {
            if windowed && full {
                // The walk from the beginning this claim owed did not happen: the next one.
                self.window.rescan_now();
            }
            self.err(Component::Relay, "claim")(e)
        })?;
        let token = match rows.first() {
            Some(r) => LeaseToken(r.try_get(0).map_err(self.err(Component::Relay, "claim"))?),
            None => LeaseToken(0),
        };
        if windowed {
            // The lowest head the claim leased (cut-off aggregates included).
            let first_head = match rows.first() {
                Some(r) => Some(
                    r.try_get::<i64, _>("first_head")
                        .map_err(|e| store_error("claim: decoding a row", e))?,
                ),
                None => None,
            };
            let found = match first_head {
                Some(h) => Found::Heads(h),
                // Nothing from `start` on: after a slow walk, the next claims start after the
                // table's last row as it was before the claim (new rows come after it).
                // (Only when that was read before the claim: a row committed while it ran
                // may have a lower id than one read after it.)
                None => Found::Nothing(next_id),
            };
            self.window.settle(
                token.0,
                start,
                full,
                elapsed,
                found,
                std::time::Instant::now() + params.lease,
            );
        }
        let Claimed {
            messages,
            undecodable,
            takeovers,
        } = claimed(&rows)?;
        if !messages.is_empty() && params.scope != ClaimScope::TakeOver {
            self.learn_rows_per_head(&messages);
        }
        Ok(ClaimedBatch {
            token,
            messages,
            takeovers,
            undecodable,
            liveness,
        })
    }

    async fn mark_published(&self, params: MarkParams<'_>) -> Result<u64, StoreError> {
        let sql = match self.config.on_publish {
            OnPublish::Delete => &self.sql.mark_delete,
            OnPublish::Mark => &self.sql.mark_update,
        };
        Ok(sqlx::query(self.q(sql))
            .bind(params.ids)
            .bind(params.token.0)
            .execute(&self.pool)
            .await
            .map_err(self.err(Component::Relay, "mark published"))?
            .rows_affected())
    }

    async fn record_failure(&self, params: FailureParams<'_>) -> Result<bool, StoreError> {
        if let Some(after) = params.retry_after {
            // The row may lie before where the claims start: a walk from the beginning once
            // it is due (with a margin for the database's own clock).
            self.window
                .rescan_at(std::time::Instant::now() + after + Duration::from_millis(50));
        }
        let n = sqlx::query(self.q(&self.sql.fail))
            .bind(params.id)
            .bind(params.token.0)
            .bind(params.error)
            .bind(params.retry_after.map(millis))
            .execute(&self.pool)
            .await
            .map_err(self.err(Component::Relay, "record failure"))?
            .rows_affected();
        Ok(n == 1)
    }

    async fn release(&self, params: ReleaseParams<'_>) -> Result<u64, StoreError> {
        self.window.release(params.token.0);
        Ok(sqlx::query(self.q(&self.sql.release))
            .bind(params.token.0)
            .execute(&self.pool)
            .await
            .map_err(self.err(Component::Relay, "release"))?
            .rows_affected())
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let sql = match self.config.on_publish {
            OnPublish::Delete => &self.sql.stats,
            OnPublish::Mark => &self.sql.stats_mark,
        };
        let r = sqlx::query(self.q(sql))
            .fetch_one(&self.pool)
            .await
            .map_err(self.err(Component::Reader, "stats"))?;
        stats_from_row(&r).map_err(|e| store_error("stats", e))
    }

    async fn wait_for_work(&self, timeout: Duration) {
        let notify = self.wakeup_notify().await;
        let _ = tokio::time::timeout(timeout, notify.notified()).await;
    }

    async fn takeovers_waiting(&self) -> Result<bool, StoreError> {
        sqlx::query_scalar(self.q(&self.sql.takeovers_waiting))
            .fetch_one(&self.pool)
            .await
            .map_err(self.err(Component::Relay, "takeovers waiting"))
    }
}

impl PgStore {
    /// Refuses to run against a schema that is missing or at another version.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Schema` naming what to do, `PermissionDenied` naming the role
    /// when it cannot read the schema, or `Unavailable`.
    pub async fn check(&self) -> Result<(), StoreError> {
        crate::migrate::check_schema(&self.pool, &self.config.schema)
            .await
            .map_err(|e| match e {
                crate::error::MigrateError::Database(d) => store_error("schema check", d),
                crate::error::MigrateError::PermissionDenied(p) => StoreError::new(
                    StoreErrorKind::PermissionDenied,
                    format!("schema check: {p}"),
                ),
                other => StoreError::new(StoreErrorKind::Schema, other.to_string()),
            })
    }
}

/// The outbox numbers from a row of `(pending, oldest pending age in seconds, in flight,
/// retrying, dead, published kept)`, the columns of the stats statements (`sql::STATS` and the
/// admin module's bounded count).
pub(crate) fn stats_from_row(r: &PgRow) -> Result<OutboxStats, sqlx::Error> {
    let age: Option<f64> = r.try_get(1)?;
    Ok(OutboxStats {
        pending: r.try_get(0)?,
        oldest_pending_age: age.map(|a| Duration::from_secs_f64(a.max(0.0))),
        in_flight: r.try_get(2)?,
        retrying: r.try_get(3)?,
        dead: r.try_get(4)?,
        published_retained: r.try_get(5)?,
    })
}
