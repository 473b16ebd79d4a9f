//! The feed suite on the polling feed over the in-memory store (a fake: the engine's contract
//! with its feeds, checked without a database; PostgreSQL's feeds run the same suite).

use std::sync::Arc;
use std::time::Duration;

use outbox_core::relay::PollingFeed;
use outbox_core::{NewMessage, OutboxStore as _};
use outbox_testkit::feed::FeedFixture;
use outbox_testkit::fixture::{HeldProducer, StoreFixture};
use outbox_testkit::memory::{MemoryFixture, MemoryStore};

struct MemoryFeedFixture {
    store: MemoryFixture,
    feed: Arc<PollingFeed<MemoryStore>>,
}

impl FeedFixture for MemoryFeedFixture {
    type Feed = PollingFeed<MemoryStore>;
    type Operator = MemoryStore;

    async fn new() -> Self {
        let store = MemoryFixture::new().await;
        let feed = Arc::new(PollingFeed::new(
            Arc::new(store.store()),
            100,
            Duration::from_secs(30),
        ));
        Self { store, feed }
    }

    fn feed(&self) -> Arc<Self::Feed> {
        Arc::clone(&self.feed)
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) {
        self.store.enqueue(messages).await;
    }

    async fn enqueue_held(&self, messages: Vec<NewMessage>) -> Box<dyn HeldProducer> {
        self.store.enqueue_held(messages).await
    }

    async fn unpublished(&self) -> usize {
        let s = self.store.store().stats().await.expect("stats");
        usize::try_from(s.pending + s.dead).expect("counts")
    }

    fn operator(&self) -> MemoryStore {
        self.store.store()
    }

    async fn cleanup(&self) {
        self.store.cleanup().await;
    }
}

outbox_testkit::feed_suite!(MemoryFeedFixture);
