//! The store fixture over a fresh PostgreSQL schema: what the conformance suites (store,
//! engines, operator) and the polling feed's suite run on.

use crate::common::TestDb;
use outbox_core::consumer::{ConsumerDeadLetter, HandlerError};
use outbox_core::effect::{NewWorkItem, WorkItemState};
use outbox_core::operator::prelude::*;
use outbox_core::{NewMessage, StoreError, StoreErrorKind};
use outbox_postgres::PgStore;
use outbox_testkit::fixture::{HeldProducer, StoreFixture, WorkItemView};
use sqlx::{AssertSqlSafe, PgConnection, Row};
use std::time::Duration;

/// The store over a fresh schema; `MARK`: published rows are kept (mark mode) instead of
/// deleted, as `relay.on_publish = "mark"` runs it.
pub struct PgFixture<const MARK: bool = false> {
    db: TestDb,
}

impl<const MARK: bool> PgFixture<MARK> {
    fn sql(&self, template: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(template.replace("{s}", &format!("\"{}\"", self.db.schema)))
    }

    async fn exec(&self, template: &str) {
        sqlx::query(self.sql(template))
            .execute(&self.db.pool)
            .await
            .unwrap_or_else(|e| panic!("{template}: {e}"));
    }

    async fn count(&self, template: &str) -> i64 {
        sqlx::query_scalar(self.sql(template))
            .fetch_one(&self.db.pool)
            .await
            .unwrap_or_else(|e| panic!("{template}: {e}"))
    }
}

impl<const MARK: bool> StoreFixture for PgFixture<MARK> {
    type Store = PgStore;

    async fn new() -> Self {
        let db = TestDb::new().await;
        let f = Self { db };
        f.exec("CREATE TABLE {s}.test_effects (key text NOT NULL)")
            .await;
        f
    }

    fn store(&self) -> PgStore {
        self.db.store_with(if MARK {
            outbox_postgres::OnPublish::Mark
        } else {
            outbox_postgres::OnPublish::Delete
        })
    }

    async fn enqueue(&self, messages: Vec<NewMessage>) {
        self.db.enqueue(&messages).await;
    }

    async fn enqueue_held(&self, messages: Vec<NewMessage>) -> Box<dyn HeldProducer> {
        crate::common::enqueue_held(&self.db, &messages).await
    }

