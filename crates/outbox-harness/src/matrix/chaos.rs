//! `--chaos`: a time-bounded steady workload with random SIGKILLs of relays, the consumer and
//! the executor, one broker restart, and the invariants checked at the end.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::process::Command;

use super::LOG_TARGET;
use super::MatrixArgs;
use super::cells::Role;
use super::env::Env;
use super::invariants::{Check, check_invariants, provider_payouts};
use super::probes::{effects_stats, is_quiet};
use super::process::is_kill;
use super::report::splice_markdown;
use super::system::{Processes, SystemSpec, start_system};

/// What the chaos run did, as its table reports it.
#[derive(Default)]
struct ChaosRun {
    kills: BTreeMap<&'static str, u32>,
    total_kills: u32,
    broker_restarts: u32,
    unplanned: u32,
    producer_done: bool,
    quiet_since: Option<Instant>,
    timed_out: bool,
}

pub(super) async fn chaos(env: &Env, args: &MatrixArgs, restart_cmd: &str) -> Result<ExitCode> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let mut rng = fastrand::Rng::with_seed(seed);
    println!(
        "chaos: {} s of steady workload, at most {} kills, one broker restart, seed {seed}",
        args.chaos_secs, args.max_kills
    );
    env.reset().await?;
    let logs = env.log_dir.join("chaos");
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let seen =
        crate::observer::spawn_observer(env.broker, &env.broker_url, &env.observed()).await?;
    let duration = format!("--duration-secs={}", args.chaos_secs);
    let mut sys = start_system(
        env,
        SystemSpec {
            logs: &logs,
            payments: 1_000_000,
            producer_extra: &["--pace-ms=15", &duration],
            relays: 2,
            provider_idempotent: true,
            provider_delay_ms: 0,
            executor_timeout_ms: 1000,
            arm: None,
        },
    )
    .await?;
    let run = run_chaos(env, args, restart_cmd, &mut sys, &mut rng).await?;
    for p in sys.procs.iter_mut().skip(1).rev() {
        p.stop().await;
    }
    let payouts = provider_payouts(&sys.provider_url).await;
    sys.procs[0].stop().await;
    let seen = seen.seen();
    let check = check_invariants(env, &seen, payouts, false).await?;
    report(env, args, seed, &run, &check)
}

/// The steady workload with its kills and its broker restart, then the wait until the system
/// is quiet (or the deadline).
async fn run_chaos(
    env: &Env,
    args: &MatrixArgs,
    restart_cmd: &str,
    sys: &mut Processes,
    rng: &mut fastrand::Rng,
) -> Result<ChaosRun> {
    let started = Instant::now();
    let chaos_end = started + Duration::from_secs(args.chaos_secs);
    let restart_at = started + Duration::from_secs(args.chaos_secs / 2);
    let mut next_kill = started + Duration::from_millis(rng.u64(1000..3000));
    let deadline = chaos_end + Duration::from_secs(args.cell_timeout_secs.max(60));
    let mut run = ChaosRun::default();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Instant::now();
        restart_ended(env, sys, rng, &mut run).await?;
        if run.broker_restarts == 0 && now >= restart_at {
            restart_broker(restart_cmd, started, &mut run).await?;
        }
        if now < chaos_end && now >= next_kill && run.total_kills < args.max_kills {
            kill_one(sys, rng, &mut run);
            next_kill = now + Duration::from_millis(rng.u64(800..3500));
        }
        if run.producer_done && now >= chaos_end {
            let s = effects_stats(env).await?;
            if is_quiet(env, &s).await? {
                let since = *run.quiet_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(2500) {
                    break;
                }
            } else {
                run.quiet_since = None;
            }
        }
        if now > deadline {
            run.timed_out = true;
            break;
        }
    }
    Ok(run)
}

