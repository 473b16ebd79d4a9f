//! Outbox dead letters: listed, filtered, grouped, read whole, requeued and discarded.

use outbox_core::operator::prelude::*;
use outbox_core::operator::{
    DeadLetterFilter, DeadLetterSelection, DeadLetterView, OperatorErrorKind, reason_key,
};
use outbox_core::{EventId, OutboxStore};
use serde_json::json;
use uuid::Uuid;

use super::steps::*;
use crate::fixture::StoreFixture;
use crate::store::claim;
use crate::support::release_all;

/// The reason group of the listing case's two timeouts.
const TIMEOUT: &str = "publish timed out after # ms (event #)";

/// The dead letters of the listing case: `payment` a1 (a2 waits behind it, pending) and b1
/// timed out, `order` c1 was refused.
struct Listed {
    ia1: EventId,
    ia2: EventId,
    ib1: EventId,
    ic1: EventId,
    /// a1's payload.
    a1_body: String,
    /// a1's error.
    ea: String,
    /// c1's error.
    ec: &'static str,
}

/// Outbox dead letters: oldest first, with what waits behind them and their reason key;
/// filtered by aggregate type, event type, destination, reason group and time; grouped by
/// reason (errors differing only in numbers and ids are one group); read whole; `NotFound` for
/// an id that is not a dead letter.
pub async fn dead_letters_are_listed_filtered_grouped_and_read_whole<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let dead = three_dead_letters(&f).await;
    let all = they_are_listed_oldest_first(&s, &dead).await;
    they_are_filtered(&s, &dead).await;
    they_are_grouped_by_reason(&s, &dead).await;
    they_are_read_whole(&s, &dead, &all).await;
    assert!(audit(&s).await.is_empty(), "reads record nothing");
    f.cleanup().await;
}

/// Makes the dead letters of [`Listed`].
async fn three_dead_letters<F: StoreFixture>(f: &F) -> Listed {
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
    kill(f, &[(ia1, &ea), (ib1, &eb), (ic1, ec)]).await;
    let timeout = TIMEOUT;
    assert_eq!(reason_key(Some(&ea)), timeout);
    Listed {
        ia1,
        ia2,
        ib1,
        ic1,
        a1_body,
        ea,
        ec,
    }
}

/// Listed oldest first, with what waits behind each, its attempts, last error and reason.
async fn they_are_listed_oldest_first<S: OperatorStore>(s: &S, d: &Listed) -> Vec<DeadLetterView> {
    let (ia1, ib1, ic1, ea, ec) = (d.ia1, d.ib1, d.ic1, &d.ea, d.ec);
    let timeout = TIMEOUT;
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
    all
}

/// Filtered by aggregate type, event type, destination, reason group and time; the limit holds.
async fn they_are_filtered<S: OperatorStore>(s: &S, d: &Listed) {
    let (ia1, ib1, ic1) = (d.ia1, d.ib1, d.ic1);
    let timeout = TIMEOUT;
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
        assert_eq!(dead_letter_ids(s, &filter, 100).await, want, "{filter:?}");
    }
    assert_eq!(
        s.dead_letters(&none, 1).await.unwrap().len(),
        1,
        "the limit holds"
    );
}

/// Grouped by reason, largest first, with the oldest one's error; filtered too.
async fn they_are_grouped_by_reason<S: OperatorStore>(s: &S, d: &Listed) {
    let (ea, ec) = (&d.ea, d.ec);
    let timeout = TIMEOUT;
    let none = DeadLetterFilter::default();
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
}

/// Read whole (payload, headers, partition key); `NotFound` for a row that is not dead and for
/// an unknown id.
async fn they_are_read_whole<S: OperatorStore>(s: &S, d: &Listed, all: &[DeadLetterView]) {
    let (ia1, ia2, ic1, a1_body) = (d.ia1, d.ia2, d.ic1, &d.a1_body);
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
