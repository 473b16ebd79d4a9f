//! The maintainer over a store: cleanup on one elected instance.

use std::time::Duration;

use outbox_core::effect::{ExecutorConfig, WorkItemState};

use super::executor::{executor_config, executor_with, work_item};
use crate::fakes::CallMode;
use crate::fixture::StoreFixture;
use crate::support::old_and_young_inbox;

/// The maintainer deletes, on the elected instance only and in batches, inbox identities older
/// than the retention, old succeeded work items and leases of crashed relays; it refuses a
/// retention inside the replay horizon; leadership moves when the leader's session ends.
pub async fn the_maintainer_cleans_up_on_one_elected_instance<F: StoreFixture>() {
    use outbox_core::maintenance::{
        InboxRetention, Maintainer, MaintenanceConfig, MaintenanceStore, ReplayHorizon,
    };
    let f = F::new().await;
    let store = f.store();
    let day = Duration::from_secs(86_400);
    old_and_young_inbox(&f, day * 3).await;
    let (settled, _) = work_item(&f, "old").await;
    let (open, _) = work_item(&f, "open").await;
    // Settle only the first: the second stays pending (claimed one at a time).
    let one = executor_with(
        f.store(),
        CallMode::Succeed,
        ExecutorConfig {
            batch_size: 1,
            ..executor_config()
        },
    );
    one.run_once().await.unwrap();
    assert_eq!(f.work_item(settled).await.state, WorkItemState::Succeeded);
    assert_eq!(f.work_item(open).await.state, WorkItemState::Pending);
    f.age_work_items(day * 10).await;

    let horizon = ReplayHorizon {
        broker_retention: day,
        outbox_retention: Duration::ZERO,
        dead_letter_requeue_window: day * 2,
    };
    let config = MaintenanceConfig {
        inbox: Some(InboxRetention {
            keep: day * 2,
            horizon,
        }),
        work_items_keep: Some(day * 7),
        published_keep: None,
        lease_reap_after: Some(Duration::from_secs(600)),
        batch_size: 2,
        interval: Duration::from_secs(60),
    };
    let unsafe_config = MaintenanceConfig {
        inbox: Some(InboxRetention {
            keep: Duration::from_secs(3600),
            horizon,
        }),
        ..config.clone()
    };
    let err = Maintainer::new(store.clone(), unsafe_config).expect_err("refused");
    assert_eq!(err.key, "inbox.keep");
    assert!(err.to_string().contains("172800"), "{err}");

    let a = Maintainer::new(store.clone(), config.clone()).unwrap();
    let b = Maintainer::new(store.clone(), config).unwrap();
    let mut sa = store.maintenance_session().await.unwrap();
    let mut sb = store.maintenance_session().await.unwrap();
    let r = a.round(&mut sa).await.unwrap().expect("a is elected");
    assert_eq!((r.inbox, r.work_items), (5, 1), "{r:?}");
    assert_eq!(
        b.round(&mut sb).await.unwrap(),
        None,
        "b is not the maintainer"
    );
    assert_eq!(f.inbox_len().await, 1);
    let left: Vec<i64> = f.work_items().await.iter().map(|w| w.id).collect();
    assert_eq!(left, vec![open]);
    drop(sa);
    let mut elected = None;
    for _ in 0..50 {
        elected = b.round(&mut sb).await.unwrap();
        if elected.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        elected.map(|r| r.total()),
        Some(0),
        "b took over; nothing left to delete"
    );
    f.cleanup().await;
}
