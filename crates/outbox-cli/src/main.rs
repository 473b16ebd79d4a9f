//! `outbox`: operate the transactional outbox.
//!
//! ```text
//! outbox migrate                      create / upgrade the tables
//! outbox relay                        move committed rows to the broker (Prometheus on --metrics-addr)
//! outbox status [--json]              pending, oldest age, in flight, retrying, dead letters
//! outbox dead-letters list            what exhausted its attempts, and what waits behind it
//! outbox dead-letters requeue ID…|--all
//! outbox cleanup                      elected retention round (inbox identities, old work items)
//! outbox effects run|status|list|resolve   remote-effect executor and work items
//! outbox crash-matrix [--chaos]        the crash matrix / chaos run with real processes
//! outbox demo                         payments workload through the relay to the broker, with a verdict
//! ```
#![forbid(unsafe_code)]

mod broker;
mod config;
mod demo;
mod effects_cmd;
mod http_provider;
mod logging;
mod matrix;
mod observer;
mod provider;
mod roles_cmd;
mod scrape;
#[cfg(test)]
mod tls_testkit;
mod workload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use outbox_core::relay::Relay;
use outbox_core::{DeadLetterListParams, OutboxStore, RequeueParams};
use outbox_postgres::{PgStore, PgStoreConfig};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::broker::AnyTransport;
use crate::config::{BrokerKind, FileConfig, Resolved, broker_kind, redact};

#[derive(Parser, Debug)]
#[command(
    name = "outbox",
    version,
    about = "Transactional outbox: migrate, relay, inspect, demo"
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
    /// amqp://user:pass@host:5672/vhost or amqps://… (RabbitMQ over TLS).
    #[arg(long, global = true, env = "OUTBOX_BROKER_URL", hide_env_values = true)]
    broker_url: Option<String>,
    #[command(flatten)]
    security: config::BrokerSecurityArgs,
    /// Schema holding the outbox tables (default `outbox`).
    #[arg(long, global = true, env = "OUTBOX_SCHEMA")]
    schema: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create or upgrade the outbox tables (safe to run concurrently and repeatedly).
    Migrate,
    /// Run the relay until SIGTERM / Ctrl-C.
    Relay {
        /// Serve Prometheus metrics here, e.g. 127.0.0.1:9090. The endpoint has no
        /// authentication: keep it on loopback unless a firewall guards the interface.
        #[arg(long, env = "OUTBOX_METRICS_ADDR")]
        metrics_addr: Option<SocketAddr>,
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
    /// Inspect and requeue dead letters.
    #[command(subcommand)]
    DeadLetters(DeadLetterCmd),
    /// Run a payments workload through the relay to the broker and check every event arrived.
    Demo(demo::DemoArgs),
    /// The demo's reporting consumer as its own process (inbox + handler + ack after commit),
    /// until SIGTERM. Crash tests kill it with OUTBOX_CRASH_POINT=consumer.after_commit etc.
    DemoConsumer(demo::ConsumerArgs),
    /// Delete inbox identities older than the retention (never inside the replay horizon) and,
    /// optionally, old succeeded work items. One elected instance deletes; others skip.
    Cleanup(CleanupArgs),
    /// Remote effects: run the executor, inspect and resolve work items.
    #[command(subcommand)]
    Effects(effects_cmd::EffectsCmd),
    /// The stand-in payment provider (HTTP) used by the crash matrix.
    DemoProvider(provider::ProviderArgs),
    /// The payments workload as its own process (resumable; crash points producer.*).
    DemoProducer(workload::ProducerArgs),
    /// Run the crash matrix (or, with --chaos, the chaos run) with real processes; exits 1 if
    /// any cell did not end as expected.
    CrashMatrix(matrix::MatrixArgs),
    /// Events whose id arrived again with a different payload (recorded by consumers).
    #[command(subcommand)]
    Conflicts(ConflictsCmd),
    /// Deliveries a consumer could not apply: list them, hand them back to the consumer.
    #[command(subcommand)]
    ConsumerDeadLetters(ConsumerDeadLetterCmd),
    /// Least-privilege roles: print or apply each component's grants, check a role's.
    #[command(subcommand)]
    Roles(roles_cmd::RolesCmd),
}

