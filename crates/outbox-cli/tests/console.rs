//! `outbox console` as operators run it: a dead letter requeued through its API reaches the
//! broker under its own event id, the console and `outbox status` show the same numbers, and
//! an open address without a token is refused at start.
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const TOKEN: &str = "console-token-of-the-cli-test";
const QUICK: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_dead_letter_requeued_through_the_console_reaches_the_broker() {
    let db = TestDb::new().await;
    let nats = NatsEnv::new().await;
    let subscriber = nats.stream_subscriber().await;
    let (v1, v2) = (event("acc-1", 1), event("acc-1", 2));
    db.enqueue(&[v1.clone(), v2.clone()]).await;
    db.exec(&db.sql(&format!(
        "UPDATE {{s}}.events SET state = 'dead', attempts = 5, last_error = 'refused by the broker' \
         WHERE event_id = '{}'",
        v1.event_id
    )))
    .await;

    let (port, mut console) = spawn_console_with_token(&db, TOKEN).await;

    // The relay runs, but v1 is dead and v2 waits behind it: nothing is published.
    let (stop, relay_task) = nats.start_relay(&db).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(subscriber.len(), 0, "nothing passes a dead letter");

    // The console and `outbox status` agree.
    let (status, overview) =
        console_call(port, "GET", "/api/v1/overview?exact=true", Some(TOKEN), "").await;
    assert_eq!(status, 200, "{overview}");
    let cli = run_cli(&db, None, None, &["status", "--json"]).await;
    assert!(cli.status.success(), "{cli:?}");
    let mut cli: Value = serde_json::from_str(cli.stdout.trim()).expect("status --json");
    // `status` adds the routes and the processes (the console's /routes and /instances).
    let (_, routes) = console_get(port, "/api/v1/routes").await;
    assert_eq!(
        cli["routes"]["routes"][0]["dead_letters"], routes["routes"][0]["dead_letters"],
        "{cli} {routes}"
    );
    if let Some(fields) = cli.as_object_mut() {
        fields.remove("routes");
        fields.remove("processes");
    }
    let mut overview = overview;
    for v in [&mut cli, &mut overview] {
        v["oldest_pending_age_seconds"] = Value::Null;
    }
    assert_eq!(cli, overview);
    assert_eq!(overview["dead_letters"], 1);
    assert_eq!(overview["pending"], 1);

    // Without the token: refused. With it: v1 goes out under its own id, then v2.
    let body = format!(
        r#"{{"event_ids": ["{}"], "reason": "limit raised"}}"#,
        v1.event_id
    );
    let r = requeue_with_the_token_only(port, &body).await;
    assert_eq!(r["requeued"], 1);
    let seen = subscriber
        .wait_ids(&[v1.event_id, v2.event_id], Duration::from_secs(20))
        .await;
    let ids: Vec<_> = seen.iter().map(|r| r.event_id).collect();
    assert_eq!(ids, vec![v1.event_id, v2.event_id]);

    // The action is in the console's audit log, without the token.
    stop.cancel();
    relay_task.await.expect("relay task");
    let exit = console.terminate().await;
    assert!(
        exit.success(),
        "SIGTERM stops the console cleanly: {exit:?}"
    );
    let log = console.log();
    assert!(
        log.contains("outbox::audit") && log.contains("limit raised"),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "the token reached the log:\n{log}");
    db.drop().await;
}

#[tokio::test]
async fn an_open_address_without_a_token_or_a_weak_token_is_refused_at_start() {
    let db = TestDb::new().await;
    let r = console_refused(outbox(Some(db.name()), None, None), "0.0.0.0:0", None).await;
    assert!(
        r.stderr
            .contains("refusing to listen on 0.0.0.0:0 without a token"),
        "{r:?}"
    );

    let r = console_refused(
        outbox(Some(db.name()), None, None),
        "127.0.0.1:0",
        Some("short"),
    )
    .await;
    assert!(r.stderr.contains("at least 16 characters"), "{r:?}");
    db.drop().await;
}

/// `outbox …` with these arguments against `db`, as the actor carol; its output.
async fn cli(db: &TestDb, args: &[&str]) -> Run {
    run_cli(db, None, Some("carol"), args).await
}

