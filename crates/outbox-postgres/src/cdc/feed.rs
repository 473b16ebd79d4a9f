//! [`CdcFeed`]: the relay's [`Feed`] over a [`CdcStream`] (described on the type).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use outbox_core::relay::log::{Behind, LogBatch, LogScheduler};
use outbox_core::relay::{
    Feed, FeedBatch, PollingFeed, PollingTicket, RelayConfig, SettleReport, Settlement,
};
use outbox_core::{OutboxStats, OutboxStore as _, StoreError, StoreErrorKind};
use sqlx::PgPool;
use tokio::sync::Mutex;

use super::{CdcConfig, CdcError, CdcStream};
use crate::schema::Schema;
use crate::store::{OnPublish, PgStore, PgStoreConfig};
use row::{Row, xid_param};

mod row;
mod session;
mod table;
#[cfg(test)]
mod tests;

/// How often the parked aggregates are looked at in the table, in case a requeue's or a
/// resume's wake-up was missed (the listener was reconnecting, or the rows were changed with
/// plain SQL).
const PARKED_RECHECK: Duration = Duration::from_secs(5);

/// How often the paused routes are read again while the stream is followed: a route paused
/// meanwhile holds from the next batch after that (a batch handed out before is finished).
const PAUSES_RECHECK: Duration = Duration::from_secs(1);

/// The longest a worker waits between two claims of the catch-up while other batches are out
/// or rows below its ceiling are held by someone else.
const CATCH_UP_WAIT: Duration = Duration::from_millis(50);

/// How often a standby tries to take the slot over, at the latest.
const STANDBY_RETRY: Duration = Duration::from_secs(1);

/// How often a standby looks whether the slot is still streamed (a query of
/// `pg_replication_slots` through the pool, much cheaper than a replication connection's try):
/// the slot is free as soon as the streaming relay's connection ended, and the standby tries at
/// once then.
const STANDBY_LOOK: Duration = Duration::from_millis(50);

/// The handle of a [`CdcFeed`] batch.
#[derive(Debug)]
pub struct CdcTicket {
    /// A batch of the catch-up: claimed from the table under a lease, settled through it.
    table: Option<(PollingTicket, Arc<PollingFeed<PgStore>>)>,
    /// The streamed events of the batch, and the session they came from.
    log: LogBatch<Row>,
}

/// The catch-up of a stream session (see [`CdcFeed`]): the table's rows up to `ceiling`,
/// claimed under leases, before the stream is read.
#[derive(Debug)]
struct CatchUp {
    feed: Arc<PollingFeed<PgStore>>,
    ceiling: i64,
    started: Instant,
    /// Events it published.
    published: u64,
}

#[derive(Debug, Default)]
struct State {
    /// The session's events in memory: waiting, busy, parked, open transactions.
    log: LogScheduler<Row>,
    stream: Option<CdcStream>,
    /// The session's catch-up, until it is done.
    catch_up: Option<CatchUp>,
    /// Catch-up batches of this session handed out and not settled.
    catch_up_out: usize,
    /// The `rescan` wake-ups seen when the session started ([`PgStore::rescans`]).
    rescans: u64,
    /// When the parked aggregates were last looked at ([`CdcFeed::unblocked`]).
    parked_checked: Option<Instant>,
    /// When the paused routes were last read ([`CdcFeed::read_pauses`]).
    pauses_read: Option<Instant>,
    /// Waiting as a standby (another connection streams the slot) since then.
    standby_since: Option<Instant>,
    /// A standby's next try to take the slot.
    retry_at: Option<Instant>,
}

impl State {
    /// Drops the session: everything after the confirmed position comes again.
    fn reset(&mut self) {
        let mut log = std::mem::take(&mut self.log);
        log.reset();
        *self = State {
            log,
            ..State::default()
        };
    }
}

