//! The helpers the operator cases share: the actor, test events, audit reads, dead letters made
//! by a claim and a failure, claims as (aggregate, version) pairs, consumer dead letters and
//! work items in each state.

use std::fmt::Debug;
use std::time::Duration;

use outbox_core::consumer::InboxStore;
use outbox_core::effect::{ClaimPurpose, WorkItemClaimParams, WorkItemStore, WorkItemUpdate};
use outbox_core::operator::prelude::*;
use outbox_core::operator::{
    Actor, AggregateTrace, AuditEntry, DeadLetterFilter, MAX_LIST, OperatorError, OperatorErrorKind,
};
use outbox_core::{
    EventId, EventIdentity, LeaseToken, NewMessage, OutboxMessage, OutboxStore, Payload,
};
use serde_json::json;
use uuid::Uuid;

use crate::fakes::{event_message, wire_message};
use crate::fixture::StoreFixture;
use crate::store::{claim, incoming};
use crate::support::{
    enqueue_work_item, payout_item, record_call, record_failure, release_all,
    write_consumer_dead_letters,
};

/// The actor of every case's actions: `alice` through `suite`, with a credential.
pub fn actor() -> Actor {
    Actor::new("alice", "suite")
        .expect("a valid actor")
        .with_credential("fp-1")
}

/// An event of `aggregate_type`/`aggregate_id` at `version` with a small JSON payload.
pub fn event(
    aggregate_type: &str,
    aggregate_id: &str,
    version: i64,
    event_type: &str,
) -> NewMessage {
    NewMessage::new(
        aggregate_type,
        aggregate_id,
        version,
        event_type,
        Payload::json(&json!({"agg": aggregate_id, "v": version})).expect("json"),
    )
}

/// A `PaymentCreated` event of the `payment` `aggregate_id` at `version` ([`event`]).
pub(super) fn created(aggregate_id: &str, version: i64) -> NewMessage {
    event("payment", aggregate_id, version, "PaymentCreated")
}

/// A `payment` event of `aggregate_id` at `version` whose payload is `body`, under `event_id`.
pub(super) fn payment(
    event_id: EventId,
    aggregate_id: &str,
    version: i64,
    body: &str,
) -> NewMessage {
    NewMessage::new(
        "payment",
        aggregate_id,
        version,
        "PaymentCreated",
        Payload::bytes("application/json", body.to_owned()),
    )
    .with_event_id(event_id)
}

/// The kind of the error `r` must be.
pub(super) fn kind<T: Debug>(r: Result<T, OperatorError>) -> OperatorErrorKind {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.kind,
    }
}

/// Every audit record, newest first.
pub(super) async fn audit<S: OperatorStore>(s: &S) -> Vec<AuditEntry> {
    s.audit(None, MAX_LIST).await.expect("audit")
}

/// The newest audit record.
pub(super) async fn last_record<S: OperatorStore>(s: &S) -> AuditEntry {
    audit(s).await.into_iter().next().expect("an audit record")
}

/// The newest audit record, which must be the one `audit_id` names.
pub(super) async fn audited<S: OperatorStore>(s: &S, audit_id: i64) -> AuditEntry {
    let r = last_record(s).await;
    assert_eq!(audit_id, r.id);
    r
}

/// The event ids of the dead letters `filter` selects (at most `limit`), oldest first.
pub(super) async fn dead_letter_ids<S: OperatorStore>(
    s: &S,
    filter: &DeadLetterFilter,
    limit: i64,
) -> Vec<EventId> {
    let dead = s.dead_letters(filter, limit).await.expect("dead letters");
    dead.iter().map(|d| d.event_id).collect()
}

/// Claims everything claimable, makes the rows `dead` names dead letters with their error,
/// and releases the claim.
pub(super) async fn kill<F: StoreFixture>(f: &F, dead: &[(EventId, &str)]) {
    let store = f.store();
    let batch = store.claim_batch(claim(1000, 30_000)).await.expect("claim");
    for (event_id, error) in dead {
        let m = batch
            .messages
            .iter()
            .find(|m| m.event_id == *event_id)
            .unwrap_or_else(|| panic!("{event_id} was not claimed"));
        let failed = record_failure(&store, batch.token, m.id, error, None).await;
        assert!(failed, "the failure of {event_id} is recorded");
    }
    release_all(&store, &batch).await;
}