/// `outbox …` with these arguments against `db`, with `config` and as `actor` when given; its
/// output.
async fn run_cli(
    db: &TestDb,
    config: Option<&TempFile>,
    actor: Option<&str>,
    args: &[&str],
) -> Run {
    run(cli_cmd(db, config, actor, args), QUICK).await
}

/// The command [`run_cli`] runs.
fn cli_cmd(
    db: &TestDb,
    config: Option<&TempFile>,
    actor: Option<&str>,
    args: &[&str],
) -> std::process::Command {
    let mut c = outbox(Some(db.name()), None, config.map(TempFile::path));
    c.args(args);
    if let Some(actor) = actor {
        c.env("OUTBOX_ACTOR", actor);
    }
    c
}

/// `cmd` as `outbox console --listen <listen>` with `OUTBOX_CONSOLE_TOKEN` set to `token`, or
/// unset: asserts it refuses to start, and returns what it said.
async fn console_refused(mut cmd: std::process::Command, listen: &str, token: Option<&str>) -> Run {
    cmd.args(["console", "--listen", listen]);
    match token {
        Some(t) => cmd.env("OUTBOX_CONSOLE_TOKEN", t),
        None => cmd.env_remove("OUTBOX_CONSOLE_TOKEN"),
    };
    let r = run(cmd, QUICK).await;
    assert!(!r.status.success(), "{r:?}");
    r
}

/// POSTs `body` to the console's dead-letter requeue on `port`: refused (401) without
/// [`TOKEN`], done (200) with it. Returns the answer.
async fn requeue_with_the_token_only(port: u16, body: &str) -> Value {
    let path = "/api/v1/dead-letters/requeue";
    let (status, e) = console_call(port, "POST", path, None, body).await;
    assert_eq!(status, 401, "{e}");
    let (status, r) = console_call(port, "POST", path, Some(TOKEN), body).await;
    assert_eq!(status, 200, "{r}");
    r
}

/// Stops `console` with SIGTERM, asserting that it exits cleanly, then drops `db`'s schema.
async fn stop_console(mut console: ChildGuard, db: TestDb) {
    let exit = console.terminate().await;
    assert!(exit.success(), "{exit:?}");
    db.drop().await;
}

