//! The console's API over real HTTP against a real PostgreSQL: the numbers it shows are the
//! database's, actions need the token, and the guards refuse what they must.
#![allow(missing_docs)]

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use outbox_console::{ConsoleConfig, ConsoleError, check_bind, router};
use outbox_core::operator::Counting;
use outbox_core::operator::prelude::*;
use outbox_core::{NewMessage, Payload};
use outbox_postgres::{PgOutbox, PgStore, PgStoreConfig};
use outbox_testkit::pg::TestDb;
use serde_json::Value;
use sqlx::AssertSqlSafe;
use tokio_util::sync::CancellationToken;

/// The console token of the tests, as a literal (for [`TOKEN`] and [`AUTH`]).
macro_rules! token {
    () => {
        "a-console-token-for-tests"
    };
}
const TOKEN: &str = token!();
/// The `authorization` header carrying [`TOKEN`].
const AUTH: (&str, &str) = ("authorization", concat!("Bearer ", token!()));

/// A fresh schema with `pending` pending events and `dead` dead letters (each its own
/// aggregate, with one event waiting behind the first dead letter).
async fn seeded(pending: usize, dead: usize) -> TestDb {
    let db = TestDb::new().await;
    let mut tx = db.pool.begin().await.unwrap();
    for i in 0..pending + dead {
        let m = NewMessage::new(
            "order",
            format!("o-{i}"),
            1,
            "OrderPlaced",
            Payload::json(&serde_json::json!({ "i": i })).unwrap(),
        );
        db.outbox.enqueue(&mut *tx, &m).await.unwrap();
    }
    // The event behind the first dead letter.
    let m = NewMessage::new(
        "order",
        format!("o-{pending}"),
        2,
        "OrderShipped",
        Payload::json(&serde_json::json!({})).unwrap(),
    );
    if dead > 0 {
        db.outbox.enqueue(&mut *tx, &m).await.unwrap();
    }
    tx.commit().await.unwrap();
    if dead > 0 {
        db.exec(format!(
            "UPDATE {{s}}.events SET state = 'dead', attempts = 3, \
             last_error = 'broker refused: message too large <b>x</b>' \
             WHERE aggregate_version = 1 AND aggregate_id IN ({})",
            (pending..pending + dead)
                .map(|i| format!("'o-{i}'"))
                .collect::<Vec<_>>()
                .join(",")
        ))
        .await;
    }
    db
}

/// A console served on a free loopback port until the returned token is cancelled.
async fn serve(admin: PgStore, config: ConsoleConfig) -> (SocketAddr, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        outbox_console::serve(listener, admin, config, async move { s.cancelled().await })
            .await
            .expect("console server");
    });
    (addr, stop)
}

/// A fresh [`seeded`] schema with `pending` pending events and `dead` dead letters, and a console with
/// the token serving it (see [`serve`]).
async fn db_and_console(pending: usize, dead: usize) -> (TestDb, SocketAddr, CancellationToken) {
    let db = seeded(pending, dead).await;
    let (addr, stop) = serve(db.store(), with_token()).await;
    (db, addr, stop)
}

/// Stops the console `stop` belongs to, then drops `db`'s schema.
async fn stop_and_drop(stop: CancellationToken, db: TestDb) {
    stop.cancel();
    db.drop().await;
}

/// One request; returns the status and the body (JSON when it parses, else a string).
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or("").to_owned())))
        .unwrap();
    let resp = client.request(req).await.expect("request");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, value)
}

/// `GET path` without credentials.
async fn get(addr: SocketAddr, path: &str) -> (u16, Value) {
    call(addr, "GET", path, &[], None).await
}

/// `POST path` of the JSON `body` with `headers`.
async fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, Value) {
    call(addr, "POST", path, headers, Some(body)).await
}

/// Serves `app` on a free loopback port until the returned task is aborted.
async fn serve_app(app: axum::Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (
        addr,
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() }),
    )
}

/// The string fields `fields` of each element of the JSON array `list`, one row per element.
fn strings<'a>(list: &'a Value, fields: &[&str]) -> Vec<Vec<&'a str>> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|e| fields.iter().map(|f| e[*f].as_str().unwrap()).collect())
        .collect()
}

fn with_token() -> ConsoleConfig {
    ConsoleConfig {
        token: Some(TOKEN.to_owned()),
        ..ConsoleConfig::default()
    }
}

