//! What the CDC relay's CLI tests share: the slot's cleanup, the relay's command line, waiting
//! for the slot to be streamed, and a producer of version rounds.
#![allow(dead_code)]

use std::collections::HashSet;
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

/// One CDC relay test's world: a fresh schema migrated by `outbox migrate` (which creates the
/// publication), a broker with a subscriber, the relays' config file, and the cleanup of the
/// slot named after the schema.
pub struct CdcEnv {
    pub db: TestDb,
    pub broker: BrokerEnv,
    pub sub: Subscriber,
    pub config: TempFile,
    /// What `outbox migrate` said (it succeeded).
    pub migrated: Run,
    _cleanup: SlotCleanup,
}

impl CdcEnv {
    /// The world on a broker of `kind`, the config's `[relay]` table holding `relay_extra`
    /// (`mode = "cdc"` and what the test adds).
    pub async fn new(kind: Kind, relay_extra: &str) -> CdcEnv {
        let db = TestDb::new().await;
        let broker = BrokerEnv::new(kind).await;
        let sub = broker.subscriber().await;
        let _cleanup = SlotCleanup(db.name().to_owned());
        let config = config_file(relay_extra, &broker.toml(""));
        let migrated = cli(&db, &config, &["migrate"]).await;
        assert!(migrated.status.success(), "{migrated:?}");
        CdcEnv {
            db,
            broker,
            sub,
            config,
            migrated,
            _cleanup,
        }
    }

    /// `outbox <args>` with the test's config file (see [`cli`]).
    pub async fn cli(&self, args: &[&str]) -> Run {
        cli(&self.db, &self.config, args).await
    }

    /// `outbox relay` with the test's config (see [`relay_cmd`]).
    /// `outbox relay` on `db`, `broker` and `config`, with `--create-slot` when `create_slot`.
    pub fn relay_cmd(&self, create_slot: bool) -> std::process::Command {
        relay_cmd(&self.db, &self.broker, &self.config, create_slot)
    }

    /// `outbox relay` started as the child `name`.
    pub fn spawn_relay(&self, create_slot: bool, name: &str) -> ChildGuard {
        ChildGuard::spawn(self.relay_cmd(create_slot), name)
    }

    /// Runs `outbox relay` without `--create-slot` to its end, asserts that it failed, and
    /// returns what it said.
    pub async fn relay_refused(&self) -> Run {
        let refused = run(self.relay_cmd(false), Duration::from_secs(30)).await;
        assert!(!refused.status.success(), "{refused:?}");
        refused
    }

    /// The guide's recovery from a lost slot: a polling relay (`polling-relay`), then a CDC
    /// relay with `--create-slot` (`cdc_name`) beside it. Returns both, in that order.
    pub fn start_recovery(&self, cdc_name: &str) -> (ChildGuard, ChildGuard) {
        let mut polling = self.relay_cmd(false);
        polling.args(["--mode", "polling"]);
        let polling = ChildGuard::spawn(polling, "polling-relay");
        (polling, self.spawn_relay(true, cdc_name))
    }

    /// Waits up to `within` until every one of `expected` reached the subscriber; returns the
    /// ids seen, after checking that their first appearances kept each aggregate's order.
    pub async fn first_appearances(
        &self,
        expected: &HashSet<Uuid>,
        within: Duration,
    ) -> HashSet<Uuid> {
        let seen = self
            .sub
            .wait_ids(&expected.iter().copied().collect::<Vec<_>>(), within)
            .await;
        assert_first_appearances_in_order(seen)
    }

    /// The end of a recovery test: waits until the recovery's relays (`polling`, `cdc`, from
    /// [`CdcEnv::start_recovery`]) published and deleted every row, stops them and cleans up.
    pub async fn finish_recovery(self, polling: ChildGuard, cdc: ChildGuard) {
        self.db
            .wait_count("true", 0, Duration::from_secs(20), "published rows deleted")
            .await;
        drop(polling);
        drop(cdc);
        self.cleanup().await;
    }

    /// Drops the schema, the broker's test resources, then the slot.
    pub async fn cleanup(self) {
        self.db.drop().await;
        self.broker.cleanup().await;
    }
}

/// `outbox <args>` on `db` with `config`, killed after 30 s.
pub async fn cli(db: &TestDb, config: &TempFile, args: &[&str]) -> Run {
    let mut cmd = outbox(Some(db.name()), None, Some(config.path()));
    cmd.args(args);
    run(cmd, Duration::from_secs(30)).await
}

/// `outbox relay` on `db`, `broker` and `config`, with `--create-slot` when `create_slot`.
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
    produce_on(&db.pool, &db.outbox, prefix, aggregates, from, to).await
}

/// [`produce`] on a task of its own; the task returns the event ids written, in order.
pub fn spawn_produce(
    db: &TestDb,
    prefix: &str,
    aggregates: usize,
    from: i64,
    to: i64,
) -> tokio::task::JoinHandle<Vec<Uuid>> {
    let (pool, outbox, prefix) = (db.pool.clone(), db.outbox.clone(), prefix.to_owned());
    tokio::spawn(async move { produce_on(&pool, &outbox, &prefix, aggregates, from, to).await })
}

/// [`produce`] with the pool and outbox of a schema.
async fn produce_on(
    pool: &sqlx::PgPool,
    outbox: &outbox_postgres::PgOutbox,
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
        let mut tx = pool.begin().await.unwrap();
        outbox.enqueue_batch(&mut *tx, &batch).await.unwrap();
        tx.commit().await.unwrap();
        ids.extend(batch.iter().map(|m| m.event_id));
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
            ids.extend(produce_on(&pool, &outbox, &prefix, 10, v, v).await);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        ids
    })
}
