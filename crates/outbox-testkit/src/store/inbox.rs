//! The inbox: duplicates, conflicts, concurrent records, the ordering guard, records of many
//! events at once.

use std::time::Duration;

use outbox_core::IncomingEvent;
use outbox_core::consumer::{InboxOutcome, InboxStore, OrderingGuard};
use uuid::Uuid;

use super::incoming;
use crate::fixture::StoreFixture;
use crate::support::record;

/// The inbox: a redelivery is a duplicate; the same id with another payload is a conflict,
/// recorded; a rolled-back record leaves nothing; two consumers each record the event.
pub async fn inbox_absorbs_duplicates_and_records_conflicts<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let id = Uuid::now_v7();
    let e = incoming(id, "a", 1, r#"{"amount":1}"#);
    let other = incoming(id, "a", 1, r#"{"amount":2}"#);

    let mut tx = store.begin().await.unwrap();
    let rolled_back = store.inbox_record(&mut tx, "c1", OrderingGuard::Off, &e);
    assert_eq!(rolled_back.await.unwrap(), InboxOutcome::New);
    store.rollback(tx).await.unwrap();

    let conflict = InboxOutcome::Conflict {
        stored: e.fingerprint,
    };
    for (want, event) in [
        (InboxOutcome::New, &e),
        (InboxOutcome::Duplicate, &e),
        (conflict, &other),
        (conflict, &other),
    ] {
        assert_eq!(record(&store, "c1", OrderingGuard::Off, event).await, want);
    }
    let conflicts = f.conflict_count().await;
    assert_eq!(conflicts, 1, "one conflict record, seen twice");
    assert_eq!(
        record(&store, "c2", OrderingGuard::Off, &e).await,
        InboxOutcome::New,
        "another consumer records the event for itself"
    );
    assert_eq!(f.inbox_len().await, 2);
    f.cleanup().await;
}

/// Two transactions recording the same event at once meet: exactly one sees `New`.
pub async fn concurrent_records_of_one_event_give_one_new<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let e = incoming(Uuid::now_v7(), "a", 1, "{}");
    let run = |store: F::Store, e: IncomingEvent| async move {
        let mut tx = store.begin().await.unwrap();
        let outcome = store
            .inbox_record(&mut tx, "c", OrderingGuard::Off, &e)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        store.commit(tx).await.unwrap();
        outcome
    };
    let (a, b) = tokio::join!(
        tokio::spawn(run(store.clone(), e.clone())),
        tokio::spawn(run(store.clone(), e.clone()))
    );
    let mut outcomes = vec![a.unwrap(), b.unwrap()];
    outcomes.sort_by_key(|o| format!("{o:?}"));
    assert_eq!(outcomes, vec![InboxOutcome::Duplicate, InboxOutcome::New]);
    f.cleanup().await;
}

/// The ordering guard: `Wait` absorbs older versions as stale and reports a gap (without
/// moving the mark); `ApplyAnyway` applies across a gap.
pub async fn ordering_guard_absorbs_stale_versions_and_reports_gaps<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let record = |guard: OrderingGuard, e: IncomingEvent, consumer: &'static str| {
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.unwrap();
            let o = store
                .inbox_record(&mut tx, consumer, guard, &e)
                .await
                .unwrap();
            if matches!(o, InboxOutcome::Gap { .. }) {
                store.rollback(tx).await.unwrap();
            } else {
                store.commit(tx).await.unwrap();
            }
            o
        }
    };
    let v = |n: i64| incoming(Uuid::now_v7(), "agg", n, &format!("{{\"v\":{n}}}"));
    use InboxOutcome::{Gap, New, Stale};
    use OrderingGuard::{ApplyAnyway, Wait};
    // (guard, version, consumer, outcome, why), in order.
    for (guard, n, consumer, want, why) in [
        (
            Wait,
            2,
            "w",
            Gap { last_applied: 0 },
            "a first-seen aggregate must start at version 1",
        ),
        (Wait, 1, "w", New, "the version it waited for"),
        (Wait, 2, "w", New, "the next version"),
        (Wait, 1, "w", Stale { last_applied: 2 }, "an older version"),
        (
            Wait,
            4,
            "w",
            Gap { last_applied: 2 },
            "a version beyond the next",
        ),
        (ApplyAnyway, 3, "a", New, "applied across a gap"),
        (
            ApplyAnyway,
            1,
            "a",
            Stale { last_applied: 3 },
            "an older version",
        ),
    ] {
        let got = record(guard, v(n), consumer).await;
        assert_eq!(got, want, "{why}: {consumer} at version {n}");
    }
    f.cleanup().await;
}

/// Recording many events at once decides exactly as recording them one by one, ids repeated
/// inside the batch included.
pub async fn record_many_decides_as_record_one_by_one<F: StoreFixture>() {
    let f = F::new().await;
    let store = f.store();
    let known = incoming(Uuid::now_v7(), "k", 1, r#"{"k":1}"#);
    record(&store, "c", OrderingGuard::Off, &known).await;
    let fresh = incoming(Uuid::now_v7(), "f", 1, r#"{"f":1}"#);
    let clash = incoming(known.event_id, "k", 1, r#"{"k":2}"#);
    let fresh_clash = incoming(fresh.event_id, "f", 1, r#"{"f":2}"#);
    let batch = [&fresh, &known, &fresh, &clash, &fresh_clash];
    let mut tx = store.begin().await.unwrap();
    let got = store.inbox_record_many(&mut tx, "c", &batch).await.unwrap();
    store.commit(tx).await.unwrap();
    assert_eq!(
        got,
        vec![
            InboxOutcome::New,
            InboxOutcome::Duplicate,
            InboxOutcome::Duplicate,
            InboxOutcome::Conflict {
                stored: known.fingerprint
            },
            InboxOutcome::Conflict {
                stored: fresh.fingerprint
            },
        ]
    );
    assert_eq!(f.conflict_count().await, 2);
    f.cleanup().await;
}
