//! The feed suite (`outbox_testkit::feed`) on PostgreSQL's two feeds against the real server:
//! the polling feed over [`PgStore`] and the CDC feed over a logical replication slot. Both
//! are held to the rules the publish engine relies on; the memory store's polling feed runs the
//! same cases.

mod common;
#[path = "support/pg_fixture.rs"]
mod pg_fixture;

use std::sync::Arc;
use std::time::Duration;

use common::{TestDb, database_url};
use outbox_core::{NewMessage, OutboxStore as _};
use outbox_postgres::cdc::{CdcConfig, CdcFeed, create_slot, ensure_publication, remove};
use outbox_postgres::{OnPublish, PgStore};
use outbox_testkit::feed::FeedFixture;
use outbox_testkit::fixture::HeldProducer;
use pg_fixture::PgFixture;

/// A fresh schema and its store, under the CDC feed.
struct Outbox {
    db: TestDb,
    store: PgStore,
}

impl Outbox {
    async fn new() -> Self {
        let db = TestDb::new().await;
        let store = db.store();
        Self { db, store }
    }
}

/// The CDC feed over a slot of its own (created before anything is written, so the stream
/// holds every event), removed at the end.
struct Cdc {
    outbox: Outbox,
    feed: Arc<CdcFeed>,
    slot: String,
    publication: String,
    removed: std::sync::atomic::AtomicBool,
}

/// A failed case's slot is removed too (on a thread of its own: the case's runtime is
/// unwinding): a slot left behind would pin the server's WAL for good.
impl Drop for Cdc {
    fn drop(&mut self) {
        if self.removed.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let (slot, publication) = (self.slot.clone(), self.publication.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(pool) = sqlx::PgPool::connect(&database_url()).await {
                    let _ = remove(&pool, &slot, &publication, Duration::from_secs(10)).await;
                }
            });
        })
        .join();
    }
}

impl FeedFixture for Cdc {
    type Feed = CdcFeed;
    type Operator = PgStore;

    async fn new() -> Self {
        let outbox = Outbox::new().await;
        let (db, config) = (&outbox.db, CdcConfig::default());
        let slot = config.slot_name(&db.schema);
        let publication = config.publication_name(&db.schema);
        ensure_publication(&db.pool, &db.schema, &publication)
            .await
            .expect("publication");
        create_slot(&db.pool, &slot)
            .await
            .expect("slot (wal_level = logical: scripts/services sets it)");
        let feed = Arc::new(
            CdcFeed::new(
                &database_url(),
                db.pool.clone(),
                db.schema.clone(),
                config,
                OnPublish::Delete,
            )
            .with_catch_up_claims(100, Duration::from_secs(30)),
        );
        Self {
            outbox,
            feed,
            slot,
            publication,
            removed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn feed(&self) -> Arc<Self::Feed> {
        Arc::clone(&self.feed)
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) {
        self.outbox.db.enqueue(&messages).await;
    }

    async fn enqueue_held(&self, messages: Vec<NewMessage>) -> Box<dyn HeldProducer> {
        crate::common::enqueue_held(&self.outbox.db, &messages).await
    }

    async fn unpublished(&self) -> usize {
        let s = self.outbox.store.stats().await.expect("stats");
        usize::try_from(s.pending + s.dead).expect("counts")
    }

    fn operator(&self) -> PgStore {
        self.outbox.store.clone()
    }

    async fn cleanup(&self) {
        let _ = self.feed.shutdown().await;
        let db = &self.outbox.db;
        remove(
            &db.pool,
            &self.slot,
            &self.publication,
            Duration::from_secs(10),
        )
        .await
        .expect("remove the slot and the publication");
        self.removed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        common::exec(&db.pool, format!("DROP SCHEMA \"{}\" CASCADE", db.schema)).await;
    }
}

mod polling {
    outbox_testkit::feed_suite!(outbox_testkit::feed::PollingFixture<super::PgFixture>);
}

mod cdc {
    outbox_testkit::feed_suite!(super::Cdc);
}
