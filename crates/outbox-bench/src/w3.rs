//! W3: end-to-end latency at a steady producer rate: producer commit -> in-process relay
//! (woken by `RelayWaker`) -> broker -> in-process `PgConsumer` (inbox + handler) commit.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use outbox_core::Transport;
use outbox_core::consumer::ConsumerConfig;
use outbox_core::consumer::DeliverySource;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_kafka::{KafkaConsumerConfig, KafkaSource};
use outbox_nats::{NatsConsumerConfig, NatsSource};
use outbox_postgres::cdc::{self, CdcConfig, CdcFeed};
use outbox_postgres::{OnPublish, PgConsumer, PgStore};
use outbox_rabbitmq::RabbitSource;
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;

use crate::brokers::{AnyBench, RawLatency};
use crate::common::{
    BenchSchema, CpuSnap, Env, connect_pool, cpu_headers, loadavg, percentile, print_table,
};
use crate::consume::{
    ConsumerSplit, ReportHandler, SourceStats, TimedSource, create_report_table, split,
};
use crate::latency::{LATENCY_HEADERS, Steady, latency_cells, produce_steady};
use crate::timing::{Breakdown, TimedStore, TimedTransport, breakdown};

/// Options of `w3`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    steady: Steady,
    /// ConsumerConfig::batch_size.
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
    /// ConsumerConfig::batch_wait in milliseconds.
    #[arg(long, default_value_t = 10)]
    batch_wait_ms: u64,
    /// The relay's feed: `polling` (claims, woken by `RelayWaker`) or `cdc` (the replication
    /// slot, created before the producer starts and dropped after the run; needs
    /// `wal_level = logical`).
    #[arg(long, value_enum, default_value_t = RelayMode::Polling)]
    relay_mode: RelayMode,
    /// The handler writes a batch's report rows with one statement (`Handler::handle_many`)
    /// instead of one `INSERT` per event.
    #[arg(long)]
    handle_many: bool,
    /// NATS only: `NatsConsumerConfig::prefetch`, messages asked for ahead of the batches (0: a
    /// fetch per batch).
    #[arg(long, default_value_t = 0)]
    prefetch: usize,
}

/// `--relay-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RelayMode {
    /// Claims with leases.
    Polling,
    /// The replication slot.
    Cdc,
}

/// Producer commit-return time of one measured event, on the process clock and the wall
/// clock (microseconds since the epoch, comparable with PostgreSQL's `clock_timestamp()` on
/// this host).
#[derive(Clone, Copy)]
struct Commit {
    at: Instant,
    wall_us: i64,
}

impl Commit {
    fn now() -> Self {
        let at = Instant::now();
        let wall_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        Self { at, wall_us }
    }
}

struct Outcome {
    transport: &'static str,
    produced_total: usize,
    measured: usize,
    rate: f64,
    missing: usize,
    /// Producer commit -> consumer commit (the runner's first ack call after its commit).
    e2e_ms: Vec<f64>,
    /// Producer commit -> handler's `clock_timestamp()` (database clock, before the commit).
    db_ms: Vec<f64>,
    /// Producer commit -> relay publish confirmed.
    to_broker_ms: Vec<f64>,
    /// Relay publish confirmed -> consumer commit.
    from_broker_ms: Vec<f64>,
    relay: Breakdown,
    consumer: ConsumerSplit,
    cpu: CpuSnap,
    measured_secs: f64,
    checks: String,
    load: String,
    /// Kafka only: the raw clients' latency on the same broker, right after (see
    /// [`KafkaBench::raw_latency`](crate::brokers::KafkaBench::raw_latency)).
    floor: Option<RawLatency>,
}

struct Pools {
    producer: PgPool,
    relay: PgPool,
    consumer: PgPool,
    /// The CDC feed's replication connection.
    database_url: String,
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    let pools = Pools {
        producer: connect_pool(env, args.steady.producers).await?,
        relay: connect_pool(env, 6).await?,
        consumer: connect_pool(env, 2).await?,
        database_url: env.database_url.clone(),
    };
    BenchSchema::scope(&pools.producer, async |bench| {
        let result = measure(env, &pools, bench, &args).await;
        // The CDC slot of a run that failed half-way, if any: it would keep WAL for good.
        let name = bench.schema.as_str();
        let removed = cdc::remove(&pools.relay, name, name, Duration::from_secs(10)).await;
        removed.context("removing the bench's slot")?;
        result
    })
    .await
}

