//! Replays, as the store's publish mode allows them.

use outbox_core::operator::prelude::*;
use outbox_core::operator::{OperatorErrorKind, RangeSelection, ReplaySelection};
use outbox_core::{EventId, OutboxStore};

use super::steps::*;
use crate::fixture::StoreFixture;
use crate::store::claim;
use crate::support::publish_all;

/// Replays follow the store's publish mode: a store that keeps no published rows refuses every
/// replay (`Refused`, nothing recorded); one that keeps them (mark mode) says in a dry run what
/// it would take, refuses a changed count, a version below 1, no reason and an unknown
/// aggregate, and replays the published rows under their own ids, audited.
pub async fn replays_follow_the_stores_publish_mode<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let published = two_published_rows(&f, &s).await;
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
        delete_mode_refuses_every_replay(&s, &which, &range).await;
        f.cleanup().await;
        return;
    }

    // Mark mode.
    a_dry_run_says_what_a_replay_would_take(&s, &which).await;
    wrong_replays_are_refused(&s, &which, &empty_range).await;
    a_replay_republishes_under_the_events_own_ids(&s, &which, published).await;
    f.cleanup().await;
}

/// Two rows of `payment` `r`, published; returns their event ids.
async fn two_published_rows<F: StoreFixture>(f: &F, s: &F::Store) -> Vec<EventId> {
    let (r1, r2) = (created("r", 1), created("r", 2));
    let published = vec![r1.event_id, r2.event_id];
    f.enqueue(vec![r1, r2]).await;
    let batch = s.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(publish_all(s, &batch).await, 2);
    published
}

/// Delete mode: every replay is refused, nothing is recorded or claimable.
async fn delete_mode_refuses_every_replay<S: OperatorStore + OutboxStore>(
    s: &S,
    which: &ReplaySelection,
    range: &RangeSelection,
) {
    let me = actor();
    for dry_run in [true, false] {
        assert_eq!(
            kind(s.replay(which, dry_run, None, &me, "rebuild").await),
            OperatorErrorKind::Refused
        );
        assert_eq!(
            kind(s.replay(range, dry_run, None, &me, "rebuild").await),
            OperatorErrorKind::Refused
        );
    }
    assert!(audit(s).await.is_empty());
    assert!(claimable(s).await.is_empty());
}

/// A dry run says what a replay would take and records nothing.
async fn a_dry_run_says_what_a_replay_would_take<S: OperatorStore>(s: &S, which: &ReplaySelection) {
    let me = actor();
    let plan = s.replay(which, true, None, &me, "").await.unwrap();
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
    assert!(audit(s).await.is_empty(), "a dry run records nothing");
}

/// A changed count, a version below 1, no reason, an unknown aggregate and an empty range are
/// refused, and recorded nowhere.
async fn wrong_replays_are_refused<S: OperatorStore>(
    s: &S,
    which: &ReplaySelection,
    empty_range: &RangeSelection,
) {
    let me = actor();
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
            which,
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
        (which, false, None, " ", InvalidRequest, "no reason"),
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
        kind(s.replay(empty_range, true, None, &me, "rebuild").await),
        OperatorErrorKind::InvalidRequest
    );
    assert!(audit(s).await.is_empty(), "refusals record nothing");
}

/// The replay republishes the published rows under their own ids, in version order, audited.
async fn a_replay_republishes_under_the_events_own_ids<S: OperatorStore + OutboxStore>(
    s: &S,
    which: &ReplaySelection,
    published: Vec<EventId>,
) {
    let me = actor();
    let done = s
        .replay(which, false, Some(2), &me, "rebuild")
        .await
        .unwrap();
    assert_eq!((done.events, done.dry_run), (2, false));
    let r = last_record(s).await;
    assert_eq!((r.action.as_str(), r.affected), ("replay", 2));
    let batch = s.claim_batch(claim(100, 30_000)).await.unwrap();
    let republished: Vec<EventId> = batch.messages.iter().map(|m| m.event_id).collect();
    assert_eq!(
        republished, published,
        "republished under their own ids, in version order"
    );
}