/// A relay running in this process (see [`relay_in_process`]).
struct InProcessRelay {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl InProcessRelay {
    /// Stops the relay and waits for its end.
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// A relay in this process over `store`, publishing to `rabbit` with a 50 ms poll interval,
/// until stopped.
async fn relay_in_process(store: outbox_postgres::PgStore, rabbit: &RabbitEnv) -> InProcessRelay {
    let relay = std::sync::Arc::new(
        outbox_core::relay::Relay::new(
            std::sync::Arc::new(store),
            std::sync::Arc::new(rabbit.transport(&amqp_url()).await),
            outbox_core::relay::RelayConfig {
                poll_interval: Duration::from_millis(50),
                ..outbox_core::relay::RelayConfig::default()
            },
        )
        .expect("relay config"),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    InProcessRelay {
        stop: stop.clone(),
        task: tokio::spawn(relay.run(stop)),
    }
}

#[tokio::test]
async fn cli_actions_are_audited_and_the_console_shows_the_same_records_and_traces() {
    let db = TestDb::new().await;
    let (a, b, c) = (event("acc-1", 1), event("acc-2", 1), event("acc-3", 1));
    db.enqueue(&[a.clone(), b.clone(), c.clone()]).await;
    db.exec(&db.sql(
        "UPDATE {s}.events SET state = 'dead', attempts = 5, \
         last_error = 'schema 7 unknown to the broker'",
    ))
    .await;
    db.exec(&db.sql(&format!(
        "UPDATE {{s}}.events SET last_error = 'timed out after 30 s' WHERE event_id = '{}'",
        c.event_id
    )))
    .await;

    // Grouped by reason (numbers as #).
    let out = cli(&db, &["dead-letters", "groups", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let groups: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        groups["groups"][0]["reason"],
        "schema # unknown to the broker"
    );
    assert_eq!(groups["groups"][0]["count"], 2);

    // A discard without a reason is refused and changes nothing.
    let out = cli(
        &db,
        &["dead-letters", "discard", "--group", "timed out after # s"],
    )
    .await;
    assert!(!out.status.success(), "{out:?}");
    assert!(
        out.stderr.contains("discard dead letters needs a reason"),
        "{out:?}"
    );
    assert_eq!(db.count("state = 'dead'").await, 3);
    // By group, with a reason; then a requeue of the rest by filter.
    let out = cli(
        &db,
        &[
            "dead-letters",
            "discard",
            "--group",
            "timed out after # s",
            "--reason",
            "duplicate of acc-2",
        ],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(db.count(&format!("event_id = '{}'", c.event_id)).await, 0);
    let out = cli(
        &db,
        &[
            "dead-letters",
            "requeue",
            "--aggregate-type",
            "payment",
            "--reason",
            "broker upgraded",
        ],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.contains("requeued 2"), "{out:?}");

    // The console shows the CLI's records, as `outbox audit --json` does.
    let port = free_port();
    let console = spawn_console(outbox(Some(db.name()), None, None), port).await;
    let (status, audit) = console_get(port, "/api/v1/audit").await;
    assert_eq!(status, 200, "{audit}");
    let out = cli(&db, &["audit", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let from_cli: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(from_cli, audit);
    let actions: Vec<(&str, &str, &str, i64)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["action"].as_str().unwrap(),
                a["actor"].as_str().unwrap(),
                a["via"].as_str().unwrap(),
                a["affected"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        vec![
            ("requeue dead letters", "carol", "cli", 2),
            ("discard dead letters", "carol", "cli", 1)
        ]
    );

    // The discarded event's trace, from both.
    let (status, t) = console_get(port, &format!("/api/v1/trace/event/{}", c.event_id)).await;
    assert_eq!(status, 200, "{t}");
    let out = cli(&db, &["trace", &c.event_id.to_string()]).await;
    assert!(out.status.success(), "{out:?}");
    let from_cli: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(from_cli, t);
    assert!(t["outbox"].is_null());
    assert_eq!(t["discarded"]["last_error"], "timed out after 30 s");
    assert_eq!(t["audit"][0]["reason"], "duplicate of acc-2");
    let out = cli(&db, &["trace", "--aggregate", "payment/acc-1"]).await;
    assert!(out.status.success(), "{out:?}");
    let agg: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(agg["outbox"][0]["state"], "pending");

    stop_console(console, db).await;
}

#[tokio::test]
async fn the_console_shows_a_running_relay_up_then_stopped_and_what_it_published_per_route() {
    let db = TestDb::new().await;
    let nats = NatsEnv::new().await;
    let subscriber = nats.stream_subscriber().await;
    // One dead letter (from before the relay starts), which the routes count too.
    let dead = event("acc-9", 1);
    db.enqueue(std::slice::from_ref(&dead)).await;
    db.exec(&format!(
        "UPDATE {{s}}.events SET state = 'dead', last_error = 'refused' WHERE event_id = '{}'",
        dead.event_id
    ))
    .await;
    let config = config_file("", &nats.toml());
    let mut relay = ChildGuard::spawn(
        {
            let mut c = outbox(Some(db.name()), Some(&nats_url()), Some(config.path()));
            // The default log filter, as an operator gets it.
            c.arg("relay").env_remove("RUST_LOG");
            c
        },
        "relay",
    );
    let events: Vec<_> = (1..=5).map(|i| event(&format!("acc-{i}"), 1)).collect();
    db.enqueue(&events).await;
    subscriber.wait_len(5, Duration::from_secs(20)).await;
    let port = free_port();
    let console = spawn_console(outbox(Some(db.name()), None, None), port).await;

    // The relay is up, and its heartbeat wrote what it published (within a beat, 5 s).
    let deadline = std::time::Instant::now() + QUICK;
    let (instance, route) = loop {
        let (_, list) = console_get(port, "/api/v1/instances").await;
        let (_, routes) = console_get(port, "/api/v1/routes").await;
        let route = routes["routes"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["aggregate_type"] == "payment"))
            .cloned()
            .unwrap_or(Value::Null);
        let published: i64 = route["published_per_minute"]
            .as_array()
            .map_or(0, |m| m.iter().filter_map(Value::as_i64).sum());
        if published == 5 && list[0]["status"] == "up" {
            break (list[0].clone(), route);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relay's heartbeat and its publishes: {list} {routes}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(
        (&instance["kind"], &instance["name"]),
        (&"relay".into(), &"polling".into())
    );
    assert_eq!(instance["pid"], relay.id());
    assert_eq!(instance["stats"]["published"], 5);
    // Idle, it holds nothing (no lease, no batch in flight).
    assert_eq!(instance["stats"]["in_flight"]["batches"], 0, "{instance}");
    assert_eq!(route["dead_letters"], 1);
    assert_eq!(route["pending"], 0);

    // A clean stop reads as stopped; a silent process as late, then gone.
    let exit = relay.terminate().await;
    assert!(exit.success(), "{exit:?}");
    // Its log went to a pipe: plain text, no colour codes, and no third-party chatter.
    let log = relay.log();
    assert!(log.contains("INFO"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in a piped log: {log:?}"
    );
    for line in log.lines().filter(|l| l.contains(" INFO ")) {
        let target = line.split(" INFO ").nth(1).unwrap_or_default();
        assert!(
            target.starts_with("outbox"),
            "a third-party info line: {line}"
        );
    }
    let (_, list) = console_get(port, "/api/v1/instances").await;
    assert_eq!(list[0]["status"], "stopped", "{list}");
    for (age, status) in [(20, "late"), (60, "gone")] {
        db.exec(&format!(
            "UPDATE {{s}}.instances SET stopped_at = NULL, \
             heartbeat_at = now() - interval '{age} seconds'"
        ))
        .await;
        let (_, list) = console_get(port, "/api/v1/instances").await;
        assert_eq!(list[0]["status"], status, "{age} s: {list}");
    }

    stop_console(console, db).await;
}

#[tokio::test]
async fn the_token_comes_from_a_private_token_file_in_the_config() {
    use std::os::unix::fs::PermissionsExt as _;
    let db = TestDb::new().await;
    let token_file = TempFile::new(".token", &format!("{TOKEN}\n"));
    let config = config_file(
        "",
        &format!(
            "[console]\ntoken_file = \"{}\"\n",
            token_file.path().display()
        ),
    );

    // Readable by others: refused at start, saying how to fix it.
    std::fs::set_permissions(token_file.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
    let r = console_refused(
        outbox(Some(db.name()), None, Some(config.path())),
        "127.0.0.1:0",
        None,
    )
    .await;
    assert!(r.stderr.contains("chmod 600"), "{r:?}");
    assert!(!r.stderr.contains(TOKEN), "{r:?}");

    // Its owner's only: the token acts.
    std::fs::set_permissions(token_file.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
    let port = free_port();
    let mut cmd = outbox(Some(db.name()), None, Some(config.path()));
    cmd.env_remove("OUTBOX_CONSOLE_TOKEN");
    let console = spawn_console(cmd, port).await;
    let body = r#"{"all": true, "reason": "token file test"}"#;
    requeue_with_the_token_only(port, body).await;
    stop_console(console, db).await;
}

#[tokio::test]
async fn a_replayed_aggregate_reaches_the_broker_again_in_order_under_its_ids() {
    let db = TestDb::new().await;
    // RabbitMQ: NATS JetStream would drop a replay inside its stream's duplicate window (the
    // same Nats-Msg-Id), as the guide says (docs/guide/src/retention.md, "Replay").
    let rabbit = RabbitEnv::new().await;
    let subscriber = rabbit.subscriber().await;
    let mark = || {
        outbox_postgres::PgStore::new(
            db.pool.clone(),
            outbox_postgres::PgStoreConfig {
                schema: db.store().schema().clone(),
                on_publish: outbox_postgres::OnPublish::Mark,
            },
        )
    };
    // A mark-mode relay, in process, until `stop`.
    let relay = || relay_in_process(mark(), &rabbit);
    let versions: Vec<_> = (1..=3).map(|v| event("acc-1", v)).collect();
    db.enqueue(&versions).await;
    let running = relay().await;
    subscriber.wait_len(3, Duration::from_secs(20)).await;
    wait_until(QUICK, "the rows marked published", || async {
        db.count("state = 'published'").await == 3
    })
    .await;
    running.stop().await;

    // The CLI replays from v2: a dry run, then the replay expecting its count.
    let config = config_file("on_publish = \"mark\"", "");
    let replay_from_v2 = |extra: &[&str]| {
        let mut args = vec![
            "replay",
            "--aggregate",
            "payment/acc-1",
            "--from-version",
            "2",
        ];
        args.extend_from_slice(extra);
        run(cli_cmd(&db, Some(&config), Some("frank"), &args), QUICK)
    };
    let out = replay_from_v2(&["--dry-run"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.contains("would republish 2 event(s)"), "{out:?}");
    let out = replay_from_v2(&["--expect-events", "2", "--reason", "reporting rebuilt"]).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(db.count("state = 'pending'").await, 2);

    // The relay republishes v2 then v3, with their original ids.
    let running = relay().await;
    let seen = subscriber.wait_len(5, Duration::from_secs(20)).await;
    let ids: Vec<_> = seen.iter().map(|r| r.event_id).collect();
    assert_eq!(
        ids,
        vec![
            versions[0].event_id,
            versions[1].event_id,
            versions[2].event_id,
            versions[1].event_id,
            versions[2].event_id
        ]
    );
    running.stop().await;
    rabbit.cleanup().await;
    db.drop().await;
}

/// `outbox pause` holds a route at a running relay: its events stay pending, nothing reaches
/// the broker; `outbox pauses` lists it with its reason; `outbox resume` lets them go, in
/// order, under their ids. The relay runs with the claim window on, every claim counting as
/// slow and walks from the start a minute apart: its claims start past the paused rows, and
/// only the resume's `rescan` wake-up brings them back within the test's 20 s.
#[tokio::test]
async fn a_paused_route_holds_its_events_at_a_running_relay_until_resumed() {
    let db = TestDb::new().await;
    let rabbit = RabbitEnv::new().await;
    let subscriber = rabbit.subscriber().await;
    let minute = Duration::from_secs(60);
    let store = db
        .store()
        .with_claim_window(outbox_postgres::ClaimWindow::new(
            Duration::ZERO,
            minute,
            minute,
        ));
    let running = relay_in_process(store, &rabbit).await;
    let cli = |args: &[&str]| run(cli_cmd(&db, None, Some("grace"), args), QUICK);
    let out = cli(&["pause", "--aggregate-type", "payment"]).await;
    assert!(!out.status.success(), "a pause needs a reason: {out:?}");
    assert!(out.stderr.contains("needs a reason"), "{out:?}");
    let out = cli(&[
        "pause",
        "--aggregate-type",
        "payment",
        "--reason",
        "ledger team asked",
    ])
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.contains("paused route type:payment"), "{out:?}");

    let versions: Vec<_> = (1..=2).map(|v| event("acc-1", v)).collect();
    db.enqueue(&versions).await;
    // Many poll intervals: a relay that ignored the pause would have published them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(subscriber.len(), 0);
    assert_eq!(db.count("state = 'pending'").await, 2);
    let out = cli(&["pauses"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        out.stdout.contains("route type:payment")
            && out.stdout.contains("by grace: ledger team asked"),
        "{out:?}"
    );

    // With --log-format json every log line (the audit line included) is one JSON object.
    let out = cli(&["--log-format", "json", "resume", "--route", "type:payment"]).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        out.stderr.contains(r#""target":"outbox::audit""#),
        "{out:?}"
    );
    for line in out.stderr.lines() {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
    }
    let seen = subscriber.wait_len(2, Duration::from_secs(20)).await;
    let ids: Vec<_> = seen.iter().map(|r| r.event_id).collect();
    assert_eq!(ids, vec![versions[0].event_id, versions[1].event_id]);
    let out = cli(&["resume", "--route", "type:payment"]).await;
    assert!(!out.status.success(), "not paused any more: {out:?}");
    let out = cli(&["pauses"]).await;
    assert!(out.stdout.contains("nothing is paused"), "{out:?}");
    running.stop().await;
    rabbit.cleanup().await;
    db.drop().await;
}
