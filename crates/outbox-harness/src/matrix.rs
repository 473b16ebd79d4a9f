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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use outbox::secrets::redact_url as redact;
use outbox_core::broker::{BrokerSettings, Registry, SourceOptions};
use outbox_http::HttpPayoutProvider;
use outbox_postgres::Schema;
use serde_json::json;
use sqlx::{AssertSqlSafe, PgPool};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use uuid::Uuid;

use crate::Context;
use crate::observer::Seen;
use crate::workload::rolled_back;

const DEFAULT_DB: &str = "postgres://postgres@127.0.0.1:5432/test";
const DEFAULT_BROKER: &str = "nats://127.0.0.1:4222";
const CONSUMER: &str = "reporting";
/// Relay lease in the harness's relay configuration (seconds).
const RELAY_LEASE_SECS: f64 = 3.0;

/// The lease cell's longest wait, after the frozen relay's lease expired, for the other relay to
/// take its aggregates over, and then for the woken relay to settle.
const TAKEOVER_WAIT: Duration = Duration::from_secs(30);

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Producer,
    Relay,
    Consumer,
    Executor,
    Provider,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Relay => "relay",
            Role::Consumer => "consumer",
            Role::Executor => "executor",
            Role::Provider => "provider",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// All invariants hold, exactly one payout per payment.
    ExactlyOnce,
    /// All invariants hold except that some payment was paid out twice.
    DoublePayout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Abort,
    /// Freeze at the point (SIGSTOP) past the relay lease, then resume (SIGCONT).
    Stop,
    /// No crash point: the provider answers slower than the executor's call timeout.
    SlowProvider,
    /// CDC only: abort at the point and stay down, so that the second relay, a standby on the
    /// slot, must take the stream over alone.
    Takeover,
}

impl Cell {
    /// What the cell expects with `mode`'s relay. The CDC relay confirms its position with the
    /// next status update (every second), not with the settle: killed after the settle, it
    /// sends the last unconfirmed events again (same event ids, absorbed by the inbox).
    fn expected_in(&self, mode: RelayMode) -> &'static str {
        match (self.id, mode) {
            ("relay.after_mark", RelayMode::Cdc) => {
                "nothing lost; the events settled since the last confirm go out again, same event_id"
            }
            _ => self.expected,
        }
    }
}

impl Action {
    /// Whether a cell with this action means anything for `mode`'s relay: leases exist only
    /// in polling mode, standbys only in CDC mode.
    fn applies_to(self, mode: RelayMode) -> bool {
        match self {
            Action::Stop => mode == RelayMode::Polling,
            Action::Takeover => mode == RelayMode::Cdc,
            Action::Abort | Action::SlowProvider => true,
        }
    }
}

/// One row of the matrix.
#[derive(Debug, Clone, Copy)]
struct Cell {
    id: &'static str,
    step: &'static str,
    target: Role,
    point: &'static str,
    action: Action,
    skip: u64,
    provider_idempotent: bool,
    expect: Expect,
    expected: &'static str,
}

const CELLS: &[Cell] = &[
    Cell {
        id: "producer.before_commit",
        step: "before producer commit",
        target: Role::Producer,
        point: "producer.before_commit",
        action: Action::Abort,
        skip: 40,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "in-flight tx leaves no row and no intent (G1); the rest once",
    },
    Cell {
        id: "producer.after_commit",
        step: "after producer commit, before publish",
        target: Role::Producer,
        point: "producer.after_commit",
        action: Action::Abort,
        skip: 40,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "committed intent published later; one effect each",
    },
    Cell {
        id: "relay.after_publish",
        step: "after broker accept, before relay marker",
        target: Role::Relay,
        point: "relay.after_publish",
        action: Action::Abort,
        skip: 30,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "republished, same event_id; inbox absorbs (G3-G5)",
    },
    Cell {
        id: "relay.after_mark",
        step: "after relay marker",
        target: Role::Relay,
        point: "relay.after_mark",
        action: Action::Abort,
        skip: 2,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "nothing lost, nothing repeated",
    },
    Cell {
        id: "relay.lease_expired",
        step: "relay lease expired while publishing",
        target: Role::Relay,
        point: "relay.after_publish",
        action: Action::Stop,
        skip: 10,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "other relay takes over; stale marks refused, order kept (G7)",
    },
    Cell {
        id: "relay.standby_takeover",
        step: "CDC: streaming relay dies, the standby takes the slot",
        target: Role::Relay,
        point: "relay.after_publish",
        action: Action::Takeover,
        skip: 20,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "standby streams from the confirmed position; republished, same event_id",
    },
    Cell {
        id: "consumer.after_inbox",
        step: "consumer after inbox insert, before commit",
        target: Role::Consumer,
        point: "consumer.after_inbox",
        action: Action::Abort,
        skip: 30,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "rollback, redelivery, one effect (G5, G6)",
    },
    Cell {
        id: "consumer.after_effect",
        step: "consumer after business update, before commit",
        target: Role::Consumer,
        point: "consumer.after_effect",
        action: Action::Abort,
        skip: 30,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "rollback, redelivery, one effect (G5, G6)",
    },
    Cell {
        id: "consumer.after_commit",
        step: "consumer after commit, before ack",
        target: Role::Consumer,
        point: "consumer.after_commit",
        action: Action::Abort,
        skip: 3,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "redelivery, dedup, no second effect (G5)",
    },
    Cell {
        id: "payout.after_call",
        step: "payout: after provider call, before record",
        target: Role::Executor,
        point: "effects.after_call",
        action: Action::Abort,
        skip: 10,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "key + reconciliation: exactly one payout",
    },
    Cell {
        id: "payout.after_call.no_idempotency",
        step: "payout: after provider call, before record",
        target: Role::Executor,
        point: "effects.after_call",
        action: Action::Abort,
        skip: 10,
        provider_idempotent: false,
        expect: Expect::DoublePayout,
        expected: "provider ignores keys: DOUBLE payout (proof ends here)",
    },
    Cell {
        id: "payout.after_record",
        step: "payout: after recording the result",
        target: Role::Executor,
        point: "effects.after_record",
        action: Action::Abort,
        skip: 10,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "recorded outcome kept: exactly one payout",
    },
    Cell {
        id: "payout.answer_lost",
        step: "payout: provider answer lost (timeout)",
        target: Role::Executor,
        point: "",
        action: Action::SlowProvider,
        skip: 0,
        provider_idempotent: true,
        expect: Expect::ExactlyOnce,
        expected: "unknown -> reconciled by key: one payout; backlog rises, falls",
    },
];

