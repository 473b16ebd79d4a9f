//! The load driver of `igaming run`: concurrent punters and a settlement desk on the bets API.
//!
//! Bet `i` is placed by player `p-<i mod 53>` on market `m-<i mod 7>` at one of a few odds;
//! nine in ten bets are settled, every other one of those won. Each command has its own
//! `Idempotency-Key` and is sent again **with the same key** when it got no answer or a 5xx
//! (`support::load::Load::command`): a retry of a command that committed is answered
//! with the first answer. Every 25th placement is sent again after its answer and must come
//! back identical, marked as a replay; a few bad requests must get their documented 4xx.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Result, bail};
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use support::load::Load;

/// The odds the punters pick from.
const ODDS: [f64; 5] = [1.5, 1.91, 2.5, 3.75, 11.0];

/// Counters read while the load runs (kill schedule, progress lines); the retries are counted
/// by the [`Load`].
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
    /// Placements answered 201 on a retry marked as a replay: the first attempt committed but
    /// its answer was lost.
    pub replayed_after_failure: u64,
    /// Replay probes sent, and those answered exactly like the first time.
    pub replay_probes: (u64, u64),
    /// Bad requests sent, and those refused with the documented 4xx.
    pub bad_requests: (u64, u64),
}

/// Sends the documented bad requests; the report counts those refused as documented.
///
/// # Errors
/// The API cannot be reached.
pub async fn probe_bad_requests(load: &Load, report: &mut LoadReport) -> Result<()> {
    let (http, config) = (&load.http, &load.config);
    let bets = format!("{}/bets", config.api);
    let bet = json!({ "player": "p-probe", "market": "m-probe", "stake": 500, "odds": 2.0 });
    let key = |what: &str| format!("{}-probe-{what}", config.tag);
    let mut expect = |what: &str, got: StatusCode, expected: StatusCode| {
        report.bad_requests.0 += 1;
        if got == expected {
            report.bad_requests.1 += 1;
        } else {
            eprintln!("probe `{what}`: expected {expected}, got {got}");
        }
    };
    let post = |url: String, k: Option<String>, body: Value| {
        let http = http.clone();
        async move {
            let headers: Vec<(&str, &str)> = match &k {
                Some(k) => vec![("idempotency-key", k.as_str())],
                None => vec![],
            };
            http.send(Method::POST, &url, &headers, Some(&body)).await
        }
    };
    let a = post(bets.clone(), None, bet.clone()).await?;
    expect("no Idempotency-Key", a.status, StatusCode::BAD_REQUEST);
    let mut zero = bet.clone();
    zero["stake"] = json!(0);
    let a = post(bets.clone(), Some(key("stake")), zero).await?;
    expect("stake 0", a.status, StatusCode::UNPROCESSABLE_ENTITY);
    let mut odd = bet.clone();
    odd["odds"] = json!(2.555);
    let a = post(bets.clone(), Some(key("odds")), odd).await?;
    expect(
        "odds with three decimals",
        a.status,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    let mut extra = bet.clone();
    extra["bonus"] = json!(true);
    let a = post(bets.clone(), Some(key("field")), extra).await?;
    expect("unknown field", a.status, StatusCode::BAD_REQUEST);
    // The same key with another stake: 422, and the first bet stays the only one.
    let first = post(bets.clone(), Some(key("same")), bet.clone()).await?;
    let mut other = bet.clone();
    other["stake"] = json!(501);
    let second = post(bets.clone(), Some(key("same")), other).await?;
    expect("same key, first body", first.status, StatusCode::CREATED);
    expect(
        "same key, other body",
        second.status,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    let Some(id) = first.body["id"].as_str().map(str::to_owned) else {
        bail!("probe bet: no id in {}", first.body);
    };
    let settle = format!("{}/bets/{id}/settle", config.api);
    let a = post(
        settle.clone(),
        Some(key("maybe")),
        json!({ "outcome": "maybe" }),
    )
    .await?;
    expect(
        "unknown outcome",
        a.status,
        StatusCode::UNPROCESSABLE_ENTITY,
    );
    let a = post(
        settle.clone(),
        Some(key("lost")),
        json!({ "outcome": "lost" }),
    )
    .await?;
    expect("settle lost", a.status, StatusCode::OK);
    // Settled once: another settlement (another key) is refused and enqueues nothing.
    let a = post(settle, Some(key("again")), json!({ "outcome": "won" })).await?;
    expect("settle twice", a.status, StatusCode::CONFLICT);
    let missing = format!("{}/bets/bet_missing/settle", config.api);
    let a = post(missing, Some(key("missing")), json!({ "outcome": "won" })).await?;
    expect("settle a missing bet", a.status, StatusCode::NOT_FOUND);
    report.placed.insert(id.clone());
    report.lost.insert(id);
    Ok(())
}

/// Runs the clients to the end (`Load::run_clients`).
///
/// # Errors
/// A command kept failing for `retry_for`, or an answer broke the API's contract.
pub async fn drive(
    load: Arc<Load>,
    progress: Arc<Progress>,
    report: Arc<Mutex<LoadReport>>,
) -> Result<()> {
    load.run_clients(move |load, i| {
        let (progress, report) = (Arc::clone(&progress), Arc::clone(&report));
        async move { one_bet(&load, &progress, &report, i).await }
    })
    .await
}

async fn one_bet(
    load: &Load,
    progress: &Progress,
    report: &Mutex<LoadReport>,
    i: u64,
) -> Result<()> {
    let config = &load.config;
    let place_key = format!("{}-place-{i}", config.tag);
    let url = format!("{}/bets", config.api);
    let body = json!({
        "player": format!("p-{:02}", i % 53),
        "market": format!("m-{}", i % 7),
        "stake": 100 + (i * 37) % 9900,
        "odds": ODDS[(i % ODDS.len() as u64) as usize],
    });
    let (placed, retried) = load.command(&url, &place_key, Some(&body)).await?;
    let id = match (placed.status, placed.body["id"].as_str()) {
        (StatusCode::CREATED, Some(id)) => id.to_owned(),
        _ => bail!(
            "place {place_key}: expected 201 with an id, got {} {}",
            placed.status,
            placed.body
        ),
    };
    progress.placed.fetch_add(1, Ordering::Relaxed);
    {
        let mut r = report.lock().expect("report lock");
        r.placed.insert(id.clone());
        r.replayed_after_failure += u64::from(retried && placed.replayed);
    }
    if i.is_multiple_of(25) {
        let (again, _) = load.command(&url, &place_key, Some(&body)).await?;
        let same =
            again.status == StatusCode::CREATED && again.replayed && again.body == placed.body;
        let mut r = report.lock().expect("report lock");
        r.replay_probes.0 += 1;
        r.replay_probes.1 += u64::from(same);
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
    progress.settled.fetch_add(1, Ordering::Relaxed);
    let mut r = report.lock().expect("report lock");
    if outcome == "won" {
        let payout = settled.body["payout"].as_i64().unwrap_or(-1);
        r.won.push((id, payout));
    } else {
        r.lost.insert(id);
    }
    Ok(())
}
