//! The store conformance suite: one case per promise of the store traits (claim, lease,
//! fencing, late commits, order, dead letters, inbox, conflicts, consumer dead letters, work
//! items, maintenance), generic over a [`StoreFixture`]. A store crate runs it in one line:
//!
//! ```ignore
//! outbox_testkit::store_suite!(MyFixture);
//! ```
//!
//! which expands to one `#[tokio::test]` per case (so each is reported and runs in parallel).

use std::time::Duration;

use outbox_core::consumer::{
    ConsumerDeadLetterState, InboxOutcome, InboxStore, OrderingGuard, RawMessage,
};
use outbox_core::effect::{
    ClaimPurpose, WorkItemClaimParams, WorkItemRecordParams, WorkItemState, WorkItemStore,
    WorkItemUpdate,
};
use outbox_core::maintenance::MaintenanceStore;
use outbox_core::operator::{Actor, DeadLetterFilter, DeadLetterOps as _, DeadLetterSelection};
use outbox_core::{
    ClaimParams, ClaimScope, ClaimedBatch, EventIdentity, IncomingEvent, NewMessage, OutboxStore,
    Payload,
};
use uuid::Uuid;

use crate::fakes::{decode_wire, event_message, wire_message};
use crate::fixture::StoreFixture;
/// A paused route holds its rows and their aggregates back from claims (the claim contract's
/// pause rule), and a resume hands them out again; paused by the operator contract.
pub use crate::operator::a_paused_route_is_not_claimed_and_holds_its_aggregates;
use crate::support::{
    batch_ids, enqueue_work_item, mark_published, old_and_young_inbox, payout_item, publish_all,
    record, record_call, record_failure, release, release_all, row_id, take_requeued,
    write_consumer_dead_letters,
};

/// A `payment` event of aggregate `agg` at `version` with an empty JSON object.
pub fn msg(agg: &str, version: i64) -> NewMessage {
    NewMessage::new(
        "payment",
        agg,
        version,
        "PaymentCreated",
        Payload::json(&serde_json::json!({"agg": agg, "v": version})).expect("json"),
    )
}

/// Claim parameters: at most `max_rows`, 100 per aggregate, a lease of `lease_ms`.
pub fn claim(max_rows: usize, lease_ms: u64) -> ClaimParams {
    ClaimParams {
        max_rows,
        max_per_aggregate: 100,
        lease: Duration::from_millis(lease_ms),
        scope: Default::default(),
    }
}

/// The event a consumer would decode for `event_id` of `agg` at `version` with `body`.
pub fn incoming(event_id: Uuid, agg: &str, version: i64, body: &str) -> IncomingEvent {
    decode_wire(&wire_message(&event_message(event_id, agg, version, body))).expect("decodes")
}

fn versions(messages: &[outbox_core::OutboxMessage], agg: &str) -> Vec<i64> {
    messages
        .iter()
        .filter(|m| m.aggregate_id == agg)
        .map(|m| m.aggregate_version)
        .collect()
}

/// A takeover as [`takeovers`] lists it: the head's aggregate id and version, and the count.
type TakenOver = (String, i64, u32);

fn at(agg: &str, version: i64, count: u32) -> TakenOver {
    (agg.to_owned(), version, count)
}

/// The takeovers a claim reports, sorted.
fn takeovers(b: &ClaimedBatch) -> Vec<TakenOver> {
    let mut t: Vec<TakenOver> = b
        .takeovers
        .iter()
        .map(|t| {
            let head = b.messages.iter().find(|m| m.id == t.head).expect("head");
            at(&head.aggregate_id, head.aggregate_version, t.count)
        })
        .collect();
    t.sort();
    t
}

/// Each aggregate's versions come in version order, whatever the insert order; a leased
/// aggregate is not handed to a second claim (not even its new versions); the per-aggregate and
/// total caps cut runs into prefixes.
pub async fn claims_hand_out_each_aggregate_in_version_order_to_one_claim_at_a_time<
    F: StoreFixture,
