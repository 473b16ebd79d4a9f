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
async fn repeated_deliveries_give_one_effect_and_count_duplicates() {
    let db = TestDb::new().await;
    let table = effects_table(&db).await;
    let inbox = PgInbox::new(db.schema.clone());
    let e = event(Uuid::now_v7(), "p1", 1, r#"{"amount":100}"#);
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        outcomes.push(
            deliver(
                &db.pool,
                &inbox,
                &table,
                "reporting",
                OrderingGuard::Off,
                &e,
            )
            .await,
        );
    }
    assert_eq!(outcomes[0], InboxOutcome::New);
    assert!(outcomes[1..].iter().all(|o| *o == InboxOutcome::Duplicate));
    assert_eq!(effects(&db, &table, "reporting").await, 1);
    db.drop().await;
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

#[tokio::test]
async fn a_different_payload_under_the_same_id_is_a_recorded_conflict() {
    let db = TestDb::new().await;
    let table = effects_table(&db).await;
    let inbox = PgInbox::new(db.schema.clone());
    let id = Uuid::now_v7();
    let first = event(id, "p1", 1, r#"{"amount":100}"#);
    let forged = event(id, "p1", 1, r#"{"amount":999}"#);
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "c", OrderingGuard::Off, &first).await,
        InboxOutcome::New
    );
    for _ in 0..2 {
        let o = deliver(&db.pool, &inbox, &table, "c", OrderingGuard::Off, &forged).await;
        assert_eq!(
            o,
            InboxOutcome::Conflict {
                stored: first.fingerprint
            }
        );
    }
    assert_eq!(
        effects(&db, &table, "c").await,
        1,
        "a conflict is never applied"
    );
    let conflicts = inbox.conflicts(&db.pool, 10).await.unwrap();
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0].event_id, id);
    assert_eq!(conflicts[0].stored, first.fingerprint);
    assert_eq!(conflicts[0].received, forged.fingerprint);
    assert_eq!(conflicts[0].occurrences, 2);
    assert_eq!(inbox.conflict_count(&db.pool).await.unwrap(), 1);
    db.drop().await;
}

#[tokio::test]
async fn two_consumers_each_get_their_one_effect() {
    let db = TestDb::new().await;
    let table = effects_table(&db).await;
    let inbox = PgInbox::new(db.schema.clone());
    let e = event(Uuid::now_v7(), "p1", 1, "{}");
    for consumer in ["reporting", "ledger", "reporting", "ledger"] {
        deliver(&db.pool, &inbox, &table, consumer, OrderingGuard::Off, &e).await;
    }
    assert_eq!(effects(&db, &table, "reporting").await, 1);
    assert_eq!(effects(&db, &table, "ledger").await, 1);
    db.drop().await;
}

#[tokio::test]
async fn ordering_guard_absorbs_stale_versions_and_follows_the_gap_policy() {
    let db = TestDb::new().await;
    let table = effects_table(&db).await;
    let inbox = PgInbox::new(db.schema.clone());
    let ev = |v: i64| event(Uuid::now_v7(), "p1", v, &format!("{{\"v\":{v}}}"));

    // Wait: a gap is refused (rolled back) until the missing version arrived.
    let (v1, v2, v3) = (ev(1), ev(2), ev(3));
    let w = OrderingGuard::Wait;
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "wait", w, &v1).await,
        InboxOutcome::New
    );
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "wait", w, &v3).await,
        InboxOutcome::Gap { last_applied: 1 }
    );
    assert_eq!(effects(&db, &table, "wait").await, 1);
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "wait", w, &v2).await,
        InboxOutcome::New
    );
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "wait", w, &v3).await,
        InboxOutcome::New,
        "redelivery after the gap closed"
    );
    let older = ev(2); // another event carrying an already-applied version
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "wait", w, &older).await,
        InboxOutcome::Stale { last_applied: 3 }
    );
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "wait", w, &older).await,
        InboxOutcome::Duplicate
    );
    assert_eq!(effects(&db, &table, "wait").await, 3);
    let first_seen_late = event(Uuid::now_v7(), "p9", 4, "{}");
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "wait", w, &first_seen_late).await,
        InboxOutcome::Gap { last_applied: 0 }
    );

    // ApplyAnyway: a gap is applied, an older version afterwards is stale.
    let a = OrderingGuard::ApplyAnyway;
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "any", a, &v1).await,
        InboxOutcome::New
    );
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "any", a, &v3).await,
        InboxOutcome::New
    );
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "any", a, &v2).await,
        InboxOutcome::Stale { last_applied: 3 }
    );
    assert_eq!(effects(&db, &table, "any").await, 2);
    db.drop().await;
}

