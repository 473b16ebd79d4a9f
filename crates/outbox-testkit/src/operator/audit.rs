//! The audit and the traces of an event and of an aggregate.

use outbox_core::consumer::{InboxOutcome, OrderingGuard};
use outbox_core::operator::prelude::*;
use outbox_core::operator::{DeadLetterSelection, PauseTarget};
use serde_json::json;
use uuid::Uuid;

use super::steps::*;
use crate::fixture::StoreFixture;
use crate::store::incoming;
use crate::support::record;

/// The audit: newest first, ids increasing with time, paged with `before`; each record keeps
/// who (name, via, credential), what, the selection, why and how many.
pub async fn the_audit_lists_newest_first_and_pages_with_before<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let me = actor();
    let (a, b) = (PauseTarget::destination("a"), PauseTarget::destination("b"));
    s.pause(&a, &me, "one").await.unwrap();
    s.pause(&b, &me, "two").await.unwrap();
    assert!(s.pause(&b, &me, "refused").await.is_err());
    s.resume(&a, &me, "three").await.unwrap();
    s.requeue_dead_letters(&DeadLetterSelection::All, &me, "four")
        .await
        .unwrap();

    let all = audit(&s).await;
    assert_eq!(all.len(), 4, "the refused pause left no record");
    let reasons: Vec<&str> = all.iter().map(|a| a.reason.as_str()).collect();
    assert_eq!(reasons, vec!["four", "three", "two", "one"], "newest first");
    assert!(
        all.windows(2)
            .all(|w| w[0].id > w[1].id && w[0].at >= w[1].at)
    );
    let first = &all[3];
    assert_eq!(
        (
            first.actor.as_str(),
            first.via.as_str(),
            first.credential.as_deref()
        ),
        ("alice", "suite", Some("fp-1"))
    );
    assert_eq!((first.action.as_str(), first.affected), ("pause", 1));
    assert_eq!(first.selection, json!({ "route": "destination:a" }));
    assert!(!first.db_role.is_empty());

    let ids: Vec<i64> = all.iter().map(|a| a.id).collect();
    let page = |before: Option<i64>, limit: i64| {
        let s = s.clone();
        async move {
            s.audit(before, limit)
                .await
                .unwrap()
                .iter()
                .map(|a| a.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(page(None, 2).await, ids[..2].to_vec());
    assert_eq!(page(Some(ids[1]), 2).await, ids[2..].to_vec());
    assert_eq!(page(Some(ids[3]), 10).await, Vec::<i64>::new());
    assert_eq!(page(Some(ids[0] + 1), 10).await, ids);
    f.cleanup().await;
}

/// A trace shows everything the store holds of an event (its outbox row, each consumer's inbox
/// record, its conflicts, consumer dead letters, work items, and the audit records naming it),
/// and of an aggregate (its rows by version, each consumer's last applied version).
pub async fn traces_show_an_event_and_an_aggregate_everywhere<F: StoreFixture>() {
    let f = F::new().await;
    let s = f.store();
    let (id, body) = (Uuid::now_v7(), r#"{"amount":5}"#);
    f.enqueue(vec![payment(id, "t", 1, body), created("t", 2)])
        .await;
    let e = incoming(id, "t", 1, body);
    assert_eq!(
        record(&s, "c1", OrderingGuard::Wait, &e).await,
        InboxOutcome::New
    );
    let changed = incoming(id, "t", 1, r#"{"amount":6}"#);
    record(&s, "c1", OrderingGuard::Wait, &changed).await;
    consumer_dead(&s, "c3", id, "t", body, true, "handler failed").await;
    let item = work_item(&f, "k-t", Some(id)).await;

    let t = s.trace_event(id).await.unwrap();
    assert_eq!(t.event_id, id);
    let row = t.outbox.expect("the outbox row");
    assert_eq!(
        (row.event_id, row.aggregate_version, row.state.as_str()),
        (id, 1, "pending")
    );
    assert_eq!(row.payload_sha256, e.fingerprint.to_hex());
    assert_eq!(
        (row.event_type.as_str(), row.attempts),
        ("PaymentCreated", 0)
    );
    assert!(t.discarded.is_none());
    assert_eq!(t.inbox.len(), 1);
    let i = &t.inbox[0];
    assert_eq!(
        (
            i.consumer_name.as_str(),
            i.outcome.as_str(),
            i.aggregate_version
        ),
        ("c1", "applied", 1)
    );
    assert_eq!(i.payload_sha256, e.fingerprint.to_hex());
    assert_eq!(t.conflicts.len(), 1);
    assert_eq!(t.conflicts[0].consumer_name, "c1");
    assert_eq!(t.consumer_dead_letters.len(), 1);
    assert_eq!(t.consumer_dead_letters[0].consumer_name, "c3");
    assert_eq!(
        t.work_items.iter().map(|w| w.id).collect::<Vec<_>>(),
        vec![item]
    );
    assert!(t.audit.is_empty());

    kill(&f, &[(id, "broker down")]).await;
    let dead = s.trace_event(id).await.unwrap().outbox.expect("still held");
    assert_eq!((dead.state.as_str(), dead.attempts), ("dead", 1));
    assert_eq!(dead.last_error.as_deref(), Some("broker down"));
    s.requeue_dead_letters(&DeadLetterSelection::Ids(vec![id]), &actor(), "retry")
        .await
        .unwrap();
    let t = s.trace_event(id).await.unwrap();
    assert_eq!(t.outbox.map(|o| o.state), Some("pending".to_owned()));
    assert_eq!(t.audit.len(), 1);
    assert_eq!(t.audit[0].action, "requeue dead letters");

    let agg = s.trace_aggregate("payment", "t", 10).await.unwrap();
    assert_eq!(
        (agg.aggregate_type.as_str(), agg.aggregate_id.as_str()),
        ("payment", "t")
    );
    assert_eq!(trace_versions(&agg), (vec![1, 2], vec![]));
    assert_eq!(agg.consumers.len(), 1);
    assert_eq!(
        (
            agg.consumers[0].consumer_name.as_str(),
            agg.consumers[0].last_version
        ),
        ("c1", 1)
    );
    let first = s.trace_aggregate("payment", "t", 1).await.unwrap();
    assert_eq!(
        trace_versions(&first).0,
        vec![1],
        "lowest version first, up to the limit"
    );

    let nothing = s.trace_event(Uuid::now_v7()).await.unwrap();
    assert!(nothing.outbox.is_none() && nothing.discarded.is_none());
    assert!(nothing.inbox.is_empty() && nothing.conflicts.is_empty() && nothing.audit.is_empty());
    assert!(nothing.consumer_dead_letters.is_empty() && nothing.work_items.is_empty());
    f.cleanup().await;
}
