//! W2: relay drain rate of a backlog vs. the raw confirmed-publish rate of the same client.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chrono::Utc;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::{NewMessage, OutboxMessage, Payload, Transport};
use outbox_postgres::{PgOutbox, PgStore};
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;

use crate::brokers::AnyBench;
use crate::common::{
    BenchSchema, CpuSnap, Env, TransportChoice, analyze_and_checkpoint, connect_pool, cpu_snapshot,
    json_payload, loadavg, mean, print_phases_cpu, print_table, shares, synthetic_message, verdict,
};
use crate::timing::{Breakdown, TimedStore, TimedTransport, breakdown};

/// Options of `w2`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Broker(s) to measure.
    #[arg(long, value_enum, default_value_t = TransportChoice::All)]
    pub(crate) transport: TransportChoice,
    /// Messages per measured phase.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) messages: usize,
    /// Aggregates the backlog is spread over (messages / aggregates versions each).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) aggregates: usize,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 1024)]
    pub(crate) payload_bytes: usize,
    /// Interleaved rounds (baseline, then the relay for every `--workers` value).
    #[arg(long, default_value_t = 2)]
    pub(crate) rounds: usize,
    /// Relay worker counts to measure, comma separated (default: RelayConfig's default).
    #[arg(long, value_delimiter = ',')]
    pub(crate) workers: Vec<usize>,
    /// Override RelayConfig::batch_size.
    #[arg(long)]
    pub(crate) batch_size: Option<usize>,
    /// Override RelayConfig::max_in_flight (also the baseline's window).
    #[arg(long)]
    pub(crate) max_in_flight: Option<usize>,
    /// Override RelayConfig::max_per_aggregate.
    #[arg(long)]
    pub(crate) max_per_aggregate: Option<usize>,
    /// Baseline: run each publish on its own tokio task (as the transports do) instead of
    /// polling all of them from one task.
    #[arg(long)]
    pub(crate) baseline_tasks: bool,
    /// Give up a drain after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub(crate) timeout_secs: u64,
    /// Acks outstanding in the broker's ceiling: the raw client at its best window, measured
    /// in every round beside the baseline at the relay's window (0: no ceiling phase).
    #[arg(long, default_value_t = 1024)]
    pub(crate) ceiling_window: usize,
}

pub(crate) fn relay_config(args: &Args, workers: usize) -> RelayConfig {
    let d = RelayConfig::default();
    RelayConfig {
        workers,
        batch_size: args.batch_size.unwrap_or(d.batch_size),
        max_in_flight: args.max_in_flight.unwrap_or(d.max_in_flight),
        max_per_aggregate: args.max_per_aggregate.unwrap_or(d.max_per_aggregate),
        ..d
    }
}

fn body(args: &Args, agg: usize, version: usize) -> Vec<u8> {
    json_payload(
        &serde_json::json!({
            "payment_id": format!("agg-{agg:06}"),
            "amount": 100 + agg % 900,
            "currency": "EUR",
            "version": version,
        }),
        args.payload_bytes,
    )
}

/// Message `i` of a phase: aggregate `i % aggregates`, version `i / aggregates + 1`, so the
/// rows are interleaved across aggregates in insertion (id) order, as in a live system.
fn shape(args: &Args, i: usize) -> (usize, usize) {
    (i % args.aggregates, i / args.aggregates + 1)
}

/// The baseline's messages: what the relay would have claimed (fresh event ids).
pub(crate) fn synthetic(args: &Args) -> Vec<OutboxMessage> {
    let now = Utc::now();
    (0..args.messages)
        .map(|i| {
            let (agg, version) = shape(args, i);
            let payload = Payload::bytes("application/json", body(args, agg, version));
            synthetic_message(
                i as i64 + 1,
                format!("agg-{agg:06}"),
                version as i64,
                payload,
                now,
            )
        })
        .collect()
}

/// Writes the backlog (not timed by the comparison; its duration is reported for information).
pub(crate) async fn enqueue_backlog(
    pool: &PgPool,
    bench: &BenchSchema,
    args: &Args,
) -> Result<Duration> {
    enqueue_backlog_with(pool, bench, args, PgOutbox::new(bench.schema.clone())).await
}

