//! The operator conformance suite: one case per promise of the operator contract
//! ([`outbox_core::operator`]): the overview's counts, outbox and consumer dead letters
//! (filters, reason groups, detail, requeue, discard), page limits, conflicts, work items,
//! pauses (a paused route is not claimed), the audit, traces and replays, generic over a
//! [`StoreFixture`] whose store implements [`OperatorStore`]. A store crate runs it in one line:
//!
//! ```ignore
//! outbox_testkit::operator_suite!(MyFixture);
//! ```
//!
//! which expands to one `#[tokio::test]` per case. Every case seeds its data through the core's
//! store traits and the fixture only (a claim and a failure make a dead letter, the inbox
//! records conflicts and consumer dead letters), so it runs unchanged on every store; and every
//! case checks that each successful action wrote exactly one audit record and each refused one
//! none.

use std::fmt::Debug;
use std::time::Duration;

use outbox_core::consumer::{InboxOutcome, InboxStore, OrderingGuard};
use outbox_core::effect::{
    ClaimPurpose, WorkItemClaimParams, WorkItemRecordParams, WorkItemState, WorkItemStore,
    WorkItemUpdate,
};
use outbox_core::operator::prelude::*;
use outbox_core::operator::{
    Actor, AggregateTrace, AuditEntry, ConsumerSelection, Counting, DeadLetterFilter,
    DeadLetterSelection, MAX_LIST, MINUTES, OperatorError, OperatorErrorKind, PauseTarget,
    RangeSelection, ReplaySelection, Resolution, reason_key,
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
    enqueue_work_item, payout_item, publish_all, record, record_call, record_failure, release_all,
    take_requeued, write_consumer_dead_letters,
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
fn created(aggregate_id: &str, version: i64) -> NewMessage {
    event("payment", aggregate_id, version, "PaymentCreated")
}

/// A `payment` event of `aggregate_id` at `version` whose payload is `body`, under `event_id`.
fn payment(event_id: EventId, aggregate_id: &str, version: i64, body: &str) -> NewMessage {
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
fn kind<T: Debug>(r: Result<T, OperatorError>) -> OperatorErrorKind {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.kind,
    }
}

/// Every audit record, newest first.
async fn audit<S: OperatorStore>(s: &S) -> Vec<AuditEntry> {
    s.audit(None, MAX_LIST).await.expect("audit")
}

/// The newest audit record.
async fn last_record<S: OperatorStore>(s: &S) -> AuditEntry {
    audit(s).await.into_iter().next().expect("an audit record")
}

/// The newest audit record, which must be the one `audit_id` names.
async fn audited<S: OperatorStore>(s: &S, audit_id: i64) -> AuditEntry {
    let r = last_record(s).await;
    assert_eq!(audit_id, r.id);
    r
}

/// The event ids of the dead letters `filter` selects (at most `limit`), oldest first.
async fn dead_letter_ids<S: OperatorStore>(
    s: &S,
    filter: &DeadLetterFilter,
    limit: i64,
) -> Vec<EventId> {
    let dead = s.dead_letters(filter, limit).await.expect("dead letters");
    dead.iter().map(|d| d.event_id).collect()
}

/// Claims everything claimable, makes the rows `dead` names dead letters with their error,
/// and releases the claim.
async fn kill<F: StoreFixture>(f: &F, dead: &[(EventId, &str)]) {
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
fn claimed_pairs(messages: &[OutboxMessage]) -> Vec<(String, i64)> {
    messages
        .iter()
        .map(|m| (m.aggregate_id.clone(), m.aggregate_version))
        .collect()
}

/// What a claim hands out, as (aggregate id, version) pairs in the batch's order; the claim is
/// released.
async fn claimable<S: OutboxStore>(store: &S) -> Vec<(String, i64)> {
    let batch = store.claim_batch(claim(1000, 30_000)).await.expect("claim");
    release_all(store, &batch).await;
    claimed_pairs(&batch.messages)
}

/// The versions an aggregate's trace holds: of its outbox rows, and of its discarded events.
fn trace_versions(agg: &AggregateTrace) -> (Vec<i64>, Vec<i64>) {
    let outbox = agg.outbox.iter().map(|e| e.aggregate_version).collect();
    let discarded = agg.discarded.iter().map(|e| e.aggregate_version).collect();
    (outbox, discarded)
}

/// [`claimable`], sorted.
async fn claimable_sorted<S: OutboxStore>(store: &S) -> Vec<(String, i64)> {
    let mut all = claimable(store).await;
    all.sort();
    all
}

fn pairs(p: &[(&str, i64)]) -> Vec<(String, i64)> {
    p.iter().map(|(a, v)| ((*a).to_owned(), *v)).collect()
}

/// Dead-letters, at `consumer`, the message of event `event_id` (aggregate `agg`, version 1)
/// with `body`; with its identity when `identified`.
async fn consumer_dead<S: InboxStore>(
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
async fn work_item<F: StoreFixture>(f: &F, key: &str, event_id: Option<Uuid>) -> i64 {
    enqueue_work_item(f, &payout_item(key, event_id)).await
}

fn call_claim(purpose: ClaimPurpose) -> WorkItemClaimParams<'static> {
    WorkItemClaimParams {
        kind: "payout",
        purpose,
        limit: 100,
        lease: Duration::from_secs(30),
    }
}

/// A new work item keyed `key`, claimed for its call; returns its id and its claim's token.
/// Every other `payout` item must be settled or unknown already.
async fn called_item<F: StoreFixture>(f: &F, key: &str) -> (i64, LeaseToken) {
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
async fn unknown_item<F: StoreFixture>(f: &F, key: &str) -> i64 {
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
async fn failed_item<F: StoreFixture>(f: &F, key: &str) -> i64 {
    let (id, token) = called_item(f, key).await;
    let failed = WorkItemUpdate::Failed {
        reason: "refused by the provider".into(),
    };
    assert!(record_call(&f.store(), id, token, &failed).await);
    id
}

/// The overview counts pending (retrying, in flight), dead, open conflicts, open consumer dead
/// letters and work items by state, exactly or up to a bound; a bound below 1 is refused.
pub async fn overview_counts_what_waits_and_what_failed<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    s.ready().await.expect("a fresh store is ready");
    let empty = s.overview().await.unwrap();
    assert_eq!(
        (
            empty.pending,
            empty.dead_letters,
            empty.inbox_conflicts,
            empty.consumer_dead_letters,
            empty.counted_up_to
        ),
        (0, 0, 0, 0, None)
    );
    assert_eq!(empty.oldest_pending_age_seconds, 0.0);

    let (a1, a2, b1, c1) = (
        created("a", 1),
        created("a", 2),
        created("b", 1),
        created("c", 1),
    );
    let (dead_id, retry_id) = (a1.event_id, b1.event_id);
    f.enqueue(vec![a1, a2, b1]).await;
    let batch = s.claim_batch(claim(100, 30_000)).await.unwrap();
    for (event_id, retry_after) in [(dead_id, None), (retry_id, Some(Duration::from_secs(3600)))] {
        let m = batch
            .messages
            .iter()
            .find(|m| m.event_id == event_id)
            .unwrap();
        let error = "broker unavailable";
        assert!(record_failure(&s, batch.token, m.id, error, retry_after).await);
    }
    release_all(&s, &batch).await;
    // c's row is claimed and stays in flight.
    f.enqueue(vec![c1]).await;
    let held = s.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(pairs(&[("c", 1)]), claimed_pairs(&held.messages));

    // One conflict: the same event id with two payloads.
    let id = Uuid::now_v7();
    for body in [r#"{"n":1}"#, r#"{"n":2}"#] {
        record(&s, "c1", OrderingGuard::Off, &incoming(id, "x", 1, body)).await;
    }
    for n in 0..3 {
        consumer_dead(
            &s,
            "ledger",
            Uuid::now_v7(),
            &format!("l{n}"),
            "{}",
            true,
            "boom",
        )
        .await;
    }
    let letters = s
        .consumer_dead_letters(&ConsumerSelection::default(), 10)
        .await
        .unwrap();
    let ids: Vec<i64> = letters.iter().map(|l| l.dead_letter.id).collect();
    let one = |id: i64| ConsumerSelection {
        ids: Some(vec![id]),
        ..ConsumerSelection::default()
    };
    // A requeued letter is still open; a discarded one is not.
    assert_eq!(
        s.requeue_consumer_dead_letters(&one(ids[0]), &actor(), "retry")
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.discard_consumer_dead_letters(&one(ids[1]), &actor(), "obsolete")
            .await
            .unwrap(),
        1
    );

    unknown_item(&f, "k-unknown").await;
    failed_item(&f, "k-failed").await;
    work_item(&f, "k-pending", None).await;

    let o = s.overview().await.unwrap();
    assert_eq!(o.counted_up_to, None);
    assert_eq!(
        (
            o.pending,
            o.retrying,
            o.in_flight,
            o.dead_letters,
            o.published_retained
        ),
        (3, 1, 1, 1, 0),
        "{o:?}"
    );
    assert!(o.oldest_pending_age_seconds >= 0.0);
    assert_eq!(
        (o.inbox_conflicts, o.consumer_dead_letters),
        (1, 2),
        "{o:?}"
    );
    let w = &o.work_items;
    assert_eq!(
        (w.pending, w.in_progress, w.unknown, w.failed),
        (1, 0, 1, 1),
        "{w:?}"
    );
    assert!(w.oldest_unknown_age_seconds >= 0.0);

    let bounded = s.overview_counting(Counting::UpTo(1)).await.unwrap();
    assert_eq!(bounded.counted_up_to, Some(1));
    assert_eq!(
        (
            bounded.pending,
            bounded.retrying,
            bounded.in_flight,
            bounded.dead_letters
        ),
        (1, 1, 1, 1),
        "each count stops at the bound"
    );
    assert_eq!((bounded.inbox_conflicts, bounded.work_items.failed), (1, 1));
    for bound in [0, -5] {
        assert_eq!(
            kind(s.overview_counting(Counting::UpTo(bound)).await),
            OperatorErrorKind::InvalidRequest
        );
    }
    f.cleanup().await;
}

/// Outbox dead letters: oldest first, with what waits behind them and their reason key;
/// filtered by aggregate type, event type, destination, reason group and time; grouped by
/// reason (errors differing only in numbers and ids are one group); read whole; `NotFound` for
/// an id that is not a dead letter.
pub async fn dead_letters_are_listed_filtered_grouped_and_read_whole<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let a1 = created("a", 1).with_header("x-tenant", "t1");
    let a2 = created("a", 2);
    let b1 = event("payment", "b", 1, "PaymentRefunded");
    let c1 = event("order", "c", 1, "OrderPlaced")
        .with_destination("orders-eu")
        .with_partition_key("p-1");
    let (ia1, ia2, ib1, ic1) = (a1.event_id, a2.event_id, b1.event_id, c1.event_id);
    let a1_body = String::from_utf8(a1.payload.bytes.to_vec()).unwrap();
    f.enqueue(vec![a1, a2]).await;
    f.enqueue(vec![b1]).await;
    f.enqueue(vec![c1]).await;
    let (ea, eb) = (
        format!("publish timed out after 5000 ms (event {ia1})"),
        format!("publish timed out after 7000 ms (event {ib1})"),
    );
    let ec = "broker refused: message too large";
    kill(&f, &[(ia1, &ea), (ib1, &eb), (ic1, ec)]).await;
    let timeout = "publish timed out after # ms (event #)";
    assert_eq!(reason_key(Some(&ea)), timeout);

    let all = s
        .dead_letters(&DeadLetterFilter::default(), 100)
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|d| d.event_id).collect::<Vec<_>>(),
        vec![ia1, ib1, ic1],
        "oldest first"
    );
    let (da, dc) = (&all[0], &all[2]);
    assert_eq!((da.aggregate_id.as_str(), da.aggregate_version), ("a", 1));
    assert_eq!(da.blocked_behind, 1, "a2 waits behind a1");
    assert_eq!(all[1].blocked_behind, 0);
    assert_eq!(
        (da.attempts, da.last_error.as_deref()),
        (1, Some(ea.as_str()))
    );
    assert_eq!(da.reason, timeout);
    assert_eq!(da.content_type, "application/json");
    assert_eq!(dc.destination.as_deref(), Some("orders-eu"));
    assert_eq!(dc.reason, ec);

    let none = DeadLetterFilter::default();
    let later = chrono::Utc::now() + chrono::Duration::hours(1);
    let filtered = [
        (
            DeadLetterFilter {
                aggregate_type: Some("order".into()),
                ..none.clone()
            },
            vec![ic1],
        ),
        (
            DeadLetterFilter {
                event_type: Some("PaymentRefunded".into()),
                ..none.clone()
            },
            vec![ib1],
        ),
        (
            DeadLetterFilter {
                destination: Some("orders-eu".into()),
                ..none.clone()
            },
            vec![ic1],
        ),
        (
            DeadLetterFilter {
                reason_group: Some(timeout.into()),
                ..none.clone()
            },
            vec![ia1, ib1],
        ),
        (
            DeadLetterFilter {
                created_after: Some(later),
                ..none.clone()
            },
            vec![],
        ),
        (
            DeadLetterFilter {
                created_before: Some(later),
                aggregate_type: Some("payment".into()),
                ..none.clone()
            },
            vec![ia1, ib1],
        ),
    ];
    for (filter, want) in filtered {
        assert_eq!(dead_letter_ids(&s, &filter, 100).await, want, "{filter:?}");
    }
    assert_eq!(
        s.dead_letters(&none, 1).await.unwrap().len(),
        1,
        "the limit holds"
    );

    let groups = s.dead_letter_groups(&none).await.unwrap();
    assert!(groups.complete);
    assert_eq!(groups.groups.len(), 2, "{groups:?}");
    let g = &groups.groups[0];
    assert_eq!((g.reason.as_str(), g.count), (timeout, 2), "largest first");
    assert_eq!(
        g.example_error.as_deref(),
        Some(ea.as_str()),
        "the oldest one's error"
    );
    assert_eq!(g.aggregate_types, vec!["payment".to_owned()]);
    assert_eq!(
        g.event_types,
        vec!["PaymentCreated".to_owned(), "PaymentRefunded".to_owned()]
    );
    assert!(g.first_created_at <= g.last_created_at);
    assert_eq!(
        (groups.groups[1].reason.as_str(), groups.groups[1].count),
        (ec, 1)
    );
    let orders = s
        .dead_letter_groups(&DeadLetterFilter {
            aggregate_type: Some("order".into()),
            ..none.clone()
        })
        .await
        .unwrap();
    assert_eq!(orders.groups.len(), 1);

    let detail = s.dead_letter(ia1).await.unwrap();
    assert_eq!(detail.dead_letter, all[0]);
    assert_eq!(detail.payload.text.as_deref(), Some(a1_body.as_str()));
    assert_eq!(detail.payload.size, a1_body.len());
    assert_eq!(detail.headers["x-tenant"], json!("t1"));
    assert_eq!(detail.partition_key, None);
    assert_eq!(
        s.dead_letter(ic1).await.unwrap().partition_key.as_deref(),
        Some("p-1")
    );
    for not_dead in [ia2, Uuid::now_v7()] {
        assert_eq!(
            kind(s.dead_letter(not_dead).await),
            OperatorErrorKind::NotFound
        );
    }
    assert!(audit(&s).await.is_empty(), "reads record nothing");
    f.cleanup().await;
}

