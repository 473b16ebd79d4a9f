//! PostgreSQL store against the real server: migrations, the producer API, claims, leases,
//! fencing, dead letters and request idempotency.

mod common;

use std::time::Duration;

use common::{TestDb, msg};
use outbox_core::{ClaimParams, Fingerprint, MarkParams, OutboxStore, ReleaseParams};
use outbox_postgres::{
    EnqueueError, IdempotencyBegin, IdempotencyError, MigrateError, OnPublish, PgStore,
    PgStoreConfig, RelayWaker, Schema, migrate,
};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgPoolOptions;

fn claim(max_rows: usize, lease_ms: u64) -> ClaimParams {
    ClaimParams {
        max_rows,
        max_per_aggregate: 100,
        lease: Duration::from_millis(lease_ms),
        scope: Default::default(),
    }
}

/// Settles a claim without marking anything: its aggregates are free again.
async fn release(store: &PgStore, token: outbox_core::LeaseToken) {
    store
        .release(ReleaseParams { token, ids: &[] })
        .await
        .unwrap();
}

/// Marks every row of the claim `b` published, then settles it.
async fn publish_all(store: &PgStore, b: &outbox_core::ClaimedBatch) {
    store
        .mark_published(MarkParams {
            token: b.token,
            ids: &b.messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        })
        .await
        .unwrap();
    release(store, b.token).await;
}

/// The aggregate and version of each row of the claim `b`, in claim order.
fn versions(b: &outbox_core::ClaimedBatch) -> Vec<(String, i64)> {
    b.messages
        .iter()
        .map(|m| (m.aggregate_id.clone(), m.aggregate_version))
        .collect()
}

#[tokio::test]
async fn migrate_is_idempotent_concurrent_and_refuses_newer_schemas() {
    let db = TestDb::new().await;
    // Concurrent re-runs find nothing to do.
    let (a, b) = tokio::join!(migrate(&db.pool, &db.schema), migrate(&db.pool, &db.schema));
    assert!(a.unwrap().applied.is_empty());
    assert!(b.unwrap().applied.is_empty());
    outbox_postgres::check_schema(&db.pool, &db.schema)
        .await
        .unwrap();

    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{}\".schema_migrations (version, name, checksum) VALUES (999, 'future', '')",
        db.schema
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let err = migrate(&db.pool, &db.schema).await.unwrap_err();
    assert!(
        matches!(err, MigrateError::NewerSchema { found: 999, .. }),
        "{err}"
    );
    let err = outbox_postgres::check_schema(&db.pool, &db.schema)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("999"), "{err}");
    db.drop().await;
}

