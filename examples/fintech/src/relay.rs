//! `fintech relay`: the toolkit's polling relay on the payments database.
//!
//! The shape of `outbox relay` with the facade crate only (`support::relay`): a `PgStore` on the
//! outbox schema, the broker picked by URL from `outbox::brokers()`, and
//! `outbox::relay::Relay` until SIGTERM. Any number of relays may run; a killed one loses
//! nothing (its leases expire and the rows are published again, with the same event ids).

use anyhow::Result;
use tokio_util::sync::CancellationToken;

use crate::Common;

/// Runs the relay until `shutdown`.
///
/// # Errors
/// The database or the broker is unreachable, or the database is not migrated.
pub async fn run(common: &Common, shutdown: CancellationToken) -> Result<()> {
    let topology = common.topology()?;
    support::relay::run(
        &common.payments_url,
        &common.broker_url,
        &topology,
        shutdown,
    )
    .await
}
