//! [`CdcFeed`]: the relay's [`Feed`] over a [`CdcStream`] (described on the type).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use std::sync::Arc;

use outbox_core::relay::log::{
    Aggregate, Behind, Leave, LogBatch, LogEvent, LogItem, LogRow, LogScheduler, LogTransaction,
};
use outbox_core::relay::{
    Feed, FeedBatch, PollingFeed, PollingTicket, RelayConfig, SettleReport, Settlement,
};
use outbox_core::{OutboxMessage, OutboxStats, OutboxStore as _, StoreError, StoreErrorKind};
use sqlx::PgPool;
use tokio::sync::Mutex;

use super::{CdcConfig, CdcError, CdcEvent, CdcStream, CdcUnpublishable, StoredRow};
use crate::error::store_error;
use crate::schema::Schema;
use crate::store::{OnPublish, PgStore, PgStoreConfig};

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

/// SQL for the full (64-bit) transaction id of the log's 32-bit `xid`, next to the 64-bit
/// `xmax` of a snapshot: the one nearest to `xmax`, by the signed 32-bit distance between the
/// low halves. A transaction in the window this feed cares about (commit flushed, not visible
/// yet) often has an id at or above `xmax`, which is one past the latest *completed*
/// transaction; ids within 2^31 either side are told apart, across an epoch boundary too.
fn full_xid(xid: &str, xmax: &str) -> String {
    format!(
        "({xmax} + ((((({xid}) - ({xmax} & 4294967295)) + 2147483648) & 4294967295) \
         - 2147483648))"
    )
}

/// A streamed event: a message to publish, or a row that cannot be published as stored (the
/// engine dead-letters it with its reason, and its aggregate waits behind it).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // The large variant is the common one: no box per event.
enum Row {
    Message(OutboxMessage),
    Unpublishable(Box<CdcUnpublishable>),
}

impl LogRow for Row {
    fn id(&self) -> i64 {
        match self {
            Self::Message(m) => m.id,
            Self::Unpublishable(u) => u.row.id,
        }
    }

    fn version(&self) -> i64 {
        match self {
            Self::Message(m) => m.aggregate_version,
            Self::Unpublishable(u) => u.row.aggregate_version,
        }
    }

    fn key(&self) -> (&str, &str) {
        match self {
            Self::Message(m) => (&m.aggregate_type, &m.aggregate_id),
            Self::Unpublishable(u) => (&u.row.aggregate_type, &u.row.aggregate_id),
        }
    }

    fn attempted(&self) -> Self {
        let mut row = self.clone();
        match &mut row {
            Self::Message(m) => m.attempts += 1,
            Self::Unpublishable(u) => u.stored.attempts += 1,
        }
        row
    }

    fn item(&self) -> LogItem<'_> {
        match self {
            Self::Message(m) => LogItem::Message(m),
            Self::Unpublishable(u) => LogItem::Undecodable(&u.row),
        }
    }

    fn route(&self) -> (Option<&str>, &str) {
        match self {
            Self::Message(m) => (m.destination.as_deref(), &m.aggregate_type),
            Self::Unpublishable(u) => (u.stored.destination.as_deref(), &u.row.aggregate_type),
        }
    }
}

impl Row {
    fn stored(&self) -> StoredRow {
        match self {
            Self::Message(m) => StoredRow::of(m),
            Self::Unpublishable(u) => u.stored.clone(),
        }
    }
}

/// What the scheduler takes of a streamed event: a transaction's rows, each aggregate's in
/// version order wherever the unpublishable ones were.
fn log_event(event: CdcEvent) -> LogEvent<Row> {
    match event {
        CdcEvent::Idle { lsn } => LogEvent::Idle { position: lsn },
        CdcEvent::Transaction(tx) => {
            let mut rows: Vec<Row> = tx.messages.into_iter().map(Row::Message).collect();
            if !tx.unpublishable.is_empty() {
                rows.extend(
                    tx.unpublishable
                        .into_iter()
                        .map(|u| Row::Unpublishable(Box::new(u))),
                );
                rows.sort_by_key(LogRow::version);
            }
            LogEvent::Transaction(LogTransaction {
                source_tx: u64::from(tx.xid),
                end: tx.end_lsn,
                complete: tx.complete,
                committed_at: tx.committed_at,
                rows,
            })
        }
    }
}

