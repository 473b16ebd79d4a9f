//! Benchmark harness of the outbox toolkit.
//!
//! * `w1`: producer overhead. Business insert alone vs. business insert + `enqueue` in the same
//!   transaction (and, informational, + `next_aggregate_version`), interleaved rounds.
//! * `w2`: relay drain rate vs. the raw confirmed-publish rate of the same client library,
//!   for NATS JetStream and RabbitMQ, interleaved rounds.
//! * `latency`: commit-to-receive latency at a steady producer rate, with and without the
//!   `RelayWaker`.
//! * `w3`: end-to-end latency, producer commit -> relay -> broker -> `PgConsumer` commit, at a
//!   steady rate.
//! * `w6`: a backlog of millions of pending events drained by the `outbox relay` process:
//!   claim latency as it shrinks, relay memory, first publish after a restart, table sizes,
//!   in delete and mark mode (with mark mode's retention).
//! * `paused`: what a paused route's backlog costs each claim.
//! * `cdc-memory`: the CDC relay's peak RSS with one transaction of a million rows, against
//!   the same rows in ordinary transactions.
//! * `w7`: failover: a relay SIGKILLed while it holds leases (or the streaming CDC relay), and
//!   the time until a survivor publishes what it held.
//! * `w4`: consumer throughput: draining a preloaded stream / queue with `PgConsumer` (inbox)
//!   vs. the same handler without the inbox, one delivery per transaction and batched.
//!
//! Every workload creates its own PostgreSQL schema and broker objects (random names) and
//! removes them at the end. Results are printed as markdown tables; see `BENCHMARKS.md`.

mod brokers;
mod cdc_memory;
mod common;
mod consume;
mod latency;
mod paused;
mod relay_process;
mod timing;
mod w1;
mod w2;
mod w3;
mod w4;
mod w5;
mod w6;
mod w7;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::common::Env;

/// Outbox benchmark harness.
#[derive(Parser, Debug)]
#[command(name = "outbox-bench", version)]
struct Cli {
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Subcommand, Debug)]
enum Workload {
    /// Producer overhead: business insert vs. business insert + enqueue (same transaction).
    W1(w1::Args),
    /// Relay drain rate vs. the raw confirmed-publish rate of the broker client.
    W2(w2::Args),
    /// Commit-to-receive latency at a steady rate, with and without the relay waker.
    Latency(latency::Args),
    /// End-to-end latency: producer commit -> relay -> broker -> PgConsumer commit.
    W3(w3::Args),
    /// Consumer throughput: PgConsumer with the inbox vs. the same handler without it.
    W4(w4::Args),
    /// CDC relay drain vs. the polling relay's drain of the same backlog.
    W5(w5::Args),
    /// A backlog of millions of events drained by the relay process: claim latency, memory,
    /// restart, sizes, in delete and mark mode.
    W6(w6::Args),
    /// What a paused route costs each claim, by the size of its backlog.
    Paused(paused::Args),
    /// The CDC relay's memory with one very large transaction, against ordinary ones.
    CdcMemory(cdc_memory::Args),
    /// Failover: a relay SIGKILLed while it holds leases, or the streaming CDC relay; the
    /// time until a survivor publishes what it held.
    W7(w7::Args),
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let env = Env::from_env();
    println!("{}", common::run_header(&env));
    match cli.workload {
        Workload::W1(a) => w1::run(&env, a).await,
        Workload::W2(a) => w2::run(&env, a).await,
        Workload::Latency(a) => latency::run(&env, a).await,
        Workload::W3(a) => w3::run(&env, a).await,
        Workload::W4(a) => w4::run(&env, a).await,
        Workload::W5(a) => w5::run(&env, a).await,
        Workload::W6(a) => w6::run(&env, a).await,
        Workload::Paused(a) => paused::run(&env, a).await,
        Workload::CdcMemory(a) => cdc_memory::run(&env, a).await,
        Workload::W7(a) => w7::run(&env, a).await,
    }
}
