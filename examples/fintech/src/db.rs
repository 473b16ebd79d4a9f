//! The two databases: connections and their tables.
//!
//! * **payments** (the payments service's own database): `payments` (the aggregate, with its
//!   own `version` column) and the toolkit's schema `outbox`: the outbox, the request
//!   idempotency keys, and, for the capture worker that belongs to the payments service, its
//!   inbox and its work items.
//! * **reporting** (the reporting service's own database): `payment_report` and the
//!   toolkit's schema `outbox`, of which it uses the inbox.

use anyhow::Result;
use sqlx::PgPool;

pub use support::database::{connect, schema};

/// The payments database: the toolkit's migrations (library API), then the service's table.
///
/// # Errors
/// Any database error.
pub async fn migrate_payments(pool: &PgPool) -> Result<()> {
    // `version` is the aggregate's own version: 1 with PaymentCreated, incremented by the
    // UPDATE that captures (docs/guide/src/producer.md, "Version modes": the aggregate's own row).
    support::database::migrate(
        pool,
        "payments",
        &["CREATE TABLE IF NOT EXISTS payments (
             id          text        PRIMARY KEY,
             account     text        NOT NULL,
             amount      bigint      NOT NULL CHECK (amount > 0),
             status      text        NOT NULL CHECK (status IN ('created', 'captured')),
             version     bigint      NOT NULL,
             created_at  timestamptz NOT NULL DEFAULT now(),
             captured_at timestamptz
         )"],
    )
    .await
}

/// The reporting database: the toolkit's migrations (for the inbox), then the report table.
///
/// # Errors
/// Any database error.
pub async fn migrate_reporting(pool: &PgPool) -> Result<()> {
    support::database::migrate(
        pool,
        "reporting",
        &["CREATE TABLE IF NOT EXISTS payment_report (
             payment_id  text        PRIMARY KEY,
             account     text        NOT NULL,
             amount      bigint      NOT NULL,
             status      text        NOT NULL,
             events      integer     NOT NULL,
             updated_at  timestamptz NOT NULL DEFAULT now()
         )"],
    )
    .await
}

/// Refuses to start a process on a database that `fintech migrate` (or `run`) did not prepare.
///
/// # Errors
/// The toolkit's schema is missing or from another release, or `table` is missing.
pub async fn check(pool: &PgPool, table: &str) -> Result<()> {
    support::database::check(pool, table, "fintech migrate").await
}
