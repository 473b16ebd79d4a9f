//! The scheduler of a log feed: what a [`Feed`](super::Feed) that streams the store's change
//! log (instead of claiming rows from the table) keeps in memory between the log and the
//! publish engine, written once for every store whose log can be streamed.
//!
//! A log hands out committed transactions in commit order, each with the outbox rows it
//! inserted. The [`LogScheduler`] turns them into batches that keep the relay's promises:
//!
//! * **Per-aggregate order, one batch per aggregate**: events wait per aggregate in version
//!   order; an aggregate is *busy* while a batch holding it is out, and nothing more of it is
//!   handed out before that batch is settled.
//! * **Confirm after settle (G3)**: each transaction is *open* until every event of it is
//!   settled; [`LogScheduler::confirmable`] gives the log position that may be confirmed to the
//!   source: the end of the last settled transaction before the first open one (or the idle
//!   position when none is open), never past an event that is not settled. After a crash the
//!   source hands out everything after the confirmed position again, same rows, same event ids.
//! * **Retries in memory**: a failed event goes back to the head of its aggregate with one more
//!   attempt and its due time; its aggregate's later events wait behind it.
//! * **Dead letters park their aggregate**: the dead event, the aggregate's events behind it and
//!   every later one the log brings are *left to the table* ([`LogScheduler::restore_list`]):
//!   the store records them there (the dead letter marked, the others pending, written back if
//!   their producer deleted them) before they count as settled. A parked aggregate is published
//!   again by the next session's catch-up (a requeue, a discard or a resume starts one).
//! * **Late rows**: a published row whose transaction the store's settle could not see yet (a
//!   log hands a transaction out a moment before the database makes it visible) is settled by a
//!   later snapshot ([`LogScheduler::late_rows`]); its position stays unconfirmed meanwhile.
//! * **Catch-up skips**: rows a session's catch-up published from the table are skipped when
//!   the log brings them again, until the log passes the position at the catch-up's end.
//! * **Paused routes**: an aggregate whose next event goes to a paused route
//!   ([`LogScheduler::set_paused_routes`]) is parked like one behind a dead letter: that event
//!   and every later one of the aggregate, whatever their route, are left pending in the table,
//!   and a resume's new session publishes them in order (the same rule as the polling claim's,
//!   `crate::operator::PauseTarget`).
//! * **Behind the table**: an aggregate's first head in a session is checked against the table
//!   ([`LogScheduler::unverified_heads`], [`LogScheduler::hold_behind`]); one with an older
//!   version still pending there waits for it, up to [`BEHIND_PATIENCE`].
//!
//! The store's feed holds the stream itself, the catch-up's claims and every statement; this
//! module decides, and has no I/O. PostgreSQL's CDC feed (`outbox_postgres::cdc::CdcFeed`) is
//! built on it; the feed conformance suite (`outbox_testkit::feed_suite!`) holds it to the same
//! rules as the polling feed.

mod ids;
mod settle;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::message::OutboxMessage;
use crate::store::UndecodableRow;

use ids::IdSet;
pub use settle::Behind;

/// How long an aggregate with an older version pending in the table is held, looked at again
/// every [`BEHIND_RECHECK`], before the feed starts its session again (its catch-up publishes
/// the older rows): long enough for a polling relay running beside the log feed (a switch of
/// modes) to publish them itself.
pub const BEHIND_PATIENCE: Duration = Duration::from_secs(30);

/// How often a held aggregate is checked against the table again.
pub const BEHIND_RECHECK: Duration = Duration::from_millis(250);

/// An aggregate: `(aggregate_type, aggregate_id)`.
pub type Aggregate = (String, String);

