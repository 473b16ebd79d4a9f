//! The scheduler's rules on a fake row type (pure logic; the feed suite holds a real log feed
//! to them end to end).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::Utc;

use super::*;
use crate::relay::{FailedRow, SettleReport, Settlement};

/// A fake log row: a message of aggregate type `payment` (its `attempts` count failed
/// attempts).
#[derive(Debug, Clone, PartialEq)]
struct FakeRow(OutboxMessage);

impl LogRow for FakeRow {
    fn id(&self) -> i64 {
        self.0.id
    }
    fn version(&self) -> i64 {
        self.0.aggregate_version
    }
    fn key(&self) -> (&str, &str) {
        (&self.0.aggregate_type, &self.0.aggregate_id)
    }
    fn attempted(&self) -> Self {
        let mut row = self.clone();
        row.0.attempts += 1;
        row
    }
    fn item(&self) -> LogItem<'_> {
        LogItem::Message(&self.0)
    }
    fn route(&self) -> (Option<&str>, &str) {
        (self.0.destination.as_deref(), &self.0.aggregate_type)
    }
}

fn row(id: i64, aggregate: &str, version: i64) -> FakeRow {
    FakeRow(crate::relay::tests::row(id, aggregate, version))
}

fn agg(id: &str) -> Aggregate {
    ("payment".into(), id.into())
}

fn tx(source_tx: u64, end: u64, rows: Vec<FakeRow>) -> LogEvent<FakeRow> {
    LogEvent::Transaction(LogTransaction {
        source_tx,
        end,
        complete: true,
        committed_at: Utc::now(),
        rows,
    })
}

fn ids(taken: &[Waiting<FakeRow>]) -> Vec<i64> {
    taken.iter().map(|w| w.row.0.id).collect()
}

/// Takes, batches and settles everything due with `settlement(ids)`.
fn settle_all(
    s: &mut LogScheduler<FakeRow>,
    settlement: impl Fn(&[i64]) -> Settlement,
) -> (Vec<i64>, SettleReport) {
    let taken = s.take(100);
    let taken_ids = ids(&taken);
    let (batch, _, _) = s.batch(taken);
    let report = s.settle_batch(&batch, &settlement(&taken_ids), &HashSet::new());
    (taken_ids, report)
}

fn publish(ids: &[i64]) -> Settlement {
    Settlement {
        published: ids.to_vec(),
        ..Settlement::default()
    }
}

#[test]
fn a_position_is_confirmed_only_once_every_earlier_transaction_is_settled() {
    let mut s = LogScheduler::default();
    s.receive(tx(1, 100, vec![row(1, "a", 1)]));
    s.receive(tx(2, 200, vec![row(2, "b", 1)]));
    let taken = s.take(100);
    assert_eq!(ids(&taken), vec![1, 2]);
    let (batch, messages, _) = s.batch(taken);
    assert_eq!(messages.len(), 2);
    // Only the second transaction's event is published: nothing can be confirmed.
    let report = s.settle_batch(
        &batch,
        &Settlement {
            published: vec![2],
            not_attempted: vec![1],
            ..Settlement::default()
        },
        &HashSet::new(),
    );
    assert_eq!((report.marked, report.released), (1, 1));
    assert_eq!(s.confirmable(), None);
    let (again, _) = settle_all(&mut s, publish);
    assert_eq!(again, vec![1]);
    assert_eq!(s.confirmable(), Some(200));
    assert_eq!(s.confirmable(), None, "a position is given once");
}

#[test]
fn an_incomplete_transaction_is_not_confirmed_before_its_last_part() {
    let mut s = LogScheduler::default();
    let part = |end, complete, rows| {
        LogEvent::Transaction(LogTransaction {
            source_tx: 7,
            end,
            complete,
            committed_at: Utc::now(),
            rows,
        })
    };
    s.receive(part(0, false, vec![row(1, "a", 1)]));
    settle_all(&mut s, publish);
    assert_eq!(s.confirmable(), None);
    s.receive(part(300, true, vec![row(2, "a", 2)]));
    assert!(s.oldest_open().is_some());
    settle_all(&mut s, publish);
    assert_eq!(s.confirmable(), Some(300));
    assert!(s.oldest_open().is_none());
}