/// Options of `outbox cleanup`.
#[derive(clap::Args, Debug)]
struct CleanupArgs {
    /// Keep inbox identities this many seconds after they were received.
    #[arg(long)]
    inbox_keep_secs: u64,
    /// How long the broker keeps messages a consumer may re-read (NATS stream max_age, a
    /// replayable queue's retention), seconds. Part of the replay horizon.
    #[arg(long)]
    broker_retention_secs: u64,
    /// How long published outbox rows are kept and may be republished, seconds.
    #[arg(long, default_value_t = 0)]
    outbox_retention_secs: u64,
    /// How long after failing a dead letter may still be requeued, seconds.
    #[arg(long, default_value_t = 0)]
    dead_letter_requeue_window_secs: u64,
    /// Also delete succeeded work items resolved more than this many seconds ago.
    #[arg(long)]
    work_items_keep_secs: Option<u64>,
    /// Rows per delete statement.
    #[arg(long, default_value_t = 1000)]
    batch_size: i64,
    /// Keep running, one round every --interval-secs, until SIGTERM.
    #[arg(long = "loop")]
    run_loop: bool,
    /// Pause between rounds with --loop.
    #[arg(long, default_value_t = 60)]
    interval_secs: u64,
}

#[derive(Subcommand, Debug)]
enum ConflictsCmd {
    /// List conflicts, newest first.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
}

