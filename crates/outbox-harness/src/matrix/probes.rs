//! What the harness asks the database and the broker while a cell or the chaos run goes on:
//! is the system quiet yet, how many work items are open, did the takeover happen.

use std::path::Path;

use anyhow::Result;
use sqlx::AssertSqlSafe;

use super::env::Env;
use super::process::{Proc, count_in_log};

/// Leases whose time is up and that nobody took over (the takeover's upsert replaces them, a
/// settle deletes its own): in the lease cell, the frozen relay's.
pub(super) async fn expired_leases(env: &Env) -> Result<i64> {
    let s = env.schema.as_str();
    Ok(sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {s}.leases WHERE lease_until <= now()"
    )))
    .fetch_one(&env.pool)
    .await?)
}

/// After a crash before the producer's commit: the payment version it was writing must have
/// left nothing, neither business row nor intent.
pub(super) async fn check_in_flight(env: &Env, p: &Proc) -> Result<bool> {
    let last = p
        .lines
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("begin ").map(str::to_owned));
    let Some(last) = last else { return Ok(false) };
    let Some((id, v)) = last.split_once(" v") else {
        return Ok(false);
    };
    let v: i64 = v.parse().unwrap_or(0);
    let s = env.schema.as_str();
    let intents: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {s}.events WHERE aggregate_id = $1 AND aggregate_version = $2"
    )))
    .bind(id)
    .bind(v)
    .fetch_one(&env.pool)
    .await?;
    let status: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT status FROM {s}.payments WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(&env.pool)
    .await?;
    let row_clean = match v {
        1 => status.is_none(),
        _ => status.as_deref() == Some("created"),
    };
    Ok(intents == 0 && row_clean)
}

pub(super) struct EffStats {
    pub(super) unknown: i64,
    pub(super) open: i64,
    pub(super) items: i64,
}

pub(super) async fn effects_stats(env: &Env) -> Result<EffStats> {
    let s = env.schema.as_str();
    let (unknown, open, items): (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE state = 'unknown'), \
                count(*) FILTER (WHERE state IN ('pending', 'in_progress', 'unknown')), \
                count(*) FROM {s}.work_items"
    )))
    .fetch_one(&env.pool)
    .await?;
    Ok(EffStats {
        unknown,
        open,
        items,
    })
}

/// The frozen relay's settles after it woke up that changed nothing: marks the database
/// refused (fenced: "lease lost"), and marks that failed before they reached it ("mark
/// published: ..." store errors, e.g. its pool's wait for a connection ran out while the process
/// was stopped). Either way its stale marks did not apply; the cell's end checks (each event
/// applied once, order kept) hold the rest.
pub(super) fn stale_marks_blocked(log: &Path) -> usize {
    count_in_log(log, "lease lost") + count_in_log(log, "mark published: ")
}

/// Everything settled: outbox drained, every committed event applied, every payout resolved,
/// nothing waiting on the broker.
pub(super) async fn is_quiet(env: &Env, eff: &EffStats) -> Result<bool> {
    let s = env.schema.as_str();
    let (pending, expected, applied, payments): (i64, i64, i64, i64) =
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM {s}.events), \
                (SELECT count(*) + count(*) FILTER (WHERE status = 'captured') FROM {s}.payments), \
                (SELECT count(DISTINCT event_id) FROM {s}.effect_log), \
                (SELECT count(*) FROM {s}.payments)"
        )))
        .fetch_one(&env.pool)
        .await?;
    if pending != 0 || applied < expected || eff.open != 0 || eff.items < payments {
        return Ok(false);
    }
    Ok(env.broker_backlog().await.unwrap_or(u64::MAX) == 0)
}
