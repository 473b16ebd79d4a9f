//! What the CDC relay's CLI tests share: the slot's cleanup, the relay's command line, waiting
//! for the slot to be streamed, and a producer of version rounds.
#![allow(dead_code)]

use std::time::Duration;

use crate::common::*;
use uuid::Uuid;

/// Drops the test's slot and publication when the test ends, passed or failed (a slot left
/// behind pins the server's WAL).
pub struct SlotCleanup(pub String);

impl Drop for SlotCleanup {
    fn drop(&mut self) {
        let name = self.0.clone();
        let done = on_a_runtime_of_its_own(move || async move {
            let pool = sqlx::PgPool::connect(&database_url()).await?;
            outbox_postgres::cdc::remove(&pool, &name, &name, Duration::from_secs(10)).await?;
            anyhow::Ok(())
        });
        if !matches!(done, Ok(Ok(()))) {
            eprintln!("cleanup of slot {}: {done:?}", self.0);
        }
    }
}

/// Runs the future `work` makes to its end on a runtime of its own, in a thread of its own:
/// for cleanups in `Drop`, which runs inside the test's runtime (or while it unwinds).
pub fn on_a_runtime_of_its_own<W, F>(work: W) -> std::thread::Result<F::Output>
where
    W: FnOnce() -> F + Send + 'static,
    F: std::future::Future,
    F::Output: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(work())
    })
    .join()
}

pub async fn cli(db: &TestDb, config: &TempFile, args: &[&str]) -> Run {
    let mut cmd = outbox(Some(db.name()), None, Some(config.path()));
    cmd.args(args);
    run(cmd, Duration::from_secs(30)).await
}

pub fn relay_cmd(
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

/// Waits until a relay streams the test's slot (named after its schema): a WAL sender holds
/// it. A slot is also `active` while `pg_create_logical_replication_slot` builds it, which
/// waits for the transactions running then, and a transaction committed in that window is
/// before the slot's start.
pub async fn wait_slot_streamed(db: &TestDb) {
    wait_until(
        Duration::from_secs(20),
        "the slot streamed",
        || async move {
            db.scalar(&format!(
                "SELECT count(*) FROM pg_replication_slots s \
                 JOIN pg_stat_replication r ON r.pid = s.active_pid \
                 WHERE s.slot_name = '{}'",
                db.name()
            ))
            .await
                == 1
        },
    )
    .await;
}

/// One transaction per version round: `aggregates` aggregates, versions `from..=to`.
pub async fn produce(
    db: &TestDb,
    prefix: &str,
    aggregates: usize,
    from: i64,
    to: i64,
) -> Vec<Uuid> {
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

/// Writes one version of ten aggregates (`{prefix}-0` to `-9`) per transaction, every 5 ms,
/// until `stop`; the task returns the event ids written, in order.
pub fn produce_until(
    db: &TestDb,
    prefix: &str,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Vec<Uuid>> {
    let (pool, outbox, prefix) = (db.pool.clone(), db.outbox.clone(), prefix.to_owned());
    tokio::spawn(async move {
        let mut ids = Vec::new();
        let mut v = 0;
        while !stop.is_cancelled() {
            v += 1;
            let batch: Vec<_> = (0..10)
                .map(|a| event(&format!("{prefix}-{a}"), v))
                .collect();
            let mut tx = pool.begin().await.unwrap();
            outbox.enqueue_batch(&mut *tx, &batch).await.unwrap();
            tx.commit().await.unwrap();
            ids.extend(batch.iter().map(|m| m.event_id));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        ids
    })
}
