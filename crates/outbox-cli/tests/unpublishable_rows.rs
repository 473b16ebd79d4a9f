//! Rows the relay cannot publish as stored never stop delivery: written by a plain-SQL producer
//! before the table refused them (the constraint of migration 12 dropped here, as on a table
//! older than it), each such row is dead-lettered once with its reason, the rows of other
//! aggregates and the earlier versions of its own are published, in order, and nothing is
//! retried. With the constraint in place the same inserts fail in the producer's transaction,
//! with the reason; a requeue of a row still wrong fails the same way, and one corrected by the
//! operator is published with the versions that waited behind it. A value the table accepts
//! even with the constraint (`created_at = 'infinity'`) is dead-lettered the same way. In
//! each relay mode: the polling relay's claim and the CDC relay's stream (rows written while
//! it streams its slot).
#![allow(missing_docs)]

mod cdc_common;
mod common;

use std::time::Duration;

use cdc_common::*;
use common::*;
use uuid::Uuid;

/// A row a plain-SQL producer could write: `headers` as JSON text, and the other columns the
/// relay reads beyond the aggregate key.
struct Row {
    aggregate_id: String,
    version: i64,
    event_type: &'static str,
    headers: &'static str,
    content_type: &'static str,
    destination: Option<&'static str>,
    partition_key: Option<&'static str>,
    /// What the dead letter's reason must name; `None` for a row that is published.
    refused_for: Option<&'static str>,
    /// `created_at` as SQL text; `None` for the default, `now()`.
    created_at: Option<&'static str>,
    event_id: Uuid,
}

fn row(aggregate_id: &str, version: i64) -> Row {
    Row {
        aggregate_id: aggregate_id.to_owned(),
        version,
        event_type: "PaymentUpdated",
        headers: r#"{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}"#,
        content_type: "application/json",
        destination: None,
        partition_key: None,
        refused_for: None,
        created_at: None,
        event_id: Uuid::now_v7(),
    }
}

/// Every kind of row the table accepted before migration 12 that no binding can carry (or no
/// consumer would read), each as version 2 of an aggregate of its own between a good version 1
/// and a good version 3.
fn refused_rows() -> Vec<Row> {
    let bad = |name: &str, reason: &'static str, change: &dyn Fn(&mut Row)| {
        let mut r = row(&format!("bad-{name}"), 2);
        r.refused_for = Some(reason);
        change(&mut r);
        r
    };
    vec![
        bad("null", "`traceparent` is null", &|r| {
            r.headers = r#"{"traceparent": null}"#
        }),
        bad("number", "`retries` is a number", &|r| {
            r.headers = r#"{"retries": 3}"#
        }),
        bad("nested", "`ctx` is an object", &|r| {
            r.headers = r#"{"ctx": {"a": "b"}}"#
        }),
        bad("array", "`tags` is an array", &|r| {
            r.headers = r#"{"tags": ["a"]}"#
        }),
        bad("bool", "`sampled` is a boolean", &|r| {
            r.headers = r#"{"sampled": true}"#
        }),
        bad("name", "header name `x trace`", &|r| {
            r.headers = r#"{"x trace": "1"}"#
        }),
        bad("reserved", "header name `ce-id`", &|r| {
            r.headers = r#"{"ce-id": "1"}"#
        }),
        bad("control", "control character", &|r| {
            r.headers = r#"{"x": "a\r\nb: c"}"#
        }),
        bad("media", "printable ASCII", &|r| {
            r.content_type = "application/json\u{7}"
        }),
        bad("destination", "`destination`", &|r| {
            r.destination = Some("")
        }),
        bad("type", "`event_type` has a control character", &|r| {
            r.event_type = "PaymentUpdated\r\nce-id: forged"
        }),
        bad("key", "`partition_key` has a control character", &|r| {
            r.partition_key = Some("k\u{1b}[2J")
        }),
    ]
}

/// Rows the table accepts even with its constraint that cannot be published either: each as
/// version 2 between two good versions, like [`refused_rows`].
fn accepted_unpublishable_rows() -> Vec<Row> {
    vec![Row {
        created_at: Some("infinity"),
        refused_for: Some("created_at"),
        ..row("bad-infinity", 2)
    }]
}

