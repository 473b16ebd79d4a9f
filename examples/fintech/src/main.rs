//! `fintech`: a payments service built on the outbox toolkit, as a user would build it, and the
//! one command that runs the whole story, kills a process of each kind in the middle, and
//! verifies the end state.
//!
//! Every subcommand but `run` is one process of the story:
//!
//! | subcommand  | process                                                                 |
//! |-------------|-------------------------------------------------------------------------|
//! | `payments`  | the payments HTTP API (axum) on the payments database                   |
//! | `relay`     | the outbox relay: payments database → broker                            |
//! | `reporting` | the reporting service: its own database, its inbox, a report table      |
//! | `capture`   | the capture worker: a `PaymentCaptured` consumer that writes a work item, and the executor that captures at the provider |
//! | `provider`  | the stand-in payment provider (not part of the service)                 |
//! | `migrate`   | creates the tables of the payments and reporting databases              |
//! | `run`       | all of the above as child processes, load, kills, verification table    |
//!
//! See `examples/fintech/README.md` for the story and how to run it.
#![forbid(unsafe_code)]

mod capture;
mod db;
mod http_client;
mod load;
mod payments;
mod relay;
mod reporting;
mod run;
mod topology;
mod verify;

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::topology::Topology;

/// Default PostgreSQL server (its database is used only to create the run's databases).
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// Default broker.
pub const DEFAULT_BROKER_URL: &str = "nats://127.0.0.1:4222";
/// Set by `fintech run` on its children: a child exits when its standard input closes, so no
/// child outlives its parent, even one that was killed itself.
pub const PARENT_WATCH_ENV: &str = "FINTECH_PARENT_WATCH";
/// The line a child prints on stdout once it serves (listening, connected to the broker).
pub const READY_LINE: &str = "ready";

/// The payments service of the FinTech example, and its one-command story.
#[derive(Parser, Debug)]
#[command(name = "fintech", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The payments HTTP API: create and capture payments with idempotency keys.
    Payments {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        #[command(flatten)]
        common: Common,
    },
    /// The outbox relay of the payments database.
    Relay {
        #[command(flatten)]
        common: Common,
    },
    /// The reporting service: consumes payment events into its own database through its inbox.
    Reporting {
        #[command(flatten)]
        common: Common,
    },
    /// The capture worker: turns `PaymentCaptured` into a provider-capture work item (in its
    /// inbox transaction) and runs the executor that performs it at the provider.
    Capture {
        /// Base URL of the payment provider.
        #[arg(long, default_value = "http://127.0.0.1:8090")]
        provider_url: String,
        #[command(flatten)]
        common: Common,
    },
    /// The stand-in payment provider (`outbox_harness::provider`). It stands in for the real
    /// external provider; it is not part of the service.
    Provider {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8090")]
        listen: SocketAddr,
    },
    /// Creates (or updates) the tables of the payments and the reporting database.
    Migrate {
        #[command(flatten)]
        common: Common,
    },
    /// The whole story: fresh databases, every process, load, kills, verification table.
    Run(run::RunArgs),
}

/// Options shared by the service processes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// The payments database.
    #[arg(
        long,
        env = "FINTECH_PAYMENTS_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/fintech_payments"
    )]
    pub payments_url: String,
    /// The reporting service's own database.
    #[arg(
        long,
        env = "FINTECH_REPORTING_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/fintech_reporting"
    )]
    pub reporting_url: String,
    /// The broker, chosen by scheme: nats://, amqp://.
    #[arg(long, env = "FINTECH_BROKER_URL", default_value = DEFAULT_BROKER_URL)]
    pub broker_url: String,
    /// Names the broker objects of this deployment (NATS stream `FINTECH_<NAME>`, subjects
    /// `fintech_<name>.>`, RabbitMQ exchange `fintech_<name>`), so runs do not share them.
    #[arg(long, env = "FINTECH_NAME", default_value = "demo")]
    pub name: String,
    /// Timings for a short demonstration (short leases, quick redelivery).
    #[arg(long)]
    pub fast: bool,
}

impl Common {
    /// The broker objects and timings of this deployment.
    pub fn topology(&self) -> Result<Topology> {
        Topology::new(&self.name, self.fast)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fintech: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(dispatch(cli.command));
    // Not waiting for blocking tasks: the parent watch's read of stdin never ends on its own.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fintech: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(command: Command) -> Result<ExitCode> {
    let shutdown = CancellationToken::new();
    if !matches!(command, Command::Run(_)) {
        tokio::spawn(outbox::cancel_on_signal(shutdown.clone()));
        watch_parent(shutdown.clone());
    }
    match command {
        Command::Payments { listen, common } => payments::serve(&common, listen, shutdown).await?,
        Command::Relay { common } => relay::run(&common, shutdown).await?,
        Command::Reporting { common } => reporting::run(&common, shutdown).await?,
        Command::Capture {
            provider_url,
            common,
        } => capture::run(&common, &provider_url, shutdown).await?,
        Command::Provider { listen } => {
            // The stand-in prints `listening on http://ADDR` on stdout once bound: the parent's
            // readiness line for this child.
            let args = outbox_harness::provider::ProviderArgs {
                listen,
                no_idempotency: false,
                delay_ms: 0,
            };
            outbox_harness::provider::run_provider(args, shutdown).await?;
        }
        Command::Migrate { common } => {
            db::migrate_payments(&db::connect(&common.payments_url, 2).await?).await?;
            db::migrate_reporting(&db::connect(&common.reporting_url, 2).await?).await?;
            println!("payments and reporting databases migrated");
        }
        Command::Run(args) => return run::run(args).await,
    }
    Ok(ExitCode::SUCCESS)
}

/// Logs to stderr; `RUST_LOG` overrides the default level.
fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=error,lapin=warn,async_nats=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Under `fintech run` ([`PARENT_WATCH_ENV`]): stop when standard input reaches its end, which
/// happens when the parent exits or dies. A child of a parent that was SIGKILLed is not left
/// running.
fn watch_parent(shutdown: CancellationToken) {
    if std::env::var(PARENT_WATCH_ENV).as_deref() != Ok("1") {
        return;
    }
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        tracing::warn!("parent gone (stdin closed): stopping");
        shutdown.cancel();
        // Give the graceful path a moment, then leave regardless.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        std::process::exit(1);
    });
}

/// Prints [`READY_LINE`] on stdout for the parent.
pub fn announce_ready() {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{READY_LINE}");
    let _ = out.flush();
}