/// The relay's feed over the outbox table's log, a [`Feed`] over a [`CdcStream`].
///
/// The stream finds pending events; the table stays the record of what happened to them:
///
/// * **Catch-up**: each stream session (a start, a restart after an error, a standby's
///   takeover) begins with the table: the pending rows of aggregates whose head is at or below
///   the table's last id at the session's start are claimed, published and settled exactly as
///   the polling relay does ([`PollingFeed`] over a [`PgStore`] with a claim ceiling, leases
///   and fencing included), until none is left that could be published (rows behind a dead
///   letter and rows of a paused route wait). Rows committed before the slot existed, rows
///   committed while no relay ran, and requeued dead letters are so published by this feed,
///   in per-aggregate order, before anything the log brings after them; no event depends on a
///   polling relay. The stream is not read meanwhile (the server waits). Their ids are kept
///   (as ranges) until the stream has passed the log's position at the catch-up's end, and the
///   stream skips them: nothing is published twice for it. An operator's requeue, replay or
///   resume (the `rescan` wake-up on the schema's channel, [`PgStore`]'s listener; counted
///   again each time the listener reconnects, since a wake-up sent meanwhile is lost) ends the
///   session, and the next one's catch-up publishes what was made pending.
/// * **Batches**: events in commit order, each aggregate's in version order, at most one batch
///   holding an aggregate at a time (the aggregate is *busy* until its batch is settled). The
///   slot is streamed by one connection only, so no other relay holds them: batches have no
///   time limit (`owned_until` is `None`).
/// * **Published**: the rows are deleted (or marked, [`OnPublish::Mark`]) in one statement per
///   batch. A transaction's end position is confirmed to the server once every event of it and
///   of every earlier transaction is settled, never before (G3): after a crash the slot hands
///   out everything after the confirmed position again, same rows, same event ids (G4). A row
///   deleted before the crash is republished from the log.
/// * **Failed, to retry**: kept in memory at the head of its aggregate with its attempt count
///   and due time; the aggregate's later events wait behind it. While it waits, the confirmed
///   position cannot pass its transaction, so the server retains the WAL after it (a broker
///   outage grows the slot's lag: `slot_state`).
/// * **Dead-lettered**: the row is marked `dead` in the table, as the polling relay does, with
///   its attempts and error, and the aggregate is *parked*: its later events are not published
///   from the stream, they stay pending rows in the table. Parking survives restarts
///   (aggregates with a dead row are parked at each catch-up's end). `outbox dead-letters
///   requeue` makes the dead row pending again and wakes this feed: a new session's catch-up
///   delivers it and the rows behind it, in order.
/// * **Left to the table** with [`CdcConfig::producers_delete_rows`] (the producers use
///   `PgOutbox::delete_in_transaction`): every event this feed does not publish (a dead letter,
///   every event of a parked aggregate) is written back into the table first if its row is not
///   there, and only then counts as settled; so no position is confirmed past an event that
///   exists nowhere but in the log. Without the option the rows are there already and nothing
///   is written back (a written-back row that a polling relay had published and deleted during
///   a switch of modes would go out again).
/// * **Not attempted**: back at the head of the aggregate, due at once.
/// * **Behind the table**: an aggregate whose head in the log has an older version pending
///   (or dead) in the table (after the catch-up, only a polling relay running beside this one
///   during a switch of modes, or a requeue not yet seen, leaves one) is checked once per
///   stream session before its first batch. It is held, and checked again every 250 ms, for up
///   to 30 s (the polling relay publishes the older rows meanwhile); then the session ends,
///   and the next one's catch-up publishes them.
///
/// Another connection streaming the slot (another relay) makes this feed a standby: it hands
/// out empty batches and tries to take the slot every second, logging once at info level, and
/// takes over when the slot is free.
///
/// A stream that fails (connection lost, server restart) is started again on the next batch;
/// everything in memory is dropped and the slot delivers it again. A settle of a batch handed
/// out before that is ignored (its rows come again).
#[derive(Debug)]
pub struct CdcFeed {
    url: String,
    schema: Schema,
    config: CdcConfig,
    pool: PgPool,
    store: PgStore,
    on_publish: OnPublish,
    state: Mutex<State>,
    /// Commit time (Unix microseconds) of the oldest streamed transaction not confirmed yet;
    /// 0 when there is none. Read without the state's lock ([`CdcFeed::lag`]).
    oldest_open_micros: AtomicI64,
    /// A row found gone from the table was written back and said so (once).
    told_rows_gone: AtomicBool,
    /// The most events held at once ([`CdcFeed::peak_rows_in_memory`]).
    peak_held: AtomicUsize,
    /// The catch-up's claims: rows per aggregate, lease.
    claims: (usize, Duration),
    /// The stream session's catch-up is done ([`CdcFeed::following_the_log`]).
    following: AtomicBool,
}

