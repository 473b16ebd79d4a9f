//! Business transactions end to end: a rollback publishes nothing, a commit publishes exactly
//! its events (G1, G2, G3), and a late-committing transaction with a lower id is never skipped.
#![allow(missing_docs)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use outbox_core::Backoff;
use outbox_core::relay::{Relay, RelayConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn relay_config() -> RelayConfig {
    RelayConfig {
        lease: Duration::from_secs(2),
        publish_timeout: Duration::from_millis(500),
        lease_safety_margin: Duration::from_millis(200),
        poll_interval: Duration::from_millis(50),
        stats_interval: Duration::from_secs(1),
        backoff: Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(1),
        },
        ..RelayConfig::default()
    }
}

/// An in-process relay; stopped by cancelling the token.
async fn start_relay(db: &TestDb, broker: &BrokerEnv) -> (CancellationToken, JoinHandle<()>) {
    let transport = broker.transport(&broker.url()).await;
    let relay = Arc::new(
        Relay::new(Arc::new(db.store()), Arc::new(transport), relay_config()).expect("config"),
    );
    let token = CancellationToken::new();
    let handle = tokio::spawn(relay.run(token.clone()));
    (token, handle)
}

async fn stop_relay((token, handle): (CancellationToken, JoinHandle<()>)) {
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), handle)
        .await
        .expect("relay did not stop after cancel")
        .expect("relay task panicked");
}

