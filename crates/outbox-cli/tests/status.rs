//! `outbox migrate` is repeatable and `outbox status --json` reports what the table holds.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;

const QUICK: Duration = Duration::from_secs(30);

#[tokio::test]
async fn migrate_twice_is_fine_and_status_matches_the_table() {
    let db = TestDb::unmigrated().await;

    let first = run(
        {
            let mut c = outbox(Some(db.name()), None, None);
            c.arg("migrate");
            c
        },
        QUICK,
    )
    .await;
    assert!(first.status.success(), "{first:?}");
    assert!(first.stdout.contains("migrated to version "), "{first:?}");
    let second = run(
        {
            let mut c = outbox(Some(db.name()), None, None);
            c.arg("migrate");
            c
        },
        QUICK,
    )
    .await;
    assert!(second.status.success(), "{second:?}");
    assert!(second.stdout.contains("is up to date"), "{second:?}");

    // 7 pending events on 3 aggregates; 2 of them dead letters (made so directly in the table),
    // one pending row retrying.
    let mut msgs = Vec::new();
    for (agg, versions) in [("a", 3), ("b", 2), ("c", 2)] {
        for v in 1..=versions {
            msgs.push(event(agg, v));
        }
    }
    db.enqueue(&msgs).await;
    db.exec(
        "UPDATE {s}.events SET state = 'dead', attempts = 12, last_error = 'test' \
         WHERE aggregate_version = 1 AND aggregate_id IN ('a', 'b')",
    )
    .await;
    db.exec(
        "UPDATE {s}.events SET attempts = 1, created_at = now() - interval '42 seconds' \
         WHERE aggregate_id = 'c' AND aggregate_version = 1",
    )
    .await;

    let status = |json: bool| {
        let mut c = outbox(Some(db.name()), None, None);
        c.arg("status");
        if json {
            c.arg("--json");
        }
        run(c, QUICK)
    };
    let r = status(true).await;
    assert!(r.status.success(), "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim())
        .unwrap_or_else(|e| panic!("status --json is not JSON ({e}): {}", r.stdout));
    let pending = db.count("state = 'pending'").await;
    let dead = db.count("state = 'dead'").await;
    assert_eq!((pending, dead), (5, 2));
    assert_eq!(v["schema"], db.name(), "{v}");
    assert_eq!(v["pending"], pending, "{v}");
    assert_eq!(v["dead_letters"], dead, "{v}");
    assert_eq!(v["retrying"], 1, "{v}");
    assert_eq!(v["in_flight"], 0, "{v}");
    assert_eq!(v["published_retained"], 0, "{v}");
    let age = v["oldest_pending_age_seconds"].as_f64().expect("age");
    assert!((42.0..120.0).contains(&age), "oldest pending age {age}");

    // The human form says the same.
    let r = status(false).await;
    assert!(r.status.success(), "{r:?}");
    let line = |name: &str| {
        r.stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no `{name}` line: {}", r.stdout))
            .split_whitespace()
            .last()
            .unwrap()
            .to_owned()
    };
    assert_eq!(line("pending"), "5");
    assert_eq!(line("dead letters"), "2");
    // Per route (one here), as the console shows them: in the JSON and as a table.
    let routes = v["routes"]["routes"].as_array().expect("routes");
    assert_eq!(routes.len(), 1, "{v}");
    assert_eq!(
        (&routes[0]["pending"], &routes[0]["dead_letters"]),
        (&5.into(), &2.into())
    );
    assert!(r.stdout.contains("ROUTE"), "{}", r.stdout);
    let route = r
        .stdout
        .lines()
        .find(|l| l.starts_with("type:"))
        .unwrap_or_else(|| panic!("no route row: {}", r.stdout));
    let cells: Vec<&str> = route.split_whitespace().collect();
    assert_eq!((cells[1], cells[3]), ("5", "2"), "{route}");
    assert!(v["processes"].is_array(), "{v}");

    // Status on the migrated-again schema stays consistent after a third migrate.
    let third = run(
        {
            let mut c = outbox(Some(db.name()), None, None);
            c.arg("migrate");
            c
        },
        QUICK,
    )
    .await;
    assert!(third.status.success(), "{third:?}");
    assert_eq!(db.count("true").await, 7, "migrate must not touch the rows");

    db.cleanup().await;
}

#[tokio::test]
async fn concurrent_migrations_of_one_schema_all_succeed() {
    let db = TestDb::unmigrated().await;
    let runs = (0..4).map(|_| {
        let mut c = outbox(Some(db.name()), None, None);
        c.arg("migrate");
        run(c, QUICK)
    });
    for r in futures::future::join_all(runs).await {
        assert!(r.status.success(), "{r:?}");
        assert!(!r.stderr.contains("panicked"), "{r:?}");
    }
    let r = run(
        {
            let mut c = outbox(Some(db.name()), None, None);
            c.args(["status", "--json"]);
            c
        },
        QUICK,
    )
    .await;
    assert!(r.status.success(), "{r:?}");
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["pending"], 0);
    assert_eq!(v["dead_letters"], 0);
    db.cleanup().await;
}
