//! Pauses: a paused route is not claimed; pauses are checked, and a paused consumer shows
//! everywhere.

use outbox_core::OutboxStore;
use outbox_core::consumer::InboxStore;
use outbox_core::operator::prelude::*;
use outbox_core::operator::{OperatorErrorKind, PauseTarget};
use serde_json::json;

use super::steps::*;
use crate::fixture::StoreFixture;
use crate::store::claim;
use crate::support::publish_all;

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
