//! The skeleton of a load driver: concurrent clients at a rate, and the retry of a command
//! **with the same `Idempotency-Key`** until it gets an answer.
//!
//! A request that fails without an answer (the API was killed, a timeout) or with a 5xx is sent
//! again with the same key: an API with request idempotency answers a retry of a command that
//! did commit with the first answer, so nothing is done twice, however the crash fell.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use hyper::Method;
use serde_json::Value;

use crate::http_client::{Answer, HttpClient};

/// Checks a load's numbers: at least 20 units (the option `--<unit_flag>`), at least one
/// client, a finite non-negative rate of `unit`s per second.
///
/// # Errors
/// The first invalid option, named.
pub fn check_numbers(
    unit_flag: &str,
    unit: &str,
    total: u64,
    clients: u64,
    rate: f64,
) -> Result<()> {
    if total < 20 {
        bail!("invalid option `--{unit_flag}`: at least 20");
    }
    if clients == 0 {
        bail!("invalid option `--clients`: at least 1");
    }
    if !(rate >= 0.0 && rate.is_finite()) {
        bail!("invalid option `--rate`: a number of {unit} per second, 0 for no limit");
    }
    Ok(())
}

/// Runs `clients` concurrent clients over the units `0..total`: client `c` does `c`,
/// `c + clients`, … with `one(unit)`; `rate` units start per second across all clients (0: as
/// fast as they finish).
///
/// # Errors
/// The first error of a unit (the other clients are stopped).
pub async fn run_clients<F, Fut>(total: u64, clients: u64, rate: f64, one: F) -> Result<()>
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let started = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    for c in 0..clients {
        let one = one.clone();
        set.spawn(async move {
            let mut i = c;
            while i < total {
                if rate > 0.0 {
                    let due = started + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                one(i).await?;
                i += clients;
            }
            anyhow::Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}

/// Sends `POST url` with `Idempotency-Key: key` until it is answered with something other than
/// a 5xx, always with the same key, counting each retry in `retries`. Returns the answer and
/// whether it took more than one attempt.
///
/// # Errors
/// No such answer within `retry_for`.
pub async fn post_until_answered(
    http: &HttpClient,
    url: &str,
    key: &str,
    body: Option<&Value>,
    retry_for: Duration,
    retries: &AtomicU64,
) -> Result<(Answer, bool)> {
    let deadline = Instant::now() + retry_for;
    let mut delay = Duration::from_millis(50);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let outcome = http
            .send(Method::POST, url, &[("idempotency-key", key)], body)
            .await;
        let why = match outcome {
            Ok(a) if !a.status.is_server_error() => return Ok((a, attempts > 1)),
            Ok(a) => format!("{} {}", a.status, a.body),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > deadline {
            bail!("POST {url} (key {key}) kept failing for {retry_for:?}: {why}");
        }
        retries.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(800));
    }
}