#[tokio::test]
async fn check_schema_reports_an_unmigrated_schema() {
    let db = TestDb::new().await;
    let missing = Schema::new(&format!("{}_missing", db.schema)).unwrap();
    let err = outbox_postgres::check_schema(&db.pool, &missing)
        .await
        .unwrap_err();
    assert!(
        matches!(err, MigrateError::NotMigrated { found: 0, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("outbox migrate"));
    db.drop().await;
}

#[tokio::test]
async fn rolled_back_enqueue_leaves_nothing_and_commit_keeps_exact_rows() {
    let db = TestDb::new().await;
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox.enqueue(&mut *tx, &msg("a", 1)).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.count("true").await, 0);

    let m = msg("a", 1).with_header(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    );
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox.enqueue(&mut *tx, &m).await.unwrap();
    db.outbox
        .enqueue_batch(&mut *tx, &[msg("b", 1), msg("b", 2)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.count("state = 'pending'").await, 3);

    let batch = db.store().claim_batch(claim(10, 30_000)).await.unwrap();
    let got = batch
        .messages
        .iter()
        .find(|x| x.event_id == m.event_id)
        .unwrap();
    assert_eq!(got.payload, m.payload);
    assert_eq!(got.fingerprint, Fingerprint::of(&m.payload.bytes));
    assert_eq!(got.headers, m.headers);
    db.drop().await;
}

#[tokio::test]
async fn duplicate_ids_and_versions_are_named_errors() {
    let db = TestDb::new().await;
    let m = msg("a", 1);
    db.outbox.enqueue(&db.pool, &m).await.unwrap();
    let err = db.outbox.enqueue(&db.pool, &m).await.unwrap_err();
    assert!(
        matches!(err, EnqueueError::DuplicateEventId(id) if id == m.event_id),
        "{err}"
    );
    let err = db.outbox.enqueue(&db.pool, &msg("a", 1)).await.unwrap_err();
    assert!(
        matches!(err, EnqueueError::VersionConflict { version: 1, .. }),
        "{err}"
    );
    let err = db.outbox.enqueue(&db.pool, &msg("a", 0)).await.unwrap_err();
    assert!(matches!(err, EnqueueError::Invalid(_)), "{err}");
    db.drop().await;
}

#[tokio::test]
async fn mark_mode_keeps_published_rows_and_still_orders() {
    let db = TestDb::new().await;
    db.outbox
        .enqueue_batch(&db.pool, &[msg("a", 1), msg("a", 2)])
        .await
        .unwrap();
    let store = db.store_with(OnPublish::Mark);
    let b = store
        .claim_batch(ClaimParams {
            max_rows: 10,
            max_per_aggregate: 1,
            lease: Duration::from_secs(30),
            scope: Default::default(),
        })
        .await
        .unwrap();
    assert_eq!(b.messages.len(), 1);
    store
        .mark_published(MarkParams {
            token: b.token,
            ids: &[b.messages[0].id],
        })
        .await
        .unwrap();
    // Until the claim is settled (released), its aggregate stays leased.
    assert!(
        store
            .claim_batch(claim(10, 30_000))
            .await
            .unwrap()
            .messages
            .is_empty()
    );
    release(&store, b.token).await;
    let b2 = store.claim_batch(claim(10, 30_000)).await.unwrap();
    assert_eq!(
        b2.messages
            .iter()
            .map(|m| m.aggregate_version)
            .collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(store.stats().await.unwrap().published_retained, 1);
    db.drop().await;
}

/// Mark mode's two needs: its indexes (built once, rebuilt when left invalid, reported when
/// missing) and the retention of published rows (only those published before the keep, in
/// batches, by the elected maintainer, never a pending or dead row, the claim unaffected).
#[tokio::test]
async fn mark_mode_indexes_and_retention_keep_only_young_published_rows() {
    use outbox_core::maintenance::{Maintainer, MaintenanceConfig, MaintenanceStore as _};
    use outbox_postgres::{migrate_mark_mode, missing_mark_mode_indexes};
    let db = TestDb::new().await;
    let all = vec![
        "events_pending_idx",
        "events_unpublished_idx",
        "events_published_at_idx",
    ];
    assert_eq!(
        missing_mark_mode_indexes(&db.pool, &db.schema)
            .await
            .unwrap(),
        all
    );
    // Two builders and a migration at once: no deadlock (a concurrent index build waits for
    // older transactions, so no caller may wait for a lock inside one), each index built once.
    let (a, b, m) = tokio::join!(
        migrate_mark_mode(&db.pool, &db.schema),
        migrate_mark_mode(&db.pool, &db.schema),
        migrate(&db.pool, &db.schema)
    );
    m.unwrap();
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut built = [a.clone(), b.clone()].concat();
    built.sort_unstable();
    let mut sorted = all.clone();
    sorted.sort_unstable();
    assert_eq!(built, sorted, "each index once: {a:?} {b:?}");
    assert!(
        migrate_mark_mode(&db.pool, &db.schema)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        missing_mark_mode_indexes(&db.pool, &db.schema)
            .await
            .unwrap()
            .is_empty()
    );
    // An interrupted concurrent build leaves an invalid index: reported, and built again.
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE pg_catalog.pg_index SET indisvalid = false \
         WHERE indexrelid = '\"{}\".events_pending_idx'::regclass",
        db.schema
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        missing_mark_mode_indexes(&db.pool, &db.schema)
            .await
            .unwrap(),
        vec!["events_pending_idx"]
    );
    assert_eq!(
        migrate_mark_mode(&db.pool, &db.schema).await.unwrap(),
        vec!["events_pending_idx"]
    );

    // Twenty published rows (ten aggregates, two versions each) through the relay's own path.
    let store = db.store_with(OnPublish::Mark);
    let published: Vec<_> = (0..10)
        .flat_map(|a| [msg(&format!("m{a}"), 1), msg(&format!("m{a}"), 2)])
        .collect();
    db.outbox.enqueue_batch(&db.pool, &published).await.unwrap();
    let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
    let ids: Vec<i64> = b.messages.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), 20);
    let marked = store
        .mark_published(MarkParams {
            token: b.token,
            ids: &ids,
        })
        .await
        .unwrap();
    assert_eq!(marked, 20);
    release(&store, b.token).await;
    // Pending and dead rows, made old: never the retention's business.
    db.outbox
        .enqueue_batch(
            &db.pool,
            &[msg("p", 1), msg("p", 2), msg("p", 3), msg("d", 1)],
        )
        .await
        .unwrap();
    let s = &db.schema;
    db.exec(format!(
        "UPDATE \"{s}\".events SET state = 'dead', last_error = 'refused' \
         WHERE aggregate_id = 'd'"
    ))
    .await;
    db.exec(format!(
        "UPDATE \"{s}\".events SET created_at = now() - interval '3 hours' \
         WHERE aggregate_id IN ('p', 'd')"
    ))
    .await;
    // Seven aggregates published two hours ago, three just now.
    db.exec(format!(
        "UPDATE \"{s}\".events SET published_at = now() - interval '2 hours' \
         WHERE state = 'published' AND aggregate_id < 'm7'"
    ))
    .await;

    let config = MaintenanceConfig {
        published_keep: Some(Duration::from_secs(3600)),
        batch_size: 4,
        ..MaintenanceConfig::default()
    };
    let a = Maintainer::new(store.clone(), config.clone()).unwrap();
    let b = Maintainer::new(store.clone(), config).unwrap();
    let mut sa = store.maintenance_session().await.unwrap();
    let mut sb = store.maintenance_session().await.unwrap();
    let r = a.round(&mut sa).await.unwrap().expect("elected");
    assert_eq!(r.published, 14, "{r:?}");
    assert_eq!(b.round(&mut sb).await.unwrap(), None, "one maintainer");
    assert_eq!(db.count("state = 'published'").await, 6);
    assert_eq!(
        db.count("state = 'published' AND aggregate_id >= 'm7'")
            .await,
        6,
        "the young published rows stay"
    );
    assert_eq!(db.count("state = 'pending'").await, 3);
    assert_eq!(db.count("state = 'dead'").await, 1);
    // Mark mode's own stats statement (published rows counted apart) gives the same numbers.
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.dead, stats.published_retained),
        (3, 1, 6),
        "{stats:?}"
    );
    assert_eq!(
        a.round(&mut sa).await.unwrap().map(|r| r.published),
        Some(0)
    );

    // The claim goes on from the pending rows, in order.
    let c = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(
        c.messages
            .iter()
            .map(|m| (m.aggregate_id.as_str(), m.aggregate_version))
            .collect::<Vec<_>>(),
        vec![("p", 1), ("p", 2), ("p", 3)]
    );
    drop((sa, sb));
    db.drop().await;
}

