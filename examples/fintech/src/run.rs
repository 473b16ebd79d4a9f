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

use std::fmt;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hyper::Method;
use support::http_client::HttpClient;
use support::load::Load;
use support::run::{DEFAULT_BROKER_URL, DEFAULT_DATABASE_URL, ModeArgs, Plan, Sandbox};
use support::supervise::{KillSchedule, ProcessKind, Supervisor, free_addr};

use crate::load::{LoadReport, Progress};
use crate::topology::{AGGREGATE, CAPTURE_CONSUMER, REPORTING_CONSUMER, Topology};
use crate::verify::{RunFacts, Snapshot};

/// Options of `fintech run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// `--short` / `--long` and the overrides of their numbers.
    #[command(flatten)]
    mode: ModeArgs,
    /// The broker, chosen by scheme (nats://, amqp://).
    #[arg(long, env = "FINTECH_BROKER_URL", default_value = DEFAULT_BROKER_URL)]
    broker_url: String,
    /// A database on the PostgreSQL server to use: the run creates its own two databases there.
    #[arg(long, env = "FINTECH_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    database_url: String,
    /// Keep the databases and broker objects of the run (and print where they are).
    #[arg(long)]
    keep: bool,
    /// Payments to create (overrides the mode's).
    #[arg(long)]
    payments: Option<u64>,
}

/// The processes of the story.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Provider,
    Relay,
    Reporting,
    Capture,
    Payments,
}

impl Kind {
    /// The kinds killed in the middle, in the order of a round.
    const KILLED: [Kind; 4] = [Kind::Payments, Kind::Relay, Kind::Reporting, Kind::Capture];
}

impl ProcessKind for Kind {
    fn subcommand(self) -> &'static str {
        match self {
            Kind::Provider => "provider",
            Kind::Relay => "relay",
            Kind::Reporting => "reporting",
            Kind::Capture => "capture",
            Kind::Payments => "payments",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Provider => "provider",
            Kind::Relay => "relay",
            Kind::Reporting => "reporting consumer",
            Kind::Capture => "capture worker",
            Kind::Payments => "payments API",
        })
    }
}

/// The children of the run and how to start them.
struct Cluster {
    sup: Supervisor<Kind>,
    common: Vec<String>,
    provider_addr: SocketAddr,
    api_addr: SocketAddr,
}

impl Cluster {
    fn args(&self, kind: Kind) -> Vec<String> {
        let mut args = vec![kind.subcommand().to_owned()];
        match kind {
            Kind::Provider => {
                // Port 0: the provider announces the port it got (`listening on http://ADDR`).
                args.extend(["--listen".to_owned(), "127.0.0.1:0".to_owned()]);
                return args;
            }
            Kind::Payments => args.extend(["--listen".to_owned(), self.api_addr.to_string()]),
            Kind::Capture => args.extend([
                "--provider-url".to_owned(),
                format!("http://{}", self.provider_addr),
            ]),
            Kind::Relay | Kind::Reporting => {}
        }
        args.extend(self.common.iter().cloned());
        args
    }

    /// Starts `kind` and waits for its readiness line, which it returns.
    async fn start(&mut self, kind: Kind) -> Result<String> {
        let args = self.args(kind);
        self.sup.start(kind, args).await
    }
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
    let topology = Topology::new("fintech", AGGREGATE, &name, true)?;
    let payments_db = format!("fintech_{pid}_payments");
    let reporting_db = format!("fintech_{pid}_reporting");
    let broker = outbox::brokers().find(&args.broker_url)?.name;
    println!(
        "fintech run ({} mode): {} payments from {} clients, {} round(s) of kills",
        plan.mode, plan.commands, plan.clients, plan.kill_rounds
    );
    let sandbox = Sandbox::create(
        &args.database_url,
        &[payments_db.clone(), reporting_db.clone()],
        &args.broker_url,
        broker,
        &topology,
    )
    .await?;
    let payments_url = sandbox.url(&payments_db)?;
    let reporting_url = sandbox.url(&reporting_db)?;

    let result = story(&args, &plan, &topology, &payments_url, &reporting_url).await;

    if args.keep {
        println!("kept: databases {payments_db}, {reporting_db}; broker objects of {name}");
    } else {
        sandbox
            .remove(&[REPORTING_CONSUMER, CAPTURE_CONSUMER])
            .await;
    }
    result
}

/// Everything between the databases' creation and their removal.
async fn story(
    args: &RunArgs,
    plan: &Plan,
    topology: &Topology,
    payments_url: &str,
    reporting_url: &str,
) -> Result<ExitCode> {
    let payments = crate::db::connect(payments_url, 4).await?;
    let reporting = crate::db::connect(reporting_url, 4).await?;
    crate::db::migrate_payments(&payments).await?;
    crate::db::migrate_reporting(&reporting).await?;

    let sup = Supervisor::for_run("fintech")?;
    let mut cluster = Cluster {
        sup,
        common: vec![
            "--payments-url".into(),
            payments_url.into(),
            "--reporting-url".into(),
            reporting_url.into(),
            "--broker-url".into(),
            args.broker_url.clone(),
            "--name".into(),
            topology.name().to_owned(),
            "--fast".into(),
        ],
        provider_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        api_addr: free_addr()?,
    };
    let result = drive(&mut cluster, plan, &payments, &reporting).await;
    cluster.sup.stop().await;
    payments.close().await;
    reporting.close().await;
    let checks = result?;
    Ok(support::table::conclude(&checks, cluster.sup.dir()))
}

