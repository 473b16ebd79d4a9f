//! `cdc-memory`: the CDC relay's resident memory with one very large transaction, against the
//! same rows committed in ordinary transactions, in the same run.
//!
//! Per shape, on a fresh schema, publication, slot and NATS stream: the slot first (a slot
//! starts at the end of the log), then the rows, written with plain SQL (`INSERT … SELECT
//! generate_series`, the plain-SQL producers' contract) with no relay running: as **one
//! transaction** of `--events` rows, or (the baseline) in transactions of `--baseline-tx-rows`.
//! Then the `outbox relay` process (CDC mode, delete mode, the relay's defaults) is spawned
//! and drains them to NATS while the bench samples its `VmRSS` every 100 ms; the run of a
//! shape ends when no row is pending (published rows are deleted).
//!
//! Reported per shape: the relay's peak RSS, the drain's time and rate, and CPU-ms per 1,000
//! events of the relay process, PostgreSQL and nats-server (from `/proc`). The verdict is the
//! peak RSS of the large transaction against the documented bound, and its ratio to the
//! baseline's.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_postgres::cdc;
use sqlx::AssertSqlSafe;

use crate::brokers::FreshNats;
use crate::common::{
    Env, connect_pool, cpu_snapshot, loadavg, pending, print_table, proc_cpu_secs,
};
use crate::relay_process::{RelayCommand, check_bin, rss_mb, stop};

/// Options of `cdc-memory`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rows of the large transaction (and of the baseline).
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Aggregates the rows are spread over.
    #[arg(long, default_value_t = 10_000)]
    aggregates: u64,
    /// Payload bytes per row.
    #[arg(long, default_value_t = 1024)]
    payload_bytes: usize,
    /// Rows per transaction of the baseline.
    #[arg(long, default_value_t = 1_000)]
    baseline_tx_rows: u64,
    /// The relay's `relay.cdc_max_rows_in_memory`.
    #[arg(long, default_value_t = 10_000)]
    max_rows_in_memory: usize,
    /// The documented bound of the relay's RSS, MB: the verdict.
    #[arg(long, default_value_t = 256.0)]
    bound_mb: f64,
    /// The `outbox` binary (`cargo build --release -p outbox-cli`).
    #[arg(long, default_value = "target/release/outbox")]
    outbox_bin: PathBuf,
}

/// What one shape measured.
struct Shape {
    label: String,
    peak_rss_mb: f64,
    drain: Duration,
    published: u64,
    relay_cpu: f64,
    pg_cpu: f64,
    nats_cpu: f64,
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    check_bin(&args.outbox_bin)?;
    if args.aggregates == 0 || args.baseline_tx_rows == 0 {
        bail!("--aggregates and --baseline-tx-rows must be at least 1");
    }
    let pool = connect_pool(env, 4).await?;
    println!(
        "cdc-memory: {} rows x {} B over {} aggregates; baseline in transactions of {} rows; \
         relay.cdc_max_rows_in_memory = {}; load avg before {}\n",
        args.events,
        args.payload_bytes,
        args.aggregates,
        args.baseline_tx_rows,
        args.max_rows_in_memory,
        loadavg()
    );
    let mut shapes = Vec::new();
    for tx_rows in [args.baseline_tx_rows, args.events] {
        let shape = FreshNats::run(env, &pool, async |fresh| {
            let result = measure(fresh, &args, tx_rows).await;
            let name = fresh.bench.name();
            let removed = cdc::remove(&pool, name, name, Duration::from_secs(10)).await;
            let shape = result?;
            removed.context("removing the bench's slot")?;
            Ok(shape)
        })
        .await?;
        shapes.push(shape);
    }
    report(&shapes, &args);
    Ok(())
}

