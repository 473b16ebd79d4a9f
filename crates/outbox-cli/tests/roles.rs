//! The `outbox` binary under least-privilege roles: the relay process publishing to NATS, the
//! cleanup, the read-only operator's and the operator's commands each under its own login role
//! with exactly its component's grants; forbidden commands fail with a message that names the
//! missing grants; and `outbox roles print|apply|check` end to end (bootstrap, migrate and grant
//! as the migrator).
#![allow(missing_docs)]

mod common;

use std::time::Duration;

use common::*;
use outbox_postgres::{Component, PgOutbox};

const QUICK: Duration = Duration::from_secs(30);
const WITHIN: Duration = Duration::from_secs(60);

fn cmd(mut c: std::process::Command, args: &[&str]) -> std::process::Command {
    c.args(args);
    c
}

#[tokio::test]
async fn the_relay_process_publishes_wakes_and_reaps_under_the_relay_role() {
    let db = TestDb::new().await;
    let mut roles = login_roles().await;
    let by = roles_per_component(&mut roles, &db.schema).await;
    let nats = NatsEnv::new().await;
    let sub = nats.stream_subscriber().await;
    // A crashed relay's lease, expired long ago: the relay's elected reaper deletes it.
    db.exec("INSERT INTO {s}.leases VALUES ('payment', 'crashed', 1, now() - interval '1 hour')")
        .await;
    let producer = roles.pool_as(&by[&Component::Producer]).await;
    let outbox = PgOutbox::new(db.schema.clone());
    outbox
        .enqueue_batch(&producer, &[event("a", 1), event("a", 2), event("b", 1)])
        .await
        .unwrap();

    // Polls every 10 minutes: within the waits below, only a NOTIFY can wake it.
    let config = TempFile::new(
        ".toml",
        &format!(
            "[relay]\npoll_interval_ms = 600000\nstats_interval_secs = 1\nlease_secs = 2\n\
             publish_timeout_secs = 0.5\nlease_safety_margin_secs = 0.2\n{}",
            nats.toml()
        ),
    );
    let relay_role = &by[&Component::Relay];
    let mut relay = ChildGuard::spawn(
        cmd(
            outbox_as(
                relay_role,
                Some(db.name()),
                Some(&nats_url()),
                Some(config.path()),
            ),
            &["relay"],
        ),
        "relay",
    );
    sub.wait_len(3, WITHIN).await;
    wait_until(
        WITHIN,
        "rows deleted and the stale lease reaped",
        || async {
            db.count("true").await == 0 && db.scalar("SELECT count(*) FROM {s}.leases").await == 0
        },
    )
    .await;
    wait_until(WITHIN, "the relay listens", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity \
             WHERE usename = $1 AND query ILIKE 'LISTEN%'",
        )
        .bind(relay_role)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        n > 0
    })
    .await;
    outbox.enqueue(&producer, &event("c", 1)).await.unwrap();
    outbox.notify_relays(&producer).await.unwrap();
    let seen = sub.wait_len(4, WITHIN).await;
    assert_eq!(seen[3].aggregate_id, "c");
    relay.assert_running();
    assert!(relay.terminate().await.success(), "{}", relay.log());

    // The same process under a role without grants stops at once, saying why.
    let nobody = roles.create("nobody").await;
    let r = run(
        cmd(
            outbox_as(
                &nobody,
                Some(db.name()),
                Some(&nats_url()),
                Some(config.path()),
            ),
            &["relay"],
        ),
        QUICK,
    )
    .await;
    assert_clean_failure(
        &r,
        &[
            "permission denied for schema",
            &format!("role `{nobody}`"),
            "run `outbox roles apply` as the migrator",
        ],
    );
    assert!(!r.stderr.contains("outbox migrate"), "{}", r.stderr);

    drop(sub);
    nats.cleanup().await;
    db.drop().await;
    roles.cleanup().await;
}

