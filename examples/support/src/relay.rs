//! The toolkit's polling relay as the examples run it.
//!
//! The shape of `outbox relay` (crates/outbox-cli/src/commands.rs) with the facade crate only:
//! a `PgStore` on the outbox schema, the broker picked by URL from `outbox::brokers()`, and
//! `outbox::relay::Relay` until shutdown, its leases tied to its database session. Any number
//! of relays may run; a killed one loses nothing (its leases are taken over as soon as its
//! session ends, and the rows are published again, with the same event ids).

use std::sync::Arc;

use anyhow::{Context, Result};
use outbox::postgres::session::{PgSession, SessionConfig};
use outbox::postgres::{PgStore, PgStoreConfig};
use outbox::relay::{Relay, RelayConfig};
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
        pool.clone(),
        PgStoreConfig {
            schema: crate::database::schema(),
            ..Default::default()
        },
    );
    store.check().await.context("cannot start the relay")?;
    let session = PgSession::start(
        &pool.connect_options(),
        crate::database::schema(),
        SessionConfig::default(),
    )
    .await
    .context("cannot start the relay's database session")?;
    let store = store.with_session(session.clone());
    let brokers = outbox::brokers();
    let transport = brokers
        .connect_transport(broker_url, &topology.transport_settings())
        .await
        .context("cannot connect the relay's transport")?;
    let config = RelayConfig {
        lease: topology.relay_lease(),
        publish_timeout: topology.publish_timeout(),
        poll_interval: std::time::Duration::from_millis(100),
        ..RelayConfig::default()
    };
    let relay = Arc::new(Relay::new(Arc::new(store), Arc::new(transport), config)?);
    info!(
        broker = %outbox::secrets::redact_url(broker_url),
        stream_or_exchange = %topology.prefix(),
        "relay started"
    );
    crate::child::announce_ready();
    relay.run(shutdown).await;
    session.close().await;
    info!("relay stopped");
    Ok(())
}
