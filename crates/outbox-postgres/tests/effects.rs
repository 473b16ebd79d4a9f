//! The PostgreSQL-specific remote-effect API against the real server: enqueue on the
//! consumer's transaction (rollback, redelivery, key conflicts), operator resolution and
//! listing. The executor itself runs the engine suite (`conformance.rs`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::TestDb;
use outbox_core::Backoff;
use outbox_core::effect::{Executor, ExecutorConfig};
use outbox_postgres::{
    EffectsError, EnqueueOutcome, NewWorkItem, PgEffects, PgExecutor, PgStore, PgStoreConfig,
    Resolution, Schema, WorkItemRow, idempotency_key,
};
use outbox_testkit::fakes::{CallMode, FakeProvider};
use serde_json::json;
use uuid::Uuid;

const KIND: &str = "payout";

fn config() -> ExecutorConfig {
    ExecutorConfig {
        batch_size: 8,
        concurrency: 4,
        lease: Duration::from_secs(3),
        call_timeout: Duration::from_millis(300),
        poll_interval: Duration::from_millis(50),
        reconcile_after: Duration::from_millis(100),
        lookup_backoff: Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        retry_backoff: Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        ..ExecutorConfig::new(KIND)
    }
}

fn store(db: &TestDb) -> PgStore {
    PgStore::new(
        db.pool.clone(),
        PgStoreConfig {
            schema: db.schema.clone(),
            ..PgStoreConfig::default()
        },
    )
}

fn executor(db: &TestDb, mode: CallMode, config: ExecutorConfig) -> Arc<PgExecutor<FakeProvider>> {
    Arc::new(Executor::new(store(db), FakeProvider::new(mode), config).expect("valid config"))
}

fn new_item(consumer: &str) -> NewWorkItem {
    NewWorkItem::for_event(
        KIND,
        consumer,
        Uuid::now_v7(),
        json!({"amount": 100, "beneficiary": "acme"}),
    )
}

/// Enqueues `item` in its own committed transaction.
async fn enqueue(db: &TestDb, item: &NewWorkItem) -> i64 {
    let effects = PgEffects::new(db.schema.clone());
    let mut tx = db.pool.begin().await.unwrap();
    let out = effects.enqueue(&mut tx, item).await.unwrap();
    tx.commit().await.unwrap();
    match out {
        EnqueueOutcome::Inserted { id } => id,
        other => panic!("expected a new item, got {other:?}"),
    }
}

async fn row(db: &TestDb, id: i64) -> WorkItemRow {
    PgEffects::new(db.schema.clone())
        .list(&db.pool, None, 1000)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("work item {id} missing"))
}

#[tokio::test]
async fn enqueue_in_a_rolled_back_transaction_leaves_nothing() {
    let db = TestDb::new().await;
    let effects = PgEffects::new(db.schema.clone());
    let item = new_item("ledger");

    let mut tx = db.pool.begin().await.unwrap();
    let out = effects.enqueue(&mut tx, &item).await.unwrap();
    assert!(matches!(out, EnqueueOutcome::Inserted { .. }), "{out:?}");
    tx.rollback().await.unwrap();
    assert!(effects.list(&db.pool, None, 10).await.unwrap().is_empty());

    // Committed, the item is there with the stable key and its origin.
    let id = enqueue(&db, &item).await;
    let r = row(&db, id).await;
    let event_id = item.event_id.unwrap();
    assert_eq!(r.idempotency_key, format!("payout:ledger:{event_id}"));
    assert_eq!(r.idempotency_key, idempotency_key(KIND, "ledger", event_id));
    assert_eq!(r.event_id, Some(event_id));
    assert_eq!(r.consumer_name.as_deref(), Some("ledger"));
    assert_eq!((r.state.as_str(), r.attempts, r.lookups), ("pending", 0, 0));
    assert_eq!(r.payload_sha256.len(), 32);
    db.drop().await;
}