/// [`enqueue_backlog`] through `outbox` (for instance one that deletes its rows in the
/// producer's transaction, for the CDC relay).
pub(crate) async fn enqueue_backlog_with(
    pool: &PgPool,
    bench: &BenchSchema,
    args: &Args,
    outbox: PgOutbox,
) -> Result<Duration> {
    let s = bench.name();
    sqlx::query(AssertSqlSafe(format!("TRUNCATE {s}.events")))
        .execute(pool)
        .await?;
    let started = Instant::now();
    let chunk = 2000;
    let mut i = 0;
    while i < args.messages {
        let end = (i + chunk).min(args.messages);
        let msgs: Vec<NewMessage> = (i..end)
            .map(|j| {
                let (agg, version) = shape(args, j);
                NewMessage::new(
                    "payment",
                    format!("agg-{agg:06}"),
                    version as i64,
                    "PaymentCreated",
                    Payload::bytes("application/json", body(args, agg, version)),
                )
            })
            .collect();
        let mut tx = pool.begin().await?;
        outbox.enqueue_batch(&mut *tx, &msgs).await?;
        tx.commit().await?;
        i = end;
    }
    let took = started.elapsed();
    analyze_and_checkpoint(pool, s).await?;
    Ok(took)
}

/// Runs a relay from start until `n` rows were marked; returns the time to the last mark.
///
/// Every drain uses a clone of the same `PgStore`, so they share one wake-up listener (a
/// `PgStore` starts its LISTEN task on first idle wait and keeps it for the process lifetime).
pub(crate) async fn drain<T: Transport>(
    pool: &PgPool,
    bench: &BenchSchema,
    pg_store: &PgStore,
    transport: Arc<T>,
    config: RelayConfig,
    n: usize,
    timeout: Duration,
) -> Result<(Duration, Breakdown)> {
    let store = Arc::new(TimedStore::new(pg_store.clone()));
    let timed = Arc::new(TimedTransport::new(transport));
    let relay = Arc::new(Relay::new(Arc::clone(&store), Arc::clone(&timed), config)?);
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(Arc::clone(&relay).run(shutdown.clone()));
    while store.stats.marked.load(Ordering::SeqCst) < n as u64 {
        if started.elapsed() > timeout {
            shutdown.cancel();
            let _ = task.await;
            bail!(
                "drain timed out after {timeout:?}: {} of {n} marked",
                store.stats.marked.load(Ordering::SeqCst)
            );
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let last = store.stats.last_mark.lock().unwrap().expect("marked");
    let elapsed = last - started;
    shutdown.cancel();
    task.await?;
    let left = bench.count(pool, "events").await?;
    if left != 0 {
        bail!("the outbox still holds {left} rows after the drain");
    }
    Ok((elapsed, breakdown(&store.stats, &timed.stats)))
}

struct Phase {
    transport: &'static str,
    round: usize,
    /// `None` for a raw client's phase, `Some(workers)` for a relay drain.
    workers: Option<usize>,
    /// A raw client's phase at the ceiling window (else at the relay's window).
    ceiling: bool,
    rate: f64,
    elapsed: Duration,
    count: u64,
    enqueue: Option<Duration>,
    breakdown: Option<Breakdown>,
    cpu: CpuSnap,
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    let pool = connect_pool(env, 16).await?;
    BenchSchema::scope(&pool, async |bench| measure(env, &pool, bench, &args).await).await
}

async fn measure(env: &Env, pool: &PgPool, bench: &BenchSchema, args: &Args) -> Result<()> {
    let workers = if args.workers.is_empty() {
        vec![RelayConfig::default().workers]
    } else {
        args.workers.clone()
    };
    let window = relay_config(args, 1).max_in_flight;
    println!(
        "W2: {} x {} B messages over {} aggregates, {} rounds, relay workers {:?}, window {window}, \
         schema {}, load avg before {}\n",
        args.messages,
        args.payload_bytes,
        args.aggregates,
        args.rounds,
        workers,
        bench.name(),
        loadavg()
    );
    let mut phases = Vec::new();
    for t in args.transport.list() {
        let broker = AnyBench::setup(env, t).await?;
        let r = measure_broker(
            &broker,
            t.label(),
            pool,
            bench,
            args,
            &workers,
            window,
            &mut phases,
        )
        .await;
        let down = broker.teardown().await;
        r?;
        down.context("broker teardown")?;
    }
    report(args, &workers, &phases);
    println!("Load avg after: {}\n", loadavg());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn measure_broker(
    broker: &AnyBench,
    label: &'static str,
    pool: &PgPool,
    bench: &BenchSchema,
    args: &Args,
    workers: &[usize],
    window: usize,
    phases: &mut Vec<Phase>,
) -> Result<()> {
    let n = args.messages;
    let timeout = Duration::from_secs(args.timeout_secs);
    let store = PgStore::with_schema(pool.clone(), bench.schema.clone());
    for round in 1..=args.rounds {
        let mut raw = vec![(window, false)];
        if args.ceiling_window > 0 {
            raw.push((args.ceiling_window, true));
        }
        for (window, ceiling) in raw {
            let msgs = synthetic(args);
            let cpu0 = cpu_snapshot();
            let elapsed = broker.baseline(&msgs, window, args.baseline_tasks).await?;
            let cpu = cpu_snapshot().since(&cpu0);
            drop(msgs);
            let count = broker.count().await?;
            broker.purge().await?;
            let rate = n as f64 / elapsed.as_secs_f64();
            eprintln!(
                "  {label} round {round} raw client, window {window}: {rate:>8.0} ev/s ({:.2} s, broker holds {count}, load {})",
                elapsed.as_secs_f64(),
                loadavg()
            );
            phases.push(Phase {
                transport: label,
                round,
                workers: None,
                ceiling,
                rate,
                elapsed,
                count,
                enqueue: None,
                breakdown: None,
                cpu,
            });
        }
        for &w in workers {
            let enqueue = enqueue_backlog(pool, bench, args).await?;
            let cpu0 = cpu_snapshot();
            let (elapsed, bd) = drain(
                pool,
                bench,
                &store,
                Arc::clone(broker.transport()),
                relay_config(args, w),
                n,
                timeout,
            )
            .await?;
            let cpu = cpu_snapshot().since(&cpu0);
            let count = broker.count().await?;
            broker.purge().await?;
            let rate = n as f64 / elapsed.as_secs_f64();
            eprintln!(
                "  {label} round {round} relay w={w}: {rate:>8.0} ev/s ({:.2} s, broker holds {count}, backlog insert {:.1} s, load {})",
                elapsed.as_secs_f64(),
                enqueue.as_secs_f64(),
                loadavg()
            );
            phases.push(Phase {
                transport: label,
                round,
                workers: Some(w),
                ceiling: false,
                rate,
                elapsed,
                count,
                enqueue: Some(enqueue),
                breakdown: Some(bd),
                cpu,
            });
        }
    }
    Ok(())
}

fn report(args: &Args, workers: &[usize], phases: &[Phase]) {
    let n = args.messages as u64;
    println!(
        "### W2: drain of {} x {} B events ({} aggregates x {} versions)\n",
        args.messages,
        args.payload_bytes,
        args.aggregates,
        args.messages / args.aggregates.max(1)
    );
    let mut rows = Vec::new();
    for p in phases {
        let raw = |ceiling: bool| {
            phases
                .iter()
                .find(|b| {
                    b.transport == p.transport
                        && b.round == p.round
                        && b.workers.is_none()
                        && b.ceiling == ceiling
                })
                .map_or(f64::NAN, |b| b.rate)
        };
        // The ceiling is the raw client at its best window of the round: the ceiling run, or
        // the baseline's if that was faster.
        let base = raw(false);
        let ceiling = if args.ceiling_window == 0 {
            f64::NAN
        } else {
            raw(true).max(base)
        };
        rows.push(vec![
            p.transport.to_owned(),
            p.round.to_string(),
            match (p.workers, p.ceiling) {
                (Some(w), _) => format!("relay, workers={w}"),
                (None, false) => "baseline (raw client, relay's window)".to_owned(),
                (None, true) => format!("ceiling (raw client, window {})", args.ceiling_window),
            },
            format!("{:.0}", p.rate),
            format!("{:.2}", p.elapsed.as_secs_f64()),
            if p.count == n {
                format!("{} ok", p.count)
            } else {
                format!("{} **MISMATCH**", p.count)
            },
            p.workers
                .map_or("-".to_owned(), |_| format!("{:.3}", p.rate / base)),
            p.workers
                .map_or("-".to_owned(), |_| format!("{:.3}", p.rate / ceiling)),
            p.enqueue
                .map_or("-".to_owned(), |d| format!("{:.1}", d.as_secs_f64())),
        ]);
    }
    print_table(
        &[
            "transport",
            "round",
            "phase",
            "events/s",
            "seconds",
            "broker count",
            "ratio vs round baseline",
            "ratio vs round ceiling",
            "backlog insert s (untimed)",
        ],
        &rows,
    );

    let mut summary = Vec::new();
    let mut transports: Vec<&str> = phases.iter().map(|p| p.transport).collect();
    transports.dedup();
    for t in transports {
        let rates = |w: Option<usize>, ceiling: bool| -> Vec<f64> {
            phases
                .iter()
                .filter(|p| p.transport == t && p.workers == w && p.ceiling == ceiling)
                .map(|p| p.rate)
                .collect()
        };
        let base = mean(&rates(None, false));
        let ceiling = if args.ceiling_window == 0 {
            f64::NAN
        } else {
            mean(&rates(None, true)).max(base)
        };
        let abs_goal = if t == "rabbitmq" { 10_000.0 } else { 20_000.0 };
        // The goals against the ceiling: 0.5 on NATS and 0.7 on RabbitMQ (issue 12), 0.7 on
        // Kafka ("the raw rdkafka idempotent producer at its best window", issue 10).
        let ceiling_goal = match t {
            "rabbitmq" | "kafka" => Some(0.7),
            "nats" => Some(0.5),
            _ => None,
        };
        for &w in workers {
            let cand = mean(&rates(Some(w), false));
            let ratio = cand / base;
            let of_ceiling = cand / ceiling;
            summary.push(vec![
                t.to_owned(),
                w.to_string(),
                format!("{base:.0}"),
                format!("{ceiling:.0}"),
                format!("{cand:.0}"),
                format!("{ratio:.3}"),
                format!("≥ 0.70: {}", verdict(ratio, 0.70)),
                format!("{of_ceiling:.3}"),
                match ceiling_goal {
                    _ if ceiling.is_nan() => "not measured".to_owned(),
                    Some(goal) => format!("≥ {goal:.2}: {}", verdict(of_ceiling, goal)),
                    None => "no goal".to_owned(),
                },
                format!("≥ {abs_goal:.0}/s: {}", verdict(cand, abs_goal)),
            ]);
        }
    }
    println!("#### W2: CPU per 1,000 events during each phase (ms; from /proc)\n");
    print_phases_cpu(
        "bench process (relay / raw client)",
        phases.iter().map(|p| {
            let phase = match (p.workers, p.ceiling) {
                (Some(w), _) => format!("relay w={w}"),
                (None, false) => "baseline".to_owned(),
                (None, true) => "ceiling".to_owned(),
            };
            let cpu = p
                .cpu
                .cells(p.transport, args.messages as f64, p.elapsed.as_secs_f64());
            (p.transport, p.round, phase, cpu)
        }),
    );

    println!("#### W2 summary (means over rounds)\n");
    print_table(
        &[
            "transport",
            "workers",
            "baseline ev/s",
            "ceiling ev/s",
            "relay ev/s",
            "relay/baseline",
            "ratio goal",
            "relay/ceiling",
            "ceiling goal",
            "absolute goal",
        ],
        &summary,
    );

    println!(
        "#### W2: where a relay drain spends its time (timing decorators around OutboxStore and Transport)\n"
    );
    let mut rows = Vec::new();
    for p in phases {
        let (Some(w), Some(b)) = (p.workers, &p.breakdown) else {
            continue;
        };
        let worker_ms = p.elapsed.as_secs_f64() * 1e3 * w as f64;
        rows.push(vec![
            p.transport.to_owned(),
            p.round.to_string(),
            w.to_string(),
            format!("{} (+{} empty)", b.batches, b.empty_claims),
            format!("{:.0}", b.rows_per_batch),
            format!(
                "{:.1} / {:.1} / {:.1}",
                b.claim_ms_mean, b.claim_ms_p50, b.claim_ms_max
            ),
            format!("{:.1}", b.publish_phase_ms_mean),
            format!("{:.1}", b.mark_ms_mean),
            shares(
                [b.claim_ms_total, b.publish_phase_ms_total, b.mark_ms_total],
                worker_ms,
            ),
            format!(
                "{:.2} / {:.2}",
                b.publish_us_p50 / 1e3,
                b.publish_us_p99 / 1e3
            ),
            format!(
                "{:.0} (max {}) of {}",
                b.mean_in_flight, b.max_in_flight, b.publishes
            ),
            format!("{} / {} / {}", b.publish_errors, b.failures, b.released),
        ]);
    }
    print_table(
        &[
            "transport",
            "round",
            "workers",
            "batches",
            "rows/batch",
            "claim ms mean/p50/max",
            "publish phase ms/batch",
            "mark ms/batch",
            "worker time: claim/publish/mark",
            "publish call ms p50/p99",
            "publishes in flight (mean, max) of total",
            "errors/failed/released",
        ],
        &rows,
    );
}
