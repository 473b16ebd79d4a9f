//! `outbox crash-matrix`: the crash matrix of the design (§3), executable.
//!
//! For every cell the harness runs the real processes of a small payments system against the
//! real PostgreSQL and a real broker:
//!
//! * `outbox demo-producer`: payments, each one transaction with its intent (some rolled back on
//!   purpose, some captured in a second transaction);
//! * `outbox relay` (two of them in the lease cell);
//! * `outbox demo-consumer --payouts`: inbox + report + effect log + one payout work item per
//!   payment, in one transaction, ack after commit, ordering guard on;
//! * `outbox effects run`: the executor calling the payment provider with idempotency keys and
//!   reconciling unknown outcomes;
//! * `outbox demo-provider`: a stand-in payment provider over HTTP.
//!
//! One process is armed with a crash point (`OUTBOX_CRASH_POINT`, see `outbox_core::crash`) and
//! dies there for real (SIGABRT, no cleanup), or freezes there (SIGSTOP) in the lease cell. The
//! harness restarts whatever died, waits until the system is quiet, and then checks the
//! invariants with SQL, with an independent subscriber on the broker and with the provider's
//! own ledger:
//!
//! 1. every committed business row has its intents, and they were all published;
//! 2. nothing of a rolled-back transaction exists anywhere (database, wire, consumer);
//! 3. one event id per intent, however often it was republished (G4);
//! 4. per consumer exactly one effect per event (G5, G6);
//! 5. per-aggregate order on the wire and at the consumer (G7);
//! 6. one payout work item per payment, all resolved, and on the provider's side exactly one
//!    payout per payment (or, in the cell without provider idempotency, the double payout the
//!    design predicts).
//!
//! It prints the matrix (cell, expected, observed, duplicates seen on the wire) and exits 1 if
//! any cell did not end as expected.
//!
//! `--chaos` runs a time-bounded steady workload instead, SIGKILLs relays, the consumer and the
//! executor at random moments, restarts the broker once with `--broker-restart-cmd`, and checks
//! the same invariants at the end.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use outbox::secrets::redact_url as redact;
use outbox_postgres::Schema;

use crate::Context;

mod cell;
mod cells;
mod chaos;
mod env;
mod invariants;
mod probes;
mod process;
mod report;
mod system;

use cell::{Row, run_cell};
use cells::{CELLS, Cell};
use env::Env;
use report::splice_markdown_check;

const CONSUMER: &str = "reporting";
/// Relay lease in the harness's relay configuration (seconds).
const RELAY_LEASE_SECS: f64 = 3.0;

/// The log target of the matrix's own log lines (those of its submodules too).
const LOG_TARGET: &str = "outbox_harness::matrix";

/// Options of `outbox crash-matrix`.
#[derive(clap::Args, Debug)]
pub struct MatrixArgs {
    /// Only these cells (comma-separated ids; `--list` shows them).
    #[arg(long, value_delimiter = ',')]
    cells: Vec<String>,
    /// List the cells and exit.
    #[arg(long)]
    list: bool,
    /// Payments per cell.
    #[arg(long, default_value_t = 120)]
    payments: u64,
    /// Prefix of the schema, NATS stream / subjects and RabbitMQ exchange / queue it creates
    /// (and drops at the start of each cell). Runs with different prefixes can share a server.
    #[arg(long, default_value = "outbox_cm")]
    prefix: String,
    /// Break the consumer on purpose to prove the harness notices: `ack-before-commit`.
    #[arg(long = "break", value_name = "MODE")]
    break_mode: Option<String>,
    /// Give up on a cell that is not quiet after this many seconds.
    #[arg(long, default_value_t = 90)]
    cell_timeout_secs: u64,
    /// Run the chaos mode instead of the matrix.
    #[arg(long)]
    chaos: bool,
    /// Chaos: seconds of steady workload with random kills.
    #[arg(long, default_value_t = 60)]
    chaos_secs: u64,
    /// Chaos: at most this many kills.
    #[arg(long, default_value_t = 40)]
    max_kills: u32,
    /// Chaos: shell command that restarts the broker (run once, mid-run). Required with --chaos.
    #[arg(long)]
    broker_restart_cmd: Option<String>,
    /// Chaos: seed of the random kill schedule (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Write the printed table into this Markdown file, between the markers
    /// `<!-- crash-matrix:<broker>:begin -->` and `<!-- crash-matrix:<broker>:end -->`
    /// (chaos mode: `<!-- chaos:<broker>:begin -->` …).
    #[arg(long)]
    markdown_into: Option<PathBuf>,
    /// Where the processes' logs go (default: a directory under the system temp dir).
    #[arg(long)]
    log_dir: Option<PathBuf>,
    /// The relay the cells run: `polling` (leases) or `cdc` (a replication slot, which needs
    /// `wal_level = logical`). In CDC mode the lease cell gives way to the standby takeover.
    #[arg(long, value_enum, default_value_t = RelayMode::Polling)]
    relay_mode: RelayMode,
}