/// A requeue by ids, by filter or of all makes the selected dead letters pending again with
/// their attempts reset (claimable, with the rows behind them), counts only dead letters, and
/// writes one audit record each time, even when it changed nothing.
pub async fn requeued_dead_letters_are_claimable_again_and_audited<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let (a1, a2) = (created("a", 1), created("a", 2));
    let b1 = event("payment", "b", 1, "PaymentRefunded");
    let c1 = event("order", "c", 1, "OrderPlaced");
    let (ia1, ia2, ib1, ic1) = (a1.event_id, a2.event_id, b1.event_id, c1.event_id);
    f.enqueue(vec![a1, a2, b1, c1]).await;
    kill(
        &f,
        &[(ia1, "timeout 1"), (ib1, "timeout 2"), (ic1, "too large")],
    )
    .await;
    assert!(
        claimable(&s).await.is_empty(),
        "every aggregate waits behind a dead letter"
    );

    let me = actor();
    let stranger = Uuid::now_v7();
    let by_ids = DeadLetterSelection::Ids(vec![ia1, ia2, stranger]);
    assert_eq!(
        s.requeue_dead_letters(&by_ids, &me, "broker limit raised")
            .await
            .unwrap(),
        1,
        "only dead letters are requeued and counted"
    );
    let r = last_record(&s).await;
    assert_eq!(
        (
            r.action.as_str(),
            r.actor.as_str(),
            r.via.as_str(),
            r.credential.as_deref()
        ),
        ("requeue dead letters", "alice", "suite", Some("fp-1"))
    );
    assert_eq!((r.reason.as_str(), r.affected), ("broker limit raised", 1));
    assert_eq!(r.selection, json!({ "event_ids": [ia1, ia2, stranger] }));
    let any = DeadLetterFilter::default();
    assert_eq!(dead_letter_ids(&s, &any, 10).await, vec![ib1, ic1]);
    let batch = s.claim_batch(claim(100, 30_000)).await.unwrap();
    let got: Vec<(EventId, i32)> = batch
        .messages
        .iter()
        .map(|m| (m.event_id, m.attempts))
        .collect();
    assert_eq!(
        got,
        vec![(ia1, 0), (ia2, 0)],
        "a1 again, attempts reset, then a2"
    );
    release_all(&s, &batch).await;

    let refunds = DeadLetterFilter {
        event_type: Some("PaymentRefunded".into()),
        ..DeadLetterFilter::default()
    };
    assert_eq!(
        s.requeue_dead_letters(&DeadLetterSelection::Matching(refunds), &me, "fixed")
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        last_record(&s).await.selection,
        json!({ "filter": { "event_type": "PaymentRefunded" } })
    );
    assert_eq!(
        s.requeue_dead_letters(&DeadLetterSelection::All, &me, "fixed")
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.requeue_dead_letters(&DeadLetterSelection::All, &me, "again")
            .await
            .unwrap(),
        0
    );
    let r = last_record(&s).await;
    assert_eq!(
        (r.affected, r.selection.clone()),
        (0, json!({ "all": true })),
        "an action that changed nothing is recorded too"
    );
    assert_eq!(audit(&s).await.len(), 4, "one record per action");
    assert_eq!(s.overview().await.unwrap().dead_letters, 0);
    let all = claimable_sorted(&s).await;
    assert_eq!(all, pairs(&[("a", 1), ("a", 2), ("b", 1), ("c", 1)]));
    f.cleanup().await;
}

