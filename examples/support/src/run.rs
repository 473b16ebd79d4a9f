//! The mode of an example's one-command run (`fintech run`, `igaming run`) and its overrides:
//! the options both runs share, the numbers they resolve to, the services a run uses by
//! default, and the run's own databases and broker objects ([`Sandbox`]).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;

use crate::database::FreshDatabases;
use crate::load::LoadConfig;
use crate::topology::Topology;

/// The PostgreSQL server a run uses by default: its database serves only to create the run's
/// own databases.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The broker the examples use by default.
pub const DEFAULT_BROKER_URL: &str = "nats://127.0.0.1:4222";

/// The services a run uses, flattened into each example's `run` options. Flags only, on
/// purpose: a run creates and drops databases and broker objects, so it never takes its
/// servers from the environment, where a relay's own settings (`OUTBOX_DATABASE_URL`,
/// `OUTBOX_BROKER_URL`) may point at a service that matters.
#[derive(clap::Args, Debug, Clone)]
pub struct RunServices {
    /// The broker, chosen by scheme (nats://, amqp://).
    #[arg(long, default_value = DEFAULT_BROKER_URL)]
    pub broker_url: String,
    /// A database on the PostgreSQL server to use: the run creates its own databases there.
    #[arg(long, default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
    /// Keep the databases and broker objects of the run (and print where they are).
    #[arg(long)]
    pub keep: bool,
}

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

impl Plan {
    /// The load of this plan against the API at `api`: the plan's numbers, idempotency keys
    /// prefixed `run<pid>` (unique per run), and a minute for each command to get an answer.
    pub fn load(&self, api: SocketAddr) -> LoadConfig {
        LoadConfig {
            api: format!("http://{api}"),
            commands: self.commands,
            clients: self.clients,
            rate: self.rate,
            tag: format!("run{}", std::process::id()),
            retry_for: Duration::from_secs(60),
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

/// A run's own databases and broker objects, apart from every other run's: fresh databases on
/// the PostgreSQL server, and the stream or exchange of the run's deployment name (which the
/// run's relay creates). Created at the run's start, removed at its end unless kept.
pub struct Sandbox {
    databases: FreshDatabases,
    topology: Topology,
    broker: &'static str,
    broker_url: String,
}

impl Sandbox {
    /// Prints where the run keeps its state (the PostgreSQL server of `services` with the
    /// databases `names`; its broker, with `topology`'s stream on NATS or exchange on
    /// RabbitMQ), then creates the databases (dropped first if a former run left them).
    ///
    /// # Errors
    /// No broker of this build takes the broker URL, the server is unreachable, or the role
    /// may not create databases.
    pub async fn create(
        services: &RunServices,
        names: &[String],
        topology: &Topology,
    ) -> Result<Self> {
        let (database_url, broker_url) = (&services.database_url, &services.broker_url);
        let broker = outbox::brokers().find(broker_url)?.name;
        println!(
            "  postgres {} (databases {})",
            outbox::secrets::redact_url(database_url),
            names.join(", ")
        );
        println!(
            "  broker   {} ({broker}: {})",
            outbox::secrets::redact_url(broker_url),
            if broker == "nats" {
                topology.stream()
            } else {
                topology.prefix()
            }
        );
        Ok(Self {
            databases: FreshDatabases::create(database_url, names).await?,
            topology: topology.clone(),
            broker,
            broker_url: broker_url.to_owned(),
        })
    }

    /// The URL of the run's database `name` (one of those created).
    ///
    /// # Errors
    /// The server URL is not a URL.
    pub fn url(&self, name: &str) -> Result<String> {
        self.databases.url(name)
    }

    /// At the run's end: keeps the databases and broker objects if `keep`, printing where they
    /// are (`objects` names the broker objects in that line), or else removes them
    /// ([`Sandbox::remove`], with the RabbitMQ queues of `consumers`).
    pub async fn keep_or_remove(&self, keep: bool, objects: &str, consumers: &[&str]) {
        if keep {
            println!(
                "kept: databases {}; broker objects of {objects}",
                self.databases.names().join(", ")
            );
        } else {
            self.remove(consumers).await;
        }
    }

    /// Drops the run's databases and deletes its broker objects: the NATS stream, or the
    /// RabbitMQ queues of `consumers` and the exchange. A failure is a warning: the run's
    /// result stands.
    pub async fn remove(&self, consumers: &[&str]) {
        self.databases.drop_all().await;
        if let Err(e) = self
            .topology
            .delete_broker_objects(self.broker, &self.broker_url, consumers)
            .await
        {
            eprintln!("warning: cannot delete the run's broker objects: {e:#}");
        }
    }
}