/// After a large backlog was drained and vacuumed, the table keeps its peak size while its
/// statistics say it is nearly empty; the planner then prices a scan of every page plus a sort
/// below the index walk. The claim must still walk the index: W6 measured 1.0-1.6 s per claim
/// at 10 million drained rows before it did. Counted with the server's own per-table scan
/// counters, on a one-connection pool whose statistics are flushed on demand.
/// A pool of `connections` and a fresh migrated schema (with mark mode's indexes when `mark`)
/// whose events table holds `rows` pending rows over `aggregates` aggregates, written as a
/// plain-SQL producer would, and is never vacuumed or analysed behind the test's back: the
/// set-up of the planner tests.
async fn planner_schema(
    connections: u32,
    mark: bool,
    rows: i64,
    aggregates: i64,
) -> (sqlx::PgPool, Schema) {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .connect(&common::database_url())
        .await
        .unwrap();
    let schema = Schema::new(&format!("t_{}", uuid::Uuid::now_v7().simple())).unwrap();
    migrate(&pool, &schema).await.unwrap();
    if mark {
        outbox_postgres::migrate_mark_mode(&pool, &schema)
            .await
            .unwrap();
    }
    let s = schema.to_string();
    // No autovacuum or auto-analyze to change the plans half-way.
    common::exec(
        &pool,
        format!("ALTER TABLE \"{s}\".events SET (autovacuum_enabled = off)"),
    )
    .await;
    common::exec(
        &pool,
        format!(
            "INSERT INTO \"{s}\".events (event_id, aggregate_type, aggregate_id, \
             aggregate_version, event_type, payload) \
             SELECT gen_random_uuid(), 'payment', 'p' || (g % {aggregates}), \
             g / {aggregates} + 1, 'T', convert_to(repeat('x', 64), 'UTF8') \
             FROM generate_series(0, {rows} - 1) g"
        ),
    )
    .await;
    (pool, schema)
}

