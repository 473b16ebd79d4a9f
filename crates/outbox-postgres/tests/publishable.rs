//! The row decoder of the polling relay, against the real PostgreSQL:
//!
//! * the table's rule (migration 12, `event_row_problem`), its constraint (a fast test, then the
//!   rule: an actual insert, rolled back) and the relay's own check (`headers_from_json` +
//!   `OutboxMessage::check_publishable_reserving` with the table's `RESERVED_HEADERS`) refuse
//!   exactly the same rows, over generated key
//!   fields, headers, content types and destinations (a property: a row the table lets in is
//!   one the relay publishes, and a row the relay would refuse never gets in);
//! * a claim over rows written before the constraint decodes them one at a time: each row that
//!   cannot be published comes back as an `UndecodableRow` with its key and reason, the others
//!   as messages, and nothing fails the claim.
//!
//! Cases per run: `OUTBOX_FUZZ_CASES` (default 512, `outbox_testkit::fuzz`); the long mode is
//! the same test with a larger number (docs/guide/src/troubleshooting.md, "Fuzzing the
//! decoders").
#![allow(missing_docs)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use outbox_core::{
    ClaimParams, ClaimScope, ContentType, Fingerprint, OutboxMessage, OutboxStore, Payload,
    headers_from_json,
};
use outbox_testkit::fuzz;
use outbox_testkit::fuzz::proptest::prelude::*;
use outbox_testkit::fuzz::proptest::strategy::ValueTree;
use sqlx::AssertSqlSafe;

/// The relay's verdict on a row's publishable columns: `None` when it would publish it.
fn relay_problem(c: &Case) -> Option<String> {
    let headers = match headers_from_json(c.headers.clone()) {
        Ok(h) => h,
        Err(e) => return Some(e),
    };
    let payload = Payload::bytes("application/octet-stream", b"{}".to_vec());
    let message = OutboxMessage {
        id: 1,
        event_id: uuid::Uuid::now_v7(),
        aggregate_type: c.aggregate_type.clone(),
        aggregate_id: c.aggregate_id.clone(),
        aggregate_version: 1,
        event_type: c.event_type.clone(),
        schema_version: 1,
        fingerprint: Fingerprint::of(&payload.bytes),
        payload: Payload {
            content_type: ContentType(c.content_type.clone()),
            ..payload
        },
        headers,
        destination: c.destination.clone(),
        partition_key: c.partition_key.clone(),
        created_at: chrono::Utc::now(),
        attempts: 0,
    };
    message
        .check_publishable_reserving(&[outbox_postgres::RESERVED_HEADERS])
        .err()
        .map(|e| e.to_string())
}

/// Text from an alphabet that covers every class the rules tell apart: token characters,
/// separators, control characters (C0, DEL, C1), non-ASCII, and the reserved prefixes' letters.
fn text(max: usize) -> impl Strategy<Value = String> {
    let chars = prop_oneof![
        8 => prop::sample::select(
            "abcexyzACEX019-_.".chars().collect::<Vec<_>>()
        ),
        2 => prop::sample::select(
            " /;:=\"'\\*+!#$%&^`|~,()[]{}@?".chars().collect::<Vec<_>>()
        ),
        1 => prop::sample::select(
            vec!['\t', '\n', '\r', '\u{1}', '\u{1f}', '\u{7f}', '\u{85}', '\u{9f}']
        ),
        1 => prop::sample::select(vec!['é', 'ß', '€', '\u{a0}', '\u{2028}', '😀']),
    ];
    prop::collection::vec(chars, 0..max).prop_map(|v| v.into_iter().collect())
}

/// A header name: mostly plausible, with the reserved prefixes and over-long names.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => text(12),
        1 => prop::sample::select(vec![
            "ce-id", "CE_type", "cloudEvents_x", "nats-msg-id", "Content-Type", "ce", "cex",
            "traceparent", "x.y_z-1",
        ])
        .prop_map(str::to_owned),
        1 => (120usize..136).prop_map(|n| "a".repeat(n)),
    ]
}

/// A header value: a string mostly, sometimes another JSON type.
fn value() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        8 => text(16).prop_map(serde_json::Value::String),
        1 => Just(serde_json::Value::Null),
        1 => any::<i32>().prop_map(|n| serde_json::json!(n)),
        1 => any::<bool>().prop_map(serde_json::Value::Bool),
        1 => Just(serde_json::json!(["a"])),
        1 => Just(serde_json::json!({"a": "b"})),
    ]
}

