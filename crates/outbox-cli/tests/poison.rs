//! A poison row: an event that kills every relay process that tries to publish it (crash point
//! `relay.before_publish` keyed by its event id). Two relays crash-looping on it, restarted by
//! the test as a service manager would, park it as a dead letter with the reason after
//! `poison_after_takeovers` takeovers; every other event is delivered, its own aggregate's
//! earlier versions included, and the fleet then runs steadily. Requeued once the cause is
//! gone, it goes out with its aggregate's later versions, in order.
#![allow(missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use uuid::Uuid;

fn relay(
    db: &TestDb,
    broker: &BrokerEnv,
    config: &TempFile,
    poison: Option<Uuid>,
    name: &str,
) -> ChildGuard {
    let mut cmd = outbox(Some(db.name()), Some(&broker.url()), Some(config.path()));
    cmd.arg("relay");
    if let Some(id) = poison {
        cmd.env("OUTBOX_CRASH_POINT", "relay.before_publish")
            .env("OUTBOX_CRASH_KEY", id.to_string());
    }
    ChildGuard::spawn(cmd, name)
}

/// Restarts (with `start`, given the new process's name) every relay of `relays` that ended,
/// each of which must have ended at the poison's crash point; counts them in `crashes`.
async fn restart_crashed(
    relays: &mut [ChildGuard],
    crashes: &mut usize,
    start: impl Fn(&str) -> ChildGuard,
) {
    for (i, r) in relays.iter_mut().enumerate() {
        if r.try_wait_exit(Duration::ZERO).await.is_some() {
            let log = r.log();
            assert!(
                log.contains("crash point relay.before_publish reached"),
                "a relay ended for another reason:\n{log}"
            );
            *crashes += 1;
            *r = start(&format!("relay-{i}-{crashes}"));
        }
    }
}

#[tokio::test]
async fn a_row_that_crashes_every_relay_is_dead_lettered_and_the_fleet_moves_on() {
    let db = TestDb::new().await;
    let broker = BrokerEnv::new(Kind::Nats).await;
    let sub = broker.subscriber().await;
    let config = config_file("poison_after_takeovers = 3", &broker.toml(""));

    // The poison is version 3 of its aggregate; ten other aggregates beside it.
    let poisoned: Vec<_> = (1..=5).map(|v| event("poisoned", v)).collect();
    let poison = poisoned[2].event_id;
    db.enqueue(&poisoned).await;
    let others: Vec<_> = (1..=3)
        .flat_map(|v| (0..10).map(move |a| event(&format!("ok-{a}"), v)))
        .collect();
    db.enqueue(&others).await;

    let mut relays = [
        relay(&db, &broker, &config, Some(poison), "relay-a"),
        relay(&db, &broker, &config, Some(poison), "relay-b"),
    ];
    let mut crashes = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let dead = format!("event_id = '{poison}' AND state = 'dead'");
    while db.count(&dead).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the poison row was never dead-lettered ({crashes} crashes); rows:\n{:?}",
            db.scalar("SELECT count(*) FROM {s}.events").await
        );
        restart_crashed(&mut relays, &mut crashes, |name| {
            relay(&db, &broker, &config, Some(poison), name)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A relay may have crashed on the poison just before the other one parked it: restarted
    // as the service manager would. From here on no relay can reach the poison (it is dead,
    // and the crash point is keyed by its id), so none may end.
    restart_crashed(&mut relays, &mut crashes, |name| {
        relay(&db, &broker, &config, Some(poison), name)
    })
    .await;
    assert!(crashes >= 3, "dead-lettered after {crashes} crashes only");
    let dead: Vec<(String, i64, Option<String>)> = sqlx::query_as(sqlx::AssertSqlSafe(db.sql(
        "SELECT aggregate_id, aggregate_version, last_error FROM {s}.events WHERE state = 'dead'",
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(dead.len(), 1, "the poison row alone is parked: {dead:?}");
    assert_eq!(db.count("last_error LIKE 'poison row%'").await, 1);

    // Everything else arrives, the poisoned aggregate's versions before the poison included;
    // the versions behind it wait.
    let expected: Vec<Uuid> = others
        .iter()
        .chain(&poisoned[..2])
        .map(|m| m.event_id)
        .collect();
    let seen = sub.wait_ids(&expected, Duration::from_secs(30)).await;
    let first = assert_first_appearances_in_order(seen);
    for behind in &poisoned[2..] {
        assert!(!first.contains(&behind.event_id), "{behind:?} went out");
    }
    let error: String = sqlx::query_scalar(sqlx::AssertSqlSafe(db.sql(&format!(
        "SELECT last_error FROM {{s}}.events WHERE event_id = '{poison}'"
    ))))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        error.contains("poison row") && error.contains("requeue"),
        "{error}"
    );

    // The fleet is steady now: no more crashes, and the operator sees the dead letter.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for r in &mut relays {
        r.assert_running();
    }
    let mut list = outbox(Some(db.name()), None, Some(config.path()));
    list.args(["dead-letters", "list"]);
    let listed = run(list, Duration::from_secs(30)).await;
    assert!(listed.status.success(), "{listed:?}");
    assert!(
        listed.stdout.contains(&poison.to_string()) && listed.stdout.contains("poison row"),
        "{listed:?}"
    );

    // The cause fixed (relays without the crash point), the requeue delivers the rest in order.
    drop(relays);
    let _fixed = relay(&db, &broker, &config, None, "relay-fixed");
    let mut requeue = outbox(Some(db.name()), None, Some(config.path()));
    requeue.args(["dead-letters", "requeue", &poison.to_string()]);
    let requeued = run(requeue, Duration::from_secs(30)).await;
    assert!(requeued.status.success(), "{requeued:?}");
    let all: Vec<Uuid> = expected
        .iter()
        .copied()
        .chain(poisoned[2..].iter().map(|m| m.event_id))
        .collect();
    let seen = sub.wait_ids(&all, Duration::from_secs(30)).await;
    assert_first_appearances_in_order(seen);
    wait_until(Duration::from_secs(20), "every row settled", || {
        let db = &db;
        async move { db.count("true").await == 0 }
    })
    .await;
    db.drop().await;
    broker.cleanup().await;
}
