//! `outbox relay --mode cdc` end to end, on the real brokers and PostgreSQL with logical
//! replication: `outbox migrate` creates the publication, the first start needs
//! `--create-slot`, every committed event arrives in per-aggregate order and its row is
//! deleted, a relay killed with SIGKILL mid-stream loses nothing after its restart, a slot
//! dropped under a running relay stops it with the recovery named, and that recovery (the
//! polling relay, then a new slot) delivers what was committed while no slot existed.
#![allow(missing_docs)]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use uuid::Uuid;

/// Drops the test's slot and publication when the test ends, passed or failed (a slot left
/// behind pins the server's WAL).
struct SlotCleanup(String);

impl Drop for SlotCleanup {
    fn drop(&mut self) {
        let name = self.0.clone();
        let done = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                let pool = sqlx::PgPool::connect(&database_url()).await?;
                outbox_postgres::cdc::remove(&pool, &name, &name, Duration::from_secs(10)).await?;
                anyhow::Ok(())
            })
        })
        .join();
        if !matches!(done, Ok(Ok(()))) {
            eprintln!("cleanup of slot {}: {done:?}", self.0);
        }
    }
}

async fn cli(db: &TestDb, config: &TempFile, args: &[&str]) -> Run {
    let mut cmd = outbox(Some(db.name()), None, Some(config.path()));
    cmd.args(args);
    run(cmd, Duration::from_secs(30)).await
}

fn relay_cmd(
    db: &TestDb,
    broker: &BrokerEnv,
    config: &TempFile,
    create_slot: bool,
) -> std::process::Command {
    let mut cmd = outbox(Some(db.name()), Some(&broker.url()), Some(config.path()));
    cmd.arg("relay");
    if create_slot {
        cmd.arg("--create-slot");
    }
    cmd
}

/// Copies of an event sent again (after a kill, a takeover, a recovery) are fine, same id;
/// the first appearances must be in version order per aggregate. Returns the ids seen.
fn assert_first_appearances_in_order(seen: Vec<Received>) -> HashSet<Uuid> {
    let mut ids = HashSet::new();
    let firsts: Vec<_> = seen
        .into_iter()
        .filter(|r| ids.insert(r.event_id))
        .collect();
    assert_strictly_increasing(&firsts);
    ids
}

/// One transaction per version round: `aggregates` aggregates, versions `from..=to`.
async fn produce(db: &TestDb, prefix: &str, aggregates: usize, from: i64, to: i64) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for v in from..=to {
        let batch: Vec<_> = (0..aggregates)
            .map(|a| event(&format!("{prefix}-{a}"), v))
            .collect();
        ids.extend(batch.iter().map(|m| m.event_id));
        db.enqueue(&batch).await;
    }
    ids
}

