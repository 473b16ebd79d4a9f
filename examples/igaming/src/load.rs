//! The load driver of `igaming run`: concurrent punters and a settlement desk on the bets API.
//!
//! Bet `i` is placed by player `p-<i mod 53>` on market `m-<i mod 7>` at one of a few odds;
//! nine in ten bets are settled, every other one of those won. Each command has its own
//! `Idempotency-Key` and is sent again **with the same key** when it got no answer or a 5xx
//! (`support::load::Load::command`): a retry of a command that committed is answered
//! with the first answer. Every 25th placement is sent again after its answer and must come
//! back identical, marked as a replay; a few bad requests must get their documented 4xx.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};
use hyper::StatusCode;
use serde_json::{Value, json};

/// The odds the punters pick from.
const ODDS: [f64; 5] = [1.5, 1.91, 2.5, 3.75, 11.0];

/// The load of `igaming run`: its [`Progress`] and its [`LoadReport`].
pub type Load = support::load::Load<Progress, LoadReport>;

/// Counters the kill schedule and the progress lines read while the load runs (the retries,
/// replays and bad requests are counted by the [`Load`] itself).
#[derive(Debug, Default)]
pub struct Progress {
    /// Bets whose placement was answered 201.
    pub placed: AtomicU64,
    /// Bets whose settlement was answered 200.
    pub settled: AtomicU64,
}

/// What the load did, for the verification.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Bets accepted, as answered.
    pub placed: HashSet<String>,
    /// Bets settled won, as answered, with the payout answered.
    pub won: Vec<(String, i64)>,
    /// Bets settled lost, as answered.
    pub lost: HashSet<String>,
}

/// Sends the documented bad requests; the load counts those refused as documented.
///
/// # Errors
/// The API cannot be reached.
pub async fn probe_bad_requests(load: &Load) -> Result<()> {
    let config = &load.config;
    let key = |what: &str| format!("{}-probe-{what}", config.tag);
    let (bad, unprocessable) = (StatusCode::BAD_REQUEST, StatusCode::UNPROCESSABLE_ENTITY);
    let bet = json!({ "player": "p-probe", "market": "m-probe", "stake": 500, "odds": 2.0 });
    let with = |field: &str, value: Value| {
        let mut changed = bet.clone();
        changed[field] = value;
        changed
    };
    let bets = load.bad_requests(format!("{}/bets", config.api));
    bets.send_without_key("no Idempotency-Key", &bet, bad)
        .await?;
    let zero = with("stake", json!(0));
    bets.send("stake 0", &key("stake"), &zero, unprocessable)
        .await?;
    let odd = with("odds", json!(2.555));
    let what = "odds with three decimals";
    bets.send(what, &key("odds"), &odd, unprocessable).await?;
    let extra = with("bonus", json!(true));
    bets.send("unknown field", &key("field"), &extra, bad)
        .await?;
    // The same key with another stake: 422, and the first bet stays the only one.
    let created = StatusCode::CREATED;
    let first = bets
        .send("same key, first body", &key("same"), &bet, created)
        .await?;
    let other = with("stake", json!(501));
    bets.send("same key, other body", &key("same"), &other, unprocessable)
        .await?;
    let Some(id) = first.body["id"].as_str().map(str::to_owned) else {
        bail!("probe bet: no id in {}", first.body);
    };
    let settle = load.bad_requests(format!("{}/bets/{id}/settle", config.api));
    let outcome = |outcome: &str| json!({ "outcome": outcome });
    let (maybe, lost, won) = (outcome("maybe"), outcome("lost"), outcome("won"));
    settle
        .send("unknown outcome", &key("maybe"), &maybe, unprocessable)
        .await?;
    settle
        .send("settle lost", &key("lost"), &lost, StatusCode::OK)
        .await?;
    // Settled once: another settlement (another key) is refused and enqueues nothing.
    let conflict = StatusCode::CONFLICT;
    settle
        .send("settle twice", &key("again"), &won, conflict)
        .await?;
    let missing = load.bad_requests(format!("{}/bets/bet_missing/settle", config.api));
    let not_found = StatusCode::NOT_FOUND;
    missing
        .send("settle a missing bet", &key("missing"), &won, not_found)
        .await?;
    let mut report = load.report();
    report.placed.insert(id.clone());
    report.lost.insert(id);
    Ok(())
}

/// Runs the clients to the end (`Load::run_clients`).
///
/// # Errors
/// A command kept failing for `retry_for`, or an answer broke the API's contract.
pub async fn drive(load: Arc<Load>) -> Result<()> {
    load.run_clients(one_bet).await
}

async fn one_bet(load: Arc<Load>, i: u64) -> Result<()> {
    let config = &load.config;
    let place_key = format!("{}-place-{i}", config.tag);
    let url = format!("{}/bets", config.api);
    let body = json!({
        "player": format!("p-{:02}", i % 53),
        "market": format!("m-{}", i % 7),
        "stake": 100 + (i * 37) % 9900,
        "odds": ODDS[(i % ODDS.len() as u64) as usize],
    });
    let (id, placed) = load.create("place", &url, &place_key, &body).await?;
    load.progress.placed.fetch_add(1, Ordering::Relaxed);
    load.report().placed.insert(id.clone());
    if i.is_multiple_of(25) {
        load.replay_probe(&url, &place_key, &body, &placed).await?;
    }
    if i % 10 == 9 {
        return Ok(()); // left open: accepted, never settled
    }
    let outcome = if i.is_multiple_of(2) { "won" } else { "lost" };
    let settle_key = format!("{}-settle-{i}", config.tag);
    let url = format!("{}/bets/{id}/settle", config.api);
    let body = json!({ "outcome": outcome });
    let (settled, _) = load.command(&url, &settle_key, Some(&body)).await?;
    if settled.status != StatusCode::OK || settled.body["status"] != outcome {
        bail!(
            "settle {settle_key}: expected 200 {outcome}, got {} {}",
            settled.status,
            settled.body
        );
    }
    load.progress.settled.fetch_add(1, Ordering::Relaxed);
    let mut r = load.report();
    if outcome == "won" {
        let payout = settled.body["payout"].as_i64().unwrap_or(-1);
        r.won.push((id, payout));
    } else {
        r.lost.insert(id);
    }
    Ok(())
}