/// What a log row is to the batch it goes out in.
#[derive(Debug, Clone, Copy)]
pub enum LogItem<'a> {
    /// An event to publish.
    Message(&'a OutboxMessage),
    /// A row that cannot be published as stored: the engine dead-letters it with its reason,
    /// and its aggregate waits behind it.
    Undecodable(&'a UndecodableRow),
}

/// An event of the log as the scheduler holds it: a decoded message, or a row that cannot be
/// published as stored (with what the store needs to write it back).
pub trait LogRow: Clone + fmt::Debug + Send + Sync + 'static {
    /// The row's id in the table.
    fn id(&self) -> i64;
    /// Its version within its aggregate.
    fn version(&self) -> i64;
    /// Its aggregate, borrowed: `(aggregate_type, aggregate_id)`.
    fn key(&self) -> (&str, &str);
    /// The same event after one more failed attempt.
    fn attempted(&self) -> Self;
    /// What it is in a batch.
    fn item(&self) -> LogItem<'_>;
    /// Its route: `(destination, aggregate_type)`, as
    /// [`route_key`](crate::operator::route_key) takes them.
    fn route(&self) -> (Option<&str>, &str);

    /// Its aggregate, owned.
    fn aggregate(&self) -> Aggregate {
        let (t, i) = self.key();
        (t.to_owned(), i.to_owned())
    }

    /// Whether it belongs to `aggregate`.
    fn is_of(&self, aggregate: &Aggregate) -> bool {
        self.key() == (aggregate.0.as_str(), aggregate.1.as_str())
    }
}

/// What the log hands out.
#[derive(Debug, Clone)]
pub enum LogEvent<R> {
    /// A committed transaction (or a part of one) with at least one outbox row.
    Transaction(LogTransaction<R>),
    /// The log reached `position` with no outbox row since the previous event: once every
    /// earlier transaction is settled, confirming it lets the source recycle its log.
    Idle {
        /// The log position reached.
        position: u64,
    },
}

/// A committed transaction's outbox rows, as the log hands them out.
#[derive(Debug, Clone)]
pub struct LogTransaction<R> {
    /// The source's id of the transaction (how the store checks that a snapshot sees it). The
    /// parts of one transaction come one after the other with the same id.
    pub source_tx: u64,
    /// The position just past its commit; meaningful once `complete`.
    pub end: u64,
    /// This is its last part: nothing of it may be confirmed before.
    pub complete: bool,
    /// When it committed, by the source's clock.
    pub committed_at: DateTime<Utc>,
    /// Its rows, each aggregate's in version order.
    pub rows: Vec<R>,
}

/// A streamed transaction not settled yet.
#[derive(Debug)]
struct Open {
    seq: u64,
    source_tx: u64,
    complete: bool,
    end: u64,
    committed_at: DateTime<Utc>,
    /// Its events not settled yet.
    left: usize,
}

/// An event waiting to be handed out, at the head of its aggregate or behind it.
#[derive(Debug)]
pub struct Waiting<R> {
    /// The event.
    pub row: R,
    /// Its transaction's sequence number in this session.
    pub tx: u64,
    /// Its transaction's id at the source ([`LogTransaction::source_tx`]).
    pub source_tx: u64,
    /// Not handed out before (a retry's backoff, a held aggregate's recheck).
    pub due: Option<Instant>,
}

/// An event left to the table: the store records it there (a dead letter marked, a parked
/// event pending, either written back if its row is gone) before it counts as settled.
#[derive(Debug)]
pub struct Leave<R> {
    /// The event.
    pub event: Waiting<R>,
    /// The dead letter's error; `None` for an event parked behind one (left pending).
    pub dead: Option<String>,
}

/// A published row whose transaction the settle's snapshot did not see yet; settled once a
/// later snapshot sees it.
#[derive(Debug, Clone, Copy)]
pub struct Late {
    /// The row's id.
    pub id: i64,
    /// Its transaction's sequence number.
    pub tx: u64,
    /// Its transaction's id at the source.
    pub source_tx: u64,
}

