//! The invariants, checked once the system is quiet: with SQL, with what the independent
//! subscriber saw on the broker, and with the provider's own ledger.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context as _, Result};
use outbox_http::HttpPayoutProvider;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use super::CONSUMER;
use super::env::Env;
use crate::observer::Seen;
use crate::workload::rolled_back;

/// Adds "`n` `what`" to `v` when `n` is not zero.
fn flag(v: &mut Vec<String>, n: usize, what: &str) {
    if n > 0 {
        v.push(format!("{n} {what}"));
    }
}

pub(super) struct Check {
    pub(super) violations: Vec<String>,
    pub(super) summary: String,
    pub(super) wire_duplicates: usize,
    pub(super) double_payouts: usize,
    pub(super) missing_payouts: usize,
}

/// What the independent subscriber's view of the wire adds up to.
struct Wire {
    duplicates: usize,
    missing: usize,
}

/// What the provider's ledger adds up to.
struct Payouts {
    double: usize,
    missing: usize,
    total: usize,
}

/// Checks the invariants once the system is quiet. `wire_strict`: every intent must have been
/// seen by the independent subscriber (false in chaos runs, where the subscriber itself loses
/// its connection while the broker restarts).
pub(super) async fn check_invariants(
    env: &Env,
    seen: &[Seen],
    payouts: Result<Vec<(String, String)>>,
    wire_strict: bool,
) -> Result<Check> {
    let s = env.schema.as_str();
    let pool = &env.pool;
    let mut v = Vec::new();
    let payments: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, status FROM {s}.payments ORDER BY id"
    )))
    .fetch_all(pool)
    .await?;
    let expected = expected_events(&payments);
    check_rolled_back(&payments, &mut v);
    check_drained(pool, s, &mut v).await?;
    let wire = check_wire(seen, &expected, wire_strict, &mut v);
    let applied_once = check_consumer(pool, s, &expected, &mut v).await?;
    check_consumer_failures(pool, s, &mut v).await?;
    check_work_items(pool, s, &payments, &mut v).await?;
    let paid = check_payouts(payouts, &payments, &mut v);
    let summary = format!(
        "{} payments, {} events: {} applied once, {} payouts, {} paid twice{}",
        payments.len(),
        expected.len(),
        applied_once,
        paid.total,
        paid.double,
        if wire_strict || wire.missing == 0 {
            String::new()
        } else {
            format!(
                ", {} not seen by the subscriber (it reconnects)",
                wire.missing
            )
        }
    );
    Ok(Check {
        violations: v,
        summary,
        wire_duplicates: wire.duplicates,
        double_payouts: paid.double,
        missing_payouts: paid.missing,
    })
}

/// Every committed event: version 1 of each payment, version 2 of the captured ones.
fn expected_events(payments: &[(String, String)]) -> HashSet<(String, i64)> {
    let mut expected: HashSet<(String, i64)> = HashSet::new();
    for (id, status) in payments {
        expected.insert((id.clone(), 1));
        if status == "captured" {
            expected.insert((id.clone(), 2));
        }
    }
    expected
}

/// G1: a payment whose transaction rolled back on purpose has no business row.
fn check_rolled_back(payments: &[(String, String)], v: &mut Vec<String>) {
    let rolled_back_ids: HashSet<String> = payments_rolled_back(payments);
    for (id, _) in payments {
        if rolled_back_ids.contains(id) {
            v.push(format!("rolled-back payment {id} has a business row"));
        }
    }
}

/// G1 / drained: no intent left, none dead.
async fn check_drained(pool: &PgPool, s: &str, v: &mut Vec<String>) -> Result<()> {
    let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {s}.events")))
        .fetch_one(pool)
        .await?;
    if left != 0 {
        v.push(format!("{left} intents still in the outbox"));
    }
    Ok(())
}

/// The wire, as the independent subscriber saw it: every committed intent (when
/// `wire_strict`), nothing else, one event id per intent (G4), per-aggregate order (G7).
fn check_wire(
    seen: &[Seen],
    expected: &HashSet<(String, i64)>,
    wire_strict: bool,
    v: &mut Vec<String>,
) -> Wire {
    let mut ids_of: HashMap<(String, i64), HashSet<Uuid>> = HashMap::new();
    let mut first_seen: HashSet<Uuid> = HashSet::new();
    let mut last_version: HashMap<&str, i64> = HashMap::new();
    let mut wire_order = 0;
    for m in seen {
        ids_of
            .entry((m.aggregate_id.clone(), m.version))
            .or_default()
            .insert(m.event_id);
        if first_seen.insert(m.event_id) {
            let l = last_version.entry(&m.aggregate_id).or_insert(0);
            if m.version <= *l {
                wire_order += 1;
            }
            *l = m.version;
        }
    }
    let wire_duplicates = seen.len() - first_seen.len();
    let wire_missing = expected.iter().filter(|k| !ids_of.contains_key(*k)).count();
    let wire_leaked = ids_of.keys().filter(|k| !expected.contains(*k)).count();
    let regenerated = ids_of.values().filter(|ids| ids.len() > 1).count();
    if wire_strict && wire_missing > 0 {
        v.push(format!(
            "{wire_missing} committed intents never seen on the wire"
        ));
    }
    flag(
        v,
        wire_leaked,
        "events on the wire without a committed intent",
    );
    flag(
        v,
        regenerated,
        "intents published under several event ids (G4)",
    );
    flag(
        v,
        wire_order,
        "per-aggregate order violations on the wire (G7)",
    );
    Wire {
        duplicates: wire_duplicates,
        missing: wire_missing,
    }
}