fn content_type() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => prop::sample::select(vec![
            "application/json", "application/json; charset=utf-8", " text/plain ",
            "application/vnd.a+json;v=1", "a/b;", "application/", "/json", "applicationjson",
            "a/b/c", "", "a b/c",
        ])
        .prop_map(str::to_owned),
        1 => text(20),
        1 => (250usize..260).prop_map(|n| format!("a/{}", "b".repeat(n))),
    ]
}

fn optional_key() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        4 => Just(None),
        1 => Just(Some(String::new())),
        2 => text(8).prop_map(Some),
        1 => (254usize..258).prop_map(|n| Some("k".repeat(n))),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    headers: serde_json::Value,
    content_type: String,
    destination: Option<String>,
    partition_key: Option<String>,
}

/// Half the cases from the hostile alphabets above, half close to what producers write (with
/// one field at a time turned hostile now and then), so both verdicts are reached often.
fn case() -> impl Strategy<Value = Case> {
    let hostile = (
        prop::collection::btree_map(name(), value(), 0..4),
        content_type(),
        optional_key(),
        optional_key(),
    );
    let token = "[A-Za-z0-9._-]{1,20}";
    let plain = (
        prop::collection::btree_map(
            prop_oneof![4 => token.prop_map(|s| s), 1 => name()],
            prop_oneof![4 => "[ -~é]{0,20}".prop_map(serde_json::Value::String), 1 => value()],
            0..3,
        ),
        prop_oneof![4 => Just("application/json".to_owned()), 1 => content_type()],
        prop_oneof![4 => Just(None), 1 => optional_key()],
        prop_oneof![4 => Just(None), 1 => optional_key()],
    );
    // The key fields: 1..255 characters as the table's own checks hold them, now and then
    // with a control character.
    let field = || prop_oneof![8 => "[a-z0-9.:-]{1,12}".prop_map(|s| s), 1 => text(12)];
    (prop_oneof![hostile, plain], (field(), field(), field()))
        .prop_filter("the table's length checks", |(_, (t, i, e))| {
            [t, i, e]
                .iter()
                .all(|v| (1..=255).contains(&v.chars().count()))
        })
        .prop_map(
            |(
                (headers, content_type, destination, partition_key),
                (aggregate_type, aggregate_id, event_type),
            )| Case {
                aggregate_type,
                aggregate_id,
                event_type,
                headers: serde_json::Value::Object(headers.into_iter().collect()),
                content_type,
                destination,
                partition_key,
            },
        )
}

/// `$query` with the columns of the case `$c` bound next, in the order both statements of the
/// test take them: aggregate type, aggregate id, event type, headers, content type,
/// destination, partition key.
macro_rules! bind_case {
    ($query:expr, $c:expr) => {
        $query
            .bind(&$c.aggregate_type)
            .bind(&$c.aggregate_id)
            .bind(&$c.event_type)
            .bind(&$c.headers)
            .bind(&$c.content_type)
            .bind($c.destination.as_deref())
            .bind($c.partition_key.as_deref())
    };
}

