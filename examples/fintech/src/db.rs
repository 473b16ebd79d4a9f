//! The two databases: connections and their tables.
//!
//! * **payments** (the payments service's own database): `payments` (the aggregate, with its
//!   own `version` column) and the toolkit's schema `outbox`: the outbox, the request
//!   idempotency keys, and, for the capture worker that belongs to the payments service, its
//!   inbox and its work items.
//! * **reporting** (the reporting service's own database): `payment_report` and the
//!   toolkit's schema `outbox`, of which it uses the inbox.

use std::time::Duration;

use anyhow::{Context, Result};
use outbox::postgres::Schema;
use sqlx::PgPool;

use crate::topology::OUTBOX_SCHEMA;

/// The toolkit's schema in both databases.
pub fn schema() -> Schema {
    Schema::new(OUTBOX_SCHEMA).expect("a plain identifier")
}

/// A pool of at most `max` connections to `url`, failing early with the cause.
///
/// # Errors
/// The server is unreachable, the database does not exist, authentication failed.
pub async fn connect(url: &str, max: u32) -> Result<PgPool> {
    Ok(outbox::postgres::connect(url, max, Duration::from_secs(5)).await?)
}

/// The payments database: the toolkit's migrations (library API), then the service's table.
///
/// # Errors
/// Any database error.
pub async fn migrate_payments(pool: &PgPool) -> Result<()> {
    outbox::postgres::migrate(pool, &schema())
        .await
        .context("cannot migrate the outbox schema of the payments database")?;
    // `version` is the aggregate's own version: 1 with PaymentCreated, incremented by the
    // UPDATE that captures (README, "Producer API", the aggregate's own row).
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS payments (
             id          text        PRIMARY KEY,
             account     text        NOT NULL,
             amount      bigint      NOT NULL CHECK (amount > 0),
             status      text        NOT NULL CHECK (status IN ('created', 'captured')),
             version     bigint      NOT NULL,
             created_at  timestamptz NOT NULL DEFAULT now(),
             captured_at timestamptz
         )",
    )
    .execute(pool)
    .await
    .context("cannot create the payments table")?;
    Ok(())
}

/// The reporting database: the toolkit's migrations (for the inbox), then the report table.
///
/// # Errors
/// Any database error.
pub async fn migrate_reporting(pool: &PgPool) -> Result<()> {
    outbox::postgres::migrate(pool, &schema())
        .await
        .context("cannot migrate the outbox schema of the reporting database")?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS payment_report (
             payment_id  text        PRIMARY KEY,
             account     text        NOT NULL,
             amount      bigint      NOT NULL,
             status      text        NOT NULL,
             events      integer     NOT NULL,
             updated_at  timestamptz NOT NULL DEFAULT now()
         )",
    )
    .execute(pool)
    .await
    .context("cannot create the payment_report table")?;
    Ok(())
}

/// Refuses to start a process on a database that `fintech migrate` (or `run`) did not prepare.
///
/// # Errors
/// The toolkit's schema is missing or from another release, or `table` is missing.
pub async fn check(pool: &PgPool, table: &str) -> Result<()> {
    outbox::postgres::check_schema(pool, &schema())
        .await
        .context("the database is not migrated: run `fintech migrate`")?;
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(pool)
        .await?;
    if !exists {
        anyhow::bail!("table `{table}` is missing: run `fintech migrate`");
    }
    Ok(())
}