async fn measure(env: &Env, pools: &Pools, bench: &BenchSchema, args: &Args) -> Result<()> {
    create_report_table(&pools.producer, bench.name()).await?;
    println!(
        "W3: {} events/s, {:?} relay, handle_many {}, NATS prefetch {}, {} s measured after {} s warm-up, RelayWaker min_interval \
         {} ms, default RelayConfig, PgConsumer batch_size {} batch_wait {} ms, schema {}, load \
         avg before {}\n",
        args.steady.rate,
        args.relay_mode,
        args.handle_many,
        args.prefetch,
        args.steady.secs,
        args.steady.warmup_secs,
        args.steady.waker_ms,
        args.batch_size,
        args.batch_wait_ms,
        bench.name(),
        loadavg()
    );
    // One store for every run: a PgStore keeps its LISTEN task for the process lifetime.
    let pg_store = PgStore::with_schema(pools.relay.clone(), bench.schema.clone());
    let mut outcomes = Vec::new();
    for t in args.steady.transport.list() {
        let s = bench.name();
        sqlx::query(AssertSqlSafe(format!(
            "TRUNCATE {s}.report, {s}.inbox, {s}.payments"
        )))
        .execute(&pools.producer)
        .await?;
        let b = AnyBench::setup(env, t).await?;
        let r = run_on(&b, env, pools, bench, &pg_store, args).await;
        let name = b.name();
        let down = b.teardown().await;
        let o = r?;
        down.with_context(|| format!("{name} teardown"))?;
        eprintln!(
            "  {} p50 {:.1} ms p99 {:.1} ms max {:.1} ms ({} measured, {} missing; {}; load {})",
            o.transport,
            percentile(&o.e2e_ms, 0.5),
            percentile(&o.e2e_ms, 0.99),
            o.e2e_ms.last().copied().unwrap_or(f64::NAN),
            o.measured,
            o.missing,
            o.checks,
            o.load
        );
        outcomes.push(o);
    }
    report(args, &outcomes);
    println!("Load avg after: {}\n", loadavg());
    Ok(())
}