#[test]
fn a_busy_aggregate_is_not_handed_out_again_before_its_batch_is_settled() {
    let mut s = LogScheduler::default();
    s.receive(tx(1, 100, vec![row(1, "a", 1)]));
    let first = s.take(100);
    s.receive(tx(2, 200, vec![row(2, "a", 2), row(3, "b", 1)]));
    assert_eq!(ids(&s.take(100)), vec![3], "only the other aggregate");
    let (batch, _, _) = s.batch(first);
    s.settle_batch(&batch, &publish(&[1]), &HashSet::new());
    assert_eq!(ids(&s.take(100)), vec![2]);
}

#[test]
fn a_retry_waits_at_the_head_of_its_aggregate_until_it_is_due() {
    let mut s = LogScheduler::default();
    s.receive(tx(1, 100, vec![row(1, "a", 1), row(2, "a", 2)]));
    let (_, report) = settle_all(&mut s, |_| Settlement {
        failed: vec![FailedRow {
            id: 1,
            error: "down".into(),
            retry_after: Some(Duration::from_millis(50)),
        }],
        not_attempted: vec![2],
        ..Settlement::default()
    });
    assert_eq!((report.retried, report.released), (1, 1));
    assert!(s.take(100).is_empty(), "in backoff");
    assert!(s.next_due().is_some());
    std::thread::sleep(Duration::from_millis(60));
    let taken = s.take(100);
    assert_eq!(ids(&taken), vec![1, 2]);
    assert_eq!(taken[0].row.0.attempts, 1);
    assert_eq!(taken[1].row.0.attempts, 0);
}

#[test]
fn a_dead_letter_parks_its_aggregate_and_leaves_its_later_events_to_the_table() {
    let mut s = LogScheduler::default();
    s.receive(tx(
        1,
        100,
        vec![row(1, "a", 1), row(2, "a", 2), row(3, "b", 1)],
    ));
    let (_, report) = settle_all(&mut s, |_| Settlement {
        failed: vec![FailedRow {
            id: 1,
            error: "refused".into(),
            retry_after: None,
        }],
        not_attempted: vec![2],
        published: vec![3],
    });
    assert_eq!(report.dead_lettered, 1);
    s.receive(tx(2, 200, vec![row(4, "a", 3)]));
    assert!(s.take(100).is_empty());
    let left: Vec<(i64, bool)> = s
        .restore_list()
        .iter()
        .map(|l| (l.event.row.0.id, l.dead.is_some()))
        .collect();
    assert_eq!(left, vec![(1, true), (2, false), (4, false)]);
    assert_eq!(s.confirmable(), None, "not before the table has them");
    // The store recorded all but row 4 (its transaction not visible yet).
    s.restored(&HashSet::from([4]));
    assert_eq!(s.confirmable(), Some(100));
    assert!(
        s.parked_settled().is_empty(),
        "row 4 is still being recorded"
    );
    s.restored(&HashSet::new());
    assert_eq!(s.confirmable(), Some(200));
    assert_eq!(s.parked_settled(), vec![&agg("a")]);
    s.reset();
    assert!(s.has_parked(), "parking outlives a session");
}

#[test]
fn a_late_row_is_confirmed_once_a_snapshot_sees_it() {
    let mut s = LogScheduler::default();
    s.receive(tx(1, 100, vec![row(1, "a", 1)]));
    let taken = s.take(100);
    let (batch, _, _) = s.batch(taken);
    s.settle_batch(&batch, &publish(&[1]), &HashSet::from([1]));
    assert_eq!(s.confirmable(), None);
    assert_eq!(s.late_rows().len(), 1);
    s.late_settled(&HashSet::from([1]));
    assert_eq!(s.confirmable(), None, "still not visible");
    s.late_settled(&HashSet::new());
    assert_eq!(s.confirmable(), Some(100));
}