/// Runs `outbox crash-matrix`.
pub async fn run(args: MatrixArgs, ctx: &Context) -> Result<ExitCode> {
    if args.list {
        for c in CELLS
            .iter()
            .filter(|c| c.action.applies_to(args.relay_mode))
        {
            println!("{:<34} {}", c.id, c.step);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let db_url = ctx
        .database_url
        .clone()
        .unwrap_or_else(|| DEFAULT_DB.to_owned());
    let broker_url = ctx
        .broker_url
        .clone()
        .unwrap_or_else(|| DEFAULT_BROKER.to_owned());
    let break_ack = match args.break_mode.as_deref() {
        None => false,
        Some("ack-before-commit") => true,
        Some(other) => bail!("invalid option `--break`: `{other}` (known: ack-before-commit)"),
    };
    if !args
        .prefix
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        || args.prefix.is_empty()
        || args.prefix.len() > 40
    {
        bail!(
            "invalid option `--prefix`: `{}` must be 1-40 characters of a-z, 0-9 and _",
            args.prefix
        );
    }
    let mode = args.relay_mode;
    let cells: Vec<Cell> = if args.cells.is_empty() {
        CELLS
            .iter()
            .filter(|c| c.action.applies_to(mode))
            .copied()
            .collect()
    } else {
        let mut v = Vec::new();
        for id in &args.cells {
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
        v
    };
    let broker = match ctx.brokers.find(&broker_url)?.name {
        b @ ("nats" | "rabbitmq" | "kafka") => b,
        other => bail!(
            "invalid configuration `broker_url`: the crash matrix drives NATS, RabbitMQ and Kafka, not {other} ({})",
            redact(&broker_url)
        ),
    };
    let key = format!(
        "{}:{broker}{}",
        if args.chaos { "chaos" } else { "crash-matrix" },
        if mode == RelayMode::Cdc { ":cdc" } else { "" }
    );
    if let Some(path) = &args.markdown_into {
        // Refuse at once rather than after minutes of cells.
        splice_markdown_check(path, &key)?;
    }
    let log_dir = args.log_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("outbox-crash-matrix-{}", args.prefix))
    });
    std::fs::create_dir_all(&log_dir)
        .with_context(|| format!("cannot create the log directory {}", log_dir.display()))?;
    let pool = crate::connect_db(&db_url).await?;
    let env = Env {
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
        cdc: mode == RelayMode::Cdc,
    };
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
        let code = chaos(&env, &args, &cmd).await;
        env.remove_slot().await?;
        return code;
    }

    let mut rows = Vec::new();
    let bar = crate::progress::Progress::new(cells.len() as u64, "crash matrix");
    for cell in &cells {
        let started = Instant::now();
        bar.message(cell.id.to_owned());
        let row = match run_cell(&env, cell, args.payments, args.cell_timeout_secs).await {
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
    // A slot left behind would keep WAL on the server for good.
    env.remove_slot().await?;
    let label = match mode {
        RelayMode::Polling => broker.to_owned(),
        RelayMode::Cdc => format!("{broker}, CDC relay"),
    };
    let table = render(&rows, &label, mode);
    println!();
    println!("{table}");
    let failed = rows.iter().filter(|(_, r)| !r.pass).count();
    if let Some(path) = &args.markdown_into {
        splice_markdown(path, &key, &table)?;
        println!("table written into {}", path.display());
    }
    if failed == 0 {
        println!(
            "crash matrix on {label}: all {} cells as expected",
            rows.len()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "crash matrix on {label}: {failed} of {} cells NOT as expected (logs in {})",
            rows.len(),
            env.log_dir.display()
        );
        Ok(ExitCode::from(1))
    }
}

struct Env {
    db_url: String,
    broker_url: String,
    broker: &'static str,
    prefix: String,
    schema: Schema,
    log_dir: PathBuf,
    exe: PathBuf,
    pool: PgPool,
    break_ack: bool,
    brokers: Registry,
    settings: BrokerSettings,
    /// Counts resets. Kafka: every cell has a topic and a consumer group of its own (a topic is
    /// not deleted: the test broker cannot take that while a consumer may still subscribe).
    cell: std::sync::atomic::AtomicU64,
    /// This run's id, in its Kafka topic names: runs with the same prefix never share a topic.
    run: String,
    /// The relays run in CDC mode, on a slot and publication named after the schema.
    cdc: bool,
}

impl Env {
    fn relay_name(&self) -> &'static str {
        if self.cdc {
            RelayMode::Cdc.name()
        } else {
            RelayMode::Polling.name()
        }
    }

    /// Drops the CDC slot and publication of this prefix, if there are any (ending a relay
    /// that still streams it).
    async fn remove_slot(&self) -> Result<()> {
        let name = self.schema.as_str();
        outbox_postgres::cdc::remove(&self.pool, name, name, Duration::from_secs(10))
            .await
            .with_context(|| format!("cannot drop the replication slot `{name}`"))
    }

    /// The current cell's Kafka topic.
    fn kafka_topic(&self) -> String {
        format!(
            "{}.{}.c{}",
            self.prefix,
            self.run,
            self.cell.load(std::sync::atomic::Ordering::SeqCst)
        )
    }
    /// The current cell's Kafka consumer group.
    fn kafka_group(&self) -> String {
        format!("{CONSUMER}-{}", self.kafka_topic())
    }
    /// What the observer watches: the Kafka topic, or the prefix of the stream / exchange.
    fn observed(&self) -> String {
        if self.broker == "kafka" {
            self.kafka_topic()
        } else {
            self.prefix.clone()
        }
    }
    fn stream(&self) -> String {
        self.prefix.to_ascii_uppercase()
    }
    fn queue(&self) -> String {
        format!("{}.{CONSUMER}", self.prefix)
    }
    /// The cell's stream / exchange and consumer queue over the given settings.
    fn settings(&self) -> BrokerSettings {
        let mut s = self.settings.clone();
        let p = &self.prefix;
        s.set_section(
            "nats",
            json!({
                "stream": self.stream(),
                "stream_subjects": [format!("{p}.>")],
                "subject_template": format!("{p}.{{aggregate_type}}.{{event_type}}"),
            }),
        );
        s.set_section("rabbitmq", json!({ "exchange": p }));
        s.set_section(
            "rabbitmq_consumer",
            json!({ "queue": self.queue(), "bind_exchange": p, "binding_key": "#" }),
        );
        s.set_section(
            "kafka",
            json!({ "topic_template": self.kafka_topic(), "delivery_timeout_secs": 1 }),
        );
        s.set_section(
            "kafka_consumer",
            json!({ "topics": [self.kafka_topic()], "group_id": self.kafka_group() }),
        );
        s
    }
    /// The processes' config file. One relay worker: a crash point freezes or kills the whole
    /// process, and a second worker caught in the middle of its claim transaction would hold
    /// row locks through a freeze (the lease cell then saw the other relay claim nothing).
    fn config_toml(&self) -> String {
        format!(
            "[relay]\nlease_secs = {RELAY_LEASE_SECS}\npublish_timeout_secs = 1.0\n\
             lease_safety_margin_secs = 0.5\npoll_interval_ms = 100\nbatch_size = 50\n\
             workers = 1\nmode = \"{mode}\"\n\n\
             [nats]\nstream = \"{stream}\"\nstream_subjects = [\"{p}.>\"]\n\
             subject_template = \"{p}.{{aggregate_type}}.{{event_type}}\"\n\n\
             [rabbitmq]\nexchange = \"{p}\"\n\n\
             [kafka]\ntopic_template = \"{topic}\"\ndelivery_timeout_secs = 1\n\n\
             [kafka_consumer.properties]\n\"session.timeout.ms\" = \"6000\"\n\
             \"heartbeat.interval.ms\" = \"1000\"\n",
            stream = self.stream(),
            p = self.prefix,
            topic = self.kafka_topic(),
            mode = if self.cdc { "cdc" } else { "polling" },
        )
    }

    /// Drops everything of the previous cell and sets up the schema, stream / exchange.
    async fn reset(&self) -> Result<()> {
        let s = self.schema.as_str();
        // The previous cell's slot (its relays are gone) or a CDC run's of the same prefix.
        self.remove_slot().await?;
        sqlx::query(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {s} CASCADE")))
            .execute(&self.pool)
            .await?;
        outbox_postgres::migrate(&self.pool, &self.schema).await?;
        if self.cdc {
            // The slot before any event: everything the producer commits is streamed.
            outbox_postgres::cdc::ensure_publication(&self.pool, &self.schema, s).await?;
            outbox_postgres::cdc::create_slot(&self.pool, s).await?;
        }
        crate::workload::create_payments_table(&self.pool, &self.schema).await?;
        crate::demo::create_report_table(&self.pool, &self.schema).await?;
        self.cell.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.broker == "kafka" {
            // A fresh topic and group (kafka_topic): nothing of the previous cell to drop.
        } else if self.broker == "nats" {
            let client = async_nats::connect(&self.broker_url)
                .await
                .with_context(|| {
                    format!("cannot connect to NATS at {}", redact(&self.broker_url))
                })?;
            let js = async_nats::jetstream::new(client);
            let _ = js.delete_stream(self.stream()).await;
        } else {
            crate::demo::delete_rabbit_queue(&self.broker_url, &self.queue()).await?;
        }
        // Declares the stream (NATS) or the exchange (RabbitMQ) before any process starts.
        let _ = self
            .brokers
            .connect_transport(&self.broker_url, &self.settings())
            .await?;
        if self.broker == "rabbitmq" {
            // The consumer's queue must be bound before the first publish, as in any deployment:
            // a message routed only to the observer's queue would never reach the consumer.
            let _ = self
                .brokers
                .connect_source(
                    &self.broker_url,
                    &self.settings(),
                    &SourceOptions {
                        consumer: CONSUMER.into(),
                    },
                )
                .await?;
        }
        std::fs::write(self.log_dir.join("outbox.toml"), self.config_toml())?;
        Ok(())
    }

    /// Messages the consumer has not settled yet, as the broker counts them.
    async fn broker_backlog(&self) -> Result<u64> {
        if self.broker == "kafka" {
            return crate::observer::kafka_group_lag(
                &self.broker_url,
                &self.kafka_topic(),
                &self.kafka_group(),
            )
            .await;
        }
        if self.broker == "nats" {
            let client = async_nats::connect(&self.broker_url).await?;
            let js = async_nats::jetstream::new(client);
            let stream = js
                .get_stream(self.stream())
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let info = match stream.consumer_info(CONSUMER).await {
                Ok(i) => i.clone(),
                // Not created yet: the consumer process has not started its subscription.
                Err(_) => return Ok(u64::MAX),
            };
            Ok(info.num_pending + info.num_ack_pending as u64)
        } else {
            let conn = lapin::Connection::connect(
                &self.broker_url,
                lapin::ConnectionProperties::default(),
            )
            .await?;
            let ch = conn.create_channel().await?;
            let q = ch
                .queue_declare(
                    self.queue().as_str().into(),
                    lapin::options::QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    lapin::types::FieldTable::default(),
                )
                .await;
            let n = match q {
                Ok(q) => u64::from(q.message_count()),
                Err(_) => u64::MAX,
            };
            let _ = conn.close(200, "bye".into()).await;
            Ok(n)
        }
    }
}

/// A supervised child process.
struct Proc {
    role: Role,
    label: String,
    args: Vec<String>,
    crash: Option<(String, u64, Action)>,
    child: Option<Child>,
    starts: u32,
    lines: Arc<Mutex<Vec<String>>>,
    log_dir: PathBuf,
}

impl Proc {
    fn new(logs: &Path, role: Role, label: &str, args: Vec<String>) -> Self {
        Self {
            role,
            label: label.to_owned(),
            args,
            crash: None,
            child: None,
            starts: 0,
            lines: Arc::default(),
            log_dir: logs.to_owned(),
        }
    }

    /// Waits until the process's log has a line containing `needle`.
    async fn wait_for_log(&self, needle: &str, limit: Duration) -> Result<()> {
        let log = self.log_dir.join(format!("{}.log", self.label));
        let deadline = Instant::now() + limit;
        while count_in_log(&log, needle) == 0 {
            if Instant::now() > deadline {
                bail!(
                    "{} did not log `{needle}` within {limit:?}; the end of its log: {}",
                    self.label,
                    log_tail(&log, 5)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    async fn start(&mut self, env: &Env) -> Result<()> {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_dir.join(format!("{}.log", self.label)))?;
        let mut cmd = Command::new(&env.exe);
        cmd.args(&self.args)
            .env("OUTBOX_DATABASE_URL", &env.db_url)
            .env("OUTBOX_BROKER_URL", &env.broker_url)
            .env("OUTBOX_SCHEMA", env.schema.as_str())
            .env("OUTBOX_CONFIG", env.log_dir.join("outbox.toml"))
            // The relay engine's batch lines too: what a relay did when a cell fails.
            .env(
                "RUST_LOG",
                "info,sqlx=warn,pgwire_replication=off,outbox_core::relay=debug",
            )
            .env_remove("DATABASE_URL")
            .env_remove(outbox_core::crash::CRASH_POINT_ENV)
            .env_remove(outbox_core::crash::CRASH_SKIP_ENV)
            .env_remove(outbox_core::crash::CRASH_ACTION_ENV)
            .env_remove(crate::demo::ACK_BEFORE_COMMIT_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        if self.role == Role::Consumer && env.break_ack {
            cmd.env(crate::demo::ACK_BEFORE_COMMIT_ENV, "1");
        }
        // Armed only on the first start: the restarted process runs clean.
        if self.starts == 1
            && let Some((point, skip, action)) = &self.crash
        {
            cmd.env(outbox_core::crash::CRASH_POINT_ENV, point)
                .env(outbox_core::crash::CRASH_SKIP_ENV, skip.to_string());
            if *action == Action::Stop {
                cmd.env(outbox_core::crash::CRASH_ACTION_ENV, "stop");
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.label))?;
        let stdout = child.stdout.take().expect("piped");
        let lines = Arc::clone(&self.lines);
        tokio::spawn(async move {
            let mut r = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = r.next_line().await {
                lines.lock().unwrap().push(l);
            }
        });
        self.child = Some(child);
        Ok(())
    }

    /// `Some(status)` once the process ended.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut()?;
        match c.try_wait() {
            Ok(Some(s)) => {
                self.child = None;
                Some(s)
            }
            _ => None,
        }
    }

    fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status();
        }
    }

    /// Whether the process is frozen by SIGSTOP.
    fn is_stopped(&self) -> bool {
        let Some(pid) = self.pid() else { return false };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    }

    async fn stop(&mut self) {
        if self.child.is_none() {
            return;
        }
        self.signal("-CONT");
        self.signal("-TERM");
        if let Some(c) = self.child.as_mut()
            && tokio::time::timeout(Duration::from_secs(5), c.wait())
                .await
                .is_err()
        {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
        self.child = None;
    }
}

fn aborted(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(6)
}

struct Row {
    observed: String,
    wire_duplicates: usize,
    pass: bool,
}

struct Processes {
    procs: Vec<Proc>,
    provider_url: String,
}

/// What [`start_system`] starts.
struct SystemSpec<'a> {
    /// Where the processes' logs go.
    logs: &'a Path,
    payments: u64,
    producer_extra: &'a [&'a str],
    relays: usize,
    provider_idempotent: bool,
    provider_delay_ms: u64,
    executor_timeout_ms: u64,
    arm: Option<(Role, &'a str, u64, Action)>,
}

async fn start_system(env: &Env, spec: SystemSpec<'_>) -> Result<Processes> {
    let SystemSpec {
        logs,
        payments,
        producer_extra,
        relays,
        provider_idempotent,
        provider_delay_ms,
        executor_timeout_ms,
        arm,
    } = spec;
    // The provider first: the executor needs its address.
    let mut provider_args = vec!["demo-provider".to_owned()];
    if !provider_idempotent {
        provider_args.push("--no-idempotency".into());
    }
    provider_args.push(format!("--delay-ms={provider_delay_ms}"));
    let mut provider = Proc::new(logs, Role::Provider, "provider", provider_args);
    provider.start(env).await?;
    let provider_url = {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(url) = provider
                .lines
                .lock()
                .unwrap()
                .iter()
                .find_map(|l| l.strip_prefix("listening on ").map(str::to_owned))
            {
                break url;
            }
            if Instant::now() > deadline {
                bail!("the provider did not report its address within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let mut procs = vec![provider];
    let mut consumer_args: Vec<String> = [
        "demo-consumer",
        "--name",
        CONSUMER,
        "--ack-wait-secs",
        "2",
        "--batch-size",
        "10",
        "--ordering",
        "wait",
        "--payouts",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    consumer_args.extend([
        "--nats-stream".into(),
        env.stream(),
        "--rabbit-queue".into(),
        env.queue(),
        "--rabbit-exchange".into(),
        env.prefix.clone(),
        "--kafka-topic".into(),
        env.kafka_topic(),
        "--kafka-group".into(),
        env.kafka_group(),
    ]);
    procs.push(Proc::new(logs, Role::Consumer, "consumer", consumer_args));
    for i in 0..relays {
        procs.push(Proc::new(
            logs,
            Role::Relay,
            &format!("relay-{i}"),
            vec!["relay".into()],
        ));
    }
    procs.push(Proc::new(
        logs,
        Role::Executor,
        "executor",
        vec![
            "effects".into(),
            "run".into(),
            "--kind".into(),
            crate::demo::PAYOUT_KIND.into(),
            "--provider-url".into(),
            provider_url.clone(),
            format!("--call-timeout-ms={executor_timeout_ms}"),
            "--lease-secs=3.5".into(),
            "--batch-size=8".into(),
            "--concurrency=8".into(),
            "--reconcile-after-ms=300".into(),
        ],
    ));
    let mut producer_args = vec!["demo-producer".to_owned(), format!("--payments={payments}")];
    producer_args.extend(producer_extra.iter().map(|s| (*s).to_owned()));
    procs.push(Proc::new(logs, Role::Producer, "producer", producer_args));
    if let Some((role, point, skip, action)) = arm
        && let Some(p) = procs.iter_mut().find(|p| p.role == role)
    {
        p.crash = Some((point.to_owned(), skip, action));
    }
    let mut relays_started = 0;
    for p in procs.iter_mut().skip(1) {
        p.start(env).await?;
        if p.role == Role::Relay {
            relays_started += 1;
        }
        if env.cdc && p.role == Role::Relay && relays_started < relays {
            // The first relay takes the slot before the next one starts as its standby: the
            // armed relay is the one that streams.
            p.wait_for_log("streaming the replication slot", Duration::from_secs(20))
                .await?;
        } else if env.cdc && p.role == Role::Relay && relays > 1 {
            // And the standby waits on the slot before the producer writes: started after the
            // producer, a slow standby could find the slot already free (the armed relay
            // crashed on the first batch) and stream it without any takeover.
            p.wait_for_log(
                "waiting as a standby until the slot is free",
                Duration::from_secs(20),
            )
            .await?;
        }
    }
    Ok(Processes {
        procs,
        provider_url,
    })
}

async fn run_cell(env: &Env, cell: &Cell, payments: u64, timeout_secs: u64) -> Result<Row> {
    env.reset().await?;
    let logs = env.log_dir.join(cell.id);
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs)?;
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
    let seen =
        crate::observer::spawn_observer(env.broker, &env.broker_url, &env.observed()).await?;
    let mut sys = start_system(
        env,
        SystemSpec {
            logs: &logs,
            payments,
            producer_extra: &[],
            relays,
            provider_idempotent: cell.provider_idempotent,
            provider_delay_ms: delay,
            executor_timeout_ms: timeout,
            arm,
        },
    )
    .await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout_secs);
    let mut crashed = 0u32;
    let mut unplanned = 0u32;
    let mut in_flight_clean: Option<bool> = None;
    let mut stopped_at: Option<Instant> = None;
    let mut resumed = false;
    let mut resumed_at: Option<Instant> = None;
    let mut settled = false;
    let mut takeover_left: Option<i64> = None;
    let mut unknown_peak = 0i64;
    let mut delay_lifted = false;
    let mut quiet_since: Option<Instant> = None;
    let mut producer_done = false;
    let mut timed_out = false;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        for i in 0..sys.procs.len() {
            let Some(status) = sys.procs[i].exited() else {
                continue;
            };
            let p = &mut sys.procs[i];
            if p.role == Role::Producer && status.success() {
                producer_done = true;
                continue;
            }
            if p.crash.is_some() && p.starts == 1 && aborted(&status) {
                crashed += 1;
                if cell.point == "producer.before_commit" {
                    in_flight_clean = Some(check_in_flight(env, p).await?);
                }
                if cell.action == Action::Takeover {
                    // Stays down: the standby alone must carry on.
                    continue;
                }
            } else {
                unplanned += 1;
                tracing::warn!(process = %p.label, %status, "process ended unexpectedly; restarting");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            sys.procs[i].start(env).await?;
        }
        if cell.action == Action::Stop {
            let target = sys.procs.iter().find(|p| p.crash.is_some()).expect("armed");
            if stopped_at.is_none() && target.is_stopped() {
                stopped_at = Some(Instant::now());
            }
            // Resumed once its lease is long expired AND the other relay has taken over every
            // aggregate it held (no expired lease is left: the takeover's upsert replaced them).
            // Resuming on time alone made the cell depend on the other relay's speed: on a loaded
            // machine it had not claimed the rows yet, the woken relay's marks then rightly
            // succeeded, and the cell reported a refused-marks count of 0. After
            // `TAKEOVER_WAIT` the relay is resumed anyway, and the check below says why it failed.
            if let Some(t) = stopped_at
                && !resumed
                && t.elapsed() > Duration::from_secs_f64(RELAY_LEASE_SECS * 2.0 + 1.0)
            {
                let left = expired_leases(env).await?;
                if left == 0 || t.elapsed() > TAKEOVER_WAIT {
                    target.signal("-CONT");
                    resumed = true;
                    resumed_at = Some(Instant::now());
                    takeover_left = Some(left);
                    crashed += 1;
                }
            }
            // Quiet needs the woken relay to have settled (its refused marks are logged) too,
            // however slowly it gets the CPU back; bounded by `TAKEOVER_WAIT` again.
            if let Some(t) = resumed_at
                && !settled
            {
                settled = stale_marks_blocked(&logs.join("relay-0.log")) > 0
                    || t.elapsed() > TAKEOVER_WAIT;
            }
        }
        let s = effects_stats(env).await?;
        unknown_peak = unknown_peak.max(s.unknown);
        if cell.action == Action::SlowProvider
            && !delay_lifted
            && (unknown_peak >= 10 || started.elapsed() > Duration::from_secs(20))
        {
            HttpPayoutProvider::new(&sys.provider_url)?
                .stand_in_set_delay(0)
                .await?;
            delay_lifted = true;
            crashed += 1;
        }
        let quiet = producer_done
            && crashed > 0
            && is_quiet(env, &s).await?
            && (cell.action != Action::Stop || settled);
        if quiet {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            // Long enough for a redelivery after the NATS ack wait to show up.
            if since.elapsed() > Duration::from_millis(2500) {
                break;
            }
        } else {
            quiet_since = None;
        }
        if Instant::now() > deadline {
            timed_out = true;
            break;
        }
    }
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
    let mut problems = check.violations.clone();
    if crashed == 0 {
        problems.push(format!("crash point {} was never reached", cell.point));
    }
    if timed_out {
        problems.push(format!("not quiet after {timeout_secs} s"));
    }
    if let Some(false) = in_flight_clean {
        problems.push("the transaction in flight at the crash left rows behind".into());
    }
    if cell.action == Action::Stop && stale_marks == 0 {
        problems.push(format!(
            "the frozen relay's marks were not refused after its lease expired (expired leases \
             left when it was resumed: {}; the end of its log: {})",
            takeover_left.unwrap_or(-1),
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
    if cell.action == Action::SlowProvider && unknown_peak == 0 {
        problems.push("no work item ever became unknown".into());
    }
    let mut observed = check.summary.clone();
    if unplanned > 0 {
        observed.push_str(&format!(", {unplanned} unplanned restarts"));
    }
    if let Some(clean) = in_flight_clean {
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
        observed.push_str(&format!(", unknown backlog peak {unknown_peak} -> 0"));
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
    Ok(Row {
        observed,
        wire_duplicates: check.wire_duplicates,
        pass,
    })
}

/// Leases whose time is up and that nobody took over (the takeover's upsert replaces them, a
/// settle deletes its own): in the lease cell, the frozen relay's.
async fn expired_leases(env: &Env) -> Result<i64> {
    let s = env.schema.as_str();
    Ok(sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {s}.leases WHERE lease_until <= now()"
    )))
    .fetch_one(&env.pool)
    .await?)
}

/// The last `n` lines of a log that are not debug output, joined by ` | `.
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("DEBUG") && !l.contains("TRACE"))
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

fn count_in_log(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().filter(|l| l.contains(needle)).count())
        .unwrap_or(0)
}

/// After a crash before the producer's commit: the payment version it was writing must have
/// left nothing, neither business row nor intent.
async fn check_in_flight(env: &Env, p: &Proc) -> Result<bool> {
    let last = p
        .lines
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("begin ").map(str::to_owned));
    let Some(last) = last else { return Ok(false) };
    let Some((id, v)) = last.split_once(" v") else {
        return Ok(false);
    };
    let v: i64 = v.parse().unwrap_or(0);
    let s = env.schema.as_str();
    let intents: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {s}.events WHERE aggregate_id = $1 AND aggregate_version = $2"
    )))
    .bind(id)
    .bind(v)
    .fetch_one(&env.pool)
    .await?;
    let status: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT status FROM {s}.payments WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(&env.pool)
    .await?;
    let row_clean = match v {
        1 => status.is_none(),
        _ => status.as_deref() == Some("created"),
    };
    Ok(intents == 0 && row_clean)
}