#[derive(Subcommand, Debug)]
enum ConsumerDeadLetterCmd {
    /// List open consumer dead letters, oldest first.
    List {
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Mark dead letters for their consumer to apply again, through its inbox.
    Requeue {
        /// Dead-letter ids (from `list`).
        #[arg(required_unless_present = "all")]
        ids: Vec<i64>,
        /// Requeue every open dead letter (of `--consumer`, when given).
        #[arg(long, conflicts_with = "ids")]
        all: bool,
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum DeadLetterCmd {
    /// List dead letters, oldest first.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Make dead letters pending again (attempts reset); their aggregates resume in order.
    Requeue {
        /// Event ids to requeue.
        #[arg(required_unless_present = "all")]
        event_ids: Vec<uuid::Uuid>,
        /// Requeue every dead letter.
        #[arg(long, conflicts_with = "event_ids")]
        all: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Several client libraries build TLS configurations from rustls's process-wide default
    // provider; the binary links both ring and aws-lc-rs, so name one instead of panicking.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let file = match &cli.config {
        Some(p) => FileConfig::load(p),
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
    // The harness prints its own progress; its clients' connection chatter would drown it.
    let default_filter = if matches!(cli.command, Command::CrashMatrix(_)) {
        "warn,outbox_nats::transport=error,lapin=off"
    } else {
        "info,sqlx=warn"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(logging::ScrubbingStderr::new(Arc::clone(&scrubber)))
        .init();
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
    match rt.block_on(run(cli, file)) {
        Ok(code) => code,
        Err(e) => fail(e),
    }
}

async fn run(cli: Cli, mut file: FileConfig) -> Result<ExitCode> {
    cli.security.apply(&mut file);
    if let Command::Demo(args) = cli.command {
        return demo::run(args, cli.database_url, cli.broker_url, &file).await;
    }
    if let Command::DemoProvider(args) = cli.command {
        let shutdown = CancellationToken::new();
        tokio::spawn(shutdown_on_signal(shutdown.clone()));
        provider::run_provider(args, shutdown).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::CrashMatrix(args) = cli.command {
        return matrix::run(args, cli.database_url, cli.broker_url, &file).await;
    }
    if let Command::Roles(cmd) = cli.command {
        return roles_cmd::run(cmd, cli.database_url, cli.schema, &file).await;
    }
    let resolved = config::resolve(cli.database_url, cli.broker_url, cli.schema, &file)?;
    let pool = connect_db(&resolved.database_url).await?;
    let store_config = PgStoreConfig {
        schema: resolved.schema.clone(),
        on_publish: file.relay.on_publish,
    };
    match cli.command {
        Command::Migrate => {
            let report = outbox_postgres::migrate(&pool, &resolved.schema).await?;
            if report.applied.is_empty() {
                println!(
                    "schema `{}` is up to date (version {})",
                    resolved.schema, report.version
                );
            } else {
                println!(
                    "schema `{}` migrated to version {} (applied {:?})",
                    resolved.schema, report.version, report.applied
                );
            }
        }
        Command::Relay { metrics_addr } => {
            let relay_config = file.relay.to_relay_config()?;
            let store = PgStore::new(pool, store_config);
            store.check().await.context("cannot start the relay")?;
            let broker_url = broker_url(&resolved)?;
            let transport = connect_transport(&broker_url, &file).await?;
            let addr = metrics_addr.or(file
                .metrics_addr
                .as_deref()
                .map(|a| a.parse().context("invalid configuration `metrics_addr`"))
                .transpose()?);
            if let Some(addr) = addr {
                install_metrics(addr)?;
                info!(%addr, "serving Prometheus metrics");
            }
            let relay = Arc::new(Relay::new(
                Arc::new(store),
                Arc::new(transport),
                relay_config,
            )?);
            let shutdown = CancellationToken::new();
            tokio::spawn(shutdown_on_signal(shutdown.clone()));
            // Leases of crashed relays are reaped by one elected relay.
            let reaper = outbox_core::maintenance::Maintainer::<PgStore>::new(
                Arc::clone(relay.store()),
                outbox_core::maintenance::MaintenanceConfig {
                    lease_reap_after: Some(LEASE_REAP_AFTER),
                    ..Default::default()
                },
            )?;
            let reaping = tokio::spawn(reaper.run(shutdown.clone()));
            info!(schema = %resolved.schema, broker = %redact(&broker_url), "relay started");
            relay.run(shutdown).await;
            let _ = reaping.await;
        }
        Command::Status {
            json,
            relay_metrics,
        } => {
            let store = PgStore::new(pool, store_config);
            store.check().await?;
            let s = store.stats().await?;
            let conflicts = outbox_postgres::PgInbox::new(resolved.schema.clone())
                .conflict_count(store.pool())
                .await?;
            let consumer_dead = outbox_postgres::consumer_dead_letter_list(
                store.pool(),
                &resolved.schema,
                None,
                i64::MAX,
            )
            .await?
            .len();
            let effects = outbox_postgres::effects::PgEffects::new(resolved.schema.clone())
                .stats(store.pool(), None)
                .await?;
            let unknown_age = effects.oldest_unknown_age.map_or(0.0, |d| d.as_secs_f64());
            let relay = match &relay_metrics {
                Some(addr) => Some(scrape::fetch(addr).await?),
                None => None,
            };
            let age = s.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64());
            let total = |name: &str| {
                relay
                    .as_ref()
                    .map(|r| r.totals.get(name).copied().unwrap_or(0.0))
            };
            let q = |p: f64| relay.as_ref().and_then(|r| r.latency_quantile(p));
            use outbox_core::relay::metric as m;
            if json {
                let mut v = serde_json::json!({
                    "schema": resolved.schema.as_str(),
                    "pending": s.pending,
                    "oldest_pending_age_seconds": age,
                    "in_flight": s.in_flight,
                    "retrying": s.retrying,
                    "dead_letters": s.dead,
                    "published_retained": s.published_retained,
                    "inbox_conflicts": conflicts,
                    "consumer_dead_letters": consumer_dead,
                    "work_items": {
                        "pending": effects.pending,
                        "in_progress": effects.in_progress,
                        "unknown": effects.unknown,
                        "oldest_unknown_age_seconds": unknown_age,
                        "failed": effects.failed,
                    },
                });
                if relay.is_some() {
                    v["relay"] = serde_json::json!({
                        "published_total": total(m::PUBLISHED),
                        "publish_failures_total": total(m::PUBLISH_FAILURES),
                        "dead_lettered_total": total(m::DEAD_LETTERED),
                        "broker_duplicates_total": total(m::BROKER_DUPLICATES),
                        "lease_lost_total": total(m::LEASE_LOST),
                        "publish_latency_p50_seconds_le": q(0.5),
                        "publish_latency_p99_seconds_le": q(0.99),
                    });
                }
                println!("{v}");
            } else {
                println!("schema                      {}", resolved.schema);
                println!("pending                     {}", s.pending);
                println!("oldest pending age (s)      {age:.3}");
                println!("in flight (leased)          {}", s.in_flight);
                println!("retrying (failed >= once)   {}", s.retrying);
                println!("dead letters                {}", s.dead);
                println!("published (kept, mark mode) {}", s.published_retained);
                println!("inbox conflicts             {conflicts}");
                println!("consumer dead letters       {consumer_dead}");
                println!("work items pending          {}", effects.pending);
                println!("work items unknown          {}", effects.unknown);
                println!("oldest unknown age (s)      {unknown_age:.3}");
                println!("work items failed           {}", effects.failed);
                if relay.is_some() {
                    let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x}"));
                    println!("relay at {}:", relay_metrics.as_deref().unwrap_or(""));
                    println!("  published                 {}", f(total(m::PUBLISHED)));
                    println!(
                        "  failed attempts           {}",
                        f(total(m::PUBLISH_FAILURES))
                    );
                    println!("  dead-lettered             {}", f(total(m::DEAD_LETTERED)));
                    println!(
                        "  broker duplicates         {}",
                        f(total(m::BROKER_DUPLICATES))
                    );
                    println!("  leases lost               {}", f(total(m::LEASE_LOST)));
                    println!("  publish latency p50 <= s  {}", f(q(0.5)));
                    println!("  publish latency p99 <= s  {}", f(q(0.99)));
                }
            }
        }
        Command::DeadLetters(cmd) => {
            let store = PgStore::new(pool, store_config);
            store.check().await?;
            match cmd {
                DeadLetterCmd::List { limit } => {
                    let list = store
                        .dead_letter_list(DeadLetterListParams { limit })
                        .await?;
                    if list.is_empty() {
                        println!("no dead letters");
                    }
                    for d in list {
                        println!(
                            "{}  {}/{} v{}  {}  attempts={}  waiting_behind={}  created={}\n    last_error: {}",
                            d.event_id,
                            d.aggregate_type,
                            d.aggregate_id,
                            d.aggregate_version,
                            d.event_type,
                            d.attempts,
                            d.blocked_behind,
                            d.created_at.to_rfc3339(),
                            d.last_error.as_deref().unwrap_or("-")
                        );
                    }
                }
                DeadLetterCmd::Requeue { event_ids, all } => {
                    let params = RequeueParams {
                        event_ids: (!all).then_some(event_ids.clone()),
                    };
                    let n = store.dead_letter_requeue(params).await?;
                    println!("requeued {n} dead letter(s)");
                    if !all && (n as usize) < event_ids.len() {
                        println!(
                            "note: {} of the given ids were not dead letters",
                            event_ids.len() - n as usize
                        );
                        return Ok(ExitCode::from(1));
                    }
                }
            }
        }
        Command::Conflicts(ConflictsCmd::List { limit }) => {
            outbox_postgres::check_schema(&pool, &resolved.schema).await?;
            let inbox = outbox_postgres::PgInbox::new(resolved.schema.clone());
            let list = inbox.conflicts(&pool, limit).await?;
            if list.is_empty() {
                println!("no conflicts");
            }
            for c in list {
                println!(
                    "{}  consumer={}  {}/{} v{}  {}  seen {}x (first {}, last {})\n    stored  sha256 {}\n    received sha256 {}",
                    c.event_id,
                    c.consumer_name,
                    c.aggregate_type,
                    c.aggregate_id,
                    c.aggregate_version,
                    c.event_type,
                    c.occurrences,
                    c.first_seen.to_rfc3339(),
                    c.last_seen.to_rfc3339(),
                    c.stored,
                    c.received
                );
            }
        }
        Command::ConsumerDeadLetters(cmd) => {
            outbox_postgres::check_schema(&pool, &resolved.schema).await?;
            match cmd {
                ConsumerDeadLetterCmd::List { consumer, limit } => {
                    let list = outbox_postgres::consumer_dead_letter_list(
                        &pool,
                        &resolved.schema,
                        consumer.as_deref(),
                        limit,
                    )
                    .await?;
                    if list.is_empty() {
                        println!("no consumer dead letters");
                    }
                    for d in list {
                        println!(
                            "#{}  consumer={}  state={}  event={}  {}/{} v{}  {}  attempts={}  since {}\n    error: {}",
                            d.id,
                            d.consumer_name,
                            d.state,
                            d.event_id.map_or("-".to_owned(), |e| e.to_string()),
                            d.aggregate_type.as_deref().unwrap_or("-"),
                            d.aggregate_id.as_deref().unwrap_or("-"),
                            d.aggregate_version
                                .map_or("-".to_owned(), |v| v.to_string()),
                            d.event_type.as_deref().unwrap_or("-"),
                            d.attempts,
                            d.created_at.to_rfc3339(),
                            d.error
                        );
                    }
                }
                ConsumerDeadLetterCmd::Requeue { ids, all, consumer } => {
                    let n = outbox_postgres::consumer_dead_letter_requeue(
                        &pool,
                        &resolved.schema,
                        consumer.as_deref(),
                        (!all).then_some(ids.as_slice()),
                    )
                    .await?;
                    println!(
                        "requeued {n} consumer dead letter(s); the consumer applies them through its inbox"
                    );
                    if !all && (n as usize) < ids.len() {
                        println!(
                            "note: {} of the given ids were not open dead letters",
                            ids.len() - n as usize
                        );
                        return Ok(ExitCode::from(1));
                    }
                }
            }
        }
        Command::DemoConsumer(args) => {
            let broker_url = broker_url(&resolved)?;
            let shutdown = CancellationToken::new();
            tokio::spawn(shutdown_on_signal(shutdown.clone()));
            demo::run_consumer(args, pool, resolved.schema.clone(), &broker_url, shutdown).await?;
        }
        Command::DemoProducer(args) => {
            workload::run_producer(args, pool, resolved.schema.clone()).await?;
        }
        Command::Cleanup(a) => {
            use outbox_core::maintenance::{
                InboxRetention, Maintainer, MaintenanceConfig, ReplayHorizon,
            };
            outbox_postgres::check_schema(&pool, &resolved.schema).await?;
            if a.batch_size < 1 {
                anyhow::bail!("invalid option `--batch-size`: must be at least 1");
            }
            let config = MaintenanceConfig {
                inbox: Some(InboxRetention {
                    keep: Duration::from_secs(a.inbox_keep_secs),
                    horizon: ReplayHorizon {
                        broker_retention: Duration::from_secs(a.broker_retention_secs),
                        outbox_retention: Duration::from_secs(a.outbox_retention_secs),
                        dead_letter_requeue_window: Duration::from_secs(
                            a.dead_letter_requeue_window_secs,
                        ),
                    },
                }),
                work_items_keep: a.work_items_keep_secs.map(Duration::from_secs),
                lease_reap_after: Some(LEASE_REAP_AFTER),
                batch_size: a.batch_size,
                interval: Duration::from_secs(a.interval_secs.max(1)),
            };
            let store = PgStore::with_schema(pool, resolved.schema.clone());
            let maintainer = Maintainer::new(store, config).context("refusing to clean up")?;
            if a.run_loop {
                let shutdown = CancellationToken::new();
                tokio::spawn(shutdown_on_signal(shutdown.clone()));
                maintainer.run(shutdown).await;
            } else {
                match maintainer.round_once().await? {
                    Some(r) => println!(
                        "deleted {} row(s): {} inbox identities, {} work items, {} expired leases",
                        r.total(),
                        r.inbox,
                        r.work_items,
                        r.leases
                    ),
                    None => {
                        println!("another instance is the maintainer right now; nothing deleted")
                    }
                }
            }
        }
        Command::Effects(cmd) => {
            effects_cmd::run(cmd, pool, resolved.schema.clone()).await?;
        }
        Command::Demo(_) | Command::CrashMatrix(_) | Command::DemoProvider(_) => {
            unreachable!("handled above")
        }
        Command::Roles(_) => unreachable!("handled above"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Relay leases that expired this long ago belong to crashed relays: the maintainer deletes them.
const LEASE_REAP_AFTER: Duration = Duration::from_secs(600);

/// Connects the relay's transport by the URL's scheme, with the file's (and flags') TLS and
/// authentication settings: `nats://` / `tls://` to NATS, `amqp://` / `amqps://` to RabbitMQ.
async fn connect_transport(url: &str, file: &FileConfig) -> Result<AnyTransport> {
    match broker_kind(url) {
        Some(BrokerKind::Nats) => Ok(AnyTransport::Nats(Box::new(
            outbox_nats::NatsTransport::connect(url, file.nats.clone()).await?,
        ))),
        Some(BrokerKind::Rabbit) => Ok(AnyTransport::Rabbit(
            outbox_rabbitmq::RabbitTransport::connect(url, file.rabbitmq.clone()).await?,
        )),
        None => anyhow::bail!(
            "invalid configuration `broker_url`: unknown scheme in `{}`",
            redact(url)
        ),
    }
}

fn broker_url(resolved: &Resolved) -> Result<String> {
    resolved.broker_url.clone().context(
        "invalid configuration `broker_url`: not set (use --broker-url, OUTBOX_BROKER_URL or the config file)",
    )
}

/// Connects to PostgreSQL, failing fast with the (redacted) address when it is unreachable.
pub(crate) async fn connect_db(url: &str) -> Result<PgPool> {
    // One direct connection first: a pool only reports "timed out", this reports the cause
    // (connection refused, unknown database, authentication failed ...).
    {
        use sqlx::Connection;
        let conn = tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(url))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within 5 s"))
            .and_then(|r| r.map_err(anyhow::Error::from))
            .with_context(|| format!("cannot connect to PostgreSQL at {}", redact(url)))?;
        let _ = conn.close().await;
    }
    PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {}", redact(url)))
}

/// Serves Prometheus metrics on `addr` and describes the relay's metrics.
///
/// The endpoint has no authentication and no TLS, and its numbers (backlog, dead letters,
/// consumer names) describe the business. Loopback is the recommended address, scraped by a
/// local agent; any other address is served, with a warning, for interfaces a firewall guards.
pub(crate) fn install_metrics(addr: SocketAddr) -> Result<()> {
    use outbox_core::relay::metric;
    if !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "the metrics endpoint is not on loopback: it has no authentication, so anyone who \
             reaches this interface can read it; prefer 127.0.0.1 with a local scraper"
        );
    }
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(metric::PUBLISH_LATENCY.to_owned()),
            &[
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ],
        )
        .context("invalid metrics buckets")?
        .install()
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    metrics::describe_counter!(
        metric::PUBLISHED,
        "Messages the broker durably acknowledged"
    );
    metrics::describe_counter!(metric::PUBLISH_FAILURES, "Failed publish attempts");
    metrics::describe_counter!(
        metric::DEAD_LETTERED,
        "Messages moved to the dead-letter state"
    );
    metrics::describe_counter!(
        metric::BROKER_DUPLICATES,
        "Acks in which the broker reported a duplicate event id"
    );
    metrics::describe_counter!(
        metric::LEASE_LOST,
        "Rows whose settle write was refused: lease lost"
    );
    metrics::describe_histogram!(
        metric::PUBLISH_LATENCY,
        metrics::Unit::Seconds,
        "Publish to durable ack"
    );
    metrics::describe_gauge!(metric::PENDING, "Pending outbox rows");
    metrics::describe_gauge!(
        metric::OLDEST_PENDING_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest pending row"
    );
    metrics::describe_gauge!(metric::DEAD_LETTERS, "Dead letters");
    metrics::describe_gauge!(metric::RETRYING, "Pending rows that failed at least once");
    Ok(())
}

pub(crate) async fn shutdown_on_signal(token: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGTERM handler");
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: finishing the current batch, then stopping"),
        _ = tokio::signal::ctrl_c() => info!("Ctrl-C: finishing the current batch, then stopping"),
    }
    token.cancel();
}