>() {
    let f = F::new().await;
    let store = f.store();
    f.enqueue(vec![msg("a", 2), msg("a", 1), msg("a", 3), msg("b", 1)])
        .await;
    let first = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(versions(&first.messages, "a"), vec![1, 2, 3]);
    assert_eq!(first.messages.len(), 4);

    f.enqueue(vec![msg("a", 4)]).await;
    let second = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert!(second.messages.is_empty(), "{:?}", second.messages);

    release_all(&store, &first).await;
    let small = store
        .claim_batch(ClaimParams {
            max_rows: 10,
            max_per_aggregate: 2,
            lease: Duration::from_secs(30),
            scope: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(versions(&small.messages, "a"), vec![1, 2]);
    release_all(&store, &small).await;
    let capped = store.claim_batch(claim(3, 30_000)).await.unwrap();
    assert_eq!(capped.messages.len(), 3, "the total cap holds");
    f.cleanup().await;
}

/// Once a lease expired and another claim took the aggregate over, the old token can neither
/// mark nor fail its rows; the new token can.
pub async fn a_stale_worker_cannot_settle_after_another_took_over<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    f.enqueue(vec![msg("a", 1)]).await;
    let stale = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(stale.messages.len(), 1);
    f.expire_relay_leases().await;
    let fresh = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(fresh.messages.len(), 1, "an expired lease is taken over");
    assert!(fresh.token > stale.token, "tokens only grow");
    let ids = [stale.messages[0].id];
    let n = mark_published(&store, stale.token, &ids).await;
    assert_eq!(n, 0, "a stale mark must change nothing");
    let failed = record_failure(&store, stale.token, ids[0], "x", None).await;
    assert!(!failed, "a stale failure record must change nothing");
    assert_eq!(store.stats().await.unwrap().pending, 1);
    assert_eq!(mark_published(&store, fresh.token, &ids).await, 1);
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.dead), (0, 0));
    f.cleanup().await;
}

/// A claim that takes an aggregate over from an expired, unsettled lease reports it: 1 the
/// first time, +1 for each further takeover with the same head, 1 again when the head moved
/// on; a settled claim (release) ends the count. A free aggregate is not a takeover.
pub async fn takeovers_are_counted_per_head_and_end_with_a_settled_claim<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    f.enqueue(vec![msg("a", 1), msg("a", 2), msg("b", 1)]).await;
    let first = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert!(
        first.takeovers.is_empty(),
        "free aggregates: {:?}",
        first.takeovers
    );
    // The holder dies twice in a row without settling: counted 1, then 2, on both heads.
    f.expire_relay_leases().await;
    let second = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(takeovers(&second), [at("a", 1, 1), at("b", 1, 1)]);
    f.expire_relay_leases().await;
    let third = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(takeovers(&third), [at("a", 1, 2), at("b", 1, 2)]);
    // a's head is published by the holder, who then dies before releasing: the next takeover
    // of a has a new head (count 1); b's head did not move (count 3).
    let a1 = row_id(&third, "a", 1);
    assert_eq!(mark_published(&store, third.token, &[a1]).await, 1);
    f.expire_relay_leases().await;
    let fourth = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(takeovers(&fourth), [at("a", 2, 1), at("b", 1, 3)]);
    // A settled claim ends the lease and its count.
    release_all(&store, &fourth).await;
    let fifth = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(fifth.messages.len(), 2);
    assert!(fifth.takeovers.is_empty(), "{:?}", fifth.takeovers);
    f.cleanup().await;
}

