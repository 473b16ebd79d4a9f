//! The mode of an example's one-command run (`fintech run`, `igaming run`) and its overrides:
//! the options both runs share, and the numbers they resolve to.

use std::time::Duration;

use anyhow::Result;

/// The mode of a run and its overrides, flattened into each example's `run` options. The
/// number of commands has a flag of the example's own (`--payments`, `--bets`).
#[derive(clap::Args, Debug, Clone)]
pub struct ModeArgs {
    /// The CI mode: a few hundred commands at a set rate, one kill of each kind, well under a
    /// minute (the default).
    #[arg(long, conflicts_with = "long")]
    pub short: bool,
    /// The long mode: 20,000 commands as fast as the API answers, three kills of each kind.
    #[arg(long)]
    pub long: bool,
    /// Concurrent clients (overrides the mode's).
    #[arg(long)]
    pub clients: Option<u64>,
    /// Commands started per second, 0 for no limit (overrides the mode's).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Rounds of kills: each round kills one process of each kind (overrides the mode's).
    #[arg(long)]
    pub kill_rounds: Option<u32>,
    /// Seconds to wait for everything to drain after the load (overrides the mode's).
    #[arg(long)]
    pub drain_timeout_secs: Option<u64>,
}

/// The numbers of a run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `short` or `long`.
    pub mode: &'static str,
    /// Commands to send (payments to create, bets to place).
    pub commands: u64,
    /// Concurrent clients.
    pub clients: u64,
    /// Commands started per second across all clients; 0: as fast as the API answers.
    pub rate: f64,
    /// Rounds of kills.
    pub kill_rounds: u32,
    /// How long everything may take to drain after the load.
    pub drain_timeout: Duration,
}

impl Plan {
    /// The long mode's numbers, the same in every example.
    pub const LONG: Plan = Plan {
        mode: "long",
        commands: 20_000,
        clients: 16,
        rate: 0.0,
        kill_rounds: 3,
        drain_timeout: Duration::from_secs(600),
    };

    /// A short mode of `commands` at `rate` per second from 8 clients, one kill round, 40 s to
    /// drain.
    pub const fn short(commands: u64, rate: f64) -> Plan {
        Plan {
            mode: "short",
            commands,
            clients: 8,
            rate,
            kill_rounds: 1,
            drain_timeout: Duration::from_secs(40),
        }
    }
}

impl ModeArgs {
    /// The plan of the chosen mode (`short` unless `--long`) with the overrides applied;
    /// `commands` is the example's own count flag, named `--{flag}`, counting `unit`.
    ///
    /// # Errors
    /// An override out of range (fewer than 20 commands, no client, a negative or infinite
    /// rate), naming the option.
    pub fn plan(&self, short: Plan, commands: Option<u64>, flag: &str, unit: &str) -> Result<Plan> {
        let mode = if self.long { Plan::LONG } else { short };
        let plan = Plan {
            commands: commands.unwrap_or(mode.commands),
            clients: self.clients.unwrap_or(mode.clients),
            rate: self.rate.unwrap_or(mode.rate),
            kill_rounds: self.kill_rounds.unwrap_or(mode.kill_rounds),
            drain_timeout: self
                .drain_timeout_secs
                .map_or(mode.drain_timeout, Duration::from_secs),
            mode: mode.mode,
        };
        crate::load::check_numbers(flag, unit, plan.commands, plan.clients, plan.rate)?;
        Ok(plan)
    }
}
