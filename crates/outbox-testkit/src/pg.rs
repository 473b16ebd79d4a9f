//! A fresh PostgreSQL schema per test, on the real server (never a fake): the helper the
//! PostgreSQL store's tests, the binary's tests and the console's tests share (feature
//! `postgres`).
//!
//! The server is `OUTBOX_TEST_DATABASE_URL`, or the local test database. A server that cannot
//! be reached fails the test loudly, naming the address and the variable.

use std::time::Duration;

use outbox_core::NewMessage;
use outbox_postgres::{OnPublish, PgOutbox, PgStore, PgStoreConfig, Schema, migrate};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

/// The variable naming the test database, and its default.
const DATABASE_URL_ENV: &str = "OUTBOX_TEST_DATABASE_URL";
const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The test database's URL: `OUTBOX_TEST_DATABASE_URL`, or the local `test` database.
pub fn database_url() -> String {
    std::env::var(DATABASE_URL_ENV).unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

/// A pool of 16 connections to [`database_url`].
///
/// # Panics
/// When the server cannot be reached: a missing service fails the test, naming the address.
pub async fn connect_pool() -> PgPool {
    PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&database_url())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "PostgreSQL at {} is required (set {DATABASE_URL_ENV}; `bash scripts/services` \
                 starts it): {e}",
                database_url()
            )
        })
}

/// One fresh schema (named `t_<uuid>`) on its own pool, with the producer API over it.
/// A test drops it with [`TestDb::drop`] when it passes (a failed test leaves it to look at).
pub struct TestDb {
    /// The pool the schema was created with.
    pub pool: PgPool,
    /// The schema.
    pub schema: Schema,
    /// The producer API on the schema.
    pub outbox: PgOutbox,
}

impl TestDb {
    /// A fresh schema with the toolkit's migrations applied.
    ///
    /// # Panics
    /// When the server cannot be reached or a migration fails.
    pub async fn new() -> TestDb {
        let db = Self::unmigrated().await;
        migrate(&db.pool, &db.schema).await.expect("migrate");
        db
    }

    /// A fresh schema name with nothing created (for the tests of `migrate` itself).
    ///
    /// # Panics
    /// When the server cannot be reached.
    pub async fn unmigrated() -> TestDb {
        let pool = connect_pool().await;
        let schema = Schema::new(&format!("t_{}", uuid::Uuid::now_v7().simple()))
            .expect("a generated schema name is valid");
        let outbox = PgOutbox::new(schema.clone());
        TestDb {
            pool,
            schema,
            outbox,
        }
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        self.schema.as_str()
    }

    /// The store on the schema, deleting published rows.
    pub fn store(&self) -> PgStore {
        self.store_with(OnPublish::Delete)
    }

    /// The store on the schema with `on_publish`.
    pub fn store_with(&self, on_publish: OnPublish) -> PgStore {
        PgStore::new(
            self.pool.clone(),
            PgStoreConfig {
                schema: self.schema.clone(),
                on_publish,
            },
        )
    }

    /// `sql` with `{s}` replaced by the quoted schema name.
    pub fn sql(&self, sql: &str) -> String {
        sql.replace("{s}", &format!("\"{}\"", self.schema))
    }

    /// Runs one statement of the test's own ([`TestDb::sql`] applied).
    ///
    /// # Panics
    /// When the statement fails, naming it.
    pub async fn exec(&self, sql: impl AsRef<str>) {
        let sql = sql.as_ref();
        sqlx::query(AssertSqlSafe(self.sql(sql)))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The one `bigint` a query of the test's own returns ([`TestDb::sql`] applied).
    ///
    /// # Panics
    /// When the query fails, naming it.
    pub async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(self.sql(sql)))
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Rows of the outbox table matching `filter` (an SQL condition).
    pub async fn count(&self, filter: &str) -> i64 {
        self.scalar(&format!("SELECT count(*) FROM {{s}}.events WHERE {filter}"))
            .await
    }

    /// Waits up to `timeout` until [`TestDb::count`] of `filter` is `n`.
    ///
    /// # Panics
    /// When it is not by then, naming `what` and the last count.
    pub async fn wait_count(&self, filter: &str, n: i64, timeout: Duration, what: &str) {
        let mut last = None;
        let reached = crate::wait::until(what, timeout, async || {
            let count = self.count(filter).await;
            last = Some(count);
            Ok((count == n).then_some(()))
        })
        .await;
        if let Err(e) = reached {
            panic!("{e} (`{filter}` counts {last:?}, not {n})");
        }
    }

    /// Commits `messages` in one producer transaction.
    ///
    /// # Panics
    /// When the enqueue fails.
    pub async fn enqueue(&self, messages: &[NewMessage]) {
        self.outbox
            .enqueue_batch(&self.pool, messages)
            .await
            .expect("enqueue");
    }

    /// Drops the schema (if it was created) and closes the pool.
    pub async fn drop(self) {
        self.exec("DROP SCHEMA IF EXISTS {s} CASCADE").await;
        self.pool.close().await;
    }
}
