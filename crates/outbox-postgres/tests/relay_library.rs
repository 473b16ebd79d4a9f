//! Running a relay from the library API alone ([`PgRelay`]), in both modes, against the real
//! PostgreSQL: the start-up checks the binary makes refuse what they refuse, and a relay that
//! starts delivers every event in per-aggregate order, writes its heartbeat, and stops cleanly
//! when its token is cancelled. The broker is the testkit's named fake: the transports have
//! their own suites; this is about the relay's lifecycle.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestDb, database_url, msg};
use outbox_core::relay::RelayConfig;
use outbox_postgres::cdc::{CdcConfig, ensure_publication, remove, slot_state};
use outbox_postgres::relay::{CdcRelayOptions, PgRelay, RelayError, RelayMode};
use outbox_postgres::{PgStore, PgStoreConfig, Schema};
use outbox_testkit::fakes::FakeTransport;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

/// A store of `schema` over a pool of its own: the relay replaces its pool by one tied to its
/// live session and closes the one it was given.
async fn own_store(schema: &Schema) -> PgStore {
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&database_url())
        .await
        .expect("PostgreSQL is required");
    PgStore::new(
        pool,
        PgStoreConfig {
            schema: schema.clone(),
            ..PgStoreConfig::default()
        },
    )
}

/// Relay settings for a test: small batches, short polls.
fn relay_config() -> RelayConfig {
    RelayConfig {
        batch_size: 50,
        poll_interval: Duration::from_millis(50),
        ..RelayConfig::default()
    }
}

