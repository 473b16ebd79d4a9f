//! Why an engine is stuck: its last error, how many it has had, and when it last made progress.
//!
//! A growing backlog alone does not say why. Each engine (the relay, a consumer) keeps one
//! [`Health`] and records into it what went wrong and what went through; its heartbeat writes
//! the [`HealthReport`] beside the process (`outbox status`, the console's processes), and its
//! metrics carry the same facts for alerts: a counter of errors by [`TroubleKind`] and a gauge of
//! the last progress as a unix timestamp, so that "work waiting and no progress for N seconds"
//! is one rule (`ops/prometheus/outbox-rules.yml`).
//!
//! # What counts
//!
//! * **Progress** is work settled for good: for the relay a row published or dead-lettered,
//!   for a consumer a delivery applied, absorbed (a duplicate, a stale version, a recorded
//!   conflict) or dead-lettered, or a requeued dead letter settled.
//! * **An error** is anything that went wrong, with its kind ([`TroubleKind`]), its text (the
//!   store's, the transport's, the source's or the handler's own words, control characters
//!   escaped, at most [`MAX_REASON_CHARS`](crate::consumer::MAX_REASON_CHARS) characters) and
//!   its time. A dead letter is both: an error (it needs an operator) and progress (the event
//!   left the queue).
//!
//! # States
//!
//! [`HealthReport::state`] is one of, first match wins:
//!
//! | state | when |
//! |---|---|
//! | `failing` | its last error is still open: nothing went through since, and the operation that failed has not succeeded since (a claim, a settle, a read from the broker). A dead letter never opens one. |
//! | `degraded` | errors within the last minute, but work goes through (some aggregates or messages fail, others flow) |
//! | `working` | progress within the last minute, no error |
//! | `idle` | neither: nothing to do (or only rows waiting out a backoff, or a paused route) |
//!
//! So a relay whose broker is down reads `failing` (every publish fails, nothing is
//! published), and so does one whose role lost a grant (its settles fail); a relay with
//! nothing pending reads `idle`, never `failing`, however long ago its last progress was.
//! A store blip reads `failing` until the next claim succeeds, then `degraded` for a minute.
//!
//! # Cost
//!
//! Recording progress is two relaxed atomic stores (and a gauge update at most once a second);
//! the engines record it once per batch. Errors take a mutex and build their text; the engines
//! record them once per failed operation or once per batch (a batch's failed publishes are one
//! record with their count), never per acknowledged event.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The sliding window of [`HealthReport::errors_per_minute`] and of the `degraded` and
/// `working` states: the last minute, counted in [`STEP`]s.
pub const WINDOW: Duration = Duration::from_secs(60);

/// The window's resolution: an error leaves the window between 55 and 60 s after it happened.
pub const STEP: Duration = Duration::from_secs(5);

const STEPS: usize = (WINDOW.as_secs() / STEP.as_secs()) as usize;
const STEP_MS: u64 = STEP.as_millis() as u64;

/// What went wrong, by the part of the engine it happened in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TroubleKind {
    /// Relay: taking a batch from the feed failed (a polling claim, the CDC stream). Open until
    /// a claim succeeds.
    Claim,
    /// Relay: a publish failed and the row will be retried (the transport's error: the broker
    /// is unreachable, timed out, refused). Open until a row is published or dead-lettered.
    Publish,
    /// Relay: recording a batch's outcome failed (a mark, a failure record, a release; a
    /// missing grant shows here). Open until a settle succeeds.
    Settle,
    /// Relay: a settle was refused because the batch's lease had expired and another relay
    /// took the rows over (they are published again by it). Open until progress.
    LeaseLost,
    /// Relay and consumer: an event or a delivery was dead-lettered, with its reason. It is
    /// progress too, so it never makes the state `failing`.
    DeadLetter,
    /// Consumer: its delivery source (the broker) failed. Open until a read succeeds.
    Source,
    /// Consumer: the database failed (an outage, or a delivery's own transaction). Open until
    /// progress.
    Store,
    /// Consumer: a handler call failed (transient or permanent). Open until progress.
    Handler,
}

impl TroubleKind {
    #[cfg(test)]
    const ALL: [Self; 8] = [
        Self::Claim,
        Self::Publish,
        Self::Settle,
        Self::LeaseLost,
        Self::DeadLetter,
        Self::Source,
        Self::Store,
        Self::Handler,
    ];

