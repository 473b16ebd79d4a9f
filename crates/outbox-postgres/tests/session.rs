//! Leases tied to a live database session (`outbox_postgres::session`, G12), against a real
//! PostgreSQL: a relay whose session ended is taken over at once (not after its 30 s lease),
//! every write of the old owner stays fenced, a claim under a swept owner leases nothing, and
//! the old owner sees its session lost within its window (the publish engine then starts
//! nothing more under it: `outbox-core`'s relay tests).
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{TestDb, msg};
use outbox_core::{ClaimParams, ClaimedBatch, MarkParams, OutboxStore};
use outbox_postgres::PgStore;
use outbox_postgres::session::{PgSession, SessionConfig};
use sqlx::AssertSqlSafe;

/// A lease far longer than any wait of these tests: a takeover within them is the session's.
const LEASE: Duration = Duration::from_secs(30);

fn claim(max_rows: usize) -> ClaimParams {
    ClaimParams {
        max_rows,
        max_per_aggregate: 1000,
        lease: LEASE,
        scope: Default::default(),
    }
}

async fn session(db: &TestDb) -> PgSession {
    PgSession::start(
        &db.pool.connect_options(),
        db.schema.clone(),
        SessionConfig::default(),
    )
    .await
    .expect("a session")
}

/// A fresh schema holding versions 1 to `versions` of `agg`, one transaction each.
async fn with_versions(agg: &str, versions: i64) -> TestDb {
    let db = TestDb::new().await;
    for v in 1..=versions {
        db.outbox.enqueue(&db.pool, &msg(agg, v)).await.unwrap();
    }
    db
}

/// A claim of up to 100 rows by a store whose leases are tied to `session`.
async fn claim_in(db: &TestDb, session: &PgSession) -> ClaimedBatch {
    db.store()
        .with_session(session.clone())
        .claim_batch(claim(100))
        .await
        .unwrap()
}

/// Closes `sessions`, then drops the schema.
async fn close<const N: usize>(db: TestDb, sessions: [PgSession; N]) {
    for s in sessions {
        s.close().await;
    }
    db.drop().await;
}

/// Ends `session`'s backend from another connection, as an operator's `pg_terminate_backend`
/// (or a server restart of that backend) would, while the process lives on.
async fn terminate(db: &TestDb, session: &PgSession) -> Instant {
    let (owner, _) = session.current().expect("a live session");
    let killed: bool = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT pg_terminate_backend(pid) FROM \"{}\".lease_owners WHERE owner = $1",
        db.schema
    )))
    .bind(owner)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(killed, "the session's backend was not terminated");
    Instant::now()
}

/// Claims with `store` until a batch holds `agg` (releasing the others), for at most `within`.
async fn claimed_within(store: &PgStore, agg: &str, within: Duration) -> ClaimedBatch {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(b) = store.claim_batch(claim(100)).await {
            if b.messages.iter().any(|m| m.aggregate_id == agg) {
                return b;
            }
            let _ = store
                .release(outbox_core::ReleaseParams {
                    token: b.token,
                    ids: &[],
                })
                .await;
        }
        assert!(
            Instant::now() < deadline,
            "{agg} was not claimed within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_ended_session_s_aggregates_are_taken_over_at_once_and_its_writes_stay_fenced() {
    let db = with_versions("x", 5).await;
    let (a, b) = (session(&db).await, session(&db).await);
    let store_a = db.store().with_session(a.clone());
    let store_b = db.store().with_session(b.clone());

    let held = store_a.claim_batch(claim(100)).await.unwrap();
    assert_eq!(held.messages.len(), 5);
    let liveness = held.liveness.clone().expect("a batch tied to the session");
    assert!(liveness.may_start(Instant::now()));
    let (first_owner, _) = a.current().unwrap();
    // Live session, live lease: the other relay stays off.
    let other = store_b.claim_batch(claim(100)).await.unwrap();
    assert!(other.messages.is_empty(), "took a live lease");

    let killed = terminate(&db, &a).await;
    let taken = claimed_within(&store_b, "x", Duration::from_secs(3)).await;
    let took = killed.elapsed();
    assert_eq!(taken.messages.len(), 5, "the whole run, from the head");
    assert_eq!(taken.takeovers.len(), 1, "{:?}", taken.takeovers);
    assert_eq!(taken.takeovers[0].count, 1);
    assert!(
        taken.takeovers[0].orphaned_for.is_some(),
        "a takeover says how long the aggregate had no owner"
    );
    // Well before the lease's clock: the session's end, not the 30 s, decided.
    assert!(took < Duration::from_secs(3), "{took:?}");

    // The old owner learns it too, within its window, and starts nothing more.
    let deadline = killed + SessionConfig::default().window + Duration::from_millis(500);
    while !liveness.is_lost() {
        assert!(
            Instant::now() < deadline,
            "the old session was not seen lost"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!liveness.may_start(Instant::now()));
    // Its settle is fenced by its token: nothing changes.
    let ids: Vec<i64> = held.messages.iter().map(|m| m.id).collect();
    let marked = store_a
        .mark_published(MarkParams {
            token: held.token,
            ids: &ids,
        })
        .await
        .unwrap();
    assert_eq!(marked, 0, "a swept owner's mark changed rows");
    assert_eq!(db.count("true").await, 5);

    // It opens a new session, a new owner.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some((owner, _)) = a.current() {
            assert_ne!(owner, first_owner);
            break;
        }
        assert!(Instant::now() < deadline, "no new session");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    close(db, [a, b]).await;
}

#[tokio::test]
async fn a_claim_under_an_owner_already_swept_leases_nothing() {
    let db = with_versions("y", 3).await;
    let a = session(&db).await;
    let store_a = db.store().with_session(a.clone());
    let (owner, _) = a.current().unwrap();
    // What a sweep does once it found the owner gone (here while its session still lives, so
    // that the claim runs under the swept owner for sure).
    db.exec(format!(
        "DELETE FROM \"{}\".lease_owners WHERE owner = {owner}",
        db.schema
    ))
    .await;
    let batch = store_a.claim_batch(claim(100)).await.unwrap();
    assert!(batch.messages.is_empty(), "leased under a swept owner");
    let leases: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".leases",
        db.schema
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(leases, 0);
    // A relay with a registered owner takes them.
    let b = session(&db).await;
    let taken = claim_in(&db, &b).await;
    assert_eq!(taken.messages.len(), 3);
    close(db, [a, b]).await;
}

#[tokio::test]
async fn a_closed_session_hands_what_it_still_holds_over_at_once() {
    let db = with_versions("z", 2).await;
    let (a, b) = (session(&db).await, session(&db).await);
    let held = claim_in(&db, &a).await;
    assert_eq!(held.messages.len(), 2);
    a.close().await;
    assert!(held.liveness.unwrap().is_lost());
    // No wait for a sweep: the clean stop expired its own leases.
    let taken = claim_in(&db, &b).await;
    assert_eq!(taken.messages.len(), 2);
    assert_eq!(taken.takeovers.len(), 1);
    b.close().await;
    db.drop().await;
}