impl CdcFeed {
    /// A feed streaming the slot of `schema` (see [`CdcConfig`]) over a replication connection
    /// to `url`, writing through `pool` (the same database). The stream starts on the first
    /// batch.
    pub fn new(
        url: &str,
        pool: PgPool,
        schema: Schema,
        config: CdcConfig,
        on_publish: OnPublish,
    ) -> Self {
        let store = PgStore::new(
            pool.clone(),
            PgStoreConfig {
                schema: schema.clone(),
                on_publish,
            },
        );
        Self {
            url: url.to_owned(),
            schema,
            config,
            pool,
            store,
            on_publish,
            state: Mutex::new(State::default()),
            oldest_open_micros: AtomicI64::new(0),
            told_rows_gone: AtomicBool::new(false),
            peak_held: AtomicUsize::new(0),
            claims: {
                let d = RelayConfig::default();
                (d.max_per_aggregate, d.lease)
            },
            following: AtomicBool::new(false),
        }
    }

    /// Whether this feed streams the slot and its catch-up is done: what commits now is
    /// published from the log. False for a standby and during a catch-up.
    pub fn following_the_log(&self) -> bool {
        self.following.load(Ordering::Relaxed)
    }

    /// The catch-up's claims (see the type's docs): at most `max_per_aggregate` rows of one
    /// aggregate per batch, under a lease of `lease`, as the polling relay claims them (the
    /// relay passes its own settings; by default [`RelayConfig`]'s).
    #[must_use]
    pub fn with_catch_up_claims(mut self, max_per_aggregate: usize, lease: Duration) -> Self {
        self.claims = (max_per_aggregate.max(1), lease);
        self
    }

    /// This feed's table claims (the catch-up's) tied to `session`, as a polling relay's
    /// ([`PgStore::with_session`]): what a killed relay's catch-up held is taken over as soon
    /// as its session ends. What `outbox relay` does.
    #[must_use]
    pub fn with_session(mut self, session: crate::session::PgSession) -> Self {
        self.store = self.store.with_session(session);
        self
    }

    /// How far delivery is behind the log in time: the age of the oldest transaction this
    /// relay streamed and has not confirmed yet (some event of it not settled, or an earlier
    /// transaction's), zero when every streamed transaction is confirmed. It does not see
    /// transactions the stream has not handed over yet; the slot's lag in bytes
    /// ([`slot_state`](super::slot_state)) does.
    pub fn lag(&self) -> Duration {
        let micros = self.oldest_open_micros.load(Ordering::Relaxed);
        if micros == 0 {
            return Duration::ZERO;
        }
        let now = chrono::Utc::now().timestamp_micros();
        Duration::from_micros(u64::try_from(now - micros).unwrap_or(0))
    }

    /// Ends the stream after the relay stopped: the position confirmed last is sent to the
    /// server first ([`CdcStream::stop`]), so a restart does not publish settled transactions
    /// again. The next batch would start a new stream.
    ///
    /// # Errors
    /// [`CdcError::Stream`] when the connection failed while closing (the server then keeps
    /// the position of its last status update: copies, never losses).
    pub async fn shutdown(&self) -> Result<(), CdcError> {
        let mut state = self.state.lock().await;
        self.confirm(&mut state);
        match state.stream.take() {
            Some(stream) => stream.stop().await,
            None => Ok(()),
        }
    }

    /// The most streamed events this feed has held in memory at once, not counting the
    /// batches handed out (at most the relay's batch size per worker): at most
    /// [`CdcConfig::max_rows_in_memory`] plus one part of a transaction (a quarter of it).
    /// The bound of the relay's memory, whatever the size of the transactions.
    pub fn peak_rows_in_memory(&self) -> usize {
        self.peak_held.load(Ordering::Relaxed)
    }

    fn confirm(&self, state: &mut State) {
        if let Some(lsn) = state.log.confirmable()
            && let Some(stream) = &state.stream
        {
            stream.confirm(lsn);
        }
        let oldest = state
            .log
            .oldest_open()
            .map_or(0, |at| at.timestamp_micros().max(1));
        self.oldest_open_micros.store(oldest, Ordering::Relaxed);
    }
}

/// A batch with nothing in it, of stream session `session`.
fn empty_batch(session: u64) -> FeedBatch<CdcTicket> {
    FeedBatch {
        ticket: CdcTicket {
            table: None,
            log: LogBatch::empty(session),
        },
        messages: Vec::new(),
        owned_until: None,
        takeovers: Vec::new(),
        undecodable: Vec::new(),
        liveness: None,
    }
}