/// The claim scopes of the poison-row rule. A `Free` claim takes free aggregates and first
/// takeovers (counting 1), grouped; an aggregate whose takeover expired unsettled again is
/// left to `TakeOver` claims, which hand it out alone, its head row only, counting on.
pub async fn solo_takeovers_hand_out_one_expired_head_at_a_time<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let scoped = async |scope| {
        let params = ClaimParams {
            max_rows: 10,
            max_per_aggregate: 10,
            lease: Duration::from_secs(30),
            scope,
        };
        store.claim_batch(params).await.unwrap()
    };
    f.enqueue(vec![msg("a", 1), msg("a", 2), msg("b", 1), msg("c", 1)])
        .await;
    let first = scoped(ClaimScope::Free).await;
    assert_eq!(first.messages.len(), 4);
    assert!(first.takeovers.is_empty());
    // c is published, then the holder dies without releasing anything.
    mark_published(&store, first.token, &[row_id(&first, "c", 1)]).await;
    f.expire_relay_leases().await;

    // First takeovers go with the rest, grouped.
    f.enqueue(vec![msg("d", 1)]).await;
    let retake = scoped(ClaimScope::Free).await;
    assert_eq!(retake.messages.len(), 4, "{:?}", retake.messages);
    assert_eq!(
        takeovers(&retake),
        [at("a", 1, 1), at("b", 1, 1)],
        "a and b were taken over once, d was free"
    );
    let none = scoped(ClaimScope::TakeOver).await;
    assert!(none.messages.is_empty(), "live leases: {:?}", none.messages);

    // That holder dies too: a and b are left to solo takeovers; d (a first takeover) is not.
    f.expire_relay_leases().await;
    let free = scoped(ClaimScope::Free).await;
    assert_eq!(takeovers(&free), [at("d", 1, 1)], "{:?}", free.messages);
    assert_eq!(free.messages.len(), 1);
    release(&store, free.token, &[]).await;
    let mut heads = Vec::new();
    for _ in 0..2 {
        let solo = scoped(ClaimScope::TakeOver).await;
        let head = &solo.messages;
        assert_eq!(head.len(), 1, "its head alone: {head:?}");
        let c = takeovers(&solo);
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].1, c[0].2),
            (1, 2),
            "the head, taken over twice: {c:?}"
        );
        heads.push(c[0].0.clone());
    }
    heads.sort();
    assert_eq!(heads, ["a", "b"]);
    let none = scoped(ClaimScope::TakeOver).await;
    assert!(none.messages.is_empty(), "{:?}", none.messages);

    // Their solo holders die as well: the same heads count 3. b's holder had published b's
    // only row before it died.
    f.expire_relay_leases().await;
    for _ in 0..2 {
        let solo = scoped(ClaimScope::TakeOver).await;
        assert_eq!(solo.takeovers.len(), 1, "{:?}", solo.messages);
        assert_eq!(solo.takeovers[0].count, 3);
        if solo.messages[0].aggregate_id == "b" {
            let marked = mark_published(&store, solo.token, &[solo.messages[0].id]).await;
            assert_eq!(marked, 1);
        }
    }
    // The next solo claim takes a again and clears b's lease, which has nothing left: b's
    // new event goes to a normal claim.
    f.expire_relay_leases().await;
    let solo = scoped(ClaimScope::TakeOver).await;
    assert_eq!(takeovers(&solo), [at("a", 1, 4)]);
    f.enqueue(vec![msg("b", 2)]).await;
    let b = scoped(ClaimScope::Free).await;
    assert_eq!(versions(&b.messages, "b"), [2], "{:?}", b.messages);
    release(&store, b.token, &[]).await;

    // c's expired lease (nothing left to publish) does not keep its new event from a claim.
    f.enqueue(vec![msg("c", 2)]).await;
    let c = scoped(ClaimScope::Free).await;
    assert_eq!(versions(&c.messages, "c"), [2], "{:?}", c.messages);
    f.cleanup().await;
}

/// A dead letter parks only its own aggregate (and says what waits behind it); a requeue
/// brings it back first, in order; a row in backoff is not claimable before its time.
pub async fn dead_letters_and_backoff_park_only_their_aggregate<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    f.enqueue(vec![msg("a", 1), msg("a", 2), msg("b", 1)]).await;
    let b = store.claim_batch(claim(10, 30_000)).await.unwrap();
    let a1 = row_id(&b, "a", 1);
    let rest: Vec<i64> = batch_ids(&b).into_iter().filter(|id| *id != a1).collect();
    assert!(record_failure(&store, b.token, a1, "too large", None).await);
    release(&store, b.token, &rest).await;
    let b2 = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(b2.messages.len(), 1, "{:?}", b2.messages);
    assert_eq!(b2.messages[0].aggregate_id, "b");
    publish_all(&store, &b2).await;
    let dead = store
        .dead_letters(&DeadLetterFilter::default(), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].blocked_behind, 1);
    assert_eq!(dead[0].attempts, 1);
    assert_eq!(dead[0].last_error.as_deref(), Some("too large"));
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.dead, stats.pending), (1, 1));

    let n = store
        .requeue_dead_letters(
            &DeadLetterSelection::Ids(vec![dead[0].event_id]),
            &Actor::new("suite", "test").unwrap(),
            "store suite",
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let b3 = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(versions(&b3.messages, "a"), vec![1, 2]);
    assert_eq!(b3.messages[0].attempts, 0, "a requeue resets the attempts");

    let (first, later) = (b3.messages[0].id, &batch_ids(&b3)[1..]);
    let backoff = Some(Duration::from_millis(300));
    record_failure(&store, b3.token, first, "down", backoff).await;
    release(&store, b3.token, later).await;
    let during = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert!(during.messages.is_empty(), "{:?}", during.messages);
    release(&store, during.token, &[]).await;
    let s = store.stats().await.unwrap();
    assert_eq!(s.retrying, 1);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let b4 = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(versions(&b4.messages, "a"), vec![1, 2]);
    assert_eq!(b4.messages[0].attempts, 1);
    f.cleanup().await;
}