#[tokio::test]
async fn retention_deletes_only_identities_older_than_the_horizon_on_one_elected_instance() {
    use outbox_core::maintenance::{
        InboxRetention, Maintainer, MaintenanceConfig, MaintenanceStore, ReplayHorizon, RoundReport,
    };
    use outbox_postgres::{PgStore, PgStoreConfig};
    let db = TestDb::new().await;
    let table = effects_table(&db).await;
    let inbox = PgInbox::new(db.schema.clone());
    let old: Vec<_> = (0..5)
        .map(|i| event(Uuid::now_v7(), &format!("o{i}"), 1, "{}"))
        .collect();
    let young = event(Uuid::now_v7(), "y", 1, "{}");
    for e in old.iter().chain([&young]) {
        deliver(&db.pool, &inbox, &table, "c", OrderingGuard::Off, e).await;
    }
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{}\".inbox SET received_at = now() - interval '3 days' WHERE aggregate_id LIKE 'o%'",
        db.schema
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let retention = InboxRetention {
        keep: Duration::from_secs(2 * 86_400),
        horizon: ReplayHorizon {
            broker_retention: Duration::from_secs(86_400),
            outbox_retention: Duration::ZERO,
            dead_letter_requeue_window: Duration::from_secs(2 * 86_400),
        },
    };
    let config = MaintenanceConfig {
        inbox: Some(retention),
        batch_size: 2,
        ..MaintenanceConfig::default()
    };
    let store = PgStore::new(
        db.pool.clone(),
        PgStoreConfig {
            schema: db.schema.clone(),
            ..PgStoreConfig::default()
        },
    );
    let a = Maintainer::new(store.clone(), config.clone()).unwrap();
    let b = Maintainer::new(store.clone(), config.clone()).unwrap();
    let mut ca = store.maintenance_session().await.unwrap();
    let mut cb = store.maintenance_session().await.unwrap();
    assert_eq!(
        a.round(&mut ca).await.unwrap().map(|r| r.inbox),
        Some(5),
        "leader deletes the old ones, in batches"
    );
    assert_eq!(
        b.round(&mut cb).await.unwrap(),
        None,
        "the other instance is not the maintainer"
    );
    let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".inbox",
        db.schema
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(left, 1);
    // A redelivery of the young event is still absorbed.
    assert_eq!(
        deliver(&db.pool, &inbox, &table, "c", OrderingGuard::Off, &young).await,
        InboxOutcome::Duplicate
    );
    // Leadership moves when the leader's session ends.
    drop(ca);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        b.round(&mut cb).await.unwrap(),
        Some(RoundReport::default())
    );
    // An unsafe configuration is refused up front.
    let unsafe_cfg = MaintenanceConfig {
        inbox: Some(InboxRetention {
            keep: Duration::from_secs(3600),
            ..retention
        }),
        ..config
    };
    let err = Maintainer::new(store, unsafe_cfg).err().unwrap();
    assert!(
        err.to_string().contains("3600") && err.to_string().contains("172800"),
        "{err}"
    );
    db.drop().await;
}

#[tokio::test]
async fn record_many_decides_exactly_as_record_one_by_one() {
    let db = TestDb::new().await;
    let inbox = PgInbox::new(db.schema.clone());
    let known = event(Uuid::now_v7(), "k", 1, r#"{"a":1}"#);
    let mut tx = db.pool.begin().await.unwrap();
    inbox
        .record(&mut tx, "c", OrderingGuard::Off, &known)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let fresh = event(Uuid::now_v7(), "f", 1, r#"{"a":2}"#);
    let known_forged = event(known.event_id, "k", 1, r#"{"a":999}"#);
    let fresh_forged = event(fresh.event_id, "f", 1, r#"{"a":998}"#);
    let batch = [&fresh, &known, &fresh, &known_forged, &fresh_forged];
    let mut tx = db.pool.begin().await.unwrap();
    let many = inbox.record_many(&mut tx, "c", &batch).await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let mut one_by_one = Vec::new();
    for e in batch {
        one_by_one.push(
            inbox
                .record(&mut tx, "c", OrderingGuard::Off, e)
                .await
                .unwrap(),
        );
    }
    tx.rollback().await.unwrap();
    assert_eq!(many, one_by_one);
    assert_eq!(
        many,
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
    db.drop().await;
}