/// A discard needs a reason; it removes the dead letters from the outbox, keeps each as a
/// discarded event naming its audit record (the traces show it), and the rows that waited
/// behind them move on.
pub async fn discarded_dead_letters_are_kept_as_discarded_and_unblock_their_aggregate<
    F: StoreFixture,
>() {
    let f = F::new().await;
    let s = f.store();
    let (a1, a2, b1) = (created("a", 1), created("a", 2), created("b", 1));
    let (ia1, ib1) = (a1.event_id, b1.event_id);
    f.enqueue(vec![a1, a2, b1]).await;
    kill(&f, &[(ia1, "schema rejected"), (ib1, "schema rejected")]).await;
    let me = actor();
    let just_a1 = DeadLetterSelection::Ids(vec![ia1]);

    for no_reason in ["", "  "] {
        assert_eq!(
            kind(s.discard_dead_letters(&just_a1, &me, no_reason).await),
            OperatorErrorKind::InvalidRequest
        );
    }
    assert!(
        audit(&s).await.is_empty(),
        "a refused action records nothing"
    );
    let any = DeadLetterFilter::default();
    assert_eq!(dead_letter_ids(&s, &any, 10).await.len(), 2);

    let done = s
        .discard_dead_letters(&just_a1, &me, "obsolete event")
        .await
        .unwrap();
    assert_eq!(done.discarded, 1);
    let r = audited(&s, done.audit_id).await;
    assert_eq!(
        (r.action.as_str(), r.reason.as_str(), r.affected),
        ("discard dead letters", "obsolete event", 1)
    );
    assert_eq!(dead_letter_ids(&s, &any, 10).await, vec![ib1]);
    assert_eq!(kind(s.dead_letter(ia1).await), OperatorErrorKind::NotFound);

    let t = s.trace_event(ia1).await.unwrap();
    assert!(t.outbox.is_none(), "gone from the outbox");
    let d = t.discarded.expect("kept as discarded");
    assert_eq!(
        (d.event_id, d.aggregate_version, d.audit_id),
        (ia1, 1, done.audit_id)
    );
    assert_eq!(
        (d.attempts, d.last_error.as_deref()),
        (1, Some("schema rejected"))
    );
    assert!(
        t.audit.iter().any(|a| a.id == done.audit_id),
        "the trace names the discard"
    );

    assert_eq!(
        claimable(&s).await,
        pairs(&[("a", 2)]),
        "a2 moves on; b still waits"
    );
    let agg = s.trace_aggregate("payment", "a", 10).await.unwrap();
    assert_eq!(trace_versions(&agg), (vec![2], vec![1]));

    let nothing = DeadLetterSelection::Matching(DeadLetterFilter {
        reason_group: Some("no such reason".into()),
        ..DeadLetterFilter::default()
    });
    let none = s
        .discard_dead_letters(&nothing, &me, "cleanup")
        .await
        .unwrap();
    assert_eq!(none.discarded, 0);
    assert!(
        none.audit_id > done.audit_id,
        "recorded even when nothing matched"
    );
    assert_eq!(s.overview().await.unwrap().dead_letters, 1);
    f.cleanup().await;
}

/// Every list takes a limit of 1 to `MAX_LIST`: 0 and `MAX_LIST + 1` are `InvalidRequest` (and
/// so are a count bound below 1, too many conflict ids, and an actor without a name); nothing
/// is recorded.
pub async fn every_list_refuses_a_limit_out_of_range<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let invalid = OperatorErrorKind::InvalidRequest;
    let any = DeadLetterFilter::default();
    let consumers = ConsumerSelection::default();
    for limit in [0, -1, MAX_LIST + 1] {
        assert_eq!(kind(s.dead_letters(&any, limit).await), invalid, "{limit}");
        assert_eq!(
            kind(s.consumer_dead_letters(&consumers, limit).await),
            invalid
        );
        assert_eq!(kind(s.conflicts(None, false, limit).await), invalid);
        assert_eq!(kind(s.work_items(None, limit).await), invalid);
        assert_eq!(kind(s.audit(None, limit).await), invalid);
        assert_eq!(
            kind(s.trace_aggregate("payment", "a", limit).await),
            invalid
        );
    }
    for limit in [1, MAX_LIST] {
        assert!(s.dead_letters(&any, limit).await.unwrap().is_empty());
        assert!(
            s.consumer_dead_letters(&consumers, limit)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(s.conflicts(None, false, limit).await.unwrap().is_empty());
        assert!(s.work_items(None, limit).await.unwrap().is_empty());
        assert!(s.audit(None, limit).await.unwrap().is_empty());
        assert!(
            s.trace_aggregate("payment", "a", limit)
                .await
                .unwrap()
                .outbox
                .is_empty()
        );
    }
    assert_eq!(kind(s.overview_counting(Counting::UpTo(0)).await), invalid);
    assert_eq!(kind(s.routes(0).await), invalid);
    let too_many: Vec<i64> = (1..=MAX_LIST + 1).collect();
    assert_eq!(
        kind(s.resolve_conflicts(&too_many, &actor(), "x").await),
        invalid
    );
    assert_eq!(kind(Actor::new("", "cli")), invalid);
    assert_eq!(kind(Actor::new("bob", "")), invalid);
    assert!(audit(&s).await.is_empty());
    f.cleanup().await;
}

