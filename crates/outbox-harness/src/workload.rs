//! `outbox demo-producer`: the payments workload as its own process, so that the crash matrix
//! can kill a producer between writing its transaction and committing it.
//!
//! Payment `i` has the id `pay-{i:06}`. Every `rollback_every`-th payment is rolled back on
//! purpose after writing its row and its intent (nothing of it may ever leave); every
//! `capture_every`-th payment is captured in a second transaction (`PaymentCaptured`, version 2).
//!
//! The workload is *resumable*: a restarted producer skips payments whose row exists and
//! finishes a capture that did not commit, as a client retrying its request would. So a crash
//! before a commit loses nothing that was acknowledged, and a crash after a commit never writes
//! a payment twice.
//!
//! Before every commit the producer prints `begin <payment> v<version>` on stdout (flushed), so
//! a harness knows which transaction was in flight when the process died.

use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_core::{NewMessage, Payload, crash};
use outbox_postgres::{PgOutbox, RelayWaker, Schema};
use sqlx::{AssertSqlSafe, PgPool};

/// Every how many payments one is rolled back on purpose, unless `--rollback-every` says
/// otherwise (the crash matrix relies on this default to know which payments must not exist).
pub const DEFAULT_ROLLBACK_EVERY: u64 = 10;

/// Options of `outbox demo-producer`.
#[derive(clap::Args, Debug, Clone)]
pub struct ProducerArgs {
    /// Payments to create (ids pay-000000 …).
    #[arg(long, default_value_t = 200)]
    pub payments: u64,
    /// Pause between payments, in milliseconds (a steady workload for chaos runs).
    #[arg(long, default_value_t = 0)]
    pub pace_ms: u64,
    /// Stop after this many seconds even if not all payments were created (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub duration_secs: u64,
    /// Every n-th payment (i % n == n-1) is rolled back on purpose.
    #[arg(long, default_value_t = DEFAULT_ROLLBACK_EVERY)]
    pub rollback_every: u64,
    /// Every n-th payment (i % n == 0) is captured in a second transaction.
    #[arg(long, default_value_t = 3)]
    pub capture_every: u64,
}

/// The business table of the workload, in `schema`.
pub async fn create_payments_table(pool: &PgPool, schema: &Schema) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {}.payments (id text PRIMARY KEY, amount bigint NOT NULL, \
         status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
        schema.as_str()
    )))
    .execute(pool)
    .await?;
    Ok(())
}

/// Whether payment `i` is rolled back on purpose.
pub fn rolled_back(i: u64, every: u64) -> bool {
    every > 0 && i % every == every - 1
}

/// The amount of payment `i`.
pub fn amount_of(i: u64) -> i64 {
    100 + (i as i64 % 900)
}

/// Runs the workload; returns once every payment was handled or the duration ran out.
///
/// # Errors
/// A database error ends the run (the process exits non-zero; a restart resumes).
pub async fn run_producer(args: ProducerArgs, pool: PgPool, schema: Schema) -> Result<()> {
    outbox_postgres::check_schema(&pool, &schema).await?;
    create_payments_table(&pool, &schema).await?;
    let outbox = PgOutbox::new(schema.clone());
    let waker = RelayWaker::spawn(pool.clone(), &outbox, Duration::from_millis(5));
    let s = schema.as_str().to_owned();
    let started = Instant::now();
    let mut stdout = std::io::stdout();
    for i in 0..args.payments {
        if args.duration_secs > 0 && started.elapsed() >= Duration::from_secs(args.duration_secs) {
            break;
        }
        let id = format!("pay-{i:06}");
        let status: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT status FROM {s}.payments WHERE id = $1"
        )))
        .bind(&id)
        .fetch_optional(&pool)
        .await?;
        let capture = args.capture_every > 0 && i.is_multiple_of(args.capture_every);
        match status.as_deref() {
            None => {
                let mut tx = pool.begin().await?;
                sqlx::query(AssertSqlSafe(format!(
                    "INSERT INTO {s}.payments (id, amount, status) VALUES ($1, $2, 'created')"
                )))
                .bind(&id)
                .bind(amount_of(i))
                .execute(&mut *tx)
                .await?;
                let v = outbox
                    .next_aggregate_version(&mut *tx, "payment", &id)
                    .await?;
                let msg = NewMessage::new(
                    "payment",
                    &id,
                    v,
                    "PaymentCreated",
                    Payload::json(&serde_json::json!({
                        "payment_id": id, "amount": amount_of(i), "currency": "EUR"
                    }))?,
                );
                outbox.enqueue(&mut *tx, &msg).await?;
                if rolled_back(i, args.rollback_every) {
                    tx.rollback().await?;
                    continue;
                }
                writeln!(stdout, "begin {id} v{v}")?;
                stdout.flush()?;
                crash::hit(crash::PRODUCER_BEFORE_COMMIT);
                tx.commit().await.context("commit")?;
                crash::hit(crash::PRODUCER_AFTER_COMMIT);
                waker.wake();
                if capture {
                    capture_payment(&pool, &outbox, &s, &id, i, &mut stdout).await?;
                    waker.wake();
                }
            }
            Some("created") if capture => {
                capture_payment(&pool, &outbox, &s, &id, i, &mut stdout).await?;
                waker.wake();
            }
            Some(_) => {}
        }
        if args.pace_ms > 0 {
            tokio::time::sleep(Duration::from_millis(args.pace_ms)).await;
        }
    }
    writeln!(stdout, "done")?;
    stdout.flush()?;
    // Let the waker's last NOTIFY go out.
    tokio::time::sleep(Duration::from_millis(20)).await;
    Ok(())
}

async fn capture_payment(
    pool: &PgPool,
    outbox: &PgOutbox,
    s: &str,
    id: &str,
    i: u64,
    stdout: &mut std::io::Stdout,
) -> Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {s}.payments SET status = 'captured' WHERE id = $1"
    )))
    .bind(id)
    .execute(&mut *tx)
    .await?;
    let v = outbox
        .next_aggregate_version(&mut *tx, "payment", id)
        .await?;
    let msg = NewMessage::new(
        "payment",
        id,
        v,
        "PaymentCaptured",
        Payload::json(&serde_json::json!({"payment_id": id, "amount": amount_of(i)}))?,
    );
    outbox.enqueue(&mut *tx, &msg).await?;
    writeln!(stdout, "begin {id} v{v}")?;
    stdout.flush()?;
    crash::hit(crash::PRODUCER_BEFORE_COMMIT);
    tx.commit().await.context("commit")?;
    crash::hit(crash::PRODUCER_AFTER_COMMIT);
    Ok(())
}