struct EffStats {
    unknown: i64,
    open: i64,
    items: i64,
}

async fn effects_stats(env: &Env) -> Result<EffStats> {
    let s = env.schema.as_str();
    let (unknown, open, items): (i64, i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE state = 'unknown'), \
                count(*) FILTER (WHERE state IN ('pending', 'in_progress', 'unknown')), \
                count(*) FROM {s}.work_items"
    )))
    .fetch_one(&env.pool)
    .await?;
    Ok(EffStats {
        unknown,
        open,
        items,
    })
}

/// The frozen relay's settles after it woke up that changed nothing: marks the database
/// refused (fenced: "lease lost"), and marks that failed before they reached it ("mark
/// published: ..." store errors, e.g. its pool's wait for a connection ran out while the process
/// was stopped). Either way its stale marks did not apply; the cell's end checks (each event
/// applied once, order kept) hold the rest.
fn stale_marks_blocked(log: &std::path::Path) -> usize {
    count_in_log(log, "lease lost") + count_in_log(log, "mark published: ")
}

/// Everything settled: outbox drained, every committed event applied, every payout resolved,
/// nothing waiting on the broker.
async fn is_quiet(env: &Env, eff: &EffStats) -> Result<bool> {
    let s = env.schema.as_str();
    let (pending, expected, applied, payments): (i64, i64, i64, i64) =
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT (SELECT count(*) FROM {s}.events), \
                (SELECT count(*) + count(*) FILTER (WHERE status = 'captured') FROM {s}.payments), \
                (SELECT count(DISTINCT event_id) FROM {s}.effect_log), \
                (SELECT count(*) FROM {s}.payments)"
        )))
        .fetch_one(&env.pool)
        .await?;
    if pending != 0 || applied < expected || eff.open != 0 || eff.items < payments {
        return Ok(false);
    }
    Ok(env.broker_backlog().await.unwrap_or(u64::MAX) == 0)
}