/// Consumer dead letters: listed while open (dead or requeued), by consumer, ids and reason
/// group; grouped by (consumer, reason); read whole in any state; a requeue and a discard take
/// only `dead` ones (a discard needs a reason), each audited; the consumer takes the requeued
/// ones back.
pub async fn consumer_dead_letters_are_listed_grouped_requeued_and_discarded<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let e0 = Uuid::now_v7();
    let body0 = r#"{"amount":17}"#;
    // (consumer, event, aggregate, body, identified, error), oldest first.
    for (consumer, event_id, agg, body, identified, error) in [
        ("ledger", e0, "l0", body0, true, "decode failed at byte 17"),
        (
            "ledger",
            Uuid::now_v7(),
            "l1",
            "{}",
            false,
            "decode failed at byte 42",
        ),
        (
            "ledger",
            Uuid::now_v7(),
            "l2",
            "{}",
            true,
            "handler panicked: boom",
        ),
        ("mail", Uuid::now_v7(), "m0", "{}", true, "template missing"),
    ] {
        consumer_dead(&s, consumer, event_id, agg, body, identified, error).await;
    }
    let all = ConsumerSelection::default();
    let listed = s.consumer_dead_letters(&all, 100).await.unwrap();
    assert_eq!(listed.len(), 4);
    assert!(
        listed
            .windows(2)
            .all(|w| w[0].dead_letter.id < w[1].dead_letter.id),
        "oldest first"
    );
    assert!(listed.iter().all(|l| l.dead_letter.state == "dead"));
    let ids: Vec<i64> = listed.iter().map(|l| l.dead_letter.id).collect();
    let (first, mail) = (&listed[0], &listed[3]);
    assert_eq!(first.dead_letter.consumer_name, "ledger");
    assert_eq!(first.dead_letter.event_id, Some(e0));
    assert_eq!(first.reason, "decode failed at byte #");
    assert_eq!(listed[1].dead_letter.event_id, None, "no identity given");

    let ledger = ConsumerSelection {
        consumer: Some("ledger".into()),
        ..all.clone()
    };
    assert_eq!(
        s.consumer_dead_letters(&ledger, 100).await.unwrap().len(),
        3
    );
    let decode = ConsumerSelection {
        reason_group: Some("decode failed at byte #".into()),
        ..all.clone()
    };
    assert_eq!(
        s.consumer_dead_letters(&decode, 100)
            .await
            .unwrap()
            .iter()
            .map(|l| l.dead_letter.id)
            .collect::<Vec<_>>(),
        ids[..2].to_vec()
    );
    assert_eq!(s.consumer_dead_letters(&all, 1).await.unwrap().len(), 1);

    let groups = s.consumer_dead_letter_groups(&all).await.unwrap();
    assert!(groups.complete);
    assert_eq!(groups.groups.len(), 3, "{groups:?}");
    let g = &groups.groups[0];
    assert_eq!(
        (g.consumer_name.as_str(), g.reason.as_str(), g.count),
        ("ledger", "decode failed at byte #", 2)
    );
    assert_eq!(g.example_error, "decode failed at byte 17");
    assert!(g.first_at <= g.last_at);
    let mail_only = ConsumerSelection {
        consumer: Some("mail".into()),
        ..all.clone()
    };
    assert_eq!(
        s.consumer_dead_letter_groups(&mail_only)
            .await
            .unwrap()
            .groups
            .len(),
        1
    );

    let detail = s.consumer_dead_letter(ids[0]).await.unwrap();
    assert_eq!(detail.dead_letter, listed[0]);
    assert_eq!(detail.payload.text.as_deref(), Some(body0));
    assert_eq!(detail.headers["ce-id"], json!(e0.to_string()));
    assert_eq!(detail.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        kind(s.consumer_dead_letter(ids[3] + 1000).await),
        OperatorErrorKind::NotFound
    );

    let me = actor();
    let only = |id: i64| ConsumerSelection {
        ids: Some(vec![id]),
        ..ConsumerSelection::default()
    };
    assert_eq!(
        s.requeue_consumer_dead_letters(&only(ids[0]), &me, "decoder fixed")
            .await
            .unwrap(),
        1
    );
    let r = last_record(&s).await;
    assert_eq!(
        (r.action.as_str(), r.affected, r.selection.clone()),
        (
            "requeue consumer dead letters",
            1,
            json!({ "ids": [ids[0]] })
        )
    );
    let after = s.consumer_dead_letters(&all, 100).await.unwrap();
    assert_eq!(after.len(), 4, "a requeued letter is still open");
    assert_eq!(after[0].dead_letter.state, "requeued");
    assert_eq!(
        s.requeue_consumer_dead_letters(&only(ids[0]), &me, "again")
            .await
            .unwrap(),
        0,
        "only dead letters are requeued"
    );
    let taken = take_requeued(&s, "ledger", 10).await;
    assert_eq!(taken.iter().map(|t| t.id).collect::<Vec<_>>(), vec![ids[0]]);

    let records = audit(&s).await.len();
    assert_eq!(
        kind(s.discard_consumer_dead_letters(&mail_only, &me, " ").await),
        OperatorErrorKind::InvalidRequest
    );
    assert_eq!(
        audit(&s).await.len(),
        records,
        "a refused action records nothing"
    );
    assert_eq!(
        s.discard_consumer_dead_letters(&mail_only, &me, "template fixed by hand")
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        last_record(&s).await.action,
        "discard consumer dead letters"
    );
    let open = s.consumer_dead_letters(&all, 100).await.unwrap();
    assert_eq!(open.len(), 3, "a resolved letter is not listed");
    assert!(open.iter().all(|l| l.dead_letter.id != mail.dead_letter.id));
    assert_eq!(
        s.consumer_dead_letter(mail.dead_letter.id)
            .await
            .unwrap()
            .dead_letter
            .dead_letter
            .state,
        "resolved",
        "still readable whole"
    );
    assert_eq!(
        s.discard_consumer_dead_letters(&only(ids[0]), &me, "x")
            .await
            .unwrap(),
        0,
        "a requeued letter is the consumer's again"
    );
    assert_eq!(s.overview().await.unwrap().consumer_dead_letters, 3);
    let views = s.consumers().await.unwrap();
    let ledger_view = views
        .iter()
        .find(|c| c.name == "ledger")
        .expect("ledger is known");
    assert_eq!((ledger_view.dead_letters, ledger_view.paused), (3, false));
    assert_eq!(ledger_view.processed_per_minute.len(), MINUTES);
    assert!(
        views.iter().all(|c| c.name != "mail"),
        "nothing open of mail: {views:?}"
    );
    assert_eq!(audit(&s).await.len(), records + 2, "the two discards");
    f.cleanup().await;
}