/// The handle of a batch of streamed events ([`LogScheduler::batch`]).
#[derive(Debug)]
pub struct LogBatch<R> {
    /// The session it came from: a settle of an older session is ignored.
    pub session: u64,
    /// Each event with its transaction's sequence number and source id.
    pub rows: Vec<(i64, u64, u64)>,
    /// The events (for retries and not-attempted rows).
    pub events: Vec<R>,
}

impl<R> LogBatch<R> {
    /// A batch with nothing in it, of `session`.
    pub fn empty(session: u64) -> Self {
        Self {
            session,
            rows: Vec::new(),
            events: Vec::new(),
        }
    }
}

/// The scheduler's own maps and sets. Hashed with foldhash (a random seed per map) rather than
/// the standard SipHash: the stream path looks each event's aggregate up three or four times,
/// and SipHash on those keys was about 8 % of the path's samples (W5, issue 36). The trade:
/// aggregate ids may come from end users, and foldhash calls itself only minimally resistant
/// to keys chosen to collide; the seed is random per map and per process.
pub(crate) type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
/// See [`Map`].
pub(crate) type Set<K> = HashSet<K, foldhash::fast::RandomState>;

/// The in-memory state of a log feed's session; see the [module docs](self).
#[derive(Debug)]
pub struct LogScheduler<R> {
    session: u64,
    next_seq: u64,
    /// Rows the catch-up published or dead-lettered, which the stream skips.
    caught_up: IdSet,
    /// The log position after which no row of `caught_up` can come.
    caught_up_until: Option<u64>,
    /// Transactions in commit order, settled ones popped from the front.
    open: VecDeque<Open>,
    /// Events not handed out, per aggregate in version order.
    waiting: Map<Aggregate, VecDeque<Waiting<R>>>,
    /// Aggregates in the order their first waiting event arrived (may hold stale entries).
    order: VecDeque<Aggregate>,
    /// Aggregates of a batch not settled yet.
    busy: Set<Aggregate>,
    /// Aggregates left to the table: their events are not published from the log.
    parked: Set<Aggregate>,
    /// Events left to the table, recorded there before they count as settled.
    restore: Vec<Leave<R>>,
    /// Published rows whose transaction was not visible yet when their settle ran.
    late: Vec<Late>,
    /// Aggregates checked against the table in this session.
    verified: Set<Aggregate>,
    /// Aggregates found behind the table, since then.
    behind: Map<Aggregate, Instant>,
    /// The highest idle position seen, confirmed once nothing before it is open.
    idle: Option<u64>,
    /// The paused routes' keys.
    paused_routes: HashSet<String>,
}

impl<R> Default for LogScheduler<R> {
    fn default() -> Self {
        Self {
            session: 0,
            next_seq: 0,
            caught_up: IdSet::default(),
            caught_up_until: None,
            open: VecDeque::new(),
            waiting: Map::default(),
            order: VecDeque::new(),
            busy: Set::default(),
            parked: Set::default(),
            restore: Vec::new(),
            late: Vec::new(),
            verified: Set::default(),
            behind: Map::default(),
            idle: None,
            paused_routes: HashSet::new(),
        }
    }
}

impl<R: LogRow> LogScheduler<R> {
    /// The current session: 0 at the start, one more at each [`LogScheduler::reset`].
    pub fn session(&self) -> u64 {
        self.session
    }

    /// Drops the session: everything after the confirmed position comes again from the log.
    /// The parked aggregates and the paused routes are kept.
    pub fn reset(&mut self) {
        let parked = std::mem::take(&mut self.parked);
        let paused_routes = std::mem::take(&mut self.paused_routes);
        let session = self.session + 1;
        *self = Self {
            session,
            parked,
            paused_routes,
            ..Self::default()
        };
    }

    /// The routes paused now, by their keys ([`route_key`](crate::operator::route_key)):
    /// from the next [`LogScheduler::take`] on, an aggregate whose next event goes to one of
    /// them is parked, and its events stay pending in the table. A batch handed out before is
    /// finished. Returns whether a route was paused that was not before.
    pub fn set_paused_routes(&mut self, routes: impl IntoIterator<Item = String>) -> bool {
        let routes: HashSet<String> = routes.into_iter().collect();
        let added = routes.iter().any(|r| !self.paused_routes.contains(r));
        self.paused_routes = routes;
        added
    }

