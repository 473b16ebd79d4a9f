//! Consumer inbox against the real PostgreSQL: duplicates, concurrent deliveries, conflicts,
//! several consumers, the ordering guard.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::TestDb;
use outbox_core::consumer::{InboxOutcome, OrderingGuard};
use outbox_core::{Fingerprint, IncomingEvent, Payload};
use outbox_postgres::PgInbox;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

fn event(id: Uuid, agg: &str, version: i64, body: &str) -> IncomingEvent {
    let payload = Payload::bytes("application/json", body.as_bytes().to_vec());
    IncomingEvent {
        event_id: id,
        event_type: "PaymentCreated".into(),
        source: "/test".into(),
        aggregate_type: "payment".into(),
        aggregate_id: agg.into(),
        aggregate_version: version,
        schema_version: 1,
        partition_key: agg.into(),
        time: None,
        fingerprint: Fingerprint::of(body.as_bytes()),
        payload,
        headers: BTreeMap::new(),
    }
}

async fn effects_table(db: &TestDb) -> String {
    let t = format!("\"{}\".effects", db.schema);
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {t} (consumer text, event_id uuid)"
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    t
}

/// One delivery: inbox + effect in one transaction, effect only when new.
async fn deliver(
    pool: &PgPool,
    inbox: &PgInbox,
    table: &str,
    consumer: &str,
    guard: OrderingGuard,
    e: &IncomingEvent,
) -> InboxOutcome {
    let mut tx = pool.begin().await.unwrap();
    let outcome = inbox.record(&mut tx, consumer, guard, e).await.unwrap();
    if outcome.should_apply() {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} VALUES ($1, $2)"
        )))
        .bind(consumer)
        .bind(e.event_id)
        .execute(&mut *tx)
        .await
        .unwrap();
    }
    if matches!(outcome, InboxOutcome::Gap { .. }) {
        tx.rollback().await.unwrap();
    } else {
        tx.commit().await.unwrap();
    }
    outcome
}

async fn effects(db: &TestDb, table: &str, consumer: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE consumer = $1"
    )))
    .bind(consumer)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn concurrent_deliveries_to_two_instances_give_one_effect() {
    let db = TestDb::new().await;
    let table = effects_table(&db).await;
    let inbox = PgInbox::new(db.schema.clone());
    let e = event(Uuid::now_v7(), "p1", 1, "{}");
    // Instance A records and holds its transaction open; instance B must wait, then absorb.
    let mut a = db.pool.begin().await.unwrap();
    assert_eq!(
        inbox
            .record(&mut a, "c", OrderingGuard::Off, &e)
            .await
            .unwrap(),
        InboxOutcome::New
    );
    let (pool, inbox_b, table_b, e_b) = (db.pool.clone(), inbox.clone(), table.clone(), e.clone());
    let b = tokio::spawn(async move {
        deliver(&pool, &inbox_b, &table_b, "c", OrderingGuard::Off, &e_b).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!b.is_finished(), "B must wait for A's transaction");
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} VALUES ('c', $1)"
    )))
    .bind(e.event_id)
    .execute(&mut *a)
    .await
    .unwrap();
    a.commit().await.unwrap();
    assert_eq!(b.await.unwrap(), InboxOutcome::Duplicate);
    assert_eq!(effects(&db, &table, "c").await, 1);

    // If the first instance rolls back (crash before commit), the waiting one applies it.
    let e2 = event(Uuid::now_v7(), "p2", 1, "{}");
    let mut a = db.pool.begin().await.unwrap();
    assert_eq!(
        inbox
            .record(&mut a, "c", OrderingGuard::Off, &e2)
            .await
            .unwrap(),
        InboxOutcome::New
    );
    let (pool, inbox_b, table_b, e_b) = (db.pool.clone(), inbox.clone(), table.clone(), e2.clone());
    let b = tokio::spawn(async move {
        deliver(&pool, &inbox_b, &table_b, "c", OrderingGuard::Off, &e_b).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    a.rollback().await.unwrap();
    assert_eq!(b.await.unwrap(), InboxOutcome::New);
    assert_eq!(effects(&db, &table, "c").await, 2);

    // Many racing deliveries of one event: exactly one effect.
    let e3 = event(Uuid::now_v7(), "p3", 1, "{}");
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (pool, inbox, table, e) =
                (db.pool.clone(), inbox.clone(), table.clone(), e3.clone());
            tokio::spawn(async move {
                deliver(&pool, &inbox, &table, "c", OrderingGuard::Off, &e).await
            })
        })
        .collect();
    let mut new = 0;
    for t in tasks {
        if t.await.unwrap() == InboxOutcome::New {
            new += 1;
        }
    }
    assert_eq!(new, 1);
    assert_eq!(effects(&db, &table, "c").await, 3);
    db.drop().await;
}