const INSERT: &str = "INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, \
    aggregate_version, event_type, payload, headers, content_type, destination, partition_key, \
    created_at) VALUES ($1, 'payment', $2, $3, $4, convert_to('{}', 'UTF8'), $5::jsonb, $6, $7, \
    $8, coalesce($9::timestamptz, now()))";

async fn insert(db: &TestDb, r: &Row) -> Result<(), sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(db.sql(INSERT)))
        .bind(r.event_id)
        .bind(&r.aggregate_id)
        .bind(r.version)
        .bind(r.event_type)
        .bind(r.headers)
        .bind(r.content_type)
        .bind(r.destination)
        .bind(r.partition_key)
        .bind(r.created_at)
        .execute(&db.pool)
        .await
        .map(|_| ())
}

async fn last_error(db: &TestDb, id: Uuid) -> (String, Option<String>, i32) {
    sqlx::query_as(sqlx::AssertSqlSafe(db.sql(
        "SELECT state, last_error, attempts FROM {s}.events WHERE event_id = $1",
    )))
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .expect("the row")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Polling,
    Cdc,
}

#[tokio::test]
async fn rows_no_binding_can_carry_are_dead_lettered_once_and_the_rest_is_published() {
    rows_no_binding_can_carry(Mode::Polling).await;
}

#[tokio::test]
async fn cdc_rows_no_binding_can_carry_are_dead_lettered_once_and_the_rest_is_published() {
    rows_no_binding_can_carry(Mode::Cdc).await;
}