/// A stream error as the engine sees it: the slot's own states are operator errors that the
/// relay keeps reporting (it waits and tries again, loudly); the rest are outages.
fn cdc_error(e: CdcError) -> StoreError {
    let kind = match &e {
        CdcError::Database(_) | CdcError::Stream(_) | CdcError::SlotBusy { .. } => {
            StoreErrorKind::Unavailable
        }
        CdcError::WalLevel { .. } | CdcError::Config(_) => StoreErrorKind::Schema,
        _ => StoreErrorKind::Other,
    };
    StoreError::with_source(kind, e.to_string(), e)
}

impl Feed for CdcFeed {
    type Ticket = CdcTicket;

    async fn next_batch(&self, max_rows: usize) -> Result<FeedBatch<CdcTicket>, StoreError> {
        let mut state = self.state.lock().await;
        if !self.ensure_stream(&mut state).await? {
            // A standby: nothing of its own is behind (the streaming relay reports its lag).
            self.oldest_open_micros.store(0, Ordering::Relaxed);
            return Ok(empty_batch(state.log.session()));
        }
        if state.catch_up.is_some() {
            if let Some(batch) = self.catch_up(&mut state, max_rows).await? {
                return Ok(batch);
            }
            if state.catch_up.is_some() {
                return Ok(empty_batch(state.log.session()));
            }
        } else if self.store.rescans() != state.rescans {
            // An operator made rows pending again (a requeue, a replay, a resume): a new
            // session, whose catch-up publishes them in order before the log goes on.
            tracing::info!(
                "rows were made pending again (a requeue, a replay or a resume): the stream \
                 starts again and its catch-up publishes them"
            );
            self.end_session(&mut state).await;
            return Ok(empty_batch(state.log.session()));
        } else if state.log.has_parked()
            && state
                .parked_checked
                .is_none_or(|at| at.elapsed() >= PARKED_RECHECK)
        {
            state.parked_checked = Some(Instant::now());
            let unblocked = self.unblocked(&state).await?;
            if let Some(aggregate) = unblocked.first() {
                tracing::info!(
                    aggregate_type = %aggregate.0,
                    aggregate_id = %aggregate.1,
                    aggregates = unblocked.len(),
                    "a parked aggregate is no longer behind a dead letter or a paused route \
                     (a requeue, a discard or a resume): the stream starts again and its \
                     catch-up publishes its rows"
                );
                self.end_session(&mut state).await;
                return Ok(empty_batch(state.log.session()));
            }
        }
        if state
            .pauses_read
            .is_none_or(|at| at.elapsed() >= PAUSES_RECHECK)
        {
            self.read_pauses(&mut state).await?;
        }
        if state.log.waiting_count() < max_rows {
            self.pull(&mut state, Duration::ZERO, max_rows).await?;
        }
        self.confirm(&mut state);
        let taken = state.log.take(max_rows.max(1));
        let heads = state.log.unverified_heads(&taken);
        let behind = match self.behind_the_table(&heads).await {
            Ok(behind) => behind,
            Err(e) => {
                state.reset();
                return Err(e);
            }
        };
        let taken = match state.log.hold_behind(heads, taken, &behind) {
            Behind::Go(taken) => taken,
            Behind::Restart(_) => {
                self.end_session(&mut state).await;
                return Ok(empty_batch(state.log.session()));
            }
        };
        if let Err(e) = self.restore(&mut state).await {
            state.reset();
            return Err(e);
        }
        if let Err(e) = self.settle_late(&mut state).await {
            state.reset();
            return Err(e);
        }
        self.confirm(&mut state);
        let (log, messages, undecodable) = state.log.batch(taken);
        Ok(FeedBatch {
            ticket: CdcTicket { table: None, log },
            messages,
            owned_until: None,
            takeovers: Vec::new(),
            undecodable,
            liveness: None,
        })
    }