/// Starts the processes, runs the load with the kills, waits for the drain, and returns the
/// checks.
async fn drive(
    cluster: &mut Cluster,
    plan: &Plan,
    payments: &sqlx::PgPool,
    reporting: &sqlx::PgPool,
) -> Result<Vec<support::table::Check>> {
    let line = cluster.start(Kind::Provider).await?;
    cluster.provider_addr = line
        .strip_prefix("listening on http://")
        .and_then(|a| a.parse().ok())
        .with_context(|| format!("the provider announced no address: `{line}`"))?;
    // The relay first: it creates the NATS stream / RabbitMQ exchange the consumers bind to.
    for kind in [Kind::Relay, Kind::Reporting, Kind::Capture, Kind::Payments] {
        cluster.start(kind).await?;
    }
    let provider_url = format!("http://{}", cluster.provider_addr);
    let http = HttpClient::new(Duration::from_secs(3));
    let load = Arc::new(Load::new(http.clone(), plan.load(cluster.api_addr)));
    let report = Arc::new(Mutex::new(LoadReport::default()));
    {
        let mut r = LoadReport::default();
        crate::load::probe_bad_requests(&load, &mut r).await?;
        let mut shared = report.lock().expect("report lock");
        *shared = r;
    }
    let progress = Arc::new(Progress::default());
    let driving = tokio::spawn(crate::load::drive(
        Arc::clone(&load),
        Arc::clone(&progress),
        Arc::clone(&report),
    ));

    // The kill schedule: evenly spread over the load, one kind after the other.
    let mut schedule = KillSchedule::new(&Kind::KILLED, plan.kill_rounds, plan.commands);
    let kills_planned = schedule.planned() as i64;
    // The slow provider: from 40% of the load until an outcome was unknown, however long that
    // takes on a loaded machine (the capture worker may be down or slow for a while), at most
    // SLOW_AT_MOST; the run fails its check if none was.
    let slow_at = plan.commands * 2 / 5;
    let mut slow: Option<Instant> = None;
    let mut slow_done = false;
    let mut kills = 0i64;
    let mut last_line = Instant::now();
    loop {
        if driving.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        cluster.sup.check_alive()?;
        let created = progress.created.load(Ordering::Relaxed);
        if let Some(kind) = schedule.due(created) {
            cluster.sup.kill(kind).await?;
            kills += 1;
            // A consumer or worker down for a moment; the API comes back at once (its clients
            // are retrying).
            if kind != Kind::Payments {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            cluster.start(kind).await?;
        }
        if !slow_done && slow.is_none() && created >= slow_at {
            set_provider_delay(&http, &provider_url, 1500).await?;
            cluster.sup.say(
                "provider answers slower than the executor waits (1.5 s > 1 s): unknown outcomes",
            );
            slow = Some(Instant::now());
        }
        if let Some(since) = slow {
            let unknown_seen = unknown_outcomes(payments).await.unwrap_or(0) > 0;
            if unknown_seen || since.elapsed() > SLOW_AT_MOST {
                set_provider_delay(&http, &provider_url, 0).await?;
                cluster.sup.say("provider answers at once again");
                slow = None;
                slow_done = true;
            }
        }
        if last_line.elapsed() > Duration::from_secs(2) {
            last_line = Instant::now();
            cluster.sup.say(&format!(
                "load: {} created, {} captured, {} requests retried",
                progress.created.load(Ordering::Relaxed),
                progress.captured.load(Ordering::Relaxed),
                load.retries()
            ));
        }
    }
    driving.await.context("the load driver panicked")??;
    if let Some(since) = slow {
        // The load ended first: the captures it made are still being called.
        while since.elapsed() < SLOW_AT_MOST && unknown_outcomes(payments).await.unwrap_or(0) == 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        set_provider_delay(&http, &provider_url, 0).await?;
        cluster.sup.say("provider answers at once again");
    }
    // Kills not reached (a tiny --payments): do them now, the drain still has to survive them.
    while let Some(kind) = schedule.next_remaining() {
        cluster.sup.kill(kind).await?;
        kills += 1;
        cluster.start(kind).await?;
    }
    cluster.sup.say(&format!(
        "load done: {} created, {} captured, {} requests retried with the same key",
        progress.created.load(Ordering::Relaxed),
        progress.captured.load(Ordering::Relaxed),
        load.retries()
    ));

    // Drain.
    cluster
        .sup
        .wait_drained(plan.drain_timeout, &mut last_line, || async {
            let s = Snapshot::take(payments, reporting, &http, &provider_url, false).await?;
            Ok(s.pending())
        })
        .await?;
    let snapshot = Snapshot::take(payments, reporting, &http, &provider_url, true).await?;
    let report = report.lock().expect("report lock");
    let facts = RunFacts {
        kills,
        kills_planned,
    };
    println!(
        "requests retried with the same key: {}; creates whose retry was answered as a replay: {}",
        load.retries(),
        report.replayed_after_failure
    );
    Ok(crate::verify::checks(&snapshot, &report, &facts))
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
async fn unknown_outcomes(payments: &sqlx::PgPool) -> Result<i64> {
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