#[tokio::test]
async fn the_table_and_the_relay_refuse_the_same_rows() {
    let db = TestDb::new().await;
    let problem_sql = format!(
        "SELECT \"{}\".event_row_problem($1, $2, $3, $4::jsonb, $5, $6, $7)",
        db.schema
    );
    let insert_sql = format!(
        "INSERT INTO \"{}\".events (event_id, aggregate_type, aggregate_id, aggregate_version, \
         event_type, payload, headers, content_type, destination, partition_key) VALUES ($1, \
         $2, $3, 1, $4, '\\x7b7d', $5::jsonb, $6, $7, $8)",
        db.schema
    );
    // Generated up front (the runner is synchronous), checked against the server one by one.
    let mut runner = fuzz::runner();
    let strategy = case();
    let cases: Vec<Case> = (0..fuzz::cases())
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    let (mut accepted, mut refused) = (0, 0);
    for c in &cases {
        let relay = relay_problem(c);
        let table: Option<String> =
            bind_case!(sqlx::query_scalar(AssertSqlSafe(problem_sql.clone())), c)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        assert_eq!(
            relay.is_some(),
            table.is_some(),
            "the relay says {relay:?}, the table says {table:?}, for {c:?}"
        );
        // And the constraint itself (its fast test, then the rule): an insert of the row, rolled
        // back, succeeds exactly when the rule finds nothing, and fails with the rule's reason.
        let mut tx = db.pool.begin().await.unwrap();
        let inserted = bind_case!(
            sqlx::query(AssertSqlSafe(insert_sql.clone())).bind(uuid::Uuid::now_v7()),
            c
        )
        .execute(&mut *tx)
        .await;
        drop(tx);
        match (&table, inserted) {
            (None, Ok(_)) => {}
            (Some(problem), Err(e)) => assert!(
                e.to_string().contains(problem.as_str()),
                "refused with {e}, the rule says {problem}, for {c:?}"
            ),
            (table, inserted) => panic!(
                "the constraint {} what the rule says {table:?} of, for {c:?}",
                if inserted.is_ok() {
                    "accepted"
                } else {
                    "refused"
                }
            ),
        }
        if relay.is_some() {
            refused += 1;
        } else {
            accepted += 1;
        }
    }
    // The generator reaches both sides, or the property says nothing.
    assert!(
        accepted * 10 >= cases.len() && refused * 10 >= cases.len(),
        "accepted {accepted}, refused {refused} of {}",
        cases.len()
    );
    db.drop().await;
}

#[tokio::test]
async fn a_claim_reads_each_row_on_its_own_and_reports_the_unpublishable_ones() {
    let db = TestDb::new().await;
    db.exec(format!(
        "ALTER TABLE \"{}\".events DROP CONSTRAINT events_publishable",
        db.schema
    ))
    .await;
    let insert = format!(
        "INSERT INTO \"{}\".events (event_id, aggregate_type, aggregate_id, aggregate_version, \
         event_type, payload, headers, content_type) VALUES ($1, 'payment', $2, $3, 'E', \
         '\\x7b7d', $4::jsonb, $5)",
        db.schema
    );
    let rows: [(&str, i64, &str, &str); 5] = [
        ("a", 1, r#"{"t": "x"}"#, "application/json"),
        ("a", 2, r#"{"t": null}"#, "application/json"),
        ("a", 3, "{}", "application/json"),
        ("b", 1, r#"{"n": 1.5}"#, "application/json"),
        ("c", 1, "{}", "text/plain\u{1b}"),
    ];
    let mut ids = BTreeMap::new();
    for (agg, version, headers, content_type) in rows {
        let id = uuid::Uuid::now_v7();
        ids.insert((agg, version), id);
        sqlx::query(AssertSqlSafe(insert.clone()))
            .bind(id)
            .bind(agg)
            .bind(version)
            .bind(headers)
            .bind(content_type)
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let batch = db
        .store()
        .claim_batch(ClaimParams {
            max_rows: 100,
            max_per_aggregate: 100,
            lease: Duration::from_secs(30),
            scope: ClaimScope::All,
        })
        .await
        .expect("one bad row never fails a claim");
    let messages: Vec<(String, i64)> = batch
        .messages
        .iter()
        .map(|m| (m.aggregate_id.clone(), m.aggregate_version))
        .collect();
    assert_eq!(
        messages,
        [("a".to_owned(), 1), ("a".to_owned(), 3)],
        "{batch:?}"
    );
    let bad: Vec<(String, i64, Option<uuid::Uuid>)> = batch
        .undecodable
        .iter()
        .map(|u| (u.aggregate_id.clone(), u.aggregate_version, u.event_id))
        .collect();
    assert_eq!(
        bad,
        [
            ("a".to_owned(), 2, Some(ids[&("a", 2)])),
            ("b".to_owned(), 1, Some(ids[&("b", 1)])),
            ("c".to_owned(), 1, Some(ids[&("c", 1)])),
        ]
    );
    assert!(
        batch.undecodable[0].reason.contains("`t` is null"),
        "{:?}",
        batch.undecodable[0]
    );
    assert!(batch.undecodable[1].reason.contains("`n` is a number"));
    assert!(batch.undecodable[2].reason.contains("content type"));
    db.drop().await;
}
