//! Issue 11, acceptance 4, the other way to lose a slot: the server invalidates it because it
//! held back more WAL than `max_slot_wal_keep_size` while the relay was down. The relay then
//! refuses to stream, with the recovery named, and the guide's recovery ("a lost slot": the
//! polling relay, then CDC with `--create-slot`, which replaces the invalidated slot) publishes
//! every pending event with its id, in order per aggregate.
//!
//! This is a test binary of its own on purpose: `max_slot_wal_keep_size` is a server-wide
//! setting, and `cargo test` runs test binaries one after another, so no other test's slot
//! exists while it is lowered. The test checks that: it fails, saying why, if any other slot
//! exists on the server when it would lower the setting (another test's, another checkout's,
//! a bench's), rather than invalidate it. (Under a runner that runs binaries in parallel, run
//! this one alone.) The setting is put back when the test ends, passed or failed.
#![allow(missing_docs)]

mod cdc_common;
mod common;

use std::collections::HashSet;
use std::time::Duration;

use cdc_common::*;
use common::*;
use uuid::Uuid;

/// Lowers `max_slot_wal_keep_size` server-wide for its lifetime, after checking that no other
/// replication slot exists (it would be invalidated too: the test fails instead, saying so).
/// Dropped, also after a failed assertion, it puts back what was there: the value set with
/// `ALTER SYSTEM` before, or none.
struct KeepSizeLowered {
    previous_alter_system: Option<String>,
}

impl KeepSizeLowered {
    async fn set(pool: &sqlx::PgPool, value: &str, own_slot: &str) -> KeepSizeLowered {
        let others: Vec<String> = sqlx::query_scalar(
            "SELECT slot_name::text FROM pg_replication_slots WHERE slot_name <> $1",
        )
        .bind(own_slot)
        .fetch_all(pool)
        .await
        .unwrap();
        assert!(
            others.is_empty(),
            "other replication slots exist on this server ({others:?}): this test lowers \
             max_slot_wal_keep_size server-wide and would invalidate them; run it alone"
        );
        let (current, file): (String, Option<String>) = sqlx::query_as(
            "SELECT current_setting('max_slot_wal_keep_size'), sourcefile FROM pg_settings \
             WHERE name = 'max_slot_wal_keep_size'",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        let previous_alter_system = file
            .is_some_and(|f| f.ends_with("postgresql.auto.conf"))
            .then_some(current);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER SYSTEM SET max_slot_wal_keep_size = '{value}'"
        )))
        .execute(pool)
        .await
        .expect("ALTER SYSTEM (the test role must be a superuser)");
        sqlx::query("SELECT pg_reload_conf()")
            .execute(pool)
            .await
            .unwrap();
        KeepSizeLowered {
            previous_alter_system,
        }
    }
}

impl Drop for KeepSizeLowered {
    fn drop(&mut self) {
        let restore = match &self.previous_alter_system {
            Some(value) => format!("ALTER SYSTEM SET max_slot_wal_keep_size = '{value}'"),
            None => "ALTER SYSTEM RESET max_slot_wal_keep_size".to_owned(),
        };
        let done = on_a_runtime_of_its_own(move || async move {
            let pool = sqlx::PgPool::connect(&database_url()).await?;
            sqlx::query(sqlx::AssertSqlSafe(restore))
                .execute(&pool)
                .await?;
            sqlx::query("SELECT pg_reload_conf()")
                .execute(&pool)
                .await?;
            anyhow::Ok(())
        });
        if !matches!(done, Ok(Ok(()))) {
            eprintln!("putting max_slot_wal_keep_size back: {done:?}");
        }
    }
}

/// The slot's `wal_status` (`lost` once the server invalidated it).
async fn wal_status(admin: &sqlx::PgPool, slot: &str) -> Option<String> {
    sqlx::query_scalar("SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1")
        .bind(slot)
        .fetch_one(admin)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_invalidated_slot_stops_the_relay_and_the_recovery_republishes_every_pending_event() {
    let env = CdcEnv::new(Kind::Nats, "mode = \"cdc\"").await;
    let slot = env.db.name().to_owned();
    let admin = sqlx::PgPool::connect(&database_url()).await.unwrap();

    // The relay streams and confirms a first round, then stops (an orderly stop).
    let mut relay = env.spawn_relay(true, "cdc-relay-1");
    wait_slot_streamed(&env.db).await;
    let mut expected: Vec<Uuid> = produce(&env.db, "inv", 4, 1, 3).await;
    env.sub.wait_ids(&expected, Duration::from_secs(30)).await;
    assert!(relay.terminate().await.success());

    // While it is down: events committed, then more WAL than the lowered limit allows, and a
    // checkpoint, at which the server invalidates the slot.
    let pending = produce(&env.db, "inv", 4, 4, 6).await;
    expected.extend(pending.iter().copied());
    let lowered = KeepSizeLowered::set(&admin, "1MB", &slot).await;
    env.db
        .exec("CREATE TABLE {s}.filler (n int8, pad text)")
        .await;
    let mut rounds = 0;
    loop {
        let status = wal_status(&admin, &slot).await;
        if status.as_deref() == Some("lost") {
            break;
        }
        rounds += 1;
        assert!(
            rounds <= 20,
            "the slot was not invalidated (wal_status {status:?})"
        );
        // About 16 MB of WAL (a segment), then a new segment and a checkpoint.
        env.db.exec(
            "INSERT INTO {s}.filler SELECT n, repeat('x', 200) FROM generate_series(1, 60000) n",
        )
        .await;
        for statement in ["SELECT pg_switch_wal()", "CHECKPOINT"] {
            sqlx::query(statement).execute(&admin).await.unwrap();
        }
    }
    drop(lowered);
    assert_eq!(
        env.db.count("true").await,
        pending.len() as i64,
        "the unconfirmed events are rows of the table"
    );

    // Started again as a service would start it (no --create-slot): it refuses to go on, and
    // says what happened and where the recovery is.
    let refused = env.relay_refused().await;
    assert!(
        refused.stderr.contains("can no longer be streamed")
            && refused.stderr.contains("a lost slot"),
        "{refused:?}"
    );
    assert_eq!(
        env.db.count("true").await,
        pending.len() as i64,
        "the refused relay deleted nothing"
    );

    // The guide's recovery: the polling relay, then CDC with --create-slot (which replaces
    // the invalidated slot) while it runs; more events committed meanwhile.
    let (polling, cdc) = env.start_recovery("cdc-relay-2");
    wait_slot_streamed(&env.db).await;
    assert_ne!(
        wal_status(&admin, &slot).await.as_deref(),
        Some("lost"),
        "a new slot streams"
    );
    let after = produce(&env.db, "inv", 4, 7, 9).await;
    expected.extend(after.iter().copied());
    let expected: HashSet<Uuid> = expected.into_iter().collect();
    let ids = env
        .first_appearances(&expected, Duration::from_secs(60))
        .await;
    assert_eq!(
        ids, expected,
        "every event, those pending at the loss included"
    );
    env.finish_recovery(polling, cdc).await;
}
