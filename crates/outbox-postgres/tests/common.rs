//! Shared test set-up: a real PostgreSQL (never a fake), one fresh schema per test.
#![allow(dead_code, missing_docs)]

use outbox_core::NewMessage;

use outbox_testkit::fixture::{BoxFuture, HeldProducer};

use sqlx::{AssertSqlSafe, PgPool, Postgres, Transaction};

#[allow(unused_imports)] // not every test binary connects by itself
pub use outbox_testkit::pg::{TestDb, database_url};

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

/// Writes `messages` in a producer transaction of `db` that stays open until the handle
/// commits.
pub async fn enqueue_held(db: &TestDb, messages: &[NewMessage]) -> Box<dyn HeldProducer> {
    let mut tx = db.pool.begin().await.expect("begin");
    db.outbox
        .enqueue_batch(&mut *tx, messages)
        .await
        .expect("enqueue");
    Box::new(HeldPg(tx))
}
