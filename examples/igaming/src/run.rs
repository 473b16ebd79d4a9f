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

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sqlx::PgPool;
use support::http_client::HttpClient;
use support::run::{ModeArgs, Plan, RunServices, Sandbox};
use support::supervise::{Supervisor, child_args, free_addr, service_args};
use support::table::Check;
use support::watch::LoadWatch;

use crate::conflict::Injected;
use crate::load::Load;
use crate::topology::{HISTORY_CONSUMER, PAYOUTS_CONSUMER, Topology};
use crate::verify::Snapshot;

/// Options of `igaming run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// `--short` / `--long` and the overrides of their numbers.
    #[command(flatten)]
    mode: ModeArgs,
    /// The broker and the PostgreSQL server the run uses.
    #[command(flatten)]
    services: RunServices,
    /// Bets to place (overrides the mode's).
    #[arg(long)]
    bets: Option<u64>,
}

/// The processes of the story: the subcommand that runs each, and its name in messages.
mod process {
    use support::supervise::Process;

    pub const RELAY: Process = Process::new("relay", "relay");
    pub const HISTORY: Process = Process::new("history", "history projection");
    pub const PAYOUTS: Process = Process::new("payouts", "payout consumer");
    pub const BETS: Process = Process::new("bets", "bets API");
    /// The consumers, started after the relay (it creates the stream / exchange they bind to).
    pub const CONSUMERS: [Process; 2] = [HISTORY, PAYOUTS];
    /// The processes killed in the middle, in the order of a round.
    pub const KILLED: [Process; 4] = [BETS, RELAY, HISTORY, PAYOUTS];
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
    let names = crate::db::ALL.map(|db| format!("igaming_{pid}_{}", db.name));
    // An unknown broker is refused here, before anything is created.
    outbox::brokers().find(&args.services.broker_url)?;
    println!(
        "igaming run ({} mode): {} bets from {} clients, {} round(s) of kills, one re-sent and one re-emitted event",
        plan.mode, plan.commands, plan.clients, plan.kill_rounds
    );
    let sandbox = Sandbox::create(&args.services, &names, &topology).await?;
    let urls = [
        sandbox.url(&names[0])?,
        sandbox.url(&names[1])?,
        sandbox.url(&names[2])?,
    ];

    let result = story(&args, &plan, &topology, &urls).await;

    let consumers = [HISTORY_CONSUMER, PAYOUTS_CONSUMER];
    let objects = topology.prefix();
    sandbox
        .keep_or_remove(args.services.keep, &objects, &consumers)
        .await;
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
    crate::db::BETS.migrate(&pools.bets).await?;
    crate::db::HISTORY.migrate(&pools.history).await?;
    crate::db::LEDGER.migrate(&pools.ledger).await?;

    let databases = [
        ("--bets-url", urls[0].as_str()),
        ("--history-url", &urls[1]),
        ("--ledger-url", &urls[2]),
    ];
    let common = service_args(&databases, &args.services.broker_url, topology);
    let exit = Supervisor::supervise("igaming", async |sup: &mut Supervisor| {
        drive(
            sup,
            plan,
            common,
            &args.services.broker_url,
            topology,
            &pools,
        )
        .await
    })
    .await;
    for pool in [&pools.bets, &pools.history, &pools.ledger] {
        pool.close().await;
    }
    exit
}

/// Starts the processes with the options `common`, runs the load with the kills and the
/// conflict, waits for the drain, and returns the checks.
async fn drive(
    sup: &mut Supervisor,
    plan: &Plan,
    common: Vec<String>,
    broker_url: &str,
    topology: &Topology,
    pools: &Pools,
) -> Result<Vec<Check>> {
    let api = free_addr()?;
    sup.start(process::RELAY, common.clone()).await?;
    for consumer in process::CONSUMERS {
        sup.start(consumer, common.clone()).await?;
    }
    let bets = child_args(&["--listen", &api.to_string()], &common);
    sup.start(process::BETS, bets).await?;
    let http = HttpClient::new(Duration::from_secs(3));
    let load = Arc::new(Load::new(http, plan.load(api)));
    crate::load::probe_bad_requests(&load).await?;
    let driving = tokio::spawn(crate::load::drive(Arc::clone(&load)));

    let mut watch = LoadWatch::new(plan, &process::KILLED, process::BETS);
    // The re-send: from 60% of the load, as soon as a payout is in the ledger.
    let inject_at = plan.commands * 3 / 5;
    let mut injected: Option<Injected> = None;
    let progress = &load.progress;
    while !driving.is_finished() {
        let placed = watch.beat(sup, &progress.placed).await?;
        if injected.is_none() && placed >= inject_at {
            injected = try_inject(sup, broker_url, topology, pools).await?;
        }
        watch.progress(sup, || {
            format!(
                "load: {} bets placed, {} settled, {} requests retried",
                placed,
                progress.settled.load(Ordering::Relaxed),
                load.retries()
            )
        });
    }
    driving.await.context("the load driver panicked")??;
    // Kills not reached (a tiny --bets): now; the drain still has to survive them.
    watch.kill_the_rest(sup).await?;
    sup.say(&format!(
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
        injected = try_inject(sup, broker_url, topology, pools).await?;
    };

    let (bets, history, ledger) = (&pools.bets, &pools.history, &pools.ledger);
    let pending = || async {
        let s = Snapshot::take(bets, history, ledger, Some(&injected), false).await?;
        Ok(s.pending(Some(&injected)))
    };
    watch.drain(sup, plan.drain_timeout, pending).await?;
    let snapshot = Snapshot::take(bets, history, ledger, Some(&injected), true).await?;
    let idempotency = load.idempotency();
    println!(
        "requests retried with the same key: {}; placements whose retry was answered as a replay: {}",
        idempotency.retries, idempotency.replayed_after_failure
    );
    println!(
        "re-sent event {} (bet {}): payout {} instead of {}; the ledger kept {}",
        injected.event_id,
        injected.bet_id,
        injected.changed_payout,
        injected.original_payout,
        snapshot.payouts.get(&injected.bet_id).copied().unwrap_or(0)
    );
    let report = load.report();
    let mut checks = crate::verify::checks(&snapshot, &report, &injected);
    checks.extend(idempotency.checks("probe requests answered as documented (4xx, 409, 422)"));
    checks.push(watch.check());
    Ok(checks)
}

/// The conflict injection, once a payout is in the ledger; `None` before.
async fn try_inject(
    sup: &Supervisor,
    broker_url: &str,
    topology: &Topology,
    pools: &Pools,
) -> Result<Option<Injected>> {
    let say = |m: &str| sup.say(m);
    let injected =
        crate::conflict::inject(broker_url, topology, &pools.bets, &pools.ledger, say).await?;
    if let Some(i) = &injected {
        sup.say(&format!(
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
        sup.say(&format!(
            "re-emitted the same settlement of bet {} under a new event id {}",
            i.bet_id, i.reemitted_event_id
        ));
    }
    Ok(injected)
}