async fn measure(fresh: &FreshNats<'_>, args: &Args, tx_rows: u64) -> Result<Shape> {
    let (env, pool, bench, nats) = (fresh.env, fresh.pool, &fresh.bench, &fresh.nats);
    let s = bench.name();
    cdc::ensure_publication(pool, &bench.schema, s).await?;
    cdc::create_slot(pool, s).await?;
    let label = if tx_rows >= args.events {
        format!("one transaction of {} rows", args.events)
    } else {
        format!("transactions of {tx_rows} rows (baseline)")
    };
    let config = std::env::temp_dir().join(format!("outbox-bench-cdc-memory-{s}.toml"));
    std::fs::write(
        &config,
        format!(
            "[relay]\nmode = \"cdc\"\ncdc_max_rows_in_memory = {}\n\n{}",
            args.max_rows_in_memory,
            nats.relay_toml()
        ),
    )?;
    let mut relay = RelayCommand {
        bin: &args.outbox_bin,
        config: &config,
        database_url: &env.database_url,
        broker_url: &env.nats_url,
        schema: s,
        log: "warn",
    }
    .spawn()?;
    let pid = relay.id();
    // Streaming (its catch-up of an empty table is done a moment later) before the writes.
    let spawned = Instant::now();
    loop {
        let active: bool = sqlx::query_scalar(
            "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots \
             WHERE slot_name = $1",
        )
        .bind(s)
        .fetch_one(pool)
        .await?;
        if active {
            break;
        }
        if spawned.elapsed() > Duration::from_secs(30) {
            bail!("the relay did not stream the slot within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    let cpu_before = cpu_snapshot();
    let relay_cpu_before = pid.and_then(proc_cpu_secs).unwrap_or(0.0);
    let mut peak = rss_mb(pid).unwrap_or(0.0);
    let started = Instant::now();
    let pad = "x".repeat(args.payload_bytes.saturating_sub(10));
    let mut at = 0;
    while at < args.events {
        let end = (at + tx_rows).min(args.events);
        // One statement, one transaction.
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, aggregate_version, \
             event_type, payload) \
             SELECT gen_random_uuid(), 'payment', 'agg-' || lpad((g % $3)::text, 7, '0'), \
               g / $3 + 1, 'PaymentCreated', convert_to('{{\"pad\":\"' || $4 || '\"}}', 'UTF8') \
             FROM generate_series($1::int8, $2::int8 - 1) g"
        )))
        .bind(at as i64)
        .bind(end as i64)
        .bind(args.aggregates as i64)
        .bind(&pad)
        .execute(pool)
        .await
        .context("writing the rows")?;
        at = end;
        peak = peak.max(rss_mb(pid).unwrap_or(0.0));
    }
    println!(
        "{label}: written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut relay_cpu = relay_cpu_before;
    let mut next_count = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(status) = relay.try_wait()? {
            bail!("the relay ended during the drain: {status}");
        }
        peak = peak.max(rss_mb(pid).unwrap_or(0.0));
        relay_cpu = pid.and_then(proc_cpu_secs).unwrap_or(relay_cpu);
        if Instant::now() >= next_count {
            next_count = Instant::now() + Duration::from_secs(1);
            if nats.last_sequence().await? >= args.events && pending(pool, s).await? == 0 {
                break;
            }
        }
        if Instant::now() > deadline {
            bail!("{label}: not drained within 30 min");
        }
    }
    let drain = started.elapsed();
    let cpu = cpu_snapshot().since(&cpu_before);
    let published = nats.last_sequence().await?;
    stop(&mut relay, "TERM").await?;
    let _ = std::fs::remove_file(&config);
    println!(
        "{label}: written and published in {:.1} s, peak RSS {peak:.0} MB",
        drain.as_secs_f64()
    );
    Ok(Shape {
        label,
        peak_rss_mb: peak,
        drain,
        published,
        relay_cpu: relay_cpu - relay_cpu_before,
        pg_cpu: cpu.pg,
        nats_cpu: cpu.nats,
    })
}

fn report(shapes: &[Shape], args: &Args) {
    println!("\n### cdc-memory summary\n");
    let per_k = |secs: f64| format!("{:.1}", secs * 1000.0 / (args.events as f64 / 1000.0));
    let rows: Vec<Vec<String>> = shapes
        .iter()
        .map(|s| {
            vec![
                s.label.clone(),
                format!("{:.0}", s.peak_rss_mb),
                format!("{:.1}", s.drain.as_secs_f64()),
                format!("{:.0}", args.events as f64 / s.drain.as_secs_f64()),
                s.published.to_string(),
                per_k(s.relay_cpu),
                per_k(s.pg_cpu),
                per_k(s.nats_cpu),
            ]
        })
        .collect();
    print_table(
        &[
            "shape",
            "relay peak RSS MB",
            "write + publish s",
            "events/s",
            "messages published",
            "relay CPU-ms/1k",
            "PostgreSQL CPU-ms/1k",
            "nats-server CPU-ms/1k",
        ],
        &rows,
    );
    if let [baseline, big] = shapes {
        let ratio = big.peak_rss_mb / baseline.peak_rss_mb.max(1.0);
        let verdict = if big.peak_rss_mb <= args.bound_mb {
            "within the bound"
        } else {
            "OVER THE BOUND"
        };
        println!(
            "\nlarge transaction: peak RSS {:.0} MB, {ratio:.2}x the baseline's; bound {:.0} MB: \
             {verdict}",
            big.peak_rss_mb, args.bound_mb
        );
    }
}
