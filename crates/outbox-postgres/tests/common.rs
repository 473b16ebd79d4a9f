//! Shared test set-up: a real PostgreSQL (never a fake), one fresh schema per test.
#![allow(dead_code, missing_docs)]

use outbox_core::NewMessage;
use outbox_postgres::{PgOutbox, PgStore, PgStoreConfig, Schema, migrate};
use outbox_testkit::fixture::{BoxFuture, HeldProducer};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool, Postgres, Transaction};

pub fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub struct TestDb {
    pub pool: PgPool,
    pub schema: Schema,
    pub outbox: PgOutbox,
}

impl TestDb {
    /// Connects (a missing server fails the test loudly) and migrates a fresh schema.
    pub async fn new() -> TestDb {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect(&database_url())
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {} is required: {e}", database_url()));
        let name = format!("t_{}", uuid::Uuid::now_v7().simple());
        let schema = Schema::new(&name).unwrap();
        migrate(&pool, &schema).await.expect("migrate");
        let outbox = PgOutbox::new(schema.clone());
        TestDb {
            pool,
            schema,
            outbox,
        }
    }

    pub fn store(&self) -> PgStore {
        self.store_with(outbox_postgres::OnPublish::Delete)
    }

    pub fn store_with(&self, on_publish: outbox_postgres::OnPublish) -> PgStore {
        PgStore::new(
            self.pool.clone(),
            PgStoreConfig {
                schema: self.schema.clone(),
                on_publish,
            },
        )
    }

    /// Runs one statement (a test's own set-up SQL); a failure fails the test.
    pub async fn exec(&self, sql: String) {
        exec(&self.pool, sql).await;
    }

    pub async fn count(&self, filter: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".events WHERE {filter}",
            self.schema
        )))
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    pub async fn drop(self) {
        sqlx::query(AssertSqlSafe(format!(
            "DROP SCHEMA \"{}\" CASCADE",
            self.schema
        )))
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

/// Runs one statement on `pool` (a test's own set-up SQL); a failure fails the test.
pub async fn exec(pool: &PgPool, sql: String) {
    sqlx::query(AssertSqlSafe(sql)).execute(pool).await.unwrap();
}

/// A `payment` event of aggregate `agg` at `version` (the suites' own).
#[allow(unused_imports)] // not every test binary writes events
pub use outbox_testkit::store::msg;

/// A producer transaction held open until the suite commits it.
pub struct HeldPg(pub Transaction<'static, Postgres>);

impl HeldProducer for HeldPg {
    fn commit(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(async move { self.0.commit().await.expect("held producer commits") })
    }
}

impl TestDb {
    /// Commits `messages` in one transaction.
    pub async fn enqueue(&self, messages: &[NewMessage]) {
        self.outbox
            .enqueue_batch(&self.pool, messages)
            .await
            .expect("enqueue");
    }

    /// Writes `messages` in a producer transaction that stays open until the handle commits.
    pub async fn enqueue_held(&self, messages: &[NewMessage]) -> Box<dyn HeldProducer> {
        let mut tx = self.pool.begin().await.expect("begin");
        self.outbox
            .enqueue_batch(&mut *tx, messages)
            .await
            .expect("enqueue");
        Box::new(HeldPg(tx))
    }
}
