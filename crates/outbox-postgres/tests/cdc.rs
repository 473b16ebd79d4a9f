//! The CDC stream against the real server with `wal_level = logical` (set by `scripts/services`):
//! committed inserts of the outbox table, whole transactions in commit order, decoded exactly as
//! the table holds them; rollbacks never seen; a restart resumes after the confirmed position
//! with the same rows; slot errors are told apart.

mod common;

use std::time::Duration;

use common::{TestDb, database_url, msg};
use outbox_core::NewMessage;
use outbox_postgres::cdc::{
    CdcConfig, CdcError, CdcEvent, CdcStream, CdcTransaction, create_slot, ensure_publication,
    heartbeat, remove, slot_state,
};
use sqlx::AssertSqlSafe;

/// A fresh schema with its publication and slot (the slot starts at the current end of the log),
/// and the guard that removes all three when the test ends, passed or failed: a slot left
/// behind would pin the server's WAL for good.
async fn setup() -> (TestDb, CdcConfig, Cleanup) {
    let (db, config, cleanup) = setup_without_slot().await;
    assert!(
        ensure_publication(&db.pool, &db.schema, &cleanup.publication)
            .await
            .expect("publication")
    );
    assert!(
        !ensure_publication(&db.pool, &db.schema, &cleanup.publication)
            .await
            .expect("publication again"),
        "a second call finds the publication"
    );
    assert!(
        create_slot(&db.pool, &cleanup.slot)
            .await
            .expect("slot (wal_level = logical: scripts/services sets it)")
    );
    (db, config, cleanup)
}

/// A fresh schema, the default CDC config, and the guard that removes the schema and the
/// config's slot and publication when the test ends; neither slot nor publication is created.
async fn setup_without_slot() -> (TestDb, CdcConfig, Cleanup) {
    let db = TestDb::new().await;
    let config = CdcConfig::default();
    let cleanup = Cleanup {
        schema: db.schema.as_str().to_owned(),
        slot: config.slot_name(&db.schema),
        publication: config.publication_name(&db.schema),
    };
    (db, config, cleanup)
}

/// The CDC relay's feed over `db`'s schema with `config`, deleting what it publishes.
fn cdc_feed(db: &TestDb, config: &CdcConfig) -> std::sync::Arc<outbox_postgres::cdc::CdcFeed> {
    std::sync::Arc::new(outbox_postgres::cdc::CdcFeed::new(
        &database_url(),
        db.pool.clone(),
        db.schema.clone(),
        config.clone(),
        outbox_postgres::OnPublish::Delete,
    ))
}

/// The versions of `aggregate` the fake broker acknowledged, each at its first delivery, in
/// the order they came (copies after a restart left out).
fn first_deliveries(transport: &outbox_testkit::fakes::FakeTransport, aggregate: &str) -> Vec<i64> {
    let mut firsts: Vec<i64> = Vec::new();
    for v in transport.acked_for(aggregate) {
        if !firsts.contains(&v) {
            firsts.push(v);
        }
    }
    firsts
}

/// Drops a test's slot, publication and schema, on a thread of its own (it runs while a failed
/// test unwinds, inside the test's runtime).
struct Cleanup {
    schema: String,
    slot: String,
    publication: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (schema, slot, publication) = (
            self.schema.clone(),
            self.slot.clone(),
            self.publication.clone(),
        );
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let pool = sqlx::PgPool::connect(&database_url()).await?;
                // A failed test's relay task may still stream the slot: `remove` ends it.
                remove(&pool, &slot, &publication, Duration::from_secs(10)).await?;
                sqlx::query(AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                )))
                .execute(&pool)
                .await?;
                anyhow::Ok(())
            })
        })
        .join();
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) if !std::thread::panicking() => panic!("cleanup: {e}"),
            Ok(Err(e)) => eprintln!("cleanup: {e}"),
            Err(_) => eprintln!("cleanup thread panicked"),
        }
    }
}

/// The next transaction with outbox inserts (idle positions skipped), within 20 s.
async fn next_tx(stream: &mut CdcStream) -> CdcTransaction {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => panic!("no transaction within 20 s"),
            Ok(Err(e)) => panic!("stream: {e}"),
            Ok(Ok(None)) => panic!("the stream ended"),
            Ok(Ok(Some(CdcEvent::Idle { .. }))) => {}
            Ok(Ok(Some(CdcEvent::Transaction(tx)))) => return tx,
        }
    }
}

/// `id, event_id, schema_version, headers, payload, payload_sha256, created_at` of a row.
type Row = (
    i64,
    uuid::Uuid,
    i32,
    String,
    Vec<u8>,
    Vec<u8>,
    chrono::DateTime<chrono::Utc>,
);

fn ids(tx: &CdcTransaction) -> Vec<uuid::Uuid> {
    tx.messages.iter().map(|m| m.event_id).collect()
}