/// Adds "`n` `what`" to `v` when `n` is not zero.
fn flag(v: &mut Vec<String>, n: usize, what: &str) {
    if n > 0 {
        v.push(format!("{n} {what}"));
    }
}

struct Check {
    violations: Vec<String>,
    summary: String,
    wire_duplicates: usize,
    double_payouts: usize,
    missing_payouts: usize,
}

/// Checks the invariants once the system is quiet. `wire_strict`: every intent must have been
/// seen by the independent subscriber (false in chaos runs, where the subscriber itself loses
/// its connection while the broker restarts).
async fn check_invariants(
    env: &Env,
    seen: &[Seen],
    payouts: Result<Vec<(String, String)>>,
    wire_strict: bool,
) -> Result<Check> {
    let s = env.schema.as_str();
    let pool = &env.pool;
    let mut v = Vec::new();
    let payments: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, status FROM {s}.payments ORDER BY id"
    )))
    .fetch_all(pool)
    .await?;
    let mut expected: HashSet<(String, i64)> = HashSet::new();
    for (id, status) in &payments {
        expected.insert((id.clone(), 1));
        if status == "captured" {
            expected.insert((id.clone(), 2));
        }
    }
    let rolled_back_ids: HashSet<String> = payments_rolled_back(&payments);
    for (id, _) in &payments {
        if rolled_back_ids.contains(id) {
            v.push(format!("rolled-back payment {id} has a business row"));
        }
    }
    // G1 / drained: no intent left, none dead.
    let left: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {s}.events")))
        .fetch_one(pool)
        .await?;
    if left != 0 {
        v.push(format!("{left} intents still in the outbox"));
    }
    // The wire, as the independent subscriber saw it.
    let mut ids_of: HashMap<(String, i64), HashSet<Uuid>> = HashMap::new();
    let mut first_seen: HashSet<Uuid> = HashSet::new();
    let mut last_version: HashMap<&str, i64> = HashMap::new();
    let mut wire_order = 0;
    for m in seen {
        ids_of
            .entry((m.aggregate_id.clone(), m.version))
            .or_default()
            .insert(m.event_id);
        if first_seen.insert(m.event_id) {
            let l = last_version.entry(&m.aggregate_id).or_insert(0);
            if m.version <= *l {
                wire_order += 1;
            }
            *l = m.version;
        }
    }
    let wire_duplicates = seen.len() - first_seen.len();
    let wire_missing = expected.iter().filter(|k| !ids_of.contains_key(*k)).count();
    let wire_leaked = ids_of.keys().filter(|k| !expected.contains(*k)).count();
    let regenerated = ids_of.values().filter(|ids| ids.len() > 1).count();
    if wire_strict && wire_missing > 0 {
        v.push(format!(
            "{wire_missing} committed intents never seen on the wire"
        ));
    }
    flag(
        &mut v,
        wire_leaked,
        "events on the wire without a committed intent",
    );
    flag(
        &mut v,
        regenerated,
        "intents published under several event ids (G4)",
    );
    flag(
        &mut v,
        wire_order,
        "per-aggregate order violations on the wire (G7)",
    );
    // The consumer's effects.
    let log: Vec<(Uuid, String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT event_id, aggregate_id, aggregate_version FROM {s}.effect_log \
         WHERE consumer_name = $1 ORDER BY seq"
    )))
    .bind(CONSUMER)
    .fetch_all(pool)
    .await?;
    let mut per_event: HashMap<Uuid, usize> = HashMap::new();
    let mut applied: HashSet<(String, i64)> = HashSet::new();
    let mut consumer_order = 0;
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (id, agg, ver) in &log {
        *per_event.entry(*id).or_default() += 1;
        applied.insert((agg.clone(), *ver));
        let l = last.entry(agg.as_str()).or_insert(0);
        if *ver <= *l {
            consumer_order += 1;
        }
        *l = (*l).max(*ver);
    }
    let duplicate_effects = per_event.values().filter(|n| **n > 1).count();
    let lost = expected.iter().filter(|k| !applied.contains(*k)).count();
    let phantom = applied.iter().filter(|k| !expected.contains(*k)).count();
    flag(
        &mut v,
        duplicate_effects,
        "events applied more than once (G5)",
    );
    flag(
        &mut v,
        lost,
        "committed events never applied by the consumer",
    );
    flag(&mut v, phantom, "effects without a committed intent");
    flag(
        &mut v,
        consumer_order,
        "per-aggregate order violations at the consumer",
    );
    let (conflicts, consumer_dead): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT (SELECT count(*) FROM {s}.inbox_conflicts), \
                (SELECT count(*) FROM {s}.consumer_dead_letters)"
    )))
    .fetch_one(pool)
    .await?;
    if conflicts + consumer_dead > 0 {
        v.push(format!(
            "{conflicts} inbox conflicts, {consumer_dead} consumer dead letters"
        ));
    }
    // Payouts: one work item per payment, all resolved; the provider's ledger.
    let items: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT payload->>'reference', state FROM {s}.work_items"
    )))
    .fetch_all(pool)
    .await?;
    let mut items_per_payment: HashMap<&str, usize> = HashMap::new();
    for (r, state) in &items {
        *items_per_payment.entry(r.as_str()).or_default() += 1;
        if state != "succeeded" {
            v.push(format!("work item for {r} ended {state}"));
        }
    }
    if items.len() != payments.len() || items_per_payment.values().any(|n| *n != 1) {
        v.push(format!(
            "{} payout work items for {} payments",
            items.len(),
            payments.len()
        ));
    }
    let (double_payouts, missing_payouts, payout_total) = match payouts {
        Ok(list) => {
            let mut per: BTreeMap<&str, usize> = BTreeMap::new();
            for (reference, _) in &list {
                *per.entry(reference.as_str()).or_default() += 1;
            }
            let missing = payments
                .iter()
                .filter(|(id, _)| !per.contains_key(id.as_str()))
                .count();
            let double = per.values().filter(|n| **n > 1).count();
            if missing > 0 {
                v.push(format!("{missing} payments never paid out"));
            }
            (double, missing, list.len())
        }
        Err(e) => {
            v.push(format!("cannot read the provider's payouts: {e:#}"));
            (0, 0, 0)
        }
    };
    let summary = format!(
        "{} payments, {} events: {} applied once, {} payouts, {} paid twice{}",
        payments.len(),
        expected.len(),
        per_event.values().filter(|n| **n == 1).count(),
        payout_total,
        double_payouts,
        if wire_strict || wire_missing == 0 {
            String::new()
        } else {
            format!(", {wire_missing} not seen by the subscriber (it reconnects)")
        }
    );
    Ok(Check {
        violations: v,
        summary,
        wire_duplicates,
        double_payouts,
        missing_payouts,
    })
}