/// Conflicts: listed newest first (open only, or all; of one event); read with both payloads
/// where the store holds the first; resolved by ids (only open ones counted, the record written
/// even when all were resolved already); refused without ids, without a reason, or when no id
/// is a conflict; the conflicting payload arriving again reopens one.
pub async fn conflicts_are_listed_resolved_and_reopened<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let (id1, id2) = (Uuid::now_v7(), Uuid::now_v7());
    let (body1, body2) = (r#"{"amount":1}"#, r#"{"amount":2}"#);
    f.enqueue(vec![payment(id1, "a", 1, body1)]).await;
    let (e1, e2) = (incoming(id1, "a", 1, body1), incoming(id1, "a", 1, body2));
    assert_eq!(
        record(&s, "c1", OrderingGuard::Off, &e1).await,
        InboxOutcome::New
    );
    for _ in 0..2 {
        assert!(matches!(
            record(&s, "c1", OrderingGuard::Off, &e2).await,
            InboxOutcome::Conflict { .. }
        ));
    }
    for body in ["{}", r#"{"x":1}"#] {
        record(&s, "c2", OrderingGuard::Off, &incoming(id2, "b", 1, body)).await;
    }

    let open = s.conflicts(None, true, 100).await.unwrap();
    assert_eq!(open.len(), 2);
    assert!(open[0].id > open[1].id, "newest first");
    let (ca, cb) = (open[1].clone(), open[0].clone());
    assert_eq!((ca.event_id, cb.event_id), (id1, id2));
    assert_eq!(
        s.conflicts(Some(id1), false, 100).await.unwrap(),
        vec![ca.clone()]
    );
    assert_eq!(s.conflicts(None, true, 1).await.unwrap(), vec![cb.clone()]);
    assert_eq!(
        (
            ca.consumer_name.as_str(),
            ca.aggregate_id.as_str(),
            ca.aggregate_version
        ),
        ("c1", "a", 1)
    );
    assert_eq!(
        (ca.event_type.as_str(), ca.occurrences),
        ("PaymentCreated", 2)
    );
    assert_eq!(ca.stored_sha256, e1.fingerprint.to_hex());
    assert_eq!(ca.received_sha256, e2.fingerprint.to_hex());
    assert!(ca.first_seen <= ca.last_seen);
    assert_eq!((ca.resolved_at, ca.resolved_by.clone()), (None, None));

    let detail = s.conflict(ca.id).await.unwrap();
    assert_eq!(detail.conflict, ca);
    assert_eq!(detail.received_payload.text.as_deref(), Some(body2));
    assert_eq!(
        detail.first_payload.and_then(|p| p.text).as_deref(),
        Some(body1),
        "the producer's row is still held"
    );
    assert_eq!(s.conflict(cb.id).await.unwrap().first_payload, None);
    let stranger = ca.id.max(cb.id) + 1000;
    assert_eq!(
        kind(s.conflict(stranger).await),
        OperatorErrorKind::NotFound
    );

    let me = actor();
    assert_eq!(
        kind(s.resolve_conflicts(&[], &me, "x").await),
        OperatorErrorKind::InvalidRequest
    );
    assert_eq!(
        kind(s.resolve_conflicts(&[ca.id], &me, " ").await),
        OperatorErrorKind::InvalidRequest
    );
    assert_eq!(
        kind(s.resolve_conflicts(&[stranger], &me, "x").await),
        OperatorErrorKind::NotFound
    );
    assert!(audit(&s).await.is_empty(), "refusals record nothing");

    let done = s
        .resolve_conflicts(&[ca.id, stranger], &me, "producer fixed")
        .await
        .unwrap();
    assert_eq!(done.resolved, 1);
    let r = audited(&s, done.audit_id).await;
    assert_eq!(
        (r.action.as_str(), r.affected, r.selection.clone()),
        (
            "resolve conflicts",
            1,
            json!({ "conflicts": [ca.id, stranger] })
        )
    );
    assert_eq!(
        s.conflicts(None, true, 100).await.unwrap(),
        vec![cb.clone()]
    );
    let resolved = s.conflicts(Some(id1), false, 100).await.unwrap();
    assert_eq!(resolved.len(), 1, "still listed among all");
    assert!(resolved[0].resolved_at.is_some());
    assert_eq!(resolved[0].resolved_by.as_deref(), Some("alice"));
    assert_eq!(
        resolved[0].resolution_reason.as_deref(),
        Some("producer fixed")
    );
    assert_eq!(
        s.overview().await.unwrap().inbox_conflicts,
        1,
        "open ones only"
    );

    let again = s.resolve_conflicts(&[ca.id], &me, "again").await.unwrap();
    assert_eq!(again.resolved, 0, "already resolved: not counted");
    assert!(again.audit_id > done.audit_id, "but recorded");
    assert_eq!(last_record(&s).await.affected, 0);

    assert!(matches!(
        record(&s, "c1", OrderingGuard::Off, &e2).await,
        InboxOutcome::Conflict { .. }
    ));
    let reopened = s.conflicts(Some(id1), true, 100).await.unwrap();
    assert_eq!(
        reopened.len(),
        1,
        "the conflicting payload again reopens it"
    );
    assert_eq!((reopened[0].id, reopened[0].occurrences), (ca.id, 3));
    assert_eq!(reopened[0].resolved_at, None);
    let views = s.consumers().await.unwrap();
    for name in ["c1", "c2"] {
        let v = views
            .iter()
            .find(|c| c.name == name)
            .expect("known by its conflict");
        assert_eq!(v.conflicts, 1, "{name}");
    }
    f.cleanup().await;
}