#[tokio::test]
async fn enqueue_same_key_same_payload_is_already_present() {
    let db = TestDb::new().await;
    let effects = PgEffects::new(db.schema.clone());
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;

    let mut tx = db.pool.begin().await.unwrap();
    let again = effects.enqueue(&mut tx, &item.clone()).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again, EnqueueOutcome::AlreadyPresent { id });
    assert_eq!(effects.stats(&db.pool, None).await.unwrap().pending, 1);
    db.drop().await;
}

#[tokio::test]
async fn enqueue_same_key_different_payload_or_kind_is_a_conflict() {
    let db = TestDb::new().await;
    let effects = PgEffects::new(db.schema.clone());
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;

    let other_payload = NewWorkItem {
        payload: json!({"amount": 999, "beneficiary": "acme"}),
        ..item.clone()
    };
    let other_kind = NewWorkItem {
        kind: "refund".into(),
        ..item.clone()
    };
    for changed in [other_payload, other_kind] {
        let mut tx = db.pool.begin().await.unwrap();
        match effects.enqueue(&mut tx, &changed).await {
            Err(EffectsError::KeyConflict {
                key,
                existing_id,
                existing_kind,
            }) => {
                assert_eq!(key, item.idempotency_key);
                assert_eq!(existing_id, id);
                assert_eq!(existing_kind, KIND);
            }
            other => panic!("expected a key conflict, got {other:?}"),
        }
        tx.rollback().await.unwrap();
    }
    let rows = effects.list(&db.pool, None, 10).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].payload, item.payload, "the first payload stays");
    db.drop().await;
}

#[tokio::test]
async fn resolve_applies_only_to_unknown_or_failed_items() {
    let db = TestDb::new().await;
    let effects = PgEffects::new(db.schema.clone());
    let id = enqueue(&db, &new_item("ledger")).await;

    for res in [
        Resolution::Succeeded {
            reference: "r".into(),
        },
        Resolution::Failed { reason: "x".into() },
        Resolution::Resend,
    ] {
        match effects.resolve(&db.pool, id, res).await {
            Err(EffectsError::NotResolvable { id: i, state, .. }) => {
                assert_eq!((i, state.as_str()), (id, "pending"));
            }
            other => panic!("pending items are not resolvable: {other:?}"),
        }
    }
    assert!(matches!(
        effects.resolve(&db.pool, id + 1000, Resolution::Resend).await,
        Err(EffectsError::NotFound { id: missing }) if missing == id + 1000
    ));

    // unknown -> failed by hand; failed -> resend is allowed, failed -> succeeded is not.
    let ex = executor(&db, CallMode::LostUnknown, config());
    ex.run_once().await.unwrap();
    assert_eq!(row(&db, id).await.state, "unknown");
    let r = effects
        .resolve(
            &db.pool,
            id,
            Resolution::Failed {
                reason: "confirmed with the provider's support".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(r.state, "failed");
    assert!(r.resolved_at.is_some());
    assert!(matches!(
        effects
            .resolve(
                &db.pool,
                id,
                Resolution::Succeeded {
                    reference: "r".into()
                }
            )
            .await,
        Err(EffectsError::NotResolvable { .. })
    ));
    let r = effects
        .resolve(&db.pool, id, Resolution::Resend)
        .await
        .unwrap();
    assert_eq!((r.state.as_str(), r.resolved_at), ("pending", None));
    db.drop().await;
}

#[tokio::test]
async fn list_refuses_unknown_states_and_a_missing_schema_says_migrate() {
    let db = TestDb::new().await;
    let effects = PgEffects::new(db.schema.clone());
    assert!(matches!(
        effects.list(&db.pool, Some("done"), 10).await,
        Err(EffectsError::InvalidArgument { name: "state", .. })
    ));
    let missing =
        PgEffects::new(Schema::new(&format!("nope_{}", Uuid::now_v7().simple())).unwrap());
    assert!(matches!(
        missing.stats(&db.pool, None).await,
        Err(EffectsError::NotMigrated { .. })
    ));
    db.drop().await;
}
