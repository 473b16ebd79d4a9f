//! Where a store's claim starts reading the pending rows: the claim window, for a store whose
//! claim statement walks the pending rows in id order (PostgreSQL's, for example:
//! `PgStore::with_claim_window`, `relay.claim_window = true`), an option off by default. The
//! store runs its statement from [`Window::start`] and reports what it found
//! ([`Window::settle`], [`Window::release`]); this module decides, and has no I/O.
//!
//! A claim reads the pending rows in id order and stops once it has enough heads. Rows that
//! cannot be claimed now (a paused route's, those waiting behind a dead letter, those in
//! backoff, those another relay holds) are read and rejected by every claim (about 2 µs each
//! on PostgreSQL): a front of a million such rows makes each claim take seconds (BENCHMARKS.md,
//! "A paused route's cost"), and an idle relay keeps the database busy with it.
//!
//! With the window, a claim whose statement took at least [`ClaimWindow::slow_claim`] tells
//! the next ones where to start: at its lowest head (the rows before it were all rejected), or,
//! when it found none, after the table's last row as read before it ran. A claim walks from the
//! beginning again:
//!
//! * when the last walk from the beginning is ten times its own duration old, within
//!   [`ClaimWindow::min_rescan`] and [`ClaimWindow::max_rescan`] (such walks cost about a
//!   tenth of the claims' time while one takes under a second, and one walk per `max_rescan`
//!   beyond; a row below the start waits at most `max_rescan` plus one walk for them);
//! * after an operator's requeue, discard, replay or resume (the store's wake-up calls
//!   [`Window::rescan_now`]);
//! * when a retry this relay scheduled comes due.
//!
//! The start never passes the lowest head of a claim of this store that is not settled yet: an
//! aggregate a sibling worker holds is not left behind when it is released.
//!
//! What it trades: while the front of the table is blocked, a row below the start that becomes
//! claimable otherwise (a producer transaction that committed after rows with higher ids were
//! claimed, a lease of a crashed relay that expired, an aggregate another relay process held,
//! a retry another relay scheduled) waits for the next walk from the beginning: at most
//! `max_rescan` (10 s by default) plus that walk. Nothing is lost or reordered (a head still
//! needs every earlier version of its aggregate published, wherever it lies), and while claims
//! are faster than `slow_claim` the start stays at the beginning.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Settings of the claim window (the module docs say what it trades).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimWindow {
    /// A claim statement that took at least this long moves the next claims' start past the
    /// rows it rejected. Default 100 ms (a claim of 1,000 rows takes 5–20 ms on an unblocked
    /// table here).
    pub slow_claim: Duration,
    /// The shortest time between two walks from the beginning. Default 1 s.
    pub min_rescan: Duration,
    /// The longest time between two walks from the beginning: what a row below the start
    /// waits at most, plus one walk. Default 10 s.
    pub max_rescan: Duration,
}

impl Default for ClaimWindow {
    fn default() -> Self {
        Self {
            slow_claim: Duration::from_millis(100),
            min_rescan: Duration::from_secs(1),
            max_rescan: Duration::from_secs(10),
        }
    }
}

impl ClaimWindow {
    /// The defaults with other thresholds (`max_rescan` is raised to `min_rescan` if lower).
    pub fn new(slow_claim: Duration, min_rescan: Duration, max_rescan: Duration) -> Self {
        Self {
            slow_claim,
            min_rescan,
            max_rescan: max_rescan.max(min_rescan),
        }
    }
}

/// The start of a claim from the table's beginning (ids are positive, but a row may have
/// been written with any id).
pub const BEGINNING: i64 = i64::MIN;

/// What a claim found, for [`Window::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Heads, the lowest of them at this id.
    Heads(i64),
    /// No head; the table's next id, when it was read before the claim.
    Nothing(Option<i64>),
}

/// The start of the next claim, shared by a store's clones (behind an `Arc`).
#[derive(Debug)]
pub struct Window {
    /// `None`: the window is off; every claim walks from the beginning.
    config: Option<ClaimWindow>,
    state: Mutex<State>,
    rescan: AtomicBool,
    /// Whether the last claim statement was slow (the next one reads the table's next id
    /// first).
    last_slow: AtomicBool,
}

#[derive(Debug)]
struct State {
    /// The id the next windowed claim starts at; [`BEGINNING`] when claims start there.
    from: i64,
    /// When the next claim walks from the beginning.
    rescan_at: Instant,
    /// When this relay's retries come due (each one asks for a walk from the beginning).
    retries: BTreeSet<Instant>,
    /// The lowest head of each claim (by lease token) not settled yet, and when its lease
    /// ends (an entry whose release never came, after a failed settle, goes then).
    held: BTreeMap<i64, (i64, Instant)>,
}

