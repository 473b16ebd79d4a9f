//! `igaming run`: the whole story in one command.
//!
//! 1. Creates three fresh databases (`igaming_<pid>_bets`, `_history`, `_ledger`) on the server
//!    of `--database-url` and migrates them (library API).
//! 2. Starts the relay, the history projection, the payout consumer and the bets API as
//!    children of this binary (`support::supervise`): logs in the run directory, `ready` on
//!    stdout, gone when the run ends however it ends.
//! 3. Drives load through the HTTP API ([`crate::load`]); in the middle, SIGKILLs one process
//!    of each kind (bets API, relay, history, payouts; three rounds in the long mode) and
//!    restarts it, and re-sends one delivered `BetSettled` with the same event id and a changed
//!    payout straight to the broker, then the same settlement under a new event id
//!    ([`crate::conflict`]).
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
use sqlx::PgPool;
use support::http_client::HttpClient;
use support::load::Load;
use support::run::{DEFAULT_BROKER_URL, DEFAULT_DATABASE_URL, ModeArgs, Plan, Sandbox};
use support::supervise::{KillSchedule, ProcessKind, Supervisor, free_addr};
use support::table::Check;

use crate::conflict::Injected;
use crate::load::{LoadReport, Progress};
use crate::topology::{HISTORY_CONSUMER, PAYOUTS_CONSUMER, Topology};
use crate::verify::{RunFacts, Snapshot};

/// Options of `igaming run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// `--short` / `--long` and the overrides of their numbers.
    #[command(flatten)]
    mode: ModeArgs,
    /// The broker, chosen by scheme (nats://, amqp://).
    #[arg(long, env = "IGAMING_BROKER_URL", default_value = DEFAULT_BROKER_URL)]
    broker_url: String,
    /// A database on the PostgreSQL server to use: the run creates its own three databases there.
    #[arg(long, env = "IGAMING_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    database_url: String,
    /// Keep the databases and broker objects of the run (and print where they are).
    #[arg(long)]
    keep: bool,
    /// Bets to place (overrides the mode's).
    #[arg(long)]
    bets: Option<u64>,
}

/// The processes of the story.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Relay,
    History,
    Payouts,
    Bets,
}

impl Kind {
    /// Started in this order (the relay first: it creates the stream / exchange the consumers
    /// bind to), and killed in the middle in this order.
    const ALL: [Kind; 4] = [Kind::Relay, Kind::History, Kind::Payouts, Kind::Bets];
    const KILLED: [Kind; 4] = [Kind::Bets, Kind::Relay, Kind::History, Kind::Payouts];
}

impl ProcessKind for Kind {
    fn subcommand(self) -> &'static str {
        match self {
            Kind::Relay => "relay",
            Kind::History => "history",
            Kind::Payouts => "payouts",
            Kind::Bets => "bets",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Relay => "relay",
            Kind::History => "history projection",
            Kind::Payouts => "payout consumer",
            Kind::Bets => "bets API",
        })
    }
}

/// The run's children and their arguments.
struct Cluster {
    sup: Supervisor<Kind>,
    /// `--bets-url … --fast`, given to every process.
    common: Vec<String>,
    api: SocketAddr,
}

impl Cluster {
    async fn start(&mut self, kind: Kind) -> Result<()> {
        let mut args = vec![kind.subcommand().to_owned()];
        if kind == Kind::Bets {
            args.extend(["--listen".to_owned(), self.api.to_string()]);
        }
        args.extend(self.common.iter().cloned());
        self.sup.start(kind, args).await.map(drop)
    }