/// The consumer's effects: one per event (G5), none lost, none without an intent, in
/// per-aggregate order. Answers how many events were applied exactly once.
async fn check_consumer(
    pool: &PgPool,
    s: &str,
    expected: &HashSet<(String, i64)>,
    v: &mut Vec<String>,
) -> Result<usize> {
    let log: Vec<(Uuid, String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT event_id, aggregate_id, aggregate_version FROM {s}.effect_log \
         WHERE consumer_name = $1 ORDER BY seq"
    )))
    .bind(CONSUMER)
    .fetch_all(pool)
    .await?;
    let mut per_event: HashMap<Uuid, usize> = HashMap::new();
    let mut applied: HashSet<(String, i64)> = HashSet::new();
    let mut consumer_order = 0;
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (id, agg, ver) in &log {
        *per_event.entry(*id).or_default() += 1;
        applied.insert((agg.clone(), *ver));
        let l = last.entry(agg.as_str()).or_insert(0);
        if *ver <= *l {
            consumer_order += 1;
        }
        *l = (*l).max(*ver);
    }
    let duplicate_effects = per_event.values().filter(|n| **n > 1).count();
    let lost = expected.iter().filter(|k| !applied.contains(*k)).count();
    let phantom = applied.iter().filter(|k| !expected.contains(*k)).count();
    flag(v, duplicate_effects, "events applied more than once (G5)");
    flag(v, lost, "committed events never applied by the consumer");
    flag(v, phantom, "effects without a committed intent");
    flag(
        v,
        consumer_order,
        "per-aggregate order violations at the consumer",
    );
    Ok(per_event.values().filter(|n| **n == 1).count())
}

/// No inbox conflict and no consumer dead letter.
async fn check_consumer_failures(pool: &PgPool, s: &str, v: &mut Vec<String>) -> Result<()> {
    let (conflicts, consumer_dead): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM {s}.inbox_conflicts), \
                (SELECT count(*) FROM {s}.consumer_dead_letters)"
    )))
    .fetch_one(pool)
    .await?;
    if conflicts + consumer_dead > 0 {
        v.push(format!(
            "{conflicts} inbox conflicts, {consumer_dead} consumer dead letters"
        ));
    }
    Ok(())
}

/// Payouts: one work item per payment, all resolved.
async fn check_work_items(
    pool: &PgPool,
    s: &str,
    payments: &[(String, String)],
    v: &mut Vec<String>,
) -> Result<()> {
    let items: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT payload->>'reference', state FROM {s}.work_items"
    )))
    .fetch_all(pool)
    .await?;
    let mut items_per_payment: HashMap<&str, usize> = HashMap::new();
    for (r, state) in &items {
        *items_per_payment.entry(r.as_str()).or_default() += 1;
        if state != "succeeded" {
            v.push(format!("work item for {r} ended {state}"));
        }
    }
    if items.len() != payments.len() || items_per_payment.values().any(|n| *n != 1) {
        v.push(format!(
            "{} payout work items for {} payments",
            items.len(),
            payments.len()
        ));
    }
    Ok(())
}

/// The provider's ledger: every payment paid out; how many twice.
fn check_payouts(
    payouts: Result<Vec<(String, String)>>,
    payments: &[(String, String)],
    v: &mut Vec<String>,
) -> Payouts {
    match payouts {
        Ok(list) => {
            let mut per: BTreeMap<&str, usize> = BTreeMap::new();
            for (reference, _) in &list {
                *per.entry(reference.as_str()).or_default() += 1;
            }
            let missing = payments
                .iter()
                .filter(|(id, _)| !per.contains_key(id.as_str()))
                .count();
            let double = per.values().filter(|n| **n > 1).count();
            if missing > 0 {
                v.push(format!("{missing} payments never paid out"));
            }
            Payouts {
                double,
                missing,
                total: list.len(),
            }
        }
        Err(e) => {
            v.push(format!("cannot read the provider's payouts: {e:#}"));
            Payouts {
                double: 0,
                missing: 0,
                total: 0,
            }
        }
    }
}

fn payments_rolled_back(payments: &[(String, String)]) -> HashSet<String> {
    payments
        .iter()
        .filter_map(|(id, _)| {
            let i: u64 = id.strip_prefix("pay-")?.parse().ok()?;
            rolled_back(i, crate::workload::DEFAULT_ROLLBACK_EVERY).then(|| id.clone())
        })
        .collect()
}

/// `(reference, payout_id)` of every payout the provider made.
pub(super) async fn provider_payouts(base: &str) -> Result<Vec<(String, String)>> {
    let list = tokio::time::timeout(
        Duration::from_secs(10),
        HttpPayoutProvider::new(base)?.stand_in_payouts(),
    )
    .await
    .context("the provider did not answer GET /payouts within 10 s")??;
    Ok(list
        .iter()
        .map(|p| {
            (
                p["reference"].as_str().unwrap_or("").to_owned(),
                p["payout_id"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect())
}