/// Work items: counted by state, listed by state (an unknown state is refused), resolved by
/// hand only from the states each resolution allows (`Refused` otherwise, `NotFound` for no
/// item), reconciled at once only when unknown; every success audited, no refusal.
pub async fn work_items_are_counted_listed_resolved_and_reconciled<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let u = unknown_item(&f, "k-u").await;
    let u2 = unknown_item(&f, "k-u2").await;
    let failed = failed_item(&f, "k-f").await;
    let pending = work_item(&f, "k-p", None).await;
    let stranger = u.max(u2).max(failed).max(pending) + 1000;

    let st = s.work_item_stats(None).await.unwrap();
    assert_eq!(
        (
            st.pending,
            st.in_progress,
            st.unknown,
            st.succeeded,
            st.failed
        ),
        (1, 0, 2, 0, 1)
    );
    assert!(st.oldest_unknown_age.is_some());
    let other = s.work_item_stats(Some("refund")).await.unwrap();
    assert_eq!((other.pending, other.unknown, other.failed), (0, 0, 0));

    let all = s.work_items(None, 100).await.unwrap();
    assert_eq!(
        all.iter().map(|w| w.id).collect::<Vec<_>>(),
        vec![u, u2, failed, pending],
        "oldest first"
    );
    let unknown = s.work_items(Some("unknown"), 100).await.unwrap();
    assert_eq!(
        unknown.iter().map(|w| w.id).collect::<Vec<_>>(),
        vec![u, u2]
    );
    let w = &unknown[0];
    assert_eq!(
        (
            w.kind.as_str(),
            w.idempotency_key.as_str(),
            w.state.as_str()
        ),
        ("payout", "k-u", "unknown")
    );
    assert_eq!(
        (w.consumer_name.as_deref(), w.last_error.as_deref()),
        (Some("c"), Some("lease expired"))
    );
    assert_eq!((w.attempts, w.payload.clone()), (1, json!({"key": "k-u"})));
    assert!(w.unknown_since.is_some());
    assert_eq!(s.work_items(Some("failed"), 1).await.unwrap()[0].id, failed);
    assert_eq!(
        kind(s.work_items(Some("bogus"), 10).await),
        OperatorErrorKind::InvalidRequest
    );

    let me = actor();
    let done = |reference: &str| Resolution::Succeeded {
        reference: reference.into(),
    };
    for (id, resolution) in [
        (pending, done("r")),
        (pending, Resolution::Resend),
        (failed, done("r")),
        (failed, Resolution::Failed { reason: "x".into() }),
    ] {
        assert_eq!(
            kind(s.resolve_work_item(id, resolution, &me, "checked").await),
            OperatorErrorKind::Refused
        );
    }
    assert_eq!(
        kind(
            s.resolve_work_item(stranger, Resolution::Resend, &me, "x")
                .await
        ),
        OperatorErrorKind::NotFound
    );
    assert!(audit(&s).await.is_empty(), "refusals record nothing");

    let resent = s
        .resolve_work_item(failed, Resolution::Resend, &me, "provider fixed")
        .await
        .unwrap();
    assert_eq!((resent.id, resent.state.as_str()), (failed, "pending"));
    assert_eq!(f.work_item(failed).await.state, WorkItemState::Pending);
    let r = last_record(&s).await;
    assert_eq!(
        (r.action.as_str(), r.affected, r.selection.clone()),
        (
            "resolve work item",
            1,
            json!({ "work_item": failed, "resolution": "resend" })
        )
    );
    let gave_up = s
        .resolve_work_item(
            u,
            Resolution::Failed {
                reason: "the provider has no record".into(),
            },
            &me,
            "checked with the provider",
        )
        .await
        .unwrap();
    assert_eq!(gave_up.state, "failed");
    assert_eq!(
        gave_up.last_error.as_deref(),
        Some("the provider has no record")
    );
    assert!(gave_up.resolved_at.is_some());

    // Reconcile now: only an unknown outcome; its lookup is due at once.
    assert!(
        s.work_item_claim(call_claim(ClaimPurpose::Lookup))
            .await
            .unwrap()
            .is_empty(),
        "the lookup is due in an hour"
    );
    for (id, want) in [
        (pending, OperatorErrorKind::Refused),
        (u, OperatorErrorKind::Refused),
        (stranger, OperatorErrorKind::NotFound),
    ] {
        assert_eq!(kind(s.reconcile_work_item(id, &me, "now").await), want);
    }
    let records = audit(&s).await.len();
    s.reconcile_work_item(u2, &me, "customer waiting")
        .await
        .unwrap();
    let r = last_record(&s).await;
    assert_eq!(
        (r.action.as_str(), r.affected, r.selection.clone()),
        ("reconcile work item", 1, json!({ "work_item": u2 }))
    );
    assert_eq!(audit(&s).await.len(), records + 1);
    let looked = s
        .work_item_claim(call_claim(ClaimPurpose::Lookup))
        .await
        .unwrap();
    assert_eq!(
        looked.iter().map(|c| c.item.id).collect::<Vec<_>>(),
        vec![u2]
    );

    // Settling by hand clears the lookup's lease: its late answer is refused.
    let settled = s
        .resolve_work_item(u2, done("ref-9"), &me, "seen in the provider's dashboard")
        .await
        .unwrap();
    assert_eq!(
        (settled.state.as_str(), settled.reference.as_deref()),
        ("succeeded", Some("ref-9"))
    );
    assert_eq!(settled.lease_token, None);
    assert!(
        !s.work_item_record(WorkItemRecordParams {
            id: u2,
            token: looked[0].token,
            claimed_in: WorkItemState::Unknown,
            update: &WorkItemUpdate::Failed {
                reason: "late".into()
            },
            lookups_add: 1,
        })
        .await
        .unwrap()
    );
    let st = s.work_item_stats(Some("payout")).await.unwrap();
    assert_eq!(
        (st.pending, st.unknown, st.succeeded, st.failed),
        (2, 0, 1, 1)
    );
    assert_eq!(audit(&s).await.len(), 4);
    f.cleanup().await;
}

/// A paused route is not claimed: its rows stay pending, an aggregate whose next row goes there
/// waits with all its later rows, and a run stops before its first row on a paused route;
/// resuming hands them out again.
pub async fn a_paused_route_is_not_claimed_and_holds_its_aggregates<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let at = |agg: &str, v: i64, to: Option<&str>| {
        let m = created(agg, v);
        match to {
            Some(d) => m.with_destination(d),
            None => m,
        }
    };
    f.enqueue(vec![
        at("x", 1, None),
        at("x", 2, Some("ledger")),
        at("x", 3, None),
        at("y", 1, Some("ledger")),
        at("y", 2, None),
        at("z", 1, None),
    ])
    .await;
    let me = actor();
    let ledger = PauseTarget::destination("ledger");
    let p = s.pause(&ledger, &me, "broker maintenance").await.unwrap();
    assert_eq!(
        (p.kind.as_str(), p.name.as_str()),
        ("route", "destination:ledger")
    );
    assert_eq!(
        (p.actor.as_deref(), p.reason.as_deref()),
        (Some("alice"), Some("broker maintenance"))
    );
    let r = audited(&s, p.audit_id).await;
    assert_eq!(
        (r.action.as_str(), r.affected, r.selection.clone()),
        ("pause", 1, json!({ "route": "destination:ledger" }))
    );
    assert_eq!(s.pauses().await.unwrap(), vec![p.clone()]);

    let batch = s.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(
        claimed_pairs(&batch.messages),
        pairs(&[("x", 1), ("z", 1)]),
        "x stops before x2; y waits"
    );
    assert_eq!(publish_all(&s, &batch).await, 2);
    assert!(
        claimable(&s).await.is_empty(),
        "x2 and y1 head their aggregates, on the paused route"
    );
    assert_eq!(
        s.overview().await.unwrap().pending,
        4,
        "paused rows stay pending"
    );

    s.resume(&ledger, &me, "maintenance over").await.unwrap();
    let r = last_record(&s).await;
    assert_eq!((r.action.as_str(), r.affected), ("resume", 1));
    assert!(s.pauses().await.unwrap().is_empty());
    let all = pairs(&[("x", 2), ("x", 3), ("y", 1), ("y", 2)]);
    assert_eq!(claimable_sorted(&s).await, all);

    // A type route: the runs stop before their first row without a destination.
    s.pause(&PauseTarget::aggregate_type("payment"), &me, "hold")
        .await
        .unwrap();
    assert_eq!(claimable_sorted(&s).await, pairs(&[("x", 2), ("y", 1)]));
    s.resume(&PauseTarget::aggregate_type("payment"), &me, "go")
        .await
        .unwrap();
    assert_eq!(claimable_sorted(&s).await, all);
    assert_eq!(audit(&s).await.len(), 4);
    f.cleanup().await;
}

