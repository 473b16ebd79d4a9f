//! Maintenance: one elected session, deleting only old rows.

use std::time::Duration;

use outbox_core::OutboxStore;
use outbox_core::effect::{ClaimPurpose, WorkItemClaimParams, WorkItemStore, WorkItemUpdate};
use outbox_core::maintenance::{MaintenanceStore, Purge};

use super::{claim, msg};
use crate::fixture::StoreFixture;
use crate::support::{enqueue_work_item, old_and_young_inbox, payout_item, record_call};

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
    // One batch of `what` on the leader's session; how many rows it deleted.
    let mut purge = async |what: Purge, older_than: Duration, limit: i64| {
        store.purge(&mut a, what, older_than, limit).await.unwrap()
    };
    assert_eq!(purge(Purge::Inbox, keep, 3).await, 3);
    assert_eq!(purge(Purge::Inbox, keep, 3).await, 2);
    assert_eq!(purge(Purge::Inbox, keep, 3).await, 0);
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
    assert_eq!(purge(Purge::WorkItems, week, 10).await, 0);
    f.age_work_items(week * 2).await;
    assert_eq!(purge(Purge::WorkItems, week, 10).await, 1);
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
    assert_eq!(purge(Purge::Leases, ten_minutes, 10).await, 0);
    f.age_relay_leases(Duration::from_secs(3600)).await;
    assert_eq!(purge(Purge::Leases, ten_minutes, 10).await, 1);
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
