//! `fintech run`: the whole story in one command.
//!
//! 1. Creates two fresh databases (`fintech_<pid>_payments`, `fintech_<pid>_reporting`) on the
//!    server of `--database-url` and migrates them (library API).
//! 2. Starts every process as a child of this binary (`std::env::current_exe`): the stand-in
//!    provider, the relay, the reporting consumer, the capture worker, the payments API. Each
//!    child writes its log to a file of the run directory, prints `ready` when it serves, and
//!    exits when its standard input closes (so none outlives this process); every child is
//!    also killed when its handle is dropped.
//! 3. Drives load through the HTTP API ([`crate::load`]) and, in the middle, SIGKILLs one
//!    process of each kind (payments API, relay, reporting, capture worker; three rounds in the
//!    long mode) and restarts it. For a moment it also makes the provider answer slower than
//!    the executor waits, so calls end with an unknown outcome that must be reconciled.
//! 4. Waits until everything drained (deadline: an error naming what is still pending), stops
//!    the children, prints the verification table and exits non-zero if any check failed.
//! 5. Drops the databases and deletes the broker objects of the run, unless `--keep`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hyper::Method;
use sqlx::PgPool;
use support::http_client::HttpClient;
use support::run::{ModeArgs, Plan, RunServices, Sandbox};
use support::supervise::{Supervisor, child_args, free_addr, service_args};
use support::table::Check;
use support::watch::LoadWatch;

use crate::db::{PAYMENTS, REPORTING};
use crate::load::Load;
use crate::topology::{CAPTURE_CONSUMER, REPORTING_CONSUMER, Topology};
use crate::verify::Snapshot;

/// Options of `fintech run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// `--short` / `--long` and the overrides of their numbers.
    #[command(flatten)]
    mode: ModeArgs,
    /// The broker and the PostgreSQL server the run uses.
    #[command(flatten)]
    services: RunServices,
    /// Payments to create (overrides the mode's).
    #[arg(long)]
    payments: Option<u64>,
}

/// The processes of the story: the subcommand that runs each, and its name in messages.
mod process {
    use support::supervise::Process;

    pub const PROVIDER: Process = Process::new("provider", "provider");
    pub const RELAY: Process = Process::new("relay", "relay");
    pub const REPORTING: Process = Process::new("reporting", "reporting consumer");
    pub const CAPTURE: Process = Process::new("capture", "capture worker");
    pub const PAYMENTS: Process = Process::new("payments", "payments API");
    /// The processes killed in the middle, in the order of a round.
    pub const KILLED: [Process; 4] = [PAYMENTS, RELAY, REPORTING, CAPTURE];
}

/// Runs the story; the exit status is 1 when a check failed.
///
/// # Errors
/// A service is unreachable, a process failed, the load could not complete, or the run did not
/// drain within its deadline.
pub async fn run(args: RunArgs) -> Result<ExitCode> {
    let plan = args.mode.plan(
        Plan::short(200, 40.0),
        args.payments,
        "payments",
        "payments",
    )?;
    let pid = std::process::id();
    let name = format!("r{pid}");
    let topology = crate::topology::topology(&name, true)?;
    let names = [PAYMENTS.name, REPORTING.name].map(|db| format!("fintech_{pid}_{db}"));
    // An unknown broker is refused here, before anything is created.
    outbox::brokers().find(&args.services.broker_url)?;
    println!(
        "fintech run ({} mode): {} payments from {} clients, {} round(s) of kills",
        plan.mode, plan.commands, plan.clients, plan.kill_rounds
    );
    let sandbox = Sandbox::create(&args.services, &names, &topology).await?;
    let urls = [sandbox.url(&names[0])?, sandbox.url(&names[1])?];

    let result = story(&args, &plan, &topology, &urls).await;

    let consumers = [REPORTING_CONSUMER, CAPTURE_CONSUMER];
    sandbox
        .keep_or_remove(args.services.keep, &name, &consumers)
        .await;
    result
}

/// Everything between the databases' creation and their removal.
async fn story(
    args: &RunArgs,
    plan: &Plan,
    topology: &Topology,
    urls: &[String; 2],
) -> Result<ExitCode> {
    let payments = crate::db::connect(&urls[0], 4).await?;
    let reporting = crate::db::connect(&urls[1], 4).await?;
    PAYMENTS.migrate(&payments).await?;
    REPORTING.migrate(&reporting).await?;
    let databases = [
        ("--payments-url", urls[0].as_str()),
        ("--reporting-url", &urls[1]),
    ];
    let common = service_args(&databases, &args.services.broker_url, topology);
    let exit = Supervisor::supervise("fintech", async |sup: &mut Supervisor| {
        drive(sup, plan, common, &payments, &reporting).await
    })
    .await;
    payments.close().await;
    reporting.close().await;
    exit
}

