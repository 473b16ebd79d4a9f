//! `outbox migrate` is repeatable and `outbox status --json` reports what the table holds;
//! `outbox status` and the console say why a relay is stuck.
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

    db.drop().await;
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
    db.drop().await;
}

/// `outbox status --json`, parsed.
async fn status_json(db: &TestDb) -> serde_json::Value {
    let mut c = outbox(Some(db.name()), None, None);
    c.args(["status", "--json"]);
    let r = run(c, QUICK).await;
    assert!(r.status.success(), "{r:?}");
    serde_json::from_str(r.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
}

/// The one relay's `health` in `outbox status --json`, once it satisfies `ok`.
async fn relay_health(
    db: &TestDb,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let v = status_json(db).await;
        let health = &v["processes"][0]["health"];
        if v["processes"][0]["status"] == "up" && ok(health) {
            return health.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the relay's health is {health}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `outbox ready` asked once of the relay at `port`.
async fn outbox_ready(port: u16) -> Run {
    let mut c = outbox(None, None, None);
    c.args(["ready", "--metrics-addr", &format!("127.0.0.1:{port}")]);
    run(c, QUICK).await
}

/// `GET /readyz` until it answers `status` (the relay is ready only once its first claim
/// went through, which may come after the heartbeat that said it was idle): its JSON body.
async fn readyz(port: u16, status: u16) -> serde_json::Value {
    let deadline = std::time::Instant::now() + QUICK;
    loop {
        let (got, body) = http_get(port, "/readyz").await;
        if got == status {
            return serde_json::from_str(&body).unwrap_or_else(|e| panic!("/readyz: {e}: {body}"));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/readyz still answers {got}, not {status}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The sum of `name`'s series carrying `label` in a Prometheus exposition.
fn labelled(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A real relay (`outbox relay`) whose broker goes away: `outbox status` (human and JSON) and
/// the console's processes say it is failing and why (the transport's error), its metrics count
/// the errors and its last progress stops; once the broker is back it publishes everything and
/// is no longer failing, its last error kept. Before that, with nothing pending, it is idle,
/// never failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_relay_says_why_in_status_and_on_the_console() {
    let db = TestDb::new().await;
    let nats = NatsEnv::new().await;
    let subscriber = nats.stream_subscriber().await;
    let proxy = Proxy::start(host_port(&nats_url())).await;
    let config = config_file("", &nats.toml());
    let metrics_port = free_port();
    let mut relay = ChildGuard::spawn(
        {
            let mut c = outbox(
                Some(db.name()),
                Some(&with_host_port(&nats_url(), proxy.addr)),
                Some(config.path()),
            );
            c.args([
                "relay",
                "--metrics-addr",
                &format!("127.0.0.1:{metrics_port}"),
            ]);
            c
        },
        "relay",
    );
    let console_port = free_port();
    let mut console = spawn_console(outbox(Some(db.name()), None, None), console_port).await;

    // Nothing pending: idle, no error.
    let h = relay_health(&db, "an idle relay", |h| h["state"] == "idle").await;
    assert_eq!(h["last_error"], serde_json::Value::Null, "{h}");
    assert_eq!(h["errors"], 0, "{h}");
    // Its probes: alive, and ready (running, not failing).
    assert_eq!(
        http_get(metrics_port, "/healthz").await,
        (200, "ok".to_owned())
    );
    let ready = readyz(metrics_port, 200).await;
    assert_eq!(ready["phase"], "running", "{ready}");
    assert_eq!(ready["health"]["state"], "idle", "{ready}");
    let r = outbox_ready(metrics_port).await;
    assert!(r.status.success(), "{r:?}");

    let first = event("acc-1", 1);
    db.enqueue(std::slice::from_ref(&first)).await;
    subscriber.wait_ids(&[first.event_id], QUICK).await;
    relay_health(&db, "a working relay", |h| h["state"] == "working").await;

    // The broker goes away: every publish fails, nothing goes out.
    proxy.set_down();
    let stuck: Vec<_> = (2..=4).map(|i| event(&format!("acc-{i}"), 1)).collect();
    db.enqueue(&stuck).await;
    let h = relay_health(&db, "a failing relay", |h| {
        h["state"] == "failing" && h["last_error"]["kind"] == "publish"
    })
    .await;
    let reason = h["last_error"]["message"].as_str().unwrap().to_owned();
    assert!(reason.starts_with("attempt "), "{reason}");
    assert!(h["errors_per_minute"].as_u64().unwrap() > 0, "{h}");
    assert!(
        h["last_progress_age_seconds"].as_f64().unwrap() > 0.0,
        "{h}"
    );
    assert_eq!(db.count("state = 'pending'").await, 3);
    // Not ready while failing, but alive (restarting it would not bring the broker back).
    let ready = readyz(metrics_port, 503).await;
    assert_eq!(ready["ready"], false, "{ready}");
    assert_eq!(ready["health"]["state"], "failing", "{ready}");
    assert_eq!(ready["health"]["last_error"]["kind"], "publish", "{ready}");
    assert!(
        ready["health"]["last_error"].get("message").is_none(),
        "no error text on an unauthenticated probe: {ready}"
    );
    assert_eq!(http_get(metrics_port, "/healthz").await.0, 200);
    let r = outbox_ready(metrics_port).await;
    assert_eq!(r.status.code(), Some(1), "{r:?}");
    assert!(r.stdout.starts_with("not ready (503)"), "{r:?}");

    // The human form: the state in the processes' table, the reason below it.
    let mut c = outbox(Some(db.name()), None, None);
    c.arg("status");
    let r = run(c, QUICK).await;
    assert!(r.status.success(), "{r:?}");
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with("relay "))
        .unwrap_or_else(|| panic!("no relay row: {}", r.stdout));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[..4], ["relay", "polling", "up", "failing"], "{row}");
    let why = r
        .stdout
        .lines()
        .find(|l| l.starts_with("last error of relay polling"))
        .unwrap_or_else(|| panic!("no reason: {}", r.stdout));
    assert!(why.contains(" ago, publish: attempt "), "{why}");

    // The console's API carries the same, typed.
    let (status, list) = console_call(console_port, "GET", "/api/v1/instances", None, "").await;
    assert_eq!(status, 200, "{list}");
    let health = &list[0]["health"];
    assert_eq!(health["state"], "failing", "{list}");
    assert_eq!(health["last_error"]["kind"], "publish", "{list}");
    assert!(
        health["last_error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("attempt ")),
        "{list}"
    );
    assert!(
        list[0]["stats"].get("health").is_none(),
        "not twice: {list}"
    );

    // Its metrics: the errors by kind, and a last progress that stopped at the first event.
    let text = scrape_metrics(metrics_port).await;
    assert!(
        labelled(&text, "outbox_relay_errors_total", "kind=\"publish\"") >= 1.0,
        "{text}"
    );
    let last = metric_value(&text, "outbox_relay_last_progress_timestamp_seconds")
        .expect("the progress gauge");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let stalled = h["last_progress_age_seconds"].as_f64().unwrap();
    assert!(now - last >= stalled - 1.0, "{last} vs {now}, {h}");

    // The broker is back: everything goes out, the relay is no longer failing.
    proxy.set_up();
    let ids: Vec<_> = stuck.iter().map(|m| m.event_id).collect();
    subscriber.wait_ids(&ids, Duration::from_secs(40)).await;
    let h = relay_health(&db, "a relay that recovered", |h| {
        h["state"] == "degraded" || h["state"] == "working"
    })
    .await;
    assert_eq!(h["last_error"]["kind"], "publish", "kept: {h}");
    let ready = readyz(metrics_port, 200).await;
    assert_eq!(ready["ready"], true, "{ready}");

    let exit = relay.terminate().await;
    assert!(exit.success(), "{exit:?}");
    let exit = console.terminate().await;
    assert!(exit.success(), "{exit:?}");
    drop(proxy);
    nats.cleanup().await;
    db.drop().await;
}
