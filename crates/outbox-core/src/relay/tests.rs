use super::*;
use crate::message::{NewMessage, Payload};

#[test]
fn a_costly_gauge_refresh_spaces_the_next_one_out() {
    let interval = Duration::from_secs(5);
    assert_eq!(stats_wait(interval, Duration::from_millis(3)), interval);
    assert_eq!(stats_wait(interval, Duration::from_millis(250)), interval);
    assert_eq!(
        stats_wait(interval, Duration::from_secs(2)),
        Duration::from_secs(40)
    );
    assert_eq!(
        stats_wait(interval, Duration::from_secs(10)),
        STATS_MAX_WAIT
    );
    let long = Duration::from_secs(300);
    assert_eq!(stats_wait(long, Duration::from_secs(10)), long);
}

/// Rows of [`row`], one per `id:aggregate version` word of `spec` (`"3:a2"`: id 3, aggregate
/// `a`, version 2; one-letter aggregate ids).
fn rows(spec: &str) -> Vec<OutboxMessage> {
    let number = |s: &str| s.parse::<i64>().expect("a number in the spec");
    spec.split_whitespace()
        .map(|word| {
            let (id, rest) = word.split_once(':').expect("id:aggregate version");
            let (aggregate, version) = rest.split_at(1);
            row(number(id), aggregate, number(version))
        })
        .collect()
}

/// A row of aggregate type `payment` (also the activity's tests').
pub(super) fn row(id: i64, aggregate_id: &str, version: i64) -> OutboxMessage {
    let payload = Payload::json(&serde_json::json!({ "v": version })).unwrap();
    NewMessage::new("payment", aggregate_id, version, "PaymentUpdated", payload)
        .with_event_id(uuid::Uuid::from_u128(id as u128))
        .stored(id, chrono::Utc::now())
}

fn ids(messages: &[OutboxMessage]) -> Vec<i64> {
    messages.iter().map(|m| m.id).collect()
}

#[test]
fn a_head_taken_over_too_often_is_dead_lettered_with_the_rest_of_its_run_given_back() {
    // a: 1, 2, 3 (taken over twice); b: 4, 5 (not taken over); c: 6, 7 (three times).
    let batch = rows("1:a1 2:a2 3:a3 4:b1 5:b2 6:c1 7:c2");
    let takeovers = [
        Takeover {
            head: 1,
            count: 2,
            orphaned_for: None,
        },
        Takeover {
            head: 6,
            count: 3,
            orphaned_for: None,
        },
    ];
    let (publish, aside) = set_aside_takeovers(&batch, &takeovers, 3);
    assert_eq!(ids(&publish), [1, 2, 3, 4, 5]);
    assert_eq!(aside.not_attempted, [7]);
    assert_eq!(aside.failed.len(), 1);
    assert_eq!(aside.failed[0].id, 6);
    assert_eq!(
        aside.failed[0].retry_after, None,
        "dead letter, not a retry"
    );
    assert!(
        aside.failed[0].error.contains("poison row") && aside.failed[0].error.contains('3'),
        "{}",
        aside.failed[0].error
    );

    // Below the limit, or with the rule off, everything goes out.
    for limit in [4, 0] {
        let (publish, aside) = set_aside_takeovers(&batch, &takeovers, limit);
        assert_eq!(ids(&publish), ids(&batch));
        assert_eq!(aside, SetAside::default());
    }
}

#[test]
fn an_undecodable_row_is_dead_lettered_and_its_aggregate_stops_behind_it() {
    // a: 1, 2, [3 undecodable], 4, 5; b: 6, 7 (nothing wrong); c: [8 undecodable].
    let batch = rows("1:a1 2:a2 4:a4 5:a5 6:b1 7:b2");
    let bad = |id: i64, aggregate_id: &str, version: i64| UndecodableRow {
        id,
        event_id: None,
        aggregate_type: "payment".into(),
        aggregate_id: aggregate_id.into(),
        aggregate_version: version,
        reason: format!("column `headers`: header `h{id}` is null"),
    };
    let undecodable = [bad(3, "a", 3), bad(8, "c", 1)];
    let mut aside = SetAside::default();
    let publish = set_aside_undecodable(&batch, &undecodable, &mut aside);
    assert_eq!(ids(&publish), [1, 2, 6, 7]);
    assert_eq!(aside.not_attempted, [4, 5]);
    assert_eq!(
        aside.failed.iter().map(|f| f.id).collect::<Vec<_>>(),
        [3, 8]
    );
    assert!(aside.failed.iter().all(|f| f.retry_after.is_none()));
    assert!(
        aside.failed[0].error.contains("`h3` is null"),
        "{}",
        aside.failed[0].error
    );
}

#[test]
fn config_refuses_lease_shorter_than_publish_window() {
    let c = RelayConfig {
        lease: Duration::from_secs(5),
        publish_timeout: Duration::from_secs(10),
        ..RelayConfig::default()
    };
    let e = c.validate().unwrap_err();
    assert_eq!(e.key, "lease");
    assert!(RelayConfig::default().validate().is_ok());
    for (limit, ok) in [(0, true), (1, false), (2, false), (3, true)] {
        let c = RelayConfig {
            poison_after_takeovers: limit,
            ..RelayConfig::default()
        };
        assert_eq!(c.validate().is_ok(), ok, "poison_after_takeovers = {limit}");
    }
}