    /// The name used in the heartbeat's JSON and as the metrics' `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Publish => "publish",
            Self::Settle => "settle",
            Self::LeaseLost => "lease_lost",
            Self::DeadLetter => "dead_letter",
            Self::Source => "source",
            Self::Store => "store",
            Self::Handler => "handler",
        }
    }

    /// A code for the open-error atomic: never 0 (0 is none).
    fn code(self) -> u8 {
        self as u8 + 1
    }
}

impl std::fmt::Display for TroubleKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An engine's state, as [`Health::report`] reads it (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HealthState {
    /// Progress within the last minute, no error.
    Working,
    /// No progress and no error within the last minute.
    Idle,
    /// Errors within the last minute, and work goes through.
    Degraded,
    /// The last error is open: nothing went through since, and what failed has not succeeded
    /// since.
    Failing,
}

impl HealthState {
    /// `working`, `idle`, `degraded` or `failing`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "working",
            Self::Idle => "idle",
            Self::Degraded => "degraded",
            Self::Failing => "failing",
        }
    }
}

impl std::fmt::Display for HealthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The last error an engine recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastError {
    /// Where it happened.
    pub kind: TroubleKind,
    /// What the store, transport, source or handler said (printable, bounded).
    pub message: String,
    /// When, by the engine's clock.
    pub at: DateTime<Utc>,
    /// How long ago, seconds, when the report was made (a reader adds the report's own age:
    /// [`HealthReport::aged`]).
    pub age_seconds: f64,
}

/// What a [`Health`] says at one moment: what a heartbeat writes down as the process's
/// `health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthReport {
    /// The state (see the [module docs](self)).
    pub state: HealthState,
    /// When the engine began counting (its start).
    pub since: DateTime<Utc>,
    /// Its last progress; `None` when none since it started.
    pub last_progress_at: Option<DateTime<Utc>>,
    /// How long ago that was, seconds, when the report was made; `None` without progress.
    pub last_progress_age_seconds: Option<f64>,
    /// Its last error; `None` when none since it started.
    pub last_error: Option<LastError>,
    /// Errors since it started.
    pub errors: u64,
    /// Errors within the last minute ([`WINDOW`]).
    pub errors_per_minute: u64,
}

impl HealthReport {
    /// The report as read `seconds` after it was made (a heartbeat read from the database
    /// later): its ages grow by that much. The state stays the one of the report's moment.
    #[must_use]
    pub fn aged(mut self, seconds: f64) -> Self {
        let seconds = seconds.max(0.0);
        if let Some(age) = self.last_progress_age_seconds.as_mut() {
            *age += seconds;
        }
        if let Some(e) = self.last_error.as_mut() {
            e.age_seconds += seconds;
        }
        self
    }
}

/// The metrics a [`Health`] updates.
#[derive(Debug)]
struct Exported {
    errors: &'static str,
    last_progress: &'static str,
    labels: Vec<(&'static str, String)>,
}

#[derive(Debug)]
struct Recorded {
    kind: TroubleKind,
    message: String,
    at_ms: u64,
}

/// Errors per [`STEP`] over the last [`WINDOW`]: slot `i` holds the step `steps[i]`.
#[derive(Debug, Default)]
struct Window {
    counts: [u64; STEPS],
    steps: [u64; STEPS],
}

impl Window {
    fn add(&mut self, step: u64, n: u64) {
        let i = (step % STEPS as u64) as usize;
        if self.steps[i] != step {
            self.steps[i] = step;
            self.counts[i] = 0;
        }
        self.counts[i] += n;
    }

    fn sum(&self, step: u64) -> u64 {
        self.counts
            .iter()
            .zip(&self.steps)
            .filter(|(_, s)| step.saturating_sub(**s) < STEPS as u64)
            .map(|(c, _)| c)
            .sum()
    }
}

#[derive(Debug, Default)]
struct Inner {
    last: Option<Recorded>,
    errors: u64,
    window: Window,
}

/// One engine's record of its errors and its progress (see the [module docs](self)). Shared
/// between the engine, which records, and its reporters (a heartbeat), which read
/// [`Health::report`].
#[derive(Debug)]
pub struct Health {
    base: Instant,
    base_wall: DateTime<Utc>,
    /// Milliseconds from `base` to the last progress, plus one; 0 before any.
    progress: AtomicU64,
    /// The whole second of the last progress the gauge was set to.
    gauge_second: AtomicU64,
    /// [`TroubleKind::code`] of the open error; 0 when none is.
    open: AtomicU8,
    /// Whether an operation succeeded since the record started (progress counts too: see
    /// [`Health::has_worked`]).
    worked: AtomicBool,
    inner: Mutex<Inner>,
    exported: Option<Exported>,
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

impl Health {
    /// A record starting now, exporting no metrics.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            base_wall: Utc::now(),
            progress: AtomicU64::new(0),
            gauge_second: AtomicU64::new(u64::MAX),
            open: AtomicU8::new(0),
            worked: AtomicBool::new(false),
            inner: Mutex::default(),
            exported: None,
        }
    }