/// A producer transaction that took its row id first but commits last is claimed once it
/// commits: nothing is skipped by a read cursor (G2).
pub async fn a_late_commit_is_claimed_after_later_ones<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let held = f.enqueue_held(vec![msg("t1", 1)]).await;
    f.enqueue(vec![msg("t2", 1)]).await;
    let b = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(b.messages.len(), 1, "uncommitted rows are invisible");
    assert_eq!(b.messages[0].aggregate_id, "t2");
    publish_all(&store, &b).await;
    held.commit().await;
    let b = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(b.messages.len(), 1);
    assert_eq!(b.messages[0].aggregate_id, "t1");
    f.cleanup().await;
}

/// A claimed row carries exactly what the producer wrote (the same event id on every claim).
pub async fn a_claimed_row_is_what_the_producer_wrote<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let m = msg("a", 1)
        .with_header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .with_partition_key("p-1");
    f.enqueue(vec![m.clone()]).await;
    let b = store.claim_batch(claim(10, 30_000)).await.unwrap();
    let got = &b.messages[0];
    assert_eq!(got.event_id, m.event_id);
    assert_eq!(got.payload.bytes, m.payload.bytes);
    assert_eq!(got.payload.content_type, m.payload.content_type);
    assert_eq!(got.fingerprint, m.payload.fingerprint());
    assert_eq!(got.headers, m.headers);
    assert_eq!(got.partition_key(), "p-1");
    assert_eq!(got.attempts, 0);
    record_failure(&store, b.token, got.id, "down", Some(Duration::ZERO)).await;
    release(&store, b.token, &[]).await;
    let again = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(
        again.messages[0].event_id, m.event_id,
        "same id on retry (G4)"
    );
    assert_eq!(again.messages[0].attempts, 1);
    f.cleanup().await;
}

/// The inbox: a redelivery is a duplicate; the same id with another payload is a conflict,
/// recorded; a rolled-back record leaves nothing; two consumers each record the event.
pub async fn inbox_absorbs_duplicates_and_records_conflicts<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let id = Uuid::now_v7();
    let e = incoming(id, "a", 1, r#"{"amount":1}"#);
    let other = incoming(id, "a", 1, r#"{"amount":2}"#);

    let mut tx = store.begin().await.unwrap();
    let rolled_back = store.inbox_record(&mut tx, "c1", OrderingGuard::Off, &e);
    assert_eq!(rolled_back.await.unwrap(), InboxOutcome::New);
    store.rollback(tx).await.unwrap();

    let conflict = InboxOutcome::Conflict {
        stored: e.fingerprint,
    };
    for (want, event) in [
        (InboxOutcome::New, &e),
        (InboxOutcome::Duplicate, &e),
        (conflict, &other),
        (conflict, &other),
    ] {
        assert_eq!(record(&store, "c1", OrderingGuard::Off, event).await, want);
    }
    let conflicts = f.conflict_count().await;
    assert_eq!(conflicts, 1, "one conflict record, seen twice");
    assert_eq!(
        record(&store, "c2", OrderingGuard::Off, &e).await,
        InboxOutcome::New,
        "another consumer records the event for itself"
    );
    assert_eq!(f.inbox_len().await, 2);
    f.cleanup().await;
}

/// Two transactions recording the same event at once meet: exactly one sees `New`.
pub async fn concurrent_records_of_one_event_give_one_new<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let e = incoming(Uuid::now_v7(), "a", 1, "{}");
    let run = |store: F::Store, e: IncomingEvent| async move {
        let mut tx = store.begin().await.unwrap();
        let outcome = store
            .inbox_record(&mut tx, "c", OrderingGuard::Off, &e)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.commit(tx).await.unwrap();
        outcome
    };
    let (a, b) = tokio::join!(
        tokio::spawn(run(store.clone(), e.clone())),
        tokio::spawn(run(store.clone(), e.clone()))
    );
    let mut outcomes = vec![a.unwrap(), b.unwrap()];
    outcomes.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(outcomes, vec![InboxOutcome::Duplicate, InboxOutcome::New]);
    f.cleanup().await;
}

