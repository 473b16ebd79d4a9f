//! Remote effects against the real PostgreSQL: work items enqueued in the consumer's
//! transaction, the executor's claim / call / record, unknown outcomes and reconciliation,
//! lease expiry and fencing, operator resolution. The provider is an in-process fake that
//! records every call and lookup per key and remembers which effects it really performed.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::TestDb;
use outbox_core::Backoff;
use outbox_core::effect::{Executor, ExecutorConfig, LEASE_EXPIRED_REASON, PARKED_REASON};
use outbox_core::{CallOutcome, LookupOutcome, RemoteEffect, WorkItem};
use outbox_postgres::{
    EffectsError, EnqueueOutcome, NewWorkItem, PgEffects, PgExecutor, PgStore, PgStoreConfig,
    Resolution, Schema, WorkItemRow, idempotency_key,
};
use serde_json::json;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

const KIND: &str = "payout";

/// How the fake answers a call.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CallMode {
    /// Perform (once per key when honouring keys) and answer `Succeeded`.
    Succeed,
    /// Perform, then take `Duration` before answering `Succeeded` (a slow or hung provider).
    SucceedAfter(Duration),
    /// The request is lost before the provider sees it, but the caller cannot tell: `Unknown`.
    LostUnknown,
    /// The request provably never left: `NotSent`.
    NotSent,
    /// The provider refuses: `Failed`.
    Fail,
}

#[derive(Debug)]
struct FakeState {
    mode: CallMode,
    /// Keys whose calls take this long (overrides `mode`'s timing; they still succeed).
    slow_keys: HashMap<String, Duration>,
    /// Answer every lookup with `Unknown`.
    lookup_unknown: bool,
    /// Whether a second call with a known key returns the first result instead of acting again.
    honour_keys: bool,
    /// Every call, in order, by key.
    calls: Vec<String>,
    /// Every lookup, in order, by key.
    lookups: Vec<String>,
    /// Effects really performed: key -> reference.
    done: HashMap<String, String>,
    /// How many effects were performed in total (more than `done.len()` means a double payout).
    performed: usize,
}

/// An in-process provider with switches; never a real service.
#[derive(Debug)]
struct FakeProvider(Mutex<FakeState>);

impl FakeProvider {
    fn new(mode: CallMode) -> Self {
        Self(Mutex::new(FakeState {
            mode,
            slow_keys: HashMap::new(),
            lookup_unknown: false,
            honour_keys: true,
            calls: Vec::new(),
            lookups: Vec::new(),
            done: HashMap::new(),
            performed: 0,
        }))
    }

    fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }

    fn set_mode(&self, mode: CallMode) {
        self.with(|s| s.mode = mode);
    }

    fn calls_for(&self, key: &str) -> usize {
        self.with(|s| s.calls.iter().filter(|k| *k == key).count())
    }

    fn lookups_for(&self, key: &str) -> usize {
        self.with(|s| s.lookups.iter().filter(|k| *k == key).count())
    }

    /// Performs the effect for `key` (or returns the earlier result when honouring keys).
    fn perform(s: &mut FakeState, key: &str) -> String {
        if s.honour_keys
            && let Some(r) = s.done.get(key)
        {
            return r.clone();
        }
        s.performed += 1;
        let reference = format!("ref-{}-{key}", s.performed);
        s.done.insert(key.to_owned(), reference.clone());
        reference
    }
}

impl RemoteEffect for FakeProvider {
    async fn call(&self, item: &WorkItem) -> CallOutcome {
        let key = item.idempotency_key.clone();
        let (outcome, wait) = self.with(|s| {
            s.calls.push(key.clone());
            let slow = s.slow_keys.get(&key).copied();
            match s.mode {
                CallMode::Succeed => (
                    CallOutcome::Succeeded {
                        reference: Self::perform(s, &key),
                    },
                    slow,
                ),
                CallMode::SucceedAfter(d) => (
                    CallOutcome::Succeeded {
                        reference: Self::perform(s, &key),
                    },
                    Some(d),
                ),
                CallMode::LostUnknown => (
                    CallOutcome::Unknown {
                        reason: "connection reset".into(),
                    },
                    None,
                ),
                CallMode::NotSent => (
                    CallOutcome::NotSent {
                        reason: "connection refused".into(),
                    },
                    None,
                ),
                CallMode::Fail => (
                    CallOutcome::Failed {
                        reason: "insufficient funds".into(),
                    },
                    None,
                ),
            }
        });
        if let Some(d) = wait {
            tokio::time::sleep(d).await;
        }
        outcome
    }

