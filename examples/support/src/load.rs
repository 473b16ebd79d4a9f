//! The skeleton of a load driver: what to send ([`LoadConfig`]), concurrent clients at a rate
//! ([`Load::run_clients`]), the retry of a command **with the same `Idempotency-Key`** until
//! it gets an answer ([`Load::command`]), and the API's request idempotency checked from the
//! outside: creates answered as replays after a lost answer ([`Load::create`]), a create sent
//! again after its answer ([`Load::replay_probe`]), bad requests ([`Load::bad_requests`]), all
//! counted for the verification ([`Idempotency`]).
//!
//! A request that fails without an answer (the API was killed, a timeout) or with a 5xx is sent
//! again with the same key: an API with request idempotency answers a retry of a command that
//! did commit with the first answer, so nothing is done twice, however the crash fell.
//!
//! The commands themselves (which requests, what their answers must be, what the run counts)
//! stay in each example's load driver.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use hyper::{Method, StatusCode};
use serde_json::Value;

use crate::http_client::{Answer, HttpClient};
use crate::table::{Check, eq};

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

/// A load under way, shared by its clients: the HTTP client, what to send, what the example
/// counts (`P`, its progress, read while the load runs; `R`, its report, for the verification),
/// and the counts of the API's request idempotency seen from the outside.
pub struct Load<P, R> {
    /// The HTTP client (also for requests sent once, such as the probes of bad requests).
    pub http: HttpClient,
    /// What to send.
    pub config: LoadConfig,
    /// The example's counters read while the load runs (the kill schedule, progress lines).
    pub progress: P,
    report: Mutex<R>,
    retries: AtomicU64,
    replayed_after_failure: AtomicU64,
    replay_probes: (AtomicU64, AtomicU64),
    bad_requests: (AtomicU64, AtomicU64),
}

/// What a load saw of the API's request idempotency, for the verification.
#[derive(Debug, Clone, Default)]
pub struct Idempotency {
    /// Requests sent again after a failure without an answer or a 5xx.
    pub retries: u64,
    /// Creates answered 201 on a retry marked as a replay: the first attempt had committed but
    /// its answer was lost.
    pub replayed_after_failure: u64,
    /// Replay probes sent (a create sent again after its answer).
    pub replay_probes: u64,
    /// Replay probes answered exactly like the first time and marked as a replay.
    pub replay_probes_identical: u64,
    /// Bad requests sent.
    pub bad_requests: u64,
    /// Bad requests answered as documented.
    pub bad_requests_refused: u64,
}

impl Idempotency {
    /// The verification table's rows: replays answered like the first time, and the bad
    /// requests answered as documented (the row `bad_requests_row`).
    pub fn checks(&self, bad_requests_row: &str) -> [Check; 2] {
        [
            eq(
                "replayed requests answered like the first time",
                self.replay_probes as i64,
                self.replay_probes_identical as i64,
            ),
            eq(
                bad_requests_row,
                self.bad_requests as i64,
                self.bad_requests_refused as i64,
            ),
        ]
    }
}

fn count(counter: &AtomicU64, yes: bool) {
    counter.fetch_add(u64::from(yes), Ordering::Relaxed);
}