/// Starts the processes with the options `common`, runs the load with the kills, waits for
/// the drain, and returns the checks.
async fn drive(
    sup: &mut Supervisor,
    plan: &Plan,
    common: Vec<String>,
    payments: &PgPool,
    reporting: &PgPool,
) -> Result<Vec<Check>> {
    let api_addr = free_addr()?;
    // Port 0: the provider announces the port it got (`listening on http://ADDR`).
    let provider = child_args(&["--listen", "127.0.0.1:0"], &[]);
    let line = sup.start(process::PROVIDER, provider).await?;
    let provider_addr: SocketAddr = line
        .strip_prefix("listening on http://")
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("the provider announced no address: `{line}`"))?;
    let provider_url = format!("http://{provider_addr}");
    // The relay first: it creates the NATS stream / RabbitMQ exchange the consumers bind to.
    sup.start(process::RELAY, common.clone()).await?;
    sup.start(process::REPORTING, common.clone()).await?;
    let capture = child_args(&["--provider-url", &provider_url], &common);
    sup.start(process::CAPTURE, capture).await?;
    let api = child_args(&["--listen", &api_addr.to_string()], &common);
    sup.start(process::PAYMENTS, api).await?;
    let http = HttpClient::new(Duration::from_secs(3));
    let load = Arc::new(Load::new(http.clone(), plan.load(api_addr)));
    crate::load::probe_bad_requests(&load).await?;
    let driving = tokio::spawn(crate::load::drive(Arc::clone(&load)));

    // The kill schedule: evenly spread over the load, one kind after the other.
    let mut watch = LoadWatch::new(plan, &process::KILLED, process::PAYMENTS);
    // The slow provider: from 40% of the load until an outcome was unknown, however long that
    // takes on a loaded machine (the capture worker may be down or slow for a while), at most
    // SLOW_AT_MOST; the run fails its check if none was.
    let slow_at = plan.commands * 2 / 5;
    let mut slow: Option<Instant> = None;
    let mut slow_done = false;
    let progress = &load.progress;
    while !driving.is_finished() {
        let created = watch.beat(sup, &progress.created).await?;
        if !slow_done && slow.is_none() && created >= slow_at {
            set_provider_delay(&http, &provider_url, 1500).await?;
            sup.say(
                "provider answers slower than the executor waits (1.5 s > 1 s): unknown outcomes",
            );
            slow = Some(Instant::now());
        }
        if let Some(since) = slow {
            let unknown_seen = unknown_outcomes(payments).await.unwrap_or(0) > 0;
            if unknown_seen || since.elapsed() > SLOW_AT_MOST {
                set_provider_delay(&http, &provider_url, 0).await?;
                sup.say("provider answers at once again");
                slow = None;
                slow_done = true;
            }
        }
        watch.progress(sup, || {
            format!(
                "load: {} created, {} captured, {} requests retried",
                progress.created.load(Ordering::Relaxed),
                progress.captured.load(Ordering::Relaxed),
                load.retries()
            )
        });
    }
    driving.await.context("the load driver panicked")??;
    if let Some(since) = slow {
        // The load ended first: the captures it made are still being called.
        while since.elapsed() < SLOW_AT_MOST && unknown_outcomes(payments).await.unwrap_or(0) == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        set_provider_delay(&http, &provider_url, 0).await?;
        sup.say("provider answers at once again");
    }
    // Kills not reached (a tiny --payments): do them now, the drain still has to survive them.
    watch.kill_the_rest(sup).await?;
    sup.say(&format!(
        "load done: {} created, {} captured, {} requests retried with the same key",
        progress.created.load(Ordering::Relaxed),
        progress.captured.load(Ordering::Relaxed),
        load.retries()
    ));

    // Drain.
    let pending = || async {
        let s = Snapshot::take(payments, reporting, &http, &provider_url, false).await?;
        Ok(s.pending())
    };
    watch.drain(sup, plan.drain_timeout, pending).await?;
    let snapshot = Snapshot::take(payments, reporting, &http, &provider_url, true).await?;
    let idempotency = load.idempotency();
    println!(
        "requests retried with the same key: {}; creates whose retry was answered as a replay: {}",
        idempotency.retries, idempotency.replayed_after_failure
    );
    let report = load.report();
    let mut checks = crate::verify::checks(&snapshot, &report);
    checks.extend(idempotency.checks("bad requests refused with the documented 4xx"));
    checks.push(watch.check());
    Ok(checks)
}

/// Longest the provider stays slow while waiting for a first unknown outcome.
const SLOW_AT_MOST: Duration = Duration::from_secs(30);

/// The stand-in provider's response delay (its admin endpoint).
async fn set_provider_delay(http: &HttpClient, provider_url: &str, ms: u64) -> Result<()> {
    let a = http
        .send(
            Method::POST,
            &format!("{provider_url}/admin/delay"),
            &[],
            Some(&serde_json::json!({ "ms": ms })),
        )
        .await?;
    if !a.status.is_success() {
        bail!("the provider refused the delay: {} {}", a.status, a.body);
    }
    Ok(())
}

/// Capture work items that are, or were, of unknown outcome.
async fn unknown_outcomes(payments: &PgPool) -> Result<i64> {
    let effects = outbox::postgres::PgEffects::new(crate::db::schema());
    let s = effects
        .stats(payments, Some(crate::topology::CAPTURE_KIND))
        .await?;
    if s.unknown > 0 {
        return Ok(s.unknown);
    }
    // One already reconciled between two looks counts too: it was unknown.
    let reconciled = effects
        .list(payments, Some("succeeded"), 10_000)
        .await?
        .iter()
        .filter(|w| w.lookups > 0)
        .count();
    Ok(i64::try_from(reconciled).unwrap_or(i64::MAX))
}
