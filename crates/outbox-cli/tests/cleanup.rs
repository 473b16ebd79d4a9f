//! `outbox cleanup`: the elected retention round from the command line. An unsafe retention is
//! refused before anything is deleted; old succeeded work items go, everything else stays. In
//! mark mode, `outbox migrate` builds the indexes while a relay runs, and old published events
//! go while young ones, and the inbox's horizon, are kept.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::{
    BrokerEnv, ChildGuard, Kind, Run, TestDb, assert_first_appearances_in_order, config_file,
    database_url, event, outbox, wait_until,
};
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

#[tokio::test(flavor = "multi_thread")]
async fn mark_mode_keeps_published_events_until_cleanup_deletes_the_old_ones() {
    let db = TestDb::new().await;
    let broker = BrokerEnv::new(Kind::Nats).await;
    let sub = broker.subscriber().await;
    let config = config_file("on_publish = \"mark\"", &broker.toml(""));
    let events: Vec<_> = (1..=3)
        .flat_map(|v| (0..10).map(move |a| event(&format!("m-{a}"), v)))
        .collect();
    let published = |n: i64| {
        let db = &db;
        async move { db.count("state = 'published'").await == n }
    };

    // A relay started before the mark-mode indexes exist delivers, and says what is missing.
    db.enqueue(&events[..15]).await;
    let mut relay_cmd = outbox(Some(db.name()), Some(&broker.url()), Some(config.path()));
    relay_cmd.arg("relay");
    let mut relay = ChildGuard::spawn(relay_cmd, "relay");
    wait_until(Duration::from_secs(30), "15 events published", || {
        published(15)
    })
    .await;
    let log = relay.log();
    assert!(
        log.contains("without the mark-mode indexes") && log.contains("events_pending_idx"),
        "{log}"
    );

    // `outbox migrate` with the same configuration builds them while the relay runs.
    let mut migrate = outbox(Some(db.name()), None, Some(config.path()));
    migrate.arg("migrate");
    let out = common::run(migrate, Duration::from_secs(60)).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        out.stdout.contains(
            "mark-mode indexes created: events_pending_idx, events_unpublished_idx, \
             events_published_at_idx"
        ),
        "{out:?}"
    );
    db.enqueue(&events[15..]).await;
    wait_until(Duration::from_secs(30), "30 events published", || {
        published(30)
    })
    .await;
    relay.terminate().await;
    let ids: Vec<Uuid> = events.iter().map(|m| m.event_id).collect();
    assert_first_appearances_in_order(sub.wait_ids(&ids, Duration::from_secs(30)).await);

    // Published rows kept beyond the inbox's memory could be replayed into a second effect:
    // the published keep counts in the replay horizon.
    let out = cleanup(
        db.name(),
        &[
            "--inbox-keep-secs=3600",
            "--broker-retention-secs=60",
            "--published-keep-secs=86400",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        out.stderr.contains("--inbox-keep-secs 3600")
            && out.stderr.contains("--published-keep-secs 86400"),
        "{out:?}"
    );
    // Horizon flags without the inbox keep they belong to would be ignored: refused.
    for lone in [
        &["--inbox-keep-secs=86400"][..],
        &["--outbox-retention-secs=86400", "--published-keep-secs=60"][..],
    ] {
        let out = cleanup(db.name(), lone).await;
        assert_eq!(out.status.code(), Some(2), "{lone:?}: {out:?}");
        assert!(out.stderr.contains("required"), "{lone:?}: {out:?}");
    }
    assert_eq!(db.count("true").await, 30, "nothing deleted");

    // Versions 1 and 2 were published two hours ago: they go, in batches; version 3 stays.
    db.exec(
        "UPDATE {s}.events SET published_at = now() - interval '2 hours' \
         WHERE aggregate_version < 3",
    )
    .await;
    let out = cleanup(db.name(), &["--published-keep-secs=3600", "--batch-size=7"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        out.stdout.contains("deleted 20 row(s)") && out.stdout.contains("20 published events"),
        "{out:?}"
    );
    assert_eq!(db.count("true").await, 10);
    assert_eq!(
        db.count("state = 'published' AND aggregate_version = 3")
            .await,
        10
    );
    db.drop().await;
    broker.cleanup().await;
}