    async fn lookup(&self, item: &WorkItem) -> LookupOutcome {
        self.with(|s| {
            s.lookups.push(item.idempotency_key.clone());
            if s.lookup_unknown {
                LookupOutcome::Unknown {
                    reason: "503".into(),
                }
            } else if let Some(r) = s.done.get(&item.idempotency_key) {
                LookupOutcome::Succeeded {
                    reference: r.clone(),
                }
            } else {
                LookupOutcome::NotFound
            }
        })
    }
}

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

/// Makes every scheduled call and lookup due now (instead of sleeping through backoffs).
async fn make_due(db: &TestDb) {
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{}\".work_items SET next_attempt_at = now()",
        db.schema
    )))
    .execute(&db.pool)
    .await
    .unwrap();
}

/// Seconds from now until the item's next attempt (negative when due).
async fn due_in(db: &TestDb, id: i64) -> f64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT extract(epoch FROM next_attempt_at - now())::float8 FROM \"{}\".work_items \
         WHERE id = $1",
        db.schema
    )))
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
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
async fn happy_path_succeeds_with_reference_and_exactly_one_call() {
    let db = TestDb::new().await;
    let ex = executor(&db, CallMode::Succeed, config());
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;

    let report = ex.run_once().await.unwrap();
    assert_eq!((report.called, report.succeeded), (1, 1), "{report:?}");
    let r = row(&db, id).await;
    assert_eq!(r.state, "succeeded");
    let provider_ref = ex
        .provider()
        .with(|s| s.done[&item.idempotency_key].clone());
    assert_eq!(r.reference.as_deref(), Some(provider_ref.as_str()));
    assert!(r.resolved_at.is_some());
    assert_eq!((r.attempts, r.lease_token, r.lease_until), (1, None, None));

    let report = ex.run_once().await.unwrap();
    assert!(!report.changed(), "{report:?}");
    assert_eq!(ex.provider().calls_for(&item.idempotency_key), 1);
    db.drop().await;
}

#[tokio::test]
async fn failed_call_is_terminal() {
    let db = TestDb::new().await;
    let ex = executor(&db, CallMode::Fail, config());
    let id = enqueue(&db, &new_item("ledger")).await;
    let report = ex.run_once().await.unwrap();
    assert_eq!(report.failed, 1, "{report:?}");
    let r = row(&db, id).await;
    assert_eq!(r.state, "failed");
    assert_eq!(r.last_error.as_deref(), Some("insufficient funds"));
    make_due(&db).await;
    assert_eq!(ex.run_once().await.unwrap().called, 0);
    db.drop().await;
}

