//! W6: a backlog of millions of pending events (10 million by default), drained by the
//! `outbox relay` process, in delete mode and in mark mode.
//!
//! What it measures, per mode, on NATS:
//!
//! * **claim latency** at each checkpoint of the backlog (10M, 5M, 1M pending, then 1,000 fresh
//!   rows after the drain, shaped as the backlog, before and after a `VACUUM`): the relay is
//!   stopped, and the bench
//!   runs `--claims` claims of one relay batch (1,000 rows, the relay's defaults) through
//!   [`PgStore`], each released untouched, so every claim reads the same backlog;
//! * the relay's **resident memory** (`VmRSS` of the process, sampled every 250 ms) while it
//!   drains;
//! * the **first publish after a restart**: the time from spawning the relay in the middle of
//!   the backlog to the stream's first new message. The first stop is a `SIGKILL` (a crash:
//!   the dead relay's leases stay until they expire), the later ones a `SIGTERM`;
//! * the **drain rate** of the first segment (from its first publish to the first checkpoint,
//!   no restart in it) against the raw client's ceiling measured in the same run, before and
//!   after the drains (W2's baseline: raw async-nats, `--window` acks outstanding, no ordering
//!   constraint), and the overall rate, restarts and the crashed relay's lease expiry included;
//! * **table and index sizes** after the drain, and after a plain `VACUUM`;
//! * in mark mode, after the drain: the retention job deleting every published row
//!   ([`Maintainer`] with `published_keep` zero), its rate, and the sizes after it;
//! * with `--cycles N` (N > 1), whether the space is reused ("no unbounded bloat"): the same
//!   backlog written again N - 1 times on top of what the previous cycle left, each drained by
//!   one relay start (and, in mark mode, retained again), with the sizes after the write, the
//!   drain and a plain `VACUUM`. A file that grows by the backlog's size every cycle is bloat;
//!   one that stops growing reuses the space the earlier drains freed.
//!
//! With `OUTBOX_BENCH_EXPLAIN_MS=N` the claims the bench times run on connections with
//! PostgreSQL's `auto_explain` loaded (a superuser's connection): every claim statement slower
//! than N ms writes its plan, with `ANALYZE` and `BUFFERS`, into the server's log, which says
//! where a slow claim's time goes.
//!
//! The backlog is written with plain SQL (`INSERT … SELECT generate_series`, the SQL contract
//! of plain-SQL producers) in chunks, then analysed and checkpointed. Published messages are
//! purged from the stream as the drain goes (the count uses the stream's last sequence).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::Utc;
use outbox_core::maintenance::{Maintainer, MaintenanceConfig};
use outbox_core::relay::RelayConfig;
use outbox_core::{OutboxMessage, Payload};
use outbox_postgres::{OnPublish, PgStore, PgStoreConfig};
use sqlx::{AssertSqlSafe, PgPool};

use crate::brokers::{FreshNats, NatsBench, baseline};
use crate::common::{
    BenchSchema, Env, analyze_and_checkpoint, connect_pool, loadavg, pending, percentile,
    print_table, synthetic_message,
};
use crate::relay_process::{RelayCommand, check_bin, rss_mb, stop};

/// Options of `w6`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Pending events in the backlog.
    #[arg(long, default_value_t = 10_000_000)]
    pub(crate) events: u64,
    /// Aggregates the backlog is spread over (events / aggregates versions each).
    #[arg(long, default_value_t = 1_000_000)]
    pub(crate) aggregates: u64,
    /// Payload bytes per event (a JSON object).
    #[arg(long, default_value_t = 64)]
    pub(crate) payload_bytes: usize,
    /// Backlog sizes (pending events) at which the relay is stopped and the claim measured,
    /// besides the full backlog at the start and 1,000 fresh rows after the drain.
    #[arg(long, value_delimiter = ',', default_values_t = [5_000_000u64, 1_000_000])]
    pub(crate) checkpoints: Vec<u64>,
    /// What happens to published rows: delete, mark, or both in turn.
    #[arg(long, value_delimiter = ',', default_values = ["delete", "mark"])]
    pub(crate) modes: Vec<String>,
    /// Claims per latency measurement.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) claims: u64,
    /// The `outbox` binary (`cargo build --release -p outbox-cli`).
    #[arg(long, default_value = "target/release/outbox")]
    pub(crate) outbox_bin: PathBuf,
    /// Messages of the raw client's ceiling, measured in the same run.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) baseline_messages: usize,
    /// Acks outstanding in the raw client's ceiling.
    #[arg(long, default_value_t = 1024)]
    pub(crate) window: usize,
    /// Rows per statement of the mark-mode retention.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) retention_batch: i64,
    /// Give up a drain segment after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub(crate) timeout_secs: u64,
    /// Backlogs written and drained one after the other on the same table: after the first
    /// (measured in full), each later one is written, drained, vacuumed and its sizes taken
    /// (whether the earlier drains' space is reused).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub(crate) cycles: u32,
}

