//! The table statements of [`CdcFeed`] against the real PostgreSQL
//! (`OUTBOX_TEST_DATABASE_URL`).

use std::collections::HashSet;

use outbox_core::relay::log::{Leave, Waiting};
use outbox_core::{NewMessage, Payload};
use sqlx::PgPool;

use super::row::Row;
use super::table::full_xid;
use super::*;
use crate::PgOutbox;

/// The full id of a 32-bit xid next to a snapshot's xmax: before, at and after xmax, and
/// across an epoch boundary either way.
#[tokio::test]
async fn a_32_bit_xid_is_made_full_next_to_the_snapshots_xmax() {
    let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let pool = PgPool::connect(&url)
        .await
        .expect("PostgreSQL on OUTBOX_TEST_DATABASE_URL");
    const E: i64 = 1 << 32;
    for (xid, xmax, full) in [
        (700, 1000, 700),
        (1000, 1000, 1000),
        (1005, 1000, 1005),
        (700, 2 * E + 1000, 2 * E + 700),
        (1005, 2 * E + 1000, 2 * E + 1005),
        // xmax just past an epoch boundary, the xid just before it.
        (E - 2, 2 * E + 3, 2 * E - 2),
        // xmax just before a boundary, the xid just after it.
        (1, 2 * E - 2, 2 * E + 1),
    ] {
        let got: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT {}",
            full_xid("$1::int8", "$2::int8")
        )))
        .bind(xid)
        .bind(xmax)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(got, full, "xid {xid} next to xmax {xmax}");
    }
}

/// Enqueues `message` in a transaction left open (its row invisible to other sessions, as
/// in the moment between a commit reaching the log and becoming visible); returns it, the
/// row's id and the transaction's id.
async fn enqueue_open(
    pool: &PgPool,
    schema: &Schema,
    message: &NewMessage,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, i64, i64) {
    let mut tx = pool.begin().await.unwrap();
    PgOutbox::new(schema.clone())
        .enqueue(&mut *tx, message)
        .await
        .unwrap();
    let (id, xid): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, txid_current() FROM {}.events",
        schema.quoted()
    )))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    (tx, id, xid)
}

/// A fresh schema of its own on the test database, a CDC feed over it (never started: the
/// cases call its table statements), and the pool.
struct Fixture {
    pool: PgPool,
    schema: Schema,
    feed: CdcFeed,
}

impl Fixture {
    async fn new(prefix: &str) -> Self {
        let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let pool = PgPool::connect(&url)
            .await
            .expect("PostgreSQL on OUTBOX_TEST_DATABASE_URL");
        let schema = Schema::new(&format!("{prefix}_{}", uuid::Uuid::now_v7().simple())).unwrap();
        crate::migrate(&pool, &schema).await.unwrap();
        let feed = CdcFeed::new(
            &url,
            pool.clone(),
            schema.clone(),
            CdcConfig::default(),
            OnPublish::Delete,
        );
        Self { pool, schema, feed }
    }

    /// A new message of aggregate `t`/`id`, version 1.
    fn message(id: &str) -> NewMessage {
        NewMessage::new(
            "t",
            id,
            1,
            "T",
            Payload::bytes("application/json", b"{}".to_vec()),
        )
    }

    /// The one value of `sql` (`{s}` is the schema).
    async fn scalar<T>(&self, sql: &str) -> T
    where
        T: Send + Unpin + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
    {
        sqlx::query_scalar::<_, T>(sqlx::AssertSqlSafe(self.schema.render(sql)))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn remove(self) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            self.schema.quoted()
        )))
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

/// A dead letter of a row whose transaction the statement does not see yet is not counted
/// as recorded (it would stay pending unseen, its position confirmed): it is kept for a
/// later try, which records it once the transaction is visible. An open transaction stands
/// for the window, as below.
#[tokio::test]
async fn a_dead_letter_of_a_row_not_visible_yet_is_recorded_later() {
    let f = Fixture::new("cdc_late_dead").await;
    let new = Fixture::message("a");
    let (tx, id, xid) = enqueue_open(&f.pool, &f.schema, &new).await;
    let mut message = new.stored(id, chrono::Utc::now());
    message.attempts = 1;
    let leave = || Leave {
        event: Waiting {
            row: Row::Message(message.clone()),
            tx: 0,
            source_tx: (xid & 0xFFFF_FFFF) as u64,
            due: None,
        },
        dead: Some("refused".to_owned()),
    };
    let state = || f.scalar::<String>("SELECT state FROM {s}.events");
    let (late, written) = f.feed.leave_rows(&[leave()]).await.unwrap();
    assert_eq!((late, written), (HashSet::from([id]), 0), "not seen yet");
    tx.commit().await.unwrap();
    assert_eq!(
        state().await,
        "pending",
        "nothing recorded before it was seen"
    );
    let (late, written) = f.feed.leave_rows(&[leave()]).await.unwrap();
    assert_eq!((late, written), (HashSet::new(), 0));
    assert_eq!(state().await, "dead", "recorded once seen");
    f.remove().await;
}

/// The window between a transaction's commit record reaching the log and the commit
/// becoming visible is too short to hit on purpose; an open transaction stands for it:
/// its row is invisible to the settle's snapshot exactly as a row in that window is.
#[tokio::test]
async fn a_row_of_a_transaction_the_settle_does_not_see_yet_is_left_for_later() {
    let f = Fixture::new("cdc_late").await;
    let (pool, schema, feed) = (&f.pool, &f.schema, &f.feed);
    let count = || f.scalar::<i64>("SELECT count(*) FROM {s}.events");

    let (tx, id, xid) = enqueue_open(pool, schema, &Fixture::message("a")).await;
    let row = (id, xid & 0xFFFF_FFFF);
    assert_eq!(
        feed.settle_rows(&[row]).await.unwrap(),
        HashSet::from([id]),
        "not seen yet: left for later"
    );
    tx.commit().await.unwrap();
    assert_eq!(count().await, 1, "nothing deleted before it was seen");
    assert!(feed.settle_rows(&[row]).await.unwrap().is_empty());
    assert_eq!(count().await, 0, "deleted once seen");

    // Deleted by the producer in its transaction: seen, nothing to delete, not late.
    let mut tx = pool.begin().await.unwrap();
    PgOutbox::new(schema.clone())
        .delete_in_transaction(true)
        .enqueue(&mut *tx, &Fixture::message("b"))
        .await
        .unwrap();
    let (gone, xid): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT currval(pg_get_serial_sequence('{}.events', 'id')), txid_current()",
        schema.quoted()
    )))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert!(
        feed.settle_rows(&[(gone, xid & 0xFFFF_FFFF)])
            .await
            .unwrap()
            .is_empty()
    );
    f.remove().await;
}