/// Pauses are refused twice (`Refused`), without a reason or with a malformed route key
/// (`InvalidRequest`); a resume needs a pause (`NotFound`); a paused consumer is what its
/// engine asks and what the pauses and consumers show; refusals record nothing.
pub async fn pauses_are_checked_and_a_paused_consumer_shows_everywhere<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let me = actor();
    let invalid = OperatorErrorKind::InvalidRequest;
    for bad in ["ledger", "destination:", "type:", "queue:ledger", ""] {
        let target = PauseTarget::Route(bad.into());
        assert_eq!(kind(s.pause(&target, &me, "x").await), invalid, "{bad:?}");
        assert_eq!(kind(s.resume(&target, &me, "x").await), invalid, "{bad:?}");
    }
    assert_eq!(
        kind(
            s.pause(&PauseTarget::Consumer(String::new()), &me, "x")
                .await
        ),
        invalid
    );
    let b = PauseTarget::destination("b");
    assert_eq!(
        kind(s.pause(&b, &me, " ").await),
        invalid,
        "a pause needs a reason"
    );
    assert_eq!(
        kind(s.resume(&b, &me, "x").await),
        OperatorErrorKind::NotFound,
        "not paused"
    );
    assert!(audit(&s).await.is_empty(), "refusals record nothing");

    s.pause(&b, &me, "first").await.unwrap();
    assert_eq!(
        kind(s.pause(&b, &me, "second").await),
        OperatorErrorKind::Refused
    );
    let pauses = s.pauses().await.unwrap();
    assert_eq!(pauses.len(), 1);
    assert_eq!(
        pauses[0].reason.as_deref(),
        Some("first"),
        "the first pause stands"
    );
    s.pause(&PauseTarget::destination("a"), &me, "too")
        .await
        .unwrap();

    assert!(!s.consumer_paused("mailer").await.unwrap());
    let mailer = PauseTarget::Consumer("mailer".into());
    let p = s.pause(&mailer, &me, "smtp down").await.unwrap();
    assert_eq!((p.kind.as_str(), p.name.as_str()), ("consumer", "mailer"));
    assert!(
        s.consumer_paused("mailer").await.unwrap(),
        "its engine sees the pause"
    );
    assert!(!s.consumer_paused("ledger").await.unwrap());
    let pauses = s.pauses().await.unwrap();
    let routes: Vec<&str> = pauses
        .iter()
        .filter(|p| p.kind == "route")
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(routes, vec!["destination:a", "destination:b"], "by name");
    let consumer = pauses
        .iter()
        .find(|p| p.kind == "consumer")
        .expect("the consumer's");
    assert_eq!(consumer, &p);
    let view = s.consumers().await.unwrap();
    let v = view
        .iter()
        .find(|c| c.name == "mailer")
        .expect("known by its pause");
    assert!(v.paused);
    assert_eq!((v.dead_letters, v.conflicts), (0, 0));

    s.resume(&mailer, &me, "smtp back").await.unwrap();
    assert!(!s.consumer_paused("mailer").await.unwrap());
    assert_eq!(
        kind(s.resume(&mailer, &me, "again").await),
        OperatorErrorKind::NotFound
    );
    assert!(
        s.consumers()
            .await
            .unwrap()
            .iter()
            .all(|c| c.name != "mailer")
    );
    let actions: Vec<String> = audit(&s).await.into_iter().map(|a| a.action).collect();
    assert_eq!(actions, vec!["resume", "pause", "pause", "pause"]);
    f.cleanup().await;
}

