//! [`StoreFixture`]: what a store crate provides so that the store conformance suite
//! ([`crate::store`]) and the engine suites ([`crate::engines`]) run against it. Everything a
//! suite cannot do through the core's traits (write producer rows, let a handler write a
//! business effect, age rows to test retention) goes through here.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use outbox_core::consumer::{ConsumerDeadLetter, HandlerError, InboxStore};
use outbox_core::effect::{NewWorkItem, WorkItemState, WorkItemStore};
use outbox_core::maintenance::MaintenanceStore;
use outbox_core::operator::OperatorStore;
use outbox_core::{NewMessage, OutboxStore, StoreError};

/// A boxed future, for the object-safe parts of a fixture.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A producer transaction that wrote outbox rows and has not committed yet.
pub trait HeldProducer: Send {
    /// Commits it: its rows become visible (after rows of transactions that committed earlier,
    /// although they were written first).
    fn commit(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// A work item as the suites inspect it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkItemView {
    /// Id.
    pub id: i64,
    /// State.
    pub state: WorkItemState,
    /// Calls made.
    pub attempts: i32,
    /// Lookups made.
    pub lookups: i32,
    /// The provider's reference, once succeeded.
    pub reference: Option<String>,
    /// The latest error or reason.
    pub last_error: Option<String>,
}

/// A fresh, isolated store for one test case, and the store-specific operations the suites
/// need. Every method panics on an unexpected database error (it is test set-up).
pub trait StoreFixture: Send + Sync + Sized + 'static {
    /// The store under test.
    type Store: OutboxStore + InboxStore + WorkItemStore + MaintenanceStore + OperatorStore + Clone;

    /// A fixture with an empty store of its own (its own schema, database or instance).
    fn new() -> impl Future<Output = Self> + Send;

    /// The store (cheap clones sharing the data).
    fn store(&self) -> Self::Store;

    /// Writes `messages` as one committed producer transaction.
    fn enqueue(&self, messages: Vec<NewMessage>) -> impl Future<Output = ()> + Send;

    /// Writes `messages` in a producer transaction that stays open until the returned handle
    /// commits.
    fn enqueue_held(
        &self,
        messages: Vec<NewMessage>,
    ) -> impl Future<Output = Box<dyn HeldProducer>> + Send;

    /// A handler's business write: adds one to the effect `key`, on the inbox transaction's
    /// connection.
    fn write_effect<'a>(
        &'a self,
        conn: &'a mut <Self::Store as InboxStore>::Conn,
        key: &'a str,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;

    /// The committed count of the effect `key`.
    fn effect_count(&self, key: &str) -> impl Future<Output = u64> + Send;

    /// Writes a work item on the inbox transaction's connection (what a consumer's handler
    /// does for a remote effect).
    ///
    /// # Errors
    /// [`StoreError`] when the store refuses it (the key names another payload).
    fn enqueue_work_item<'a>(
        &'a self,
        conn: &'a mut <Self::Store as InboxStore>::Conn,
        item: &'a NewWorkItem,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'a;

    /// A work item by id.
    fn work_item(&self, id: i64) -> impl Future<Output = WorkItemView> + Send;

    /// Every work item, by id.
    fn work_items(&self) -> impl Future<Output = Vec<WorkItemView>> + Send;

    /// Moves every work item's due, unknown and resolution times back by `by`.
    fn age_work_items(&self, by: Duration) -> impl Future<Output = ()> + Send;

    /// Ends every live work-item lease now (an executor stalled past it).
    fn expire_work_item_leases(&self) -> impl Future<Output = ()> + Send;

    /// Moves every inbox identity's receive time back by `by`.
    fn age_inbox(&self, by: Duration) -> impl Future<Output = ()> + Send;

    /// Inbox identities held (all consumers).
    fn inbox_len(&self) -> impl Future<Output = usize> + Send;

    /// Conflicts recorded (all consumers).
    fn conflict_count(&self) -> impl Future<Output = usize> + Send;

    /// Ends every live relay lease now (a relay stalled past it).
    fn expire_relay_leases(&self) -> impl Future<Output = ()> + Send;

    /// Moves every relay lease's end back by `by`.
    fn age_relay_leases(&self, by: Duration) -> impl Future<Output = ()> + Send;

    /// Relay leases held (live or expired).
    fn relay_lease_count(&self) -> impl Future<Output = usize> + Send;

    /// Consumer dead letters of `consumer` in every state, oldest first.
    fn consumer_dead_letters(
        &self,
        consumer: &str,
    ) -> impl Future<Output = Vec<ConsumerDeadLetter>> + Send;

    /// An operator's requeue of every open dead letter of `consumer`. Returns how many.
    fn requeue_consumer_dead_letters(&self, consumer: &str) -> impl Future<Output = u64> + Send;

    /// An operator's pause (`true`) or resume (`false`) of `consumer`.
    fn set_consumer_paused(&self, consumer: &str, paused: bool) -> impl Future<Output = ()> + Send;

    /// Removes what the fixture created.
    fn cleanup(&self) -> impl Future<Output = ()> + Send;
}

/// Expands to one `#[tokio::test]` per case of suite module `$suite`, each running the case
/// `$crate::$suite::$case` for the fixture `$fixture` (the fixture-based counterpart of the
/// broker suites' `__conformance_cases!`). Used by the suite macros.
#[doc(hidden)]
#[macro_export]
macro_rules! __fixture_cases {
    ($suite:ident, $fixture:ty; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::$suite::$case::<$fixture>().await;
            }
        )+
    };
}