/// The ordering guard: `Wait` absorbs older versions as stale and reports a gap (without
/// moving the mark); `ApplyAnyway` applies across a gap.
pub async fn ordering_guard_absorbs_stale_versions_and_reports_gaps<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let record = |guard: OrderingGuard, e: IncomingEvent, consumer: &'static str| {
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.unwrap();
            let o = store
                .inbox_record(&mut tx, consumer, guard, &e)
                .await
                .unwrap();
            if matches!(o, InboxOutcome::Gap { .. }) {
                store.rollback(tx).await.unwrap();
            } else {
                store.commit(tx).await.unwrap();
            }
            o
        }
    };
    let v = |n: i64| incoming(Uuid::now_v7(), "agg", n, &format!("{{\"v\":{n}}}"));
    use InboxOutcome::{Gap, New, Stale};
    use OrderingGuard::{ApplyAnyway, Wait};
    // (guard, version, consumer, outcome, why), in order.
    for (guard, n, consumer, want, why) in [
        (
            Wait,
            2,
            "w",
            Gap { last_applied: 0 },
            "a first-seen aggregate must start at version 1",
        ),
        (Wait, 1, "w", New, "the version it waited for"),
        (Wait, 2, "w", New, "the next version"),
        (Wait, 1, "w", Stale { last_applied: 2 }, "an older version"),
        (
            Wait,
            4,
            "w",
            Gap { last_applied: 2 },
            "a version beyond the next",
        ),
        (ApplyAnyway, 3, "a", New, "applied across a gap"),
        (
            ApplyAnyway,
            1,
            "a",
            Stale { last_applied: 3 },
            "an older version",
        ),
    ] {
        let got = record(guard, v(n), consumer).await;
        assert_eq!(got, want, "{why}: {consumer} at version {n}");
    }
    f.cleanup().await;
}

/// Recording many events at once decides exactly as recording them one by one, ids repeated
/// inside the batch included.
pub async fn record_many_decides_as_record_one_by_one<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let known = incoming(Uuid::now_v7(), "k", 1, r#"{"k":1}"#);
    record(&store, "c", OrderingGuard::Off, &known).await;
    let fresh = incoming(Uuid::now_v7(), "f", 1, r#"{"f":1}"#);
    let clash = incoming(known.event_id, "k", 1, r#"{"k":2}"#);
    let fresh_clash = incoming(fresh.event_id, "f", 1, r#"{"f":2}"#);
    let batch = [&fresh, &known, &fresh, &clash, &fresh_clash];
    let mut tx = store.begin().await.unwrap();
    let got = store.inbox_record_many(&mut tx, "c", &batch).await.unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!(
        got,
        vec![
            InboxOutcome::New,
            InboxOutcome::Duplicate,
            InboxOutcome::Duplicate,
            InboxOutcome::Conflict {
                stored: known.fingerprint
            },
            InboxOutcome::Conflict {
                stored: fresh.fingerprint
            },
        ]
    );
    assert_eq!(f.conflict_count().await, 2);
    f.cleanup().await;
}

/// Consumer dead letters: written with the transaction, counted until resolved, handed back by
/// a requeue least recently updated first, settled only while requeued.
pub async fn consumer_dead_letters_are_kept_requeued_and_settled<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let raw = |n: i64| wire_message(&event_message(Uuid::now_v7(), "a", n, "{}"));
    let (r1, r2) = (raw(1), raw(2));
    let none = EventIdentity::default();
    let write = async || {
        let letters = [(&r1, &none), (&r2, &none)];
        write_consumer_dead_letters(&store, "c", &letters, "malformed: test", 3)
            .await
            .unwrap()
    };
    drop(write().await);
    assert_eq!(
        store.consumer_dead_letter_count("c").await.unwrap(),
        0,
        "dropping the transaction rolled it back"
    );
    store.commit(write().await).await.unwrap();
    assert_eq!(store.consumer_dead_letter_count("c").await.unwrap(), 2);
    assert_eq!(store.consumer_dead_letter_count("other").await.unwrap(), 0);
    let letters = f.consumer_dead_letters("c").await;
    assert_eq!(letters.len(), 2);
    assert!(letters.iter().all(|d| d.state == "dead" && d.attempts == 3));

    // Nothing is requeued yet.
    assert!(take_requeued(&store, "c", 10).await.is_empty());
    assert_eq!(f.requeue_consumer_dead_letters("c").await, 2);

    // The first one taken is tried and is still waiting: it goes to the back.
    let mut tx = store.begin().await.unwrap();
    let first = store
        .consumer_dead_letter_take_requeued(&mut tx, "c", 1)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].raw, r1, "the raw message is kept as received");
    store
        .consumer_dead_letter_settle(
            &mut tx,
            first[0].id,
            ConsumerDeadLetterState::Requeued,
            None,
        )
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    let next = store
        .consumer_dead_letter_take_requeued(&mut tx, "c", 1)
        .await
        .unwrap();
    assert_eq!(next[0].raw, r2, "least recently updated first");
    store
        .consumer_dead_letter_settle(&mut tx, next[0].id, ConsumerDeadLetterState::Resolved, None)
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    // A settle of a letter that is no longer requeued changes nothing.
    let mut tx = store.begin().await.unwrap();
    store
        .consumer_dead_letter_settle(
            &mut tx,
            next[0].id,
            ConsumerDeadLetterState::Dead,
            Some("late"),
        )
        .await
        .unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!(store.consumer_dead_letter_count("c").await.unwrap(), 1);
    let letters = f.consumer_dead_letters("c").await;
    let resolved = letters.iter().find(|d| d.id == next[0].id).unwrap();
    assert_eq!(
        (resolved.state.as_str(), resolved.attempts),
        ("resolved", 4)
    );
    f.cleanup().await;
}

