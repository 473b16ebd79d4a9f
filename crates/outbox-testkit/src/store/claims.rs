//! Claims and leases: per-aggregate order, one claim at a time, fencing of a stale worker,
//! takeovers counted per head, solo takeovers of expired heads.

use std::time::Duration;

use outbox_core::{ClaimParams, ClaimScope, ClaimedBatch, OutboxStore};

use super::{claim, msg};
use crate::fixture::StoreFixture;
use crate::support::{mark_published, record_failure, release, release_all, row_id};

pub(super) fn versions(messages: &[outbox_core::OutboxMessage], agg: &str) -> Vec<i64> {
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