/// One claim-latency measurement.
struct ClaimLatency {
    label: String,
    pending: i64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

/// Table and index sizes, MB.
struct Sizes {
    label: String,
    table_mb: f64,
    indexes_mb: f64,
}

/// Everything one mode measured.
struct ModeReport {
    mode: OnPublish,
    load: Duration,
    claims: Vec<ClaimLatency>,
    max_rss_mb: f64,
    restarts: Vec<(String, Duration)>,
    drained: u64,
    running: Duration,
    /// The first segment (first start to the first checkpoint): events published from the
    /// first publish on, and the time they took. No crash or restart in it.
    steady: (u64, Duration),
    sizes: Vec<Sizes>,
    retention: Option<(u64, Duration)>,
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    if args.aggregates == 0 || args.aggregates > 9_999_999 {
        bail!("--aggregates must be 1 to 9,999,999 (aggregate ids have seven digits)");
    }
    check_bin(&args.outbox_bin)?;
    let modes = args
        .modes
        .iter()
        .map(|m| match m.as_str() {
            "delete" => Ok(OnPublish::Delete),
            "mark" => Ok(OnPublish::Mark),
            other => bail!("unknown mode `{other}`: use delete or mark"),
        })
        .collect::<Result<Vec<_>>>()?;
    let pool = connect_pool(env, 4).await?;
    println!(
        "W6: {} pending events x {} B payload over {} aggregates, modes {:?}, {} claims per \
         measurement, load avg before {}\n",
        args.events,
        args.payload_bytes,
        args.aggregates,
        args.modes,
        args.claims,
        loadavg()
    );
    let ceiling = raw_ceiling(env, &args).await?;
    println!(
        "raw async-nats ceiling: {ceiling:.0} ev/s ({} messages, {} acks outstanding)\n",
        args.baseline_messages, args.window
    );
    let mut reports = Vec::new();
    for mode in modes {
        let report = FreshNats::run(env, &pool, async |fresh| {
            measure_mode(fresh, &args, mode).await
        })
        .await?;
        reports.push(report);
    }
    let ceiling_after = raw_ceiling(env, &args).await?;
    println!(
        "raw async-nats ceiling again after the drains: {ceiling_after:.0} ev/s; the ratio below \
         uses the mean of both\n"
    );
    report(&reports, (ceiling + ceiling_after) / 2.0, &args);
    Ok(())
}

/// W2's baseline: the raw client publishing `baseline_messages` synthetic events.
async fn raw_ceiling(env: &Env, args: &Args) -> Result<f64> {
    let nats = NatsBench::setup(env).await?;
    let now = Utc::now();
    let msgs: Vec<OutboxMessage> = (0..args.baseline_messages)
        .map(|i| {
            let payload = Payload::bytes("application/json", payload(args.payload_bytes));
            synthetic_message(
                i as i64 + 1,
                format!("agg-{:07}", i as u64 % args.aggregates),
                (i as u64 / args.aggregates + 1) as i64,
                payload,
                now,
            )
        })
        .collect();
    let elapsed = baseline(&nats, &msgs, args.window, false).await;
    nats.teardown().await?;
    Ok(args.baseline_messages as f64 / elapsed?.as_secs_f64())
}

fn payload(len: usize) -> Vec<u8> {
    let pad = len.saturating_sub(10);
    format!("{{\"pad\":\"{}\"}}", "x".repeat(pad)).into_bytes()
}

/// What one mode's drain works with.
struct ModeRun<'a> {
    env: &'a Env,
    pool: &'a PgPool,
    bench: &'a BenchSchema,
    nats: &'a NatsBench,
    args: &'a Args,
    /// The store of the timed claims.
    store: PgStore,
    /// The relay's configuration file.
    config: PathBuf,
}

