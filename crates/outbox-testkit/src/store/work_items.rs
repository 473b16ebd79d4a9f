//! Work items: claimed once, recorded under their lease.

use std::time::Duration;

use outbox_core::effect::{
    ClaimPurpose, WorkItemClaimParams, WorkItemRecordParams, WorkItemState, WorkItemStore,
    WorkItemUpdate,
};

use crate::fixture::StoreFixture;
use crate::support::{enqueue_work_item, payout_item, record_call};

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
