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
mod load;
mod payments;
mod reporting;
mod run;
mod topology;
mod verify;

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use support::topology::Deployment;

use crate::topology::Topology;

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
    /// The stand-in payment provider (`outbox_stand_in`). It stands in for the real
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
    /// The broker and the deployment's name.
    #[command(flatten)]
    pub deployment: Deployment,
}

impl Common {
    /// The broker objects and timings of this deployment.
    pub fn topology(&self) -> Result<Topology> {
        topology::topology(&self.deployment.name, self.deployment.fast)
    }
}

fn main() -> ExitCode {
    support::child::run_main("fintech", dispatch(Cli::parse().command))
}

async fn dispatch(command: Command) -> Result<ExitCode> {
    if let Command::Run(args) = command {
        return run::run(args).await;
    }
    // A service process: it stops on SIGTERM, and under `fintech run` when the parent is gone.
    let shutdown = support::child::service_shutdown();
    match command {
        Command::Payments { listen, common } => payments::serve(&common, listen, shutdown).await?,
        Command::Relay { common } => {
            // The toolkit's polling relay, the shape of `outbox relay` (see `support::relay`).
            let topology = common.topology()?;
            support::relay::run(
                &common.payments_url,
                &common.deployment.broker_url,
                &topology,
                shutdown,
            )
            .await?;
        }
        Command::Reporting { common } => reporting::run(&common, shutdown).await?,
        Command::Capture {
            provider_url,
            common,
        } => capture::run(&common, &provider_url, shutdown).await?,
        Command::Provider { listen } => {
            // The stand-in prints `listening on http://ADDR` on stdout once bound: the parent's
            // readiness line for this child.
            let args = outbox_stand_in::ProviderArgs {
                listen,
                no_idempotency: false,
                delay_ms: 0,
            };
            outbox_stand_in::run_provider(args, shutdown).await?;
        }
        Command::Migrate { common } => {
            db::PAYMENTS
                .migrate(&db::connect(&common.payments_url, 2).await?)
                .await?;
            db::REPORTING
                .migrate(&db::connect(&common.reporting_url, 2).await?)
                .await?;
            println!("payments and reporting databases migrated");
        }
        Command::Run(_) => unreachable!("handled above"),
    }
    Ok(ExitCode::SUCCESS)
}
