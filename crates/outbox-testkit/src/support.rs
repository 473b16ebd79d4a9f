//! The steps the store, operator and engine suites share, written once: a claim's rows
//! published, failed or released, an event recorded in an inbox, consumer dead letters written
//! and taken back, work items written and settled, inbox identities of two ages.
//!
//! Each step goes through the core's store traits (or the [`StoreFixture`]) only, so it runs
//! unchanged on every store, and panics on an error the step does not expect (it is a test's
//! set-up).

use std::time::Duration;

use outbox_core::consumer::{
    InboxOutcome, InboxStore, NewConsumerDeadLetter, OrderingGuard, RawMessage, RequeuedDeadLetter,
};
use outbox_core::effect::{
    NewWorkItem, WorkItemRecordParams, WorkItemState, WorkItemStore, WorkItemUpdate,
};
use outbox_core::{
    ClaimedBatch, EventIdentity, FailureParams, IncomingEvent, LeaseToken, MarkParams, OutboxStore,
    ReleaseParams, StoreError,
};
use uuid::Uuid;

use crate::fixture::StoreFixture;

/// The row ids of `batch`, in the batch's order.
pub fn batch_ids(batch: &ClaimedBatch) -> Vec<i64> {
    batch.messages.iter().map(|m| m.id).collect()
}

/// The row id of version `version` of aggregate `aggregate_id` in `batch`.
///
/// # Panics
/// When the batch holds no such row.
pub fn row_id(batch: &ClaimedBatch, aggregate_id: &str, version: i64) -> i64 {
    batch
        .messages
        .iter()
        .find(|m| m.aggregate_id == aggregate_id && m.aggregate_version == version)
        .unwrap_or_else(|| panic!("{aggregate_id}/{version} was not claimed"))
        .id
}

/// Releases the claim `token`, settling the rows `ids` (put back unpublished) and ending its
/// leases.
pub async fn release<S: OutboxStore>(store: &S, token: LeaseToken, ids: &[i64]) {
    store
        .release(ReleaseParams { token, ids })
        .await
        .expect("release");
}

/// Releases every row of `batch` unpublished.
pub async fn release_all<S: OutboxStore>(store: &S, batch: &ClaimedBatch) {
    release(store, batch.token, &batch_ids(batch)).await;
}

/// Marks the rows `ids` published under the claim `token`; returns how many it marked.
pub async fn mark_published<S: OutboxStore>(store: &S, token: LeaseToken, ids: &[i64]) -> u64 {
    store
        .mark_published(MarkParams { token, ids })
        .await
        .expect("mark published")
}

/// Marks every row of `batch` published, then releases the claim; returns how many it marked.
pub async fn publish_all<S: OutboxStore>(store: &S, batch: &ClaimedBatch) -> u64 {
    let marked = mark_published(store, batch.token, &batch_ids(batch)).await;
    release(store, batch.token, &[]).await;
    marked
}

/// Records a failed publish of row `id` under the claim `token`: retried after `retry_after`,
/// or dead-lettered without it. Returns whether the store recorded it.
pub async fn record_failure<S: OutboxStore>(
    store: &S,
    token: LeaseToken,
    id: i64,
    error: &str,
    retry_after: Option<Duration>,
) -> bool {
    store
        .record_failure(FailureParams {
            token,
            id,
            error,
            retry_after,
        })
        .await
        .expect("record failure")
}

/// Records `e` in the inbox of `consumer` under `guard`, committed; returns the outcome.
pub async fn record<S: InboxStore>(
    store: &S,
    consumer: &str,
    guard: OrderingGuard,
    e: &IncomingEvent,
) -> InboxOutcome {
    let mut tx = store.begin().await.expect("begin");
    let outcome = store
        .inbox_record(&mut tx, consumer, guard, e)
        .await
        .expect("inbox record");
    store.commit(tx).await.expect("commit");
    outcome
}

/// Records five identities at consumer `c` (aggregates `o0` to `o4`) and moves them `age`
/// back, then records one young identity (aggregate `y`): what a retention test deletes, and
/// what it keeps.
pub async fn old_and_young_inbox<F: StoreFixture>(f: &F, age: Duration) {
    let store = f.store();
    for n in 0..5 {
        let e = crate::store::incoming(Uuid::now_v7(), &format!("o{n}"), 1, "{}");
        record(&store, "c", OrderingGuard::Off, &e).await;
    }
    f.age_inbox(age).await;
    let young = crate::store::incoming(Uuid::now_v7(), "y", 1, "{}");
    record(&store, "c", OrderingGuard::Off, &young).await;
}

/// Begins a transaction and writes on it a dead letter of `consumer` for each `(raw message,
/// identity)` of `letters`, with `error` and `attempts`, as the consumer engine does; returns
/// the transaction, open (the caller commits or drops it).
///
/// # Errors
/// The store's refusal of a dead letter (or of the transaction).
pub async fn write_consumer_dead_letters<S: InboxStore>(
    store: &S,
    consumer: &str,
    letters: &[(&RawMessage, &EventIdentity)],
    error: &str,
    attempts: u32,
) -> Result<S::Tx, StoreError> {
    let mut tx = store.begin().await?;
    for (raw, identity) in letters {
        let letter = NewConsumerDeadLetter {
            consumer,
            raw,
            identity,
            error,
            attempts,
        };
        store.consumer_dead_letter_insert(&mut tx, letter).await?;
    }
    Ok(tx)
}

/// The requeued dead letters of `consumer` the engine would take next (at most `limit`), read
/// in a transaction that is rolled back: they stay requeued.
pub async fn take_requeued<S: InboxStore>(
    store: &S,
    consumer: &str,
    limit: usize,
) -> Vec<RequeuedDeadLetter> {
    let mut tx = store.begin().await.expect("begin");
    let taken = store
        .consumer_dead_letter_take_requeued(&mut tx, consumer, limit)
        .await
        .expect("take requeued");
    store.rollback(tx).await.expect("rollback");
    taken
}

/// A `payout` work item keyed `key` (caused by `event_id`, if any) of consumer `c`, its payload
/// naming the key.
pub fn payout_item(key: &str, event_id: Option<Uuid>) -> NewWorkItem {
    NewWorkItem {
        kind: "payout".into(),
        idempotency_key: key.into(),
        payload: serde_json::json!({"key": key}),
        event_id,
        consumer_name: Some("c".into()),
    }
}

/// Writes `item` on a committed transaction, as a consumer's handler would; returns its id.
pub async fn enqueue_work_item<F: StoreFixture>(f: &F, item: &NewWorkItem) -> i64 {
    let store = f.store();
    let before: Vec<i64> = f.work_items().await.iter().map(|w| w.id).collect();
    let mut tx = store.begin().await.expect("begin");
    f.enqueue_work_item(&mut tx, item).await.expect("work item");
    store.commit(tx).await.expect("commit");
    f.work_items()
        .await
        .into_iter()
        .map(|w| w.id)
        .find(|id| !before.contains(id))
        .expect("a new work item")
}

/// Records `update` of the work item `id`, claimed for a call under `token` (an executor's
/// record of its call's outcome, no lookup made); returns whether the store took it.
pub async fn record_call<S: WorkItemStore>(
    store: &S,
    id: i64,
    token: LeaseToken,
    update: &WorkItemUpdate,
) -> bool {
    store
        .work_item_record(WorkItemRecordParams {
            id,
            token,
            claimed_in: WorkItemState::InProgress,
            update,
            lookups_add: 0,
        })
        .await
        .expect("record work item")
}