#[tokio::test]
async fn committed_inserts_arrive_whole_in_commit_order_and_resume_after_the_confirmed_position() {
    let (db, config, _cleanup) = setup().await;
    let a = [
        msg("a", 1)
            .with_header("tenant", "acme")
            .with_schema_version(3),
        msg("a", 2),
    ];
    let mut b = msg("b", 1);
    b.destination = Some("payments.special".into());
    b.partition_key = Some("shard-7".into());
    let c = msg("c", 1);
    let r = msg("r", 1);

    // C starts first and commits last (a late commit); R rolls back.
    let mut tx_c = db.pool.begin().await.unwrap();
    db.outbox.enqueue(&mut *tx_c, &c).await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox.enqueue_batch(&mut *tx, &a).await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox.enqueue(&mut *tx, &r).await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox.enqueue(&mut *tx, &b).await.unwrap();
    tx.commit().await.unwrap();
    tx_c.commit().await.unwrap();

    let mut stream = CdcStream::start(&database_url(), &db.schema, &config)
        .await
        .expect("stream");
    let first = next_tx(&mut stream).await;
    let second = next_tx(&mut stream).await;
    let third = next_tx(&mut stream).await;
    assert_eq!(ids(&first), vec![a[0].event_id, a[1].event_id]);
    assert_eq!(ids(&second), vec![b.event_id]);
    assert_eq!(
        ids(&third),
        vec![c.event_id],
        "commit order, not start order"
    );
    assert!(first.end_lsn < second.end_lsn && second.end_lsn < third.end_lsn);

    // Every field as the table holds it (the polling relay's reading is the reference).
    let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, event_id, schema_version, headers::text, payload, payload_sha256, \
             created_at FROM {}.events ORDER BY id",
        db.schema.quoted()
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let streamed: Vec<_> = [&first, &second, &third]
        .iter()
        .flat_map(|t| t.messages.iter())
        .collect();
    assert_eq!(rows.len(), 4, "the rolled-back row is not in the table");
    for m in &streamed {
        let (id, _, schema_version, headers, payload, sha, created_at) = rows
            .iter()
            .find(|r| r.1 == m.event_id)
            .unwrap_or_else(|| panic!("{} streamed but not in the table", m.event_id));
        assert_eq!(m.id, *id);
        assert_eq!(m.schema_version, *schema_version);
        assert_eq!(
            serde_json::to_value(&m.headers).unwrap(),
            serde_json::from_str::<serde_json::Value>(headers).unwrap()
        );
        assert_eq!(m.payload.bytes.as_ref(), payload.as_slice());
        assert_eq!(
            Some(m.fingerprint),
            outbox_core::Fingerprint::from_slice(sha)
        );
        assert_eq!(m.created_at, *created_at);
        assert_eq!(m.payload.content_type.0, "application/json");
    }
    let streamed_b = &second.messages[0];
    assert_eq!(streamed_b.aggregate_type, "payment");
    assert_eq!(streamed_b.aggregate_id, "b");
    assert_eq!(streamed_b.aggregate_version, 1);
    assert_eq!(streamed_b.event_type, "PaymentCreated");
    assert_eq!(streamed_b.destination.as_deref(), Some("payments.special"));
    assert_eq!(streamed_b.partition_key.as_deref(), Some("shard-7"));
    assert_eq!(
        first.messages[0].headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    assert!(
        !streamed.iter().any(|m| m.event_id == r.event_id),
        "a rolled-back insert was streamed"
    );

    // Only A is confirmed: a restart gets B and C again, with the same rows.
    stream.confirm(first.end_lsn);
    stream.stop().await.expect("stop");
    let mut stream = CdcStream::start(&database_url(), &db.schema, &config)
        .await
        .expect("restart");
    let again = next_tx(&mut stream).await;
    assert_eq!(
        again, second,
        "the first unconfirmed transaction, identical"
    );
    let again = next_tx(&mut stream).await;
    assert_eq!(again, third);
    stream.confirm(third.end_lsn);
    stream.stop().await.expect("stop");

    let confirmed: String = sqlx::query_scalar(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(config.slot_name(&db.schema))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        lsn(&confirmed),
        third.end_lsn,
        "the slot holds the confirmed position"
    );
}

fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').expect("an LSN");
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// A transaction larger than a part (a quarter of `max_rows_in_memory`) arrives in parts, one
/// after the other, in insert order; only the last carries the commit's position, and it may
/// hold no rows (10,000 is five parts of 2,000 exactly). A smaller transaction after it comes
/// whole.
#[tokio::test]
async fn a_transaction_of_ten_thousand_events_arrives_in_parts_in_insert_order() {
    let (db, config, _cleanup) = setup().await;
    let config = CdcConfig {
        max_rows_in_memory: 8_000,
        ..config
    };
    let messages: Vec<NewMessage> = (1..=10_000).map(|v| msg("hot", v)).collect();
    let mut tx = db.pool.begin().await.unwrap();
    for chunk in messages.chunks(1000) {
        db.outbox.enqueue_batch(&mut *tx, chunk).await.unwrap();
    }
    tx.commit().await.unwrap();
    let small: Vec<NewMessage> = (1..=3).map(|v| msg("after", v)).collect();
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox.enqueue_batch(&mut *tx, &small).await.unwrap();
    tx.commit().await.unwrap();

    let mut stream = CdcStream::start(&database_url(), &db.schema, &config)
        .await
        .expect("stream");
    let mut parts = Vec::new();
    loop {
        let part = next_tx(&mut stream).await;
        let complete = part.complete;
        parts.push(part);
        if complete {
            break;
        }
    }
    let sizes: Vec<usize> = parts.iter().map(|p| p.messages.len()).collect();
    assert_eq!(sizes, [2_000, 2_000, 2_000, 2_000, 2_000, 0]);
    assert!(
        parts.iter().all(|p| p.xid == parts[0].xid),
        "one transaction"
    );
    assert!(
        parts[..5].iter().all(|p| p.end_lsn == 0),
        "no position before the last part"
    );
    assert!(parts[5].end_lsn > 0);
    let received: Vec<&outbox_core::OutboxMessage> =
        parts.iter().flat_map(|p| &p.messages).collect();
    assert!(
        received
            .iter()
            .zip(&messages)
            .all(|(m, n)| m.event_id == n.event_id && m.aggregate_version == n.aggregate_version),
        "every event, in the order inserted"
    );
    let after = next_tx(&mut stream).await;
    assert!(after.complete);
    assert_eq!(after.messages.len(), 3);
    assert!(after.end_lsn > parts[5].end_lsn);
    stream.stop().await.expect("stop");
}

#[tokio::test]
async fn a_missing_slot_and_a_busy_slot_are_errors_of_their_own() {
    let (db, config, _cleanup) = setup().await;
    let missing = CdcConfig {
        slot: Some(format!("{}_gone", db.schema.as_str())),
        ..config.clone()
    };
    let e = CdcStream::start(&database_url(), &db.schema, &missing)
        .await
        .expect_err("no such slot");
    assert!(matches!(e, CdcError::SlotMissing { .. }), "{e}");
    assert!(!e.is_transient());
    assert!(
        e.to_string()
            .contains("docs/guide/src/relay.md, \"a lost slot\""),
        "says where the recovery is: {e}"
    );

    let stream = CdcStream::start(&database_url(), &db.schema, &config)
        .await
        .expect("first stream");
    let state = slot_state(&db.pool, &config.slot_name(&db.schema))
        .await
        .unwrap()
        .expect("the slot");
    assert!(state.active, "{state:?}");
    assert_eq!(state.wal_status, "reserved");
    assert!(
        slot_state(&db.pool, missing.slot.as_deref().unwrap())
            .await
            .unwrap()
            .is_none()
    );
    let e = CdcStream::start(&database_url(), &db.schema, &config)
        .await
        .expect_err("the slot is streamed already");
    assert!(matches!(e, CdcError::SlotBusy { .. }), "{e}");
    assert!(e.is_transient(), "a standby waits and tries again");
    stream.stop().await.expect("stop");
}

/// Acceptance 3 of the CDC issue: an idle outbox on a database busy with other tables for a
/// minute. The CDC relay (feed and engine) confirms the idle positions it receives (keepalives
/// and heartbeats, one heartbeat a second as `outbox relay` writes them) and keeps the WAL its
/// slot retains bounded; a slot nobody streams, created at the same moment, retains all of it
/// (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_outbox_on_a_busy_database_keeps_the_retained_wal_bounded() {
    const BUSY: Duration = Duration::from_secs(60);
    let (db, config, _cleanup) = setup().await;
    let control = Cleanup {
        schema: db.schema.as_str().to_owned(),
        slot: format!("{}_control", config.slot_name(&db.schema)),
        publication: config.publication_name(&db.schema),
    };
    create_slot(&db.pool, &control.slot)
        .await
        .expect("control slot");
    let s = db.schema.quoted();
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {s}.busy (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text)"
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    let start_lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&db.pool)
        .await
        .unwrap();

    // The CDC relay itself (feed and engine), with nothing to publish.
    let feed = cdc_feed(&db, &config);
    let transport = std::sync::Arc::new(outbox_testkit::fakes::FakeTransport::new());
    let relay = std::sync::Arc::new(
        outbox_core::relay::Relay::with_feed(
            std::sync::Arc::clone(&feed),
            std::sync::Arc::clone(&transport),
            outbox_core::relay::RelayConfig {
                poll_interval: Duration::from_millis(100),
                ..outbox_core::relay::RelayConfig::default()
            },
        )
        .unwrap(),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let relay_task = tokio::spawn(std::sync::Arc::clone(&relay).run(stop.clone()));
    let writer = {
        let pool = db.pool.clone();
        let insert = format!(
            "INSERT INTO {s}.busy (body) SELECT repeat(md5(random()::text), 32) \
             FROM generate_series(1, 20)"
        );
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + BUSY;
            let mut next_heartbeat = tokio::time::Instant::now();
            let mut transactions = 0u64;
            while tokio::time::Instant::now() < until {
                sqlx::query(AssertSqlSafe(insert.clone()))
                    .execute(&pool)
                    .await
                    .expect("busy insert");
                transactions += 1;
                // About 3 MB of WAL a second: busy, without filling the disk.
                tokio::time::sleep(Duration::from_millis(5)).await;
                if tokio::time::Instant::now() >= next_heartbeat {
                    heartbeat(&pool).await.expect("heartbeat");
                    next_heartbeat += Duration::from_secs(1);
                }
            }
            transactions
        })
    };
    // The relay confirms the idle positions (keepalives, heartbeats) itself; the retained WAL
    // is sampled every 5 s.
    let mut samples = Vec::new();
    while !writer.is_finished() {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let state = slot_state(&db.pool, &config.slot_name(&db.schema))
            .await
            .unwrap()
            .expect("the slot");
        assert!(state.active, "the relay streams the slot");
        samples.push(state.retained_bytes / 1_000_000);
    }
    let transactions = writer.await.unwrap();
    // A checkpoint logs the running transactions, from which a logical slot's restart position
    // can move (the server also logs them every 15 s on its own); then heartbeats, which the
    // relay confirms, and its status updates reach the server.
    sqlx::query("CHECKPOINT").execute(&db.pool).await.unwrap();
    for _ in 0..3 {
        heartbeat(&db.pool).await.unwrap();
        tokio::time::sleep(config.status_interval + Duration::from_millis(500)).await;
    }
    stop.cancel();
    relay_task.await.unwrap();
    feed.shutdown().await.expect("shutdown");
    assert!(
        transport.acked().is_empty(),
        "an idle outbox publishes nothing"
    );

    let generated: i64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::int8")
            .bind(&start_lsn)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    let streamed = slot_state(&db.pool, &config.slot_name(&db.schema))
        .await
        .unwrap()
        .expect("the slot");
    let unstreamed = slot_state(&db.pool, &control.slot)
        .await
        .unwrap()
        .expect("the control slot");
    eprintln!(
        "{transactions} busy transactions, {} MB of WAL written; retained: streamed slot {} KB \
         at the end, every 5 s (MB) {samples:?}; control slot {} MB",
        generated / 1_000_000,
        streamed.retained_bytes / 1000,
        unstreamed.retained_bytes / 1_000_000
    );
    assert!(
        generated > 64_000_000,
        "the busy tables wrote only {generated} bytes of WAL: the test proves nothing"
    );
    assert!(
        unstreamed.retained_bytes >= generated,
        "the control slot retains what was written ({} of {generated})",
        unstreamed.retained_bytes
    );
    assert!(
        streamed.retained_bytes < 16_000_000,
        "the streamed slot retains {} bytes of {generated} written",
        streamed.retained_bytes
    );
    // While the writes went on, the slot held back at most the WAL between two logs of the
    // running transactions (15 s here), never the whole minute.
    let max_mb = samples.iter().copied().max().unwrap_or(0);
    assert!(
        max_mb * 1_000_000 < generated / 2,
        "the streamed slot retained up to {max_mb} MB while {generated} bytes were written: \
         {samples:?}"
    );
    assert_eq!(streamed.wal_status, "reserved");
    drop(control);
}

