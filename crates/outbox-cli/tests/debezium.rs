//! The Debezium-compatible mode end to end (issue 10, acceptance 4). Producers written for
//! Debezium's outbox insert rows of its documented layout (and delete them again in the same
//! transaction, as Debezium's own examples do); `outbox debezium apply` bridges the table;
//! `outbox relay` with `[kafka] format = "debezium"` publishes records that must equal what
//! Debezium's Outbox Event Router emits for those rows with its defaults.
//!
//! The fixture's expectations are the router's documented behaviour (docs/debezium-router.md
//! names the source of each): topic `outbox.event.<aggregatetype>` with the value's case kept
//! (Debezium's `OutboxEventRouterIT` expects `outbox.event.User`), key = `aggregateid`, one
//! header `id` = the event id, value = the payload column as PostgreSQL gives its text (jsonb
//! normalises spacing and key order), a NULL payload a null value, the record timestamp from
//! `table.field.event.timestamp` read as UTC (the IT's `2019-03-24 20:52:59` is
//! 1553460779000 ms). Updates and rolled-back inserts publish nothing.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;
use outbox_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
use outbox_kafka::rdkafka::message::{Headers as _, Message as _};
use outbox_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

/// A record as read from the topic, every part kept as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    topic: String,
    partition: i32,
    key: Option<Vec<u8>>,
    headers: Vec<(String, Option<Vec<u8>>)>,
    value: Option<Vec<u8>>,
    timestamp: Option<i64>,
}

/// Every record of `topic` (of `partitions` partitions) from its start, read until `n` came
/// and then one more quiet second (a record too many would show).
async fn read_topic(topic: &str, partitions: i32, n: usize) -> Vec<Record> {
    let consumer: BaseConsumer = kafka_client()
        .set("group.id", format!("debezium-reader-{}", uid()))
        .set("enable.auto.commit", "false")
        .create()
        .expect("Kafka reader");
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition");
    }
    consumer.assign(&list).expect("assign");
    tokio::task::spawn_blocking(move || {
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut quiet_since = None;
        while std::time::Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    quiet_since = None;
                    got.push(Record {
                        topic: m.topic().to_owned(),
                        partition: m.partition(),
                        key: m.key().map(<[u8]>::to_vec),
                        headers: m
                            .headers()
                            .map(|h| {
                                h.iter()
                                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                                    .collect()
                            })
                            .unwrap_or_default(),
                        value: m.payload().map(<[u8]>::to_vec),
                        timestamp: m.timestamp().to_millis(),
                    });
                }
                Some(Err(e)) => eprintln!("Kafka reader: {e}"),
                None if got.len() >= n => {
                    let since = *quiet_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > Duration::from_secs(1) {
                        break;
                    }
                }
                None => {}
            }
        }
        got
    })
    .await
    .expect("reader task")
}

const PARTITIONS: i32 = 4;

/// `outbox <args>` on the test's schema, with `config` when given, to completion.
async fn cli(db: &TestDb, config: Option<&TempFile>, args: &[&str]) -> Run {
    let mut cmd = outbox(Some(db.name()), None, config.map(TempFile::path));
    cmd.args(args);
    run(cmd, Duration::from_secs(30)).await
}

/// The router's documented table (`id`, `aggregatetype`, `aggregateid`, `type`, `payload`)
/// with the Quarkus extension's optional `timestamp` and `tracingspancontext`.
const DEBEZIUM_TABLE: &str = "CREATE TABLE {s}.outbox (
    id                 uuid                   NOT NULL,
    aggregatetype      character varying(255) NOT NULL,
    aggregateid        character varying(255) NOT NULL,
    type               character varying(255) NOT NULL,
    payload            jsonb,
    timestamp          timestamp,
    tracingspancontext character varying(256)
)";

fn config(db: &TestDb, extra_debezium: &str) -> TempFile {
    TempFile::new(
        ".toml",
        &format!(
            "[debezium]\ntable = \"{}.outbox\"\n\"table.field.event.timestamp\" = \"timestamp\"\n{extra_debezium}\n\n\
             [kafka]\nformat = \"debezium\"\ntopic_partitions = {PARTITIONS}\ndelivery_timeout_secs = 2\nconnect_timeout_secs = 3\n\n\
             [relay]\npoll_interval_ms = 50\nlease_secs = 8\npublish_timeout_secs = 2.5\n",
            db.name()
        ),
    )
}