/// At most this many retry due times are kept; beyond it the earliest ones are dropped (their
/// rows wait for a later walk, at most `max_rescan` away).
const MAX_RETRIES_KEPT: usize = 10_000;

impl Window {
    /// A window with `config`, or off (`None`: every claim walks from the beginning).
    pub fn new(config: Option<ClaimWindow>) -> Self {
        Self {
            config,
            state: Mutex::new(State {
                from: BEGINNING,
                rescan_at: Instant::now(),
                retries: BTreeSet::new(),
                held: BTreeMap::new(),
            }),
            rescan: AtomicBool::new(false),
            last_slow: AtomicBool::new(false),
        }
    }

    /// Whether the next claim is likely slow too (the last one was).
    pub fn expect_slow(&self) -> bool {
        self.last_slow.load(Ordering::Relaxed)
    }

    /// Whether the window is on.
    pub fn enabled(&self) -> bool {
        self.config.is_some()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the next claim starts, and whether that is the beginning.
    pub fn start(&self) -> (i64, bool) {
        if self.config.is_none() {
            return (BEGINNING, true);
        }
        let asked = self.rescan.swap(false, Ordering::Relaxed);
        let now = Instant::now();
        let mut st = self.state();
        let retry_due = st.retries.first().is_some_and(|due| *due <= now);
        if retry_due {
            // The walk starting now takes every retry due by now.
            st.retries = st.retries.split_off(&now);
        }
        if st.from == BEGINNING || asked || retry_due || now >= st.rescan_at {
            (BEGINNING, true)
        } else {
            (st.from, false)
        }
    }

    /// Records what the claim `token` (0: it took nothing), started at `start`, found in
    /// `elapsed` (its statement's time); its lease ends at `lease_end`.
    pub fn settle(
        &self,
        token: i64,
        start: i64,
        full: bool,
        elapsed: Duration,
        found: Found,
        lease_end: Instant,
    ) {
        let Some(config) = self.config else {
            return;
        };
        let mut st = self.state();
        let now = Instant::now();
        if full {
            let spacing = (elapsed * 10).clamp(config.min_rescan, config.max_rescan);
            st.rescan_at = now.checked_add(spacing).unwrap_or(now);
        }
        let slow = elapsed >= config.slow_claim;
        self.last_slow.store(slow, Ordering::Relaxed);
        let moved = match found {
            Found::Heads(first) if slow => Some(first.max(start)),
            Found::Nothing(Some(next)) if slow => Some(next.max(start)),
            _ => None,
        };
        st.held.retain(|_, (_, until)| *until > now);
        if let Found::Heads(first) = found
            && token != 0
        {
            st.held.insert(token, (first, lease_end));
        }
        let candidate = match moved {
            Some(at) => at,
            // Fast: from the beginning stays there; a windowed start is kept.
            None if full => BEGINNING,
            None => start,
        };
        // Never past an aggregate a claim of this store still holds.
        let lowest_held = st.held.values().map(|(h, _)| *h).min().unwrap_or(i64::MAX);
        st.from = candidate.min(lowest_held);
    }

    /// The claim `token` was settled: its aggregates are free again, and their rows left
    /// pending lie from its lowest head on, which the start does not pass.
    pub fn release(&self, token: i64) {
        if self.config.is_none() {
            return;
        }
        let mut st = self.state();
        if let Some((head, _)) = st.held.remove(&token)
            && st.from != BEGINNING
        {
            st.from = st.from.min(head);
        }
    }

    /// The next claim walks from the beginning (an operator made rows claimable, or a walk
    /// that was asked for failed).
    pub fn rescan_now(&self) {
        self.rescan.store(true, Ordering::Relaxed);
    }

    /// A claim walks from the beginning once `due` has passed (a retry of this relay).
    pub fn rescan_at(&self, due: Instant) {
        if self.config.is_none() {
            return;
        }
        let mut st = self.state();
        st.retries.insert(due);
        while st.retries.len() > MAX_RETRIES_KEPT {
            st.retries.pop_first();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> Window {
        Window::new(Some(ClaimWindow::new(
            Duration::from_millis(100),
            Duration::from_secs(60),
            Duration::from_secs(120),
        )))
    }

    const FAST: Duration = Duration::from_millis(5);

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(3_600)
    }
    const SLOW: Duration = Duration::from_millis(500);

    #[test]
    fn off_every_claim_walks_from_the_beginning() {
        let w = Window::new(None);
        w.settle(1, BEGINNING, true, SLOW, Found::Heads(5_000), far());
        assert_eq!(w.start(), (BEGINNING, true));
    }

    #[test]
    fn fast_claims_always_start_from_the_beginning() {
        let w = window();
        assert_eq!(w.start(), (BEGINNING, true));
        w.settle(1, BEGINNING, true, FAST, Found::Heads(1_000), far());
        w.release(1);
        assert_eq!(w.start(), (BEGINNING, true));
        w.settle(0, BEGINNING, true, FAST, Found::Nothing(None), far());
        assert_eq!(w.start(), (BEGINNING, true));
    }

    #[test]
    fn a_slow_claim_moves_the_start_until_a_rescan() {
        let w = window();
        w.settle(1, BEGINNING, true, SLOW, Found::Heads(5_000), far());
        w.release(1);
        assert_eq!(w.start(), (5_000, false));
        // Fast windowed claims keep it; a slow one moves it on.
        w.settle(2, 5_000, false, FAST, Found::Heads(9_000), far());
        w.release(2);
        assert_eq!(w.start(), (5_000, false));
        w.settle(0, 5_000, false, SLOW, Found::Nothing(Some(12_000)), far());
        assert_eq!(w.start(), (12_000, false));
        w.settle(3, 12_000, false, SLOW, Found::Heads(15_000), far());
        w.release(3);
        assert_eq!(w.start(), (15_000, false));
        // An operator's action: the next claim starts from the beginning, once.
        w.rescan_now();
        assert_eq!(w.start(), (BEGINNING, true));
        assert_eq!(w.start(), (15_000, false));
        // A retry due now: one walk from the beginning, and a full walk does not forget a
        // later one.
        w.rescan_at(Instant::now());
        w.rescan_at(Instant::now() + Duration::from_secs(3_600));
        assert_eq!(w.start(), (BEGINNING, true));
        w.settle(
            0,
            BEGINNING,
            true,
            SLOW,
            Found::Nothing(Some(12_000)),
            far(),
        );
        assert_eq!(w.start(), (12_000, false));
        assert_eq!(
            w.state().retries.len(),
            1,
            "the later retry is still awaited"
        );
        // A fast full walk: the front is free again.
        w.rescan_now();
        assert_eq!(w.start(), (BEGINNING, true));
        w.settle(4, BEGINNING, true, FAST, Found::Heads(7), far());
        w.release(4);
        assert_eq!(w.start(), (BEGINNING, true));
    }

    #[test]
    fn the_start_never_passes_a_claim_not_settled_yet() {
        let w = window();
        // Worker A holds an aggregate whose head is at 100; worker B's slow claim finds heads
        // from 5,000 on (A's rows were rejected as leased).
        w.settle(1, BEGINNING, true, FAST, Found::Heads(100), far());
        w.settle(2, BEGINNING, true, SLOW, Found::Heads(5_000), far());
        assert_eq!(w.start(), (100, false));
        w.release(1);
        w.release(2);
        w.settle(0, 100, false, SLOW, Found::Nothing(Some(9_000)), far());
        assert_eq!(w.start(), (9_000, false));
    }

    #[test]
    fn a_claim_whose_release_never_came_stops_holding_the_start_when_its_lease_ends() {
        let w = window();
        // A settle failed, so claim 1 is never released; its lease has ended.
        w.settle(1, BEGINNING, true, FAST, Found::Heads(100), Instant::now());
        w.settle(2, BEGINNING, true, SLOW, Found::Heads(5_000), far());
        w.release(2);
        assert_eq!(w.start(), (5_000, false));
    }

    #[test]
    fn walks_from_the_beginning_are_spaced_by_ten_times_their_cost_within_bounds() {
        let w = Window::new(Some(ClaimWindow::new(
            Duration::from_millis(100),
            Duration::ZERO,
            Duration::from_secs(3_600),
        )));
        w.settle(
            1,
            BEGINNING,
            true,
            Duration::from_secs(2),
            Found::Heads(10),
            far(),
        );
        w.release(1);
        assert_eq!(w.start(), (10, false), "the next walk is 20 s away");
        let capped = Window::new(Some(ClaimWindow::new(
            Duration::from_millis(100),
            Duration::ZERO,
            Duration::ZERO,
        )));
        capped.settle(
            1,
            BEGINNING,
            true,
            Duration::from_secs(2),
            Found::Heads(10),
            far(),
        );
        assert_eq!(
            capped.start(),
            (BEGINNING, true),
            "max_rescan caps the spacing"
        );
    }
}