fn payments_rolled_back(payments: &[(String, String)]) -> HashSet<String> {
    payments
        .iter()
        .filter_map(|(id, _)| {
            let i: u64 = id.strip_prefix("pay-")?.parse().ok()?;
            rolled_back(i, crate::workload::DEFAULT_ROLLBACK_EVERY).then(|| id.clone())
        })
        .collect()
}

/// `(reference, payout_id)` of every payout the provider made.
async fn provider_payouts(base: &str) -> Result<Vec<(String, String)>> {
    let list = tokio::time::timeout(
        Duration::from_secs(10),
        HttpPayoutProvider::new(base)?.stand_in_payouts(),
    )
    .await
    .context("the provider did not answer GET /payouts within 10 s")??;
    Ok(list
        .iter()
        .map(|p| {
            (
                p["reference"].as_str().unwrap_or("").to_owned(),
                p["payout_id"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect())
}

fn render(rows: &[(Cell, Row)], broker: &str, mode: RelayMode) -> String {
    let mut out = format!(
        "| cell ({broker}) | crash at | process | expected | observed | wire dups | result |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    for (c, r) in rows {
        let point = if c.point.is_empty() {
            "provider slower than call timeout".to_owned()
        } else if c.action == Action::Stop {
            format!("`{}` (SIGSTOP past the lease)", c.point)
        } else if c.action == Action::Takeover {
            format!("`{}` (stays down; standby on the slot)", c.point)
        } else {
            format!("`{}`", c.point)
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            c.id,
            point,
            c.target.name(),
            c.expected_in(mode),
            r.observed.replace('|', "/"),
            r.wire_duplicates,
            if r.pass { "PASS" } else { "FAIL" }
        ));
    }
    out
}

/// Fails unless `path` holds the markers of `key`.
fn splice_markdown_check(path: &Path, key: &str) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let begin = format!("<!-- {key}:begin -->");
    let end = format!("<!-- {key}:end -->");
    match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) if b < e => Ok(()),
        _ => bail!(
            "invalid option `--markdown-into`: {} has no `{begin}` … `{end}` markers",
            path.display()
        ),
    }
}

