//! `outbox`: operate the transactional outbox.
//!
//! ```text
//! outbox migrate                      create / upgrade the tables
//! outbox relay                        move committed rows to the broker (Prometheus on --metrics-addr)
//! outbox ready [--wait-secs N]        whether that relay is ready (GET /readyz), as an exit code
//! outbox status [--json]              pending, oldest age, in flight, retrying, dead letters
//! outbox dead-letters list            what exhausted its attempts, and what waits behind it
//! outbox dead-letters requeue ID…|--all
//! outbox conflicts list               same event id, different payload, per consumer
//! outbox consumer-dead-letters list|requeue
//! outbox cleanup                      elected retention round (inbox identities, old work items,
//!                                     old published events in mark mode)
//! outbox effects run|status|list|resolve   remote-effect executor and work items
//! outbox debezium apply|sql|remove    bridge a Debezium-layout outbox table into this outbox
//! ```
//!
//! With the cargo feature `harness` the binary also has the test tools (`crash-matrix`, `demo`,
//! `demo-consumer`, `demo-producer`, `demo-provider`, from `outbox-harness`) and the crash points
//! they arm; `outbox --help` lists them apart. A production build leaves the feature off:
//! `cargo install --path crates/outbox-cli` (or a plain `cargo build` at the workspace root, whose
//! default members leave the harness out) has operator commands only, and no crash points.
#![forbid(unsafe_code)]

mod admin_cmd;
mod commands;
mod config;
mod debezium_cmd;
mod effects_cmd;
mod logging;
mod metrics;
mod roles_cmd;
mod scrape;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use outbox::broker::Registry;
use outbox_postgres::PgStoreConfig;

use crate::admin_cmd::{ConflictsCmd, ConsumerDeadLetterCmd, DeadLetterCmd};
use crate::config::{FileConfig, Resolved};

