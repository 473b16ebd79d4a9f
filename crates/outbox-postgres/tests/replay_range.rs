//! A time-range replay (`ReplayOps::replay` of a `RangeSelection`) against the real PostgreSQL: what it takes (each
//! aggregate extended to its newest version), the dry run, the replay horizon that retention
//! raises, and its refusals.

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{TestDb, msg};
use outbox_core::maintenance::{MaintenanceStore, Purge};
use outbox_core::operator::prelude::*;
use outbox_core::operator::{Actor, OperatorErrorKind, RangeSelection};
use outbox_postgres::OnPublish;

/// Writes `aggregate`'s `version` (of `kind`), published, created and published `minutes_ago`.
async fn published(db: &TestDb, kind: &str, aggregate: &str, version: i64, minutes_ago: i64) {
    let mut m = msg(aggregate, version);
    m.aggregate_type = kind.to_owned();
    db.outbox.enqueue(&db.pool, &m).await.unwrap();
    db.exec(format!(
        "UPDATE \"{}\".events SET state = 'published', \
           created_at = now() - interval '{minutes_ago} minutes', \
           published_at = now() - interval '{minutes_ago} minutes' \
         WHERE aggregate_type = '{kind}' AND aggregate_id = '{aggregate}' \
           AND aggregate_version = {version}",
        db.schema
    ))
    .await;
}

fn ago(minutes: i64) -> DateTime<Utc> {
    Utc::now() - chrono::Duration::minutes(minutes)
}

fn range(from_minutes_ago: i64, to_minutes_ago: i64) -> RangeSelection {
    RangeSelection {
        created_after: ago(from_minutes_ago),
        created_before: ago(to_minutes_ago),
        aggregate_type: None,
        destination: None,
    }
}

#[tokio::test]
async fn a_time_range_replays_each_aggregate_to_its_newest_version_within_the_horizon() {
    let db = TestDb::new().await;
    let admin = db.store_with(OnPublish::Mark);
    let who = Actor::new("oncall", "test").unwrap();
    // Before the range: d. In the range (100 to 60 minutes ago): a v1, b v1, order c v1.
    // After it: a v2, which the extension takes along.
    published(&db, "payment", "d", 1, 180).await;
    published(&db, "payment", "a", 1, 90).await;
    published(&db, "payment", "b", 1, 80).await;
    published(&db, "order", "c", 1, 70).await;
    published(&db, "payment", "a", 2, 30).await;
    let in_range = range(100, 60);
    // The mark starts at the migration (a moment ago): these rows were written "earlier" by
    // hand, so vouch for the last day, as a schema migrated a day ago would.
    db.exec(format!(
        "UPDATE \"{}\".retention_marks SET through = now() - interval '1 day'",
        db.schema
    ))
    .await;
    let day_ago = ago(24 * 60);

    let plan = admin.replay(&in_range, true, None, &who, "").await.unwrap();
    assert_eq!(
        (plan.events, plan.in_range, plan.aggregates),
        (4, 3, 3),
        "{plan:?}"
    );
    let horizon = plan.horizon.expect("a horizon from the migration on");
    assert!((horizon - day_ago).num_seconds().abs() < 60, "{horizon}");
    let e = admin
        .replay(&range(25 * 60, 60), true, None, &who, "")
        .await
        .unwrap_err();
    assert!(e.message.starts_with("beyond the replay horizon"), "{e}");
    assert_eq!(
        db.count("state = 'pending'").await,
        0,
        "a dry run changes nothing"
    );
    let payments = RangeSelection {
        aggregate_type: Some("payment".into()),
        ..in_range.clone()
    };
    let plan = admin.replay(&payments, true, None, &who, "").await.unwrap();
    assert_eq!((plan.events, plan.in_range, plan.aggregates), (3, 2, 2));

    // Refusals: no reason, an empty range, nothing in it, a changed count, a held aggregate.
    let e = admin
        .replay(&payments, false, Some(3), &who, " ")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::InvalidRequest, "{e}");
    let e = admin
        .replay(&range(60, 100), true, None, &who, "")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::InvalidRequest, "{e}");
    let e = admin
        .replay(&range(20, 10), true, None, &who, "")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::NotFound, "{e}");
    let e = admin
        .replay(&payments, false, Some(2), &who, "rebuild reporting")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::Refused, "{e}");
    assert!(e.message.contains("not the 2 expected"), "{e}");
    db.exec(format!(
        "INSERT INTO \"{}\".leases (aggregate_type, aggregate_id, token, lease_until) \
         VALUES ('payment', 'b', 1, now() + interval '1 minute')",
        db.schema
    ))
    .await;
    let e = admin
        .replay(&payments, false, Some(3), &who, "rebuild reporting")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::Refused, "{e}");
    assert!(e.message.contains("payment/b"), "{e}");
    db.exec(format!("DELETE FROM \"{}\".leases", db.schema))
        .await;

    // The replay: a v1 and v2 and b v1 pending again, order c and d left alone.
    let done = admin
        .replay(&payments, false, Some(3), &who, "rebuild reporting")
        .await
        .unwrap();
    assert_eq!((done.events, done.dry_run), (3, false));
    assert_eq!(
        db.count("state = 'pending' AND aggregate_type = 'payment' AND aggregate_id IN ('a', 'b')")
            .await,
        3
    );
    assert_eq!(db.count("state = 'published'").await, 2);
    let audit = admin.audit(None, 10).await.unwrap();
    assert_eq!((audit.len(), audit[0].action.as_str()), (1, "replay range"));
    db.exec(format!(
        "UPDATE \"{}\".events SET state = 'published' WHERE state = 'pending'",
        db.schema
    ))
    .await;

    // Retention deletes d (written and published 180 minutes ago): the horizon moves to its
    // write time, a range from before it is refused, one from after it is not.
    let store = db.store_with(OnPublish::Mark);
    let mut session = store.maintenance_session().await.unwrap();
    let deleted = store
        .purge(
            &mut session,
            Purge::Published,
            Duration::from_secs(150 * 60),
            100,
        )
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let e = admin
        .replay(&range(200, 60), true, None, &who, "")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::Refused, "{e}");
    assert!(e.message.starts_with("beyond the replay horizon"), "{e}");
    let plan = admin
        .replay(&range(170, 60), true, None, &who, "")
        .await
        .unwrap();
    let horizon = plan
        .horizon
        .expect("a horizon once retention deleted something");
    assert!(horizon < ago(175) && horizon > ago(185), "{horizon}");
    assert_eq!(plan.events, 4);

    // A gap inside an aggregate's versions (a discard took b v2 of b v1..v3) is refused.
    published(&db, "payment", "b", 2, 50).await;
    published(&db, "payment", "b", 3, 40).await;
    db.exec(format!(
        "DELETE FROM \"{}\".events WHERE aggregate_id = 'b' AND aggregate_version = 2",
        db.schema
    ))
    .await;
    let e = admin
        .replay(&range(170, 60), true, None, &who, "")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::Refused, "{e}");
    assert!(e.message.contains("payment/b"), "{e}");
    db.drop().await;
}

#[tokio::test]
async fn a_time_range_is_refused_in_delete_mode() {
    let db = TestDb::new().await;
    let admin = db.store();
    let who = Actor::new("oncall", "test").unwrap();
    let e = admin
        .replay(&range(100, 60), true, None, &who, "")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::Refused, "{e}");
    assert!(e.message.contains("relay.on_publish"), "{e}");
    db.drop().await;
}
