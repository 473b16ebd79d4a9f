//! The test tools of the `outbox` binary: what its `harness` feature adds.
//!
//! * `outbox crash-matrix` ([`matrix`]): the design's crash matrix with real processes (producer,
//!   relays, consumer, executor, provider) killed at named crash points, plus the chaos run.
//! * `outbox demo` ([`demo`]): a payments workload end to end, with a verdict.
//! * `outbox demo-consumer`, `outbox demo-producer` ([`workload`]), `outbox demo-provider`
//!   ([`provider`], a stand-in payment provider speaking the protocol of `outbox-http`): the
//!   processes the crash matrix runs and kills.
//! * The ack-first source ([`ack_first`]): a consumer broken on purpose, so the matrix can show
//!   it notices.
//!
//! None of this is in a production build: the operator binary built without the `harness`
//! feature has neither these commands nor the crash points they arm (`outbox-core`'s
//! `crash-points` feature, which this crate enables). These are test tools whose errors end in
//! the binary's exit message, so they use `anyhow`.
#![forbid(unsafe_code)]

pub mod ack_first;
pub mod demo;
pub mod matrix;
mod observer;
mod progress;
/// The stand-in payment provider (`outbox demo-provider`), kept in its own crate so that the
/// examples can run it without the harness's crash points.
pub use outbox_stand_in as provider;
pub use progress::suspend as suspend_progress;
pub mod workload;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, Result};
use outbox_core::broker::{BrokerSettings, Registry};
use outbox_postgres::Schema;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// What the binary resolved from its flags, environment and configuration file.
#[derive(Debug, Clone)]
pub struct Context {
    /// PostgreSQL URL, when one was given.
    pub database_url: Option<String>,
    /// Broker URL, when one was given.
    pub broker_url: Option<String>,
    /// Schema name, when one was given.
    pub schema: Option<String>,
    /// The brokers of the build.
    pub brokers: Registry,
    /// The broker settings sections and file overrides.
    pub settings: BrokerSettings,
}

/// The test tools' database when none was given: the local test database.
const DEFAULT_DB: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The test tools' broker when none was given: the local NATS.
const DEFAULT_BROKER: &str = "nats://127.0.0.1:4222";

impl Context {
    /// The database URL given, or the local test database (the demo's and the crash
    /// matrix's default).
    fn database_url_or_local(&self) -> String {
        self.database_url
            .clone()
            .unwrap_or_else(|| DEFAULT_DB.to_owned())
    }

    /// The broker URL given, or the local NATS.
    fn broker_url_or_local(&self) -> String {
        self.broker_url
            .clone()
            .unwrap_or_else(|| DEFAULT_BROKER.to_owned())
    }

    fn database_url(&self) -> Result<&str> {
        self.database_url.as_deref().context(
            "invalid configuration `database_url`: not set (use --database-url, OUTBOX_DATABASE_URL, DATABASE_URL or the config file)",
        )
    }

    fn broker_url(&self) -> Result<&str> {
        self.broker_url.as_deref().context(
            "invalid configuration `broker_url`: not set (use --broker-url, OUTBOX_BROKER_URL or the config file)",
        )
    }

    fn schema(&self) -> Result<Schema> {
        Schema::new(
            self.schema
                .as_deref()
                .unwrap_or(outbox_postgres::DEFAULT_SCHEMA),
        )
        .map_err(|e| anyhow::anyhow!("invalid configuration `schema`: {e}"))
    }
}

/// The test tools, as subcommands of the `outbox` binary.
#[derive(clap::Subcommand, Debug)]
pub enum Tool {
    /// Run a payments workload through the relay to the broker and check every event arrived.
    Demo(demo::DemoArgs),
    /// The demo's reporting consumer as its own process (inbox + handler + ack after commit),
    /// until SIGTERM. Crash tests kill it with OUTBOX_CRASH_POINT=consumer.after_commit etc.
    DemoConsumer(demo::ConsumerArgs),
    /// The payments workload as its own process (resumable; crash points producer.*).
    DemoProducer(workload::ProducerArgs),
    /// The stand-in payment provider (HTTP) used by the crash matrix.
    DemoProvider(provider::ProviderArgs),
    /// Run the crash matrix (or, with --chaos, the chaos run) with real processes; exits 1 if
    /// any cell did not end as expected.
    CrashMatrix(matrix::MatrixArgs),
}

impl Tool {
    /// True for the tools that print their own progress, whose clients' connection chatter
    /// would drown it (the default log filter is quieter for them).
    pub fn prints_progress(&self) -> bool {
        matches!(self, Self::CrashMatrix(_) | Self::Demo(_))
    }
}

/// Connects the tools' pool (16 connections, 5 s to answer).
pub(crate) async fn connect_db(url: &str) -> Result<PgPool> {
    Ok(outbox_postgres::connect(url, 16, Duration::from_secs(5)).await?)
}

/// Runs `tool` until it ends, or until SIGTERM / Ctrl-C for the long-running ones.
///
/// # Errors
/// Whatever stopped the tool: configuration, connection, or a failed step.
pub async fn run(tool: Tool, ctx: Context) -> Result<ExitCode> {
    let shutdown = CancellationToken::new();
    match tool {
        Tool::Demo(args) => demo::run(args, &ctx).await,
        Tool::CrashMatrix(args) => matrix::run(args, &ctx).await,
        Tool::DemoProvider(args) => {
            tokio::spawn(outbox::cancel_on_signal(shutdown.clone()));
            provider::run_provider(args, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Tool::DemoProducer(args) => {
            let pool = connect_db(ctx.database_url()?).await?;
            workload::run_producer(args, pool, ctx.schema()?).await?;
            Ok(ExitCode::SUCCESS)
        }
        Tool::DemoConsumer(args) => {
            let pool = connect_db(ctx.database_url()?).await?;
            let broker_url = ctx.broker_url()?.to_owned();
            tokio::spawn(outbox::cancel_on_signal(shutdown.clone()));
            demo::run_consumer(args, pool, ctx.schema()?, &broker_url, &ctx, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
