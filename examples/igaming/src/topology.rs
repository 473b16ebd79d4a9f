//! The names of the story's events and consumers, and the deployment's broker objects and
//! timings ([`Topology`], shared with the other examples).
//!
//! One name per deployment (`igaming run` uses one per run): NATS stream `IGAMING_<NAME>`
//! capturing `igaming_<name>.>`, subjects `igaming_<name>.bet.<event type>`; RabbitMQ exchange
//! `igaming_<name>` with the queues `igaming_<name>.history` and `igaming_<name>.payouts`.

use std::time::Duration;

use anyhow::Result;
pub use support::topology::Topology;

/// The aggregate type of every event of the service.
pub const AGGREGATE: &str = "bet";
/// Event type of an accepted bet (version 1).
pub const BET_ACCEPTED: &str = "BetAccepted";
/// Event type of a settled bet, won or lost (version 2).
pub const BET_SETTLED: &str = "BetSettled";
/// The player-history projection's consumer name (its inbox key is `(name, event_id)`).
pub const HISTORY_CONSUMER: &str = "history";
/// The payout consumer's name.
pub const PAYOUTS_CONSUMER: &str = "payouts";
/// The NATS duplicate window of a fast deployment: short, so that the run's re-sent event gets
/// past the broker's dedup to the consumers' inboxes, as one sent later would.
pub const FAST_DUPLICATE_WINDOW: Duration = Duration::from_secs(2);

/// The topology of the deployment `name`.
///
/// # Errors
/// A name that cannot be part of a subject, stream or exchange name.
pub fn topology(name: &str, fast: bool) -> Result<Topology> {
    let t = Topology::new("igaming", AGGREGATE, name, fast)?;
    Ok(if fast {
        t.with_duplicate_window(FAST_DUPLICATE_WINDOW)
    } else {
        t
    })
}