/// Writes `aggregates` × `versions` events, one committed transaction per version round.
async fn write_events(db: &TestDb, aggregates: usize, versions: i64) {
    for v in 1..=versions {
        let mut tx = db.pool.begin().await.unwrap();
        for a in 0..aggregates {
            db.outbox
                .enqueue(&mut *tx, &msg(&format!("agg-{a}"), v))
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
}

/// Waits (at most 20 s) until the fake broker acknowledged `n` messages.
async fn wait_acked(transport: &FakeTransport, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while transport.acked().len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} events published within 20 s",
            transport.acked().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every aggregate's versions arrived 1..=versions, in order (redeliveries aside).
fn assert_in_order(transport: &FakeTransport, aggregates: usize, versions: i64) {
    for a in 0..aggregates {
        let mut seen = transport.acked_for(&format!("agg-{a}"));
        seen.dedup();
        assert_eq!(seen, (1..=versions).collect::<Vec<_>>(), "agg-{a}");
    }
}

/// The CDC mode's options with the default CDC settings.
fn cdc_options(create_slot: bool, heartbeat_every: Option<Duration>) -> CdcRelayOptions {
    CdcRelayOptions {
        database_url: database_url(),
        cdc: CdcConfig::default(),
        create_slot,
        heartbeat_every,
    }
}

/// The error of the start-up checks of a relay in `mode` over `schema`.
async fn refused(schema: &Schema, mode: RelayMode) -> RelayError {
    PgRelay::new(own_store(schema).await, relay_config(), mode)
        .check()
        .await
        .unwrap_err()
}

/// With a running relay: waits until it published the `n` events written before, checks that
/// its live session is registered (else fails with `registered`), and that an event written
/// while it runs is published too.
async fn delivers_while_running(
    db: &TestDb,
    transport: &FakeTransport,
    n: usize,
    registered: &str,
) {
    wait_acked(transport, n).await;
    assert_eq!(owners(db).await, 1, "{registered}");
    // Written while it runs.
    db.outbox.enqueue(&db.pool, &msg("late", 1)).await.unwrap();
    wait_acked(transport, n + 1).await;
}

/// After a relay `name` stopped: the `(aggregates, versions)` written arrived in order,
/// nothing is left in the table, its heartbeat recorded the stop and its session resigned.
async fn assert_stopped_after_delivering(
    db: &TestDb,
    transport: &FakeTransport,
    (aggregates, versions): (usize, i64),
    name: &str,
) {
    assert_in_order(transport, aggregates, versions);
    assert_eq!(db.count("true").await, 0, "delete mode: nothing left");
    assert_eq!(heartbeat(db).await, vec![(name.to_owned(), true)]);
    assert_eq!(owners(db).await, 0, "the live session resigned at the stop");
}

/// Live sessions registered in the schema (relays whose leases are tied to a session).
async fn owners(db: &TestDb) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".lease_owners",
        db.schema
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

/// The relay's heartbeat row: its name and whether it recorded a clean stop.
async fn heartbeat(db: &TestDb) -> Vec<(String, bool)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT name, stopped_at IS NOT NULL FROM \"{}\".instances WHERE kind = 'relay'",
        db.schema
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_relay_runs_from_the_library_api_alone() {
    let db = TestDb::new().await;
    write_events(&db, 20, 5).await;
    let transport = Arc::new(FakeTransport::new());
    let shutdown = CancellationToken::new();
    let store = own_store(&db.schema).await;
    // A service's pool, shared with its producers: the relay leaves it open.
    let shared = store.pool().clone();
    let relay = PgRelay::new(store, relay_config(), RelayMode::Polling);
    relay.check().await.expect("the start-up checks pass");
    let running = tokio::spawn(relay.run(Arc::clone(&transport), shutdown.clone()));
    delivers_while_running(
        &db,
        &transport,
        100,
        "the relay's live session is registered",
    )
    .await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the relay stops within 10 s of its token")
        .unwrap()
        .expect("a clean stop");
    assert_stopped_after_delivering(&db, &transport, (20, 5), "polling").await;
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&shared)
        .await
        .expect("the service's own pool is still open");
    assert_eq!(one, 1);
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_up_checks_refuse_a_missing_schema_publication_or_slot() {
    let db = TestDb::new().await;
    // A schema nobody migrated.
    let missing = Schema::new(&format!("{}_none", db.schema.as_str())).unwrap();
    let e = refused(&missing, RelayMode::Polling).await;
    assert!(matches!(e, RelayError::Store(_)), "{e}");
    assert!(e.to_string().starts_with("cannot start the relay"), "{e}");

    // CDC without the publication `outbox migrate` makes.
    let cdc = cdc_options(false, None);
    let e = refused(&db.schema, RelayMode::Cdc(cdc.clone())).await;
    assert!(matches!(e, RelayError::NoPublication { .. }), "{e}");

    // With the publication but no slot, and not asked to create one: refused, nothing created.
    let publication = cdc.cdc.publication_name(&db.schema);
    ensure_publication(&db.pool, &db.schema, &publication)
        .await
        .unwrap();
    let e = refused(&db.schema, RelayMode::Cdc(cdc.clone())).await;
    assert!(matches!(e, RelayError::NoSlot { .. }), "{e}");
    let slot = cdc.cdc.slot_name(&db.schema);
    assert!(slot_state(&db.pool, &slot).await.unwrap().is_none());
    remove(&db.pool, &slot, &publication, Duration::from_secs(10))
        .await
        .unwrap();
    db.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cdc_relay_runs_from_the_library_api_alone() {
    let db = TestDb::new().await;
    let cdc = cdc_options(true, Some(Duration::from_millis(200)));
    let (slot, publication) = (
        cdc.cdc.slot_name(&db.schema),
        cdc.cdc.publication_name(&db.schema),
    );
    ensure_publication(&db.pool, &db.schema, &publication)
        .await
        .unwrap();
    let transport = Arc::new(FakeTransport::new());
    let shutdown = CancellationToken::new();
    let relay = PgRelay::new(
        own_store(&db.schema).await,
        relay_config(),
        RelayMode::Cdc(cdc),
    );
    // The check creates the slot (asked to): events committed from now on are streamed.
    relay.check().await.expect("the start-up checks pass");
    assert!(slot_state(&db.pool, &slot).await.unwrap().is_some());
    write_events(&db, 10, 3).await;
    let running = tokio::spawn(relay.run(Arc::clone(&transport), shutdown.clone()));
    delivers_while_running(
        &db,
        &transport,
        30,
        "the CDC relay's live session is registered",
    )
    .await;
    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("the relay stops within 15 s of its token")
        .unwrap();
    remove(&db.pool, &slot, &publication, Duration::from_secs(10))
        .await
        .unwrap();
    stopped.expect("a clean stop");
    assert_stopped_after_delivering(&db, &transport, (10, 3), "cdc").await;
    db.drop().await;
}