#[tokio::test]
async fn claims_walk_the_index_when_a_drained_table_looks_empty_to_the_planner() {
    // One connection does everything to this schema, and flushes its statistics on demand,
    // so no other backend's late flush can move the counters between two reads.
    let (pool, schema) = planner_schema(1, false, 100_000, 10_000).await;
    let s = schema.to_string();
    let exec = |sql: String| common::exec(&pool, sql);
    // Drained to the newest 1,000, vacuumed.
    exec(format!(
        "DELETE FROM \"{s}\".events WHERE id <= (SELECT max(id) - 1000 FROM \"{s}\".events)"
    ))
    .await;
    exec(format!("VACUUM \"{s}\".events")).await;

    // (sequential scans, index scans) of the events table.
    let scans = || {
        let (pool, s) = (pool.clone(), s.clone());
        async move {
            // Flushed when the backend goes idle after this statement, before the read.
            sqlx::query("SELECT pg_stat_force_next_flush()")
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query_as::<_, (i64, i64)>(AssertSqlSafe(format!(
                "SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables \
                 WHERE relid = '\"{s}\".events'::regclass"
            )))
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // The set-up provokes the bad plan: the claim's scan of heads, planned as usual, reads
    // every page. Without this the test would prove nothing.
    let before = scans().await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT id FROM \"{s}\".events WHERE state = 'pending' AND available_at <= now() \
         ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED"
    )))
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let control = scans().await;
    assert_eq!(
        control.0 - before.0,
        1,
        "the drained, vacuumed table no longer makes the planner scan sequentially here; \
         the test needs a set-up that does"
    );

    let store = PgStore::new(
        pool.clone(),
        PgStoreConfig {
            schema: schema.clone(),
            on_publish: OnPublish::Delete,
        },
    );
    let b = store.claim_batch(claim(1000, 30_000)).await.unwrap();
    assert_eq!(b.messages.len(), 1000);
    let after = scans().await;
    assert_eq!(
        after.0, control.0,
        "the claim scanned the events table sequentially"
    );
    assert!(
        after.1 > control.1,
        "the claim read no index of the events table"
    );
    // The settings stayed in the claim's transaction.
    let seqscan: String = sqlx::query_scalar("SHOW enable_seqscan")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(seqscan, "on");
    exec(format!("DROP SCHEMA \"{s}\" CASCADE")).await;
    pool.close().await;
}