    /// Whether `row` goes to a paused route.
    fn is_paused(paused_routes: &HashSet<String>, row: &R) -> bool {
        if paused_routes.is_empty() {
            return false;
        }
        let (destination, aggregate_type) = row.route();
        paused_routes.contains(&crate::operator::route_key(destination, aggregate_type))
    }

    /// Events waiting to be handed out.
    pub fn waiting_count(&self) -> usize {
        self.waiting.values().map(VecDeque::len).sum()
    }

    /// Streamed events held in memory and not handed out: waiting, left to the table, or
    /// published and waiting for their transaction to become visible. A feed stops reading
    /// its log while this is at its memory bound.
    pub fn held(&self) -> usize {
        self.waiting_count() + self.restore.len() + self.late.len()
    }

    /// Whether a batch is out (some aggregate is busy).
    pub fn has_busy(&self) -> bool {
        !self.busy.is_empty()
    }

    /// Marks `n` events of transaction `seq` settled.
    pub fn settled(&mut self, seq: u64, n: usize) {
        if let Some(t) = self.open.iter_mut().find(|t| t.seq == seq) {
            t.left = t.left.saturating_sub(n);
        }
    }

    /// The position that may be confirmed now: the end of the last settled transaction before
    /// the first open one, or the idle position when nothing is open. Each position is given
    /// once.
    pub fn confirmable(&mut self) -> Option<u64> {
        let mut end = None;
        while self.open.front().is_some_and(|t| t.left == 0 && t.complete) {
            end = self.open.pop_front().map(|t| t.end);
        }
        if self.open.is_empty()
            && let Some(idle) = self.idle.take()
        {
            end = Some(end.map_or(idle, |e: u64| e.max(idle)));
        }
        end
    }

    /// When the oldest transaction not confirmed yet committed.
    pub fn oldest_open(&self) -> Option<DateTime<Utc>> {
        self.open.front().map(|t| t.committed_at)
    }

    /// Takes what the log handed out.
    pub fn receive(&mut self, event: LogEvent<R>) {
        let reached = match &event {
            LogEvent::Idle { position } => Some(*position),
            LogEvent::Transaction(tx) if tx.complete => Some(tx.end),
            LogEvent::Transaction(_) => None,
        };
        match event {
            LogEvent::Idle { position } => {
                self.idle = Some(self.idle.map_or(position, |p| p.max(position)));
            }
            LogEvent::Transaction(tx) => self.take_in(tx),
        }
        if let (Some(reached), Some(until)) = (reached, self.caught_up_until)
            && reached > until
        {
            // Every transaction that held a row of the catch-up has come.
            self.caught_up = IdSet::default();
            self.caught_up_until = None;
        }
    }

    fn take_in(&mut self, tx: LogTransaction<R>) {
        // The next part of the transaction received last, or a new transaction.
        let continued = self
            .open
            .back()
            .filter(|t| !t.complete && t.source_tx == tx.source_tx)
            .map(|t| t.seq);
        let seq = continued.unwrap_or_else(|| {
            self.next_seq += 1;
            self.next_seq - 1
        });
        let mut rows = tx.rows;
        if !self.caught_up.is_empty() {
            // Published (or dead-lettered) by the catch-up already.
            rows.retain(|r| !self.caught_up.contains(r.id()));
        }
        let left = rows.len();
        for row in rows {
            let aggregate = row.aggregate();
            let event = Waiting {
                row,
                tx: seq,
                source_tx: tx.source_tx,
                due: None,
            };
            if self.parked.contains(&aggregate) {
                // Left pending in the table for a later catch-up: there already, or written
                // back first if its producer deleted it (every version: one published before a
                // restart goes out again, a late-committing older one is not lost).
                self.restore.push(Leave { event, dead: None });
                continue;
            }
            match self.waiting.get_mut(&aggregate) {
                Some(queue) if !queue.is_empty() => queue.push_back(event),
                _ => {
                    self.order.push_back(aggregate.clone());
                    self.waiting.entry(aggregate).or_default().push_back(event);
                }
            }
        }
        match self.open.back_mut().filter(|_| continued.is_some()) {
            Some(open) => {
                open.left += left;
                open.complete = tx.complete;
                open.end = tx.end;
            }
            None => self.open.push_back(Open {
                seq,
                source_tx: tx.source_tx,
                complete: tx.complete,
                end: tx.end,
                committed_at: tx.committed_at,
                left,
            }),
        }
    }