async fn measure_mode(fresh: &FreshNats<'_>, args: &Args, mode: OnPublish) -> Result<ModeReport> {
    let (env, pool, bench, nats) = (fresh.env, fresh.pool, &fresh.bench, &fresh.nats);
    let s = bench.name();
    println!("## mode {mode:?} (schema {s})\n");
    if mode == OnPublish::Mark {
        outbox_postgres::migrate_mark_mode(pool, &bench.schema).await?;
    }
    let store = PgStore::new(
        claim_pool(env, pool).await?,
        PgStoreConfig {
            schema: bench.schema.clone(),
            on_publish: mode,
        },
    );
    let load = load_backlog(pool, s, args).await?;
    println!(
        "loaded {} events in {:.1} s",
        args.events,
        load.as_secs_f64()
    );
    let mut report = ModeReport {
        mode,
        load,
        claims: Vec::new(),
        max_rss_mb: 0.0,
        restarts: Vec::new(),
        drained: 0,
        running: Duration::ZERO,
        steady: (0, Duration::ZERO),
        sizes: Vec::new(),
        retention: None,
    };
    report
        .claims
        .push(claim_latency(pool, &store, s, args, "full backlog").await?);

    let run = ModeRun {
        env,
        pool,
        bench,
        nats,
        args,
        store,
        config: relay_config_file(bench, nats, mode)?,
    };
    let result = drain_and_measure(&run, &mut report).await;
    let _ = std::fs::remove_file(&run.config);
    result?;
    Ok(report)
}

/// The pool the timed claims run on: `pool`, or with `OUTBOX_BENCH_EXPLAIN_MS` set, a pool of
/// its own whose connections load `auto_explain` and log the plan of every statement slower
/// than that many milliseconds (with `ANALYZE` and `BUFFERS`) into the server's log.
async fn claim_pool(env: &Env, pool: &PgPool) -> Result<PgPool> {
    let Ok(ms) = std::env::var("OUTBOX_BENCH_EXPLAIN_MS") else {
        return Ok(pool.clone());
    };
    let ms: u32 = ms
        .parse()
        .context("OUTBOX_BENCH_EXPLAIN_MS: a number of milliseconds")?;
    println!("auto_explain: plans of claims slower than {ms} ms go to the server's log");
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                for statement in [
                    "LOAD 'auto_explain'".to_owned(),
                    format!("SET auto_explain.log_min_duration = {ms}"),
                    "SET auto_explain.log_analyze = on".to_owned(),
                    "SET auto_explain.log_buffers = on".to_owned(),
                ] {
                    sqlx::query(AssertSqlSafe(statement))
                        .execute(&mut *conn)
                        .await?;
                }
                Ok(())
            })
        })
        .connect(&env.database_url)
        .await
        .context("connecting the claims' pool with auto_explain")
}