/// Replaces what stands between `<!-- {key}:begin -->` and `<!-- {key}:end -->` in `path`.
fn splice_markdown(path: &Path, key: &str, table: &str) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let begin = format!("<!-- {key}:begin -->");
    let end = format!("<!-- {key}:end -->");
    let (Some(b), Some(e)) = (text.find(&begin), text.find(&end)) else {
        bail!(
            "{} has no `{begin}` … `{end}` markers to write the table between",
            path.display()
        );
    };
    if e < b {
        bail!("{}: `{end}` comes before `{begin}`", path.display());
    }
    let new = format!("{}{begin}\n{table}{}", &text[..b], &text[e..]);
    std::fs::write(path, new).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

async fn chaos(env: &Env, args: &MatrixArgs, restart_cmd: &str) -> Result<ExitCode> {
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
    let started = Instant::now();
    let chaos_end = started + Duration::from_secs(args.chaos_secs);
    let restart_at = started + Duration::from_secs(args.chaos_secs / 2);
    let mut next_kill = started + Duration::from_millis(rng.u64(1000..3000));
    let mut kills: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut total_kills = 0;
    let mut broker_restarts = 0;
    let mut unplanned = 0u32;
    let mut producer_done = false;
    let mut quiet_since: Option<Instant> = None;
    let deadline = chaos_end + Duration::from_secs(args.cell_timeout_secs.max(60));
    let mut timed_out = false;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = Instant::now();
        for i in 0..sys.procs.len() {
            let Some(status) = sys.procs[i].exited() else {
                continue;
            };
            if sys.procs[i].role == Role::Producer && status.success() {
                producer_done = true;
                continue;
            }
            if !is_kill(&status) {
                unplanned += 1;
                tracing::warn!(process = %sys.procs[i].label, %status, "process ended on its own; restarting");
            }
            tokio::time::sleep(Duration::from_millis(rng.u64(0..400))).await;
            sys.procs[i].start(env).await?;
        }
        if broker_restarts == 0 && now >= restart_at {
            let t = Instant::now();
            let status = Command::new("sh")
                .args(["-c", restart_cmd])
                .status()
                .await
                .context("cannot run --broker-restart-cmd")?;
            if !status.success() {
                bail!("--broker-restart-cmd failed: {status}");
            }
            broker_restarts += 1;
            println!(
                "  [{:>5.1}s] broker restarted ({:.1} s)",
                started.elapsed().as_secs_f64(),
                t.elapsed().as_secs_f64()
            );
        }
        if now < chaos_end && now >= next_kill && total_kills < args.max_kills {
            let victims: Vec<usize> = sys
                .procs
                .iter()
                .enumerate()
                .filter(|(_, p)| {
                    matches!(p.role, Role::Relay | Role::Consumer | Role::Executor)
                        && p.child.is_some()
                })
                .map(|(i, _)| i)
                .collect();
            if !victims.is_empty() {
                let i = victims[rng.usize(..victims.len())];
                sys.procs[i].signal("-KILL");
                total_kills += 1;
                *kills.entry(sys.procs[i].role.name()).or_default() += 1;
            }
            next_kill = now + Duration::from_millis(rng.u64(800..3500));
        }
        if producer_done && now >= chaos_end {
            let s = effects_stats(env).await?;
            if is_quiet(env, &s).await? {
                let since = *quiet_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(2500) {
                    break;
                }
            } else {
                quiet_since = None;
            }
        }
        if now > deadline {
            timed_out = true;
            break;
        }
    }
    for p in sys.procs.iter_mut().skip(1).rev() {
        p.stop().await;
    }
    let payouts = provider_payouts(&sys.provider_url).await;
    sys.procs[0].stop().await;
    let seen = seen.seen();
    let check = check_invariants(env, &seen, payouts, false).await?;
    let mut problems = check.violations.clone();
    if timed_out {
        problems.push("not quiet in time after the chaos ended".into());
    }
    if broker_restarts == 0 {
        problems.push("the broker was never restarted".into());
    }
    if total_kills == 0 {
        problems.push("nothing was killed".into());
    }
    let kills_text = kills
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
        "| kills (SIGKILL) | {total_kills}: {kills_text} |\n"
    ));
    table.push_str(&format!("| broker restarts | {broker_restarts} |\n"));
    table.push_str(&format!(
        "| processes that ended on their own | {unplanned} |\n"
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

fn is_kill(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(9)
}