/// Mark mode's retention deletes a batch by ctid, whatever the statistics say: with statistics
/// taken before the rows were published (the partial `published_at` index looks empty), a
/// delete whose state check an index could serve read every published row per batch (W6 met
/// it at 10 million rows: one batch ran for minutes). Told apart by the index's entries read.
#[tokio::test]
async fn retention_deletes_by_ctid_when_the_statistics_predate_the_publishing() {
    use outbox_core::maintenance::{MaintenanceStore as _, Purge};
    const ROWS: i64 = 30_000;
    let (pool, schema) = planner_schema(2, true, ROWS, 3_000).await;
    let s = schema.to_string();
    let exec = |sql: String| common::exec(&pool, sql);
    // Statistics of a pending backlog, then every row published an hour ago.
    exec(format!("ANALYZE \"{s}\".events")).await;
    exec(format!(
        "UPDATE \"{s}\".events SET state = 'published', published_at = now() - interval '1 hour'"
    ))
    .await;

    let store = PgStore::new(
        pool.clone(),
        PgStoreConfig {
            schema: schema.clone(),
            on_publish: OnPublish::Mark,
        },
    );
    let mut session = store.maintenance_session().await.unwrap();
    // Entries of the published_at index read so far, flushed by the session that read them.
    let read = async |session: &mut sqlx::PgConnection| -> i64 {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&mut *session)
            .await
            .unwrap();
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT idx_tup_read FROM pg_stat_user_indexes \
             WHERE indexrelid = '\"{s}\".events_published_at_idx'::regclass"
        )))
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    // The set-up provokes the bad plan: the same delete with a plain state check, rolled
    // back. Without this the test would prove nothing.
    let before = read(&mut session).await;
    sqlx::query("BEGIN").execute(&mut session).await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM \"{s}\".events WHERE ctid = ANY(ARRAY( \
         SELECT ctid FROM \"{s}\".events WHERE state = 'published' \
         AND published_at < now() - interval '1 minute' LIMIT 1000)) \
         AND state = 'published' AND published_at < now() - interval '1 minute'"
    )))
    .execute(&mut session)
    .await
    .unwrap();
    sqlx::query("ROLLBACK").execute(&mut session).await.unwrap();
    let control = read(&mut session).await;
    assert!(
        control - before >= ROWS,
        "the plain check no longer reads the whole index here ({} entries); the test needs a \
         set-up that makes it",
        control - before
    );

    let deleted = store
        .purge(
            &mut session,
            Purge::Published,
            Duration::from_secs(60),
            1000,
        )
        .await
        .unwrap();
    assert_eq!(deleted, 1000);
    let after = read(&mut session).await;
    assert!(
        after - control <= 2 * 1000,
        "the retention read {} entries of the published_at index for a batch of 1,000",
        after - control
    );
    drop(session);
    exec(format!("DROP SCHEMA \"{s}\" CASCADE")).await;
    pool.close().await;
}

#[tokio::test]
async fn version_allocation_serialises_writers_of_one_aggregate() {
    let db = TestDb::new().await;
    let mut t1 = db.pool.begin().await.unwrap();
    let v1 = db
        .outbox
        .next_aggregate_version(&mut *t1, "payment", "p")
        .await
        .unwrap();
    assert_eq!(v1, 1);
    let pool = db.pool.clone();
    let outbox = db.outbox.clone();
    let second = tokio::spawn(async move {
        let mut t2 = pool.begin().await.unwrap();
        let v = outbox
            .next_aggregate_version(&mut *t2, "payment", "p")
            .await
            .unwrap();
        t2.commit().await.unwrap();
        v
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !second.is_finished(),
        "second writer must wait for the first"
    );
    t1.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), 2);
    let other = db
        .outbox
        .next_aggregate_version(&db.pool, "payment", "q")
        .await
        .unwrap();
    assert_eq!(other, 1);
    db.drop().await;
}

#[tokio::test]
async fn versions_from_the_aggregates_own_row_serialise_its_writers() {
    use outbox_postgres::{AggregateRow, AggregateRowError};
    let db = TestDb::new().await;
    let table = format!("{}.accounts", db.schema);
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY, balance bigint NOT NULL, \
         version integer NOT NULL); INSERT INTO {table} VALUES (1, 0, 0), (2, 0, 0)"
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let accounts = AggregateRow::new(&table, "id", "version").unwrap();

    let mut t1 = db.pool.begin().await.unwrap();
    let v1 = accounts.next_version(&mut *t1, 1_i64).await.unwrap();
    assert_eq!(v1, 1);
    db.outbox.enqueue(&mut *t1, &msg("1", v1)).await.unwrap();
    let (pool, outbox, rows) = (db.pool.clone(), db.outbox.clone(), accounts.clone());
    let second = tokio::spawn(async move {
        let mut t2 = pool.begin().await.unwrap();
        let v = rows.next_version(&mut *t2, 1_i64).await.unwrap();
        outbox.enqueue(&mut *t2, &msg("1", v)).await.unwrap();
        t2.commit().await.unwrap();
        v
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !second.is_finished(),
        "the second writer of an aggregate must wait for the first"
    );
    // Another aggregate does not wait.
    assert_eq!(accounts.next_version(&db.pool, 2_i64).await.unwrap(), 1);
    t1.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), 2);

    // A rolled-back increment gives its version back.
    let mut t3 = db.pool.begin().await.unwrap();
    assert_eq!(accounts.next_version(&mut *t3, 1_i64).await.unwrap(), 3);
    t3.rollback().await.unwrap();
    assert_eq!(accounts.next_version(&db.pool, 1_i64).await.unwrap(), 3);

    let err = accounts.next_version(&db.pool, 99_i64).await.unwrap_err();
    assert!(
        matches!(&err, AggregateRowError::NotFound { table: t } if *t == table),
        "{err}"
    );
    assert!(err.to_string().contains("does not exist"), "{err}");
    // An id of the wrong type is the database's error, not a missing row.
    let err = accounts.next_version(&db.pool, "1").await.unwrap_err();
    assert!(matches!(err, AggregateRowError::Database(_)), "{err}");
    // A version of the same aggregate twice is still refused by the outbox.
    let err = db.outbox.enqueue(&db.pool, &msg("1", 2)).await.unwrap_err();
    assert!(matches!(err, EnqueueError::VersionConflict { .. }), "{err}");
    db.drop().await;
}

