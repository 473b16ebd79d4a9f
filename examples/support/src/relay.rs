//! The toolkit's polling relay as the examples run it.
//!
//! What `outbox relay` runs, with the facade crate only: `PgRelay` (the library's relay: its
//! start-up checks, leases tied to its database session, the heartbeat) over a `PgStore` on the
//! outbox schema, the broker picked by URL from `outbox::brokers()`, until shutdown. Any number
//! of relays may run; a killed one loses nothing (its leases are taken over as soon as its
//! session ends, and the rows are published again, with the same event ids).

use std::sync::Arc;

use anyhow::{Context, Result};
use outbox::postgres::relay::{PgRelay, RelayMode};
use outbox::postgres::{PgStore, PgStoreConfig};
use outbox::relay::RelayConfig;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::topology::Topology;

/// Runs the relay of the database `database_url` to `broker_url` until `shutdown`, announcing
/// readiness once connected.
///
/// # Errors
/// The database or the broker is unreachable, or the database is not migrated.
pub async fn run(
    database_url: &str,
    broker_url: &str,
    topology: &Topology,
    shutdown: CancellationToken,
) -> Result<()> {
    let pool = crate::database::connect(database_url, 8).await?;
    let store = PgStore::new(
        pool,
        PgStoreConfig {
            schema: crate::database::schema(),
            ..Default::default()
        },
    );
    let config = RelayConfig {
        lease: topology.relay_lease(),
        publish_timeout: topology.publish_timeout(),
        poll_interval: std::time::Duration::from_millis(100),
        ..RelayConfig::default()
    };
    let relay = PgRelay::new(store, config, RelayMode::Polling);
    relay.check().await?;
    let brokers = outbox::brokers();
    let transport = brokers
        .connect_transport(broker_url, &topology.transport_settings())
        .await
        .context("cannot connect the relay's transport")?;
    info!(
        broker = %outbox::secrets::redact_url(broker_url),
        stream_or_exchange = %topology.prefix(),
        "relay started"
    );
    crate::child::announce_ready();
    relay.run(Arc::new(transport), shutdown).await?;
    info!("relay stopped");
    Ok(())
}