/// `--relay-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RelayMode {
    /// The polling relay: claims with leases, any number of relays.
    Polling,
    /// The CDC relay: streams the outbox table's log through a replication slot that the
    /// harness creates (named after `--prefix`) and drops at the end; one relay streams, a
    /// second one waits as a standby.
    Cdc,
}

impl RelayMode {
    fn name(self) -> &'static str {
        match self {
            RelayMode::Polling => "polling",
            RelayMode::Cdc => "CDC",
        }
    }
}

/// Runs `outbox crash-matrix`.
pub async fn run(args: MatrixArgs, ctx: &Context) -> Result<ExitCode> {
    if args.list {
        list_cells(args.relay_mode);
        return Ok(ExitCode::SUCCESS);
    }
    let db_url = ctx.database_url_or_local();
    let broker_url = ctx.broker_url_or_local();
    let break_ack = parse_break(args.break_mode.as_deref())?;
    check_prefix(&args.prefix)?;
    let mode = args.relay_mode;
    let cells = select_cells(&args.cells, mode)?;
    let broker = matrix_broker(ctx, &broker_url)?;
    let key = format!(
        "{}:{broker}{}",
        if args.chaos { "chaos" } else { "crash-matrix" },
        if mode == RelayMode::Cdc { ":cdc" } else { "" }
    );
    if let Some(path) = &args.markdown_into {
        // Refuse at once rather than after minutes of cells.
        splice_markdown_check(path, &key)?;
    }
    let env = open_env(&args, ctx, db_url, broker_url, broker, break_ack).await?;
    println!(
        "outbox crash-matrix: broker {} ({}), {} relay, database {}, {} payments per cell, logs \
         in {}",
        redact(&env.broker_url),
        broker,
        env.relay_name(),
        redact(&env.db_url),
        args.payments,
        env.log_dir.display()
    );
    if break_ack {
        println!("consumer BROKEN ON PURPOSE: it acknowledges before its commit");
    }
    if args.chaos {
        let Some(cmd) = args.broker_restart_cmd.clone() else {
            bail!(
                "invalid option `--broker-restart-cmd`: chaos mode restarts the broker once and needs the command that does it"
            );
        };
        let code = chaos::chaos(&env, &args, &cmd).await;
        env.remove_slot().await?;
        return code;
    }
    let rows = run_cells(&env, &cells, &args).await;
    // A slot left behind would keep WAL on the server for good.
    env.remove_slot().await?;
    report::finish(&env, &args, &rows, &key)
}

/// `--list`: the cells of `mode`'s relay.
fn list_cells(mode: RelayMode) {
    for c in CELLS.iter().filter(|c| c.action.applies_to(mode)) {
        println!("{:<34} {}", c.id, c.step);
    }
}

/// `--break`: whether the consumer acknowledges before its commit.
fn parse_break(mode: Option<&str>) -> Result<bool> {
    Ok(match mode {
        None => false,
        Some("ack-before-commit") => true,
        Some(other) => bail!("invalid option `--break`: `{other}` (known: ack-before-commit)"),
    })
}

