//! Page limits and count bounds: what every list and count refuses.

use outbox_core::operator::prelude::*;
use outbox_core::operator::{
    ACTIVITY_MINUTES, ActivityKind, Actor, ConflictFilter, ConsumerSelection, Counting,
    DeadLetterFilter, MAX_LIST, OperatorErrorKind,
};

use super::steps::*;
use crate::fixture::StoreFixture;

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
        assert_eq!(
            kind(s.conflicts(ConflictFilter::default(), limit).await),
            invalid
        );
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
        assert!(
            s.conflicts(ConflictFilter::default(), limit)
                .await
                .unwrap()
                .is_empty()
        );
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
    for minutes in [0, ACTIVITY_MINUTES + 1] {
        assert_eq!(
            kind(s.activity(ActivityKind::Publish, minutes).await),
            invalid
        );
    }
    let window = s.activity(ActivityKind::Consume, ACTIVITY_MINUTES).await;
    assert_eq!(window.map(|a| a.minutes).ok(), Some(ACTIVITY_MINUTES));
    let level = s.activity(ActivityKind::Lag, 15).await;
    assert_eq!(level.map(|a| (a.level, a.minutes)).ok(), Some((true, 15)));
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