async fn cdc_relay_end_to_end(kind: Kind) {
    let db = TestDb::new().await;
    let broker = BrokerEnv::new(kind).await;
    let sub = broker.subscriber().await;
    let _cleanup = SlotCleanup(db.name().to_owned());
    let config = config_file("mode = \"cdc\"\ncdc_heartbeat_secs = 1", &broker.toml(""));

    let migrate = cli(&db, &config, &["migrate"]).await;
    assert!(migrate.status.success(), "{migrate:?}");
    assert!(
        migrate
            .stdout
            .contains(&format!("publication `{}`", db.name())),
        "{migrate:?}"
    );

    // Without a slot and without --create-slot: refused, with the way forward.
    let refused = run(
        relay_cmd(&db, &broker, &config, false),
        Duration::from_secs(30),
    )
    .await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(refused.stderr.contains("--create-slot"), "{refused:?}");

    let mut relay = ChildGuard::spawn(relay_cmd(&db, &broker, &config, true), "cdc-relay-1");
    wait_until(Duration::from_secs(20), "the slot streamed", || {
        let db = &db;
        async move {
            db.scalar(&format!(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' AND active",
                db.name()
            ))
            .await
                == 1
        }
    })
    .await;
    let mut expected: HashSet<Uuid> = produce(&db, "pay", 5, 1, 4).await.into_iter().collect();
    sub.wait_ids(
        &expected.iter().copied().collect::<Vec<_>>(),
        Duration::from_secs(30),
    )
    .await;
    wait_until(Duration::from_secs(20), "published rows deleted", || {
        let db = &db;
        async move { db.count("true").await == 0 }
    })
    .await;

    // SIGKILL while the next events stream; the restarted relay (no --create-slot) resumes
    // from the slot.
    let more = produce(&db, "pay", 5, 5, 12).await;
    expected.extend(more.iter().copied());
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &relay.id().to_string()])
        .status();
    relay.wait_exit(Duration::from_secs(10)).await;
    let late = produce(&db, "late", 3, 1, 3).await;
    expected.extend(late.iter().copied());
    let mut relay = ChildGuard::spawn(relay_cmd(&db, &broker, &config, false), "cdc-relay-2");
    let seen = sub
        .wait_ids(
            &expected.iter().copied().collect::<Vec<_>>(),
            Duration::from_secs(60),
        )
        .await;
    let ids = assert_first_appearances_in_order(seen);
    assert!(
        ids.is_subset(&expected) && expected.is_subset(&ids),
        "exactly the committed events"
    );
    wait_until(Duration::from_secs(20), "published rows deleted", || {
        let db = &db;
        async move { db.count("true").await == 0 }
    })
    .await;
    relay.assert_running();

    // The slot dropped under the running relay: it stops, non-zero, naming the recovery.
    let pool = sqlx::PgPool::connect(&database_url()).await.unwrap();
    let name = db.name().to_owned();
    let terminate = format!(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = '{name}' AND active"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        sqlx::query(sqlx::AssertSqlSafe(terminate.clone()))
            .execute(&pool)
            .await
            .unwrap();
        if outbox_postgres::cdc::drop_slot(&pool, &name).await.is_ok() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "could not drop the slot"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = relay.wait_exit(Duration::from_secs(30)).await;
    assert!(!status.success(), "{status}");
    let log = relay.log();
    assert!(
        log.contains("was dropped") && log.contains("a lost slot"),
        "the relay says what happened and where the recovery is:\n{log}"
    );

    // Events committed while no slot exists stay rows of the table. A CDC relay started
    // without --create-slot refuses, naming the recovery; the README's recovery (the polling
    // relay, then CDC again with --create-slot while it runs) delivers every one of them and
    // what follows, in order per aggregate.
    let lost = produce(&db, "lost", 4, 1, 3).await;
    expected.extend(lost.iter().copied());
    let refused = run(
        relay_cmd(&db, &broker, &config, false),
        Duration::from_secs(30),
    )
    .await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        refused.stderr.contains("does not exist") && refused.stderr.contains("a lost slot"),
        "{refused:?}"
    );
    let mut polling = relay_cmd(&db, &broker, &config, false);
    polling.args(["--mode", "polling"]);
    let polling = ChildGuard::spawn(polling, "polling-relay");
    let cdc = ChildGuard::spawn(relay_cmd(&db, &broker, &config, true), "cdc-relay-3");
    let after = produce(&db, "lost", 4, 4, 6).await;
    expected.extend(after.iter().copied());
    let seen = sub
        .wait_ids(
            &expected.iter().copied().collect::<Vec<_>>(),
            Duration::from_secs(60),
        )
        .await;
    let ids = assert_first_appearances_in_order(seen);
    assert!(
        expected.is_subset(&ids),
        "every event, those committed without a slot included"
    );
    wait_until(Duration::from_secs(20), "published rows deleted", || {
        let db = &db;
        async move { db.count("true").await == 0 }
    })
    .await;
    drop(polling);
    drop(cdc);
    db.cleanup().await;
    broker.cleanup().await;
}

#[tokio::test]
async fn nats_cdc_relay_end_to_end() {
    cdc_relay_end_to_end(Kind::Nats).await;
}

#[tokio::test]
async fn rabbitmq_cdc_relay_end_to_end() {
    cdc_relay_end_to_end(Kind::Rabbit).await;
}

#[tokio::test]
async fn kafka_cdc_relay_end_to_end() {
    cdc_relay_end_to_end(Kind::Kafka).await;
}

/// Two CDC relays on one slot: one streams, the other waits as a standby (the server lets one
/// connection stream a slot); the first killed, the standby takes over; nothing lost, order
/// kept.
#[tokio::test]
async fn a_standby_cdc_relay_takes_over_when_the_streaming_one_dies() {
    let db = TestDb::new().await;
    let broker = BrokerEnv::new(Kind::Nats).await;
    let sub = broker.subscriber().await;
    let _cleanup = SlotCleanup(db.name().to_owned());
    let config = config_file("mode = \"cdc\"", &broker.toml(""));
    assert!(cli(&db, &config, &["migrate"]).await.status.success());
    let mut first = ChildGuard::spawn(relay_cmd(&db, &broker, &config, true), "cdc-first");
    wait_until(Duration::from_secs(20), "the slot streamed", || {
        let db = &db;
        async move {
            db.scalar(&format!(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' AND active",
                db.name()
            ))
            .await
                == 1
        }
    })
    .await;
    let mut standby = ChildGuard::spawn(relay_cmd(&db, &broker, &config, false), "cdc-standby");
    wait_until(
        Duration::from_secs(20),
        "the standby waiting for the slot",
        || {
            let log = standby.log();
            async move { log.contains("streamed by another connection") }
        },
    )
    .await;
    let mut expected = produce(&db, "pay", 4, 1, 5).await;
    sub.wait_ids(&expected, Duration::from_secs(30)).await;
    standby.assert_running();

    let _ = std::process::Command::new("kill")
        .args(["-KILL", &first.id().to_string()])
        .status();
    first.wait_exit(Duration::from_secs(10)).await;
    expected.extend(produce(&db, "pay", 4, 6, 10).await);
    let seen = sub.wait_ids(&expected, Duration::from_secs(60)).await;
    let ids = assert_first_appearances_in_order(seen);
    assert_eq!(ids.len(), expected.len());
    standby.assert_running();
    let log = standby.log();
    assert!(
        log.contains("took over from the relay that held it"),
        "the standby took the slot over:\n{log}"
    );
    assert!(
        !log.contains("store error"),
        "waiting as a standby is not an error:\n{log}"
    );
    drop(standby);
    db.cleanup().await;
    broker.cleanup().await;
}