/// The log's 32-bit transaction id of a streamed event, for the visibility checks.
fn xid_param(source_tx: u64) -> i64 {
    i64::try_from(source_tx).unwrap_or_default()
}

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

    /// The table's side of a settlement's published rows: deleted (or marked). Returns those
    /// whose transactions the settle's snapshot did not see yet (see [`CdcFeed::settle_rows`]).
    /// Dead letters are recorded with the events left to the table ([`CdcFeed::restore`]).
    async fn write_settlement(
        &self,
        settlement: &Settlement,
        xid_of: &HashMap<i64, i64>,
    ) -> Result<HashSet<i64>, StoreError> {
        let rows: Vec<(i64, i64)> = settlement
            .published
            .iter()
            .map(|id| (*id, xid_of.get(id).copied().unwrap_or_default()))
            .collect();
        self.settle_rows(&rows).await
    }

    /// Deletes (or marks) published rows; returns the ids of those whose inserting
    /// transaction was not visible yet, which are left for a later settle.
    ///
    /// The log hands a transaction out once its commit record is flushed, which is a moment
    /// before the server makes it visible to other sessions. A relay quick enough to publish
    /// and settle within that moment finds no row to delete, and the row would stay behind,
    /// published, for the polling relay to publish again and for the CDC relay's "behind the
    /// table" check to hold its aggregate (W3 in CDC mode left 4-21 rows per run so). So the
    /// rows the plain statement did not find are looked at again with their transactions
    /// ([`CdcFeed::settle_unseen`]): a row the producer deleted in its transaction is gone for
    /// good, a row of a transaction not visible yet is left for later
    /// ([`CdcFeed::settle_late`]), and its position is not confirmed before.
    async fn settle_rows(&self, rows: &[(i64, i64)]) -> Result<HashSet<i64>, StoreError> {
        if rows.is_empty() {
            return Ok(HashSet::new());
        }
        let sql = format!("{} RETURNING id", self.settle_write("$1"));
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let found: HashSet<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(&ids)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| store_error("settling published rows", e))?
            .into_iter()
            .collect();
        let unseen: Vec<(i64, i64)> = rows
            .iter()
            .filter(|r| !found.contains(&r.0))
            .copied()
            .collect();
        self.settle_unseen(&unseen).await
    }

    /// The statement that settles published rows whose ids are the array `ids`: deletes
    /// them, or marks the pending ones published ([`OnPublish`]).
    fn settle_write(&self, ids: &str) -> String {
        let s = self.schema.quoted();
        match self.on_publish {
            OnPublish::Delete => format!("DELETE FROM {s}.events WHERE id = ANY({ids})"),
            OnPublish::Mark => format!(
                "UPDATE {s}.events SET state = 'published', \
                 published_at = coalesce(published_at, now()) \
                 WHERE id = ANY({ids}) AND state = 'pending'"
            ),
        }
    }

    /// Rows the settle did not find: each is deleted (or marked) if the statement's snapshot
    /// sees its inserting transaction (it became visible meanwhile) and counts as settled
    /// either way then (a row of a visible transaction that is not there was deleted by its
    /// producer, or marked already); the ids of transactions still not visible are returned.
    async fn settle_unseen(&self, rows: &[(i64, i64)]) -> Result<HashSet<i64>, StoreError> {
        if rows.is_empty() {
            return Ok(HashSet::new());
        }
        let write = self.settle_write("ARRAY(SELECT id FROM r WHERE seen)");
        // One statement, so the write and the visibility check share the snapshot.
        let sql = format!(
            "WITH snap AS MATERIALIZED ( \
               SELECT pg_current_snapshot() AS s, \
                      pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS xmax), \
             r AS MATERIALIZED ( \
               SELECT u.id, pg_visible_in_snapshot({full}::text::xid8, snap.s) AS seen \
               FROM unnest($1::int8[], $2::int8[]) AS u(id, x), snap), \
             w AS ({write}) \
             SELECT id FROM r WHERE NOT seen",
            full = full_xid("u.x", "snap.xmax")
        );
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let xids: Vec<i64> = rows.iter().map(|r| r.1).collect();
        let late: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(&ids)
            .bind(&xids)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| store_error("settling published rows", e))?;
        Ok(late.into_iter().collect())
    }

    /// Settles the late rows ([`LogScheduler::late_rows`]) whose transactions are visible now.
    async fn settle_late(&self, state: &mut State) -> Result<(), StoreError> {
        if state.log.late_rows().is_empty() {
            return Ok(());
        }
        let rows: Vec<(i64, i64)> = state
            .log
            .late_rows()
            .iter()
            .map(|l| (l.id, xid_param(l.source_tx)))
            .collect();
        let still = self.settle_rows(&rows).await?;
        state.log.late_settled(&still);
        Ok(())
    }

    /// Records the events left to the table ([`LogScheduler::restore_list`]), then counts them as
    /// settled: a dead letter's row is marked `dead` with its error; the row of an event that
    /// is gone from the table although its transaction is visible (its producer deleted it in
    /// the transaction, [`CdcConfig::producers_delete_rows`]) is written back first, as the
    /// producer wrote it, `dead` or pending. An event whose transaction is not visible yet
    /// (its commit is in the log a moment before other sessions see it) stays in the list for
    /// the next call, and its position unconfirmed: without that check its dead letter would
    /// find no row, count as settled, and the row would stay pending unseen. On an error all
    /// stay in the list.
    async fn restore(&self, state: &mut State) -> Result<(), StoreError> {
        if state.log.restore_list().is_empty() {
            return Ok(());
        }
        let (late, written) = self.leave_rows(state.log.restore_list()).await?;
        if written > 0
            && !self.config.producers_delete_rows
            && !self.told_rows_gone.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                rows = written,
                "streamed rows were gone from the outbox table although their transactions \
                 committed: the producers delete their rows in their transactions. The relay \
                 wrote them back (dead letters, events parked behind one); set \
                 relay.cdc_producers_delete_rows = true and grant the relay INSERT on the \
                 outbox table (docs/guide/src/security.md)"
            );
        }
        state.log.restored(&late);
        Ok(())
    }

    /// The statement of [`CdcFeed::restore`], in one snapshot. Returns the ids of events whose
    /// transactions are not visible yet, and how many rows were written back.
    async fn leave_rows(&self, leaves: &[Leave<Row>]) -> Result<(HashSet<i64>, i64), StoreError> {
        let rows: Vec<StoredRow> = leaves.iter().map(|l| l.event.row.stored()).collect();
        let col = |f: fn(&StoredRow) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
        // The state a row written back gets: a row that cannot be published would break the
        // table's constraint as a pending row, and can only end as a dead letter anyway.
        let insert_state: Vec<&str> = leaves
            .iter()
            .map(|l| match (&l.dead, &l.event.row) {
                (Some(_), _) | (None, Row::Unpublishable(_)) => "dead",
                (None, Row::Message(_)) => "pending",
            })
            .collect();
        let error: Vec<Option<String>> = leaves
            .iter()
            .map(|l| match (&l.dead, &l.event.row) {
                (Some(e), _) => Some(e.clone()),
                (None, Row::Unpublishable(u)) => Some(format!(
                    "cannot be published as stored: {}; correct the row, then requeue it",
                    u.row.reason
                )),
                (None, Row::Message(_)) => None,
            })
            .collect();
        let dead: Vec<bool> = leaves.iter().map(|l| l.dead.is_some()).collect();
        let s = self.schema.quoted();
        let sql = format!(
            "WITH snap AS MATERIALIZED ( \
               SELECT pg_current_snapshot() AS s, \
                      pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS xmax), \
             u AS MATERIALIZED ( \
               SELECT u.*, pg_visible_in_snapshot({full}::text::xid8, snap.s) AS seen \
               FROM unnest($1::int8[], $2::uuid[], $3::text[], $4::text[], $5::int8[], \
                 $6::text[], $7::int4[], $8::text[], $9::bytea[], $10::text[], $11::text[], \
                 $12::text[], $13::text[], $14::int4[], $15::text[], $16::text[], $17::bool[], \
                 $18::int8[]) \
                 AS u(id, event_id, aggregate_type, aggregate_id, aggregate_version, \
                 event_type, schema_version, content_type, payload, headers, destination, \
                 partition_key, created_at, attempts, state, last_error, dead, x), snap), \
             gone AS MATERIALIZED ( \
               SELECT u.* FROM u WHERE u.seen AND NOT EXISTS ( \
                 SELECT 1 FROM {s}.events e WHERE e.event_id = u.event_id)), \
             ins AS ( \
               INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, \
                 aggregate_version, event_type, schema_version, content_type, payload, \
                 headers, destination, partition_key, created_at, attempts, state, last_error) \
               SELECT coalesce(g.event_id, gen_random_uuid()), g.aggregate_type, \
                 g.aggregate_id, g.aggregate_version, coalesce(g.event_type, '(unreadable)'), \
                 coalesce(g.schema_version, 1), coalesce(g.content_type, \
                 'application/octet-stream'), coalesce(g.payload, ''::bytea), \
                 coalesce(g.headers, '{{}}')::jsonb, g.destination, g.partition_key, \
                 coalesce(g.created_at::timestamptz, now()), g.attempts, g.state, g.last_error \
               FROM gone g ORDER BY g.id \
               ON CONFLICT DO NOTHING RETURNING 1), \
             marked AS ( \
               UPDATE {s}.events e SET state = 'dead', attempts = u.attempts, \
                 last_error = u.last_error \
               FROM u WHERE u.seen AND u.dead AND e.event_id = u.event_id \
                 AND e.state = 'pending' RETURNING 1) \
             SELECT coalesce((SELECT array_agg(id) FROM u WHERE NOT seen), '{{}}'), \
               (SELECT count(*) FROM ins), (SELECT count(*) FROM marked)",
            full = full_xid("u.x", "snap.xmax")
        );
        let (late, written, _marked): (Vec<i64>, i64, i64) =
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.event_id).collect::<Vec<_>>())
                .bind(col(|r| Some(r.aggregate_type.clone())))
                .bind(col(|r| Some(r.aggregate_id.clone())))
                .bind(rows.iter().map(|r| r.aggregate_version).collect::<Vec<_>>())
                .bind(col(|r| r.event_type.clone()))
                .bind(rows.iter().map(|r| r.schema_version).collect::<Vec<_>>())
                .bind(col(|r| r.content_type.clone()))
                .bind(rows.iter().map(|r| r.payload.clone()).collect::<Vec<_>>())
                .bind(col(|r| r.headers.clone()))
                .bind(col(|r| r.destination.clone()))
                .bind(col(|r| r.partition_key.clone()))
                .bind(col(|r| r.created_at.map(super::pg_time_text)))
                .bind(rows.iter().map(|r| r.attempts).collect::<Vec<_>>())
                .bind(insert_state)
                .bind(error)
                .bind(dead)
                .bind(
                    leaves
                        .iter()
                        .map(|l| xid_param(l.event.source_tx))
                        .collect::<Vec<_>>(),
                )
                .fetch_one(&self.pool)
                .await
                .map_err(|e| store_error("recording events left to the table", e))?;
        Ok((late.into_iter().collect(), written))
    }

    /// Of the aggregates about to be handed out for the first time in this session, those
    /// with a lower version pending or dead in the table than the head the stream gives
    /// (a polling relay beside this one holds it, a requeue not seen yet): they wait for it,
    /// then for a new session's catch-up.
    ///
    /// Each comes with whether it is *blocked*: an older row is dead, or pending on a paused
    /// route (the catch-up leaves those), so only a requeue or a resume moves it; the others
    /// wait for the rows to be published.
    async fn behind_the_table(
        &self,
        heads: &[(Aggregate, i64)],
    ) -> Result<HashMap<Aggregate, bool>, StoreError> {
        if heads.is_empty() {
            return Ok(HashMap::new());
        }
        let types: Vec<&str> = heads.iter().map(|((t, _), _)| t.as_str()).collect();
        let ids: Vec<&str> = heads.iter().map(|((_, i), _)| i.as_str()).collect();
        let versions: Vec<i64> = heads.iter().map(|(_, v)| *v).collect();
        let s = self.schema.quoted();
        let rows: Vec<(String, String, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT h.t, h.i, bool_or(e.state = 'dead' OR {paused}) \
             FROM unnest($1::text[], $2::text[], $3::int8[]) AS h(t, i, v) \
             JOIN {s}.events e ON e.aggregate_type = h.t AND e.aggregate_id = h.i \
               AND e.aggregate_version < h.v AND e.state IN ('pending', 'dead') \
             GROUP BY h.t, h.i",
            paused = self.paused_sql("e."),
        )))
        .bind(&types)
        .bind(&ids)
        .bind(&versions)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| store_error("checking for older pending versions", e))?;
        Ok(rows.into_iter().map(|(t, i, b)| ((t, i), b)).collect())
    }

    /// Whether the events row `alias` (`"e."`) is on a paused route.
    fn paused_sql(&self, alias: &str) -> String {
        format!(
            "EXISTS (SELECT 1 FROM {}.pauses z WHERE z.kind = 'route' AND z.name = {})",
            self.schema.quoted(),
            crate::sql::route_key(alias)
        )
    }

    /// Of the parked aggregates none of whose events waits to be recorded in the table, those
    /// that are no longer blocked (no dead row, no pending row on a paused route): a requeue
    /// or a resume whose wake-up this feed missed. Looked at every [`PARKED_RECHECK`].
    async fn unblocked(&self, state: &State) -> Result<Vec<Aggregate>, StoreError> {
        let parked = state.log.parked_settled();
        if parked.is_empty() {
            return Ok(Vec::new());
        }
        let types: Vec<&str> = parked.iter().map(|(t, _)| t.as_str()).collect();
        let ids: Vec<&str> = parked.iter().map(|(_, i)| i.as_str()).collect();
        let s = self.schema.quoted();
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT h.t, h.i FROM unnest($1::text[], $2::text[]) AS h(t, i) \
             WHERE NOT EXISTS (SELECT 1 FROM {s}.events e WHERE e.aggregate_type = h.t \
               AND e.aggregate_id = h.i \
               AND (e.state = 'dead' OR (e.state = 'pending' AND {paused})))",
            paused = self.paused_sql("e."),
        )))
        .bind(&types)
        .bind(&ids)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| store_error("looking at the parked aggregates", e))
    }

    /// Starts the stream if it is not running, with the parked aggregates read from the table.
    async fn ensure_stream(&self, state: &mut State) -> Result<bool, StoreError> {
        if state.stream.is_some() {
            return Ok(true);
        }
        if state.retry_at.is_some_and(|at| Instant::now() < at) {
            // A standby: try before the retry's time once the slot is free.
            let streamed: Result<Option<bool>, sqlx::Error> =
                sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
                    .bind(self.config.slot_name(&self.schema))
                    .fetch_optional(&self.pool)
                    .await;
            if !matches!(streamed, Ok(Some(false))) {
                return Ok(false);
            }
        }
        let stream = match CdcStream::start(&self.url, &self.schema, &self.config).await {
            Ok(stream) => stream,
            // Another relay streams the slot: wait as a standby, quietly, and try again.
            Err(e @ CdcError::SlotBusy { .. }) => {
                if state.standby_since.is_none() {
                    tracing::info!(error = %e, "waiting as a standby until the slot is free");
                    state.standby_since = Some(Instant::now());
                }
                state.retry_at = Some(Instant::now() + STANDBY_RETRY);
                return Ok(false);
            }
            Err(e) => return Err(cdc_error(e)),
        };
        // The catch-up's ceiling: the table's last row now. Everything committed before the
        // stream's start that is still pending lies at or below it.
        self.store.listen().await;
        let ceiling: i64 = match sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT coalesce(max(id), 0) FROM {}.events",
            self.schema.quoted()
        )))
        .fetch_one(&self.pool)
        .await
        {
            Ok(ceiling) => ceiling,
            Err(e) => {
                let _ = stream.stop().await;
                return Err(store_error("reading the catch-up's ceiling", e));
            }
        };
        match state.standby_since {
            Some(since) => tracing::info!(
                slot = stream.slot(),
                waited_secs = since.elapsed().as_secs_f64(),
                "streaming the replication slot: took over from the relay that held it"
            ),
            None => tracing::info!(slot = stream.slot(), "streaming the replication slot"),
        }
        state.reset();
        self.following.store(false, Ordering::Relaxed);
        // Read again at the catch-up's end (a requeue may have emptied some).
        state.log.clear_parked();
        if let Err(e) = self.read_pauses(state).await {
            let _ = stream.stop().await;
            return Err(e);
        }
        state.stream = Some(stream);
        state.rescans = self.store.rescans();
        let mut store = PgStore::new(
            self.pool.clone(),
            PgStoreConfig {
                schema: self.schema.clone(),
                on_publish: self.on_publish,
            },
        )
        .with_claim_ceiling(ceiling);
        if let Some(session) = self.store.session() {
            store = store.with_session(session.clone());
        }
        state.catch_up = Some(CatchUp {
            feed: Arc::new(PollingFeed::new(
                Arc::new(store),
                self.claims.0,
                self.claims.1,
            )),
            ceiling,
            started: Instant::now(),
            published: 0,
        });
        Ok(true)
    }

    /// Reads the paused routes into the scheduler: what the log brings of them is left pending
    /// in the table ([`LogScheduler::set_paused_routes`]), as the catch-up's claims leave theirs.
    async fn read_pauses(&self, state: &mut State) -> Result<(), StoreError> {
        let routes: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT name FROM {}.pauses WHERE kind = 'route'",
            self.schema.quoted()
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| store_error("reading the paused routes", e))?;
        if state.log.set_paused_routes(routes) {
            tracing::info!(
                "a route was paused: what the log brings of it is left pending in the table \
                 until it is resumed"
            );
        }
        state.pauses_read = Some(Instant::now());
        Ok(())
    }

    /// The catch-up's next batch (`None` when it has none now), or its end: once a claim
    /// finds nothing, no batch of it is out, and no pending row at or below the ceiling is
    /// left that could be published (rows behind a dead letter and rows of a paused route
    /// wait), the parked aggregates are read, and the stream is read from then on.
    async fn catch_up(
        &self,
        state: &mut State,
        max_rows: usize,
    ) -> Result<Option<FeedBatch<CdcTicket>>, StoreError> {
        let Some(catch_up) = state.catch_up.as_ref() else {
            return Ok(None);
        };
        let (feed, ceiling) = (Arc::clone(&catch_up.feed), catch_up.ceiling);
        let batch = feed.next_batch(max_rows).await?;
        if !batch.messages.is_empty() || !batch.undecodable.is_empty() {
            state.catch_up_out += 1;
            return Ok(Some(FeedBatch {
                ticket: CdcTicket {
                    table: Some((batch.ticket, feed)),
                    log: LogBatch::empty(state.log.session()),
                },
                messages: batch.messages,
                owned_until: batch.owned_until,
                takeovers: batch.takeovers,
                undecodable: batch.undecodable,
                liveness: batch.liveness,
            }));
        }
        if state.catch_up_out > 0 || self.pending_up_to(ceiling).await? {
            return Ok(None);
        }
        let parked: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT DISTINCT aggregate_type, aggregate_id FROM {}.events WHERE state = 'dead'",
            self.schema.quoted()
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| store_error("reading parked aggregates", e))?;
        let until: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| store_error("reading the log's position", e))?;
        let until = super::parse_lsn(&until).map_err(cdc_error)?;
        state.log.caught_up(parked, until);
        self.following.store(true, Ordering::Relaxed);
        if let Some(done) = state.catch_up.take()
            && done.published > 0
        {
            tracing::info!(
                events = done.published,
                secs = done.started.elapsed().as_secs_f64(),
                "caught up: events pending in the table when the stream started are published; \
                 following the log"
            );
        }
        Ok(None)
    }

    /// Whether a head the catch-up must publish is left at or below `ceiling`: a pending row
    /// with no unpublished earlier version of its aggregate (the claim's heads; rows behind a
    /// dead letter are not heads) and not on a paused route (those wait for a requeue or a
    /// resume, which start a new catch-up). Heads held by another relay's lease or in backoff
    /// count: the catch-up waits for them.
    async fn pending_up_to(&self, ceiling: i64) -> Result<bool, StoreError> {
        let s = self.schema.quoted();
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT EXISTS (SELECT 1 FROM {s}.events e WHERE e.state = 'pending' AND e.id <= $1 \
               AND NOT EXISTS (SELECT 1 FROM {s}.events p \
                 WHERE p.aggregate_type = e.aggregate_type AND p.aggregate_id = e.aggregate_id \
                   AND p.aggregate_version < e.aggregate_version AND p.state <> 'published') \
               AND NOT EXISTS (SELECT 1 FROM {s}.pauses z WHERE z.kind = 'route' \
                 AND z.name = {key}))",
            key = crate::sql::route_key("e.")
        )))
        .bind(ceiling)
        .fetch_one(&self.pool)
        .await
        .map_err(|e| store_error("looking for rows left to catch up", e))
    }

    /// Reads what the stream has: waits up to `wait` for the first event, then takes what
    /// follows at once, until `max_rows` events wait; never past
    /// [`CdcConfig::max_rows_in_memory`] held events.
    async fn pull(
        &self,
        state: &mut State,
        wait: Duration,
        max_rows: usize,
    ) -> Result<(), StoreError> {
        let mut wait = wait;
        loop {
            if self.memory_full(state) {
                return Ok(());
            }
            let Some(stream) = state.stream.as_mut() else {
                return Ok(());
            };
            let next = match tokio::time::timeout(wait, stream.next()).await {
                Err(_) => return Ok(()),
                Ok(Ok(Some(event))) => event,
                Ok(Ok(None)) => {
                    state.reset();
                    return Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "the replication stream ended; it is started again",
                    ));
                }
                Ok(Err(e)) => {
                    state.reset();
                    return Err(cdc_error(e));
                }
            };
            state.log.receive(log_event(next));
            if state.log.waiting_count() >= max_rows {
                return Ok(());
            }
            // The rest: only what the connection has already buffered. Waiting for more here
            // would add that wait to every event of a steady trickle.
            wait = Duration::ZERO;
        }
    }

    /// The events held reached [`CdcConfig::max_rows_in_memory`]: the stream is not read
    /// until some are settled. The highest count seen is kept
    /// ([`CdcFeed::peak_rows_in_memory`]).
    fn memory_full(&self, state: &State) -> bool {
        let held = state.log.held();
        self.peak_held.fetch_max(held, Ordering::Relaxed);
        held >= self.config.max_rows_in_memory.max(1)
    }

    /// The most streamed events this feed has held in memory at once, not counting the
    /// batches handed out (at most the relay's batch size per worker): at most
    /// [`CdcConfig::max_rows_in_memory`] plus one part of a transaction (a quarter of it).
    /// The bound of the relay's memory, whatever the size of the transactions.
    pub fn peak_rows_in_memory(&self) -> usize {
        self.peak_held.load(Ordering::Relaxed)
    }

    /// Ends the stream session: the position confirmed so far is sent, the stream closed, and
    /// everything in memory dropped; the next batch starts a new session (and its catch-up).
    async fn end_session(&self, state: &mut State) {
        self.confirm(state);
        if let Some(stream) = state.stream.take()
            && let Err(e) = stream.stop().await
        {
            tracing::warn!(error = %e, "stopping the stream");
        }
        state.reset();
        self.following.store(false, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use outbox_core::{NewMessage, Payload};

    use super::*;
    use crate::PgOutbox;
    use outbox_core::relay::log::Waiting;

    /// The full id of a 32-bit xid next to a snapshot's xmax: before, at and after xmax, and
    /// across an epoch boundary either way.
    #[tokio::test]
    async fn a_32_bit_xid_is_made_full_next_to_the_snapshots_xmax() {
        let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let pool = PgPool::connect(&url)
            .await
            .expect("PostgreSQL on OUTBOX_TEST_DATABASE_URL");
        const E: i64 = 1 << 32;
        for (xid, xmax, full) in [
            (700, 1000, 700),
            (1000, 1000, 1000),
            (1005, 1000, 1005),
            (700, 2 * E + 1000, 2 * E + 700),
            (1005, 2 * E + 1000, 2 * E + 1005),
            // xmax just past an epoch boundary, the xid just before it.
            (E - 2, 2 * E + 3, 2 * E - 2),
            // xmax just before a boundary, the xid just after it.
            (1, 2 * E - 2, 2 * E + 1),
        ] {
            let got: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT {}",
                full_xid("$1::int8", "$2::int8")
            )))
            .bind(xid)
            .bind(xmax)
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(got, full, "xid {xid} next to xmax {xmax}");
        }
    }

    /// Enqueues `message` in a transaction left open (its row invisible to other sessions, as
    /// in the moment between a commit reaching the log and becoming visible); returns it, the
    /// row's id and the transaction's id.
    async fn enqueue_open(
        pool: &PgPool,
        schema: &Schema,
        message: &NewMessage,
    ) -> (sqlx::Transaction<'static, sqlx::Postgres>, i64, i64) {
        let mut tx = pool.begin().await.unwrap();
        PgOutbox::new(schema.clone())
            .enqueue(&mut *tx, message)
            .await
            .unwrap();
        let (id, xid): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id, txid_current() FROM {}.events",
            schema.quoted()
        )))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        (tx, id, xid)
    }

    /// A dead letter of a row whose transaction the statement does not see yet is not counted
    /// as recorded (it would stay pending unseen, its position confirmed): it is kept for a
    /// later try, which records it once the transaction is visible. An open transaction stands
    /// for the window, as below.
    #[tokio::test]
    async fn a_dead_letter_of_a_row_not_visible_yet_is_recorded_later() {
        let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let pool = PgPool::connect(&url)
            .await
            .expect("PostgreSQL on OUTBOX_TEST_DATABASE_URL");
        let schema =
            Schema::new(&format!("cdc_late_dead_{}", uuid::Uuid::now_v7().simple())).unwrap();
        crate::migrate(&pool, &schema).await.unwrap();
        let feed = CdcFeed::new(
            &url,
            pool.clone(),
            schema.clone(),
            CdcConfig::default(),
            OnPublish::Delete,
        );
        let new = NewMessage::new(
            "t",
            "a",
            1,
            "T",
            Payload::bytes("application/json", b"{}".to_vec()),
        );
        let (tx, id, xid) = enqueue_open(&pool, &schema, &new).await;
        let message = OutboxMessage {
            id,
            event_id: new.event_id,
            aggregate_type: new.aggregate_type.clone(),
            aggregate_id: new.aggregate_id.clone(),
            aggregate_version: 1,
            event_type: new.event_type.clone(),
            schema_version: 1,
            fingerprint: outbox_core::Fingerprint::of(&new.payload.bytes),
            payload: new.payload.clone(),
            headers: std::collections::BTreeMap::new(),
            destination: None,
            partition_key: None,
            created_at: chrono::Utc::now(),
            attempts: 1,
        };
        let leave = || Leave {
            event: Waiting {
                row: Row::Message(message.clone()),
                tx: 0,
                source_tx: (xid & 0xFFFF_FFFF) as u64,
                due: None,
            },
            dead: Some("refused".to_owned()),
        };
        let state = || async {
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
                "SELECT state FROM {}.events",
                schema.quoted()
            )))
            .fetch_one(&pool)
            .await
            .unwrap()
        };
        let (late, written) = feed.leave_rows(&[leave()]).await.unwrap();
        assert_eq!((late, written), (HashSet::from([id]), 0), "not seen yet");
        tx.commit().await.unwrap();
        assert_eq!(
            state().await,
            "pending",
            "nothing recorded before it was seen"
        );
        let (late, written) = feed.leave_rows(&[leave()]).await.unwrap();
        assert_eq!((late, written), (HashSet::new(), 0));
        assert_eq!(state().await, "dead", "recorded once seen");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .unwrap();
    }

    /// The window between a transaction's commit record reaching the log and the commit
    /// becoming visible is too short to hit on purpose; an open transaction stands for it:
    /// its row is invisible to the settle's snapshot exactly as a row in that window is.
    #[tokio::test]
    async fn a_row_of_a_transaction_the_settle_does_not_see_yet_is_left_for_later() {
        let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let pool = PgPool::connect(&url)
            .await
            .expect("PostgreSQL on OUTBOX_TEST_DATABASE_URL");
        let schema = Schema::new(&format!("cdc_late_{}", uuid::Uuid::now_v7().simple())).unwrap();
        crate::migrate(&pool, &schema).await.unwrap();
        let feed = CdcFeed::new(
            &url,
            pool.clone(),
            schema.clone(),
            CdcConfig::default(),
            OnPublish::Delete,
        );
        let message = |id: &str| {
            NewMessage::new(
                "t",
                id,
                1,
                "T",
                Payload::bytes("application/json", b"{}".to_vec()),
            )
        };
        let count = || async {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {}.events",
                schema.quoted()
            )))
            .fetch_one(&pool)
            .await
            .unwrap()
        };

        let (tx, id, xid) = enqueue_open(&pool, &schema, &message("a")).await;
        let row = (id, xid & 0xFFFF_FFFF);
        assert_eq!(
            feed.settle_rows(&[row]).await.unwrap(),
            HashSet::from([id]),
            "not seen yet: left for later"
        );
        tx.commit().await.unwrap();
        assert_eq!(count().await, 1, "nothing deleted before it was seen");
        assert!(feed.settle_rows(&[row]).await.unwrap().is_empty());
        assert_eq!(count().await, 0, "deleted once seen");

        // Deleted by the producer in its transaction: seen, nothing to delete, not late.
        let mut tx = pool.begin().await.unwrap();
        PgOutbox::new(schema.clone())
            .delete_in_transaction(true)
            .enqueue(&mut *tx, &message("b"))
            .await
            .unwrap();
        let (gone, xid): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT currval(pg_get_serial_sequence('{}.events', 'id')), txid_current()",
            schema.quoted()
        )))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        assert!(
            feed.settle_rows(&[(gone, xid & 0xFFFF_FFFF)])
                .await
                .unwrap()
                .is_empty()
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .unwrap();
    }
}
