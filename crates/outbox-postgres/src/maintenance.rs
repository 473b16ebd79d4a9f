//! [`PgStore`] as the core's [`MaintenanceStore`]: the elected maintainer's session is a
//! connection taken out of the pool holding a session advisory lock, and the jobs delete in
//! small batches (inbox identities, settled work items, published rows kept by mark mode,
//! leases of crashed relays).
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use outbox_core::maintenance::{InboxRetention, MaintenanceConfig, Maintainer, ReplayHorizon};
//! use outbox_postgres::{PgStore, PgStoreConfig};
//!
//! let store = PgStore::new(pool, PgStoreConfig::default());
//! let config = MaintenanceConfig {
//!     inbox: Some(InboxRetention {
//!         keep: Duration::from_secs(7 * 86_400),
//!         horizon: ReplayHorizon {
//!             broker_retention: Duration::from_secs(3 * 86_400),
//!             outbox_retention: Duration::ZERO,
//!             dead_letter_requeue_window: Duration::from_secs(7 * 86_400),
//!         },
//!     }),
//!     ..MaintenanceConfig::default()
//! };
//! let maintainer = Maintainer::new(store, config)?; // refuses a keep inside the horizon
//! maintainer.run(tokio_util::sync::CancellationToken::new()).await;
//! # Ok(()) }
//! ```

use std::time::Duration;

use outbox_core::StoreError;
use outbox_core::maintenance::{MaintenanceStore, Purge};
use sqlx::PgConnection;

use crate::error::store_error;
use crate::permission::Component;
use crate::store::PgStore;

const ELECT: &str =
    "SELECT pg_try_advisory_lock(hashtextextended('outbox.inbox_maintainer.' || $1, 0))";

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl MaintenanceStore for PgStore {
    type Session = PgConnection;

    async fn maintenance_session(&self) -> Result<PgConnection, StoreError> {
        // Out of the pool for good: the advisory lock lives exactly as long as this connection.
        Ok(self
            .pool()
            .acquire()
            .await
            .map_err(|e| store_error("maintainer session", e))?
            .detach())
    }

    async fn maintainer_elect<'a>(
        &'a self,
        session: &'a mut PgConnection,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(ELECT)
            .bind(self.schema().as_str())
            .fetch_one(session)
            .await
            .map_err(self.err(Component::Maintainer, "maintainer election"))
    }

    async fn purge<'a>(
        &'a self,
        session: &'a mut PgConnection,
        what: Purge,
        older_than: Duration,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let sql = self.sql();
        let (statement, context) = match what {
            Purge::Inbox => (&sql.inbox_purge, "inbox retention"),
            Purge::WorkItems => (&sql.work_item_purge, "work-item retention"),
            Purge::Published => (&sql.published_purge, "published-row retention"),
            Purge::Leases => (&sql.lease_reap, "lease reaping"),
        };
        let failed = self.err(Component::Maintainer, context);
        if what == Purge::Published {
            // One statement deletes and raises the retention mark (the replay horizon), so it
            // answers its count as a row rather than as rows affected.
            let deleted: i64 = sqlx::query_scalar(self.q(statement))
                .bind(millis(older_than))
                .bind(limit)
                .fetch_one(session)
                .await
                .map_err(failed)?;
            return Ok(u64::try_from(deleted).unwrap_or(0));
        }
        Ok(sqlx::query(self.q(statement))
            .bind(millis(older_than))
            .bind(limit)
            .execute(session)
            .await
            .map_err(failed)?
            .rows_affected())
    }
}