/// The audit: newest first, ids increasing with time, paged with `before`; each record keeps
/// who (name, via, credential), what, the selection, why and how many.
pub async fn the_audit_lists_newest_first_and_pages_with_before<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let me = actor();
    let (a, b) = (PauseTarget::destination("a"), PauseTarget::destination("b"));
    s.pause(&a, &me, "one").await.unwrap();
    s.pause(&b, &me, "two").await.unwrap();
    assert!(s.pause(&b, &me, "refused").await.is_err());
    s.resume(&a, &me, "three").await.unwrap();
    s.requeue_dead_letters(&DeadLetterSelection::All, &me, "four")
        .await
        .unwrap();

    let all = audit(&s).await;
    assert_eq!(all.len(), 4, "the refused pause left no record");
    let reasons: Vec<&str> = all.iter().map(|a| a.reason.as_str()).collect();
    assert_eq!(reasons, vec!["four", "three", "two", "one"], "newest first");
    assert!(
        all.windows(2)
            .all(|w| w[0].id > w[1].id && w[0].at >= w[1].at)
    );
    let first = &all[3];
    assert_eq!(
        (
            first.actor.as_str(),
            first.via.as_str(),
            first.credential.as_deref()
        ),
        ("alice", "suite", Some("fp-1"))
    );
    assert_eq!((first.action.as_str(), first.affected), ("pause", 1));
    assert_eq!(first.selection, json!({ "route": "destination:a" }));
    assert!(!first.db_role.is_empty());

    let ids: Vec<i64> = all.iter().map(|a| a.id).collect();
    let page = |before: Option<i64>, limit: i64| {
        let s = s.clone();
        async move {
            s.audit(before, limit)
                .await
                .unwrap()
                .iter()
                .map(|a| a.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(page(None, 2).await, ids[..2].to_vec());
    assert_eq!(page(Some(ids[1]), 2).await, ids[2..].to_vec());
    assert_eq!(page(Some(ids[3]), 10).await, Vec::<i64>::new());
    assert_eq!(page(Some(ids[0] + 1), 10).await, ids);
    f.cleanup().await;
}

/// A trace shows everything the store holds of an event (its outbox row, each consumer's inbox
/// record, its conflicts, consumer dead letters, work items, and the audit records naming it),
/// and of an aggregate (its rows by version, each consumer's last applied version).
pub async fn traces_show_an_event_and_an_aggregate_everywhere<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let (id, body) = (Uuid::now_v7(), r#"{"amount":5}"#);
    f.enqueue(vec![payment(id, "t", 1, body), created("t", 2)])
        .await;
    let e = incoming(id, "t", 1, body);
    assert_eq!(
        record(&s, "c1", OrderingGuard::Wait, &e).await,
        InboxOutcome::New
    );
    let changed = incoming(id, "t", 1, r#"{"amount":6}"#);
    record(&s, "c1", OrderingGuard::Wait, &changed).await;
    consumer_dead(&s, "c3", id, "t", body, true, "handler failed").await;
    let item = work_item(&f, "k-t", Some(id)).await;

    let t = s.trace_event(id).await.unwrap();
    assert_eq!(t.event_id, id);
    let row = t.outbox.expect("the outbox row");
    assert_eq!(
        (row.event_id, row.aggregate_version, row.state.as_str()),
        (id, 1, "pending")
    );
    assert_eq!(row.payload_sha256, e.fingerprint.to_hex());
    assert_eq!(
        (row.event_type.as_str(), row.attempts),
        ("PaymentCreated", 0)
    );
    assert!(t.discarded.is_none());
    assert_eq!(t.inbox.len(), 1);
    let i = &t.inbox[0];
    assert_eq!(
        (
            i.consumer_name.as_str(),
            i.outcome.as_str(),
            i.aggregate_version
        ),
        ("c1", "applied", 1)
    );
    assert_eq!(i.payload_sha256, e.fingerprint.to_hex());
    assert_eq!(t.conflicts.len(), 1);
    assert_eq!(t.conflicts[0].consumer_name, "c1");
    assert_eq!(t.consumer_dead_letters.len(), 1);
    assert_eq!(t.consumer_dead_letters[0].consumer_name, "c3");
    assert_eq!(
        t.work_items.iter().map(|w| w.id).collect::<Vec<_>>(),
        vec![item]
    );
    assert!(t.audit.is_empty());

    kill(&f, &[(id, "broker down")]).await;
    let dead = s.trace_event(id).await.unwrap().outbox.expect("still held");
    assert_eq!((dead.state.as_str(), dead.attempts), ("dead", 1));
    assert_eq!(dead.last_error.as_deref(), Some("broker down"));
    s.requeue_dead_letters(&DeadLetterSelection::Ids(vec![id]), &actor(), "retry")
        .await
        .unwrap();
    let t = s.trace_event(id).await.unwrap();
    assert_eq!(t.outbox.map(|o| o.state), Some("pending".to_owned()));
    assert_eq!(t.audit.len(), 1);
    assert_eq!(t.audit[0].action, "requeue dead letters");

    let agg = s.trace_aggregate("payment", "t", 10).await.unwrap();
    assert_eq!(
        (agg.aggregate_type.as_str(), agg.aggregate_id.as_str()),
        ("payment", "t")
    );
    assert_eq!(trace_versions(&agg), (vec![1, 2], vec![]));
    assert_eq!(agg.consumers.len(), 1);
    assert_eq!(
        (
            agg.consumers[0].consumer_name.as_str(),
            agg.consumers[0].last_version
        ),
        ("c1", 1)
    );
    let first = s.trace_aggregate("payment", "t", 1).await.unwrap();
    assert_eq!(
        trace_versions(&first).0,
        vec![1],
        "lowest version first, up to the limit"
    );

    let nothing = s.trace_event(Uuid::now_v7()).await.unwrap();
    assert!(nothing.outbox.is_none() && nothing.discarded.is_none());
    assert!(nothing.inbox.is_empty() && nothing.conflicts.is_empty() && nothing.audit.is_empty());
    assert!(nothing.consumer_dead_letters.is_empty() && nothing.work_items.is_empty());
    f.cleanup().await;
}

/// Replays follow the store's publish mode: a store that keeps no published rows refuses every
/// replay (`Refused`, nothing recorded); one that keeps them (mark mode) says in a dry run what
/// it would take, refuses a changed count, a version below 1, no reason and an unknown
/// aggregate, and replays the published rows under their own ids, audited.
pub async fn replays_follow_the_stores_publish_mode<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let (r1, r2) = (created("r", 1), created("r", 2));
    let published = vec![r1.event_id, r2.event_id];
    f.enqueue(vec![r1, r2]).await;
    let batch = s.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(publish_all(&s, &batch).await, 2);
    let me = actor();
    let which = ReplaySelection {
        aggregate_type: "payment".into(),
        aggregate_id: "r".into(),
        from_version: None,
    };
    let now = chrono::Utc::now();
    let range = RangeSelection {
        created_after: now - chrono::Duration::hours(1),
        created_before: now + chrono::Duration::hours(1),
        aggregate_type: None,
        destination: None,
    };
    let empty_range = RangeSelection {
        created_after: now,
        created_before: now,
        ..range.clone()
    };

    if s.overview().await.unwrap().published_retained == 0 {
        // Delete mode: nothing to replay from.
        for dry_run in [true, false] {
            assert_eq!(
                kind(s.replay(&which, dry_run, None, &me, "rebuild").await),
                OperatorErrorKind::Refused
            );
            assert_eq!(
                kind(s.replay_range(&range, dry_run, None, &me, "rebuild").await),
                OperatorErrorKind::Refused
            );
        }
        assert!(audit(&s).await.is_empty());
        assert!(claimable(&s).await.is_empty());
        f.cleanup().await;
        return;
    }

    // Mark mode.
    let plan = s.replay(&which, true, None, &me, "").await.unwrap();
    assert_eq!(
        (
            plan.events,
            plan.lowest_version_held,
            plan.newest_version_held,
            plan.dry_run
        ),
        (2, Some(1), Some(2), true)
    );
    assert!(plan.first_published_at.is_some());
    assert!(audit(&s).await.is_empty(), "a dry run records nothing");
    let from_zero = ReplaySelection {
        from_version: Some(0),
        ..which.clone()
    };
    let unknown = ReplaySelection {
        aggregate_id: "nobody".into(),
        ..which.clone()
    };
    use OperatorErrorKind::{InvalidRequest, NotFound, Refused};
    // (selection, dry run, expected count, reason, refusal, why).
    for (selection, dry_run, count, reason, want, why) in [
        (
            &which,
            false,
            Some(3),
            "rebuild",
            Refused,
            "the count changed",
        ),
        (
            &from_zero,
            false,
            None,
            "rebuild",
            InvalidRequest,
            "a version below 1",
        ),
        (&which, false, None, " ", InvalidRequest, "no reason"),
        (
            &unknown,
            true,
            None,
            "rebuild",
            NotFound,
            "an unknown aggregate",
        ),
    ] {
        let refused = s.replay(selection, dry_run, count, &me, reason).await;
        assert_eq!(kind(refused), want, "{why}");
    }
    assert_eq!(
        kind(
            s.replay_range(&empty_range, true, None, &me, "rebuild")
                .await
        ),
        OperatorErrorKind::InvalidRequest
    );
    assert!(audit(&s).await.is_empty(), "refusals record nothing");
    let done = s
        .replay(&which, false, Some(2), &me, "rebuild")
        .await
        .unwrap();
    assert_eq!((done.events, done.dry_run), (2, false));
    let r = last_record(&s).await;
    assert_eq!((r.action.as_str(), r.affected), ("replay", 2));
    let batch = s.claim_batch(claim(100, 30_000)).await.unwrap();
    let republished: Vec<EventId> = batch.messages.iter().map(|m| m.event_id).collect();
    assert_eq!(
        republished, published,
        "republished under their own ids, in version order"
    );
    f.cleanup().await;
}

/// Routes count pending rows (and the oldest one's age) and dead letters per route among the
/// oldest `bound` rows, busiest first, with a per-minute series; a bound below 1 is refused; a
/// fresh store runs no process.
pub async fn routes_count_pending_and_dead_rows_per_route<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    assert!(s.instances().await.unwrap().is_empty());
    let empty = s.routes(10).await.unwrap();
    assert!(empty.routes.is_empty() && empty.complete);
    let d1 = event("order", "d", 1, "OrderPlaced");
    let dead = d1.event_id;
    f.enqueue(vec![d1]).await;
    kill(&f, &[(dead, "refused")]).await;
    f.enqueue(vec![
        created("p", 1),
        created("q", 1),
        created("l", 1).with_destination("ledger"),
    ])
    .await;

    let routes = s.routes(100).await.unwrap();
    assert!(routes.complete);
    assert_eq!(routes.counted_up_to, 100);
    let got: Vec<(Option<&str>, Option<&str>, i64, i64)> = routes
        .routes
        .iter()
        .map(|r| {
            (
                r.destination.as_deref(),
                r.aggregate_type.as_deref(),
                r.pending,
                r.dead_letters,
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (None, Some("payment"), 2, 0),
            (Some("ledger"), None, 1, 0),
            (None, Some("order"), 0, 1),
        ],
        "busiest first"
    );
    assert!(
        routes
            .routes
            .iter()
            .all(|r| r.published_per_minute.len() == MINUTES)
    );
    assert!(routes.routes[0].oldest_pending_age_seconds >= 0.0);
    assert_eq!(routes.routes[2].oldest_pending_age_seconds, 0.0);

    let bounded = s.routes(1).await.unwrap();
    assert!(!bounded.complete, "more rows than the bound");
    assert_eq!(bounded.counted_up_to, 1);
    assert_eq!(bounded.routes.iter().map(|r| r.pending).sum::<i64>(), 1);
    assert_eq!(
        bounded.routes.iter().map(|r| r.dead_letters).sum::<i64>(),
        1
    );
    f.cleanup().await;
}

/// Expands to one `#[tokio::test]` per case of the operator conformance suite for the
/// [`StoreFixture`] `$fixture`, whose store implements [`OperatorStore`].
#[macro_export]
macro_rules! operator_suite {
    ($fixture:ty) => {
        $crate::__fixture_cases!(operator, $fixture;
            overview_counts_what_waits_and_what_failed,
            dead_letters_are_listed_filtered_grouped_and_read_whole,
            requeued_dead_letters_are_claimable_again_and_audited,
            discarded_dead_letters_are_kept_as_discarded_and_unblock_their_aggregate,
            every_list_refuses_a_limit_out_of_range,
            consumer_dead_letters_are_listed_grouped_requeued_and_discarded,
            conflicts_are_listed_resolved_and_reopened,
            work_items_are_counted_listed_resolved_and_reconciled,
            pauses_are_checked_and_a_paused_consumer_shows_everywhere,
            the_audit_lists_newest_first_and_pages_with_before,
            traces_show_an_event_and_an_aggregate_everywhere,
            replays_follow_the_stores_publish_mode,
            routes_count_pending_and_dead_rows_per_route,
        );
    };
}
