//! Running one cell: reset, start the system with the crash point armed, restart whatever
//! dies until the system is quiet, then check the invariants and say whether the cell ended as
//! the design expects.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use outbox_http::HttpPayoutProvider;

use super::cells::{Action, Cell, Expect, Role};
use super::env::Env;
use super::invariants::{Check, check_invariants, provider_payouts};
use super::probes::{
    check_in_flight, effects_stats, expired_leases, is_quiet, stale_marks_blocked,
};
use super::process::{aborted, count_in_log, log_tail};
use super::system::{Processes, SystemSpec, start_system};
use super::{LOG_TARGET, RELAY_LEASE_SECS};

/// The lease cell's longest wait, after the frozen relay's lease expired, for the other relay to
/// take its aggregates over, and then for the woken relay to settle.
const TAKEOVER_WAIT: Duration = Duration::from_secs(30);

/// One line of the matrix: what a cell observed and whether that is what it expects.
pub(super) struct Row {
    pub(super) observed: String,
    pub(super) wire_duplicates: usize,
    pub(super) pass: bool,
}

/// What happened while a cell ran, as its end checks need it.
#[derive(Default)]
struct CellRun {
    crashed: u32,
    unplanned: u32,
    in_flight_clean: Option<bool>,
    stopped_at: Option<Instant>,
    resumed: bool,
    resumed_at: Option<Instant>,
    settled: bool,
    takeover_left: Option<i64>,
    unknown_peak: i64,
    delay_lifted: bool,
    quiet_since: Option<Instant>,
    producer_done: bool,
    timed_out: bool,
}

pub(super) async fn run_cell(
    env: &Env,
    cell: &Cell,
    payments: u64,
    timeout_secs: u64,
) -> Result<Row> {
    env.reset().await?;
    let logs = env.log_dir.join(cell.id);
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
    let seen =
        crate::observer::spawn_observer(env.broker, &env.broker_url, &env.observed()).await?;
    let mut sys = start_system(env, cell_spec(cell, &logs, payments)).await?;
    let run = watch_cell(env, cell, &mut sys, &logs, timeout_secs).await?;
    // Everything but the provider (procs[0]): its ledger is read below.
    for p in sys.procs.iter_mut().skip(1).rev() {
        p.stop().await;
    }
    // The frozen relay is relay-0 (the first relay is the armed one); its log says how many of
    // its marks the database refused after it woke up.
    let stale_marks = if cell.action == Action::Stop {
        stale_marks_blocked(&logs.join("relay-0.log"))
    } else {
        0
    };
    let payouts = provider_payouts(&sys.provider_url).await;
    sys.procs[0].stop().await;
    let seen = seen.seen();
    let check = check_invariants(env, &seen, payouts, true).await?;
    let problems = cell_problems(cell, &run, &check, stale_marks, &logs, timeout_secs);
    Ok(judge(cell, &run, &check, problems, stale_marks))
}

/// The system a cell starts: its crash point armed (the slow provider instead in the cell of
/// the lost answer), two relays where one must take over from the other.
fn cell_spec<'a>(cell: &'a Cell, logs: &'a Path, payments: u64) -> SystemSpec<'a> {
    let (delay, timeout) = match cell.action {
        Action::SlowProvider => (1500, 400),
        _ => (0, 1000),
    };
    let arm = match cell.action {
        Action::SlowProvider => None,
        a => Some((cell.target, cell.point, cell.skip, a)),
    };
    let relays = match cell.action {
        Action::Stop | Action::Takeover => 2,
        _ => 1,
    };
    SystemSpec {
        logs,
        payments,
        producer_extra: &[],
        relays,
        provider_idempotent: cell.provider_idempotent,
        provider_delay_ms: delay,
        executor_timeout_ms: timeout,
        arm,
    }
}

/// Supervises the cell's processes until the system has been quiet for a while, or until
/// `timeout_secs`.
async fn watch_cell(
    env: &Env,
    cell: &Cell,
    sys: &mut Processes,
    logs: &Path,
    timeout_secs: u64,
) -> Result<CellRun> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout_secs);
    let mut run = CellRun::default();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        restart_ended(env, cell, sys, &mut run).await?;
        if cell.action == Action::Stop {
            resume_after_takeover(env, sys, logs, &mut run).await?;
        }
        let s = effects_stats(env).await?;
        run.unknown_peak = run.unknown_peak.max(s.unknown);
        if cell.action == Action::SlowProvider
            && !run.delay_lifted
            && (run.unknown_peak >= 10 || started.elapsed() > Duration::from_secs(20))
        {
            HttpPayoutProvider::new(&sys.provider_url)?
                .stand_in_set_delay(0)
                .await?;
            run.delay_lifted = true;
            run.crashed += 1;
        }
        let quiet = run.producer_done
            && run.crashed > 0
            && is_quiet(env, &s).await?
            && (cell.action != Action::Stop || run.settled);
        if quiet {
            let since = *run.quiet_since.get_or_insert_with(Instant::now);
            // Long enough for a redelivery after the NATS ack wait to show up.
            if since.elapsed() > Duration::from_millis(2500) {
                break;
            }
        } else {
            run.quiet_since = None;
        }
        if Instant::now() > deadline {
            run.timed_out = true;
            break;
        }
    }
    Ok(run)
}

