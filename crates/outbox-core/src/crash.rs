//! Named crash points: a process dies for real (abort, no unwinding, no cleanup) at a chosen
//! step, so that tests and the crash-matrix harness can kill a relay exactly between "the broker
//! acknowledged" and "the row was marked".
//!
//! Crash points exist only in builds with the cargo feature `crash-points` (off by default):
//! without it [`hit`] is an empty inline function and no environment variable is read, so a
//! production build of the library cannot be made to abort or stop by its environment. The
//! `outbox` binary's test tools (feature `harness`) and the toolkit's own tests enable it.
//!
//! A point is activated by the environment variable [`CRASH_POINT_ENV`] holding its name. The
//! variables are read once; when no point is set a crash point costs one relaxed atomic load.
//!
//! * [`CRASH_SKIP_ENV`] (`OUTBOX_CRASH_SKIP=n`): let the point pass `n` times and act on the
//!   `n+1`-th hit, so a crash lands in the middle of a workload rather than on its first event.
//! * [`CRASH_KEY_ENV`] (`OUTBOX_CRASH_KEY=<event id>`): act only where the point is hit for
//!   this key (points hit with [`hit_keyed`]; `relay.before_publish` is keyed by event id), so
//!   one chosen row kills every relay that tries to publish it (a poison row).
//! * [`CRASH_ACTION_ENV`] (`OUTBOX_CRASH_ACTION`): `abort` (default) ends the process with
//!   SIGABRT; `stop` raises SIGSTOP on the thread that hit the point, freezing the process
//!   with that thread exactly there (a long GC or VM pause) until someone sends SIGCONT. The crash matrix uses `stop` to let a relay's lease
//!   expire between the broker's ack and its mark.
//!
//! Points defined so far:
//!
//! | name                          | where                                                    |
//! |-------------------------------|----------------------------------------------------------|
//! | `producer.before_commit`      | demo producer: business row + intent written, no commit  |
//! | `producer.after_commit`       | demo producer: committed, before reporting success       |
//! | `relay.before_publish`        | relay: about to send a message (keyed by its event id)   |
//! | `relay.after_publish`         | relay: broker acknowledged a message, before the mark    |
//! | `relay.after_mark`            | relay: batch marked sent, before the next claim          |
//! | `consumer.after_inbox`        | consumer: inbox row written, handler not run (no commit) |
//! | `consumer.after_effect`       | consumer: effect written, not committed                  |
//! | `consumer.after_commit`       | consumer: committed, not acknowledged                    |
//! | `effects.after_call`          | effects executor: provider answered, result not recorded |
//! | `effects.after_record`        | effects executor: the provider's answer is recorded      |
//!
//! The consumer points sit in the consumer engine ([`crate::consumer`]), the effects points in
//! the work-item executor ([`crate::effect`]), the producer points in the `outbox demo-producer`
//! workload (a library never commits the caller's transaction, so the points sit in the caller's
//! code, where a user's service would crash).

#[cfg(feature = "crash-points")]
use std::sync::OnceLock;
#[cfg(feature = "crash-points")]
use std::sync::atomic::{AtomicU64, Ordering};

/// Whether this build has crash points (the cargo feature `crash-points`).
pub const ENABLED: bool = cfg!(feature = "crash-points");

/// The environment variable naming the crash point to activate.
pub const CRASH_POINT_ENV: &str = "OUTBOX_CRASH_POINT";

/// Relay: about to send a message to the broker; keyed by the event id ([`hit_keyed`]).
pub const RELAY_BEFORE_PUBLISH: &str = "relay.before_publish";
/// Relay: the broker acknowledged a message and the relay has not marked it yet.
pub const RELAY_AFTER_PUBLISH: &str = "relay.after_publish";
/// Relay: a batch was marked sent.
pub const RELAY_AFTER_MARK: &str = "relay.after_mark";

/// The environment variable holding how many hits of the point to let pass first.
pub const CRASH_SKIP_ENV: &str = "OUTBOX_CRASH_SKIP";
/// The environment variable restricting the point to hits with this key (an event id).
pub const CRASH_KEY_ENV: &str = "OUTBOX_CRASH_KEY";
/// The environment variable choosing what happens at the point: `abort` or `stop`.
pub const CRASH_ACTION_ENV: &str = "OUTBOX_CRASH_ACTION";