/// Runs `outbox relay` with `cfg` on Kafka (as the child `name`) until the bridged events
/// drained from the table, checks that it still runs, and returns the `n` records of `topic`
/// read then.
async fn relay_and_read(
    db: &TestDb,
    cfg: &TempFile,
    name: &str,
    topic: &str,
    n: usize,
) -> Vec<Record> {
    let mut c = outbox(Some(db.name()), Some(&kafka_url()), Some(cfg.path()));
    c.arg("relay");
    let mut relay = ChildGuard::spawn(c, name);
    wait_until(
        Duration::from_secs(30),
        "the bridged events to drain",
        || async { db.count("true").await == 0 },
    )
    .await;
    relay.assert_running();
    read_topic(topic, PARTITIONS, n).await
}

/// A row of the router's table: the SQL literals of its `id`, `aggregatetype`, `aggregateid`,
/// `type` and `payload`, by column.
fn row(values: [&str; 5]) -> Vec<(&str, &str)> {
    ["id", "aggregatetype", "aggregateid", "type", "payload"]
        .into_iter()
        .zip(values)
        .collect()
}

/// Inserts a row as a Debezium producer does: insert, then delete, in one transaction.
async fn produce(db: &TestDb, row: &[(&str, &str)], delete_after: bool) {
    let mut tx = db.pool.begin().await.unwrap();
    let columns: Vec<&str> = row.iter().map(|(c, _)| *c).collect();
    let values: Vec<&str> = row.iter().map(|(_, v)| *v).collect();
    let sql = db.sql(&format!(
        "INSERT INTO {{s}}.outbox ({}) VALUES ({})",
        columns.join(", "),
        values.join(", ")
    ));
    sqlx::query(AssertSqlSafe(sql))
        .execute(&mut *tx)
        .await
        .unwrap_or_else(|e| panic!("producer insert {row:?}: {e}"));
    if delete_after {
        sqlx::query(AssertSqlSafe(db.sql("DELETE FROM {s}.outbox")))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn a_debezium_layout_table_drains_as_the_routers_defaults_emit_it() {
    let db = TestDb::new().await;
    db.exec(DEBEZIUM_TABLE).await;
    let cfg = config(&db, "");

    let sql = cli(&db, Some(&cfg), &["debezium", "sql"]).await;
    assert!(sql.status.success(), "{sql:?}");
    assert!(
        sql.stdout.contains("CREATE TRIGGER") && sql.stdout.contains("AFTER INSERT"),
        "{}",
        sql.stdout
    );
    let apply = cli(&db, Some(&cfg), &["debezium", "apply"]).await;
    assert!(apply.status.success(), "{apply:?}");

    // Case kept in the topic, and a name unique to this run.
    let aggregate_type = format!("User{}", uid());
    let topic = format!("outbox.event.{aggregate_type}");
    let at = format!("'{aggregate_type}'");
    let (u1, u2, u3, u4, rolled_back) = (
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
        Uuid::now_v7(),
    );
    let q = |u: &Uuid| format!("'{u}'");
    let (q1, q2, q3, q4) = (q(&u1), q(&u2), q(&u3), q(&u4));
    let ann = r#"'{"id": 1, "name": "Ann"}'"#;
    let mut first = row([&q1, &at, "'10711fa5'", "'UserCreated'", ann]);
    first.push(("timestamp", "'2019-03-24 20:52:59'"));
    produce(&db, &first, true).await;
    // Spacing and key order as the producer wrote them; jsonb normalises both.
    let bob = r#"'{"name":"Bob",   "id":1}'"#;
    let mut second = row([&q2, &at, "'10711fa5'", "'UserUpdated'", bob]);
    second.push((
        "tracingspancontext",
        "E'#Thu Dec 03 2026\\ntraceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\\n'",
    ));
    produce(&db, &second, true).await;
    // Kept in the table (a producer that cleans up on a schedule), then updated: the update
    // publishes nothing.
    produce(
        &db,
        &row([&q3, &at, "'a-2'", "'UserDeleted'", "NULL"]),
        false,
    )
    .await;
    db.exec("UPDATE {s}.outbox SET type = 'Changed'").await;
    {
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query(AssertSqlSafe(db.sql(&format!(
            "INSERT INTO {{s}}.outbox (id, aggregatetype, aggregateid, type, payload) \
             VALUES ('{rolled_back}', {at}, 'a-3', 'Lost', '{{}}')"
        ))))
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.rollback().await.unwrap();
    }
    let cy = r#"'{"name": "Cy", "tags": ["a", "b"]}'"#;
    produce(
        &db,
        &row([&q4, &at, "'10711fa5'", "'UserRenamed'", cy]),
        true,
    )
    .await;
    assert_eq!(db.count("true").await, 4, "four events bridged");
    assert_eq!(
        db.count("aggregate_id = '10711fa5'").await,
        3,
        "one aggregate's three events"
    );

    let records = relay_and_read(&db, &cfg, "debezium-relay", &topic, 4).await;

    let id = |u: &Uuid| vec![("id".to_owned(), Some(u.to_string().into_bytes()))];
    let mut traced = id(&u2);
    traced.push((
        "traceparent".to_owned(),
        Some(b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_vec()),
    ));
    let user = records
        .iter()
        .filter(|r| r.key.as_deref() == Some(b"10711fa5"))
        .cloned()
        .collect::<Vec<_>>();
    assert_eq!(records.len(), 4, "{records:#?}");
    assert!(records.iter().all(|r| r.topic == topic), "{records:#?}");
    assert_eq!(user.len(), 3, "{records:#?}");
    assert!(user.iter().all(|r| r.partition == user[0].partition));
    // In order, each as the router emits it.
    assert_eq!(user[0].headers, id(&u1));
    assert_eq!(
        user[0].value.as_deref(),
        Some(&br#"{"id": 1, "name": "Ann"}"#[..])
    );
    assert_eq!(user[0].timestamp, Some(1_553_460_779_000));
    assert_eq!(user[1].headers, traced);
    assert_eq!(
        user[1].value.as_deref(),
        Some(&br#"{"id": 1, "name": "Bob"}"#[..])
    );
    assert_eq!(user[2].headers, id(&u4));
    assert_eq!(
        user[2].value.as_deref(),
        Some(&br#"{"name": "Cy", "tags": ["a", "b"]}"#[..])
    );
    let deleted = records
        .iter()
        .find(|r| r.key.as_deref() == Some(b"a-2"))
        .expect("the NULL-payload event");
    assert_eq!(deleted.headers, id(&u3));
    assert_eq!(deleted.value, None, "a NULL payload is a null value");
    assert!(
        !records.iter().any(|r| r.key.as_deref() == Some(b"a-3")),
        "a rolled-back insert published"
    );

    // Removing the bridge: inserts are no longer events.
    let remove = cli(&db, Some(&cfg), &["debezium", "remove"]).await;
    assert!(remove.status.success(), "{remove:?}");
    let after = q(&Uuid::now_v7());
    produce(&db, &row([&after, &at, "'a-4'", "'After'", "'{}'"]), false).await;
    assert_eq!(db.count("true").await, 0);
    db.drop().await;
}

#[tokio::test]
async fn bridge_settings_that_do_not_fit_the_table_are_refused_by_name() {
    let db = TestDb::new().await;
    db.exec(DEBEZIUM_TABLE).await;
    for (extra, key, says) in [
        (
            "\"table.field.event.payload\" = \"body\"",
            "table.field.event.payload",
            "no column `body`",
        ),
        (
            "\"table.fields.additional.placement\" = \"type:envelope:eventType\"",
            "table.fields.additional.placement",
            "not supported",
        ),
        (
            "\"route.by.field\" = \"kind\"",
            "route.by.field",
            "no column `kind`",
        ),
    ] {
        let cfg = config(&db, extra);
        let out = cli(&db, Some(&cfg), &["debezium", "apply"]).await;
        assert_eq!(out.status.code(), Some(2), "{extra}: {out:?}");
        assert!(
            out.stderr.contains(key) && out.stderr.contains(says),
            "{extra}: {}",
            out.stderr
        );
    }
    let missing = cli(
        &db,
        None,
        &[
            "debezium",
            "apply",
            "--table",
            "public.no_such_outbox_table",
        ],
    )
    .await;
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert!(
        missing.stderr.contains("does not exist"),
        "{}",
        missing.stderr
    );
    // Nothing was installed by the refusals.
    let id = format!("'{}'", Uuid::now_v7());
    produce(&db, &row([&id, "'X'", "'x'", "'T'", "'{}'"]), false).await;
    assert_eq!(db.count("true").await, 0);
    db.drop().await;
}

/// The reverse direction, as far as it can be checked without Kafka Connect: Debezium's
/// PostgreSQL connector captures base tables through a publication (a view cannot be
/// captured), and the router reads columns by the names docs/debezium-router.md's connector
/// properties give. Those names must be columns of our `events` table of the types the
/// document's mapping relies on.
#[tokio::test]
async fn our_table_is_what_the_documented_debezium_connector_reads() {
    let db = TestDb::new().await;
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/debezium-router.md"
    ))
    .expect("docs/debezium-router.md");
    let property = |name: &str| -> String {
        doc.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("docs/debezium-router.md sets no `{name}`"))
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns \
          WHERE table_schema = $1 AND table_name = 'events'",
    )
    .bind(db.name())
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let type_of = |column: &str| {
        columns
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| panic!("the connector reads `{column}`, which events lacks"))
    };
    for (name, column_type) in [
        ("transforms.outbox.table.field.event.id", "uuid"),
        ("transforms.outbox.table.field.event.key", "text"),
        ("transforms.outbox.table.field.event.payload", "bytea"),
        ("transforms.outbox.route.by.field", "text"),
    ] {
        assert_eq!(type_of(&property(name)), column_type, "{name}");
    }
    for placement in property("transforms.outbox.table.fields.additional.placement").split(',') {
        type_of(placement.split(':').next().unwrap());
    }

    // A publication takes the base table (PostgreSQL only warns when wal_level is not
    // logical yet), and refuses a view.
    let publication = format!("p_{}", db.name());
    db.exec(&format!(
        "CREATE PUBLICATION {publication} FOR TABLE {{s}}.events"
    ))
    .await;
    db.exec(&format!("DROP PUBLICATION {publication}")).await;
    db.exec("CREATE VIEW {s}.events_view AS SELECT * FROM {s}.events")
        .await;
    let view = sqlx::query(AssertSqlSafe(db.sql(&format!(
        "CREATE PUBLICATION {publication} FOR TABLE {{s}}.events_view"
    ))))
    .execute(&db.pool)
    .await;
    assert!(view.is_err(), "a view was accepted into a publication");
    db.drop().await;
}

/// Non-default column names (as a connector's `table.field.event.*` options give them), a text
/// id written in upper case, a text payload, `header` placements (one of them NULL), a NULL
/// type, and the value `JsonConverter` (`schemas.enable=false`) writes: the payload as a JSON
/// string.
#[tokio::test]
async fn custom_columns_placements_and_json_string_values() {
    let db = TestDb::new().await;
    db.exec(
        "CREATE TABLE {s}.invoice_outbox (event_uuid text NOT NULL, kind text NOT NULL, \
         entity text NOT NULL, event_name text, body text, tenant text, region text)",
    )
    .await;
    let cfg = TempFile::new(
        ".toml",
        &format!(
            "[debezium]\ntable = \"{}.invoice_outbox\"\n\"table.field.event.id\" = \"event_uuid\"\n\
             \"route.by.field\" = \"kind\"\n\"table.field.event.key\" = \"entity\"\n\
             \"table.field.event.type\" = \"event_name\"\n\"table.field.event.payload\" = \"body\"\n\
             \"table.fields.additional.placement\" = \"tenant:header:x-tenant, region:header\"\n\n\
             [kafka]\nformat = \"debezium\"\ndebezium_payload = \"json-string\"\n\
             topic_partitions = {PARTITIONS}\ndelivery_timeout_secs = 2\nconnect_timeout_secs = 3\n\n\
             [relay]\npoll_interval_ms = 50\nlease_secs = 8\npublish_timeout_secs = 2.5\n",
            db.name()
        ),
    );
    let apply = cli(&db, Some(&cfg), &["debezium", "apply"]).await;
    assert!(apply.status.success(), "{apply:?}");

    let kind = format!("Invoice{}", uid());
    let (id1, id2) = (Uuid::now_v7(), Uuid::now_v7());
    let insert = |id: &Uuid, name: &str, body: &str, tenant: &str, region: &str| {
        db.sql(&format!(
            "INSERT INTO {{s}}.invoice_outbox VALUES ('{}', '{kind}', 'inv-1', {name}, {body}, \
             {tenant}, {region})",
            id.to_string().to_uppercase()
        ))
    };
    for sql in [
        insert(
            &id1,
            "'InvoiceIssued'",
            r#"'{"total": 5}'"#,
            "'acme'",
            "NULL",
        ),
        insert(&id2, "NULL", r#"'plain "text"'"#, "NULL", "'eu'"),
    ] {
        sqlx::query(AssertSqlSafe(sql))
            .execute(&db.pool)
            .await
            .unwrap();
    }
    assert_eq!(db.count("event_type = 'unknown'").await, 1, "a NULL type");

    let topic = format!("outbox.event.{kind}");
    let records = relay_and_read(&db, &cfg, "debezium-relay-custom", &topic, 2).await;

    assert_eq!(records.len(), 2, "{records:#?}");
    let header = |name: &str, value: &str| (name.to_owned(), Some(value.as_bytes().to_vec()));
    assert_eq!(records[0].key.as_deref(), Some(&b"inv-1"[..]));
    assert_eq!(
        records[0].headers,
        vec![header("id", &id1.to_string()), header("x-tenant", "acme")],
        "a NULL placement sends no header"
    );
    // A text column is sent as written (no jsonb normalisation), as one JSON string.
    assert_eq!(
        records[0].value.as_deref(),
        Some(&br#""{\"total\": 5}""#[..])
    );
    assert_eq!(
        records[1].headers,
        vec![header("id", &id2.to_string()), header("region", "eu")]
    );
    assert_eq!(
        records[1].value.as_deref(),
        Some(&br#""plain \"text\"""#[..])
    );
    db.drop().await;
}
