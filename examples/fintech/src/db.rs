//! The two databases: connections and their tables.
//!
//! * **payments** (the payments service's own database): `payments` (the aggregate, with its
//!   own `version` column) and the toolkit's schema `outbox`: the outbox, the request
//!   idempotency keys, and, for the capture worker that belongs to the payments service, its
//!   inbox and its work items.
//! * **reporting** (the reporting service's own database): `payment_report` and the
//!   toolkit's schema `outbox`, of which it uses the inbox.
//!
//! Each is migrated with the toolkit's migrations (library API) first, then the service's own
//! table, whose statement is in `examples/fintech/sql/` (`ServiceDatabase::migrate`).

use anyhow::Result;
use sqlx::PgPool;
use support::database::ServiceDatabase;

pub use support::database::{connect, schema};

/// The payments database. `version` is the aggregate's own version: 1 with PaymentCreated,
/// incremented by the UPDATE that captures (docs/guide/src/producer.md, "Version modes": the
/// aggregate's own row).
pub const PAYMENTS: ServiceDatabase = ServiceDatabase {
    name: "payments",
    tables: &[("payments", include_str!("../sql/payments.sql"))],
};

/// The reporting database: the report table (and the toolkit's schema, for the inbox).
pub const REPORTING: ServiceDatabase = ServiceDatabase {
    name: "reporting",
    tables: &[("payment_report", include_str!("../sql/payment_report.sql"))],
};

/// A pool of at most `max` connections to `db` at `url`, refusing a database that
/// `fintech migrate` (or `run`) did not prepare.
///
/// # Errors
/// The database is unreachable, or the toolkit's schema or the service's table is missing.
pub async fn open(db: &ServiceDatabase, url: &str, max: u32) -> Result<PgPool> {
    db.open(url, max, "fintech migrate").await
}