/// The drain in segments (claim latency at each checkpoint), then the near-empty claims, the
/// sizes and, in mark mode, the retention.
async fn drain_and_measure(run: &ModeRun<'_>, report: &mut ModeReport) -> Result<()> {
    let (pool, bench, nats, args, store) = (run.pool, run.bench, run.nats, run.args, &run.store);
    let s = bench.name();
    let mode = report.mode;
    // Descending, each once, inside the backlog; then the end of the drain.
    let mut stops: Vec<u64> = args.checkpoints.clone();
    stops.retain(|c| *c > 0 && *c < args.events);
    stops.sort_unstable_by(|a, b| b.cmp(a));
    stops.dedup();
    stops.push(0);
    for (i, stop_at) in stops.iter().enumerate() {
        let target = args.events - stop_at;
        let started = Instant::now();
        let before = nats.last_sequence().await?;
        let mut relay = spawn_relay(run)?;
        // The first publish of this start.
        loop {
            if nats.last_sequence().await? > before {
                break;
            }
            if let Some(status) = relay.try_wait()? {
                bail!("the relay ended before publishing: {status}");
            }
            if started.elapsed() > Duration::from_secs(60) {
                bail!("no publish within 60 s of the relay's start");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let first = started.elapsed();
        let label = if i == 0 {
            "first start".to_owned()
        } else if i == 1 {
            "after a SIGKILL".to_owned()
        } else {
            "after a SIGTERM".to_owned()
        };
        println!("{label}: first publish {:.0} ms after spawning", ms(first));
        report.restarts.push((label, first));
        // Drain to the next checkpoint, sampling the relay's memory.
        drain_to(run, &mut relay, target, started, &mut report.max_rss_mb).await?;
        if *stop_at == 0 {
            // Everything published: wait for the last settle before stopping the relay.
            settled(pool, s).await?;
        }
        report.running += started.elapsed();
        if i == 0 {
            let published = nats.last_sequence().await? - before;
            report.steady = (published, started.elapsed() - first);
        }
        // The first stop is a crash, the others a graceful shutdown.
        stop(&mut relay, if i == 0 { "KILL" } else { "TERM" }).await?;
        if *stop_at > 0 {
            let label = format!("{stop_at} pending");
            report
                .claims
                .push(claim_latency(pool, store, s, args, &label).await?);
        }
    }
    report.drained = nats.last_sequence().await?;
    report.sizes.push(sizes(pool, s, "after the drain").await?);

    // Near empty: 1,000 fresh rows on top of what the drain left (dead tuples, or published
    // rows in mark mode), then the same after a VACUUM.
    // Shaped as the backlog (its versions per aggregate, following the drained ones), so that
    // the claims compare: a claim's cost grows with the aggregates it leases.
    // Versions above every drained one (mark mode keeps those until the retention).
    let drained_versions = args.events.div_ceil(args.aggregates.max(1));
    let shape = drained_versions.clamp(1, 1000);
    insert_rows(pool, s, args, (0, 1000), 1000 / shape, drained_versions).await?;
    report
        .claims
        .push(claim_latency(pool, store, s, args, "1,000 fresh rows, before VACUUM").await?);
    vacuum(pool, s).await?;
    report.sizes.push(sizes(pool, s, "after VACUUM").await?);
    report
        .claims
        .push(claim_latency(pool, store, s, args, "1,000 fresh rows, after VACUUM").await?);

    if mode == OnPublish::Mark {
        let started = Instant::now();
        let r = retain_all(store, args).await?;
        let took = started.elapsed();
        println!(
            "retention: {} published rows deleted in {:.1} s",
            r.published,
            took.as_secs_f64()
        );
        report.retention = Some((r.published, took));
        vacuum(pool, s).await?;
        report
            .sizes
            .push(sizes(pool, s, "after the retention and VACUUM").await?);
        report
            .claims
            .push(claim_latency(pool, store, s, args, "1,000 rows, after the retention").await?);
    }
    for cycle in 2..=args.cycles {
        next_backlog(run, report, cycle).await?;
    }
    Ok(())
}

/// Backlog number `cycle` on top of what the earlier ones left, drained by one relay start
/// (and retained again in mark mode), with the sizes after the write, the drain and a
/// `VACUUM`.
async fn next_backlog(run: &ModeRun<'_>, report: &mut ModeReport, cycle: u32) -> Result<()> {
    let (pool, bench, nats, args, store) = (run.pool, run.bench, run.nats, run.args, &run.store);
    let s = bench.name();
    // Versions above every earlier backlog's and the fresh rows' (at most `shape` each).
    let drained_versions = args.events.div_ceil(args.aggregates.max(1));
    let base = u64::from(cycle - 1) * (drained_versions + drained_versions.clamp(1, 1000));
    let started = Instant::now();
    insert_rows(pool, s, args, (0, args.events), args.aggregates, base).await?;
    sqlx::query(AssertSqlSafe(format!("ANALYZE {s}.events")))
        .execute(pool)
        .await?;
    println!(
        "backlog {cycle}: {} events written in {:.1} s",
        args.events,
        started.elapsed().as_secs_f64()
    );
    report
        .sizes
        .push(sizes(pool, s, &format!("backlog {cycle} written")).await?);
    let target = nats.last_sequence().await? + pending(pool, s).await? as u64;
    let started = Instant::now();
    let mut relay = spawn_relay(run)?;
    drain_to(run, &mut relay, target, started, &mut report.max_rss_mb).await?;
    settled(pool, s).await?;
    let took = started.elapsed();
    stop(&mut relay, "TERM").await?;
    println!(
        "backlog {cycle} drained in {:.1} s ({:.0} ev/s)",
        took.as_secs_f64(),
        args.events as f64 / took.as_secs_f64()
    );
    report
        .sizes
        .push(sizes(pool, s, &format!("backlog {cycle} drained")).await?);
    if report.mode == OnPublish::Mark {
        retain_all(store, args).await?;
    }
    vacuum(pool, s).await?;
    let label = if report.mode == OnPublish::Mark {
        format!("backlog {cycle} drained, retention, VACUUM")
    } else {
        format!("backlog {cycle} drained, VACUUM")
    };
    report.sizes.push(sizes(pool, s, &label).await?);
    Ok(())
}

/// Waits until the stream's last sequence reaches `target`, sampling the relay's memory into
/// `max_rss_mb` and purging the stream every million messages; fails when the relay ends or
/// `args.timeout_secs` pass from `started`.
async fn drain_to(
    run: &ModeRun<'_>,
    relay: &mut tokio::process::Child,
    target: u64,
    started: Instant,
    max_rss_mb: &mut f64,
) -> Result<()> {
    let (nats, args) = (run.nats, run.args);
    let mut last_rss = Instant::now() - Duration::from_secs(1);
    loop {
        let published = nats.last_sequence().await?;
        if published >= target {
            return Ok(());
        }
        if let Some(status) = relay.try_wait()? {
            bail!("the relay ended at {published} of {target} published: {status}");
        }
        if started.elapsed() > Duration::from_secs(args.timeout_secs) {
            bail!("drain timed out at {published} of {target}");
        }
        if last_rss.elapsed() >= Duration::from_millis(250) {
            last_rss = Instant::now();
            if let Some(rss) = rss_mb(relay.id()) {
                *max_rss_mb = max_rss_mb.max(rss);
            }
            if nats.count().await? > 1_000_000 {
                nats.purge().await?;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (60 s at most) until no row is pending: the relay settled what it published.
async fn settled(pool: &PgPool, s: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while pending(pool, s).await? > 0 {
        if Instant::now() > deadline {
            bail!("rows still pending 60 s after the last publish");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// The mark-mode retention of every published row, by the maintainer (one elected round).
async fn retain_all(store: &PgStore, args: &Args) -> Result<outbox_core::maintenance::RoundReport> {
    let maintainer = Maintainer::new(
        store.clone(),
        MaintenanceConfig {
            published_keep: Some(Duration::ZERO),
            batch_size: args.retention_batch,
            ..MaintenanceConfig::default()
        },
    )?;
    maintainer
        .round_once()
        .await?
        .context("another maintainer holds the bench schema's election")
}

/// Writes rows `from..to` with plain SQL, in chunks of 500,000: row `g` is version
/// `g / aggregates + 1 + version_base` of aggregate `g % aggregates`.
async fn insert_rows(
    pool: &PgPool,
    s: &str,
    args: &Args,
    (from, to): (u64, u64),
    aggregates: u64,
    version_base: u64,
) -> Result<()> {
    let pad = "x".repeat(args.payload_bytes.saturating_sub(10));
    let mut at = from;
    while at < to {
        let end = (at + 500_000).min(to);
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, aggregate_version, \
             event_type, payload) \
             SELECT gen_random_uuid(), 'payment', 'agg-' || lpad((g % $3)::text, 7, '0'), \
               g / $3 + 1 + $5, 'PaymentCreated', convert_to('{{\"pad\":\"' || $4 || '\"}}', 'UTF8') \
             FROM generate_series($1::int8, $2::int8 - 1) g"
        )))
        .bind(at as i64)
        .bind(end as i64)
        .bind(aggregates.max(1) as i64)
        .bind(&pad)
        .bind(version_base as i64)
        .execute(pool)
        .await
        .context("writing the backlog")?;
        at = end;
    }
    Ok(())
}

async fn load_backlog(pool: &PgPool, s: &str, args: &Args) -> Result<Duration> {
    let started = Instant::now();
    insert_rows(pool, s, args, (0, args.events), args.aggregates, 0).await?;
    let took = started.elapsed();
    analyze_and_checkpoint(pool, s).await?;
    Ok(took)
}

async fn vacuum(pool: &PgPool, s: &str) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!("VACUUM (ANALYZE) {s}.events")))
        .execute(pool)
        .await?;
    Ok(())
}

async fn sizes(pool: &PgPool, s: &str, label: &str) -> Result<Sizes> {
    let (table, indexes): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT pg_table_size('{s}.events'), pg_indexes_size('{s}.events')"
    )))
    .fetch_one(pool)
    .await?;
    let mb = |b: i64| b as f64 / 1_048_576.0;
    println!(
        "{label}: table {:.0} MB, indexes {:.0} MB",
        mb(table),
        mb(indexes)
    );
    Ok(Sizes {
        label: label.to_owned(),
        table_mb: mb(table),
        indexes_mb: mb(indexes),
    })
}