/// Demo producer: the business row and the intent are written, the commit has not been sent.
pub const PRODUCER_BEFORE_COMMIT: &str = "producer.before_commit";
/// Demo producer: the transaction committed.
pub const PRODUCER_AFTER_COMMIT: &str = "producer.after_commit";

/// Consumer: the inbox row was written, the handler has not run.
pub const CONSUMER_AFTER_INBOX: &str = "consumer.after_inbox";
/// Consumer: the handler's effect was written, not committed.
pub const CONSUMER_AFTER_EFFECT: &str = "consumer.after_effect";
/// Consumer: committed, not acknowledged.
pub const CONSUMER_AFTER_COMMIT: &str = "consumer.after_commit";

/// Effects executor: the provider answered a call and the answer is not recorded.
pub const EFFECTS_AFTER_CALL: &str = "effects.after_call";
/// Effects executor: the answer of a call is recorded.
pub const EFFECTS_AFTER_RECORD: &str = "effects.after_record";

#[cfg(feature = "crash-points")]
#[derive(Debug)]
struct Active {
    name: String,
    key: Option<String>,
    skip: u64,
    stop: bool,
    hits: AtomicU64,
}

#[cfg(feature = "crash-points")]
static ACTIVE: OnceLock<Option<Active>> = OnceLock::new();

#[cfg(feature = "crash-points")]
fn active() -> Option<&'static Active> {
    ACTIVE
        .get_or_init(|| {
            let name = std::env::var(CRASH_POINT_ENV)
                .ok()
                .filter(|s| !s.is_empty())?;
            let skip = std::env::var(CRASH_SKIP_ENV)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            let stop = std::env::var(CRASH_ACTION_ENV).is_ok_and(|a| a.trim() == "stop");
            let key = std::env::var(CRASH_KEY_ENV)
                .ok()
                .map(|k| k.trim().to_owned())
                .filter(|k| !k.is_empty());
            Some(Active {
                name,
                key,
                skip,
                stop,
                hits: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// Does nothing: this build has no crash points (cargo feature `crash-points` off).
#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn hit(_name: &str) {}

/// Does nothing: this build has no crash points (cargo feature `crash-points` off).
#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn hit_keyed(_name: &str, _key: &dyn std::fmt::Display) {}

/// Acts on the process if `name` is the activated crash point and its skip count is used up:
/// aborts it (default) or stops it with SIGSTOP. Does nothing otherwise, and nothing when
/// [`CRASH_KEY_ENV`] is set (that point only acts through [`hit_keyed`]).
#[cfg(feature = "crash-points")]
pub fn hit(name: &str) {
    let Some(a) = active() else { return };
    if a.name != name || a.key.is_some() {
        return;
    }
    act(a, name);
}

/// [`hit`] for a point hit per item: when [`CRASH_KEY_ENV`] is set, only hits whose `key`
/// (an event id) equals it count.
#[cfg(feature = "crash-points")]
pub fn hit_keyed(name: &str, key: &dyn std::fmt::Display) {
    let Some(a) = active() else { return };
    if a.name != name {
        return;
    }
    if let Some(k) = &a.key
        && *k != key.to_string()
    {
        return;
    }
    act(a, name);
}

#[cfg(feature = "crash-points")]
fn act(a: &Active, name: &str) {
    let n = a.hits.fetch_add(1, Ordering::Relaxed);
    if n < a.skip {
        return;
    }
    if a.stop {
        if n == a.skip {
            eprintln!(
                "outbox: crash point {name} reached (hit {}), stopping",
                n + 1
            );
            // SIGSTOP cannot be caught: the process freezes right here until SIGCONT. Raised
            // on this thread (tgkill), so this thread takes the signal before it returns to
            // user code. A stop sent to the whole process (once by a spawned `kill`) is taken
            // by whichever thread the kernel picks; on a loaded machine this thread could get
            // the CPU first and run on (the lease cell's relay then settled its batch before
            // freezing, and nothing was left to refuse).
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
        }
        return;
    }
    eprintln!(
        "outbox: crash point {name} reached (hit {}), aborting",
        n + 1
    );
    std::process::abort();
}