    /// A record starting now that counts errors in the counter `errors` (label `kind`, plus
    /// `labels`) and sets the gauge `last_progress` to the unix time of the last progress, in
    /// seconds.
    pub fn with_metrics(
        errors: &'static str,
        last_progress: &'static str,
        labels: Vec<(&'static str, String)>,
    ) -> Self {
        Self {
            exported: Some(Exported {
                errors,
                last_progress,
                labels,
            }),
            ..Self::new()
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    fn wall(&self, ms: u64) -> DateTime<Utc> {
        self.base_wall + chrono::Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX))
    }

    /// Exports the progress gauge now: the last progress, or, before any, the moment this
    /// record began, so that "no progress for N seconds" counts from the engine's start. The
    /// engines call it when they start running.
    pub fn export(&self) {
        let ms = self.progress.load(Ordering::Relaxed).saturating_sub(1);
        self.set_gauge(ms);
    }

    fn set_gauge(&self, ms: u64) {
        if let Some(m) = &self.exported {
            let at = self.wall(ms);
            metrics::gauge!(m.last_progress, &m.labels[..]).set(at.timestamp_millis() as f64 / 1e3);
        }
    }

    /// Records progress now (work settled for good). Closes any open error.
    pub fn progressed(&self) {
        let ms = self.elapsed_ms();
        self.progress.store(ms + 1, Ordering::Relaxed);
        if self.open.load(Ordering::Relaxed) != 0 {
            self.open.store(0, Ordering::Relaxed);
        }
        let second = ms / 1000;
        if self.exported.is_some() && self.gauge_second.swap(second, Ordering::Relaxed) != second {
            self.set_gauge(ms);
        }
    }

    /// Records `count` errors of `kind` (one failed operation, or a batch's failed rows),
    /// `error` being the last one's (or a representative one's) text. It becomes the last
    /// error, and open (the state is `failing`) unless it is a dead letter. Nothing for
    /// `count == 0`.
    pub fn failed(&self, kind: TroubleKind, count: u64, error: &dyn std::fmt::Display) {
        if count == 0 {
            return;
        }
        let ms = self.elapsed_ms();
        let message = crate::consumer::printable(&error.to_string());
        {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.errors = inner.errors.saturating_add(count);
            inner.window.add(ms / STEP_MS, count);
            inner.last = Some(Recorded {
                kind,
                message,
                at_ms: ms,
            });
        }
        if kind != TroubleKind::DeadLetter {
            self.open.store(kind.code(), Ordering::Relaxed);
        }
        if let Some(m) = &self.exported {
            let mut labels = m.labels.clone();
            labels.push(("kind", kind.as_str().to_owned()));
            metrics::counter!(m.errors, &labels[..]).increment(count);
        }
    }

    /// Records that an operation of `kind` succeeded: an open error of that kind is closed
    /// (a claim after a failed claim, a read from the broker after a failed one). One relaxed
    /// load when none is open.
    pub fn succeeded(&self, kind: TroubleKind) {
        self.mark_worked();
        let code = kind.code();
        if self.open.load(Ordering::Relaxed) == code {
            let _ = self
                .open
                .compare_exchange(code, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Whether an operation succeeded ([`succeeded`](Self::succeeded)) or work went through
    /// ([`progressed`](Self::progressed)) since the record started: a relay's first claim, a
    /// consumer's first read from its broker.
    pub fn has_worked(&self) -> bool {
        self.worked.load(Ordering::Relaxed) || self.progress.load(Ordering::Relaxed) != 0
    }

    /// Sets `worked`, once: a relaxed load on every later call.
    fn mark_worked(&self) {
        if !self.worked.load(Ordering::Relaxed) {
            self.worked.store(true, Ordering::Relaxed);
        }
    }

    /// What the record says now.
    pub fn report(&self) -> HealthReport {
        let now = self.elapsed_ms();
        let age = |ms: u64| now.saturating_sub(ms) as f64 / 1e3;
        let progress = self.progress.load(Ordering::Relaxed).checked_sub(1);
        let open = self.open.load(Ordering::Relaxed) != 0;
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let errors_per_minute = inner.window.sum(now / STEP_MS);
        let recent = |ms: u64| now.saturating_sub(ms) < WINDOW.as_millis() as u64;
        let state = if open {
            HealthState::Failing
        } else if errors_per_minute > 0 {
            HealthState::Degraded
        } else if progress.is_some_and(recent) {
            HealthState::Working
        } else {
            HealthState::Idle
        };
        HealthReport {
            state,
            since: self.base_wall,
            last_progress_at: progress.map(|ms| self.wall(ms)),
            last_progress_age_seconds: progress.map(age),
            last_error: inner.last.as_ref().map(|e| LastError {
                kind: e.kind,
                message: e.message.clone(),
                at: self.wall(e.at_ms),
                age_seconds: age(e.at_ms),
            }),
            errors: inner.errors,
            errors_per_minute,
        }
    }
}

/// Whether an engine is ready, for a process's readiness probe (`GET /readyz` of `outbox
/// relay`, a systemd unit's start-up wait, a Kubernetes readiness probe).
///
/// A clonable handle: the process keeps one, the engine's runner marks it
/// [`started`](Self::started) once its start-up checks passed and the engine runs, and
/// [`stopped`](Self::stopped) when the engine returns. [`Readiness::check`] is then:
///
/// | state | ready |
/// |---|---|
/// | not started yet (start-up checks, connecting) | no: `starting` |
/// | running, nothing succeeded yet ([`Health::has_worked`]: a relay before its first claim, a CDC relay before its replication stream answered) | no |
/// | running, has worked, its [`HealthReport::state`] `working`, `idle` or `degraded` | yes |
/// | running, `failing` (its last error is open: the broker or the store is down, a grant is missing) | no |
/// | stopped | no: `stopped` |
///
/// Ready is not alive: a failing relay is not ready, yet restarting it would not help (it
/// recovers by itself when the broker or the database comes back), so a liveness probe should
/// only ask whether the process answers.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    inner: std::sync::Arc<Mutex<Phase>>,
}

#[derive(Debug, Default)]
enum Phase {
    #[default]
    Starting,
    Running(Option<std::sync::Arc<Health>>),
    Stopped,
}

/// What [`Readiness::check`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadinessReport {
    /// Whether the engine is ready (see [`Readiness`]).
    pub ready: bool,
    /// `starting`, `running` or `stopped`.
    pub phase: &'static str,
    /// The engine's health while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthReport>,
}

impl Readiness {
    /// A handle in the `starting` phase.
    pub fn new() -> Self {
        Self::default()
    }

    /// The engine runs from now on and records into `health`.
    pub fn started(&self, health: std::sync::Arc<Health>) {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Phase::Running(Some(health));
    }

    /// The engine runs from now on and keeps no [`Health`] record (the effects executor): it
    /// reads ready while it runs.
    pub fn running(&self) {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Phase::Running(None);
    }

    /// The engine returned: never ready again.
    pub fn stopped(&self) {
        *self.inner.lock().unwrap_or_else(|e| e.into_inner()) = Phase::Stopped;
    }

    /// The phase, and while running the engine's health, with the verdict.
    pub fn check(&self) -> ReadinessReport {
        match &*self.inner.lock().unwrap_or_else(|e| e.into_inner()) {
            Phase::Starting => ReadinessReport {
                ready: false,
                phase: "starting",
                health: None,
            },
            Phase::Running(health) => {
                let report = health.as_ref().map(|h| (h.has_worked(), h.report()));
                ReadinessReport {
                    ready: report
                        .as_ref()
                        .is_none_or(|(worked, r)| *worked && r.state != HealthState::Failing),
                    phase: "running",
                    health: report.map(|(_, r)| r),
                }
            }
            Phase::Stopped => ReadinessReport {
                ready: false,
                phase: "stopped",
                health: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_record_is_idle_and_progress_makes_it_working() {
        let h = Health::new();
        let r = h.report();
        assert_eq!(r.state, HealthState::Idle);
        assert_eq!(
            (r.last_progress_at, &r.last_error, r.errors),
            (None, &None, 0)
        );
        h.progressed();
        let r = h.report();
        assert_eq!(r.state, HealthState::Working);
        assert!(r.last_progress_age_seconds.is_some_and(|a| a < 5.0));
    }

    #[test]
    fn an_error_is_open_until_progress_or_the_same_operation_succeeds() {
        let h = Health::new();
        h.failed(
            TroubleKind::Publish,
            3,
            &"TimedOut: no acknowledgement within 10s",
        );
        let r = h.report();
        assert_eq!(r.state, HealthState::Failing);
        let e = r.last_error.expect("the last error");
        assert_eq!(e.kind, TroubleKind::Publish);
        assert_eq!(e.message, "TimedOut: no acknowledgement within 10s");
        assert_eq!((r.errors, r.errors_per_minute), (3, 3));
        // Another operation's success does not close it; progress does.
        h.succeeded(TroubleKind::Claim);
        assert_eq!(h.report().state, HealthState::Failing);
        h.progressed();
        assert_eq!(
            h.report().state,
            HealthState::Degraded,
            "errors this minute"
        );

        // A failed claim is closed by the next claim that succeeds, without progress.
        h.failed(TroubleKind::Claim, 1, &"Unavailable: connection refused");
        assert_eq!(h.report().state, HealthState::Failing);
        h.succeeded(TroubleKind::Settle);
        assert_eq!(h.report().state, HealthState::Failing);
        h.succeeded(TroubleKind::Claim);
        let r = h.report();
        assert_eq!(r.state, HealthState::Degraded);
        assert_eq!(r.errors, 4);
        assert_eq!(r.last_error.unwrap().kind, TroubleKind::Claim);
    }

    #[test]
    fn a_dead_letter_is_an_error_that_never_opens() {
        let h = Health::new();
        h.failed(TroubleKind::DeadLetter, 2, &"attempt 1: TooLarge: 2 MB");
        let r = h.report();
        assert_eq!(r.state, HealthState::Degraded);
        assert_eq!(r.errors, 2);
        h.failed(TroubleKind::DeadLetter, 0, &"nothing");
        assert_eq!(h.report().errors, 2, "a count of 0 records nothing");
    }

    #[test]
    fn messages_are_printable_and_bounded() {
        let h = Health::new();
        let long = format!("bad\0value {}", "x".repeat(5000));
        h.failed(TroubleKind::Handler, 1, &long);
        let e = h.report().last_error.unwrap();
        assert!(e.message.starts_with("bad\\u{0}value"), "{}", e.message);
        // 1,024 characters of the original (one escaped as five), then the cut.
        assert!(e.message.ends_with('…'), "{}", e.message);
        assert_eq!(
            e.message.chars().count(),
            crate::consumer::MAX_REASON_CHARS + 4 + 1
        );
    }

    #[test]
    fn the_window_forgets_errors_older_than_a_minute() {
        let mut w = Window::default();
        w.add(0, 2);
        w.add(5, 1);
        assert_eq!(w.sum(5), 3);
        assert_eq!(w.sum(STEPS as u64 - 1), 3);
        assert_eq!(w.sum(STEPS as u64), 1, "step 0 left the window");
        w.add(STEPS as u64 + 5, 4);
        assert_eq!(w.sum(STEPS as u64 + 5), 4, "step 5's slot was reused");
        assert_eq!(w.sum(100), 0);
    }

    #[test]
    fn a_report_read_later_is_older() {
        let h = Health::new();
        h.progressed();
        h.failed(TroubleKind::Source, 1, &"connection reset");
        let r = h.report().aged(30.0);
        assert!(r.last_progress_age_seconds.unwrap() >= 30.0);
        assert!(r.last_error.as_ref().unwrap().age_seconds >= 30.0);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["state"], "failing");
        assert_eq!(json["last_error"]["kind"], "source");
        let back: HealthReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn kinds_have_distinct_codes() {
        let codes: std::collections::HashSet<u8> =
            TroubleKind::ALL.iter().map(|k| k.code()).collect();
        assert_eq!(codes.len(), TroubleKind::ALL.len());
        assert!(!codes.contains(&0));
    }

    #[test]
    fn readiness_is_started_and_not_failing() {
        let readiness = Readiness::new();
        let probe = readiness.clone();
        assert_eq!(probe.check().phase, "starting");
        assert!(!probe.check().ready);

        let health = std::sync::Arc::new(Health::new());
        readiness.started(std::sync::Arc::clone(&health));
        let first = probe.check();
        assert_eq!(first.phase, "running");
        assert!(!first.ready, "not before its first claim: {first:?}");

        health.succeeded(TroubleKind::Claim);
        let idle = probe.check();
        assert!(idle.ready, "{idle:?}");
        assert_eq!(idle.health.map(|h| h.state), Some(HealthState::Idle));

        health.failed(TroubleKind::Publish, 1, &"broker unreachable");
        let failing = probe.check();
        assert!(!failing.ready, "{failing:?}");
        assert_eq!(failing.health.map(|h| h.state), Some(HealthState::Failing));

        health.progressed();
        assert!(probe.check().ready, "degraded is ready");

        readiness.stopped();
        assert_eq!(probe.check().phase, "stopped");
        assert!(!probe.check().ready);
    }
}