/// `args.claims` claims of one relay batch, each released untouched: the claim's latency on
/// the backlog as it is.
async fn claim_latency(
    pool: &PgPool,
    store: &PgStore,
    s: &str,
    args: &Args,
    label: &str,
) -> Result<ClaimLatency> {
    let pending = pending(pool, s).await?;
    let samples = crate::paused::claims(store, args.claims)
        .await
        .map_err(|e| e.context(format!("{label} ({pending} pending)")))?;
    let c = ClaimLatency {
        label: label.to_owned(),
        pending,
        p50_ms: percentile(&samples, 0.5),
        p99_ms: percentile(&samples, 0.99),
        max_ms: *samples.last().expect("claims >= 1"),
    };
    println!(
        "claim at {label} ({pending} pending): p50 {:.1} ms, p99 {:.1} ms",
        c.p50_ms, c.p99_ms
    );
    Ok(c)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The relay's configuration file: the bench's stream, the mode, the relay's defaults.
fn relay_config_file(bench: &BenchSchema, nats: &NatsBench, mode: OnPublish) -> Result<PathBuf> {
    let mode = match mode {
        OnPublish::Delete => "delete",
        OnPublish::Mark => "mark",
    };
    let path = std::env::temp_dir().join(format!("outbox-bench-w6-{}.toml", bench.name()));
    std::fs::write(
        &path,
        format!("[relay]\non_publish = \"{mode}\"\n\n{}", nats.relay_toml()),
    )?;
    Ok(path)
}

/// The relay process on the mode's schema and stream.
fn spawn_relay(run: &ModeRun<'_>) -> Result<tokio::process::Child> {
    RelayCommand {
        bin: &run.args.outbox_bin,
        config: &run.config,
        database_url: &run.env.database_url,
        broker_url: &run.env.nats_url,
        schema: run.bench.name(),
        log: "warn",
    }
    .spawn()
}

fn report(reports: &[ModeReport], ceiling: f64, args: &Args) {
    println!("\n### W6 summary\n");
    let mut rows = Vec::new();
    for r in reports {
        let steady = r.steady.0 as f64 / r.steady.1.as_secs_f64();
        let overall = r.drained as f64 / r.running.as_secs_f64();
        rows.push(vec![
            format!("{:?}", r.mode),
            format!("{:.0} s", r.load.as_secs_f64()),
            format!("{steady:.0} ev/s"),
            format!("{:.3}", steady / ceiling),
            format!("{overall:.0} ev/s"),
            format!("{:.1} MB", r.max_rss_mb),
            r.restarts
                .iter()
                .map(|(l, d)| format!("{l} {:.0} ms", ms(*d)))
                .collect::<Vec<_>>()
                .join("; "),
            r.retention.map_or("-".to_owned(), |(n, d)| {
                format!(
                    "{n} rows in {:.1} s ({:.0}/s)",
                    d.as_secs_f64(),
                    n as f64 / d.as_secs_f64()
                )
            }),
        ]);
    }
    print_table(
        &[
            "mode",
            "load",
            "drain rate, first segment",
            "vs raw ceiling",
            "overall (restarts, lease expiry included)",
            "relay max RSS",
            "first publish after start",
            "retention",
        ],
        &rows,
    );
    let mut rows = Vec::new();
    for r in reports {
        let first = r.claims.first().map_or(f64::NAN, |c| c.p50_ms);
        for c in &r.claims {
            rows.push(vec![
                format!("{:?}", r.mode),
                c.label.clone(),
                c.pending.to_string(),
                format!("{:.1}", c.p50_ms),
                format!("{:.1}", c.p99_ms),
                format!("{:.1}", c.max_ms),
                format!("{:.2}", c.p50_ms / first),
            ]);
        }
    }
    println!(
        "claim latency, {} claims of {} rows each (goal: flat within 2x):\n",
        args.claims,
        RelayConfig::default().batch_size
    );
    print_table(
        &[
            "mode",
            "backlog",
            "pending",
            "p50 ms",
            "p99 ms",
            "max ms",
            "p50 / full backlog's",
        ],
        &rows,
    );
    let mut rows = Vec::new();
    for r in reports {
        for s in &r.sizes {
            rows.push(vec![
                format!("{:?}", r.mode),
                s.label.clone(),
                format!("{:.0}", s.table_mb),
                format!("{:.0}", s.indexes_mb),
            ]);
        }
    }
    print_table(&["mode", "when", "table MB", "indexes MB"], &rows);
}
