//! `igaming`: a sportsbook's bets service built on the outbox toolkit, as a user would build it,
//! and the one command that runs the whole story, kills a process of each kind in the middle,
//! re-sends one event with a changed payload the way a buggy producer would, and verifies the
//! end state.
//!
//! Every subcommand but `run` is one process of the story:
//!
//! | subcommand | process                                                                     |
//! |------------|-----------------------------------------------------------------------------|
//! | `bets`     | the bets HTTP API (axum) on the bets database: accept and settle bets        |
//! | `relay`    | the outbox relay: bets database → broker                                     |
//! | `history`  | the player-history projection: its own database, its inbox                   |
//! | `payouts`  | the payout consumer: its own ledger database, its inbox, double-entry postings |
//! | `migrate`  | creates the tables of the three databases                                    |
//! | `run`      | all of the above as child processes, load, kills, the conflict, verification |
//!
//! See `examples/igaming/README.md` for the story and how to run it.
#![forbid(unsafe_code)]

mod bets;
mod conflict;
mod db;
mod history;
mod load;
mod payouts;
mod run;
mod topology;
mod verify;

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use support::topology::Deployment;

use crate::topology::Topology;

/// The bets service of the iGaming example, and its one-command story.
#[derive(Parser, Debug)]
#[command(name = "igaming", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The bets HTTP API: accept and settle bets with idempotency keys.
    Bets {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: SocketAddr,
        #[command(flatten)]
        common: Common,
    },
    /// The outbox relay of the bets database.
    Relay {
        #[command(flatten)]
        common: Common,
    },
    /// The player-history projection: consumes bet events into its own database.
    History {
        #[command(flatten)]
        common: Common,
    },
    /// The payout consumer: posts each won bet's payout into the double-entry ledger.
    Payouts {
        #[command(flatten)]
        common: Common,
    },
    /// Creates (or updates) the tables of the bets, history and ledger databases.
    Migrate {
        #[command(flatten)]
        common: Common,
    },
    /// The whole story: fresh databases, every process, load, kills, the conflict, the table.
    Run(run::RunArgs),
}

/// Options shared by the service processes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// The bets database (bets, the outbox, the request idempotency keys).
    #[arg(
        long,
        env = "IGAMING_BETS_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/igaming_bets"
    )]
    pub bets_url: String,
    /// The player-history projection's own database.
    #[arg(
        long,
        env = "IGAMING_HISTORY_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/igaming_history"
    )]
    pub history_url: String,
    /// The ledger's own database (the payout consumer's inbox lives there too).
    #[arg(
        long,
        env = "IGAMING_LEDGER_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/igaming_ledger"
    )]
    pub ledger_url: String,
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
    support::child::run_main("igaming", dispatch(Cli::parse().command))
}

async fn dispatch(command: Command) -> Result<ExitCode> {
    let common = match command {
        Command::Run(args) => return run::run(args).await,
        Command::Migrate { common } => {
            db::migrate_all(&common).await?;
            println!("bets, history and ledger databases migrated");
            return Ok(ExitCode::SUCCESS);
        }
        Command::Bets { ref common, .. }
        | Command::Relay { ref common }
        | Command::History { ref common }
        | Command::Payouts { ref common } => common.clone(),
    };
    // A service process: it stops on SIGTERM, and under `igaming run` when the parent is gone.
    let shutdown = support::child::service_shutdown();
    match command {
        Command::Bets { listen, .. } => bets::serve(&common, listen, shutdown).await?,
        Command::Relay { .. } => {
            let topology = common.topology()?;
            support::relay::run(
                &common.bets_url,
                &common.deployment.broker_url,
                &topology,
                shutdown,
            )
            .await?;
        }
        Command::History { .. } => history::run(&common, shutdown).await?,
        Command::Payouts { .. } => payouts::run(&common, shutdown).await?,
        Command::Migrate { .. } | Command::Run(_) => unreachable!("handled above"),
    }
    Ok(ExitCode::SUCCESS)
}