fn read(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

impl<P, R> Load<P, R>
where
    P: Default + Send + Sync + 'static,
    R: Default + Send + 'static,
{
    /// The load `config`, sent with `http`, its progress and report at their defaults.
    pub fn new(http: HttpClient, config: LoadConfig) -> Self {
        Self {
            http,
            config,
            progress: P::default(),
            report: Mutex::default(),
            retries: AtomicU64::new(0),
            replayed_after_failure: AtomicU64::new(0),
            replay_probes: Default::default(),
            bad_requests: Default::default(),
        }
    }

    /// The example's report of what the load did so far, locked.
    pub fn report(&self) -> MutexGuard<'_, R> {
        self.report.lock().expect("report lock")
    }

    /// Requests sent again so far (each retry of [`Load::command`]).
    pub fn retries(&self) -> u64 {
        read(&self.retries)
    }

    /// What the load saw of the API's request idempotency so far.
    pub fn idempotency(&self) -> Idempotency {
        Idempotency {
            retries: self.retries(),
            replayed_after_failure: read(&self.replayed_after_failure),
            replay_probes: read(&self.replay_probes.0),
            replay_probes_identical: read(&self.replay_probes.1),
            bad_requests: read(&self.bad_requests.0),
            bad_requests_refused: read(&self.bad_requests.1),
        }
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

    /// Sends the command that creates a unit's aggregate (`what`: `create`, `place`) as
    /// [`Load::command`]: it must be answered 201 with an `id`. Counts a 201 on a retry marked
    /// as a replay (the first attempt had committed but its answer was lost). Returns the id and
    /// the answer.
    ///
    /// # Errors
    /// No answer within `retry_for`, or another answer (a broken contract).
    pub async fn create(
        &self,
        what: &str,
        url: &str,
        key: &str,
        body: &Value,
    ) -> Result<(String, Answer)> {
        let (answer, retried) = self.command(url, key, Some(body)).await?;
        let id = match (answer.status, answer.body["id"].as_str()) {
            (StatusCode::CREATED, Some(id)) => id.to_owned(),
            _ => bail!(
                "{what} {key}: expected 201 with an id, got {} {}",
                answer.status,
                answer.body
            ),
        };
        count(&self.replayed_after_failure, retried && answer.replayed);
        Ok((id, answer))
    }

    /// Sends a create again after its answer `first` (same URL, key and body): a replay probe,
    /// counted, and counted as identical when it is answered exactly like the first time and
    /// marked as a replay.
    ///
    /// # Errors
    /// No answer within `retry_for`.
    pub async fn replay_probe(
        &self,
        url: &str,
        key: &str,
        body: &Value,
        first: &Answer,
    ) -> Result<()> {
        let (again, _) = self.command(url, key, Some(body)).await?;
        let same =
            again.status == StatusCode::CREATED && again.replayed && again.body == first.body;
        count(&self.replay_probes.0, true);
        count(&self.replay_probes.1, same);
        Ok(())
    }

    /// The bad requests to `url` ([`BadRequests::send`]), sent once each and counted.
    pub fn bad_requests(&self, url: impl Into<String>) -> BadRequests<'_, P, R> {
        BadRequests {
            load: self,
            url: url.into(),
        }
    }

    /// Counts a bad request the caller sent and judged itself (`refused`: answered as
    /// documented).
    pub fn count_bad_request(&self, refused: bool) {
        count(&self.bad_requests.0, true);
        count(&self.bad_requests.1, refused);
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

/// Bad requests to one URL of the API ([`Load::bad_requests`]): each sent once, counted as
/// refused as documented when answered with the expected status.
pub struct BadRequests<'a, P, R> {
    load: &'a Load<P, R>,
    url: String,
}

impl<P, R> BadRequests<'_, P, R>
where
    P: Default + Send + Sync + 'static,
    R: Default + Send + 'static,
{
    /// Sends the bad request `what`: `POST` with `Idempotency-Key: key` and `body`. Counted as
    /// refused as documented when answered `expected` (otherwise said on stderr). Returns the
    /// answer.
    ///
    /// # Errors
    /// The API cannot be reached.
    pub async fn send<'b>(
        &self,
        what: &str,
        key: &str,
        body: impl Into<Option<&'b Value>>,
        expected: StatusCode,
    ) -> Result<Answer> {
        let headers = [("idempotency-key", key)];
        self.judge(what, &headers, body.into(), expected).await
    }

    /// [`BadRequests::send`] without the `Idempotency-Key` header.
    ///
    /// # Errors
    /// The API cannot be reached.
    pub async fn send_without_key(
        &self,
        what: &str,
        body: &Value,
        expected: StatusCode,
    ) -> Result<Answer> {
        self.judge(what, &[], Some(body), expected).await
    }

    async fn judge(
        &self,
        what: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
        expected: StatusCode,
    ) -> Result<Answer> {
        let url = &self.url;
        let a = self
            .load
            .http
            .send(Method::POST, url, headers, body)
            .await?;
        self.load.count_bad_request(a.status == expected);
        if a.status != expected {
            eprintln!(
                "probe `{what}`: expected {expected}, got {} {}",
                a.status, a.body
            );
        }
        Ok(a)
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