#[tokio::test]
async fn the_reader_reads_and_only_the_operator_requeues_and_resolves() {
    let db = TestDb::new().await;
    let mut roles = login_roles().await;
    let by = roles_per_component(&mut roles, &db.schema).await;
    db.enqueue(&[event("a", 1)]).await;
    for sql in [
        "UPDATE {s}.events SET state = 'dead', last_error = 'too large'",
        "INSERT INTO {s}.inbox_conflicts (consumer_name, event_id, stored_sha256, \
         received_sha256, aggregate_type, aggregate_id, aggregate_version, event_type, payload) \
         VALUES ('ledger', gen_random_uuid(), sha256('a'), sha256('b'), 'payment', 'a', 1, 'T', '\\x00')",
        "INSERT INTO {s}.consumer_dead_letters (consumer_name, payload, error) \
         VALUES ('ledger', '\\x00', 'poison')",
        "INSERT INTO {s}.work_items (kind, idempotency_key, payload, state, unknown_since) \
         VALUES ('payout', 'k-1', '{\"amount\": 5}', 'unknown', now())",
    ] {
        db.exec(sql).await;
    }
    let item = db.scalar("SELECT id FROM {s}.work_items").await.to_string();
    let reader = &by[&Component::Reader];
    let operator = &by[&Component::Operator];
    let as_role = |role: &str, args: &[&str]| {
        run(
            cmd(outbox_as(role, Some(db.name()), None, None), args),
            QUICK,
        )
    };

    for (args, needle) in [
        (&["status", "--json"][..], "\"dead_letters\":1"),
        (&["dead-letters", "list"][..], "too large"),
        (&["conflicts", "list"][..], "consumer=ledger"),
        (&["consumer-dead-letters", "list"][..], "poison"),
        (&["effects", "status"][..], "unknown (to reconcile) 1"),
        (&["effects", "list"][..], "k-1"),
    ] {
        let r = as_role(reader, args).await;
        assert!(r.status.success(), "{args:?} as the reader: {r:?}");
        assert!(
            r.stdout.replace(' ', "").contains(&needle.replace(' ', "")),
            "{args:?}: {}",
            r.stdout
        );
    }

    // The reader's writes fail, saying which grants they need.
    let r = as_role(reader, &["dead-letters", "requeue", "--all"]).await;
    assert_clean_failure(
        &r,
        &[
            "permission denied for table events",
            &format!("role `{reader}` needs the operator grants"),
            "outbox roles apply",
        ],
    );
    let r = as_role(reader, &["effects", "resolve", &item, "--resend"]).await;
    assert_clean_failure(
        &r,
        &[
            "permission denied for table work_items",
            "needs the operator grants",
        ],
    );
    let r = as_role(reader, &["consumer-dead-letters", "requeue", "--all"]).await;
    assert_clean_failure(
        &r,
        &[
            "permission denied for table consumer_dead_letters",
            &format!("role `{reader}` needs the operator grants"),
        ],
    );
    assert_eq!(
        db.count("state = 'dead'").await,
        1,
        "a refused requeue changed rows"
    );

    // The console as the reader: it reads; its actions are refused by the database even with
    // the console's token, naming the grants.
    let token = "console-token-of-the-roles-test";
    let port = free_port();
    let mut cmd = outbox_as(reader, Some(db.name()), None, None);
    cmd.env("OUTBOX_CONSOLE_TOKEN", token);
    let mut console = spawn_console(cmd, port).await;
    let (status, o) = console_call(port, "GET", "/api/v1/overview", None, "").await;
    assert_eq!(status, 200, "{o}");
    assert_eq!(
        (
            &o["dead_letters"],
            &o["inbox_conflicts"],
            &o["consumer_dead_letters"]
        ),
        (&1.into(), &1.into(), &1.into()),
        "{o}"
    );
    assert_eq!(o["work_items"]["unknown"], 1, "{o}");
    let (status, list) = console_call(port, "GET", "/api/v1/dead-letters", None, "").await;
    assert_eq!(
        (status, &list[0]["last_error"]),
        (200, &"too large".into()),
        "{list}"
    );
    let (status, e) = console_call(
        port,
        "POST",
        "/api/v1/dead-letters/requeue",
        Some(token),
        r#"{"all": true}"#,
    )
    .await;
    assert_eq!(status, 403, "{e}");
    assert!(
        e["error"]
            .as_str()
            .unwrap_or("")
            .contains("needs the operator grants"),
        "{e}"
    );
    assert_eq!(db.count("state = 'dead'").await, 1);
    console.terminate().await;

    // The operator's succeed.
    for (args, needle) in [
        (
            &["dead-letters", "requeue", "--all"][..],
            "requeued 1 dead letter",
        ),
        (
            &["consumer-dead-letters", "requeue", "--all"][..],
            "requeued 1 consumer dead letter",
        ),
        (&["effects", "resolve", &item, "--resend"][..], "pending"),
    ] {
        let r = as_role(operator, args).await;
        assert!(r.status.success(), "{args:?} as the operator: {r:?}");
        assert!(r.stdout.contains(needle), "{args:?}: {}", r.stdout);
    }
    assert_eq!(db.count("state = 'pending'").await, 1);

    // A role with no grants at all is told so, not to migrate.
    let nobody = roles.create("nobody").await;
    let r = as_role(&nobody, &["status"]).await;
    assert_clean_failure(
        &r,
        &[
            "permission denied for schema",
            &format!("role `{nobody}`"),
            "outbox roles apply",
        ],
    );
    assert!(!r.stderr.contains("outbox migrate"), "{}", r.stderr);

    db.drop().await;
    roles.cleanup().await;
}

