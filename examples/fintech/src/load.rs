//! The load driver of `fintech run`: concurrent clients of the payments API.
//!
//! Each client creates its share of the payments and captures nine in ten of them, each
//! command with an `Idempotency-Key` of its own. A request that fails without an answer (the
//! API was killed, a timeout) or with a 5xx is sent again **with the same key** until it gets
//! an answer: the API answers a retry of a command that did commit with the first answer, so
//! nothing is created or captured twice, however the crash fell. Any other 4xx is a bug and
//! stops the run.
//!
//! Besides, the driver checks request idempotency from the outside: every 25th create is sent
//! again after its answer (it must come back identical, marked as a replay), and a few bad
//! requests must be refused with the documented 4xx.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};
use hyper::{Method, StatusCode};
use serde_json::json;

/// The load of `fintech run`: its [`Progress`] and its [`LoadReport`].
pub type Load = support::load::Load<Progress, LoadReport>;

/// Counters the kill schedule and the progress lines read while the load runs (the retries,
/// replays and bad requests are counted by the [`Load`] itself).
#[derive(Debug, Default)]
pub struct Progress {
    /// Payments whose create was answered 201.
    pub created: AtomicU64,
    /// Payments whose capture was answered 200.
    pub captured: AtomicU64,
}

/// What the load did, for the verification.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// Ids of the payments created (as answered).
    pub created: HashSet<String>,
    /// Ids of the payments captured (as answered).
    pub captured: HashSet<String>,
}

/// Sends the documented bad requests; the load counts those refused as documented.
///
/// # Errors
/// The API cannot be reached.
pub async fn probe_bad_requests(load: &Load) -> Result<()> {
    let config = &load.config;
    let url = format!("{}/payments", config.api);
    let good = json!({ "account": "acc-probe", "amount": 500 });
    let (bad, unprocessable) = (StatusCode::BAD_REQUEST, StatusCode::UNPROCESSABLE_ENTITY);
    let payments = load.bad_requests(&url);
    payments
        .send_without_key("no Idempotency-Key", &good, bad)
        .await?;
    let zero = json!({ "account": "acc-probe", "amount": 0 });
    payments
        .send("amount 0", "probe-amount", &zero, unprocessable)
        .await?;
    let extra = json!({ "account": "acc-probe", "amount": 5, "currency": "EUR" });
    payments
        .send("unknown field", "probe-field", &extra, bad)
        .await?;
    // The same key with another body: 422, and the first payment stays the only one.
    let key = format!("{}-probe-1", config.tag);
    let headers = [("idempotency-key", key.as_str())];
    let first = load
        .http
        .send(Method::POST, &url, &headers, Some(&good))
        .await?;
    let other = json!({ "account": "acc-probe", "amount": 501 });
    let second = load
        .http
        .send(Method::POST, &url, &headers, Some(&other))
        .await?;
    let refused = first.status == StatusCode::CREATED && second.status == unprocessable;
    load.count_bad_request(refused);
    if !refused {
        eprintln!(
            "probe `same key, other body`: expected 201 then 422, got {} then {}",
            first.status, second.status
        );
    }
    if let Some(id) = first.body["id"].as_str() {
        load.report().created.insert(id.to_owned());
    }
    // A capture of a payment that does not exist.
    let capture = load.bad_requests(format!("{}/payments/pay_missing/capture", config.api));
    let not_found = StatusCode::NOT_FOUND;
    capture
        .send("missing payment", "probe-missing", None, not_found)
        .await?;
    Ok(())
}

/// Runs the clients to the end (`Load::run_clients`): payment `i` of the load is created, and
/// captured unless `i` is a multiple of 10.
///
/// # Errors
/// A command kept failing for `retry_for`, or an answer broke the API's contract.
pub async fn drive(load: Arc<Load>) -> Result<()> {
    load.run_clients(one_payment).await
}

async fn one_payment(load: Arc<Load>, i: u64) -> Result<()> {
    let config = &load.config;
    let create_key = format!("{}-create-{i}", config.tag);
    let body = json!({ "account": format!("acc-{:03}", i % 97), "amount": 100 + (i % 4900) });
    let url = format!("{}/payments", config.api);
    let (id, created) = load.create("create", &url, &create_key, &body).await?;
    load.progress.created.fetch_add(1, Ordering::Relaxed);
    load.report().created.insert(id.clone());
    if i.is_multiple_of(25) {
        load.replay_probe(&url, &create_key, &body, &created)
            .await?;
    }
    if !i.is_multiple_of(10) {
        let capture_key = format!("{}-capture-{i}", config.tag);
        let url = format!("{}/payments/{id}/capture", config.api);
        let (captured, _) = load.command(&url, &capture_key, None).await?;
        if captured.status != StatusCode::OK || captured.body["status"] != "captured" {
            bail!(
                "capture {capture_key}: expected 200, got {} {}",
                captured.status,
                captured.body
            );
        }
        load.progress.captured.fetch_add(1, Ordering::Relaxed);
        load.report().captured.insert(id);
    }
    Ok(())
}
