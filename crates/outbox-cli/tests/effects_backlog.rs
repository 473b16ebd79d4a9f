//! Remote effects through real processes: `outbox effects run` against the stand-in provider
//! (`outbox demo-provider`) answering slower than the call timeout. Every call's outcome is
//! unknown; the reconciliation backlog metric rises, reconciliation asks the provider by key,
//! and the backlog falls back to zero with exactly one payout per work item.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{ChildGuard, database_url, free_port, metric_value, scrape_metrics};
use outbox_postgres::Schema;
use outbox_postgres::effects::{NewWorkItem, PgEffects};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

/// `GET path` on the stand-in provider (Connection: close); the response body.
async fn provider_get(addr: &str, path: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

/// `outbox …` in `schema`, run to completion; its stdout parsed as JSON.
async fn outbox_json(schema: &str, args: &[&str]) -> serde_json::Value {
    let mut cmd = common::outbox(Some(schema), None, None);
    cmd.args(args);
    let out = common::run(cmd, Duration::from_secs(30)).await;
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}{}", out.stdout, out.stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_outcomes_are_reconciled_and_the_backlog_metric_rises_and_falls() {
    let schema = format!("eff_{}", Uuid::now_v7().simple());
    let pool = PgPool::connect(&database_url()).await.expect("PostgreSQL");
    let s = Schema::new(&schema).unwrap();
    outbox_postgres::migrate(&pool, &s).await.unwrap();

    // Five payouts, written as a consumer would, in a transaction.
    let effects = PgEffects::new(s.clone());
    let mut tx = pool.begin().await.unwrap();
    for i in 0..5 {
        let event = Uuid::now_v7();
        let item = NewWorkItem {
            kind: "payout".into(),
            idempotency_key: outbox_postgres::effects::idempotency_key("payout", "test", event),
            payload: serde_json::json!({"reference": format!("pay-{i}"), "amount": 100 + i, "beneficiary": "m"}),
            event_id: Some(event),
            consumer_name: Some("test".into()),
        };
        effects.enqueue(&mut tx, &item).await.unwrap();
    }
    tx.commit().await.unwrap();

    // The provider answers after 1.5 s; the executor gives up after 300 ms: outcome unknown.
    let mut provider_cmd = common::outbox(Some(&schema), None, None);
    provider_cmd.args(["demo-provider", "--delay-ms=1500"]);
    let mut provider = ChildGuard::spawn(provider_cmd, "provider");
    let deadline = Instant::now() + Duration::from_secs(10);
    let url = loop {
        if let Some(url) = provider
            .log()
            .lines()
            .find_map(|l| l.strip_prefix("listening on ").map(str::to_owned))
        {
            break url;
        }
        assert!(
            Instant::now() < deadline,
            "provider address: {}",
            provider.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let provider_addr = url.trim_start_matches("http://").to_owned();
    let metrics_port = free_port();
    let mut executor_cmd = common::outbox(Some(&schema), None, None);
    executor_cmd.args([
        "effects",
        "run",
        "--kind=payout",
        &format!("--provider-url={url}"),
        "--call-timeout-ms=300",
        "--lease-secs=3.5",
        "--batch-size=8",
        "--concurrency=8",
        "--reconcile-after-ms=4000",
        &format!("--metrics-addr=127.0.0.1:{metrics_port}"),
    ]);
    let mut executor = ChildGuard::spawn(executor_cmd, "executor");

    // Rises: all five unknown, with an age.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut peak = 0.0;
    let mut age = 0.0;
    while Instant::now() < deadline && peak < 5.0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Until the endpoint is up, scrape_metrics panics inside its own task: skipped.
        if let Ok(Ok(text)) = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::spawn(scrape_metrics(metrics_port)),
        )
        .await
        {
            peak = f64::max(
                peak,
                metric_value(&text, "outbox_effects_unknown").unwrap_or(0.0),
            );
            age = f64::max(
                age,
                metric_value(&text, "outbox_effects_oldest_unknown_age_seconds").unwrap_or(0.0),
            );
        }
    }
    assert_eq!(
        peak, 5.0,
        "the backlog gauge never showed all five unknown items"
    );
    assert!(age > 0.0, "the oldest-unknown age gauge stayed at zero");
    let unknown_in_db: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.work_items WHERE state = 'unknown'"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        unknown_in_db > 0,
        "items left unknown before reconcile_after"
    );
    // The operator sees the same backlog in `outbox status`.
    let status = outbox_json(&schema, &["status", "--json"]).await;
    assert!(
        status["work_items"]["unknown"].as_i64().unwrap_or(0) > 0,
        "{status}"
    );

    // Falls: reconciliation finds each payout by key at the provider.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = f64::NAN;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let text = scrape_metrics(metrics_port).await;
        last = metric_value(&text, "outbox_effects_unknown").unwrap_or(f64::NAN);
        if last == 0.0 {
            break;
        }
    }
    assert_eq!(last, 0.0, "the backlog gauge did not fall to zero");
    let succeeded: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {schema}.work_items WHERE state = 'succeeded' AND reference IS NOT NULL"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(succeeded, 5);

    // Exactly one payout per item on the provider's side: reconciliation never called again.
    let payouts: serde_json::Value =
        serde_json::from_str(&provider_get(&provider_addr, "/payouts").await).unwrap();
    let payouts = payouts.as_array().unwrap();
    assert_eq!(payouts.len(), 5, "{payouts:?}");
    let mut refs: Vec<&str> = payouts
        .iter()
        .map(|p| p["reference"].as_str().unwrap())
        .collect();
    refs.sort_unstable();
    refs.dedup();
    assert_eq!(refs.len(), 5, "{payouts:?}");

    // The operator view agrees.
    let status = outbox_json(&schema, &["effects", "status", "--json"]).await;
    assert_eq!(status["unknown"], 0, "{status}");
    assert_eq!(status["succeeded"], 5, "{status}");

    executor.terminate().await;
    provider.terminate().await;
    let _ = sqlx::query(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await;
}