/// An operator resolves a conflict (`resolve_conflicts`, schema 11): it leaves the open
/// list and count with who and why, the consumer's effect stays the first payload's; the same
/// conflicting payload arriving again reopens it, counted.
#[tokio::test]
async fn a_resolved_conflict_leaves_the_open_list_until_it_comes_again() {
    use outbox_core::operator::prelude::*;
    use outbox_core::operator::{Actor, ConflictFilter, OperatorErrorKind};
    let db = TestDb::new().await;
    let table = effects_table(&db).await;
    let inbox = PgInbox::new(db.schema.clone());
    let admin = db.store();
    let who = Actor::new("oncall", "test").unwrap();
    let id = Uuid::now_v7();
    let first = event(id, "p1", 1, "{\"amount\":100}");
    let changed = event(id, "p1", 1, "{\"amount\":999}");
    for (e, expected) in [(&first, "New"), (&changed, "Conflict")] {
        let outcome = deliver(&db.pool, &inbox, &table, "ledger", OrderingGuard::Off, e).await;
        assert!(format!("{outcome:?}").starts_with(expected), "{outcome:?}");
    }
    let open = admin.conflicts(ConflictFilter::OPEN, 10).await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].resolved_at, None);
    assert_eq!(inbox.conflict_count(&db.pool).await.unwrap(), 1);

    let e = admin
        .resolve_conflicts(&[open[0].id], &who, " ")
        .await
        .unwrap_err();
    assert_eq!(
        e.kind,
        OperatorErrorKind::InvalidRequest,
        "a reason is required: {e}"
    );
    let e = admin
        .resolve_conflicts(&[-1], &who, "checked")
        .await
        .unwrap_err();
    assert_eq!(e.kind, OperatorErrorKind::NotFound, "{e}");
    let r = admin
        .resolve_conflicts(&[open[0].id], &who, "producer fixed in release 42")
        .await
        .unwrap();
    assert_eq!(r.resolved, 1);
    assert!(
        admin
            .conflicts(ConflictFilter::OPEN, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(inbox.conflict_count(&db.pool).await.unwrap(), 0);
    let all = admin
        .conflicts(ConflictFilter::default(), 10)
        .await
        .unwrap();
    assert!(all[0].resolved_at.is_some());
    assert_eq!(all[0].resolved_by.as_deref(), Some("oncall"));
    assert_eq!(
        all[0].resolution_reason.as_deref(),
        Some("producer fixed in release 42")
    );
    // Resolving it again changes nothing, and is recorded as an action that changed nothing.
    let again = admin
        .resolve_conflicts(&[open[0].id], &who, "twice")
        .await
        .unwrap();
    assert_eq!(again.resolved, 0);
    let audit = admin.audit(None, 10).await.unwrap();
    assert_eq!(audit.len(), 2);
    assert_eq!((audit[0].id, audit[0].affected), (again.audit_id, 0));
    assert_eq!(
        admin
            .conflicts(ConflictFilter::default(), 10)
            .await
            .unwrap()[0]
            .resolution_reason
            .as_deref(),
        Some("producer fixed in release 42"),
        "the first resolution stands"
    );

    // The same conflicting payload again: open again, counted twice; the effect is still one.
    deliver(
        &db.pool,
        &inbox,
        &table,
        "ledger",
        OrderingGuard::Off,
        &changed,
    )
    .await;
    let open = admin.conflicts(ConflictFilter::OPEN, 10).await.unwrap();
    assert_eq!(open.len(), 1, "reopened");
    assert_eq!(open[0].occurrences, 2);
    assert_eq!(
        (open[0].resolved_at, open[0].resolved_by.as_deref()),
        (None, None)
    );
    assert_eq!(effects(&db, &table, "ledger").await, 1);
    db.drop().await;
}

/// A stored fingerprint that is not 32 bytes (a row damaged by hand) is an error naming the
/// column, never read as zeros: zeros would make every redelivery of that event a conflict.
#[tokio::test]
async fn a_corrupt_stored_fingerprint_is_an_error_not_a_conflict() {
    let db = TestDb::new().await;
    let table = effects_table(&db).await;
    let inbox = PgInbox::new(db.schema.clone());
    let e = event(Uuid::now_v7(), "p1", 1, "{\"a\":1}");
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "c", OrderingGuard::Off, &e).await,
        InboxOutcome::New
    );
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{}\".inbox SET payload_sha256 = '\\x0102'::bytea WHERE event_id = $1",
        db.schema
    )))
    .bind(e.event_id)
    .execute(&db.pool)
    .await
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let err = inbox
        .record(&mut tx, "c", OrderingGuard::Off, &e)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("corrupt inbox.payload_sha256: 2 bytes"),
        "{err}"
    );
    tx.rollback().await.unwrap();
    let conflicts: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".inbox_conflicts",
        db.schema
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        conflicts, 0,
        "a corrupt row must not be recorded as a conflict"
    );
    assert_eq!(effects(&db, &table, "c").await, 1);
    db.drop().await;
}