#[derive(Parser, Debug)]
#[command(
    name = "outbox",
    version,
    about = "Transactional outbox: migrate, relay, inspect, operate"
)]
struct Cli {
    /// TOML configuration file (flags and environment win over it).
    #[arg(long, global = true, env = "OUTBOX_CONFIG")]
    config: Option<PathBuf>,
    /// PostgreSQL URL. Falls back to DATABASE_URL, then the config file.
    #[arg(
        long,
        global = true,
        env = "OUTBOX_DATABASE_URL",
        hide_env_values = true
    )]
    database_url: Option<String>,
    /// Broker URL: nats://host:4222, tls://host:4222 (NATS, TLS required),
    /// amqp://user:pass@host:5672/vhost or amqps://… (RabbitMQ over TLS),
    /// kafka://host:9092,host:9092 (Kafka; TLS and SASL in the config's [kafka.properties]).
    #[arg(long, global = true, env = "OUTBOX_BROKER_URL", hide_env_values = true)]
    broker_url: Option<String>,
    #[command(flatten)]
    security: config::BrokerSecurityArgs,
    /// Schema holding the outbox tables (default `outbox`).
    #[arg(long, global = true, env = "OUTBOX_SCHEMA")]
    schema: Option<String>,
    /// Log lines on stderr: `text` (coloured only on a terminal, and never with NO_COLOR set)
    /// or `json` (one object per line, for log collectors).
    #[arg(long, global = true, env = "OUTBOX_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// The format of the log lines ([`Cli::log_format`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or upgrade the outbox tables (safe to run concurrently and repeatedly); with
    /// `relay.mode = "cdc"` also the publication the CDC relay streams.
    Migrate,
    /// Run the relay until SIGTERM / Ctrl-C.
    Relay {
        /// Serve Prometheus metrics here, e.g. 127.0.0.1:9090. The endpoint has no
        /// authentication: keep it on loopback unless a firewall guards the interface.
        #[arg(long, env = "OUTBOX_METRICS_ADDR")]
        metrics_addr: Option<SocketAddr>,
        /// How pending events are found (overrides `relay.mode`): polling, or cdc (a logical
        /// replication slot; needs wal_level = logical and a role with REPLICATION).
        #[arg(long, value_enum)]
        mode: Option<config::RelayMode>,
        /// CDC: create the replication slot if it does not exist, or replace it if the server
        /// invalidated it. Only for the first start and the recovery after a lost slot
        /// (docs/guide/src/relay.md, "A lost slot"): without it a missing or invalidated slot
        /// stops the relay, so a lost slot is never silently replaced.
        #[arg(long)]
        create_slot: bool,
    },
    /// Serve the web console and its JSON API (`/api/v1`) until SIGTERM / Ctrl-C. Actions
    /// need the token from OUTBOX_CONSOLE_TOKEN or the config file's `[console] token_file`
    /// (never from the command line); without it the console only reads, and a non-loopback
    /// address is refused.
    Console {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Refuse every action, whatever the token.
        #[arg(long)]
        read_only: bool,
    },
    /// Print the outbox's numbers.
    Status {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Also read a running relay's counters from its metrics address (host:port).
        #[arg(long, env = "OUTBOX_RELAY_METRICS")]
        relay_metrics: Option<String>,
    },
    /// Whether a running relay or effects executor is ready: `GET /readyz` on its metrics
    /// address (running, and not failing). Exit 0 when ready; 1 when not ready, or not
    /// answering, after --wait-secs (asked every 0.5 s). Needs no database: for a systemd
    /// unit's start-up wait or a container's health check.
    Ready {
        /// The process's metrics address (host:port), as given to `outbox relay` [default: the
        /// config file's `metrics_addr`].
        #[arg(long, env = "OUTBOX_METRICS_ADDR")]
        metrics_addr: Option<String>,
        /// Keep asking this long before giving up.
        #[arg(long, default_value_t = 0.0)]
        wait_secs: f64,
    },
    /// Outbox dead letters: list, group by reason, show one whole, requeue or discard by ids,
    /// filter or all (each action recorded in the audit table).
    #[command(subcommand)]
    DeadLetters(DeadLetterCmd),
    /// Events whose id arrived again with a different payload (recorded by consumers).
    #[command(subcommand)]
    Conflicts(ConflictsCmd),
    /// Deliveries a consumer could not apply: list them, hand them back to the consumer.
    #[command(subcommand)]
    ConsumerDeadLetters(ConsumerDeadLetterCmd),
    /// Stop a route (its rows are not claimed by the polling relays; an aggregate whose next
    /// row goes there waits) or a consumer (it takes no deliveries) until `outbox resume`.
    /// Needs --reason.
    Pause {
        #[command(flatten)]
        which: admin_cmd::PauseArgs,
        #[command(flatten)]
        action: admin_cmd::ActionArgs,
    },
    /// End a pause (`outbox pause`).
    Resume {
        #[command(flatten)]
        which: admin_cmd::PauseArgs,
        #[command(flatten)]
        action: admin_cmd::ActionArgs,
    },
    /// Every pause in force, with who paused it and why.
    Pauses {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Republish an aggregate's published events with their original ids (mark mode only),
    /// from a version on, or those written in a time range (--since, --until), each aggregate
    /// to its newest version; refused beyond the replay horizon (what retention still holds)
    /// and while a relay holds an aggregate. --dry-run first, then --expect-events N.
    Replay(admin_cmd::ReplayArgs),
    /// The operators' recorded actions (requeues, discards, resolutions, from the CLI and the
    /// console), newest first.
    Audit {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Only records older than this record id (the next page).
        #[arg(long)]
        before: Option<i64>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Everything this database holds of an event (its outbox row, each consumer's inbox
    /// record, conflicts, consumer dead letters, work items, audit records) or of an
    /// aggregate's events, as JSON.
    Trace {
        /// The event id.
        #[arg(required_unless_present = "aggregate")]
        event_id: Option<uuid::Uuid>,
        /// An aggregate instead, TYPE/ID.
        #[arg(long, conflicts_with = "event_id")]
        aggregate: Option<String>,
        /// With --aggregate: at most this many of its outbox rows, lowest version first.
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Delete inbox identities older than the retention (never inside the replay horizon) and,
    /// optionally, old succeeded work items and old published events (mark mode). One elected
    /// instance deletes; others skip.
    Cleanup(CleanupArgs),
    /// Remote effects: run the executor, inspect and resolve work items.
    #[command(subcommand)]
    Effects(effects_cmd::EffectsCmd),
    /// Least-privilege roles: print or apply each component's grants, check a role's.
    #[command(subcommand)]
    Roles(roles_cmd::RolesCmd),
    /// Bridge a Debezium-layout outbox table: each row its producers insert becomes an event
    /// here, in their transaction (see docs/guide/src/migrating.md, "Moving from Debezium").
    #[command(subcommand)]
    Debezium(debezium_cmd::DebeziumCmd),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell), generated from
    /// this binary's own commands: `outbox completions bash > /etc/bash_completion.d/outbox`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff), generated from this binary's own commands:
    /// `outbox man > /usr/local/share/man/man1/outbox.1`.
    Man,
    /// Test tools (feature `harness`).
    #[cfg(feature = "harness")]
    #[command(flatten)]
    Tool(outbox_harness::Tool),
}

/// Options of `outbox cleanup`.
#[derive(clap::Args, Debug)]
pub(crate) struct CleanupArgs {
    /// Keep inbox identities this many seconds after they were received (needs
    /// --broker-retention-secs). Without it, no inbox identity is deleted.
    #[arg(long, requires = "broker_retention_secs")]
    pub(crate) inbox_keep_secs: Option<u64>,
    /// How long the broker keeps messages a consumer may re-read (NATS stream max_age, a
    /// replayable queue's retention), seconds. Part of the replay horizon.
    #[arg(long, requires = "inbox_keep_secs")]
    pub(crate) broker_retention_secs: Option<u64>,
    /// How long published outbox rows are kept and may be republished, seconds. Part of the
    /// inbox's replay horizon (at least --published-keep-secs).
    #[arg(long, default_value_t = 0, requires = "inbox_keep_secs")]
    pub(crate) outbox_retention_secs: u64,
    /// Mark mode (`relay.on_publish = "mark"`): delete published events published more than
    /// this many seconds ago, in batches, never a pending or dead one.
    #[arg(long)]
    pub(crate) published_keep_secs: Option<u64>,
    /// How long after failing a dead letter may still be requeued, seconds. Part of the
    /// inbox's replay horizon.
    #[arg(long, default_value_t = 0, requires = "inbox_keep_secs")]
    pub(crate) dead_letter_requeue_window_secs: u64,
    /// Also delete succeeded work items resolved more than this many seconds ago.
    #[arg(long)]
    pub(crate) work_items_keep_secs: Option<u64>,
    /// Rows per delete statement.
    #[arg(long, default_value_t = 1000)]
    pub(crate) batch_size: i64,
    /// Keep running, one round every --interval-secs, until SIGTERM.
    #[arg(long = "loop")]
    pub(crate) run_loop: bool,
    /// Pause between rounds with --loop.
    #[arg(long, default_value_t = 60)]
    pub(crate) interval_secs: u64,
}

/// The names and descriptions of the test tools, for `outbox --help`.
#[cfg(feature = "harness")]
fn tools() -> Vec<(String, String)> {
    use clap::Subcommand as _;
    outbox_harness::Tool::augment_subcommands(clap::Command::new("tools"))
        .get_subcommands()
        .map(|c| {
            let about = c.get_about().map(ToString::to_string).unwrap_or_default();
            let first = about.split(". ").next().unwrap_or_default().to_owned();
            (c.get_name().to_owned(), first)
        })
        .collect()
}

/// The command line: operator commands in the main list, the test tools (when built in) hidden
/// from it and listed apart after it.
fn command() -> clap::Command {
    let cmd = Cli::command();
    #[cfg(feature = "harness")]
    {
        let mut text = String::from(
            "Test tools (this build has the `harness` feature; never run them against production):",
        );
        let mut cmd = cmd;
        for (name, about) in tools() {
            text.push_str(&format!("\n  {name:<16} {about}"));
            cmd = cmd.mut_subcommand(name, |c| c.hide(true));
        }
        cmd.after_help(text)
    }
    #[cfg(not(feature = "harness"))]
    cmd.after_help(
        "Test tools (crash-matrix, demo, demo-consumer, demo-producer, demo-provider): not in \
         this build; build with `--features harness`.",
    )
}

fn main() -> ExitCode {
    exit_quietly_on_closed_stdout();
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // Generated from the command definition; they need no configuration, database or broker.
    match &cli.command {
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(*shell, &mut command(), "outbox", &mut out);
            return print_generated(&out);
        }
        Command::Man => {
            let mut out = Vec::new();
            // Rendering into memory cannot fail.
            let _ = clap_mangen::Man::new(command()).render(&mut out);
            return print_generated(&out);
        }
        _ => {}
    }
    // Several client libraries build TLS configurations from rustls's process-wide default
    // provider; the binary links both ring and aws-lc-rs, so name one instead of panicking.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let brokers = outbox::brokers();
    let file = match &cli.config {
        Some(p) => FileConfig::load(p, &brokers),
        None => Ok(FileConfig::default()),
    };
    // Every URL the process may hand to a client library: their secrets are masked in all
    // log output and in the final error, whatever prints them.
    let mut urls: Vec<&str> = [cli.database_url.as_deref(), cli.broker_url.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    if let Ok(f) = &file {
        urls.extend(f.database_url.as_deref());
        urls.extend(f.broker_url.as_deref());
    }
    if let Command::Effects(effects_cmd::EffectsCmd::Run(args)) = &cli.command {
        urls.push(args.provider_url());
    }
    let scrubber = Arc::new(logging::scrubber(urls));
    // A log line of a test tool clears its progress bar, is written, and the bar comes back.
    #[cfg(feature = "harness")]
    logging::around_writes(outbox_harness::suspend_progress);
    #[cfg(feature = "harness")]
    let quiet = matches!(&cli.command, Command::Tool(t) if t.prints_progress());
    #[cfg(not(feature = "harness"))]
    let quiet = false;
    // The harness prints its own progress; its clients' connection chatter would drown it.
    let default_filter = if quiet {
        "warn,outbox_nats::transport=error,lapin=off".to_owned()
    } else {
        // The toolkit's own lines at info, third-party crates' at warn (their connection
        // chatter is not the operator's business). pgwire-replication logs every ended
        // replication connection at ERROR, a CDC standby's retry each second included; the CDC
        // relay reports each of those errors itself.
        logging::DEFAULT_FILTER.to_owned()
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    let writer = logging::ScrubbingStderr::new(Arc::clone(&scrubber));
    match cli.log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(logging::colour())
            .with_writer(writer)
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(writer)
            .init(),
    }
    let fail = |e: anyhow::Error| {
        eprintln!("error: {}", scrubber.scrub(&format!("{e:#}")));
        ExitCode::from(2)
    };
    let file = match file {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(anyhow::Error::new(e).context("cannot start the async runtime")),
    };
    match rt.block_on(run(cli, file, brokers)) {
        Ok(code) => code,
        Err(e) => fail(e),
    }
}

async fn run(cli: Cli, file: FileConfig, brokers: Registry) -> Result<ExitCode> {
    let settings = file.broker_settings(&cli.security);
    #[cfg(feature = "harness")]
    if let Command::Tool(tool) = cli.command {
        let ctx = outbox_harness::Context {
            database_url: cli
                .database_url
                .or_else(|| std::env::var("DATABASE_URL").ok().filter(|s| !s.is_empty()))
                .or_else(|| file.database_url.clone()),
            broker_url: cli.broker_url.or_else(|| file.broker_url.clone()),
            schema: cli.schema.or_else(|| file.schema.clone()),
            brokers,
            settings,
        };
        return outbox_harness::run(tool, ctx).await;
    }
    if let Command::Ready {
        metrics_addr,
        wait_secs,
    } = &cli.command
    {
        let wait = std::time::Duration::try_from_secs_f64(*wait_secs)
            .context("--wait-secs must be a number of seconds, 0 or more")?;
        let addr = metrics_addr
            .as_deref()
            .or(file.metrics_addr.as_deref())
            .context(
                "no metrics address to ask: give --metrics-addr, OUTBOX_METRICS_ADDR or the \
                 config file's metrics_addr, as the relay has",
            )?;
        return commands::ready(addr, wait).await;
    }
    if let Command::Roles(cmd) = cli.command {
        return roles_cmd::run(cmd, cli.database_url, cli.schema, &file, &brokers).await;
    }
    let resolved = config::resolve(
        cli.database_url,
        cli.broker_url,
        cli.schema,
        &file,
        &brokers,
    )?;
    let pool = outbox_postgres::connect(
        &resolved.database_url,
        16,
        std::time::Duration::from_secs(5),
    )
    .await?;
    let store_config = PgStoreConfig {
        schema: resolved.schema.clone(),
        on_publish: file.relay.on_publish,
    };
    let schema = &resolved.schema;
    match cli.command {
        Command::Migrate => {
            let cdc = match file.relay.mode {
                config::RelayMode::Cdc => Some(file.relay.cdc_config()?),
                config::RelayMode::Polling => None,
            };
            commands::migrate(&pool, schema, cdc.as_ref(), file.relay.on_publish).await
        }
        Command::Relay {
            metrics_addr,
            mode,
            create_slot,
        } => {
            // The claim window, the live session and the checks: `commands::relay` (PgRelay).
            let store = outbox_postgres::PgStore::new(pool, store_config);
            let broker_url = broker_url(&resolved)?;
            let run = commands::RelayRun {
                brokers: &brokers,
                broker_url: &broker_url,
                settings: &settings,
                file: &file,
                metrics_addr,
                mode: mode.unwrap_or(file.relay.mode),
                database_url: &resolved.database_url,
                create_slot,
            };
            commands::relay(store, run).await
        }
        Command::Console { listen, read_only } => {
            commands::console(pool, store_config, &file, listen, read_only).await
        }
        Command::Status {
            json,
            relay_metrics,
        } => commands::status(pool, store_config, json, relay_metrics).await,
        Command::DeadLetters(cmd) => admin_cmd::dead_letters(admin(pool, store_config), cmd).await,
        Command::Conflicts(cmd) => admin_cmd::conflicts(admin(pool, store_config), cmd).await,
        Command::ConsumerDeadLetters(cmd) => {
            admin_cmd::consumer_dead_letters(admin(pool, store_config), cmd).await
        }
        Command::Audit {
            limit,
            before,
            json,
        } => admin_cmd::audit(admin(pool, store_config), limit, before, json).await,
        Command::Pause { which, action } => {
            admin_cmd::pause(admin(pool, store_config), which, action).await
        }
        Command::Resume { which, action } => {
            admin_cmd::resume(admin(pool, store_config), which, action).await
        }
        Command::Pauses { json } => admin_cmd::pauses(admin(pool, store_config), json).await,
        Command::Replay(args) => admin_cmd::replay(admin(pool, store_config), args).await,
        Command::Trace {
            event_id,
            aggregate,
            limit,
        } => admin_cmd::trace(admin(pool, store_config), event_id, aggregate, limit).await,
        Command::Cleanup(args) => commands::cleanup(pool, schema, args).await,
        Command::Effects(cmd) => {
            effects_cmd::run(cmd, pool, schema.clone()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Debezium(cmd) => {
            debezium_cmd::run(cmd, &pool, schema, file.debezium.as_ref()).await
        }
        Command::Roles(_) | Command::Ready { .. } | Command::Completions { .. } | Command::Man => {
            unreachable!("dispatched above")
        }
        #[cfg(feature = "harness")]
        Command::Tool(_) => unreachable!("dispatched above"),
    }
}

/// Writes generated text to stdout; a reader that stopped early (`| head`) is no error.
/// A closed stdout (`outbox dead-letters list | head`) ends the command quietly with exit code
/// 0, as [`print_generated`] does for completions. Rust ignores SIGPIPE (a relay's broken
/// socket must be an error, not a death), so its print macros panic on a broken pipe instead;
/// this hook turns exactly that panic into a clean exit. Every other panic keeps the default
/// report.
fn exit_quietly_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload_as_str().unwrap_or_default();
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(0);
        }
        default(info);
    }));
}

fn print_generated(text: &[u8]) -> ExitCode {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            ExitCode::from(2)
        }
    }
}

fn broker_url(resolved: &Resolved) -> Result<String> {
    resolved.broker_url.clone().context(
        "invalid configuration `broker_url`: not set (use --broker-url, OUTBOX_BROKER_URL or the config file)",
    )
}

/// The configured store, whose operator contract (`outbox_core::operator`) the CLI's operator
/// commands read and act through, as the console does.
fn admin(pool: sqlx::PgPool, store_config: PgStoreConfig) -> outbox_postgres::PgStore {
    outbox_postgres::PgStore::new(pool, store_config)
}