/// A consumer dead letter keeps the message byte for byte, whatever it holds (NUL and control
/// characters in the content type, a header name and a value, a header value that is not
/// UTF-8, header names that are not UTF-8 (kept under [`RawMessage::header_key`]), a body that
/// is not text, broker metadata), with the decoded event's fields when given. Metadata holding NUL is accepted too (a store may show it otherwise: it is for the
/// operator, never decoded).
pub async fn consumer_dead_letters_keep_the_message_byte_for_byte<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let id = Uuid::now_v7();
    let mut raw = wire_message(&event_message(id, "a", 1, "{}"));
    raw.content_type = Some("text/plain\0\u{7}; x=\u{1b}".into());
    raw.headers
        .insert("x-\0name".into(), "\0\r\n\u{1b}[0m".into());
    raw.binary_headers.insert(
        "x-binary".into(),
        bytes::Bytes::from_static(&[0, 0xff, 0xc3]),
    );
    for (name, value) in [(&b"\xff\xfe"[..], &b"text"[..]), (b"x-%\xc3", b"\xff")] {
        raw.binary_headers.insert(
            RawMessage::header_key(name).into_owned(),
            bytes::Bytes::copy_from_slice(value),
        );
    }
    raw.payload = bytes::Bytes::from_static(&[0, 0xff, 0xfe, b'\n']);
    raw.metadata.insert("subject".into(), "payments.a".into());
    let mut nul_metadata = raw.clone();
    nul_metadata
        .metadata
        .insert("routing_key".into(), "a\0b".into());
    let identity = EventIdentity::of(&incoming(id, "a", 1, "{}"));
    let letters = [
        (&raw, &identity),
        (&nul_metadata, &EventIdentity::default()),
    ];
    let tx = write_consumer_dead_letters(&store, "c", &letters, "malformed: test", 1)
        .await
        .expect("a dead letter is never refused for what the message holds");
    store.commit(tx).await.unwrap();
    let letters = f.consumer_dead_letters("c").await;
    assert_eq!(letters.len(), 2);
    assert_eq!(letters[0].event_id, Some(id));
    assert_eq!(letters[0].aggregate_id.as_deref(), Some("a"));
    assert_eq!(letters[1].event_id, None);

    assert_eq!(f.requeue_consumer_dead_letters("c").await, 2);
    let taken = take_requeued(&store, "c", 10).await;
    assert_eq!(taken.len(), 2);
    assert_eq!(taken[0].raw, raw, "kept byte for byte");
    let mut second = taken[1].raw.clone();
    assert!(second.metadata.remove("routing_key").is_some());
    assert_eq!(second, raw, "kept byte for byte, metadata aside");
    f.cleanup().await;
}

