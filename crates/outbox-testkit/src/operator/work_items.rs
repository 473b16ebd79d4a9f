//! Work items: counted, listed, resolved by hand and reconciled.

use outbox_core::LeaseToken;
use outbox_core::effect::{
    ClaimPurpose, WorkItemRecordParams, WorkItemState, WorkItemStore, WorkItemUpdate,
};
use outbox_core::operator::prelude::*;
use outbox_core::operator::{OperatorErrorKind, Resolution};
use serde_json::json;

use super::steps::*;
use crate::fixture::StoreFixture;

/// The work items of the case: two unknown, one failed, one pending, and an id that is none.
struct Items {
    u: i64,
    u2: i64,
    failed: i64,
    pending: i64,
    stranger: i64,
}

/// A manual success with the provider's `reference`.
fn done(reference: &str) -> Resolution {
    Resolution::Succeeded {
        reference: reference.into(),
    }
}

/// Work items: counted by state, listed by state (an unknown state is refused), resolved by
/// hand only from the states each resolution allows (`Refused` otherwise, `NotFound` for no
/// item), reconciled at once only when unknown; every success audited, no refusal.
pub async fn work_items_are_counted_listed_resolved_and_reconciled<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let items = four_work_items(&f).await;
    they_are_counted_by_state(&s).await;
    they_are_listed_by_state(&s, &items).await;
    resolutions_are_refused_from_other_states(&s, &items).await;
    a_resend_and_a_failure_are_resolved_by_hand(&f, &s, &items).await;
    let lookup = only_an_unknown_outcome_is_reconciled(&s, &items).await;
    settling_by_hand_fences_off_the_lookup(&s, &items, lookup).await;
    f.cleanup().await;
}

/// Writes [`Items`].
async fn four_work_items<F: StoreFixture>(f: &F) -> Items {
    let u = unknown_item(f, "k-u").await;
    let u2 = unknown_item(f, "k-u2").await;
    let failed = failed_item(f, "k-f").await;
    let pending = work_item(f, "k-p", None).await;
    let stranger = u.max(u2).max(failed).max(pending) + 1000;
    Items {
        u,
        u2,
        failed,
        pending,
        stranger,
    }
}

/// Counted by state, of all kinds or one.
async fn they_are_counted_by_state<S: OperatorStore>(s: &S) {
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
}

/// Listed oldest first, of all states or one; an unknown state is refused.
async fn they_are_listed_by_state<S: OperatorStore>(s: &S, items: &Items) {
    let Items {
        u,
        u2,
        failed,
        pending,
        ..
    } = *items;
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
}

/// A resolution from a state it does not allow is `Refused`, of no item `NotFound`; neither is
/// recorded.
async fn resolutions_are_refused_from_other_states<S: OperatorStore>(s: &S, items: &Items) {
    let Items {
        failed,
        pending,
        stranger,
        ..
    } = *items;
    let me = actor();
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
    assert!(audit(s).await.is_empty(), "refusals record nothing");
}

/// A failed item is resent, an unknown one given up; each audited.
async fn a_resend_and_a_failure_are_resolved_by_hand<F: StoreFixture>(
    f: &F,
    s: &F::Store,
    items: &Items,
) {
    let Items { u, failed, .. } = *items;
    let me = actor();
    let resent = s
        .resolve_work_item(failed, Resolution::Resend, &me, "provider fixed")
        .await
        .unwrap();
    assert_eq!((resent.id, resent.state.as_str()), (failed, "pending"));
    assert_eq!(f.work_item(failed).await.state, WorkItemState::Pending);
    let r = last_record(s).await;
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
}

/// Only an unknown outcome is reconciled, audited; its lookup is due at once. Returns the
/// lookup's lease.
async fn only_an_unknown_outcome_is_reconciled<S: OperatorStore + WorkItemStore>(
    s: &S,
    items: &Items,
) -> LeaseToken {
    let Items {
        u,
        u2,
        pending,
        stranger,
        ..
    } = *items;
    let me = actor();
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
    let records = audit(s).await.len();
    s.reconcile_work_item(u2, &me, "customer waiting")
        .await
        .unwrap();
    let r = last_record(s).await;
    assert_eq!(
        (r.action.as_str(), r.affected, r.selection.clone()),
        ("reconcile work item", 1, json!({ "work_item": u2 }))
    );
    assert_eq!(audit(s).await.len(), records + 1);
    let looked = s
        .work_item_claim(call_claim(ClaimPurpose::Lookup))
        .await
        .unwrap();
    assert_eq!(
        looked.iter().map(|c| c.item.id).collect::<Vec<_>>(),
        vec![u2]
    );
    looked[0].token
}

/// Settling by hand clears the lookup's lease: its late answer is refused.
async fn settling_by_hand_fences_off_the_lookup<S: OperatorStore + WorkItemStore>(
    s: &S,
    items: &Items,
    lookup: LeaseToken,
) {
    let u2 = items.u2;
    let me = actor();
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
            token: lookup,
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
    assert_eq!(audit(s).await.len(), 4);
}