/// The provider acts but answers after the timeout: unknown, then reconciled by lookup without
/// a second call. The unknown backlog in `stats()` rises and falls with it.
#[tokio::test]
async fn timeout_goes_unknown_and_lookup_settles_it_without_a_second_call() {
    let db = TestDb::new().await;
    let effects = PgEffects::new(db.schema.clone());
    let ex = executor(
        &db,
        CallMode::SucceedAfter(Duration::from_secs(2)),
        config(),
    );
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;

    let before = effects.stats(&db.pool, Some(KIND)).await.unwrap();
    assert_eq!((before.pending, before.unknown), (1, 0));
    let backlog = effects.backlog(&db.pool, Some(KIND)).await.unwrap();
    assert_eq!((backlog.pending, backlog.unknown), (1, 0));
    assert!(backlog.oldest_pending_age.is_some());
    assert!(before.oldest_pending_age.is_some());
    assert_eq!(before.oldest_unknown_age, None);

    let started = std::time::Instant::now();
    let report = ex.run_once().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(1500),
        "the call timeout (300 ms) must cut the 2 s call short"
    );
    assert_eq!((report.called, report.unknown), (1, 1), "{report:?}");
    let r = row(&db, id).await;
    assert_eq!(r.state, "unknown");
    assert!(r.unknown_since.is_some());
    assert!(
        r.last_error.as_deref().unwrap_or("").contains("timed out"),
        "{:?}",
        r.last_error
    );
    let gap = r.next_attempt_at - r.unknown_since.unwrap();
    assert!(
        gap >= chrono::Duration::milliseconds(100),
        "first lookup waits reconcile_after: {gap}"
    );

    let during = effects.stats(&db.pool, Some(KIND)).await.unwrap();
    assert_eq!((during.pending, during.unknown), (0, 1));
    assert!(during.oldest_unknown_age.is_some());
    assert_eq!(during.oldest_pending_age, None);
    // The executor's cheap view of the open states agrees.
    let backlog = effects.backlog(&db.pool, Some(KIND)).await.unwrap();
    assert_eq!(
        (backlog.pending, backlog.in_progress, backlog.unknown),
        (0, 0, 1)
    );
    assert!(backlog.oldest_unknown_age.is_some());
    assert_eq!(backlog.oldest_pending_age, None);
    assert_eq!(
        effects
            .backlog(&db.pool, Some("other"))
            .await
            .unwrap()
            .unknown,
        0
    );
    assert_eq!(effects.backlog(&db.pool, None).await.unwrap().unknown, 1);

    // Even with a provider that would now answer at once, no new call is made.
    ex.provider().set_mode(CallMode::Succeed);
    make_due(&db).await;
    let report = ex.run_once().await.unwrap();
    assert_eq!(
        (report.called, report.looked_up, report.reconciled_succeeded),
        (0, 1, 1),
        "{report:?}"
    );
    let r = row(&db, id).await;
    assert_eq!(r.state, "succeeded");
    let provider_ref = ex
        .provider()
        .with(|s| s.done[&item.idempotency_key].clone());
    assert_eq!(r.reference.as_deref(), Some(provider_ref.as_str()));
    assert_eq!((r.attempts, r.lookups, r.unknown_since), (1, 1, None));
    assert_eq!(ex.provider().calls_for(&item.idempotency_key), 1);
    assert_eq!(ex.provider().with(|s| s.performed), 1);

    let after = effects.stats(&db.pool, Some(KIND)).await.unwrap();
    assert_eq!((after.unknown, after.succeeded), (0, 1));
    assert_eq!(after.oldest_unknown_age, None);
    let backlog = effects.backlog(&db.pool, Some(KIND)).await.unwrap();
    assert_eq!((backlog.pending, backlog.unknown), (0, 0));
    assert_eq!(backlog.oldest_unknown_age, None);
    db.drop().await;
}

#[tokio::test]
async fn lookup_without_answer_keeps_unknown_and_backs_off() {
    let db = TestDb::new().await;
    let ex = executor(&db, CallMode::LostUnknown, config());
    ex.provider().with(|s| s.lookup_unknown = true);
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;
    ex.run_once().await.unwrap();
    for n in 1..=2 {
        make_due(&db).await;
        let report = ex.run_once().await.unwrap();
        assert_eq!((report.called, report.still_unknown), (0, 1), "{report:?}");
        let r = row(&db, id).await;
        assert_eq!((r.state.as_str(), r.lookups), ("unknown", n));
        assert!(
            due_in(&db, id).await > 0.0,
            "next lookup is scheduled later"
        );
    }
    assert_eq!(ex.provider().calls_for(&item.idempotency_key), 1);
    assert_eq!(ex.provider().lookups_for(&item.idempotency_key), 2);
    db.drop().await;
}

#[tokio::test]
async fn lookup_not_found_with_resend_calls_again_with_the_same_key() {
    let db = TestDb::new().await;
    let ex = executor(&db, CallMode::LostUnknown, config());
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;

    assert_eq!(ex.run_once().await.unwrap().unknown, 1);
    ex.provider().set_mode(CallMode::Succeed);
    make_due(&db).await;
    let report = ex.run_once().await.unwrap();
    assert_eq!((report.looked_up, report.resent), (1, 1), "{report:?}");
    let r = row(&db, id).await;
    assert_eq!(r.state, "pending");
    assert_eq!(r.unknown_since, None);

    let report = ex.run_once().await.unwrap();
    assert_eq!((report.called, report.succeeded), (1, 1), "{report:?}");
    assert_eq!(row(&db, id).await.state, "succeeded");
    let calls = ex.provider().with(|s| s.calls.clone());
    assert_eq!(
        calls,
        vec![item.idempotency_key.clone(), item.idempotency_key.clone()],
        "both calls carry the same key"
    );
    assert_eq!(row(&db, id).await.attempts, 2);
    db.drop().await;
}