    async fn settle(
        &self,
        mut ticket: CdcTicket,
        settlement: &Settlement,
    ) -> Result<SettleReport, StoreError> {
        if let Some((table, feed)) = ticket.table.take() {
            // A catch-up batch: settled in the table under its lease, as the polling relay
            // settles. Its rows are then skipped by the stream, however it ended (one whose
            // settle failed is claimed again once its lease expires).
            let result = feed.settle(table, settlement).await;
            let mut state = self.state.lock().await;
            let current = state.log.session() == ticket.log.session;
            if current {
                state.catch_up_out = state.catch_up_out.saturating_sub(1);
            }
            // Only a batch settled whole under its lease: rows of a lost lease are another
            // relay's (or another batch's) to settle, and the log must not skip them.
            if result.as_ref().is_ok_and(|r| r.lease_lost == 0) {
                let dead = settlement
                    .failed
                    .iter()
                    .filter(|f| f.retry_after.is_none())
                    .map(|f| f.id);
                for id in settlement.published.iter().copied().chain(dead) {
                    state.log.skip(id);
                }
                if current && let Some(c) = state.catch_up.as_mut() {
                    c.published += settlement.published.len() as u64;
                }
            }
            return result;
        }
        let xid_of: HashMap<i64, i64> = ticket
            .log
            .rows
            .iter()
            .map(|&(id, _, x)| (id, xid_param(x)))
            .collect();
        // The table first: a published row is deleted (or marked) before its position can be
        // confirmed; a dead letter is recorded (below, with the events left to the table)
        // before its position can be.
        let late = match self.write_settlement(settlement, &xid_of).await {
            Ok(late) => late,
            Err(e) => {
                // Nothing of this batch is confirmed; its aggregates must not stay busy for the
                // rest of the session: the session ends, and the slot hands everything after the
                // confirmed position out again (same event ids).
                let mut state = self.state.lock().await;
                if state.log.session() == ticket.log.session {
                    state.reset();
                }
                return Err(e);
            }
        };
        let mut state = self.state.lock().await;
        let current = state.log.session() == ticket.log.session;
        let report = state.log.settle_batch(&ticket.log, settlement, &late);
        if !current {
            return Ok(report);
        }
        if let Err(e) = self.restore(&mut state).await {
            tracing::warn!(error = %e,
                "could not write events left to the table back yet; tried again with the next batch");
        }
        if let Err(e) = self.settle_late(&mut state).await {
            tracing::warn!(error = %e,
                "could not settle published rows yet; tried again with the next batch");
        }
        self.confirm(&mut state);
        Ok(report)
    }

    async fn wait_for_work(&self, timeout: Duration) {
        let mut state = self.state.lock().await;
        if state.catch_up.is_some() {
            // The catch-up claims from the table: the stream is not read before it is done.
            drop(state);
            tokio::time::sleep(timeout.min(CATCH_UP_WAIT)).await;
            return;
        }
        if state.log.has_busy() {
            // Another worker's batch is out and its settle needs the state: read the stream
            // for at most a millisecond (an event for another aggregate can go out at once),
            // then let go of the lock.
            if state.stream.is_some() && !self.memory_full(&state) {
                let more = state.log.waiting_count() + 1;
                let _ = self
                    .pull(&mut state, timeout.min(Duration::from_millis(1)), more)
                    .await;
            } else {
                drop(state);
                tokio::time::sleep(timeout.min(Duration::from_millis(2))).await;
            }
            return;
        }
        let wait = match state.log.next_due() {
            Some(due) => due.saturating_duration_since(Instant::now()).min(timeout),
            None => timeout,
        };
        if state.stream.is_none() {
            // A standby (or a stream to start again): wait for its next try, without the lock.
            let until = state.retry_at.map_or(Duration::ZERO, |at| {
                at.saturating_duration_since(Instant::now())
            });
            drop(state);
            tokio::time::sleep(until.min(timeout).min(STANDBY_LOOK)).await;
            return;
        }
        if wait.is_zero() {
            return;
        }
        if self.memory_full(&state) {
            // Nothing is read before events are settled (or the waiting ones fall due).
            drop(state);
            tokio::time::sleep(wait.min(Duration::from_millis(2))).await;
            return;
        }
        // Errors end the wait; the next batch starts the stream again and reports them.
        // Until a new event arrives: events already waiting (in backoff) do not end the wait.
        let more = state.log.waiting_count() + 1;
        let _ = self.pull(&mut state, wait, more).await;
        self.confirm(&mut state);
    }

    async fn stats(&self) -> Result<Option<OutboxStats>, StoreError> {
        self.store.stats().await.map(Some)
    }
}