/// Work items: a claim takes each due item once and counts the attempt; records are fenced by
/// token and claimed state; an expired call lease goes to `unknown`, never back to `pending`;
/// the backlog counts the open states.
pub async fn work_items_are_claimed_once_and_recorded_under_their_lease<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let a = enqueue_work_item(&f, &payout_item("k-a", None)).await;
    let b = enqueue_work_item(&f, &payout_item("k-b", None)).await;
    let params = |purpose| WorkItemClaimParams {
        kind: "payout",
        purpose,
        limit: 10,
        lease: Duration::from_secs(30),
    };
    let claim_items = async |params| store.work_item_claim(params).await.unwrap();
    let other_kind = claim_items(WorkItemClaimParams {
        kind: "refund",
        ..params(ClaimPurpose::Call)
    })
    .await;
    assert!(other_kind.is_empty(), "a claim takes only its kind");
    let claimed = claim_items(params(ClaimPurpose::Call)).await;
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|c| c.item.attempts == 1));
    assert_ne!(
        claimed[0].token, claimed[1].token,
        "one token per claimed item"
    );
    assert!(
        claim_items(params(ClaimPurpose::Call)).await.is_empty(),
        "in progress items are not claimed again"
    );
    let backlog = store.work_item_backlog(Some("payout")).await.unwrap();
    assert_eq!((backlog.pending, backlog.in_progress), (0, 2));

    let ca = claimed.iter().find(|c| c.item.id == a).unwrap();
    let cb = claimed.iter().find(|c| c.item.id == b).unwrap();
    let done = WorkItemUpdate::Succeeded {
        reference: "ref-a".into(),
    };
    for (token, taken, why) in [
        (cb.token, false, "another claim's token is refused"),
        (ca.token, true, "the claim's own token records"),
        (
            ca.token,
            false,
            "a second record of the same claim is refused",
        ),
    ] {
        assert_eq!(record_call(&store, a, token, &done).await, taken, "{why}");
    }
    let a_view = f.work_item(a).await;
    assert_eq!(
        (a_view.state, a_view.reference.as_deref()),
        (WorkItemState::Succeeded, Some("ref-a"))
    );

    // b's executor stalls past its lease: expiry makes it unknown, and its late record fails.
    f.expire_work_item_leases().await;
    let expired = store
        .work_item_expire("payout", Duration::ZERO, "lease expired")
        .await
        .unwrap();
    assert_eq!(expired, vec![b]);
    assert!(
        !record_call(&store, b, cb.token, &done).await,
        "the stale executor cannot record"
    );
    let b_view = f.work_item(b).await;
    assert_eq!(b_view.state, WorkItemState::Unknown);
    assert_eq!(b_view.last_error.as_deref(), Some("lease expired"));
    let backlog = store.work_item_backlog(Some("payout")).await.unwrap();
    assert_eq!((backlog.unknown, backlog.in_progress), (1, 0));
    assert!(backlog.oldest_unknown_age.is_some());

    // A lookup lease keeps the state and counts the lookup when recorded.
    let looked = claim_items(params(ClaimPurpose::Lookup)).await;
    assert_eq!(looked.len(), 1);
    assert_eq!(looked[0].item.attempts, 1, "a lookup is not an attempt");
    let pending_again = WorkItemUpdate::Pending {
        reason: "not found".into(),
        delay: Duration::from_secs(60),
    };
    assert!(
        store
            .work_item_record(WorkItemRecordParams {
                id: b,
                token: looked[0].token,
                claimed_in: WorkItemState::Unknown,
                update: &pending_again,
                lookups_add: 1,
            })
            .await
            .unwrap()
    );
    let b_view = f.work_item(b).await;
    assert_eq!((b_view.state, b_view.lookups), (WorkItemState::Pending, 1));
    let due = claim_items(params(ClaimPurpose::Call)).await;
    assert!(due.is_empty(), "not due before its delay");
    f.age_work_items(Duration::from_secs(120)).await;
    assert_eq!(claim_items(params(ClaimPurpose::Call)).await.len(), 1);
    f.cleanup().await;
}