#[test]
fn rows_of_the_catch_up_are_skipped_until_the_log_passes_its_end() {
    let mut s = LogScheduler::default();
    s.skip(1);
    s.caught_up(Vec::new(), 150);
    s.receive(tx(1, 100, vec![row(1, "a", 1), row(2, "a", 2)]));
    assert_eq!(ids(&s.take(100)), vec![2]);
    s.receive(LogEvent::Idle { position: 160 });
    s.receive(tx(2, 200, vec![row(1, "c", 1)]));
    assert_eq!(ids(&s.take(100)), vec![1], "past the catch-up's end");
}

#[test]
fn a_settle_of_an_older_session_changes_nothing() {
    let mut s = LogScheduler::default();
    s.receive(tx(1, 100, vec![row(1, "a", 1)]));
    let taken = s.take(100);
    let (batch, _, _) = s.batch(taken);
    s.reset();
    let report = s.settle_batch(&batch, &publish(&[1]), &HashSet::new());
    assert_eq!((report.marked, report.released), (0, 1));
    assert_eq!(s.session(), 1);
    assert_eq!(s.held(), 0);
}

#[test]
fn an_aggregate_behind_the_table_is_held_parked_or_restarts_the_session() {
    let mut s = LogScheduler::default();
    s.receive(tx(
        1,
        100,
        vec![row(1, "a", 2), row(2, "b", 5), row(3, "c", 1)],
    ));
    let taken = s.take(100);
    let heads = s.unverified_heads(&taken);
    assert_eq!(heads.len(), 3);
    let a = agg("a");
    let b = agg("b");
    let behind = HashMap::from([(a.clone(), false), (b.clone(), true)]);
    let Behind::Go(go) = s.hold_behind(heads, taken, &behind) else {
        panic!("no restart yet");
    };
    assert_eq!(ids(&go), vec![3], "c is verified, a is held, b is parked");
    assert!(
        s.parked_settled().is_empty(),
        "b's event is left to the table"
    );
    assert!(s.next_due().is_some_and(|d| d > Instant::now()));
    assert!(s.unverified_heads(&go).is_empty(), "c is verified now");
    // Held past the patience: the session restarts.
    s.behind.insert(a.clone(), Instant::now() - BEHIND_PATIENCE);
    std::thread::sleep(BEHIND_RECHECK);
    let taken = s.take(100);
    let heads = s.unverified_heads(&taken);
    match s.hold_behind(heads, taken, &behind) {
        Behind::Restart(aggregate) => assert_eq!(aggregate, a),
        Behind::Go(go) => panic!("expected a restart, got {:?}", ids(&go)),
    }
}

#[test]
fn an_aggregate_whose_next_event_goes_to_a_paused_route_waits_in_the_table() {
    let mut s = LogScheduler::default();
    let mut held = row(2, "a", 2);
    held.0.destination = Some("held".into());
    s.receive(tx(
        1,
        100,
        vec![row(1, "a", 1), held, row(3, "a", 3), row(4, "b", 1)],
    ));
    assert!(s.set_paused_routes(["destination:held".to_owned()]));
    assert!(
        !s.set_paused_routes(["destination:held".to_owned()]),
        "nothing new"
    );
    // Up to the paused event; the other aggregate as usual.
    let (first, _) = settle_all(&mut s, publish);
    assert_eq!(first, vec![1, 4]);
    // Its head is on the paused route now: parked, the later version with it.
    assert!(s.take(100).is_empty());
    let left: Vec<i64> = s.restore_list().iter().map(|l| l.event.row.0.id).collect();
    assert_eq!(left, vec![2, 3]);
    s.receive(tx(2, 200, vec![row(5, "a", 4)]));
    assert_eq!(
        s.restore_list().len(),
        3,
        "a later event waits in the table too"
    );
    s.restored(&HashSet::new());
    assert_eq!(s.confirmable(), Some(200));
    s.reset();
    assert!(
        !s.set_paused_routes(["destination:held".to_owned()]),
        "kept across sessions"
    );
}