    async fn write_effect<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        key: &'a str,
    ) -> Result<(), HandlerError> {
        sqlx::query(self.sql("INSERT INTO {s}.test_effects (key) VALUES ($1)"))
            .bind(key)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn effect_count(&self, key: &str) -> u64 {
        let n: i64 =
            sqlx::query_scalar(self.sql("SELECT count(*) FROM {s}.test_effects WHERE key = $1"))
                .bind(key)
                .fetch_one(&self.db.pool)
                .await
                .expect("count effects");
        n as u64
    }

    async fn enqueue_work_item<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        item: &'a NewWorkItem,
    ) -> Result<(), StoreError> {
        self.db
            .store()
            .effects()
            .enqueue(conn, item)
            .await
            .map(|_| ())
            .map_err(|e| StoreError::new(StoreErrorKind::Constraint, e.to_string()))
    }

    async fn work_item(&self, id: i64) -> WorkItemView {
        self.work_items()
            .await
            .into_iter()
            .find(|w| w.id == id)
            .unwrap_or_else(|| panic!("no work item {id}"))
    }

    async fn work_items(&self) -> Vec<WorkItemView> {
        let rows = sqlx::query(self.sql(
            "SELECT id, state, attempts, lookups, reference, last_error FROM {s}.work_items ORDER BY id",
        ))
        .fetch_all(&self.db.pool)
        .await
        .expect("work items");
        rows.iter()
            .map(|r| {
                let state: String = r.get(1);
                WorkItemView {
                    id: r.get(0),
                    state: WorkItemState::parse(&state).expect("known state"),
                    attempts: r.get(2),
                    lookups: r.get(3),
                    reference: r.get(4),
                    last_error: r.get(5),
                }
            })
            .collect()
    }

    async fn age_work_items(&self, by: Duration) {
        sqlx::query(self.sql(
            "UPDATE {s}.work_items SET next_attempt_at = next_attempt_at - $1 * interval '1 second', \
             resolved_at = resolved_at - $1 * interval '1 second', \
             unknown_since = unknown_since - $1 * interval '1 second'",
        ))
        .bind(by.as_secs_f64())
        .execute(&self.db.pool)
        .await
        .expect("age work items");
    }

    async fn expire_work_item_leases(&self) {
        self.exec(
            "UPDATE {s}.work_items SET lease_until = now() - interval '1 millisecond' \
             WHERE lease_until IS NOT NULL",
        )
        .await;
    }

    async fn age_inbox(&self, by: Duration) {
        sqlx::query(
            self.sql("UPDATE {s}.inbox SET received_at = received_at - $1 * interval '1 second'"),
        )
        .bind(by.as_secs_f64())
        .execute(&self.db.pool)
        .await
        .expect("age inbox");
    }

    async fn inbox_len(&self) -> usize {
        self.count("SELECT count(*) FROM {s}.inbox").await as usize
    }

    async fn conflict_count(&self) -> usize {
        self.count("SELECT count(*) FROM {s}.inbox_conflicts").await as usize
    }

    async fn expire_relay_leases(&self) {
        self.exec("UPDATE {s}.leases SET lease_until = now() - interval '1 millisecond'")
            .await;
    }

    async fn age_relay_leases(&self, by: Duration) {
        sqlx::query(
            self.sql("UPDATE {s}.leases SET lease_until = lease_until - $1 * interval '1 second'"),
        )
        .bind(by.as_secs_f64())
        .execute(&self.db.pool)
        .await
        .expect("age leases");
    }

    async fn relay_lease_count(&self) -> usize {
        self.count("SELECT count(*) FROM {s}.leases").await as usize
    }

    async fn consumer_dead_letters(&self, consumer: &str) -> Vec<ConsumerDeadLetter> {
        // Every state (the operator's list hides resolved letters).
        sqlx::query(self.sql(
            "SELECT id, consumer_name, event_id, aggregate_type, aggregate_id, aggregate_version, \
             event_type, error, attempts, state, created_at FROM {s}.consumer_dead_letters \
             WHERE consumer_name = $1 ORDER BY id",
        ))
        .bind(consumer)
        .fetch_all(&self.db.pool)
        .await
        .expect("dead letters")
        .iter()
        .map(|row| ConsumerDeadLetter {
            id: row.get(0),
            consumer_name: row.get(1),
            event_id: row.get(2),
            aggregate_type: row.get(3),
            aggregate_id: row.get(4),
            aggregate_version: row.get(5),
            event_type: row.get(6),
            error: row.get(7),
            attempts: row.get(8),
            state: row.get(9),
            created_at: row.get(10),
        })
        .collect()
    }

    async fn requeue_consumer_dead_letters(&self, consumer: &str) -> u64 {
        let which = outbox_core::operator::ConsumerSelection {
            consumer: Some(consumer.to_owned()),
            ..Default::default()
        };
        let actor = outbox_core::operator::Actor::new("suite", "test").expect("actor");
        self.db
            .store()
            .requeue_consumer_dead_letters(&which, &actor, "suite")
            .await
            .expect("requeue")
    }

    async fn set_consumer_paused(&self, consumer: &str, paused: bool) {
        let admin = self.store();
        let actor = outbox_core::operator::Actor::new("suite", "test").expect("actor");
        let target = outbox_core::operator::PauseTarget::Consumer(consumer.to_owned());
        if paused {
            admin
                .pause(&target, &actor, "engine suite")
                .await
                .expect("pause");
        } else {
            admin.resume(&target, &actor, "").await.expect("resume");
        }
    }

    async fn cleanup(&self) {
        self.exec("DROP SCHEMA {s} CASCADE").await;
    }
}
