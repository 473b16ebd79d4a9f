//! Chaos runs (`outbox crash-matrix --chaos`): a steady workload while relays, the consumer and
//! the executor are SIGKILLed at random moments and the broker is restarted once. Zero lost
//! events, zero duplicate effects, order intact; wire duplicates are reported.
//!
//! Both brokers run in one test, one after the other: restarting a broker must not hit another
//! test of this binary.
#![allow(missing_docs)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

fn restart_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/restart-broker")
}

async fn chaos(broker_url: &str, broker: &str, prefix: &str) {
    let log_dir = std::env::temp_dir().join(format!("outbox-test-{prefix}"));
    let _ = std::fs::remove_dir_all(&log_dir);
    let secs: u64 = std::env::var("OUTBOX_TEST_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let mut cmd = common::outbox(None, Some(broker_url), None);
    cmd.arg("crash-matrix")
        .arg("--chaos")
        .arg(format!("--chaos-secs={secs}"))
        .arg(format!("--prefix={prefix}"))
        .arg(format!("--log-dir={}", log_dir.display()))
        .arg(format!(
            "--broker-restart-cmd={} {broker}",
            restart_script().display()
        ));
    let out = common::run(cmd, Duration::from_secs(secs + 300)).await;
    let (stdout, stderr) = (&out.stdout, &out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("chaos on {broker}: PASS")),
        "{stdout}"
    );
    assert!(
        stdout.contains("| lost events / duplicate effects / order violations | 0 / 0 / 0 |"),
        "{stdout}"
    );
    assert!(stdout.contains("| broker restarts | 1 |"), "{stdout}");
    let kills: u32 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("| kills (SIGKILL) | "))
        .and_then(|r| r.split(':').next())
        .and_then(|n| n.trim().parse().ok())
        .expect("kills line");
    assert!(kills >= 3, "only {kills} kills:\n{stdout}");
    assert!(stdout.contains("| wire duplicates seen | "), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn chaos_loses_nothing_and_applies_once_on_both_brokers() {
    chaos(&common::nats_url(), "nats", "cmt_chaos_nats").await;
    chaos(&common::amqp_url(), "rabbitmq", "cmt_chaos_rabbit").await;
}