#[tokio::test]
async fn the_overview_and_the_dead_letters_are_the_databases_numbers() {
    let db = seeded(5, 3).await;
    // One pending row failed twice; one pending aggregate under a live lease.
    let sch = db.schema.as_str();
    for sql in [
        format!("UPDATE {sch}.events SET attempts = 2 WHERE aggregate_id = 'o-0'"),
        format!(
            "INSERT INTO {sch}.leases (aggregate_type, aggregate_id, token, lease_until) \
             VALUES ('order', 'o-1', 1, now() + interval '1 hour')"
        ),
    ] {
        db.exec(&sql).await;
    }
    let (addr, stop) = serve(db.store(), with_token()).await;

    let (status, o) = get(addr, "/api/v1/overview").await;
    assert_eq!(status, 200, "{o}");
    assert_eq!(o["schema"], db.schema.as_str());
    assert_eq!(o["pending"], db.count("state = 'pending'").await);
    assert_eq!(o["pending"], 6, "5 pending + 1 behind a dead letter");
    assert_eq!(o["dead_letters"], db.count("state = 'dead'").await);
    assert_eq!(o["dead_letters"], 3);
    assert!(o["oldest_pending_age_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(o["work_items"]["unknown"], 0);
    assert_eq!(
        (&o["retrying"], &o["in_flight"]),
        (&1.into(), &1.into()),
        "{o}"
    );
    // The CLI's JSON is the same object (one admin module), but for the age, which moved on.
    let mut cli = serde_json::to_value(db.store().overview().await.unwrap()).unwrap();
    assert_eq!(o["counted_up_to"], outbox_console::OVERVIEW_COUNT_BOUND);
    assert_eq!(cli["counted_up_to"], Value::Null);
    let (status, e) = get(addr, "/api/v1/overview?exact=true").await;
    assert_eq!(status, 401, "an exact count needs the token: {e}");
    let (status, mut exact) = call(addr, "GET", "/api/v1/overview?exact=true", &[AUTH], None).await;
    assert_eq!(status, 200, "{exact}");
    let mut o = o;
    for v in [&mut o, &mut cli, &mut exact] {
        v["oldest_pending_age_seconds"] = Value::Null;
    }
    assert_eq!(exact, cli);
    o["counted_up_to"] = Value::Null;
    assert_eq!(
        o, cli,
        "below the bound, the bounded counts are the exact ones"
    );

    // A bound below the counts: each stops there.
    let bounded = db
        .store()
        .overview_counting(Counting::UpTo(2))
        .await
        .unwrap();
    assert_eq!(
        (bounded.pending, bounded.dead_letters, bounded.counted_up_to),
        (2, 2, Some(2))
    );
    assert!(
        db.store()
            .overview_counting(Counting::UpTo(0))
            .await
            .is_err()
    );

    let (status, list) = get(addr, "/api/v1/dead-letters?limit=10").await;
    assert_eq!(status, 200, "{list}");
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(
        list[0]["last_error"],
        "broker refused: message too large <b>x</b>"
    );
    assert_eq!(list[0]["aggregate_id"], "o-5");
    assert_eq!(list[0]["blocked_behind"], 1);

    let (status, e) = get(addr, "/api/v1/dead-letters?limit=0").await;
    assert_eq!(status, 400, "{e}");
    let (status, e) = get(addr, "/api/v1/dead-letters?lmit=5").await;
    assert_eq!(status, 400, "{e}");

    let (status, body) = get(addr, "/readyz").await;
    assert_eq!((status, body), (200, Value::String("ready".into())));
    let (status, _) = get(addr, "/healthz").await;
    assert_eq!(status, 200);
    let (status, page) = get(addr, "/").await;
    assert_eq!(status, 200);
    assert!(page.as_str().unwrap().contains("outbox console"));

    stop_and_drop(stop, db).await;
}

#[tokio::test]
async fn a_requeue_needs_the_token_and_keeps_the_event_ids() {
    let (db, addr, stop) = db_and_console(0, 2).await;
    let (_, list) = get(addr, "/api/v1/dead-letters").await;
    let first = list[0]["event_id"].as_str().unwrap().to_owned();
    let body = format!(r#"{{"event_ids": ["{first}"], "reason": "broker limit raised"}}"#);
    let path = "/api/v1/dead-letters/requeue";

    // No token, a wrong one, a cross-site origin: refused, nothing changes.
    let (status, e) = post(addr, path, &[], &body).await;
    assert_eq!(status, 401, "{e}");
    let wrong = [("authorization", "Bearer not-the-console-token")];
    let (status, e) = post(addr, path, &wrong, &body).await;
    assert_eq!(status, 401, "{e}");
    let cross = [AUTH, ("origin", "http://evil.example")];
    let (status, e) = post(addr, path, &cross, &body).await;
    assert_eq!(status, 403, "{e}");
    assert_eq!(db.count("state = 'dead'").await, 2);

    // Malformed bodies: a clear 400.
    let ok = [AUTH];
    for bad in [
        r#"{"all": true, "event_ids": ["00000000-0000-0000-0000-000000000000"]}"#,
        "{}",
        r#"{"event_ids": ["nope"]}"#,
        "not json",
    ] {
        let (status, e) = post(addr, path, &ok, bad).await;
        assert_eq!(status, 400, "{bad}: {e}");
    }
    assert_eq!(db.count("state = 'dead'").await, 2);

    // The token, from the same origin: the one event is pending again under its own id.
    let host = format!("http://{addr}");
    let same = [AUTH, ("origin", host.as_str())];
    let (status, r) = post(addr, path, &same, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["requeued"], 1);
    assert_eq!(
        db.count(&format!("state = 'pending' AND event_id = '{first}'"))
            .await,
        1
    );
    assert_eq!(db.count("state = 'dead'").await, 1);

    // Everything.
    let (status, r) = post(addr, path, &ok, r#"{"all": true}"#).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["requeued"], 1);
    assert_eq!(db.count("state = 'dead'").await, 0);

    stop_and_drop(stop, db).await;
}

#[tokio::test]
async fn read_only_and_tokenless_consoles_refuse_every_action() {
    let db = seeded(0, 1).await;
    let ok = [AUTH];
    let path = "/api/v1/dead-letters/requeue";
    for config in [
        ConsoleConfig {
            token: Some(TOKEN.to_owned()),
            read_only: true,
            ..ConsoleConfig::default()
        },
        ConsoleConfig::default(),
    ] {
        let (addr, stop) = serve(db.store(), config).await;
        for (path, body) in [
            (path, r#"{"all": true}"#),
            ("/api/v1/consumer-dead-letters/requeue", r#"{"all": true}"#),
            ("/api/v1/work-items/1/resolve", r#"{"resend": true}"#),
            (
                "/api/v1/pauses/pause",
                r#"{"consumer": "ledger", "reason": "r"}"#,
            ),
            (
                "/api/v1/conflicts/resolve",
                r#"{"ids": [1], "reason": "r"}"#,
            ),
        ] {
            let (status, e) = post(addr, path, &ok, body).await;
            assert_eq!(status, 403, "{path}: {e}");
        }
        // Reading still works.
        let (status, _) = get(addr, "/api/v1/overview").await;
        assert_eq!(status, 200);
        stop.cancel();
    }
    assert_eq!(db.count("state = 'dead'").await, 1);
    db.drop().await;
}

#[tokio::test]
async fn an_open_bind_without_a_token_and_a_weak_token_are_refused() {
    let open: SocketAddr = "0.0.0.0:8080".parse().unwrap();
    assert!(matches!(
        check_bind(open, &ConsoleConfig::default()),
        Err(ConsoleError::OpenWithoutToken(_))
    ));
    assert!(check_bind(open, &with_token()).is_ok());
    assert!(check_bind("127.0.0.1:8080".parse().unwrap(), &ConsoleConfig::default()).is_ok());
    assert!(check_bind("[::1]:8080".parse().unwrap(), &ConsoleConfig::default()).is_ok());

    let db = seeded(0, 0).await;
    let weak = ConsoleConfig {
        token: Some("short".into()),
        ..ConsoleConfig::default()
    };
    assert!(matches!(
        router(db.store(), weak),
        Err(ConsoleError::WeakToken)
    ));
    db.drop().await;
}

#[tokio::test]
async fn conflicts_and_consumer_dead_letters_are_listed_and_requeued_with_the_token() {
    let db = seeded(0, 0).await;
    let s = db.schema.as_str();
    for sql in [
        format!(
            "INSERT INTO {s}.inbox_conflicts (consumer_name, event_id, stored_sha256, \
             received_sha256, aggregate_type, aggregate_id, aggregate_version, event_type, payload) \
             VALUES ('ledger', gen_random_uuid(), sha256('a'), sha256('b'), 'payment', 'p-1', 3, \
             'PaymentCaptured', '\\x00')"
        ),
        format!(
            "INSERT INTO {s}.consumer_dead_letters (consumer_name, payload, error) \
             VALUES ('ledger', '\\x00', 'handler refused: unknown currency'), \
                    ('billing', '\\x00', 'poison')"
        ),
    ] {
        db.exec(&sql).await;
    }
    let (addr, stop) = serve(db.store(), with_token()).await;

    let (status, list) = get(addr, "/api/v1/conflicts").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["consumer_name"], "ledger");
    assert_eq!(
        list[0]["stored_sha256"],
        "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb",
        "sha256('a')"
    );
    assert_ne!(list[0]["received_sha256"], list[0]["stored_sha256"]);
    assert_eq!(list[0]["resolved_at"], serde_json::Value::Null);

    let ledger = |consumers: &serde_json::Value| {
        consumers
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "ledger"))
            .map(|c| c["conflicts"].clone())
    };
    let (_, consumers) = get(addr, "/api/v1/consumers").await;
    assert_eq!(ledger(&consumers), Some(1.into()), "{consumers}");

    // Resolving it: the token and a reason are needed; then it leaves the open list.
    let cid = list[0]["id"].as_i64().unwrap();
    let path = "/api/v1/conflicts/resolve";
    let body = format!(r#"{{"ids": [{cid}], "reason": "producer fixed"}}"#);
    let (status, e) = post(addr, path, &[], &body).await;
    assert_eq!(status, 401, "{e}");
    let ok = [AUTH];
    let no_reason = format!(r#"{{"ids": [{cid}]}}"#);
    let (status, e) = post(addr, path, &ok, &no_reason).await;
    assert_eq!(status, 400, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("needs a reason"),
        "{e}"
    );
    let (status, e) = post(addr, path, &ok, r#"{"ids": [-5], "reason": "x"}"#).await;
    assert_eq!(status, 404, "{e}");
    let (status, r) = post(addr, path, &ok, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["resolved"], 1, "{r}");
    let (_, open) = get(addr, "/api/v1/conflicts?open=true").await;
    assert_eq!(open, serde_json::json!([]));
    let (_, all) = get(addr, "/api/v1/conflicts").await;
    assert_eq!(all[0]["resolution_reason"], "producer fixed", "{all}");
    let (_, overview) = get(addr, "/api/v1/overview").await;
    assert_eq!(
        overview["inbox_conflicts"], 0,
        "the overview counts open conflicts: {overview}"
    );
    // The consumers' table agrees with the overview (its open dead letter keeps it listed).
    let (_, consumers) = get(addr, "/api/v1/consumers").await;
    assert_eq!(ledger(&consumers), Some(0.into()), "{consumers}");

    let (status, list) = get(addr, "/api/v1/consumer-dead-letters?consumer=ledger").await;
    assert_eq!(status, 200, "{list}");
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["error"], "handler refused: unknown currency");
    assert_eq!(list[0]["state"], "dead");
    let id = list[0]["id"].as_i64().unwrap();

    let path = "/api/v1/consumer-dead-letters/requeue";
    let body = format!(r#"{{"ids": [{id}], "consumer": "ledger"}}"#);
    let (status, e) = post(addr, path, &[], &body).await;
    assert_eq!(status, 401, "{e}");
    let (status, e) = post(addr, path, &ok, r#"{"ids": []}"#).await;
    assert_eq!(status, 400, "{e}");
    let (status, r) = post(addr, path, &ok, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["requeued"], 1);
    let states: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT consumer_name, state FROM {s}.consumer_dead_letters ORDER BY consumer_name"
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        states,
        vec![
            ("billing".to_owned(), "dead".to_owned()),
            ("ledger".to_owned(), "requeued".to_owned())
        ]
    );

    // Grouped by consumer and reason (requeued ones stay open until their consumer settles).
    let (status, groups) = get(addr, "/api/v1/consumer-dead-letters/groups").await;
    assert_eq!(status, 200, "{groups}");
    assert_eq!(groups["complete"], true);
    let mut seen = strings(&groups["groups"], &["consumer_name", "reason"]);
    seen.sort_unstable();
    assert_eq!(
        seen,
        [
            ["billing", "poison"],
            ["ledger", "handler refused: unknown currency"]
        ]
    );
    // One whole, as received: with the token only.
    let (status, e) = get(addr, &format!("/api/v1/consumer-dead-letters/{id}")).await;
    assert_eq!(status, 401, "{e}");
    let (status, d) = call(
        addr,
        "GET",
        &format!("/api/v1/consumer-dead-letters/{id}"),
        &ok,
        None,
    )
    .await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(
        (&d["payload"]["hex"], &d["payload"]["size"]),
        (&"00".into(), &1.into())
    );
    // Discard billing's: a reason is required; it is resolved, never applied.
    let discard = "/api/v1/consumer-dead-letters/discard";
    let (status, e) = post(
        addr,
        discard,
        &ok,
        r#"{"all": true, "consumer": "billing"}"#,
    )
    .await;
    assert_eq!(status, 400, "{e}");
    let (status, r) = post(
        addr,
        discard,
        &ok,
        r#"{"all": true, "consumer": "billing", "reason": "test message"}"#,
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["discarded"], 1);
    let (_, list) = get(addr, "/api/v1/consumer-dead-letters").await;
    assert_eq!(
        list.as_array().unwrap().len(),
        1,
        "only ledger's requeued one is open"
    );

    // A conflict with its payloads: the conflicting one; the first is not held here.
    let (_, conflicts) = get(addr, "/api/v1/conflicts").await;
    let cid = conflicts[0]["id"].as_i64().unwrap();
    let (status, e) = get(addr, &format!("/api/v1/conflicts/{cid}")).await;
    assert_eq!(status, 401, "{e}");
    let (status, c) = call(addr, "GET", &format!("/api/v1/conflicts/{cid}"), &ok, None).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["received_payload"]["hex"], "00");
    assert!(c["first_payload"].is_null(), "{c}");
    let event_id = c["event_id"].as_str().unwrap();
    let (_, t) = get(addr, &format!("/api/v1/trace/event/{event_id}")).await;
    assert_eq!(t["conflicts"][0]["id"], cid, "{t}");

    stop_and_drop(stop, db).await;
}

#[tokio::test]
async fn work_items_are_listed_and_settled_by_hand_with_the_token() {
    let db = seeded(0, 0).await;
    let s = db.schema.as_str();
    db.exec(&format!(
        "INSERT INTO {s}.work_items (kind, idempotency_key, payload, state, unknown_since) \
         VALUES ('payout', 'k-1', '{{\"amount\": 5}}', 'unknown', now())"
    ))
    .await;
    let (addr, stop) = serve(db.store(), with_token()).await;

    let (status, list) = get(addr, "/api/v1/work-items?state=unknown").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list[0]["idempotency_key"], "k-1");
    assert_eq!(list[0]["payload"]["amount"], 5);
    assert_eq!(list[0]["payload_sha256"].as_str().unwrap().len(), 64);
    let id = list[0]["id"].as_i64().unwrap();
    let (status, e) = get(addr, "/api/v1/work-items?state=bogus").await;
    assert_eq!(status, 400, "{e}");

    let path = format!("/api/v1/work-items/{id}/resolve");
    let body = r#"{"succeeded": "provider-ref-7", "reason": "confirmed by phone"}"#;
    let (status, e) = post(addr, &path, &[], body).await;
    assert_eq!(status, 401, "{e}");
    let ok = [AUTH];
    for bad in [
        r#"{}"#,
        r#"{"succeeded": "r", "resend": true}"#,
        r#"{"failed": ""}"#,
    ] {
        let (status, e) = post(addr, &path, &ok, bad).await;
        assert_eq!(status, 400, "{bad}: {e}");
    }
    let (status, row) = post(addr, &path, &ok, body).await;
    assert_eq!(status, 200, "{row}");
    assert_eq!(
        (&row["state"], &row["reference"]),
        (&"succeeded".into(), &"provider-ref-7".into())
    );
    // Settled: a second settlement is refused, an unknown id is not found.
    let (status, e) = post(addr, &path, &ok, body).await;
    assert_eq!(status, 409, "{e}");
    let (status, e) = post(addr, "/api/v1/work-items/999999/resolve", &ok, body).await;
    assert_eq!(status, 404, "{e}");

    // Reconcile now: only an unknown outcome; its lookup is due at once.
    let (status, e) = post(
        addr,
        &format!("/api/v1/work-items/{id}/reconcile"),
        &ok,
        "{}",
    )
    .await;
    assert_eq!(status, 409, "{e}");
    let other: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO {s}.work_items (kind, idempotency_key, payload, state, unknown_since, \
         next_attempt_at) VALUES ('payout', 'k-2', '{{}}', 'unknown', now(), \
         now() + interval '1 hour') RETURNING id"
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let path = format!("/api/v1/work-items/{other}/reconcile");
    let (status, e) = post(addr, &path, &[], "{}").await;
    assert_eq!(status, 401, "{e}");
    let (status, r) = post(addr, &path, &ok, r#"{"reason": "provider says done"}"#).await;
    assert_eq!(status, 200, "{r}");
    let due: bool = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT next_attempt_at <= now() FROM {s}.work_items WHERE id = {other}"
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(due);
    let (_, audit) = get(addr, "/api/v1/audit").await;
    let actions = strings(&audit, &["action"]);
    assert_eq!(actions, [["reconcile work item"], ["resolve work item"]]);

    stop_and_drop(stop, db).await;
}

#[tokio::test]
async fn a_console_nested_under_a_prefix_serves_its_page_files_and_api_there() {
    let db = seeded(1, 0).await;
    let app = axum::Router::new()
        .merge(outbox_console::nested("/ops/outbox", db.store(), with_token()).unwrap());
    let (addr, server) = serve_app(app).await;

    let (status, page) = get(addr, "/ops/outbox").await;
    assert_eq!(status, 200);
    assert!(
        page.as_str()
            .unwrap()
            .contains(r#"<base href="/ops/outbox/">"#),
        "{page}"
    );
    let (status, _) = get(addr, "/ops/outbox/").await;
    assert_eq!(status, 308, "prefix/ redirects to the page");
    for path in ["/ops/outbox/console.js", "/ops/outbox/console.css"] {
        let (status, _) = get(addr, path).await;
        assert_eq!(status, 200, "{path}");
    }
    let (status, o) = get(addr, "/ops/outbox/api/v1/overview").await;
    assert_eq!((status, &o["pending"]), (200, &1.into()), "{o}");
    server.abort();
    db.drop().await;
}

#[tokio::test]
async fn a_loopback_console_answers_loopback_hosts_only_and_an_open_one_needs_the_token_to_read() {
    let (db, addr, stop) = db_and_console(1, 0).await;
    // `serve` on 127.0.0.1: a rebound name is refused, loopback names are not.
    let (status, e) = call(
        addr,
        "GET",
        "/api/v1/overview",
        &[("host", "attacker.example:8080")],
        None,
    )
    .await;
    assert_eq!(status, 403, "{e}");
    for host in [
        "localhost:8080",
        "127.0.0.1",
        "[::1]:9",
        "console.localhost",
    ] {
        let (status, e) = call(addr, "GET", "/api/v1/overview", &[("host", host)], None).await;
        assert_eq!(status, 200, "{host}: {e}");
    }
    stop.cancel();

    // Reads that need the token (what `serve` sets on a non-loopback address).
    let config = ConsoleConfig {
        reads_need_token: true,
        ..with_token()
    };
    let app = router(db.store(), config).unwrap();
    let (addr, server) = serve_app(app).await;
    let (status, e) = get(addr, "/api/v1/overview").await;
    assert_eq!(status, 401, "{e}");
    let (status, o) = call(addr, "GET", "/api/v1/overview", &[AUTH], None).await;
    assert_eq!(status, 200, "{o}");
    for open in ["/", "/healthz", "/readyz", "/console.js"] {
        let (status, _) = get(addr, open).await;
        assert_eq!(status, 200, "{open} carries no data and needs no token");
    }
    server.abort();
    db.drop().await;
}

#[tokio::test]
async fn dead_letters_are_grouped_filtered_shown_and_acted_on_by_filter_each_action_audited() {
    let db = seeded(0, 4).await;
    let s = db.schema.as_str();
    // Two reasons: "too large" (o-0, o-1) and "timed out after N ms" (o-2, o-3), whose
    // numbers differ but whose group is one.
    for (id, ms) in [("o-2", 5000), ("o-3", 7000)] {
        db.exec(&format!(
            "UPDATE {s}.events SET last_error = 'publish timed out after {ms} ms' \
             WHERE aggregate_id = '{id}' AND aggregate_version = 1"
        ))
        .await;
    }
    // A pending row that failed with the same kind of error: no dead-letter action may touch it.
    db.exec(&format!(
        "INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, aggregate_version, \
         event_type, payload, attempts, last_error) VALUES (gen_random_uuid(), 'order', 'o-9', \
         1, 'OrderPlaced', '\\x00', 2, 'publish timed out after 9000 ms')"
    ))
    .await;
    let (addr, stop) = serve(db.store(), with_token()).await;
    let ok = [AUTH];

    let (status, g) = get(addr, "/api/v1/dead-letters/groups").await;
    assert_eq!(status, 200, "{g}");
    assert_eq!(g["complete"], true);
    let groups = g["groups"].as_array().unwrap();
    let reasons: Vec<(&str, i64)> = groups
        .iter()
        .map(|g| (g["reason"].as_str().unwrap(), g["count"].as_i64().unwrap()))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("broker refused: message too large <b>x</b>", 2),
            ("publish timed out after # ms", 2)
        ]
    );

    // A group's key is a filter; so are the types and the time.
    let timeout = "/api/v1/dead-letters?reason_group=publish%20timed%20out%20after%20%23%20ms";
    let (status, list) = get(addr, timeout).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(strings(&list, &["aggregate_id"]), [["o-2"], ["o-3"]]);
    for (query, n) in [
        ("aggregate_type=order", 4),
        ("aggregate_type=nope", 0),
        ("event_type=OrderPlaced", 4),
        ("destination=elsewhere", 0),
        ("created_after=2000-01-01T00:00:00Z", 4),
        ("created_before=2000-01-01T00:00:00Z", 0),
    ] {
        let (status, list) = get(addr, &format!("/api/v1/dead-letters?{query}")).await;
        assert_eq!(status, 200, "{query}: {list}");
        assert_eq!(list.as_array().unwrap().len(), n, "{query}");
    }
    let (status, e) = get(addr, "/api/v1/dead-letters?created_after=yesterday").await;
    assert_eq!(status, 400, "{e}");

    // One whole, payload included: only with the token.
    let (_, all) = get(addr, "/api/v1/dead-letters").await;
    let first = all[0]["event_id"].as_str().unwrap().to_owned();
    let path = format!("/api/v1/dead-letters/{first}");
    let (status, e) = get(addr, &path).await;
    assert_eq!(status, 401, "{e}");
    let (status, d) = call(addr, "GET", &path, &ok, None).await;
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["payload"]["text"], r#"{"i":0}"#);
    assert_eq!(d["payload"]["size"], 7);
    assert_eq!(d["headers"], serde_json::json!({}));
    assert_eq!(d["blocked_behind"], 1);
    let (status, e) = call(
        addr,
        "GET",
        "/api/v1/dead-letters/00000000-0000-0000-0000-000000000000",
        &ok,
        None,
    )
    .await;
    assert_eq!(status, 404, "{e}");

    // Requeue a group, by filter, on the server.
    let body = r#"{"filter": {"reason_group": "publish timed out after # ms"}, "reason": "broker back", "actor": "alice"}"#;
    let (status, r) = post(addr, "/api/v1/dead-letters/requeue", &ok, body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["requeued"], 2);
    assert_eq!(
        db.count("state = 'pending' AND aggregate_id IN ('o-2', 'o-3')")
            .await,
        2
    );
    assert_eq!(
        db.count("aggregate_id = 'o-9' AND state = 'pending' AND attempts = 2")
            .await,
        1,
        "the retrying row with the same error is untouched"
    );
    // An empty filter is not "all".
    let (status, e) = post(
        addr,
        "/api/v1/dead-letters/requeue",
        &ok,
        r#"{"filter": {}}"#,
    )
    .await;
    assert_eq!(status, 400, "{e}");

    // Discard: a reason is required; then the row is kept whole beside the outbox.
    let discard = "/api/v1/dead-letters/discard";
    let body = format!(r#"{{"event_ids": ["{first}"]}}"#);
    let (status, e) = post(addr, discard, &ok, &body).await;
    assert_eq!(status, 400, "{e}");
    assert!(e["error"].as_str().unwrap().contains("reason"), "{e}");
    let body =
        format!(r#"{{"event_ids": ["{first}"], "reason": "order was cancelled", "actor": "bob"}}"#);
    let (status, r) = post(addr, discard, &ok, &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["discarded"], 1);
    let audit_id = r["audit_id"].as_i64().unwrap();
    assert_eq!(db.count(&format!("event_id = '{first}'")).await, 0);
    let (kept, kept_audit): (Vec<u8>, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT payload, audit_id FROM {s}.discarded_events WHERE event_id = '{first}'"
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (kept.as_slice(), kept_audit),
        (br#"{"i":0}"#.as_slice(), audit_id)
    );

    // The audit: newest first, who (as typed, with the token's fingerprint), the database
    // role, what, why, how many. The refused discard left no record.
    let (status, audit) = get(addr, "/api/v1/audit").await;
    assert_eq!(status, 200, "{audit}");
    let audit = audit.as_array().unwrap();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert_eq!(audit[0]["id"], audit_id);
    assert_eq!(audit[0]["action"], "discard dead letters");
    assert_eq!(audit[0]["actor"], "bob");
    assert_eq!(audit[0]["via"], "console");
    assert_eq!(audit[0]["reason"], "order was cancelled");
    assert_eq!(audit[0]["affected"], 1);
    assert_eq!(audit[0]["selection"]["event_ids"][0], first.as_str());
    assert_eq!(audit[0]["db_role"], "postgres");
    assert_eq!(audit[1]["action"], "requeue dead letters");
    assert_eq!(audit[1]["actor"], "alice");
    assert_eq!(
        audit[1]["selection"]["filter"]["reason_group"],
        "publish timed out after # ms"
    );
    let credential = audit[1]["credential"].as_str().unwrap();
    assert!(
        credential.starts_with("token ") && credential.len() == "token ".len() + 8,
        "{credential}"
    );
    assert!(!credential.contains(TOKEN));

    // The trace of the discarded event: no outbox row, its copy, and the record naming it.
    let (status, t) = get(addr, &format!("/api/v1/trace/event/{first}")).await;
    assert_eq!(status, 200, "{t}");
    assert!(t["outbox"].is_null(), "{t}");
    assert_eq!(t["discarded"]["audit_id"], audit_id);
    assert_eq!(t["audit"][0]["id"], audit_id);
    // The aggregate's trace: the event that waited behind it is its only outbox row now.
    let (status, t) = get(
        addr,
        "/api/v1/trace/aggregate?aggregate_type=order&aggregate_id=o-0",
    )
    .await;
    assert_eq!(status, 200, "{t}");
    let versions: Vec<i64> = t["outbox"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["aggregate_version"].as_i64().unwrap())
        .collect();
    assert_eq!(versions, vec![2]);
    assert_eq!(t["discarded"][0]["aggregate_version"], 1);

    stop_and_drop(stop, db).await;
}

#[tokio::test]
async fn replay_republishes_what_retention_still_holds_with_a_dry_run_first() {
    let db = seeded(0, 0).await;
    let s = db.schema.as_str();
    // p-1 published v1..v4 an hour ago; v5 pending (not yet published).
    let outbox = PgOutbox::new(db.schema.clone());
    for v in 1..=5 {
        let m = NewMessage::new(
            "payment",
            "p-1",
            v,
            "PaymentUpdated",
            Payload::json(&serde_json::json!({ "v": v })).unwrap(),
        );
        outbox.enqueue(&db.pool, &m).await.unwrap();
    }
    db.exec(&format!(
        "UPDATE {s}.events SET state = 'published', published_at = now() - interval '1 hour' \
         WHERE aggregate_version <= 4"
    ))
    .await;
    let ok = [AUTH];
    let path = "/api/v1/replay";
    let dry = r#"{"aggregate_type": "payment", "aggregate_id": "p-1", "dry_run": true}"#;

    // Delete mode keeps no published rows: refused.
    let (addr, stop) = serve(db.store(), with_token()).await;
    let (status, e) = post(addr, path, &ok, dry).await;
    assert_eq!(status, 409, "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("keeps no published events"),
        "{e}"
    );
    stop.cancel();

    let mark = PgStore::new(
        db.pool.clone(),
        PgStoreConfig {
            schema: db.schema.clone(),
            on_publish: outbox_postgres::OnPublish::Mark,
        },
    );
    let (addr, stop) = serve(mark, with_token()).await;
    let (status, e) = post(addr, path, &[], dry).await;
    assert_eq!(status, 401, "{e}");
    // The dry run counts and changes nothing.
    let (status, plan) = post(addr, path, &ok, dry).await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!(
        (
            &plan["events"],
            &plan["lowest_version_held"],
            &plan["newest_version_held"]
        ),
        (&4.into(), &1.into(), &5.into())
    );
    assert_eq!(db.count("state = 'pending'").await, 1);
    for bad in [
        r#"{"aggregate_type": "payment", "aggregate_id": "p-1", "from_version": 0, "dry_run": true}"#,
        r#"{"aggregate_type": "payment", "dry_run": true}"#,
        r#"{"aggregate_type": "payment", "aggregate_id": "p-1", "reason": ""}"#,
        r#"{"published": {"from": "2000-01-01T00:00:00Z"}}"#,
    ] {
        let (status, e) = post(addr, path, &ok, bad).await;
        assert_eq!(status, 400, "{bad}: {e}");
    }
    let (status, e) = post(
        addr,
        path,
        &ok,
        r#"{"aggregate_type": "payment", "aggregate_id": "nope", "dry_run": true}"#,
    )
    .await;
    assert_eq!(status, 404, "{e}");

    // A time range: the published events written in it, counted by a dry run; an aggregate
    // and a range together are a bad request. The replay horizon starts at the migration, a
    // moment ago: a range from an hour ago is beyond it until the mark is set back.
    let since = (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    let until = (chrono::Utc::now() + chrono::Duration::minutes(1)).to_rfc3339();
    let range =
        format!(r#"{{"created_after": "{since}", "created_before": "{until}", "dry_run": true}}"#);
    let (status, e) = post(addr, path, &ok, &range).await;
    assert_eq!(status, 409, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("replay horizon"),
        "{e}"
    );
    db.exec(&format!(
        "UPDATE {s}.retention_marks SET through = now() - interval '1 day'"
    ))
    .await;
    let (status, plan) = post(addr, path, &ok, &range).await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!(
        (&plan["events"], &plan["in_range"], &plan["aggregates"]),
        (&4.into(), &4.into(), &1.into()),
        "{plan}"
    );
    let mixed = format!(
        r#"{{"aggregate_type": "payment", "aggregate_id": "p-1", "created_after": "{since}", "created_before": "{until}", "dry_run": true}}"#
    );
    let (status, e) = post(addr, path, &ok, &mixed).await;
    assert_eq!(status, 400, "{e}");

    // A relay holds the aggregate (a live lease): refused, retry later.
    db.exec(&format!(
        "INSERT INTO {s}.leases (aggregate_type, aggregate_id, token, lease_until) \
         VALUES ('payment', 'p-1', 1, now() + interval '1 minute')"
    ))
    .await;
    let (status, e) = post(addr, path, &ok, dry).await;
    assert_eq!(status, 409, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("a relay holds"),
        "{e}"
    );
    db.exec(&format!("DELETE FROM {s}.leases")).await;

    // Retention deleted v2: from v1 (or from v2) would leave a gap, so it is refused; from v3
    // it is whole. A changed count is refused too.
    db.exec(&format!(
        "DELETE FROM {s}.events WHERE aggregate_version = 2"
    ))
    .await;
    for from in [1, 2] {
        let body = format!(
            r#"{{"aggregate_type": "payment", "aggregate_id": "p-1", "from_version": {from}, "dry_run": true}}"#
        );
        let (status, e) = post(addr, path, &ok, &body).await;
        assert_eq!(status, 409, "from {from}: {e}");
        assert!(
            e["error"].as_str().unwrap().contains("replay horizon"),
            "{e}"
        );
    }
    let run = |expect: i64| {
        format!(
            r#"{{"aggregate_type": "payment", "aggregate_id": "p-1", "from_version": 3, "expect_events": {expect}, "reason": "ledger rebuilt", "actor": "erin"}}"#
        )
    };
    let (status, e) = post(addr, path, &ok, &run(3)).await;
    assert_eq!(status, 409, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("not the 3 expected"),
        "{e}"
    );
    let (status, plan) = post(addr, path, &ok, &run(2)).await;
    assert_eq!(status, 200, "{plan}");
    assert_eq!(plan["events"], 2);
    // v3 and v4 pending again, their first publish time kept; v1 untouched.
    assert_eq!(
        db.count(
            "state = 'pending' AND attempts = 0 AND aggregate_version IN (3, 4) \
             AND published_at < now() - interval '59 minutes'"
        )
        .await,
        2
    );
    assert_eq!(
        db.count("state = 'published' AND aggregate_version = 1")
            .await,
        1
    );

    // One record, the real replay's.
    let (_, audit) = get(addr, "/api/v1/audit").await;
    let audit = audit.as_array().unwrap();
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(
        (
            &audit[0]["action"],
            &audit[0]["affected"],
            &audit[0]["actor"]
        ),
        (&"replay".into(), &2.into(), &"erin".into())
    );
    stop_and_drop(stop, db).await;
}

/// Pausing a route through the API: refused without the token, a route key checked, the
/// pause listed with its reason, the route's rows left unclaimed until the resume.
#[tokio::test]
async fn a_route_and_a_consumer_are_paused_and_resumed_with_the_token() {
    use outbox_core::{ClaimParams, OutboxStore};
    let (db, addr, stop) = db_and_console(2, 0).await;
    let ok = [AUTH];
    let route = r#"{"route": "type:order", "reason": "downstream incident", "actor": "sam"}"#;
    let (status, _) = post(addr, "/api/v1/pauses/pause", &[], route).await;
    assert_eq!(status, 401);
    for (bad, want) in [
        (r#"{"route": "order", "reason": "r"}"#, 400),
        (r#"{"route": "type:order"}"#, 400),
        (
            r#"{"route": "type:order", "consumer": "c", "reason": "r"}"#,
            400,
        ),
        (r#"{"reason": "r"}"#, 400),
    ] {
        let (status, e) = post(addr, "/api/v1/pauses/pause", &ok, bad).await;
        assert_eq!(status, want, "{bad}: {e}");
    }
    let (status, p) = post(addr, "/api/v1/pauses/pause", &ok, route).await;
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["name"], "type:order");
    let (status, _) = post(addr, "/api/v1/pauses/pause", &ok, route).await;
    assert_eq!(status, 409, "paused twice");
    let consumer = r#"{"consumer": "ledger", "reason": "replaying its database"}"#;
    let (status, _) = post(addr, "/api/v1/pauses/pause", &ok, consumer).await;
    assert_eq!(status, 200);
    let (status, list) = get(addr, "/api/v1/pauses").await;
    assert_eq!(status, 200);
    assert_eq!(
        strings(&list, &["kind", "name", "actor"]),
        [
            ["consumer", "ledger", "console operator"],
            ["route", "type:order", "sam"]
        ]
    );
    // The relay's claim leaves the paused route's rows alone.
    let store = db.store();
    let params = ClaimParams {
        max_rows: 10,
        max_per_aggregate: 10,
        lease: std::time::Duration::from_secs(30),
        scope: Default::default(),
    };
    assert!(
        store
            .claim_batch(params.clone())
            .await
            .unwrap()
            .messages
            .is_empty()
    );
    let resume = r#"{"route": "type:order"}"#;
    let (status, r) = post(addr, "/api/v1/pauses/resume", &ok, resume).await;
    assert_eq!(status, 200, "{r}");
    let (status, _) = post(addr, "/api/v1/pauses/resume", &ok, resume).await;
    assert_eq!(status, 404, "not paused any more");
    assert_eq!(store.claim_batch(params).await.unwrap().messages.len(), 2);
    let (_, audit) = get(addr, "/api/v1/audit").await;
    let actions = strings(&audit, &["action"]);
    assert_eq!(actions, [["resume"], ["pause"], ["pause"]]);
    stop_and_drop(stop, db).await;
}

/// A process's `health` (what its engine says about itself, through its heartbeat) comes typed
/// beside its numbers, not inside them, and its ages are as of the request: a heartbeat read
/// 20 s after it was written reports a last error at least 20 s old.
#[tokio::test]
async fn a_processs_health_says_why_it_is_stuck_with_ages_as_of_now() {
    use outbox_core::consumer::ConsumerStats;
    use outbox_core::health::TroubleKind;
    use outbox_postgres::heartbeat::{Heartbeat, InstanceKind};
    let db = seeded(0, 0).await;
    let stats = std::sync::Arc::new(ConsumerStats::new("ledger"));
    stats.health().failed(
        TroubleKind::Source,
        1,
        &"Unavailable: connection refused by nats://broker:4222",
    );
    let beat = Heartbeat::new(
        outbox_postgres::PgStore::with_schema(db.pool.clone(), db.schema.clone()),
        InstanceKind::Consumer,
        "ledger",
    )
    .unwrap()
    .with_interval(std::time::Duration::from_secs(60))
    .with_consumer(stats);
    let beat_stop = CancellationToken::new();
    let beating = tokio::spawn(beat.run(beat_stop.clone()));
    let (addr, stop) = serve(db.store(), ConsoleConfig::default()).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let list = loop {
        let (status, list) = get(addr, "/api/v1/instances").await;
        assert_eq!(status, 200, "{list}");
        if list.as_array().is_some_and(|l| !l.is_empty()) {
            break list;
        }
        assert!(std::time::Instant::now() < deadline, "no heartbeat: {list}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let health = &list[0]["health"];
    assert_eq!(health["state"], "failing", "{list}");
    assert_eq!(health["last_error"]["kind"], "source", "{list}");
    assert_eq!(
        health["last_error"]["message"],
        "Unavailable: connection refused by nats://broker:4222"
    );
    assert_eq!(
        (&health["errors"], &health["errors_per_minute"]),
        (&1.into(), &1.into())
    );
    assert_eq!(health["last_progress_at"], Value::Null, "{list}");
    assert!(list[0]["stats"].get("health").is_none(), "{list}");
    assert_eq!(
        list[0]["stats"]["received"], 0,
        "the consumer's numbers: {list}"
    );

    db.exec(&format!(
        "UPDATE {}.instances SET heartbeat_at = heartbeat_at - interval '20 seconds'",
        db.schema.as_str()
    ))
    .await;
    let (_, list) = get(addr, "/api/v1/instances").await;
    let age = list[0]["health"]["last_error"]["age_seconds"]
        .as_f64()
        .unwrap();
    assert!((20.0..60.0).contains(&age), "{list}");

    stop.cancel();
    beat_stop.cancel();
    beating.await.unwrap();
    db.drop().await;
}
