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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Result, bail};
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use support::load::Load;

/// Counters the chaos schedule and the progress lines read while the load runs (the retries
/// are counted by the [`Load`]).
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
    /// Creates answered 201 on a retry marked as a replay: the first attempt had committed
    /// but its answer was lost.
    pub replayed_after_failure: u64,
    /// Replay probes sent (the same create sent again after its answer).
    pub replay_probes: u64,
    /// Replay probes answered exactly like the first time and marked as a replay.
    pub replay_probes_identical: u64,
    /// Bad requests sent.
    pub bad_requests: u64,
    /// Bad requests refused with the documented 4xx.
    pub bad_requests_refused: u64,
}

/// Sends the documented bad requests; the report counts those refused as documented.
///
/// # Errors
/// The API cannot be reached.
pub async fn probe_bad_requests(load: &Load, report: &mut LoadReport) -> Result<()> {
    let (http, config) = (&load.http, &load.config);
    let url = format!("{}/payments", config.api);
    let key = format!("{}-probe-1", config.tag);
    let good = json!({ "account": "acc-probe", "amount": 500 });
    type Probe<'a> = (&'a str, Vec<(&'a str, &'a str)>, Value, StatusCode);
    let probes: Vec<Probe> = vec![
        (
            "no Idempotency-Key",
            vec![],
            good.clone(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "amount 0",
            vec![("idempotency-key", "probe-amount")],
            json!({ "account": "acc-probe", "amount": 0 }),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            "unknown field",
            vec![("idempotency-key", "probe-field")],
            json!({ "account": "acc-probe", "amount": 5, "currency": "EUR" }),
            StatusCode::BAD_REQUEST,
        ),
    ];
    for (what, headers, body, expected) in probes {
        let a = http.send(Method::POST, &url, &headers, Some(&body)).await?;
        report.bad_requests += 1;
        if a.status == expected {
            report.bad_requests_refused += 1;
        } else {
            eprintln!(
                "probe `{what}`: expected {expected}, got {} {}",
                a.status, a.body
            );
        }
    }
    // The same key with another body: 422, and the first payment stays the only one.
    let first = http
        .send(
            Method::POST,
            &url,
            &[("idempotency-key", &key)],
            Some(&good),
        )
        .await?;
    let other = json!({ "account": "acc-probe", "amount": 501 });
    let second = http
        .send(
            Method::POST,
            &url,
            &[("idempotency-key", &key)],
            Some(&other),
        )
        .await?;
    report.bad_requests += 1;
    if first.status == StatusCode::CREATED && second.status == StatusCode::UNPROCESSABLE_ENTITY {
        report.bad_requests_refused += 1;
    } else {
        eprintln!(
            "probe `same key, other body`: expected 201 then 422, got {} then {}",
            first.status, second.status
        );
    }
    if let Some(id) = first.body["id"].as_str() {
        report.created.insert(id.to_owned());
    }
    // A capture of a payment that does not exist.
    let missing = http
        .send(
            Method::POST,
            &format!("{}/payments/pay_missing/capture", config.api),
            &[("idempotency-key", "probe-missing")],
            None,
        )
        .await?;
    report.bad_requests += 1;
    if missing.status == StatusCode::NOT_FOUND {
        report.bad_requests_refused += 1;
    }
    Ok(())
}

/// Runs the clients to the end (`Load::run_clients`): payment `i` of the load is created, and
/// captured unless `i` is a multiple of 10.
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
        async move { one_payment(&load, &progress, &report, i).await }
    })
    .await
}

async fn one_payment(
    load: &Load,
    progress: &Progress,
    report: &Mutex<LoadReport>,
    i: u64,
) -> Result<()> {
    let config = &load.config;
    let create_key = format!("{}-create-{i}", config.tag);
    let body = json!({ "account": format!("acc-{:03}", i % 97), "amount": 100 + (i % 4900) });
    let url = format!("{}/payments", config.api);
    let (created, retried) = load.command(&url, &create_key, Some(&body)).await?;
    if created.status != StatusCode::CREATED {
        bail!(
            "create {create_key}: expected 201, got {} {}",
            created.status,
            created.body
        );
    }
    let Some(id) = created.body["id"].as_str().map(str::to_owned) else {
        bail!("create {create_key}: no id in {}", created.body);
    };
    progress.created.fetch_add(1, Ordering::Relaxed);
    {
        let mut r = report.lock().expect("report lock");
        r.created.insert(id.clone());
        if retried && created.replayed {
            r.replayed_after_failure += 1;
        }
    }
    if i.is_multiple_of(25) {
        let (again, _) = load.command(&url, &create_key, Some(&body)).await?;
        let mut r = report.lock().expect("report lock");
        r.replay_probes += 1;
        if again.status == StatusCode::CREATED && again.replayed && again.body == created.body {
            r.replay_probes_identical += 1;
        }
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
        progress.captured.fetch_add(1, Ordering::Relaxed);
        report.lock().expect("report lock").captured.insert(id);
    }
    Ok(())
}