// The relay's engine over the CDC feed. The broker is the in-memory fake transport, which can
// script failures (the CDC relay on the real brokers runs in the transports' suites); the
// database, the slot and the log are real.

/// The replication connection honours `sslmode` as libpq (and the pool on the same URL) does,
/// as the server sees it: `prefer`, also when no `sslmode` is given, negotiates TLS with a
/// server that offers it (the password never goes in clear there); `allow` stays plain with a
/// server that lets it in so; `require` is TLS; `disable` is plain.
#[tokio::test]
async fn the_replication_connection_honours_sslmode_as_libpq_does() {
    let (db, config, _cleanup) = setup().await;
    let slot = config.slot_name(&db.schema);
    for (params, tls) in [
        ("", true),
        ("sslmode=prefer", true),
        ("sslmode=require", true),
        ("sslmode=allow", false),
        ("sslmode=disable", false),
    ] {
        let base = database_url();
        let url = match (params, base.contains('?')) {
            ("", _) => base,
            (_, true) => format!("{base}&{params}"),
            (_, false) => format!("{base}?{params}"),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let stream = loop {
            // The previous try's WAL sender lets go of the slot a moment after it stopped.
            match CdcStream::start(&url, &db.schema, &config).await {
                Err(CdcError::SlotBusy { .. }) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => break other.unwrap_or_else(|e| panic!("{params}: {e}")),
            }
        };
        let ssl: bool = sqlx::query_scalar(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_replication_slots r ON r.active_pid = s.pid \
             WHERE r.slot_name = $1",
        )
        .bind(&slot)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(ssl, tls, "sslmode from `{params}`");
        stream.stop().await.unwrap();
    }
}

mod relay {
    use std::sync::Arc;
    use std::time::Duration;

    use outbox_core::PublishErrorKind;
    use outbox_core::operator::DeadLetterOps as _;
    use outbox_core::relay::{Relay, RelayConfig};
    use outbox_postgres::cdc::{CdcEvent, CdcFeed, CdcStream};
    use outbox_testkit::fakes::FakeTransport;
    use tokio_util::sync::CancellationToken;

    use super::common::{TestDb, database_url, msg};
    use super::{cdc_feed, setup, setup_without_slot};

    fn config() -> RelayConfig {
        RelayConfig {
            workers: 2,
            poll_interval: Duration::from_millis(50),
            // Retriable failures are retried, never dead-lettered, within a test's life.
            max_attempts: 1_000_000,
            backoff: outbox_core::Backoff {
                base: Duration::from_millis(50),
                max: Duration::from_millis(200),
            },
            ..RelayConfig::default()
        }
    }

    /// A CDC relay running in the test.
    struct Running {
        feed: Arc<CdcFeed>,
        stop: CancellationToken,
        task: tokio::task::JoinHandle<()>,
        status_interval: Duration,
    }

    /// Starts a CDC relay; with `follow`, waits until its catch-up is done and it follows the
    /// log (what the test commits next is published from the stream, not from the table).
    async fn start(
        db: &TestDb,
        config: &outbox_postgres::cdc::CdcConfig,
        transport: &Arc<FakeTransport>,
        follow: bool,
    ) -> Running {
        let feed = cdc_feed(db, config);
        let (stop, task) = spawn(&feed, transport);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while follow && !feed.following_the_log() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "not following the log within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Running {
            feed,
            stop,
            task,
            status_interval: config.status_interval,
        }
    }

    /// Runs the relay's engine over `feed` and `transport` until the returned token is
    /// cancelled.
    fn spawn(
        feed: &Arc<CdcFeed>,
        transport: &Arc<FakeTransport>,
    ) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let relay =
            Arc::new(Relay::with_feed(Arc::clone(feed), Arc::clone(transport), config()).unwrap());
        let stop = CancellationToken::new();
        (stop.clone(), tokio::spawn(relay.run(stop)))
    }

    /// Requeues every dead letter, as an operator does.
    async fn requeue_all(db: &TestDb) {
        db.store()
            .requeue_dead_letters(
                &outbox_core::operator::DeadLetterSelection::All,
                &outbox_core::operator::Actor::new("test", "test").unwrap(),
                "test",
            )
            .await
            .unwrap();
    }

    /// Waits until at least `n` rows match `filter`; after `secs` fails with `what`.
    async fn wait_for_rows(db: &TestDb, filter: &str, n: i64, secs: u64, what: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        while db.count(filter).await < n {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    impl Running {
        /// Runs until `done` holds (at most 30 s), then stops the relay; returns the most
        /// streamed events its feed held at once ([`CdcFeed::peak_rows_in_memory`]). The feed
        /// is gone on return (its stream with it: the slot is free).
        async fn until(
            self,
            transport: &Arc<FakeTransport>,
            done: impl Fn(&FakeTransport) -> bool,
        ) -> usize {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while !done(transport) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "not done within 30 s: acked {:?}",
                    transport
                        .acked()
                        .iter()
                        .map(|m| (m.aggregate_id.clone(), m.aggregate_version))
                        .collect::<Vec<_>>()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            // Settled batches confirm their positions with the next status update.
            tokio::time::sleep(self.status_interval * 2).await;
            self.stop.cancel();
            self.task.await.unwrap();
            self.feed.peak_rows_in_memory()
        }
    }

    /// Runs a CDC relay over what is committed already (its catch-up, then the log) until
    /// `done` holds (at most 30 s), then stops it; returns [`Running::until`]'s peak.
    async fn run_until(
        db: &TestDb,
        config: &outbox_postgres::cdc::CdcConfig,
        transport: &Arc<FakeTransport>,
        done: impl Fn(&FakeTransport) -> bool,
    ) -> usize {
        start(db, config, transport, false)
            .await
            .until(transport, done)
            .await
    }

    /// The first delivery of each version of `aggregate` came in order, 1 to `versions`
    /// (copies after a restart are fine).
    fn assert_first_deliveries(transport: &FakeTransport, aggregate: &str, versions: i64) {
        assert_eq!(
            super::first_deliveries(transport, aggregate),
            (1..=versions).collect::<Vec<i64>>(),
            "{aggregate}: first deliveries in order"
        );
    }

    /// No transaction left after the confirmed position: a new stream sees only idle positions.
    async fn nothing_unconfirmed(db: &TestDb, config: &outbox_postgres::cdc::CdcConfig) {
        let mut stream = CdcStream::start(&database_url(), &db.schema, config)
            .await
            .expect("stream");
        let until = tokio::time::Instant::now() + Duration::from_secs(2);
        while let Ok(event) = tokio::time::timeout_at(until, stream.next()).await {
            match event.expect("stream") {
                Some(CdcEvent::Idle { .. }) => {}
                other => panic!("unconfirmed after the relay stopped: {other:?}"),
            }
        }
        stream.stop().await.expect("stop");
    }

    /// `b` waits behind its dead letter: only its v1 acknowledged, its v2 dead in the table and
    /// `pending` later versions pending there; every other aggregate's rows published.
    async fn assert_b_parked(db: &TestDb, transport: &FakeTransport, pending: i64) {
        assert_eq!(
            transport.acked_for("b"),
            vec![1],
            "b waits behind its dead letter"
        );
        assert_eq!(
            db.count("aggregate_id = 'b' AND state = 'dead' AND aggregate_version = 2")
                .await,
            1,
            "the dead letter is in the table, as the polling relay records it"
        );
        assert_eq!(
            db.count("aggregate_id = 'b' AND state = 'pending'").await,
            pending,
            "b's later versions stay pending in the table"
        );
        assert_eq!(db.count("aggregate_id <> 'b'").await, 0);
    }

    /// Every row published (the table is empty) and every transaction confirmed.
    async fn all_published_and_confirmed(db: &TestDb, config: &outbox_postgres::cdc::CdcConfig) {
        assert_eq!(db.count("true").await, 0);
        nothing_unconfirmed(db, config).await;
    }

    async fn enqueue_each(db: &TestDb, messages: &[outbox_core::NewMessage]) {
        for m in messages {
            let mut tx = db.pool.begin().await.unwrap();
            db.outbox.enqueue(&mut *tx, m).await.unwrap();
            tx.commit().await.unwrap();
        }
    }

    #[tokio::test]
    async fn every_committed_event_is_published_in_order_its_row_deleted_and_the_slot_confirmed() {
        let (db, config, _cleanup) = setup().await;
        // Three aggregates interleaved, five versions each, one transaction per event; one
        // rolled-back transaction.
        let transport = Arc::new(FakeTransport::new());
        let relay = start(&db, &config, &transport, true).await;
        let messages: Vec<_> = (1..=5)
            .flat_map(|v| ["a", "b", "c"].map(|agg| msg(agg, v)))
            .collect();
        enqueue_each(&db, &messages).await;
        let mut tx = db.pool.begin().await.unwrap();
        db.outbox
            .enqueue(&mut *tx, &msg("rolled-back", 1))
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        relay.until(&transport, |t| t.acked().len() >= 15).await;
        for agg in ["a", "b", "c"] {
            assert_eq!(transport.acked_for(agg), vec![1, 2, 3, 4, 5], "{agg}");
        }
        assert!(transport.acked_for("rolled-back").is_empty());
        assert_eq!(db.count("true").await, 0, "published rows are deleted");
        nothing_unconfirmed(&db, &config).await;
    }

    #[tokio::test]
    async fn a_retried_event_keeps_its_aggregate_in_order_and_a_dead_letter_parks_the_rest() {
        let (db, config, _cleanup) = setup().await;
        // a v2 fails twice (an outage), b v2 is refused for good.
        let transport = Arc::new(
            FakeTransport::new()
                .fail("a", 2, PublishErrorKind::Unavailable, 2)
                .fail("b", 2, PublishErrorKind::Invalid, 1),
        );
        let relay = start(&db, &config, &transport, true).await;
        let messages: Vec<_> = (1..=4)
            .flat_map(|v| ["a", "b", "c"].map(|agg| msg(agg, v)))
            .collect();
        enqueue_each(&db, &messages).await;
        relay
            .until(&transport, |t| {
                t.acked_for("a").len() == 4 && t.acked_for("c").len() == 4
            })
            .await;
        assert_eq!(
            transport.acked_for("a"),
            vec![1, 2, 3, 4],
            "retried in place"
        );
        assert_eq!(transport.acked_for("c"), vec![1, 2, 3, 4]);
        assert_b_parked(&db, &transport, 2).await;
        nothing_unconfirmed(&db, &config).await;

        // A restarted CDC relay keeps b parked (its catch-up leaves the rows behind the dead
        // letter alone); after a requeue, made while it runs, the same relay delivers b v2..v4
        // and then the streamed b v5, in order, with no polling relay.
        let relay = start(&db, &config, &transport, true).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(transport.acked_for("b"), vec![1]);
        assert_eq!(db.count("aggregate_id = 'b'").await, 3);
        requeue_all(&db).await;
        let mut tx = db.pool.begin().await.unwrap();
        db.outbox
            .enqueue_batch(&mut *tx, &[msg("b", 5), msg("c", 5)])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        relay
            .until(&transport, |t| {
                t.acked_for("c").len() == 5 && t.acked_for("b").len() >= 5
            })
            .await;
        let b = transport.acked_for("b");
        assert_eq!(b[..5], [1, 2, 3, 4, 5], "first deliveries in order: {b:?}");
        all_published_and_confirmed(&db, &config).await;
    }

    /// Memory bounded whatever a transaction's size: with room for 40 events, a transaction of
    /// 3,000 (30 aggregates x 100 versions) and one after it are published in full, each
    /// aggregate in order, while the feed never holds more than the bound plus one part; its
    /// rows are deleted and everything is confirmed.
    #[tokio::test]
    async fn a_transaction_larger_than_memory_is_published_part_by_part_in_order() {
        let (db, config, _cleanup) = setup().await;
        let config = outbox_postgres::cdc::CdcConfig {
            max_rows_in_memory: 40,
            ..config
        };
        let transport = Arc::new(FakeTransport::new());
        let relay = start(&db, &config, &transport, true).await;
        let big: Vec<_> = (1..=100)
            .flat_map(|v| (0..30).map(move |a| msg(&format!("big-{a}"), v)))
            .collect();
        let mut tx = db.pool.begin().await.unwrap();
        for chunk in big.chunks(500) {
            db.outbox.enqueue_batch(&mut *tx, chunk).await.unwrap();
        }
        tx.commit().await.unwrap();
        enqueue_each(&db, &[msg("after", 1), msg("after", 2)]).await;
        let peak = relay.until(&transport, |t| t.acked().len() >= 3_002).await;
        for a in 0..30 {
            assert_eq!(
                transport.acked_for(&format!("big-{a}")),
                (1..=100).collect::<Vec<i64>>(),
                "big-{a}"
            );
        }
        assert_eq!(transport.acked_for("after"), vec![1, 2]);
        assert!(
            (1..=40 + 10).contains(&peak),
            "held at most the bound plus one part of 10: {peak}"
        );
        assert_eq!(db.count("true").await, 0, "published rows are deleted");
        nothing_unconfirmed(&db, &config).await;
    }

    #[tokio::test]
    async fn an_event_still_failing_when_the_relay_stops_comes_again_from_the_slot() {
        let (db, config, _cleanup) = setup().await;
        // The broker refuses a v1 for the relay's whole first life; b goes through, and its
        // transactions commit after a's first one.
        let failing =
            Arc::new(FakeTransport::new().fail("a", 1, PublishErrorKind::Unavailable, 1_000));
        let relay = start(&db, &config, &failing, true).await;
        let messages: Vec<_> = (1..=3)
            .flat_map(|v| ["a", "b"].map(|agg| msg(agg, v)))
            .collect();
        enqueue_each(&db, &messages).await;
        relay.until(&failing, |t| t.acked_for("b").len() == 3).await;
        assert!(failing.acked_for("a").is_empty());
        // Nothing of a was confirmed: the next relay gets a v1..v3 from the slot and the table
        // rows are still there.
        assert_eq!(db.count("aggregate_id = 'a'").await, 3);
        let healthy = Arc::new(FakeTransport::new());
        run_until(&db, &config, &healthy, |t| t.acked_for("a").len() == 3).await;
        assert_eq!(healthy.acked_for("a"), vec![1, 2, 3]);
        all_published_and_confirmed(&db, &config).await;
    }

    /// With the producer deleting its rows in its own transaction, the table stays empty and
    /// the CDC relay publishes from the log; what it cannot publish is written back into the
    /// table: the dead letter as dead, the events behind it as pending, which the polling relay
    /// delivers in order after a requeue.
    #[tokio::test]
    async fn rows_deleted_by_the_producer_are_published_and_a_dead_letter_is_written_back() {
        let (db, config, _cleanup) = setup().await;
        let outbox = outbox_postgres::PgOutbox::new(db.schema.clone()).delete_in_transaction(true);
        for v in 1..=3 {
            for agg in ["a", "b"] {
                let mut tx = db.pool.begin().await.unwrap();
                outbox.enqueue(&mut *tx, &msg(agg, v)).await.unwrap();
                tx.commit().await.unwrap();
            }
        }
        let mut tx = db.pool.begin().await.unwrap();
        outbox
            .enqueue_batch(&mut *tx, &[msg("c", 1), msg("c", 2)])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(db.count("true").await, 0, "the producer's rows are gone");
        let config = outbox_postgres::cdc::CdcConfig {
            producers_delete_rows: true,
            ..config
        };

        // b v2 is refused for good.
        let transport = Arc::new(FakeTransport::new().fail("b", 2, PublishErrorKind::Invalid, 1));
        run_until(&db, &config, &transport, |t| {
            t.acked_for("a").len() == 3 && t.acked_for("c").len() == 2
        })
        .await;
        assert_eq!(transport.acked_for("a"), vec![1, 2, 3]);
        assert_eq!(transport.acked_for("c"), vec![1, 2]);
        assert_eq!(transport.acked_for("b"), vec![1]);
        assert_eq!(
            db.count("aggregate_id = 'b' AND aggregate_version = 2 AND state = 'dead'")
                .await,
            1,
            "the dead letter is written back, as dead"
        );
        assert_eq!(
            db.count("aggregate_id = 'b' AND aggregate_version = 3 AND state = 'pending'")
                .await,
            1,
            "the event behind it is written back, pending"
        );
        assert_eq!(db.count("true").await, 2);
        nothing_unconfirmed(&db, &config).await;

        requeue_all(&db).await;
        // Requeued while no relay runs: the next CDC relay's catch-up delivers them, in order.
        run_until(&db, &config, &transport, |t| t.acked_for("b").len() >= 3).await;
        assert_eq!(transport.acked_for("b"), vec![1, 2, 3]);
        all_published_and_confirmed(&db, &config).await;
    }

    /// Rows the relay cannot publish as stored (a header value that is not a string, a header
    /// name no binding carries, `created_at = 'infinity'`), written by a plain-SQL producer on a
    /// table without the constraint of migration 12: each is dead-lettered once with its reason,
    /// its aggregate waits behind it, everything else is published, and every transaction is
    /// confirmed (nothing streamed again, nothing retried). With the producer deleting its rows
    /// in its transactions, the dead letter is written back as the producer wrote it, with the
    /// option and without it (the relay finds the row gone).
    async fn unpublishable_rows_are_dead_lettered_from_the_stream(producers_delete: bool) {
        let (db, config, _cleanup) = setup().await;
        db.exec(format!(
            "ALTER TABLE \"{}\".events DROP CONSTRAINT events_publishable",
            db.schema
        ))
        .await;
        let s = db.schema.as_str();
        let row = |agg: &str, v: i64, headers: &str, created_at: &str| {
            let delete = if producers_delete {
                format!("; DELETE FROM \"{s}\".events WHERE aggregate_id = '{agg}'")
            } else {
                String::new()
            };
            format!(
                "INSERT INTO \"{s}\".events (event_id, aggregate_type, aggregate_id, \
                 aggregate_version, event_type, payload, headers, created_at) VALUES \
                 (gen_random_uuid(), 't', '{agg}', {v}, 'T', '\\x7b7d', '{headers}', \
                 {created_at}){delete}"
            )
        };
        let good = r#"{"tenant": "acme"}"#;
        let mut sql = Vec::new();
        for (agg, headers, created_at) in [
            ("null", r#"{"traceparent": null}"#, "now()"),
            ("number", r#"{"retries": 1e400}"#, "now()"),
            ("name", r#"{"x trace": "1"}"#, "now()"),
            ("infinity", good, "'infinity'"),
        ] {
            sql.push(row(agg, 1, good, "now()"));
            sql.push(row(agg, 2, headers, created_at));
            sql.push(row(agg, 3, good, "now()"));
        }
        sql.push(row("ok", 1, good, "now()"));
        let config = outbox_postgres::cdc::CdcConfig {
            producers_delete_rows: producers_delete,
            ..config
        };
        let transport = Arc::new(FakeTransport::new());
        // Committed while the relay follows the log: the stream's decoder meets them.
        let relay = start(&db, &config, &transport, true).await;
        for statement in sql {
            // One transaction each (simple protocol: the producer's DELETE rides along).
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN; {statement}; COMMIT")))
                .execute(&db.pool)
                .await
                .unwrap();
        }
        // The four dead letters are in the table (written back where the producer deleted
        // its rows) before the relay is stopped: their batches come after their aggregates'
        // first events, at the relay's pace, which a loaded machine slows. Settled, too: a
        // written-back row can be seen dead before its attempt is counted (a CI run under
        // load saw attempts 0 here), so the wait is for both.
        wait_for_rows(
            &db,
            "state = 'dead' AND attempts = 1",
            4,
            30,
            "the four dead letters are not in the table within 30 s",
        )
        .await;
        relay
            .until(&transport, |t| {
                ["null", "number", "name", "infinity", "ok"]
                    .iter()
                    .all(|a| t.acked_for(a).len() == 1)
            })
            .await;
        for (agg, reason) in [
            ("null", "header `traceparent` is null"),
            ("number", "column `headers` cannot be read"),
            ("name", "header name `x trace` is invalid"),
            ("infinity", "column `created_at` is out of the range"),
        ] {
            assert_eq!(transport.acked_for(agg), vec![1], "{agg} waits behind v2");
            let (state, error, attempts, headers): (String, String, i32, String) =
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT state, last_error, attempts, headers::text FROM \"{s}\".events \
                     WHERE aggregate_id = '{agg}' AND aggregate_version = 2"
                )))
                .fetch_one(&db.pool)
                .await
                .unwrap_or_else(|e| panic!("{agg} v2 is a dead letter in the table: {e}"));
            assert_eq!((state.as_str(), attempts), ("dead", 1), "{agg}");
            assert!(
                error.contains("cannot be published as stored") && error.contains(reason),
                "{agg}: {error}"
            );
            if agg == "null" {
                assert_eq!(
                    headers, r#"{"traceparent": null}"#,
                    "as the producer wrote it"
                );
            }
            assert_eq!(
                db.count(&format!(
                    "aggregate_id = '{agg}' AND aggregate_version = 3 AND state = 'pending'"
                ))
                .await,
                1,
                "{agg} v3 waits in the table"
            );
        }
        assert_eq!(db.count("state = 'dead'").await, 4, "nothing else dead");
        let created: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT created_at::text FROM \"{s}\".events WHERE aggregate_id = 'infinity' \
             AND aggregate_version = 2"
        )))
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(created, "infinity");
        nothing_unconfirmed(&db, &config).await;
    }

    #[tokio::test]
    async fn unpublishable_rows_are_dead_lettered_from_the_stream_and_the_rest_flows() {
        unpublishable_rows_are_dead_lettered_from_the_stream(false).await;
    }

    #[tokio::test]
    async fn unpublishable_rows_deleted_by_their_producer_are_written_back_as_dead_letters() {
        unpublishable_rows_are_dead_lettered_from_the_stream(true).await;
    }

    /// Producers that delete their rows, and a relay not told so: a dead letter and the events
    /// behind it are still written back (the relay finds their rows gone), never lost.
    #[tokio::test]
    async fn a_dead_letter_of_a_deleted_row_is_written_back_without_the_option() {
        let (db, config, _cleanup) = setup().await;
        let outbox = outbox_postgres::PgOutbox::new(db.schema.clone()).delete_in_transaction(true);
        for v in 1..=3 {
            let mut tx = db.pool.begin().await.unwrap();
            outbox.enqueue(&mut *tx, &msg("b", v)).await.unwrap();
            tx.commit().await.unwrap();
        }
        assert!(!config.producers_delete_rows);
        let transport = Arc::new(FakeTransport::new().fail("b", 2, PublishErrorKind::Invalid, 1));
        run_until(&db, &config, &transport, |t| t.acked_for("b").len() == 1).await;
        wait_for_rows(&db, "true", 2, 10, "not written back").await;
        assert_eq!(
            db.count("aggregate_version = 2 AND state = 'dead' AND attempts = 1")
                .await,
            1
        );
        assert_eq!(
            db.count("aggregate_version = 3 AND state = 'pending'")
                .await,
            1
        );
        nothing_unconfirmed(&db, &config).await;
    }

    /// The lag in seconds is the age of the oldest streamed transaction not confirmed: it grows
    /// while an event keeps failing and is zero once everything streamed is settled.
    #[tokio::test]
    async fn the_lag_is_the_age_of_the_oldest_unconfirmed_transaction() {
        let (db, config, _cleanup) = setup().await;
        let feed = cdc_feed(&db, &config);
        assert_eq!(feed.lag(), Duration::ZERO, "nothing streamed yet");
        let failing =
            Arc::new(FakeTransport::new().fail("a", 1, PublishErrorKind::Unavailable, 1_000));
        let (stop, task) = spawn(&feed, &failing);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        // Committed once the relay follows the log: streamed, not caught up from the table.
        while !feed.following_the_log() {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        enqueue_each(&db, &[msg("a", 1), msg("b", 1)]).await;
        let committed = std::time::Instant::now();
        while failing.acked_for("b").is_empty() || committed.elapsed() < Duration::from_millis(1500)
        {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let lag = feed.lag();
        assert!(
            lag >= Duration::from_secs(1) && lag <= committed.elapsed() + Duration::from_secs(1),
            "a v1 has been failing since its commit {:?} ago: lag {lag:?}",
            committed.elapsed()
        );
        stop.cancel();
        task.await.unwrap();
        feed.shutdown().await.unwrap();

        let feed = cdc_feed(&db, &config);
        let healthy = Arc::new(FakeTransport::new());
        let (stop, task) = spawn(&feed, &healthy);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while healthy.acked_for("a").is_empty() || feed.lag() > Duration::ZERO {
            assert!(
                tokio::time::Instant::now() < deadline,
                "lag {:?} after a v1 was published",
                feed.lag()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.cancel();
        task.await.unwrap();
        feed.shutdown().await.unwrap();
    }

    /// The catch-up: rows committed before the slot existed (the slot starts at the end of the
    /// log, so the stream never brings them) are published by the CDC relay itself, from the
    /// table, in order and before what the log brings of the same aggregates; a row the broker
    /// refuses is dead-lettered there and its aggregate waits behind it; after a requeue,
    /// delivered by the same relay. No polling relay at any time; nothing is published twice
    /// (the stream skips what the catch-up published); everything confirmed.
    #[tokio::test]
    async fn rows_committed_before_the_slot_are_published_by_the_cdc_relay_itself() {
        let (db, config, _cleanup) = setup_without_slot().await;
        // Before the slot: a, b (v2 refused for good), c v1..v3.
        let before: Vec<_> = (1..=3)
            .flat_map(|v| ["a", "b", "c"].map(|agg| msg(agg, v)))
            .collect();
        enqueue_each(&db, &before).await;
        outbox_postgres::cdc::ensure_publication(&db.pool, &db.schema, &_cleanup.publication)
            .await
            .unwrap();
        outbox_postgres::cdc::create_slot(&db.pool, &_cleanup.slot)
            .await
            .unwrap();
        // After it: v4 of each (streamed, and visible to the catch-up too).
        enqueue_each(&db, &[msg("a", 4), msg("b", 4), msg("c", 4)]).await;
        let transport = Arc::new(FakeTransport::new().fail("b", 2, PublishErrorKind::Invalid, 1));
        let relay = start(&db, &config, &transport, true).await;
        // And once it follows the log: v5 of each.
        enqueue_each(&db, &[msg("a", 5), msg("b", 5), msg("c", 5)]).await;
        relay
            .until(&transport, |t| {
                t.acked_for("a").len() >= 5 && t.acked_for("c").len() >= 5
            })
            .await;
        assert_eq!(
            transport.acked_for("a"),
            vec![1, 2, 3, 4, 5],
            "once each, in order"
        );
        assert_eq!(
            transport.acked_for("c"),
            vec![1, 2, 3, 4, 5],
            "once each, in order"
        );
        assert_b_parked(&db, &transport, 3).await;
        nothing_unconfirmed(&db, &config).await;

        requeue_all(&db).await;
        run_until(&db, &config, &transport, |t| t.acked_for("b").len() >= 5).await;
        assert_eq!(transport.acked_for("b"), vec![1, 2, 3, 4, 5]);
        all_published_and_confirmed(&db, &config).await;
    }

    /// A requeue whose wake-up the relay never gets (made with plain SQL, no `NOTIFY`): the
    /// parked aggregate is looked at again in the table every few seconds, and the relay's next
    /// catch-up delivers the requeued row and the rows behind it, in order.
    #[tokio::test]
    async fn a_requeue_without_its_wake_up_is_still_delivered() {
        let (db, config, _cleanup) = setup().await;
        let transport = Arc::new(FakeTransport::new().fail("b", 2, PublishErrorKind::Invalid, 1));
        let relay = start(&db, &config, &transport, true).await;
        enqueue_each(&db, &[msg("b", 1), msg("b", 2), msg("b", 3)]).await;
        wait_for_rows(&db, "state = 'dead'", 1, 20, "no dead letter").await;
        db.exec(format!(
            "UPDATE \"{}\".events SET state = 'pending', attempts = 0 WHERE state = 'dead'",
            db.schema
        ))
        .await;
        relay
            .until(&transport, |t| t.acked_for("b").len() >= 3)
            .await;
        assert_eq!(transport.acked_for("b"), vec![1, 2, 3]);
        all_published_and_confirmed(&db, &config).await;
    }

    /// A slot created while producers write, with no polling relay: every committed event is
    /// published by the CDC relay (those committed before the slot from the table, the rest
    /// from the log), each aggregate's first deliveries in order.
    #[tokio::test]
    async fn a_slot_created_while_producers_write_loses_nothing() {
        let (db, config, cleanup) = setup_without_slot().await;
        outbox_postgres::cdc::ensure_publication(&db.pool, &db.schema, &cleanup.publication)
            .await
            .unwrap();
        let aggregates: Vec<String> = (0..30).map(|i| format!("w-{i}")).collect();
        let producer = {
            let (pool, outbox) = (db.pool.clone(), db.outbox.clone());
            let aggregates = aggregates.clone();
            tokio::spawn(async move {
                for v in 1..=20 {
                    let batch: Vec<_> = aggregates.iter().map(|a| msg(a, v)).collect();
                    let mut tx = pool.begin().await.unwrap();
                    outbox.enqueue_batch(&mut *tx, &batch).await.unwrap();
                    tx.commit().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(60)).await;
        outbox_postgres::cdc::create_slot(&db.pool, &cleanup.slot)
            .await
            .unwrap();
        let transport = Arc::new(FakeTransport::new());
        let relay = start(&db, &config, &transport, false).await;
        producer.await.unwrap();
        relay
            .until(&transport, |t| {
                aggregates.iter().all(|a| t.acked_for(a).len() >= 20)
            })
            .await;
        for a in &aggregates {
            assert_first_deliveries(&transport, a, 20);
        }
        all_published_and_confirmed(&db, &config).await;
    }

    #[tokio::test]
    async fn a_relay_stopped_and_started_again_mid_stream_loses_nothing_and_keeps_order() {
        let (db, config, _cleanup) = setup().await;
        let transport = Arc::new(FakeTransport::new());
        let aggregates: Vec<String> = (0..20).map(|i| format!("agg-{i}")).collect();
        let producer = {
            let (pool, outbox) = (db.pool.clone(), db.outbox.clone());
            let aggregates = aggregates.clone();
            tokio::spawn(async move {
                for v in 1..=10 {
                    for agg in &aggregates {
                        let mut tx = pool.begin().await.unwrap();
                        outbox.enqueue(&mut *tx, &msg(agg, v)).await.unwrap();
                        tx.commit().await.unwrap();
                    }
                }
            })
        };
        // Three relay lives while the producer writes 200 events.
        for round in 1..=3 {
            let seen = transport.acked().len();
            run_until(&db, &config, &transport, |t| {
                t.acked().len() >= (seen + 40).min(200) || round == 3 && t.acked().len() >= 200
            })
            .await;
        }
        producer.await.unwrap();
        let transport_done = |t: &FakeTransport| {
            aggregates
                .iter()
                .all(|a| t.acked_for(a).iter().copied().max() == Some(10))
        };
        run_until(&db, &config, &transport, transport_done).await;
        for agg in &aggregates {
            assert_first_deliveries(&transport, agg, 10);
        }
        all_published_and_confirmed(&db, &config).await;
    }
}

/// Acceptance 6 of the CDC issue, at the engine level: polling → CDC → polling while a
/// producer keeps writing, by the guide's procedure (docs/guide/src/relay.md, "CDC relay") (the CDC relay starts while the polling
/// relay still runs; the polling relay stops once no row older than the CDC relay's start is
/// pending; then CDC stops and polling takes over again). Every event arrives, and each
/// aggregate's versions first appear in order.
mod switching {
    use std::sync::Arc;
    use std::time::Duration;

    use outbox_core::relay::{Relay, RelayConfig};
    use outbox_postgres::cdc::{create_slot, ensure_publication};
    use outbox_testkit::fakes::FakeTransport;
    use tokio_util::sync::CancellationToken;

    use super::common::msg;
    use super::{cdc_feed, setup_without_slot};

    fn relay_config() -> RelayConfig {
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            lease: Duration::from_secs(3),
            publish_timeout: Duration::from_millis(500),
            lease_safety_margin: Duration::from_millis(200),
            max_attempts: 1_000_000,
            ..RelayConfig::default()
        }
    }

    async fn wait(what: &str, secs: u64, mut done: impl AsyncFnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        while !done().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what} within {secs} s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn polling_to_cdc_to_polling_under_load_loses_nothing_and_keeps_order() {
        let (db, config, _cleanup) = setup_without_slot().await;
        ensure_publication(&db.pool, &db.schema, &config.publication_name(&db.schema))
            .await
            .unwrap();
        let transport = Arc::new(FakeTransport::new());
        let store = Arc::new(db.store());

        // The producer: 20 aggregates, one version each every 20 ms round, until stopped.
        let producing = CancellationToken::new();
        let producer = {
            let (pool, outbox, stop) = (db.pool.clone(), db.outbox.clone(), producing.clone());
            tokio::spawn(async move {
                let mut v = 0;
                while !stop.is_cancelled() {
                    v += 1;
                    let batch: Vec<_> = (0..20).map(|a| msg(&format!("sw-{a}"), v)).collect();
                    let mut tx = pool.begin().await.unwrap();
                    outbox.enqueue_batch(&mut *tx, &batch).await.unwrap();
                    tx.commit().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                v
            })
        };

        // 1. Polling.
        let polling_stop = CancellationToken::new();
        let polling = Arc::new(
            Relay::new(Arc::clone(&store), Arc::clone(&transport), relay_config()).unwrap(),
        );
        let polling_task = tokio::spawn(Arc::clone(&polling).run(polling_stop.clone()));
        tokio::time::sleep(Duration::from_secs(2)).await;

        // 2. CDC starts beside it; polling stops once nothing older than CDC's start is pending.
        create_slot(&db.pool, &config.slot_name(&db.schema))
            .await
            .unwrap();
        let cdc_start: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        let feed = cdc_feed(&db, &config);
        let cdc_stop = CancellationToken::new();
        let cdc = Arc::new(
            Relay::with_feed(Arc::clone(&feed), Arc::clone(&transport), relay_config()).unwrap(),
        );
        let cdc_task = tokio::spawn(Arc::clone(&cdc).run(cdc_stop.clone()));
        let older = format!(
            "state = 'pending' AND created_at < '{}'",
            cdc_start.to_rfc3339()
        );
        wait("the rows older than the slot published", 30, async || {
            db.count(&older).await == 0
        })
        .await;
        polling_stop.cancel();
        polling_task.await.unwrap();
        let before_cdc_alone = transport.acked().len();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            transport.acked().len() > before_cdc_alone,
            "the CDC relay publishes on its own"
        );

        // 3. Back to polling: CDC stops, polling starts.
        cdc_stop.cancel();
        cdc_task.await.unwrap();
        feed.shutdown().await.unwrap();
        let polling_stop = CancellationToken::new();
        let polling = Arc::new(
            Relay::new(Arc::clone(&store), Arc::clone(&transport), relay_config()).unwrap(),
        );
        let polling_task = tokio::spawn(Arc::clone(&polling).run(polling_stop.clone()));
        tokio::time::sleep(Duration::from_secs(2)).await;
        producing.cancel();
        let last = producer.await.unwrap();
        wait("everything published", 30, async || {
            db.count("true").await == 0
        })
        .await;
        polling_stop.cancel();
        polling_task.await.unwrap();

        for a in 0..20 {
            let agg = format!("sw-{a}");
            assert_eq!(
                super::first_deliveries(&transport, &agg),
                (1..=last).collect::<Vec<_>>(),
                "{agg}: every version, first appearances in order"
            );
        }
        eprintln!(
            "{} versions of 20 aggregates, {} publishes ({} copies)",
            last,
            transport.acked().len(),
            transport.acked().len() - 20 * last as usize
        );
        db.drop().await;
    }
}