    /// SIGKILL, a moment down (the API comes back at once: its clients are retrying), restart.
    async fn kill_and_restart(&mut self, kind: Kind) -> Result<()> {
        self.sup.kill(kind).await?;
        if kind != Kind::Bets {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.start(kind).await
    }
}

/// The three databases of a run.
struct Pools {
    bets: PgPool,
    history: PgPool,
    ledger: PgPool,
}

/// Runs the story; the exit status is 1 when a check failed.
///
/// # Errors
/// A service is unreachable, a process failed, the load could not complete, or the run did not
/// drain within its deadline.
pub async fn run(args: RunArgs) -> Result<ExitCode> {
    let plan = args
        .mode
        .plan(Plan::short(300, 60.0), args.bets, "bets", "bets")?;
    let pid = std::process::id();
    let topology = crate::topology::topology(&format!("r{pid}"), true)?;
    let names = ["bets", "history", "ledger"].map(|db| format!("igaming_{pid}_{db}"));
    let broker = outbox::brokers().find(&args.broker_url)?.name;
    println!(
        "igaming run ({} mode): {} bets from {} clients, {} round(s) of kills, one re-sent and one re-emitted event",
        plan.mode, plan.commands, plan.clients, plan.kill_rounds
    );
    let sandbox = Sandbox::create(
        &args.database_url,
        &names,
        &args.broker_url,
        broker,
        &topology,
    )
    .await?;
    let urls = [
        sandbox.url(&names[0])?,
        sandbox.url(&names[1])?,
        sandbox.url(&names[2])?,
    ];

    let result = story(&args, &plan, &topology, &urls).await;

    if args.keep {
        println!(
            "kept: databases {}; broker objects of {}",
            names.join(", "),
            topology.prefix()
        );
    } else {
        sandbox.remove(&[HISTORY_CONSUMER, PAYOUTS_CONSUMER]).await;
    }
    result
}

/// Everything between the databases' creation and their removal.
async fn story(
    args: &RunArgs,
    plan: &Plan,
    topology: &Topology,
    urls: &[String; 3],
) -> Result<ExitCode> {
    let pools = Pools {
        bets: crate::db::connect(&urls[0], 4).await?,
        history: crate::db::connect(&urls[1], 4).await?,
        ledger: crate::db::connect(&urls[2], 4).await?,
    };
    crate::db::migrate_bets(&pools.bets).await?;
    crate::db::migrate_history(&pools.history).await?;
    crate::db::migrate_ledger(&pools.ledger).await?;

    let sup = Supervisor::for_run("igaming")?;
    let mut common = Vec::new();
    for (flag, value) in [
        ("--bets-url", urls[0].as_str()),
        ("--history-url", urls[1].as_str()),
        ("--ledger-url", urls[2].as_str()),
        ("--broker-url", args.broker_url.as_str()),
        ("--name", topology.name()),
    ] {
        common.extend([flag.to_owned(), value.to_owned()]);
    }
    common.push("--fast".to_owned());
    let mut cluster = Cluster {
        sup,
        common,
        api: free_addr()?,
    };
    let result = drive(&mut cluster, plan, args, topology, &pools).await;
    cluster.sup.stop().await;
    for pool in [&pools.bets, &pools.history, &pools.ledger] {
        pool.close().await;
    }
    let checks = result?;
    Ok(support::table::conclude(&checks, cluster.sup.dir()))
}

/// Starts the processes, runs the load with the kills and the conflict, waits for the drain,
/// and returns the checks.
async fn drive(
    cluster: &mut Cluster,
    plan: &Plan,
    args: &RunArgs,
    topology: &Topology,
    pools: &Pools,
) -> Result<Vec<Check>> {
    for kind in Kind::ALL {
        cluster.start(kind).await?;
    }
    let http = HttpClient::new(Duration::from_secs(3));
    let load = Arc::new(Load::new(http, plan.load(cluster.api)));
    let mut first = LoadReport::default();
    crate::load::probe_bad_requests(&load, &mut first).await?;
    let report = Arc::new(Mutex::new(first));
    let progress = Arc::new(Progress::default());
    let driving = tokio::spawn(crate::load::drive(
        Arc::clone(&load),
        Arc::clone(&progress),
        Arc::clone(&report),
    ));

    let mut schedule = KillSchedule::new(&Kind::KILLED, plan.kill_rounds, plan.commands);
    let kills_planned = schedule.planned() as i64;
    let mut kills = 0i64;
    // The re-send: from 60% of the load, as soon as a payout is in the ledger.
    let inject_at = plan.commands * 3 / 5;
    let mut injected: Option<Injected> = None;
    let mut last_line = Instant::now();
    while !driving.is_finished() {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cluster.sup.check_alive()?;
        let placed = progress.placed.load(Ordering::Relaxed);
        if let Some(kind) = schedule.due(placed) {
            cluster.kill_and_restart(kind).await?;
            kills += 1;
        }
        if injected.is_none() && placed >= inject_at {
            injected = try_inject(cluster, args, topology, pools).await?;
        }
        if last_line.elapsed() > Duration::from_secs(2) {
            last_line = Instant::now();
            cluster.sup.say(&format!(
                "load: {} bets placed, {} settled, {} requests retried",
                placed,
                progress.settled.load(Ordering::Relaxed),
                load.retries()
            ));
        }
    }
    driving.await.context("the load driver panicked")??;
    // Kills not reached (a tiny --bets): now; the drain still has to survive them.
    while let Some(kind) = schedule.next_remaining() {
        cluster.kill_and_restart(kind).await?;
        kills += 1;
    }
    cluster.sup.say(&format!(
        "load done: {} bets placed, {} settled, {} requests retried with the same key",
        progress.placed.load(Ordering::Relaxed),
        progress.settled.load(Ordering::Relaxed),
        load.retries()
    ));
    let deadline = Instant::now() + plan.drain_timeout;
    let injected = loop {
        if let Some(i) = injected.take() {
            break i;
        }
        if Instant::now() > deadline {
            bail!("no payout reached the ledger: nothing to re-send");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        injected = try_inject(cluster, args, topology, pools).await?;
    };

    cluster
        .sup
        .wait_drained(plan.drain_timeout, &mut last_line, || async {
            let s = Snapshot::take(
                &pools.bets,
                &pools.history,
                &pools.ledger,
                Some(&injected),
                false,
            )
            .await?;
            Ok(s.pending(Some(&injected)))
        })
        .await?;
    let snapshot = Snapshot::take(
        &pools.bets,
        &pools.history,
        &pools.ledger,
        Some(&injected),
        true,
    )
    .await?;
    let report = report.lock().expect("report lock");
    println!(
        "requests retried with the same key: {}; placements whose retry was answered as a replay: {}",
        load.retries(),
        report.replayed_after_failure
    );
    println!(
        "re-sent event {} (bet {}): payout {} instead of {}; the ledger kept {}",
        injected.event_id,
        injected.bet_id,
        injected.changed_payout,
        injected.original_payout,
        snapshot.payouts.get(&injected.bet_id).copied().unwrap_or(0)
    );
    let facts = RunFacts {
        kills: (kills, kills_planned),
    };
    Ok(crate::verify::checks(&snapshot, &report, &injected, &facts))
}

/// The conflict injection, once a payout is in the ledger; `None` before.
async fn try_inject(
    cluster: &Cluster,
    args: &RunArgs,
    topology: &Topology,
    pools: &Pools,
) -> Result<Option<Injected>> {
    let say = |m: &str| cluster.sup.say(m);
    let injected =
        crate::conflict::inject(&args.broker_url, topology, &pools.bets, &pools.ledger, say)
            .await?;
    if let Some(i) = &injected {
        cluster.sup.say(&format!(
            "re-sent BetSettled {} of bet {} with payout {} (was {}) to the broker, same event id{}",
            i.event_id,
            i.bet_id,
            i.changed_payout,
            i.original_payout,
            match i.dropped_by_broker {
                0 => String::new(),
                n => format!(" (the broker dropped {n} earlier attempt(s) as duplicates)"),
            }
        ));
        cluster.sup.say(&format!(
            "re-emitted the same settlement of bet {} under a new event id {}",
            i.bet_id, i.reemitted_event_id
        ));
    }
    Ok(injected)
}