#[tokio::test]
async fn cleanup_runs_under_the_maintainer_role_only() {
    let db = TestDb::new().await;
    let mut roles = login_roles().await;
    let by = roles_per_component(&mut roles, &db.schema).await;
    for sql in [
        "INSERT INTO {s}.inbox (consumer_name, event_id, payload_sha256, aggregate_type, \
         aggregate_id, aggregate_version, event_type, received_at) VALUES \
         ('c', gen_random_uuid(), '\\x00', 'payment', 'a', 1, 'T', now() - interval '30 days'), \
         ('c', gen_random_uuid(), '\\x00', 'payment', 'b', 1, 'T', now())",
        "INSERT INTO {s}.work_items (kind, idempotency_key, payload, state, resolved_at) VALUES \
         ('payout', 'old', '{}', 'succeeded', now() - interval '30 days')",
        "INSERT INTO {s}.leases VALUES ('payment', 'crashed', 1, now() - interval '1 hour')",
        "INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, aggregate_version, \
         event_type, payload, state, published_at) VALUES \
         (gen_random_uuid(), 'payment', 'p', 1, 'T', '\\x7b7d', 'published', now() - interval '30 days'), \
         (gen_random_uuid(), 'payment', 'p', 2, 'T', '\\x7b7d', 'pending', NULL)",
    ] {
        db.exec(sql).await;
    }
    let args = [
        "cleanup",
        "--inbox-keep-secs",
        "604800",
        "--broker-retention-secs",
        "86400",
        "--work-items-keep-secs",
        "86400",
        "--published-keep-secs",
        "86400",
    ];
    // The reader may not delete: refused before anything is gone, naming the grants.
    let r = run(
        cmd(
            outbox_as(&by[&Component::Reader], Some(db.name()), None, None),
            &args,
        ),
        QUICK,
    )
    .await;
    assert_clean_failure(
        &r,
        &[
            "permission denied: role",
            "lacks SELECT (ctid) ON TABLE",
            "DELETE ON TABLE",
            "needs the maintainer grants",
        ],
    );
    assert_eq!(db.scalar("SELECT count(*) FROM {s}.inbox").await, 2);

    let r = run(
        cmd(
            outbox_as(&by[&Component::Maintainer], Some(db.name()), None, None),
            &args,
        ),
        QUICK,
    )
    .await;
    assert!(r.status.success(), "{r:?}");
    assert!(
        r.stdout
            .contains("deleted 4 row(s): 1 inbox identities, 1 work items, 1 published events, 1 expired leases"),
        "{}",
        r.stdout
    );
    assert_eq!(db.scalar("SELECT count(*) FROM {s}.inbox").await, 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM {s}.events WHERE state = 'pending'")
            .await,
        1
    );
    assert_eq!(db.scalar("SELECT count(*) FROM {s}.events").await, 1);
    db.drop().await;
    roles.cleanup().await;
}

#[tokio::test]
async fn roles_bootstrap_migrate_grant_and_check_end_to_end() {
    let db = TestDb::unmigrated().await;
    let mut roles = login_roles().await;
    let migrator = roles.create("migrator").await;
    let relay = roles.create("relay").await;
    let schema = Some(db.name());

    // print needs no database.
    let mut print = outbox(schema, None, None);
    print
        .env_remove("OUTBOX_DATABASE_URL")
        .args(["roles", "print", "--relay", &relay]);
    let r = run(print, QUICK).await;
    assert!(r.status.success(), "{r:?}");
    assert!(
        r.stdout.contains(&format!(
            "GRANT USAGE ON SEQUENCE \"{}\".\"lease_token_seq\" TO \"{relay}\";",
            db.name()
        )),
        "{}",
        r.stdout
    );

    // The superuser's one-time set-up, then the migrator migrates and grants.
    let r = run(
        cmd(
            outbox(schema, None, None),
            &[
                "roles",
                "apply",
                "--bootstrap",
                "--migrator",
                &migrator,
                "--relay",
                &relay,
            ],
        ),
        QUICK,
    )
    .await;
    assert!(r.status.success(), "{r:?}");
    assert!(r.stdout.contains("every role existed"), "{}", r.stdout);
    let as_role =
        |role: &str, args: &[&str]| run(cmd(outbox_as(role, schema, None, None), args), QUICK);
    let r = as_role(&migrator, &["migrate"]).await;
    assert!(r.status.success(), "{r:?}");
    let r = as_role(&migrator, &["roles", "apply", "--relay", &relay]).await;
    assert!(r.status.success(), "{r:?}");
    assert!(
        r.stdout.contains(&format!("{relay}: relay grants")),
        "{}",
        r.stdout
    );

    let r = as_role(&relay, &["roles", "check", "--component", "relay"]).await;
    assert!(r.status.success(), "{r:?}");
    assert!(
        r.stdout
            .contains(&format!("role `{relay}` holds the relay grants")),
        "{}",
        r.stdout
    );
    let r = as_role(&relay, &["roles", "check", "--component", "operator"]).await;
    assert_clean_failure(
        &r,
        &[
            &format!("permission denied: role `{relay}` lacks"),
            "ON TABLE",
            "needs the operator grants",
        ],
    );
    // Only the owner grants; anyone else is refused instead of getting a silent warning.
    let r = as_role(&relay, &["roles", "apply", "--relay", &relay]).await;
    assert_clean_failure(&r, &[&format!("role `{relay}` does not own")]);

    db.drop().await;
    roles.cleanup().await;
}