/// Opens a transaction and begins the request `key` of `scope` with the fingerprint `request`
/// in it.
async fn begin_request(
    db: &TestDb,
    scope: &str,
    key: &str,
    request: Fingerprint,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, IdempotencyBegin) {
    let mut tx = db.pool.begin().await.unwrap();
    let begun = db
        .outbox
        .idempotency_begin(&mut tx, scope, key, request)
        .await
        .unwrap();
    (tx, begun)
}

#[tokio::test]
async fn request_idempotency_replays_and_detects_conflicts() {
    let db = TestDb::new().await;
    let req = Fingerprint::of(br#"{"amount":100}"#);
    let (mut tx, b) = begin_request(&db, "create_payment", "k1", req).await;
    assert_eq!(b, IdempotencyBegin::New);
    let response = serde_json::json!({"payment_id": "pay-1"});
    db.outbox
        .idempotency_complete(&mut tx, "create_payment", "k1", &response)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let (mut tx, b) = begin_request(&db, "create_payment", "k1", req).await;
    assert_eq!(b, IdempotencyBegin::Replay(response));
    let other = Fingerprint::of(br#"{"amount":999}"#);
    let err = db
        .outbox
        .idempotency_begin(&mut tx, "create_payment", "k1", other)
        .await
        .unwrap_err();
    assert!(matches!(err, IdempotencyError::Conflict { .. }), "{err}");
    tx.rollback().await.unwrap();

    // Same key in another scope is independent.
    let (tx, b) = begin_request(&db, "refund", "k1", other).await;
    assert_eq!(b, IdempotencyBegin::New);
    tx.rollback().await.unwrap();

    // A concurrent first use waits for the owner and then replays its response.
    let (mut t1, b) = begin_request(&db, "s", "k2", req).await;
    assert_eq!(b, IdempotencyBegin::New);
    let pool = db.pool.clone();
    let outbox = db.outbox.clone();
    let waiter = tokio::spawn(async move {
        let mut t2 = pool.begin().await.unwrap();
        outbox
            .idempotency_begin(&mut t2, "s", "k2", req)
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    db.outbox
        .idempotency_complete(&mut t1, "s", "k2", &serde_json::json!(1))
        .await
        .unwrap();
    t1.commit().await.unwrap();
    assert_eq!(
        waiter.await.unwrap(),
        IdempotencyBegin::Replay(serde_json::json!(1))
    );
    db.drop().await;
}

/// The relay's wake-up listener and the producer's waker hold or use pool connections; closing
/// the pool at shutdown stops both instead of waiting for them (or retrying for ever).
#[tokio::test]
async fn wakeup_tasks_stop_when_the_pool_closes() {
    // What the tasks log (they run on this test's single thread).
    #[derive(Clone, Default)]
    struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Logs {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Logs::default();
    let writer = logs.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || writer.clone())
            .finish(),
    );
    let db = TestDb::new().await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&common::database_url())
        .await
        .unwrap();
    let store = PgStore::new(
        pool.clone(),
        PgStoreConfig {
            schema: db.schema.clone(),
            on_publish: OnPublish::Delete,
        },
    );
    let waker = RelayWaker::spawn(pool.clone(), &db.outbox, Duration::from_millis(10));
    // Starts the LISTEN task; a wake-up reaches it.
    store.wait_for_work(Duration::from_millis(200)).await;
    waker.wake();
    tokio::time::timeout(
        Duration::from_secs(5),
        store.wait_for_work(Duration::from_secs(30)),
    )
    .await
    .expect("the wake-up reached the listener");
    assert!(waker.is_running());

    // The store (and its listener) stays alive; closing the pool must not wait for it.
    tokio::time::timeout(Duration::from_secs(5), pool.close())
        .await
        .expect("pool.close() waited for the LISTEN connection");
    tokio::time::timeout(Duration::from_secs(5), async {
        while waker.is_running() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the waker's task stopped with the pool");
    waker.wake();
    // The listener stopped too, rather than retrying a closed pool every second.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    assert!(
        !logged.contains("wake-up listener") && !logged.contains("relay wake-up failed"),
        "a wake-up task outlived its pool:\n{logged}"
    );
    drop(store);
    db.drop().await;
}

/// A paused route (migration 10) is not claimed, and nothing of an aggregate passes its paused
/// row: its earlier rows go, its later rows (to any route) wait. The takeover claim of the
/// poison-row rule leaves a paused head alone too and clears its lease. A resume gives
/// everything back, in order.
#[tokio::test]
async fn a_paused_route_is_not_claimed_and_nothing_of_an_aggregate_passes_it() {
    use outbox_core::ClaimScope;
    use outbox_core::operator::prelude::*;
    use outbox_core::operator::{Actor, OperatorErrorKind, PauseTarget};
    let db = TestDb::new().await;
    // a: v1 (topic of its type), v2 to "audit", v3 (its type again); b: v1; c: v1 to "audit".
    db.outbox
        .enqueue_batch(
            &db.pool,
            &[
                msg("a", 1),
                msg("a", 2).with_destination("audit"),
                msg("a", 3),
                msg("b", 1),
                msg("c", 1).with_destination("audit"),
            ],
        )
        .await
        .unwrap();
    let store = db.store();
    let admin = store.clone();
    let me = Actor::new("tester", "test").unwrap();
    let audit = PauseTarget::destination("audit");

    // Two claims under leases that expire at once: every head has one takeover counted.
    for _ in 0..2 {
        store.claim_batch(claim(100, 1)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pause = admin.pause(&audit, &me, "audit sink down").await.unwrap();
    assert_eq!(
        (pause.kind.as_str(), pause.name.as_str()),
        ("route", "destination:audit")
    );
    let again = admin.pause(&audit, &me, "twice").await.unwrap_err();
    assert_eq!(again.kind, OperatorErrorKind::Refused, "{again}");
    let no_reason = admin
        .pause(&PauseTarget::aggregate_type("payment"), &me, " ")
        .await
        .unwrap_err();
    assert_eq!(no_reason.kind, OperatorErrorKind::InvalidRequest);

    // The takeover claim publishes heads alone, never a paused one, and clears its lease.
    let mut taken = Vec::new();
    for _ in 0..5 {
        let b = store
            .claim_batch(ClaimParams {
                scope: ClaimScope::TakeOver,
                ..claim(100, 30_000)
            })
            .await
            .unwrap();
        taken.extend(b.messages.iter().map(|m| m.destination.clone()));
        release(&store, b.token).await;
    }
    assert_eq!(
        taken,
        vec![None, None],
        "a's and b's heads taken over alone, never the paused route's"
    );
    let c_leases: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".leases WHERE aggregate_id = 'c'",
        db.schema
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(c_leases, 0, "the paused head's takeover lease is cleared");

    // Clear every lease left, then a normal claim: a v1 and b v1 only.
    db.exec(format!("DELETE FROM \"{}\".leases", db.schema))
        .await;
    let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(versions(&b), vec![("a".into(), 1), ("b".into(), 1)]);
    publish_all(&store, &b).await;
    // a's head is now its paused v2: nothing more to claim.
    let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert!(b.messages.is_empty(), "{:?}", b.messages);

    let listed = admin.pauses().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].reason.as_deref(), Some("audit sink down"));
    assert_eq!(listed[0].actor.as_deref(), Some("tester"));
    admin.resume(&audit, &me, "sink back").await.unwrap();
    let gone = admin.resume(&audit, &me, "").await.unwrap_err();
    assert_eq!(gone.kind, OperatorErrorKind::NotFound);
    let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(
        versions(&b),
        vec![("a".into(), 2), ("a".into(), 3), ("c".into(), 1)]
    );
    let actions: Vec<String> = admin
        .audit(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.action)
        .collect();
    assert_eq!(actions, vec!["resume", "pause"]);
    db.drop().await;
}

/// The claim window (`outbox_postgres::ClaimWindow`): after a slow claim the next ones start at
/// its lowest head, or after the table's last row when it found none, and a row that becomes
/// claimable below the start (a late commit, here a row written with a lower id) is taken by
/// the next walk from the beginning, within `max_rescan`. Every claim counts as slow here.
#[tokio::test]
async fn a_slow_claim_moves_the_start_and_a_rescan_takes_what_lies_below_it() {
    use outbox_core::operator::prelude::*;
    use outbox_core::operator::{Actor, PauseTarget};
    use outbox_postgres::ClaimWindow;
    let db = TestDb::new().await;
    let held: Vec<_> = (0..50)
        .map(|i| msg(&format!("h{i}"), 1).with_destination("held"))
        .collect();
    db.outbox.enqueue_batch(&db.pool, &held).await.unwrap();
    db.outbox
        .enqueue_batch(&db.pool, &[msg("c1", 1), msg("c2", 1)])
        .await
        .unwrap();
    let store = db.store().with_claim_window(ClaimWindow::new(
        Duration::ZERO,
        Duration::from_secs(2),
        Duration::from_secs(2),
    ));
    let admin = db.store();
    let me = Actor::new("tester", "test").unwrap();
    admin
        .pause(&PauseTarget::destination("held"), &me, "sink down")
        .await
        .unwrap();
    let ids = |b: &outbox_core::ClaimedBatch| -> Vec<String> {
        b.messages.iter().map(|m| m.aggregate_id.clone()).collect()
    };
    // A late commit: a row whose id lies below every row above (written with its id).
    let late = |agg: &str, id: i64| {
        format!(
            "INSERT INTO \"{}\".events (id, event_id, aggregate_type, aggregate_id, \
             aggregate_version, event_type, payload) OVERRIDING SYSTEM VALUE \
             VALUES ({id}, gen_random_uuid(), 'payment', '{agg}', 1, 'PaymentCreated', '\\x7b7d')",
            db.schema
        )
    };

    // The first claim starts the store's wake-up listener, which asks for a walk from the
    // start once it listens (a `rescan` may have been missed before): let that settle.
    let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
    release(&store, b.token).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(
        ids(&b),
        vec!["c1", "c2"],
        "the full walk, past the paused rows"
    );
    release(&store, b.token).await;
    db.exec(late("late-1", -1)).await;
    // Windowed: starts at c1, so the row below it waits.
    let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(ids(&b), vec!["c1", "c2"]);
    release(&store, b.token).await;
    // The next full walk comes within `min_rescan`, or ten times the last full walk's time.
    let b = until_claimed(&store, "late-1").await;
    assert_eq!(ids(&b), vec!["c1", "c2", "late-1"], "the rescan takes it");
    publish_all(&store, &b).await;

    // Nothing claimable: the next claims start after the last row. A new row is taken at
    // once; another late one waits for the rescan.
    let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert!(b.messages.is_empty());
    release(&store, b.token).await;
    // Id 0: above the first late row's, below the start an empty claim moves to.
    db.exec(late("late-2", 0)).await;
    db.outbox
        .enqueue_batch(&db.pool, &[msg("new", 1)])
        .await
        .unwrap();
    let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
    assert_eq!(ids(&b), vec!["new"]);
    release(&store, b.token).await;
    let b = until_claimed(&store, "late-2").await;
    assert_eq!(ids(&b), vec!["late-2", "new"]);
    release(&store, b.token).await;
    db.drop().await;
}

/// Claims (releasing each) until a batch holds aggregate `agg`, for at most 5 s (the window's
/// `max_rescan` is 2 s there).
async fn until_claimed(store: &outbox_postgres::PgStore, agg: &str) -> outbox_core::ClaimedBatch {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let b = store.claim_batch(claim(100, 30_000)).await.unwrap();
        if b.messages.iter().any(|m| m.aggregate_id == agg) {
            return b;
        }
        release(store, b.token).await;
        assert!(
            std::time::Instant::now() < deadline,
            "{agg} was not claimed within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