async fn rollback_publishes_nothing_commit_publishes_exactly_its_events(kind: Kind) {
    let db = TestDb::new().await;
    let broker = BrokerEnv::new(kind).await;
    let sub = broker.subscriber().await;
    db.exec("CREATE TABLE {s}.payments (id text PRIMARY KEY, amount bigint NOT NULL)")
        .await;
    let insert_payment = db.sql("INSERT INTO {s}.payments (id, amount) VALUES ($1, $2)");
    let relay = start_relay(&db, &broker).await;

    // A transaction that rolls back: business row and intents vanish together.
    let mut rolled_back = Vec::new();
    {
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(insert_payment.clone()))
            .bind("pay-rb")
            .bind(100_i64)
            .execute(&mut *tx)
            .await
            .unwrap();
        for _ in 0..2 {
            let v = db
                .outbox
                .next_aggregate_version(&mut *tx, "payment", "pay-rb")
                .await
                .unwrap();
            let m = event("pay-rb", v);
            db.outbox.enqueue(&mut *tx, &m).await.unwrap();
            rolled_back.push(m.event_id);
        }
        // The intents exist inside the transaction ...
        let inside: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(
            db.sql("SELECT count(*) FROM {s}.events WHERE aggregate_id = 'pay-rb'"),
        ))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(inside, 2);
        // ... and the relay polls meanwhile without seeing them.
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.rollback().await.unwrap();
    }

    // A transaction that commits: two payments, four events.
    let mut committed = Vec::new();
    {
        let mut tx = db.pool.begin().await.unwrap();
        for (id, events) in [("pay-ok-1", 3), ("pay-ok-2", 1)] {
            sqlx::query(sqlx::AssertSqlSafe(insert_payment.clone()))
                .bind(id)
                .bind(250_i64)
                .execute(&mut *tx)
                .await
                .unwrap();
            for _ in 0..events {
                let v = db
                    .outbox
                    .next_aggregate_version(&mut *tx, "payment", id)
                    .await
                    .unwrap();
                let m = event(id, v).with_header("tenant", "acme");
                db.outbox.enqueue(&mut *tx, &m).await.unwrap();
                committed.push(m);
            }
        }
        tx.commit().await.unwrap();
    }

    // G1 in the database.
    assert_eq!(
        db.scalar("SELECT count(*) FROM {s}.payments WHERE id = 'pay-rb'")
            .await,
        0
    );
    assert_eq!(db.count("aggregate_id = 'pay-rb'").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM {s}.payments").await, 2);

    let ids: Vec<Uuid> = committed.iter().map(|m| m.event_id).collect();
    sub.wait_ids(&ids, Duration::from_secs(20)).await;
    wait_until(Duration::from_secs(10), "outbox drained", || {
        let db = &db;
        async move { db.count("true").await == 0 }
    })
    .await;
    // Give a stray publish time to show up before checking "exactly".
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = sub.snapshot();
    let seen_ids: Vec<Uuid> = seen.iter().map(|r| r.event_id).collect();
    for rb in &rolled_back {
        assert!(
            !seen_ids.contains(rb),
            "a rolled-back event was published (G1/G2)"
        );
    }
    assert_eq!(
        seen.len(),
        committed.len(),
        "exactly the committed events: {seen:#?}"
    );
    assert_eq!(
        seen_ids.iter().collect::<HashSet<_>>(),
        ids.iter().collect::<HashSet<_>>()
    );
    assert_strictly_increasing(&seen);
    for m in &committed {
        let r = seen.iter().find(|r| r.event_id == m.event_id).unwrap();
        assert_eq!(r.aggregate_id, m.aggregate_id);
        assert_eq!(r.version, m.aggregate_version);
        assert_eq!(r.payload, m.payload.bytes.to_vec());
        assert_eq!(r.headers.get("tenant").map(String::as_str), Some("acme"));
    }

    stop_relay(relay).await;
    drop(sub);
    broker.cleanup().await;
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_rollback_publishes_nothing_commit_publishes_exactly_its_events() {
    rollback_publishes_nothing_commit_publishes_exactly_its_events(Kind::Nats).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_rollback_publishes_nothing_commit_publishes_exactly_its_events() {
    rollback_publishes_nothing_commit_publishes_exactly_its_events(Kind::Rabbit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_rollback_publishes_nothing_commit_publishes_exactly_its_events() {
    rollback_publishes_nothing_commit_publishes_exactly_its_events(Kind::Kafka).await;
}

/// G2: T1 enqueues first (lower id) but commits only after T2 committed and T2's event was
/// already published. T1's event must still leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_late_commit_with_lower_id_is_not_skipped() {
    let db = TestDb::new().await;
    let broker = BrokerEnv::new(Kind::Nats).await;
    let sub = broker.subscriber().await;
    let relay = start_relay(&db, &broker).await;

    let late = event("pay-late", 1);
    let mut t1 = db.pool.begin().await.unwrap();
    db.outbox.enqueue(&mut *t1, &late).await.unwrap();
    let id_sql = db.sql("SELECT id FROM {s}.events WHERE event_id = $1");
    let t1_id: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(id_sql.clone()))
        .bind(late.event_id)
        .fetch_one(&mut *t1)
        .await
        .unwrap();

    // T2's id is read inside T2: once T2 commits, the running relay may publish and delete
    // the row before a later read.
    let early = event("pay-early", 1);
    let mut t2 = db.pool.begin().await.unwrap();
    db.outbox.enqueue(&mut *t2, &early).await.unwrap();
    let t2_id: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(id_sql))
        .bind(early.event_id)
        .fetch_one(&mut *t2)
        .await
        .unwrap();
    t2.commit().await.unwrap();
    assert!(
        t1_id < t2_id,
        "T1 must hold the lower id ({t1_id} vs {t2_id})"
    );

    // The relay publishes T2's event while T1 is still open ...
    sub.wait_ids(&[early.event_id], Duration::from_secs(15))
        .await;
    wait_until(Duration::from_secs(10), "T2's row marked", || {
        let db = &db;
        async move { db.count("true").await == 0 }
    })
    .await;
    // ... and keeps polling past T1's id for a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sub.len(), 1, "only T2's event can have left so far");

    t1.commit().await.unwrap();
    let seen = sub
        .wait_ids(&[late.event_id], Duration::from_secs(15))
        .await;
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].event_id, early.event_id);
    assert_eq!(seen[1].event_id, late.event_id);
    wait_until(Duration::from_secs(10), "T1's row marked", || {
        let db = &db;
        async move { db.count("true").await == 0 }
    })
    .await;

    stop_relay(relay).await;
    drop(sub);
    broker.cleanup().await;
    db.drop().await;
}