/// `--prefix` names a schema, streams and queues: 1-40 characters of a-z, 0-9 and _.
fn check_prefix(prefix: &str) -> Result<()> {
    if !prefix
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        || prefix.is_empty()
        || prefix.len() > 40
    {
        bail!("invalid option `--prefix`: `{prefix}` must be 1-40 characters of a-z, 0-9 and _");
    }
    Ok(())
}

/// `--cells` (every cell of `mode` when empty), in the order given.
fn select_cells(ids: &[String], mode: RelayMode) -> Result<Vec<Cell>> {
    if ids.is_empty() {
        return Ok(CELLS
            .iter()
            .filter(|c| c.action.applies_to(mode))
            .copied()
            .collect());
    }
    let mut v = Vec::new();
    for id in ids {
        match CELLS.iter().find(|c| c.id == id) {
            Some(c) if c.action.applies_to(mode) => v.push(*c),
            Some(_) => bail!(
                "invalid option `--cells`: cell `{id}` does not apply to the {} relay \
                 (see --list with --relay-mode)",
                mode.name()
            ),
            None => bail!("invalid option `--cells`: unknown cell `{id}` (see --list)"),
        }
    }
    Ok(v)
}

/// The broker of `broker_url`: one of those the matrix drives.
fn matrix_broker(ctx: &Context, broker_url: &str) -> Result<&'static str> {
    Ok(match ctx.brokers.find(broker_url)?.name {
        b @ ("nats" | "rabbitmq" | "kafka") => b,
        other => bail!(
            "invalid configuration `broker_url`: the crash matrix drives NATS, RabbitMQ and Kafka, not {other} ({})",
            redact(broker_url)
        ),
    })
}

/// The run's environment: its log directory created, its pool connected.
async fn open_env(
    args: &MatrixArgs,
    ctx: &Context,
    db_url: String,
    broker_url: String,
    broker: &'static str,
    break_ack: bool,
) -> Result<Env> {
    let log_dir = args.log_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("outbox-crash-matrix-{}", args.prefix))
    });
    std::fs::create_dir_all(&log_dir)
        .with_context(|| format!("cannot create the log directory {}", log_dir.display()))?;
    let pool = crate::connect_db(&db_url).await?;
    Ok(Env {
        db_url,
        broker_url,
        broker,
        prefix: args.prefix.clone(),
        schema: Schema::new(&args.prefix).context("invalid option `--prefix`")?,
        log_dir,
        exe: std::env::current_exe().context("cannot find the outbox binary")?,
        pool,
        break_ack,
        brokers: ctx.brokers.clone(),
        settings: ctx.settings.clone(),
        cell: std::sync::atomic::AtomicU64::new(0),
        run: uuid::Uuid::now_v7().simple().to_string(),
        cdc: args.relay_mode == RelayMode::Cdc,
    })
}

/// Runs every cell in turn under a progress bar, printing a line per cell.
async fn run_cells(env: &Env, cells: &[Cell], args: &MatrixArgs) -> Vec<(Cell, Row)> {
    let mut rows = Vec::new();
    let bar = crate::progress::Progress::new(cells.len() as u64, "crash matrix");
    for cell in cells {
        let started = Instant::now();
        bar.message(cell.id.to_owned());
        let row = match run_cell(env, cell, args.payments, args.cell_timeout_secs).await {
            Ok(r) => r,
            Err(e) => Row {
                observed: format!("harness error: {e:#}"),
                wire_duplicates: 0,
                pass: false,
            },
        };
        bar.println(&format!(
            "  {:<34} {:>5.1}s  {}  {}",
            cell.id,
            started.elapsed().as_secs_f64(),
            if row.pass { "PASS" } else { "FAIL" },
            row.observed
        ));
        bar.inc();
        rows.push((*cell, row));
    }
    bar.finish();
    rows
}
