//! The skeleton of a load driver: what to send ([`LoadConfig`]), concurrent clients at a rate
//! ([`Load::run_clients`]), and the retry of a command **with the same `Idempotency-Key`** until
//! it gets an answer ([`Load::command`]).
//!
//! A request that fails without an answer (the API was killed, a timeout) or with a 5xx is sent
//! again with the same key: an API with request idempotency answers a retry of a command that
//! did commit with the first answer, so nothing is done twice, however the crash fell.
//!
//! The commands themselves (which requests, what their answers must be, what the run counts)
//! stay in each example's load driver.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use hyper::Method;
use serde_json::Value;

use crate::http_client::{Answer, HttpClient};

/// What a load sends ([`crate::run::Plan::load`] for a run's).
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Base URL of the API.
    pub api: String,
    /// Units of the load (payments to create, bets to place), each one command or more.
    pub commands: u64,
    /// Concurrent clients.
    pub clients: u64,
    /// Units started per second across all clients; 0: as fast as the API answers.
    pub rate: f64,
    /// Prefix of every idempotency key (unique per run).
    pub tag: String,
    /// How long one command may keep failing before the run gives up.
    pub retry_for: Duration,
}

/// A load under way, shared by its clients: the HTTP client, what to send, and the count of
/// requests sent again after a failure without an answer or a 5xx.
pub struct Load {
    /// The HTTP client (also for requests sent once, such as the probes of bad requests).
    pub http: HttpClient,
    /// What to send.
    pub config: LoadConfig,
    retries: AtomicU64,
}

impl Load {
    /// The load `config`, sent with `http`.
    pub fn new(http: HttpClient, config: LoadConfig) -> Self {
        Self {
            http,
            config,
            retries: AtomicU64::new(0),
        }
    }

    /// Requests sent again so far (each retry of [`Load::command`]).
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Sends the command `POST url` with `Idempotency-Key: key` until it is answered with
    /// something other than a 5xx ([`post_until_answered`], for at most
    /// [`LoadConfig::retry_for`]), counting the retries. Returns the answer and whether it took
    /// more than one attempt.
    ///
    /// # Errors
    /// No such answer within `retry_for`.
    pub async fn command(
        &self,
        url: &str,
        key: &str,
        body: Option<&Value>,
    ) -> Result<(Answer, bool)> {
        post_until_answered(
            &self.http,
            url,
            key,
            body,
            self.config.retry_for,
            &self.retries,
        )
        .await
    }

    /// Runs the load's clients to the end ([`run_clients`] with the config's numbers): unit `i`
    /// of `0..commands` is `one(load, i)`.
    ///
    /// # Errors
    /// The first error of a unit (the other clients are stopped).
    pub async fn run_clients<F, Fut>(self: Arc<Self>, one: F) -> Result<()>
    where
        F: Fn(Arc<Self>, u64) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = Result<()>> + Send + 'static,
    {
        let c = &self.config;
        let (total, clients, rate) = (c.commands, c.clients, c.rate);
        run_clients(total, clients, rate, move |i| one(Arc::clone(&self), i)).await
    }
}

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