/// Restarts every process that ended since the last look, except a producer that finished and
/// the armed relay of the takeover cell; counts the planned crashes and the unplanned ends.
async fn restart_ended(
    env: &Env,
    cell: &Cell,
    sys: &mut Processes,
    run: &mut CellRun,
) -> Result<()> {
    for i in 0..sys.procs.len() {
        let Some(status) = sys.procs[i].exited() else {
            continue;
        };
        let p = &mut sys.procs[i];
        if p.role == Role::Producer && status.success() {
            run.producer_done = true;
            continue;
        }
        if p.crash.is_some() && p.starts == 1 && aborted(&status) {
            run.crashed += 1;
            if cell.point == "producer.before_commit" {
                run.in_flight_clean = Some(check_in_flight(env, p).await?);
            }
            if cell.action == Action::Takeover {
                // Stays down: the standby alone must carry on.
                continue;
            }
        } else {
            run.unplanned += 1;
            tracing::warn!(target: LOG_TARGET, process = %p.label, %status, "process ended unexpectedly; restarting");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        sys.procs[i].start(env).await?;
    }
    Ok(())
}

/// The lease cell: notes when the armed relay froze, resumes it once the other relay took over,
/// and notes when the woken relay settled.
async fn resume_after_takeover(
    env: &Env,
    sys: &Processes,
    logs: &Path,
    run: &mut CellRun,
) -> Result<()> {
    let target = sys.procs.iter().find(|p| p.crash.is_some()).expect("armed");
    if run.stopped_at.is_none() && target.is_stopped() {
        run.stopped_at = Some(Instant::now());
    }
    // Resumed once its lease is long expired AND the other relay has taken over every
    // aggregate it held (no expired lease is left: the takeover's upsert replaced them).
    // Resuming on time alone made the cell depend on the other relay's speed: on a loaded
    // machine it had not claimed the rows yet, the woken relay's marks then rightly
    // succeeded, and the cell reported a refused-marks count of 0. After
    // `TAKEOVER_WAIT` the relay is resumed anyway, and the check below says why it failed.
    if let Some(t) = run.stopped_at
        && !run.resumed
        && t.elapsed() > Duration::from_secs_f64(RELAY_LEASE_SECS * 2.0 + 1.0)
    {
        let left = expired_leases(env).await?;
        if left == 0 || t.elapsed() > TAKEOVER_WAIT {
            target.signal("-CONT");
            run.resumed = true;
            run.resumed_at = Some(Instant::now());
            run.takeover_left = Some(left);
            run.crashed += 1;
        }
    }
    // Quiet needs the woken relay to have settled (its refused marks are logged) too,
    // however slowly it gets the CPU back; bounded by `TAKEOVER_WAIT` again.
    if let Some(t) = run.resumed_at
        && !run.settled
    {
        run.settled =
            stale_marks_blocked(&logs.join("relay-0.log")) > 0 || t.elapsed() > TAKEOVER_WAIT;
    }
    Ok(())
}

/// The invariants' violations plus what the cell itself had to show (its crash, its takeover,
/// its unknown outcomes) and did not.
fn cell_problems(
    cell: &Cell,
    run: &CellRun,
    check: &Check,
    stale_marks: usize,
    logs: &Path,
    timeout_secs: u64,
) -> Vec<String> {
    let mut problems = check.violations.clone();
    if run.crashed == 0 {
        problems.push(format!("crash point {} was never reached", cell.point));
    }
    if run.timed_out {
        problems.push(format!("not quiet after {timeout_secs} s"));
    }
    if let Some(false) = run.in_flight_clean {
        problems.push("the transaction in flight at the crash left rows behind".into());
    }
    if cell.action == Action::Stop && stale_marks == 0 {
        problems.push(format!(
            "the frozen relay's marks were not refused after its lease expired (expired leases \
             left when it was resumed: {}; the end of its log: {})",
            run.takeover_left.unwrap_or(-1),
            log_tail(&logs.join("relay-0.log"), 5)
        ));
    }
    if cell.action == Action::Takeover
        && count_in_log(
            &logs.join("relay-1.log"),
            "took over from the relay that held it",
        ) == 0
    {
        problems.push(format!(
            "the standby never took the slot over (the end of its log: {})",
            log_tail(&logs.join("relay-1.log"), 5)
        ));
    }
    if cell.action == Action::SlowProvider && run.unknown_peak == 0 {
        problems.push("no work item ever became unknown".into());
    }
    problems
}

/// The cell's row: what it observed, and whether that is what it expects.
fn judge(
    cell: &Cell,
    run: &CellRun,
    check: &Check,
    problems: Vec<String>,
    stale_marks: usize,
) -> Row {
    let mut observed = check.summary.clone();
    if run.unplanned > 0 {
        observed.push_str(&format!(", {} unplanned restarts", run.unplanned));
    }
    if let Some(clean) = run.in_flight_clean {
        observed.push_str(if clean {
            ", in-flight tx left nothing"
        } else {
            ", in-flight tx LEFT ROWS"
        });
    }
    if cell.action == Action::Stop {
        observed.push_str(&format!(
            ", stale relay's marks refused or failed before the database: {stale_marks}"
        ));
    }
    if cell.action == Action::SlowProvider {
        observed.push_str(&format!(", unknown backlog peak {} -> 0", run.unknown_peak));
    }
    let pass = match cell.expect {
        Expect::ExactlyOnce => problems.is_empty() && check.double_payouts == 0,
        Expect::DoublePayout => {
            problems.is_empty() && check.double_payouts > 0 && check.missing_payouts == 0
        }
    };
    if !problems.is_empty() {
        observed.push_str(&format!("; VIOLATED: {}", problems.join("; ")));
    }
    if cell.expect == Expect::DoublePayout && check.double_payouts == 0 {
        observed.push_str("; the double payout did not show");
    }
    Row {
        observed,
        wire_duplicates: check.wire_duplicates,
        pass,
    }
}
