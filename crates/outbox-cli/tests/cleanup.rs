//! `outbox cleanup`: the elected retention round from the command line. An unsafe retention is
//! refused before anything is deleted; old succeeded work items go, everything else stays.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{Run, database_url};
use outbox_postgres::Schema;
use outbox_postgres::effects::{NewWorkItem, PgEffects};
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

async fn cleanup(schema: &str, args: &[&str]) -> Run {
    let mut cmd = common::outbox(Some(schema), None, None);
    cmd.arg("cleanup").args(args);
    common::run(cmd, Duration::from_secs(60)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn unsafe_retention_is_refused_and_old_succeeded_work_items_are_deleted() {
    let schema = format!("cln_{}", Uuid::now_v7().simple());
    let pool = PgPool::connect(&database_url()).await.expect("PostgreSQL");
    let s = Schema::new(&schema).unwrap();
    outbox_postgres::migrate(&pool, &s).await.unwrap();
    let effects = PgEffects::new(s.clone());
    let mut ids = Vec::new();
    for i in 0..4 {
        let mut tx = pool.begin().await.unwrap();
        let out = effects
            .enqueue(
                &mut tx,
                &NewWorkItem::for_event(
                    "payout",
                    "c",
                    Uuid::now_v7(),
                    serde_json::json!({"reference": format!("p{i}"), "amount": 1}),
                ),
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
        ids.push(match out {
            outbox_postgres::EnqueueOutcome::Inserted { id } => id,
            other => panic!("{other:?}"),
        });
    }
    // Two old succeeded items, one young succeeded, one old unknown.
    for (id, state, hours) in [
        (ids[0], "succeeded", 48),
        (ids[1], "succeeded", 48),
        (ids[2], "succeeded", 0),
        (ids[3], "unknown", 48),
    ] {
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {schema}.work_items SET state = $2, \
             resolved_at = CASE WHEN $2 = 'succeeded' THEN now() - make_interval(hours => $3) END, \
             unknown_since = CASE WHEN $2 = 'unknown' THEN now() - make_interval(hours => $3) END \
             WHERE id = $1"
        )))
        .bind(id)
        .bind(state)
        .bind(hours)
        .execute(&pool)
        .await
        .unwrap();
    }

    // Keeping inbox identities 1 h while the broker can replay for 24 h would allow a second
    // effect: refused, naming both numbers, and nothing deleted.
    let out = cleanup(
        &schema,
        &[
            "--inbox-keep-secs=3600",
            "--broker-retention-secs=86400",
            "--work-items-keep-secs=3600",
        ],
    )
    .await;
    let stderr = &out.stderr;
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("3600") && stderr.contains("86400") && stderr.contains("broker_retention"),
        "{stderr}"
    );
    let count = |pool: PgPool, schema: String| async move {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
            "SELECT count(*) FROM {schema}.work_items"
        )))
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(count(pool.clone(), schema.clone()).await, 4);

    let out = cleanup(
        &schema,
        &[
            "--inbox-keep-secs=86400",
            "--broker-retention-secs=3600",
            "--work-items-keep-secs=3600",
        ],
    )
    .await;
    let stdout = &out.stdout;
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", out.stderr);
    assert!(stdout.contains("deleted 2 row(s)"), "{stdout}");
    let left: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT id FROM {schema}.work_items ORDER BY id"
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(left, vec![ids[2], ids[3]]);
    let _ = sqlx::query(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await;
}