#[tokio::test]
async fn lookup_not_found_with_resend_disabled_parks_the_item() {
    let db = TestDb::new().await;
    let cfg = ExecutorConfig {
        resend_when_not_found: false,
        lookup_backoff: Backoff {
            base: Duration::from_millis(50),
            max: Duration::from_secs(30),
        },
        ..config()
    };
    let ex = executor(&db, CallMode::LostUnknown, cfg);
    let effects = PgEffects::new(db.schema.clone());
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;

    ex.run_once().await.unwrap();
    ex.provider().set_mode(CallMode::Succeed);
    make_due(&db).await;
    let report = ex.run_once().await.unwrap();
    assert_eq!((report.parked, report.resent), (1, 0), "{report:?}");
    let r = row(&db, id).await;
    assert_eq!(r.state, "unknown");
    assert_eq!(r.last_error.as_deref(), Some(PARKED_REASON));
    assert!(
        due_in(&db, id).await > 20.0,
        "parked items are looked up again only after the long backoff"
    );
    let report = ex.run_once().await.unwrap();
    assert!(!report.changed(), "{report:?}");
    assert_eq!(ex.provider().calls_for(&item.idempotency_key), 1);
    assert_eq!(
        effects
            .list(&db.pool, Some("unknown"), 10)
            .await
            .unwrap()
            .len(),
        1
    );

    // The operator decides to resend: the next call uses the same key.
    let r = effects
        .resolve(&db.pool, id, Resolution::Resend)
        .await
        .unwrap();
    assert_eq!(r.state, "pending");
    let report = ex.run_once().await.unwrap();
    assert_eq!(report.succeeded, 1, "{report:?}");
    assert_eq!(ex.provider().calls_for(&item.idempotency_key), 2);
    db.drop().await;
}

/// An executor that died between claim and record leaves `in_progress` with an expired lease:
/// the item becomes unknown (never pending) and the lookup finds the effect it performed.
#[tokio::test]
async fn expired_lease_goes_unknown_not_pending_and_is_reconciled() {
    let db = TestDb::new().await;
    let ex = executor(&db, CallMode::Succeed, config());
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;

    // The dead executor's claim, and the payout it made before dying.
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{s}\".work_items SET state = 'in_progress', attempts = 1, \
         lease_token = nextval('\"{s}\".lease_token_seq'), \
         lease_until = now() - interval '1 second' WHERE id = $1",
        s = db.schema
    )))
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    ex.provider()
        .with(|s| FakeProvider::perform(s, &item.idempotency_key));

    let report = ex.run_once().await.unwrap();
    assert_eq!((report.expired, report.called), (1, 0), "{report:?}");
    let r = row(&db, id).await;
    assert_eq!(r.state, "unknown");
    assert_eq!(r.last_error.as_deref(), Some(LEASE_EXPIRED_REASON));
    assert_eq!((r.lease_token, r.attempts), (None, 1));

    make_due(&db).await;
    let report = ex.run_once().await.unwrap();
    assert_eq!(report.reconciled_succeeded, 1, "{report:?}");
    let r = row(&db, id).await;
    assert_eq!(r.state, "succeeded");
    assert!(r.reference.is_some());
    assert_eq!(ex.provider().calls_for(&item.idempotency_key), 0);
    assert_eq!(ex.provider().with(|s| s.performed), 1, "exactly one payout");
    db.drop().await;
}