/// [`run_one`] on broker `b` with a consumer source of its own, and what the broker still
/// holds after it (the raw clients' floor on Kafka).
async fn run_on(
    b: &AnyBench,
    env: &Env,
    pools: &Pools,
    bench: &BenchSchema,
    pg_store: &PgStore,
    args: &Args,
) -> Result<Outcome> {
    let transport = b.transport();
    match b {
        AnyBench::Nats(b) => {
            let source = NatsSource::connect(
                &env.nats_url,
                NatsConsumerConfig {
                    stream: b.stream.clone(),
                    durable_name: "w3".into(),
                    ack_wait_secs: 30,
                    prefetch: args.prefetch,
                    ..NatsConsumerConfig::default()
                },
            )
            .await?;
            let mut o = run_one("nats", pools, bench, pg_store, transport, source, args).await?;
            let (pending, ack_pending) = b.consumer_pending("w3").await?;
            o.checks
                .push_str(&format!(", left on broker {}", pending + ack_pending));
            Ok(o)
        }
        AnyBench::Kafka(b) => {
            let source = KafkaSource::connect(
                &env.kafka_url,
                KafkaConsumerConfig {
                    topics: vec![b.topic().to_owned()],
                    group_id: format!("w3-{}", bench.name()),
                    ..KafkaConsumerConfig::default()
                },
            )
            .await?;
            let mut o = run_one("kafka", pools, bench, pg_store, transport, source, args).await?;
            let load = &args.steady;
            o.floor = Some(
                b.raw_latency(env, load.rate, load.secs, load.warmup_secs)
                    .await
                    .context("the raw clients' floor")?,
            );
            Ok(o)
        }
        AnyBench::Rabbit(b) => {
            let source = RabbitSource::connect(&env.amqp_url, b.consumer_config()).await?;
            let mut o =
                run_one("rabbitmq", pools, bench, pg_store, transport, source, args).await?;
            let left = b.count_when_idle().await?;
            o.checks.push_str(&format!(", left on broker {left}"));
            Ok(o)
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_one<T: Transport, S: DeliverySource + Sync>(
    label: &'static str,
    pools: &Pools,
    bench: &BenchSchema,
    pg_store: &PgStore,
    transport: &Arc<T>,
    source: S,
    args: &Args,
) -> Result<Outcome> {
    let store = Arc::new(TimedStore::new(pg_store.clone()));
    let timed = Arc::new(TimedTransport::stamping(Arc::clone(transport)));
    // CDC: the slot before the first event, so that everything produced is streamed.
    let feed = match args.relay_mode {
        RelayMode::Polling => None,
        RelayMode::Cdc => {
            let name = bench.schema.as_str();
            cdc::ensure_publication(&pools.relay, &bench.schema, name).await?;
            cdc::create_slot(&pools.relay, name).await?;
            Some(Arc::new(CdcFeed::new(
                &pools.database_url,
                pools.relay.clone(),
                bench.schema.clone(),
                CdcConfig::default(),
                OnPublish::Delete,
            )))
        }
    };
    let source_stats = SourceStats::new(true);
    let handler = if args.handle_many {
        ReportHandler::many(bench.name())
    } else {
        ReportHandler::new(bench.name())
    };
    let consumer = PgConsumer::new(
        PgStore::with_schema(pools.consumer.clone(), bench.schema.clone()),
        TimedSource::new(source, Arc::clone(&source_stats)),
        handler.clone(),
        ConsumerConfig {
            batch_size: args.batch_size,
            batch_wait: Duration::from_millis(args.batch_wait_ms),
            ..ConsumerConfig::new("w3")
        },
    )?;
    let relay_stop = CancellationToken::new();
    let consumer_stop = CancellationToken::new();
    let relay_task = match &feed {
        None => tokio::spawn(
            Arc::new(Relay::new(
                Arc::clone(&store),
                Arc::clone(&timed),
                RelayConfig::default(),
            )?)
            .run(relay_stop.clone()),
        ),
        Some(feed) => tokio::spawn(
            Arc::new(Relay::with_feed(
                Arc::clone(feed),
                Arc::clone(&timed),
                RelayConfig::default(),
            )?)
            .run(relay_stop.clone()),
        ),
    };
    let consumer_task = tokio::spawn(consumer.run(consumer_stop.clone()));

    let produced = produce(label, &pools.producer, bench, args).await;
    let (commits, total, measured_secs, cpu) = match produced {
        Ok(p) => p,
        Err(e) => {
            relay_stop.cancel();
            consumer_stop.cancel();
            let _ = relay_task.await;
            let _ = consumer_task.await;
            return Err(e);
        }
    };
    // Wait (at most 60 s) until every produced event was committed by the consumer (a consumer
    // slower than the producer drains its backlog here; those events count with their full
    // latency). Counted in the consumer's table, not in acknowledgements: a republished copy
    // (a publish that timed out and was retried) is acknowledged too, so the ack count can
    // reach the total while distinct events are still on their way.
    let deadline = Instant::now() + Duration::from_secs(60);
    while source_stats
        .acked
        .load(std::sync::atomic::Ordering::Relaxed)
        < total as u64
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while bench.count(&pools.producer, "report").await? < total as i64 && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let load = loadavg();
    if feed.is_some() {
        // The CDC relay settles a row whose transaction was not visible yet with a later
        // batch: give it the time (at most 10 s) before it stops and the rows are counted.
        let deadline = Instant::now() + Duration::from_secs(10);
        while bench.count(&pools.producer, "events").await? > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    relay_stop.cancel();
    relay_task.await?;
    if let Some(feed) = &feed {
        feed.shutdown().await?;
        let name = bench.schema.as_str();
        cdc::remove(&pools.relay, name, name, Duration::from_secs(10)).await?;
    }
    consumer_stop.cancel();
    consumer_task.await?; // drops the source: unacknowledged deliveries go back to the broker
    let acc = source_stats.finish(Instant::now());
    let acked = source_stats.take_ack_times();
    let published = timed.stats.take_confirm_times();

    let applied: Vec<(uuid::Uuid, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT event_id, (extract(epoch FROM applied_at) * 1000000)::int8 FROM {}.report",
        bench.name()
    )))
    .fetch_all(&pools.producer)
    .await?;
    let applied: HashMap<uuid::Uuid, i64> = applied.into_iter().collect();
    let mut o = Outcome {
        transport: label,
        produced_total: total,
        measured: commits.len(),
        rate: commits.len() as f64 / measured_secs,
        missing: 0,
        e2e_ms: Vec::new(),
        db_ms: Vec::new(),
        to_broker_ms: Vec::new(),
        from_broker_ms: Vec::new(),
        relay: breakdown(&store.stats, &timed.stats),
        consumer: split(&acc, &handler.stats),
        cpu,
        measured_secs,
        checks: String::new(),
        load,
        floor: None,
    };
    let d = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
    for (id, c) in &commits {
        let Some(&done) = acked.get(id) else {
            o.missing += 1;
            continue;
        };
        o.e2e_ms.push(d(c.at, done));
        if let Some(&p) = published.get(id) {
            o.to_broker_ms.push(d(c.at, p));
            o.from_broker_ms.push(d(p, done));
        }
        if let Some(&w) = applied.get(id) {
            o.db_ms.push((w - c.wall_us) as f64 / 1e3);
        }
    }
    for v in [
        &mut o.e2e_ms,
        &mut o.db_ms,
        &mut o.to_broker_ms,
        &mut o.from_broker_ms,
    ] {
        v.sort_by(f64::total_cmp);
    }
    let report_rows = bench.count(&pools.producer, "report").await?;
    let inbox_rows = bench.count(&pools.producer, "inbox").await?;
    let outbox_rows = bench.count(&pools.producer, "events").await?;
    let ok = report_rows == total as i64 && inbox_rows == total as i64 && outbox_rows == 0;
    o.checks = format!(
        "{}: produced {total}, report rows {report_rows}, inbox rows {inbox_rows}, outbox rows \
         left {outbox_rows}, consumer nacks {}",
        if ok { "ok" } else { "**MISMATCH**" },
        o.consumer.nacks
    );
    Ok(o)
}

/// The steady producer (as in the `latency` workload, the relay woken). Returns the measured
/// events' commit times, the number produced in total (warm-up included), the measured seconds
/// and the CPU used during the measured window.
async fn produce(
    label: &'static str,
    pool: &PgPool,
    bench: &BenchSchema,
    args: &Args,
) -> Result<(HashMap<uuid::Uuid, Commit>, usize, f64, CpuSnap)> {
    let id = |i| format!("{label}-{i}");
    let p = produce_steady(pool, bench, &args.steady, true, id, Commit::now, true).await?;
    Ok((
        p.commits,
        p.total,
        p.measured_secs,
        p.cpu.unwrap_or_default(),
    ))
}

fn pq(v: &[f64], q: f64) -> String {
    format!("{:.1}", percentile(v, q))
}

fn report(args: &Args, outcomes: &[Outcome]) {
    println!(
        "### W3: end-to-end latency at {} events/s (producer commit -> PgConsumer commit), {} s after {} s warm-up\n",
        args.steady.rate, args.steady.secs, args.steady.warmup_secs
    );
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let p50 = percentile(&o.e2e_ms, 0.5);
            let p99 = percentile(&o.e2e_ms, 0.99);
            let mut row = vec![o.transport.to_owned()];
            row.extend(latency_cells(o.measured, o.rate, &o.e2e_ms));
            row.extend([
                format!("≤ 10: {}", verdict_le(p50, 10.0)),
                format!("≤ 50: {}", verdict_le(p99, 50.0)),
                format!("{} / {}", pq(&o.db_ms, 0.5), pq(&o.db_ms, 0.99)),
                o.missing.to_string(),
                o.load.clone(),
            ]);
            row
        })
        .collect();
    let goals = [
        "goal p50",
        "goal p99",
        "DB clock check p50/p99 ms",
        "missing",
        "load avg after",
    ];
    print_table(
        &[&["transport"][..], &LATENCY_HEADERS, &goals].concat(),
        &rows,
    );
    println!("Checks: ");
    for o in outcomes {
        println!("* {}: {}", o.transport, o.checks);
    }
    println!();

    let floors: Vec<Vec<String>> = outcomes
        .iter()
        .filter_map(|o| {
            let f = o.floor.as_ref()?;
            let e2e = percentile(&o.e2e_ms, 0.5);
            let floor = percentile(&f.committed_ms, 0.5);
            Some(vec![
                o.transport.to_owned(),
                format!("{} / {}", pq(&f.acked_ms, 0.5), pq(&f.acked_ms, 0.99)),
                format!("{} / {}", pq(&f.received_ms, 0.5), pq(&f.received_ms, 0.99)),
                format!(
                    "{} / {}",
                    pq(&f.committed_ms, 0.5),
                    pq(&f.committed_ms, 0.99)
                ),
                format!("{} / {}", pq(&o.e2e_ms, 0.5), pq(&o.e2e_ms, 0.99)),
                format!("{:.2}", e2e / floor),
                f.missing.to_string(),
            ])
        })
        .collect();
    if !floors.is_empty() {
        println!(
            "#### W3: the broker's floor (raw rdkafka producer -> raw consumer with a synchronous \
             offset commit per record, 1 KB, same rate, same broker, right after)\n"
        );
        print_table(
            &[
                "transport",
                "send -> report p50/p99 ms",
                "send -> received p50/p99 ms",
                "send -> offset committed p50/p99 ms",
                "relay + inbox e2e p50/p99 ms",
                "e2e p50 / floor p50",
                "missing",
            ],
            &floors,
        );
        println!();
    }

    println!("#### W3: where the latency goes\n");
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let r = &o.relay;
            let c = &o.consumer;
            vec![
                o.transport.to_owned(),
                format!(
                    "{} / {} / {}",
                    pq(&o.to_broker_ms, 0.5),
                    pq(&o.to_broker_ms, 0.99),
                    format_args!("{:.1}", o.to_broker_ms.last().copied().unwrap_or(f64::NAN))
                ),
                format!(
                    "{} / {} / {}",
                    pq(&o.from_broker_ms, 0.5),
                    pq(&o.from_broker_ms, 0.99),
                    format_args!(
                        "{:.1}",
                        o.from_broker_ms.last().copied().unwrap_or(f64::NAN)
                    )
                ),
                format!(
                    "{} (+{} empty), {:.1} rows",
                    r.batches, r.empty_claims, r.rows_per_batch
                ),
                format!(
                    "{:.1} / {:.1} / {:.1}",
                    r.claim_ms_mean, r.publish_phase_ms_mean, r.mark_ms_mean
                ),
                format!(
                    "{:.1} / {:.1}",
                    r.publish_us_p50 / 1e3,
                    r.publish_us_p99 / 1e3
                ),
                format!(
                    "{} (+{} empty, {:.1} s in empty fetches), {:.1} events; longest fetch {:.0} ms",
                    c.batches,
                    c.empty,
                    c.empty_wait_ms_total / 1e3,
                    c.per_batch,
                    c.fetch_max_ms
                ),
                format!(
                    "{:.2} / {:.2} ({:.2} handler) / {:.2}",
                    c.fetch_ms, c.work_ms, c.handler_ms, c.settle_ms
                ),
                format!("{:.2} / {:.2}", c.ack_ms_p50, c.ack_ms_p99),
            ]
        })
        .collect();
    print_table(
        &[
            "transport",
            "commit -> publish confirmed ms p50/p99/max",
            "publish confirmed -> consumer commit ms p50/p99/max",
            "relay batches",
            "relay claim / publish phase / mark ms per batch",
            "relay publish call ms p50/p99",
            "consumer batches",
            "consumer fetch / tx (handler) / acks ms per batch",
            "consumer ack call ms p50/p99",
        ],
        &rows,
    );

    println!("#### W3: CPU during the measured window (ms per 1,000 events; from /proc)\n");
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let events = o.measured.max(1) as f64;
            let mut row = vec![o.transport.to_owned()];
            row.extend(o.cpu.cells(o.transport, events, o.measured_secs));
            row.push(o.produced_total.to_string());
            row
        })
        .collect();
    print_table(
        &[
            &["transport"][..],
            &cpu_headers("bench process (producers + relay + consumer)"),
            &["events produced incl. warm-up"],
        ]
        .concat(),
        &rows,
    );
}

/// "MET" or "MISSED BY x%" for a value that should be at most `goal`.
fn verdict_le(value: f64, goal: f64) -> String {
    if value <= goal {
        "MET".into()
    } else {
        format!("MISSED BY {:.0}%", (value - goal) / goal * 100.0)
    }
}
