//! The Debezium bridge's row mapping over generated rows, against the real PostgreSQL: a row
//! the bridge's trigger lets into the outbox is one the relay publishes, with the fields the
//! mapping (the `debezium` module's table) gives it; a row it cannot map fails the producer's
//! insert, in the producer's transaction, and leaves nothing behind.
//!
//! Rows come from hostile alphabets (control characters, non-ASCII, over-long text, NULLs, ids
//! that are not UUIDs, payloads that are not JSON, span contexts with and without a
//! `traceparent` line). Cases: `OUTBOX_FUZZ_CASES` (default 512); the long mode is the same
//! test with a large number (docs/guide/src/troubleshooting.md, "Fuzzing the decoders").
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;
use outbox_core::{ClaimParams, ClaimScope, OutboxStore};
use outbox_postgres::debezium::{DebeziumTable, install};
use outbox_testkit::fuzz::proptest::prelude::*;
use outbox_testkit::fuzz::proptest::strategy::ValueTree;
use outbox_testkit::fuzz::{self, hostile_text};
use sqlx::AssertSqlSafe;

#[derive(Debug, Clone)]
struct DebeziumRow {
    id: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    event_type: Option<String>,
    payload: Option<String>,
    span_context: Option<String>,
    tenant: Option<String>,
}

fn text_or_null(valid: &'static str) -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        6 => Just(Some(valid.to_owned())),
        1 => Just(None),
        1 => Just(Some(String::new())),
        3 => hostile_text(12).prop_map(Some),
        1 => (250usize..260).prop_map(|n| Some("x".repeat(n))),
    ]
}

fn row() -> impl Strategy<Value = DebeziumRow> {
    (
        prop_oneof![
            6 => any::<u128>().prop_map(|n| Some(uuid::Uuid::from_u128(n).to_string())),
            1 => any::<u128>().prop_map(|n| Some(uuid::Uuid::from_u128(n).simple().to_string().to_uppercase())),
            1 => Just(None),
            2 => hostile_text(12).prop_map(Some),
        ],
        text_or_null("payment"),
        text_or_null("pay-1"),
        text_or_null("PaymentCreated"),
        prop_oneof![
            4 => Just(Some(r#"{"amount": 100}"#.to_owned())),
            1 => Just(None),
            2 => hostile_text(16).prop_map(Some),
        ],
        prop_oneof![
            3 => Just(None),
            2 => Just(Some(
                "#Wed Dec 06\ntraceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n"
                    .to_owned()
            )),
            2 => hostile_text(24).prop_map(|t| Some(format!("traceparent={t}"))),
            1 => hostile_text(24).prop_map(Some),
        ],
        text_or_null("acme"),
    )
        .prop_map(
            |(id, aggregate_type, aggregate_id, event_type, payload, span_context, tenant)| {
                DebeziumRow {
                    id,
                    aggregate_type,
                    aggregate_id,
                    event_type,
                    payload,
                    span_context,
                    tenant,
                }
            },
        )
}

#[tokio::test]
async fn a_row_the_bridge_lets_in_is_a_row_the_relay_publishes_as_mapped() {
    let db = TestDb::new().await;
    let table = format!("\"{}\".debezium_outbox", db.schema);
    db.exec(format!(
        "CREATE TABLE {table} (id text, aggregatetype text, aggregateid text, type text, \
         payload text, tracingspancontext text, tenant text)"
    ))
    .await;
    let mut config = DebeziumTable::new(table.clone());
    config.additional_placement = Some("tenant:header:x-tenant".to_owned());
    install(&db.pool, &db.schema, &config)
        .await
        .expect("the bridge installs");
    let store = db.store();
    let insert = format!(
        "INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload, \
         tracingspancontext, tenant) VALUES ($1, $2, $3, $4, $5, $6, $7)"
    );

    let mut runner = fuzz::runner();
    let strategy = row();
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..fuzz::cases() {
        let r = strategy.new_tree(&mut runner).unwrap().current();
        let inserted = sqlx::query(AssertSqlSafe(insert.clone()))
            .bind(&r.id)
            .bind(&r.aggregate_type)
            .bind(&r.aggregate_id)
            .bind(&r.event_type)
            .bind(&r.payload)
            .bind(&r.span_context)
            .bind(&r.tenant)
            .execute(&db.pool)
            .await;
        if let Err(e) = inserted {
            refused += 1;
            // A refusal is a database error of the producer's insert (a NOT NULL, a duplicate
            // id, the outbox's rules, a cast to uuid, text that cannot hold a NUL), never a lost
            // connection or a crash of the server.
            let sqlx::Error::Database(d) = &e else {
                panic!("{r:?}: {e}")
            };
            let code = d.code().unwrap_or_default().into_owned();
            assert!(
                ["23502", "23505", "23514", "22P02", "22021"].contains(&code.as_str()),
                "{r:?}: unexpected refusal {code}: {e}"
            );
            assert_eq!(db.count("true").await, 0, "{r:?}: a refused insert wrote");
            continue;
        }
        accepted += 1;
        let batch = store
            .claim_batch(ClaimParams {
                max_rows: 10,
                max_per_aggregate: 10,
                lease: Duration::from_secs(30),
                scope: ClaimScope::All,
            })
            .await
            .expect("a claim");
        assert!(
            batch.undecodable.is_empty(),
            "{r:?}: the bridge let in a row the relay cannot publish: {:?}",
            batch.undecodable
        );
        assert_eq!(batch.messages.len(), 1, "{r:?}");
        let m = &batch.messages[0];
        let id = r.id.as_deref().expect("an accepted row has an id");
        assert_eq!(
            m.event_id,
            uuid::Uuid::parse_str(id).expect("an accepted id is a UUID"),
            "{r:?}"
        );
        assert_eq!(Some(&m.aggregate_type), r.aggregate_type.as_ref(), "{r:?}");
        assert_eq!(Some(&m.aggregate_id), r.aggregate_id.as_ref(), "{r:?}");
        let expected_type = match r.event_type.as_deref() {
            None | Some("") => "unknown",
            Some(t) => t,
        };
        assert_eq!(m.event_type, expected_type, "{r:?}");
        assert_eq!(
            m.payload.bytes.as_ref(),
            r.payload.as_deref().unwrap_or("").as_bytes(),
            "{r:?}"
        );
        assert_eq!(
            m.headers.get("x-tenant"),
            r.tenant.as_ref(),
            "{r:?}: {:?}",
            m.headers
        );
        m.check_publishable_reserving(&[outbox_postgres::RESERVED_HEADERS])
            .unwrap_or_else(|e| panic!("{r:?}: {e}"));
        db.exec(format!("DELETE FROM \"{}\".events", db.schema))
            .await;
        db.exec(format!("DELETE FROM \"{}\".leases", db.schema))
            .await;
    }
    assert!(
        accepted * 10 >= fuzz::cases() && refused * 10 >= fuzz::cases(),
        "accepted {accepted}, refused {refused}"
    );
    db.drop().await;
}