/// An executor whose lease was taken away while its call was in flight cannot record: the
/// other executor's verdict (unknown) stands, and reconciliation settles the item.
#[tokio::test]
async fn a_record_with_a_stale_lease_token_is_refused() {
    let db = TestDb::new().await;
    let slow = ExecutorConfig {
        call_timeout: Duration::from_secs(3),
        lease: Duration::from_secs(10),
        ..config()
    };
    let a = executor(
        &db,
        CallMode::SucceedAfter(Duration::from_millis(1500)),
        slow,
    );
    // B sweeps the expired lease; its long reconcile_after keeps A's own reconciliation pass
    // from settling the item in the same tick, so the refused record stays observable.
    let b = executor(
        &db,
        CallMode::Succeed,
        ExecutorConfig {
            reconcile_after: Duration::from_secs(60),
            ..config()
        },
    );
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;

    let task = tokio::spawn({
        let a = Arc::clone(&a);
        async move { a.run_once().await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while row(&db, id).await.state != "in_progress" {
        assert!(std::time::Instant::now() < deadline, "never claimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let token = row(&db, id).await.lease_token;
    assert!(token.is_some());
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{}\".work_items SET lease_until = now() - interval '1 millisecond' \
         WHERE id = $1",
        db.schema
    )))
    .bind(id)
    .execute(&db.pool)
    .await
    .unwrap();
    let report_b = b.run_once().await.unwrap();
    assert_eq!(report_b.expired, 1, "{report_b:?}");

    let report_a = task.await.unwrap().unwrap();
    assert_eq!(
        (report_a.lease_lost, report_a.succeeded),
        (1, 0),
        "{report_a:?}"
    );
    let r = row(&db, id).await;
    assert_eq!(r.state, "unknown", "the stale record changed nothing");
    assert_eq!(r.reference, None);
    assert_eq!(r.last_error.as_deref(), Some(LEASE_EXPIRED_REASON));

    make_due(&db).await;
    let report = a.run_once().await.unwrap();
    assert_eq!(report.reconciled_succeeded, 1, "{report:?}");
    assert_eq!(row(&db, id).await.state, "succeeded");
    assert_eq!(a.provider().with(|s| s.performed), 1);
    assert_eq!(b.provider().calls_for(&item.idempotency_key), 0);
    db.drop().await;
}

#[tokio::test]
async fn not_sent_is_retried_with_backoff_then_fails_at_the_limit() {
    let db = TestDb::new().await;
    let cfg = ExecutorConfig {
        max_not_sent_attempts: 2,
        retry_backoff: Backoff {
            base: Duration::from_secs(4),
            max: Duration::from_secs(60),
        },
        ..config()
    };
    let ex = executor(&db, CallMode::NotSent, cfg);
    let item = new_item("ledger");
    let id = enqueue(&db, &item).await;

    let report = ex.run_once().await.unwrap();
    assert_eq!((report.called, report.not_sent), (1, 1), "{report:?}");
    let r = row(&db, id).await;
    assert_eq!((r.state.as_str(), r.attempts), ("pending", 1));
    assert!(r.last_error.as_deref().unwrap().contains("not sent"));
    let wait = due_in(&db, id).await;
    assert!((1.5..=4.5).contains(&wait), "backoff 2-4 s, got {wait}");
    assert_eq!(
        ex.run_once().await.unwrap().called,
        0,
        "not before the backoff"
    );

    make_due(&db).await;
    let report = ex.run_once().await.unwrap();
    assert_eq!((report.called, report.failed), (1, 1), "{report:?}");
    let r = row(&db, id).await;
    assert_eq!((r.state.as_str(), r.attempts), ("failed", 2));
    assert!(
        r.last_error.as_deref().unwrap().contains("giving up"),
        "{:?}",
        r.last_error
    );
    assert_eq!(ex.provider().calls_for(&item.idempotency_key), 2);
    db.drop().await;
}

/// A slow call does not hold back the record of the fast ones in the same batch.
#[tokio::test]
async fn calls_of_a_batch_run_concurrently_and_record_independently() {
    let db = TestDb::new().await;
    let cfg = ExecutorConfig {
        call_timeout: Duration::from_secs(3),
        lease: Duration::from_secs(10),
        ..config()
    };
    let ex = executor(&db, CallMode::Succeed, cfg);
    let slow = new_item("ledger");
    let slow_id = enqueue(&db, &slow).await;
    let mut fast = HashSet::new();
    for _ in 0..3 {
        fast.insert(enqueue(&db, &new_item("ledger")).await);
    }
    ex.provider().with(|s| {
        s.slow_keys
            .insert(slow.idempotency_key.clone(), Duration::from_millis(2000))
    });

    let task = tokio::spawn({
        let ex = Arc::clone(&ex);
        async move { ex.run_once().await }
    });
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    loop {
        let rows = PgEffects::new(db.schema.clone())
            .list(&db.pool, Some("succeeded"), 10)
            .await
            .unwrap();
        if rows.len() == 3 {
            assert!(rows.iter().all(|r| fast.contains(&r.id)));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "fast items were not recorded while the slow call was in flight"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(row(&db, slow_id).await.state, "in_progress");
    let report = task.await.unwrap().unwrap();
    assert_eq!((report.called, report.succeeded), (4, 4), "{report:?}");
    assert_eq!(row(&db, slow_id).await.state, "succeeded");
    db.drop().await;
}

#[tokio::test]
async fn executors_do_not_touch_other_kinds() {
    let db = TestDb::new().await;
    let ex = executor(&db, CallMode::Succeed, config());
    let id = enqueue(
        &db,
        &NewWorkItem {
            kind: "refund".into(),
            ..new_item("ledger")
        },
    )
    .await;
    assert_eq!(ex.run_once().await.unwrap().called, 0);
    assert_eq!(row(&db, id).await.state, "pending");
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
async fn config_errors_name_the_key() {
    let db = TestDb::new().await;
    assert!(
        ExecutorConfig::new(KIND).validate().is_ok(),
        "defaults are valid"
    );
    let cases: Vec<(&str, ExecutorConfig)> = vec![
        ("kind", ExecutorConfig::new("")),
        (
            "batch_size",
            ExecutorConfig {
                batch_size: 0,
                ..config()
            },
        ),
        (
            "concurrency",
            ExecutorConfig {
                concurrency: 0,
                ..config()
            },
        ),
        (
            "call_timeout",
            ExecutorConfig {
                call_timeout: Duration::ZERO,
                ..config()
            },
        ),
        (
            "lease",
            ExecutorConfig {
                lease: Duration::from_secs(10),
                call_timeout: Duration::from_secs(10),
                ..ExecutorConfig::new(KIND)
            },
        ),
        (
            // 16 items, 1 at a time: the last one waits 15 calls under its lease.
            "lease",
            ExecutorConfig {
                concurrency: 1,
                ..ExecutorConfig::new(KIND)
            },
        ),
        (
            "retry_backoff",
            ExecutorConfig {
                retry_backoff: Backoff {
                    base: Duration::from_secs(2),
                    max: Duration::from_secs(1),
                },
                ..config()
            },
        ),
        (
            "max_not_sent_attempts",
            ExecutorConfig {
                max_not_sent_attempts: 0,
                ..config()
            },
        ),
    ];
    for (expected, cfg) in cases {
        match PgExecutor::new(store(&db), FakeProvider::new(CallMode::Succeed), cfg) {
            Err(e) => {
                assert_eq!(e.key, expected, "{e}");
                assert!(e.to_string().contains(expected), "{e}");
            }
            Ok(_) => panic!("expected a config error naming {expected}"),
        }
    }
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

/// `run` drives items to completion and stops on cancellation.
#[tokio::test]
async fn run_loop_processes_and_stops_on_shutdown() {
    let db = TestDb::new().await;
    let ex = executor(&db, CallMode::Succeed, config());
    let ids = [
        enqueue(&db, &new_item("ledger")).await,
        enqueue(&db, &new_item("ledger")).await,
    ];
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(Arc::clone(&ex).run(shutdown.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for id in ids {
        while row(&db, id).await.state != "succeeded" {
            assert!(
                std::time::Instant::now() < deadline,
                "run did not settle {id}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("run stops on shutdown")
        .unwrap();
    assert_eq!(ex.provider().with(|s| s.calls.len()), 2);
    db.drop().await;
}

/// The state alone does not fence: when another executor has re-claimed the item (it is
/// `in_progress` again, under a newer token), the old executor's record is still refused.
#[tokio::test]
async fn a_record_is_refused_after_another_executor_reclaimed_the_item() {
    let db = TestDb::new().await;
    let slow = ExecutorConfig {
        call_timeout: Duration::from_secs(3),
        lease: Duration::from_secs(10),
        ..config()
    };
    let a = executor(
        &db,
        CallMode::SucceedAfter(Duration::from_millis(1000)),
        slow,
    );
    let id = enqueue(&db, &new_item("ledger")).await;
    let task = tokio::spawn({
        let a = Arc::clone(&a);
        async move { a.run_once().await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while row(&db, id).await.state != "in_progress" {
        assert!(std::time::Instant::now() < deadline, "never claimed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old_token = row(&db, id).await.lease_token.unwrap();
    // Another executor's claim after expiry, lookup NotFound and resend.
    let new_token: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "UPDATE \"{s}\".work_items SET lease_token = nextval('\"{s}\".lease_token_seq'), \
         lease_until = now() + interval '10 seconds', attempts = attempts + 1 \
         WHERE id = $1 RETURNING lease_token",
        s = db.schema
    )))
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_ne!(old_token, new_token);

    let report = task.await.unwrap().unwrap();
    assert_eq!((report.lease_lost, report.succeeded), (1, 0), "{report:?}");
    let r = row(&db, id).await;
    assert_eq!(
        (r.state.as_str(), r.lease_token, r.reference),
        ("in_progress", Some(new_token), None),
        "the newer claim is untouched"
    );
    db.drop().await;
}

/// The elected maintainer deletes old `succeeded` items only: nothing pending, in progress,
/// unknown or failed, and nothing young.
#[tokio::test]
async fn retention_deletes_only_old_succeeded_work_items() {
    use outbox_core::maintenance::{
        InboxRetention, Maintainer, MaintenanceConfig, MaintenanceStore, ReplayHorizon,
    };
    let db = TestDb::new().await;
    let mut ids = HashMap::new();
    for (name, state, age_days) in [
        ("old-ok-1", "succeeded", 10),
        ("old-ok-2", "succeeded", 10),
        ("old-ok-3", "succeeded", 10),
        ("young-ok", "succeeded", 0),
        ("old-failed", "failed", 10),
        ("old-unknown", "unknown", 10),
        ("old-pending", "pending", 10),
    ] {
        let id = enqueue(&db, &new_item(name)).await;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE \"{}\".work_items SET state = $2, \
             resolved_at = CASE WHEN $2 IN ('succeeded', 'failed') \
                 THEN now() - make_interval(days => $3) END, \
             unknown_since = CASE WHEN $2 = 'unknown' THEN now() - make_interval(days => $3) END, \
             created_at = now() - make_interval(days => $3) WHERE id = $1",
            db.schema
        )))
        .bind(id)
        .bind(state)
        .bind(age_days)
        .execute(&db.pool)
        .await
        .unwrap();
        ids.insert(name, id);
    }
    let retention = InboxRetention {
        keep: Duration::from_secs(86_400),
        horizon: ReplayHorizon {
            broker_retention: Duration::from_secs(3600),
            outbox_retention: Duration::ZERO,
            dead_letter_requeue_window: Duration::ZERO,
        },
    };
    let config = MaintenanceConfig {
        inbox: Some(retention),
        batch_size: 2,
        ..MaintenanceConfig::default()
    };
    let maintainer = Maintainer::new(
        store(&db),
        MaintenanceConfig {
            work_items_keep: Some(Duration::from_secs(7 * 86_400)),
            ..config.clone()
        },
    )
    .unwrap();
    let mut conn = store(&db).maintenance_session().await.unwrap();
    assert_eq!(
        maintainer
            .round(&mut conn)
            .await
            .unwrap()
            .map(|r| r.work_items),
        Some(3),
        "three old succeeded items, deleted in batches of two"
    );
    let left: HashSet<i64> = PgEffects::new(db.schema.clone())
        .list(&db.pool, None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    for name in ["young-ok", "old-failed", "old-unknown", "old-pending"] {
        assert!(left.contains(&ids[name]), "{name} must be kept");
    }
    for name in ["old-ok-1", "old-ok-2", "old-ok-3"] {
        assert!(!left.contains(&ids[name]), "{name} must be deleted");
    }
    // Without work-item retention the maintainer leaves work items alone.
    let inbox_only = Maintainer::new(store(&db), config).unwrap();
    drop(conn);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut conn = store(&db).maintenance_session().await.unwrap();
    assert_eq!(
        inbox_only
            .round(&mut conn)
            .await
            .unwrap()
            .map(|r| r.total()),
        Some(0)
    );
    db.drop().await;
}
