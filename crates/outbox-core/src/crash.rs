//! Named crash points: a process dies for real (abort, no unwinding, no cleanup) at a chosen
//! step, so that tests and the crash-matrix harness can kill a relay exactly between "the broker
//! acknowledged" and "the row was marked".
//!
//! A point is activated by the environment variable [`CRASH_POINT_ENV`] holding its name. The
//! variable is read once; when it is unset a crash point costs one relaxed atomic load.
//!
//! Points defined so far:
//!
//! | name                          | where                                                    |
//! |-------------------------------|----------------------------------------------------------|
//! | `relay.after_publish`         | relay: broker acknowledged a message, before the mark    |
//! | `relay.after_mark`            | relay: batch marked sent, before the next claim          |
//! | `consumer.after_inbox`        | consumer: inbox row written, handler not run (no commit) |
//! | `consumer.after_effect`       | consumer: effect written, not committed                  |
//! | `consumer.after_commit`       | consumer: committed, not acknowledged                    |
//!
//! The consumer points are defined with the inbox runner (`outbox_postgres::consumer`).

use std::sync::OnceLock;

/// The environment variable naming the crash point to activate.
pub const CRASH_POINT_ENV: &str = "OUTBOX_CRASH_POINT";

/// Relay: the broker acknowledged a message and the relay has not marked it yet.
pub const RELAY_AFTER_PUBLISH: &str = "relay.after_publish";
/// Relay: a batch was marked sent.
pub const RELAY_AFTER_MARK: &str = "relay.after_mark";

static ACTIVE: OnceLock<Option<String>> = OnceLock::new();

fn active() -> Option<&'static str> {
    ACTIVE
        .get_or_init(|| {
            std::env::var(CRASH_POINT_ENV)
                .ok()
                .filter(|s| !s.is_empty())
        })
        .as_deref()
}

/// Aborts the process if `name` is the activated crash point. Does nothing otherwise.
pub fn hit(name: &str) {
    if active() == Some(name) {
        eprintln!("outbox: crash point {name} reached, aborting");
        std::process::abort();
    }
}
