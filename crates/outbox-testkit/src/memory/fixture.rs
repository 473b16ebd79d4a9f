//! The [`StoreFixture`](crate::fixture::StoreFixture) of the [`MemoryStore`].

use std::time::Duration;

use outbox_core::NewMessage;
use outbox_core::StoreError;
use outbox_core::consumer::ConsumerDeadLetter;
use outbox_core::effect::NewWorkItem;

use super::{HeldEnqueue, MemoryConn, MemoryStore};

/// The [`crate::fixture::StoreFixture`] of the [`MemoryStore`]: how the conformance and engine
/// suites run against the fake.
#[derive(Debug, Clone, Default)]
pub struct MemoryFixture {
    store: MemoryStore,
}

struct HeldMemory(HeldEnqueue);

impl crate::fixture::HeldProducer for HeldMemory {
    fn commit(self: Box<Self>) -> crate::fixture::BoxFuture<'static, ()> {
        Box::pin(async move { self.0.commit().expect("held producer commits") })
    }
}

impl crate::fixture::StoreFixture for MemoryFixture {
    type Store = MemoryStore;

    async fn new() -> Self {
        Self::default()
    }

    fn store(&self) -> MemoryStore {
        self.store.clone()
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) {
        self.store.enqueue(&messages).expect("enqueue");
    }

    async fn enqueue_held(
        &self,
        messages: Vec<NewMessage>,
    ) -> Box<dyn crate::fixture::HeldProducer> {
        Box::new(HeldMemory(self.store.enqueue_held(messages)))
    }

    async fn write_effect<'a>(
        &'a self,
        conn: &'a mut MemoryConn,
        key: &'a str,
    ) -> Result<(), outbox_core::consumer::HandlerError> {
        conn.effect(key);
        Ok(())
    }

    async fn effect_count(&self, key: &str) -> u64 {
        self.store.effect_count(key)
    }

    async fn enqueue_work_item<'a>(
        &'a self,
        conn: &'a mut MemoryConn,
        item: &'a NewWorkItem,
    ) -> Result<(), StoreError> {
        conn.enqueue_work_item(&self.store, item.clone())
    }

    async fn work_item(&self, id: i64) -> crate::fixture::WorkItemView {
        self.work_items()
            .await
            .into_iter()
            .find(|w| w.id == id)
            .unwrap_or_else(|| panic!("no work item {id}"))
    }

    async fn work_items(&self) -> Vec<crate::fixture::WorkItemView> {
        self.store.work_item_views()
    }

    async fn age_work_items(&self, by: Duration) {
        self.store.age_work_items(by);
    }

    async fn expire_work_item_leases(&self) {
        self.store.expire_work_item_leases();
    }

    async fn age_inbox(&self, by: Duration) {
        self.store.age_inbox(by);
    }

    async fn inbox_len(&self) -> usize {
        self.store.inbox_len()
    }

    async fn conflict_count(&self) -> usize {
        self.store.conflict_records().len()
    }

    async fn expire_relay_leases(&self) {
        self.store.expire_relay_leases();
    }

    async fn age_relay_leases(&self, by: Duration) {
        self.store.age_relay_leases(by);
    }

    async fn relay_lease_count(&self) -> usize {
        self.store.relay_lease_count()
    }

    async fn consumer_dead_letters(&self, consumer: &str) -> Vec<ConsumerDeadLetter> {
        self.store.consumer_dead_letter_records(Some(consumer))
    }

    async fn requeue_consumer_dead_letters(&self, consumer: &str) -> u64 {
        // Through the operator contract, audited, as on every store.
        let which = outbox_core::operator::ConsumerSelection {
            consumer: Some(consumer.to_owned()),
            ..Default::default()
        };
        outbox_core::operator::DeadLetterOps::requeue_consumer_dead_letters(
            &self.store,
            &which,
            &suite_actor(),
            "suite",
        )
        .await
        .expect("requeue")
    }

    async fn set_consumer_paused(&self, consumer: &str, paused: bool) {
        use outbox_core::operator::PauseOps as _;
        let target = outbox_core::operator::PauseTarget::Consumer(consumer.to_owned());
        if paused {
            self.store
                .pause(&target, &suite_actor(), "engine suite")
                .await
                .expect("pause");
        } else {
            self.store
                .resume(&target, &suite_actor(), "")
                .await
                .expect("resume");
        }
    }

    async fn cleanup(&self) {}
}

/// Who the suites' operator actions are recorded under.
fn suite_actor() -> outbox_core::operator::Actor {
    outbox_core::operator::Actor::new("suite", "test").expect("actor")
}