async fn rows_no_binding_can_carry(mode: Mode) {
    let db = TestDb::new().await;
    let broker = BrokerEnv::new(Kind::Nats).await;
    let sub = broker.subscriber().await;
    let _cleanup = SlotCleanup(db.name().to_owned());
    let config = config_file(
        if mode == Mode::Cdc {
            "mode = \"cdc\"\ncdc_heartbeat_secs = 1"
        } else {
            ""
        },
        &broker.toml(""),
    );

    // With the constraint, each insert fails in the producer's own transaction, with the reason.
    for bad in refused_rows() {
        let e = insert(&db, &bad)
            .await
            .expect_err("the table refuses a row the relay cannot publish");
        let message = e.to_string();
        assert!(
            message.contains("cannot be published") && message.contains(bad.refused_for.unwrap()),
            "{}: {message}",
            bad.aggregate_id
        );
    }
    assert_eq!(db.count("true").await, 0, "nothing was written");

    // A table older than the constraint accepted them.
    db.exec("ALTER TABLE {s}.events DROP CONSTRAINT events_publishable")
        .await;
    let mut bad = refused_rows();
    bad.extend(accepted_unpublishable_rows());
    let mut good = Vec::new();
    for b in &bad {
        good.push(row(&b.aggregate_id, 1));
    }
    for a in 0..20 {
        good.push(row(&format!("ok-{a}"), 1));
        good.push(row(&format!("ok-{a}"), 2));
    }
    let behind: Vec<Row> = bad.iter().map(|b| row(&b.aggregate_id, 3)).collect();
    let insert_all = async || {
        for r in good.iter().chain(&bad).chain(&behind) {
            insert(&db, r)
                .await
                .expect("accepted without the constraint");
        }
    };
    let mut relay = match mode {
        Mode::Polling => {
            insert_all().await;
            // `outbox migrate` says which pending rows break the rules, before any relay runs.
            let migrate = cli(&db, &config, &["migrate"]).await;
            assert!(migrate.status.success(), "{migrate:?}");
            let refused = refused_rows().len();
            assert!(
                migrate.stderr.contains(&format!(
                    "warning: {refused} pending row(s) of {}.events break the table's rules",
                    db.name()
                )) && migrate.stderr.contains("`traceparent` is null")
                    && migrate
                        .stderr
                        .contains(&format!("and {} more", refused - 10)),
                "{}",
                migrate.stderr
            );
            ChildGuard::spawn(relay_cmd(&db, &broker, &config, false), "relay")
        }
        Mode::Cdc => {
            // The rows reach the relay through the stream: written while it streams its slot.
            let migrate = cli(&db, &config, &["migrate"]).await;
            assert!(migrate.status.success(), "{migrate:?}");
            let relay = ChildGuard::spawn(relay_cmd(&db, &broker, &config, true), "cdc-relay");
            wait_slot_streamed(&db).await;
            insert_all().await;
            relay
        }
    };
    let good_ids: Vec<Uuid> = good.iter().map(|r| r.event_id).collect();
    let seen = sub.wait_ids(&good_ids, Duration::from_secs(30)).await;
    let first = assert_first_appearances_in_order(seen);
    wait_until(
        Duration::from_secs(20),
        "every refused row dead-lettered",
        || {
            let db = &db;
            let n = bad.len() as i64;
            async move { db.count("state = 'dead'").await == n }
        },
    )
    .await;
    for b in &bad {
        let (state, error, attempts) = last_error(&db, b.event_id).await;
        let error = error.unwrap_or_default();
        assert_eq!(state, "dead", "{}", b.aggregate_id);
        assert!(
            error.contains("cannot be published as stored")
                && error.contains(b.refused_for.unwrap()),
            "{}: {error}",
            b.aggregate_id
        );
        assert_eq!(attempts, 1, "dead-lettered at once, not retried");
        assert!(!first.contains(&b.event_id), "{} went out", b.aggregate_id);
    }
    // The versions behind each one wait, untouched, and nothing is retried while the relay runs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for r in &behind {
        let (state, _, attempts) = last_error(&db, r.event_id).await;
        assert_eq!(
            (state.as_str(), attempts),
            ("pending", 0),
            "{}",
            r.aggregate_id
        );
        assert!(!sub.snapshot().iter().any(|s| s.event_id == r.event_id));
    }
    assert_eq!(
        db.count("state = 'dead'").await,
        bad.len() as i64,
        "no other row was dead-lettered"
    );
    let attempts = db.scalar("SELECT sum(attempts) FROM {s}.events").await;
    assert_eq!(
        attempts,
        bad.len() as i64,
        "one attempt per refused row, no retries"
    );
    relay.assert_running();
    if mode == Mode::Cdc {
        // Nothing is retried from the log either: every transaction is settled and the slot
        // confirmed past the last insert.
        let end: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        let confirmed = format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}' \
             AND confirmed_flush_lsn >= '{end}'::pg_lsn",
            db.name()
        );
        wait_until(
            Duration::from_secs(20),
            "the slot confirmed to the end",
            || {
                let (db, confirmed) = (&db, &confirmed);
                async move { db.scalar(confirmed).await == 1 }
            },
        )
        .await;
    }

    // Back under the constraint: a requeue of a row still wrong fails with the reason and
    // requeues nothing; corrected, it is published with the version behind it, in order.
    db.exec(
        "ALTER TABLE {s}.events ADD CONSTRAINT events_publishable CHECK (CASE WHEN state = \
         'pending' THEN {s}.event_row_publishable(aggregate_type, aggregate_id, event_type, \
         headers, content_type, destination, partition_key) ELSE true END) NOT VALID",
    )
    .await;
    let null = &bad[0];
    let mut requeue = outbox(Some(db.name()), None, Some(config.path()));
    requeue.args(["dead-letters", "requeue", &null.event_id.to_string()]);
    let refused = run(requeue, Duration::from_secs(30)).await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        refused.stderr.contains("`traceparent` is null"),
        "{}",
        refused.stderr
    );
    assert_eq!(last_error(&db, null.event_id).await.0, "dead");
    sqlx::query(sqlx::AssertSqlSafe(
        db.sql("UPDATE {s}.events SET headers = '{}' WHERE event_id = $1"),
    ))
    .bind(null.event_id)
    .execute(&db.pool)
    .await
    .unwrap();
    let mut requeue = outbox(Some(db.name()), None, Some(config.path()));
    requeue.args(["dead-letters", "requeue", &null.event_id.to_string()]);
    let requeued = run(requeue, Duration::from_secs(30)).await;
    assert!(requeued.status.success(), "{requeued:?}");
    // In either mode the running relay delivers it (the CDC relay through the catch-up the
    // requeue's wake-up starts), with the version behind it, in order.
    let ids = [good[0].event_id, null.event_id, behind[0].event_id];
    let seen = sub.wait_ids(&ids, Duration::from_secs(30)).await;
    assert_first_appearances_in_order(seen);

    db.drop().await;
    broker.cleanup().await;
}