    /// Up to `max_rows` events of aggregates that are not busy and whose head is due, each
    /// aggregate's in version order, up to its first event on a paused route; the aggregates
    /// taken become busy. An aggregate whose head is on a paused route is parked.
    pub fn take(&mut self, max_rows: usize) -> Vec<Waiting<R>> {
        let now = Instant::now();
        let mut out = Vec::new();
        let mut paused = Vec::new();
        let mut keep = VecDeque::with_capacity(self.order.len());
        while let Some(aggregate) = self.order.pop_front() {
            if out.len() >= max_rows {
                // Full: the rest keep their places unlooked at (thousands of aggregates may
                // wait behind a batch; looking each up per batch cost more than the batch).
                // A stale entry among them (an aggregate parked or drained since) stays until
                // a take reaches it, as before; it moves no event.
                keep.push_back(aggregate);
                keep.extend(self.order.drain(..));
                break;
            }
            let Some(queue) = self.waiting.get_mut(&aggregate) else {
                continue;
            };
            if queue.is_empty() {
                self.waiting.remove(&aggregate);
                continue;
            }
            let due = queue.front().and_then(|w| w.due).is_none_or(|d| d <= now);
            if self.busy.contains(&aggregate) || !due {
                keep.push_back(aggregate);
                continue;
            }
            let room = max_rows - out.len();
            // Walked event by event only while some route is paused.
            let n = if self.paused_routes.is_empty() {
                queue.len().min(room)
            } else {
                queue
                    .iter()
                    .take(room)
                    .take_while(|w| !Self::is_paused(&self.paused_routes, &w.row))
                    .count()
            };
            if n == 0 {
                paused.push(aggregate);
                continue;
            }
            out.extend(queue.drain(..n));
            if queue.is_empty() {
                self.waiting.remove(&aggregate);
            } else {
                keep.push_back(aggregate.clone());
            }
            self.busy.insert(aggregate);
        }
        self.order = keep;
        for aggregate in paused {
            tracing::debug!(
                aggregate_type = %aggregate.0,
                aggregate_id = %aggregate.1,
                "the next event of this aggregate goes to a paused route: its events wait in \
                 the table for a resume"
            );
            self.park(&aggregate, Vec::new());
        }
        out
    }

    /// The batch of `taken` events (in the engine's order: by aggregate, then version), with
    /// the messages and the undecodable rows it hands out.
    pub fn batch(
        &self,
        mut taken: Vec<Waiting<R>>,
    ) -> (LogBatch<R>, Vec<OutboxMessage>, Vec<UndecodableRow>) {
        taken.sort_by(|a, b| (a.row.key(), a.row.version()).cmp(&(b.row.key(), b.row.version())));
        let rows = taken
            .iter()
            .map(|w| (w.row.id(), w.tx, w.source_tx))
            .collect();
        let events: Vec<R> = taken.into_iter().map(|w| w.row).collect();
        let mut messages = Vec::with_capacity(events.len());
        let mut undecodable = Vec::new();
        for event in &events {
            match event.item() {
                LogItem::Message(m) => messages.push(m.clone()),
                LogItem::Undecodable(u) => undecodable.push(u.clone()),
            }
        }
        let batch = LogBatch {
            session: self.session,
            rows,
            events,
        };
        (batch, messages, undecodable)
    }