/// The (aggregate id, version) pairs of `messages`, in their order.
pub(super) fn claimed_pairs(messages: &[OutboxMessage]) -> Vec<(String, i64)> {
    messages
        .iter()
        .map(|m| (m.aggregate_id.clone(), m.aggregate_version))
        .collect()
}

/// What a claim hands out, as (aggregate id, version) pairs in the batch's order; the claim is
/// released.
pub(super) async fn claimable<S: OutboxStore>(store: &S) -> Vec<(String, i64)> {
    let batch = store.claim_batch(claim(1000, 30_000)).await.expect("claim");
    release_all(store, &batch).await;
    claimed_pairs(&batch.messages)
}

/// The versions an aggregate's trace holds: of its outbox rows, and of its discarded events.
pub(super) fn trace_versions(agg: &AggregateTrace) -> (Vec<i64>, Vec<i64>) {
    let outbox = agg.outbox.iter().map(|e| e.aggregate_version).collect();
    let discarded = agg.discarded.iter().map(|e| e.aggregate_version).collect();
    (outbox, discarded)
}

/// [`claimable`], sorted.
pub(super) async fn claimable_sorted<S: OutboxStore>(store: &S) -> Vec<(String, i64)> {
    let mut all = claimable(store).await;
    all.sort();
    all
}

pub(super) fn pairs(p: &[(&str, i64)]) -> Vec<(String, i64)> {
    p.iter().map(|(a, v)| ((*a).to_owned(), *v)).collect()
}

/// Dead-letters, at `consumer`, the message of event `event_id` (aggregate `agg`, version 1)
/// with `body`; with its identity when `identified`.
pub(super) async fn consumer_dead<S: InboxStore>(
    store: &S,
    consumer: &str,
    event_id: EventId,
    agg: &str,
    body: &str,
    identified: bool,
    error: &str,
) {
    let raw = wire_message(&event_message(event_id, agg, 1, body));
    let identity = if identified {
        EventIdentity::of(&incoming(event_id, agg, 1, body))
    } else {
        EventIdentity::default()
    };
    let letter = [(&raw, &identity)];
    let tx = write_consumer_dead_letters(store, consumer, &letter, error, 3)
        .await
        .expect("dead letter");
    store.commit(tx).await.expect("commit");
}

/// Writes a `payout` work item keyed `key` (caused by `event_id`, if any) as consumer `c`'s
/// handler would; returns its id.
pub(super) async fn work_item<F: StoreFixture>(f: &F, key: &str, event_id: Option<Uuid>) -> i64 {
    enqueue_work_item(f, &payout_item(key, event_id)).await
}

pub(super) fn call_claim(purpose: ClaimPurpose) -> WorkItemClaimParams<'static> {
    WorkItemClaimParams {
        kind: "payout",
        purpose,
        limit: 100,
        lease: Duration::from_secs(30),
    }
}

/// A new work item keyed `key`, claimed for its call; returns its id and its claim's token.
/// Every other `payout` item must be settled or unknown already.
pub(super) async fn called_item<F: StoreFixture>(f: &F, key: &str) -> (i64, LeaseToken) {
    let id = work_item(f, key, None).await;
    let claimed = f
        .store()
        .work_item_claim(call_claim(ClaimPurpose::Call))
        .await
        .expect("claim");
    assert_eq!(
        claimed.iter().map(|c| c.item.id).collect::<Vec<_>>(),
        vec![id]
    );
    (id, claimed[0].token)
}

/// A work item whose outcome is unknown (its call's lease ran out), its lookup due in an hour.
/// Every other `payout` item must be settled or unknown already.
pub(super) async fn unknown_item<F: StoreFixture>(f: &F, key: &str) -> i64 {
    let (id, _) = called_item(f, key).await;
    f.expire_work_item_leases().await;
    let expired = f
        .store()
        .work_item_expire("payout", Duration::from_secs(3600), "lease expired")
        .await
        .expect("expire");
    assert_eq!(expired, vec![id]);
    id
}

/// A work item that failed for good. Every other `payout` item must be settled or unknown
/// already.
pub(super) async fn failed_item<F: StoreFixture>(f: &F, key: &str) -> i64 {
    let (id, token) = called_item(f, key).await;
    let failed = WorkItemUpdate::Failed {
        reason: "refused by the provider".into(),
    };
    assert!(record_call(&f.store(), id, token, &failed).await);
    id
}