/// Maintenance: one session at a time is elected; leadership moves when the leader's session
/// ends; each job deletes only what is older than its limit, in batches.
pub async fn maintenance_is_elected_and_deletes_only_old_rows<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let mut a = store.maintenance_session().await.unwrap();
    let mut b = store.maintenance_session().await.unwrap();
    assert!(store.maintainer_elect(&mut a).await.unwrap());
    assert!(
        store.maintainer_elect(&mut a).await.unwrap(),
        "still the leader"
    );
    assert!(!store.maintainer_elect(&mut b).await.unwrap());

    old_and_young_inbox(&f, Duration::from_secs(3 * 86_400)).await;
    let keep = Duration::from_secs(2 * 86_400);
    assert_eq!(store.inbox_purge(&mut a, keep, 3).await.unwrap(), 3);
    assert_eq!(store.inbox_purge(&mut a, keep, 3).await.unwrap(), 2);
    assert_eq!(store.inbox_purge(&mut a, keep, 3).await.unwrap(), 0);
    assert_eq!(f.inbox_len().await, 1, "the young identity stays");

    let ok = enqueue_work_item(&f, &payout_item("old-ok", None)).await;
    let pending = enqueue_work_item(&f, &payout_item("old-pending", None)).await;
    let claimed = store
        .work_item_claim(WorkItemClaimParams {
            kind: "payout",
            purpose: ClaimPurpose::Call,
            limit: 1,
            lease: Duration::from_secs(30),
        })
        .await
        .unwrap();
    assert_eq!(claimed[0].item.id, ok);
    let done = WorkItemUpdate::Succeeded {
        reference: "r".into(),
    };
    record_call(&store, ok, claimed[0].token, &done).await;
    let week = Duration::from_secs(7 * 86_400);
    assert_eq!(store.work_item_purge(&mut a, week, 10).await.unwrap(), 0);
    f.age_work_items(week * 2).await;
    assert_eq!(store.work_item_purge(&mut a, week, 10).await.unwrap(), 1);
    let left: Vec<i64> = f.work_items().await.iter().map(|w| w.id).collect();
    assert_eq!(
        left,
        vec![pending],
        "only the old succeeded item is deleted"
    );

    f.enqueue(vec![msg("l", 1)]).await;
    let c = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(c.messages.len(), 1);
    assert_eq!(f.relay_lease_count().await, 1);
    let ten_minutes = Duration::from_secs(600);
    assert_eq!(store.lease_reap(&mut a, ten_minutes, 10).await.unwrap(), 0);
    f.age_relay_leases(Duration::from_secs(3600)).await;
    assert_eq!(store.lease_reap(&mut a, ten_minutes, 10).await.unwrap(), 1);
    assert_eq!(f.relay_lease_count().await, 0);

    drop(a);
    let mut moved = false;
    for _ in 0..50 {
        if store.maintainer_elect(&mut b).await.unwrap() {
            moved = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(moved, "leadership moves when the leader's session ends");
    f.cleanup().await;
}

/// Expands to one `#[tokio::test]` per case of the store conformance suite for the
/// [`StoreFixture`] `$fixture`.
#[macro_export]
macro_rules! store_suite {
    ($fixture:ty) => {
        $crate::__fixture_cases!(store, $fixture;
            claims_hand_out_each_aggregate_in_version_order_to_one_claim_at_a_time,
            a_stale_worker_cannot_settle_after_another_took_over,
            takeovers_are_counted_per_head_and_end_with_a_settled_claim,
            solo_takeovers_hand_out_one_expired_head_at_a_time,
            dead_letters_and_backoff_park_only_their_aggregate,
            a_paused_route_is_not_claimed_and_holds_its_aggregates,
            a_late_commit_is_claimed_after_later_ones,
            a_claimed_row_is_what_the_producer_wrote,
            inbox_absorbs_duplicates_and_records_conflicts,
            concurrent_records_of_one_event_give_one_new,
            ordering_guard_absorbs_stale_versions_and_reports_gaps,
            record_many_decides_as_record_one_by_one,
            consumer_dead_letters_are_kept_requeued_and_settled,
            consumer_dead_letters_keep_the_message_byte_for_byte,
            work_items_are_claimed_once_and_recorded_under_their_lease,
            maintenance_is_elected_and_deletes_only_old_rows,
        );
    };
}