/// Restarts every process that ended (after a random pause), except the producer once it has
/// finished its workload.
async fn restart_ended(
    env: &Env,
    sys: &mut Processes,
    rng: &mut fastrand::Rng,
    run: &mut ChaosRun,
) -> Result<()> {
    for i in 0..sys.procs.len() {
        let Some(status) = sys.procs[i].exited() else {
            continue;
        };
        if sys.procs[i].role == Role::Producer && status.success() {
            run.producer_done = true;
            continue;
        }
        if !is_kill(&status) {
            run.unplanned += 1;
            tracing::warn!(target: LOG_TARGET, process = %sys.procs[i].label, %status, "process ended on its own; restarting");
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(0..400))).await;
        sys.procs[i].start(env).await?;
    }
    Ok(())
}

/// Runs `--broker-restart-cmd`.
async fn restart_broker(restart_cmd: &str, started: Instant, run: &mut ChaosRun) -> Result<()> {
    let t = Instant::now();
    let status = Command::new("sh")
        .args(["-c", restart_cmd])
        .status()
        .await
        .context("cannot run --broker-restart-cmd")?;
    if !status.success() {
        bail!("--broker-restart-cmd failed: {status}");
    }
    run.broker_restarts += 1;
    println!(
        "  [{:>5.1}s] broker restarted ({:.1} s)",
        started.elapsed().as_secs_f64(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// SIGKILLs one running relay, consumer or executor, picked at random.
fn kill_one(sys: &mut Processes, rng: &mut fastrand::Rng, run: &mut ChaosRun) {
    let victims: Vec<usize> = sys
        .procs
        .iter()
        .enumerate()
        .filter(|(_, p)| {
            matches!(p.role, Role::Relay | Role::Consumer | Role::Executor) && p.child.is_some()
        })
        .map(|(i, _)| i)
        .collect();
    if !victims.is_empty() {
        let i = victims[rng.usize(..victims.len())];
        sys.procs[i].signal("-KILL");
        run.total_kills += 1;
        *run.kills.entry(sys.procs[i].role.name()).or_default() += 1;
    }
}

/// Prints the chaos table (and writes it into `--markdown-into`) with the verdict.
fn report(
    env: &Env,
    args: &MatrixArgs,
    seed: u64,
    run: &ChaosRun,
    check: &Check,
) -> Result<ExitCode> {
    let mut problems = check.violations.clone();
    if run.timed_out {
        problems.push("not quiet in time after the chaos ended".into());
    }
    if run.broker_restarts == 0 {
        problems.push("the broker was never restarted".into());
    }
    if run.total_kills == 0 {
        problems.push("nothing was killed".into());
    }
    let kills_text = run
        .kills
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut table = format!("| chaos ({}) | value |\n| --- | --- |\n", env.broker);
    table.push_str(&format!(
        "| run | {} s workload, seed {seed} |\n",
        args.chaos_secs
    ));
    table.push_str(&format!(
        "| kills (SIGKILL) | {}: {kills_text} |\n",
        run.total_kills
    ));
    table.push_str(&format!("| broker restarts | {} |\n", run.broker_restarts));
    table.push_str(&format!(
        "| processes that ended on their own | {} |\n",
        run.unplanned
    ));
    table.push_str(&format!("| outcome | {} |\n", check.summary));
    table.push_str(&format!(
        "| wire duplicates seen | {} |\n",
        check.wire_duplicates
    ));
    table.push_str(&format!(
        "| lost events / duplicate effects / order violations | {} |\n",
        if problems.is_empty() {
            "0 / 0 / 0".to_owned()
        } else {
            problems.join("; ")
        }
    ));
    println!();
    print!("{table}");
    if let Some(path) = &args.markdown_into {
        splice_markdown(path, &format!("chaos:{}", env.broker), &table)?;
        println!("table written into {}", path.display());
    }
    if problems.is_empty() {
        println!("chaos on {}: PASS", env.broker);
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "chaos on {}: FAIL (logs in {})",
            env.broker,
            env.log_dir.display()
        );
        Ok(ExitCode::from(1))
    }
}