    /// Puts `events` of one aggregate back at the head of its queue, in order.
    pub fn put_back(&mut self, aggregate: &Aggregate, events: Vec<Waiting<R>>) {
        if events.is_empty() {
            return;
        }
        let queue = self.waiting.entry(aggregate.clone()).or_default();
        let was_empty = queue.is_empty();
        for w in events.into_iter().rev() {
            queue.push_front(w);
        }
        if was_empty {
            self.order.push_front(aggregate.clone());
        }
    }

    /// Leaves `aggregate` to the table: its events taken or waiting, and later ones as they
    /// arrive, stay (or are written back) as pending rows of the table.
    pub fn park(&mut self, aggregate: &Aggregate, taken: Vec<Waiting<R>>) {
        let queued = self.waiting.remove(aggregate).into_iter().flatten();
        self.leave_to_table(taken.into_iter().chain(queued));
        self.busy.remove(aggregate);
        self.parked.insert(aggregate.clone());
    }

    /// Events left to the table, pending ([`LogScheduler::restore_list`]).
    pub fn leave_to_table(&mut self, events: impl IntoIterator<Item = Waiting<R>>) {
        self.restore
            .extend(events.into_iter().map(|event| Leave { event, dead: None }));
    }

    /// The earliest due time of a waiting head, if every waiting head is in backoff.
    pub fn next_due(&self) -> Option<Instant> {
        self.waiting
            .values()
            .filter_map(|q| q.front().and_then(|w| w.due))
            .min()
    }

    /// The parked aggregates none of whose events waits to be recorded in the table: those a
    /// feed may look up to see whether they are still blocked.
    pub fn parked_settled(&self) -> Vec<&Aggregate> {
        let recording: Set<Aggregate> = self
            .restore
            .iter()
            .map(|l| l.event.row.aggregate())
            .collect();
        self.parked
            .iter()
            .filter(|a| !recording.contains(*a))
            .collect()
    }

    /// Whether some aggregate is parked.
    pub fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// Forgets the parked aggregates (a new session reads them again from the table).
    pub fn clear_parked(&mut self) {
        self.parked.clear();
    }

    /// The catch-up is done: `parked` are the aggregates it left behind a dead letter, and the
    /// log can no longer bring a row it published once past `until`.
    pub fn caught_up(&mut self, parked: impl IntoIterator<Item = Aggregate>, until: u64) {
        self.parked.extend(parked);
        self.caught_up.compact();
        self.caught_up_until = (!self.caught_up.is_empty()).then_some(until);
    }

    /// A row the catch-up published or dead-lettered: the log's copy of it is skipped.
    pub fn skip(&mut self, id: i64) {
        self.caught_up.insert(id);
    }

    /// Events left to the table and not recorded there yet.
    pub fn restore_list(&self) -> &[Leave<R>] {
        &self.restore
    }

    /// The store recorded the events left to the table but those in `not_visible` (their
    /// transactions are not visible yet): the others count as settled.
    pub fn restored(&mut self, not_visible: &HashSet<i64>) {
        for leave in std::mem::take(&mut self.restore) {
            if not_visible.contains(&leave.event.row.id()) {
                self.restore.push(leave);
            } else {
                self.settled(leave.event.tx, 1);
            }
        }
    }

    /// Published rows waiting for their transactions to become visible.
    pub fn late_rows(&self) -> &[Late] {
        &self.late
    }

    /// The store settled the late rows but those in `still` (not visible yet).
    pub fn late_settled(&mut self, still: &HashSet<i64>) {
        for l in std::mem::take(&mut self.late) {
            if still.contains(&l.id) {
                self.late.push(l);
            } else {
                self.settled(l.tx, 1);
            }
        }
    }
}

#[cfg(test)]
mod tests;
