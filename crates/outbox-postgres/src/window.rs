//! Where the polling relay's claim starts reading the pending rows.
//!
//! A claim reads the pending rows in id order and stops once it has enough heads. Rows that
//! cannot be claimed now (a paused route's, those waiting behind a dead letter, those in
//! backoff, those another relay holds) are read and rejected by every claim, about 2 µs each:
//! a front of a million such rows makes each claim take seconds (BENCHMARKS.md, "A paused
//! route's cost"), and an idle relay keeps the database busy with it.
//!
//! So a claim that was slow ([`ClaimWindow::slow_claim`]) tells the next ones where to start:
//! at its first head (the rows before it were all rejected), or, when it found none, after the
//! table's last row. Every [`ClaimWindow::min_rescan`] at least (and ten times as long as the
//! last full walk took, so that full walks cost at most a tenth of the time), a claim starts
//! from the beginning again and takes what became claimable there meanwhile. So does the next
//! claim after an operator's requeue, replay or resume (their wake-up carries `rescan`), and
//! after a retry of this relay comes due.
//!
//! What this trades: while the front of the table is blocked, a row below the start that
//! becomes claimable (a producer transaction that committed after rows with higher ids were
//! claimed, a lease of a crashed relay that expired, a retry of another relay) waits for the
//! next full walk. Nothing is lost or reordered (a head still needs every earlier version of
//! its aggregate published, wherever it lies), and when claims are fast the start stays at
//! the beginning: a relay whose table is not blocked behaves as if there were no window.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Settings of the claim's start ([`crate::PgStore::with_claim_window`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimWindow {
    /// A claim that took at least this long moves the next claims' start past the rows it
    /// rejected. Default 100 ms (a claim of 1,000 rows takes 5–20 ms on an unblocked table).
    pub slow_claim: Duration,
    /// A claim starts from the beginning at least this often while the start is moved.
    /// Default 1 s.
    pub min_rescan: Duration,
}

impl Default for ClaimWindow {
    fn default() -> Self {
        Self {
            slow_claim: Duration::from_millis(100),
            min_rescan: Duration::from_secs(1),
        }
    }
}

/// What a claim found, for [`Window::settle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Heads, the lowest of them at this id.
    Heads(i64),
    /// No head; the table's next id is this one (read only after a slow claim).
    Nothing(Option<i64>),
}

/// The start of a claim from the table's beginning (ids are positive, but a row may have
/// been written with any id).
pub(crate) const BEGINNING: i64 = i64::MIN;

/// The start of the next claim, shared by a store's clones.
#[derive(Debug)]
pub(crate) struct Window {
    config: ClaimWindow,
    state: Mutex<State>,
    rescan: AtomicBool,
}

#[derive(Debug)]
struct State {
    /// The id the next windowed claim starts at; [`BEGINNING`] when claims start from the
    /// beginning.
    from: i64,
    /// When the next claim starts from the beginning.
    rescan_at: Instant,
}

impl Window {
    pub(crate) fn new(config: ClaimWindow) -> Self {
        Self {
            config,
            state: Mutex::new(State {
                from: BEGINNING,
                rescan_at: Instant::now(),
            }),
            rescan: AtomicBool::new(false),
        }
    }

    /// Where the next claim starts, and whether that is the beginning.
    pub(crate) fn start(&self) -> (i64, bool) {
        let asked = self.rescan.swap(false, Ordering::Relaxed);
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.from == BEGINNING || asked || Instant::now() >= st.rescan_at {
            (BEGINNING, true)
        } else {
            (st.from, false)
        }
    }

    /// Whether a claim that took `elapsed` was slow.
    pub(crate) fn slow(&self, elapsed: Duration) -> bool {
        elapsed >= self.config.slow_claim
    }

    /// Records what a claim that started at `start` found, in `elapsed`.
    pub(crate) fn settle(&self, start: i64, full: bool, elapsed: Duration, found: Found) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if full {
            st.rescan_at = now + self.config.min_rescan.max(elapsed * 10);
        }
        st.from = match found {
            Found::Heads(first) if self.slow(elapsed) => first.max(start),
            Found::Nothing(Some(next)) if self.slow(elapsed) => next.max(start),
            // Fast: from the beginning stays there; a windowed start is kept.
            _ if full => BEGINNING,
            _ => start,
        };
    }

    /// The next claim starts from the beginning (an operator made rows claimable).
    pub(crate) fn rescan_now(&self) {
        self.rescan.store(true, Ordering::Relaxed);
    }

    /// A claim starts from the beginning by `at` at the latest (a retry comes due then).
    pub(crate) fn rescan_by(&self, at: Instant) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if at < st.rescan_at {
            st.rescan_at = at;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> Window {
        Window::new(ClaimWindow {
            slow_claim: Duration::from_millis(100),
            min_rescan: Duration::from_secs(60),
        })
    }

    const FAST: Duration = Duration::from_millis(5);
    const SLOW: Duration = Duration::from_millis(500);

    #[test]
    fn fast_claims_always_start_from_the_beginning() {
        let w = window();
        assert_eq!(w.start(), (BEGINNING, true));
        w.settle(BEGINNING, true, FAST, Found::Heads(1_000));
        assert_eq!(w.start(), (BEGINNING, true));
        w.settle(BEGINNING, true, FAST, Found::Nothing(None));
        assert_eq!(w.start(), (BEGINNING, true));
    }

    #[test]
    fn a_slow_claim_moves_the_start_until_a_rescan() {
        let w = window();
        w.settle(BEGINNING, true, SLOW, Found::Heads(5_000));
        assert_eq!(w.start(), (5_000, false));
        // Fast windowed claims keep it; a slow one moves it on, never back.
        w.settle(5_000, false, FAST, Found::Heads(9_000));
        assert_eq!(w.start(), (5_000, false));
        w.settle(5_000, false, SLOW, Found::Nothing(Some(12_000)));
        assert_eq!(w.start(), (12_000, false));
        w.settle(12_000, false, SLOW, Found::Heads(3));
        assert_eq!(w.start(), (12_000, false));
        // An operator's action: the next claim starts from the beginning, once.
        w.rescan_now();
        assert_eq!(w.start(), (BEGINNING, true));
        assert_eq!(w.start(), (12_000, false));
        // A retry due now: from the beginning until a full walk settles.
        w.rescan_by(Instant::now());
        assert_eq!(w.start(), (BEGINNING, true));
        // A fast full walk: the front is free again.
        w.settle(BEGINNING, true, FAST, Found::Heads(7));
        assert_eq!(w.start(), (BEGINNING, true));
    }

    #[test]
    fn full_walks_are_spaced_by_ten_times_their_cost() {
        let w = Window::new(ClaimWindow {
            slow_claim: Duration::from_millis(100),
            min_rescan: Duration::ZERO,
        });
        w.settle(BEGINNING, true, Duration::from_secs(2), Found::Heads(10));
        assert_eq!(w.start(), (10, false), "the next full walk is 20 s away");
    }
}
