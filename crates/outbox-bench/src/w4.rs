//! W4: consumer throughput. A preloaded stream / queue is drained by the same handler
//! without the inbox (baseline loop over the same `DeliverySource`) and by `PgConsumer` with
//! the inbox, one delivery per transaction and batched; interleaved rounds.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_core::consumer::ConsumerConfig;
use outbox_core::consumer::DeliverySource;
use outbox_nats::{NatsConsumerConfig, NatsSource};
use outbox_postgres::{PgConsumer, PgStore};
use outbox_rabbitmq::{RabbitConsumerConfig, RabbitSource};
use sqlx::{AssertSqlSafe, PgPool};

use crate::brokers::AnyBench;
use crate::common::{
    BenchSchema, CpuSnap, Env, TransportChoice, connect_pool, cpu_snapshot, loadavg, mean,
    print_phases_cpu, print_table, shares, verdict,
};
use crate::consume::{
    ConsumerSplit, ReportHandler, SourceStats, TimedSource, baseline_drain, create_report_table,
    preload, split, synthetic_events,
};

/// A measured variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Baseline without the inbox, one delivery per transaction.
    A,
    /// PgConsumer with the inbox, batch_size = 1.
    B,
    /// PgConsumer with the inbox, batch_size = --batch-size.
    C,
    /// Baseline without the inbox, batched like C (one transaction per batch).
    A2,
    /// Informational: A2 plus a savepoint around each handler, as the runner did in batch mode
    /// before it redid a failed batch one delivery at a time instead.
    S,
}

impl Kind {
    fn label(self, batch: usize) -> String {
        match self {
            Self::A => "A baseline, no inbox, batch 1".into(),
            Self::B => "B PgConsumer + inbox, batch 1".into(),
            Self::C => format!("C PgConsumer + inbox, batch {batch}"),
            Self::A2 => format!("A' baseline, no inbox, batch {batch}"),
            Self::S => format!("S info: A' + savepoint per event, batch {batch}"),
        }
    }
    fn short(self) -> &'static str {
        match self {
            Self::A => "A",
            Self::B => "B",
            Self::C => "C",
            Self::A2 => "A'",
            Self::S => "S",
        }
    }
    fn batched(self) -> bool {
        !matches!(self, Self::A | Self::B)
    }
    fn inbox(self) -> bool {
        matches!(self, Self::B | Self::C)
    }
    /// The same-round baseline this variant is compared with.
    fn baseline(self) -> Option<Kind> {
        match self {
            Self::B => Some(Self::A),
            Self::C | Self::S => Some(Self::A2),
            _ => None,
        }
    }
}

/// Options of `w4`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Broker(s) to measure.
    #[arg(long, value_enum, default_value_t = TransportChoice::All)]
    transport: TransportChoice,
    /// Events preloaded and drained per batched phase (C, A', S).
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Events preloaded and drained per one-delivery-per-transaction phase (A, B); these run
    /// at the commit rate of one connection, so fewer events keep the run short.
    #[arg(long, default_value_t = 2_000)]
    single_events: usize,
    /// Interleaved rounds; even rounds run the phases in reverse order.
    #[arg(long, default_value_t = 2)]
    rounds: usize,
    /// Batch size of C, A' and S.
    #[arg(long, default_value_t = 100)]
    batch_size: usize,
    /// ConsumerConfig::batch_wait (and the baseline's wait), milliseconds.
    #[arg(long, default_value_t = 100)]
    batch_wait_ms: u64,
    /// Phases per round, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Kind::A, Kind::B, Kind::C, Kind::A2, Kind::S])]
    phases: Vec<Kind>,
    /// Preload publishes outstanding at most.
    #[arg(long, default_value_t = 512)]
    window: usize,
    /// Give up a drain after this many seconds.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
}

struct Phase {
    transport: &'static str,
    round: usize,
    kind: Kind,
    events: usize,
    elapsed: Duration,
    rate: f64,
    report_rows: i64,
    inbox_rows: i64,
    broker_before: u64,
    broker_left: u64,
    preload: Duration,
    split: ConsumerSplit,
    cpu: CpuSnap,
    load: String,
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    let pool = connect_pool(env, 4).await?;
    BenchSchema::scope(&pool, async |bench| measure(env, &pool, bench, &args).await).await
}

async fn measure(env: &Env, pool: &PgPool, bench: &BenchSchema, args: &Args) -> Result<()> {
    create_report_table(pool, bench.name()).await?;
    println!(
        "W4: drain {} events per batched phase, {} per single phase, batch_size {}, batch_wait {} ms, \
         {} rounds, phases {:?}, schema {}, load avg before {}\n",
        args.events,
        args.single_events,
        args.batch_size,
        args.batch_wait_ms,
        args.rounds,
        args.phases,
        bench.name(),
        loadavg()
    );
    let mut phases = Vec::new();
    for t in args.transport.list() {
        if t == TransportChoice::Kafka {
            anyhow::bail!("W4 does not measure Kafka yet");
        }
        let label = t.label();
        let broker = AnyBench::setup(env, t).await?;
        let r = async {
            for round in 1..=args.rounds {
                let mut order = args.phases.clone();
                if round % 2 == 0 {
                    order.reverse();
                }
                for kind in order {
                    let p = run_phase(env, &broker, label, pool, bench, args, round, kind).await?;
                    eprintln!(
                        "  {label} round {round} {}: {:>7.0} ev/s ({} events, {:.2} s, report {} inbox {} broker left {}, load {})",
                        kind.short(),
                        p.rate,
                        p.events,
                        p.elapsed.as_secs_f64(),
                        p.report_rows,
                        p.inbox_rows,
                        p.broker_left,
                        p.load
                    );
                    phases.push(p);
                }
            }
            anyhow::Ok(())
        }
        .await;
        let down = broker.teardown().await;
        r?;
        down.context("broker teardown")?;
    }
    report(args, &phases);
    println!("Load avg after: {}\n", loadavg());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_phase(
    env: &Env,
    broker: &AnyBench,
    label: &'static str,
    pool: &PgPool,
    bench: &BenchSchema,
    args: &Args,
    round: usize,
    kind: Kind,
) -> Result<Phase> {
    let s = bench.name();
    let n = if kind.batched() {
        args.events
    } else {
        args.single_events
    };
    let batch = if kind.batched() { args.batch_size } else { 1 };
    sqlx::query(AssertSqlSafe(format!("TRUNCATE {s}.report, {s}.inbox")))
        .execute(pool)
        .await?;
    let msgs = synthetic_events(&format!("r{round}{}", kind.short()), n);
    let durable = format!("w4-r{round}-{kind:?}").to_lowercase();
    broker.purge().await?;
    let preload_took = preload(&**broker.transport(), &msgs, args.window).await?;
    let broker_before = broker.count().await?;
    drop(msgs);
    if broker_before != n as u64 {
        bail!("preload: the broker holds {broker_before} messages, expected {n}");
    }
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let handler = ReportHandler::new(s);
    let stats = SourceStats::new(false);
    let wait = Duration::from_millis(args.batch_wait_ms);
    let timeout = Duration::from_secs(args.timeout_secs);
    let cpu0 = cpu_snapshot();
    let (elapsed, acc) = match broker {
        AnyBench::Nats(b) => {
            let source = NatsSource::connect(
                &env.nats_url,
                NatsConsumerConfig {
                    stream: b.stream.clone(),
                    durable_name: durable.clone(),
                    ack_wait_secs: 60,
                    ..NatsConsumerConfig::default()
                },
            )
            .await?;
            drain(
                pool, bench, source, &handler, &stats, kind, batch, wait, n, timeout,
            )
            .await?
        }
        AnyBench::Rabbit(b) => {
            let source = RabbitSource::connect(
                &env.amqp_url,
                RabbitConsumerConfig {
                    prefetch: 256.max(batch as u32),
                    ..b.consumer_config()
                },
            )
            .await?;
            drain(
                pool, bench, source, &handler, &stats, kind, batch, wait, n, timeout,
            )
            .await?
        }
        AnyBench::Kafka(_) => bail!("W4 does not measure Kafka yet"),
    };
    let cpu = cpu_snapshot().since(&cpu0);
    let load = loadavg();
    // The source was dropped with the drain: whatever was not acknowledged is back on the
    // broker now.
    let broker_left = match broker {
        AnyBench::Nats(b) => {
            let (pending, ack_pending) = b.consumer_pending(&durable).await?;
            b.delete_consumer(&durable).await?;
            b.purge().await?;
            pending + ack_pending
        }
        AnyBench::Rabbit(b) => {
            let left = b.count_when_idle().await?;
            b.purge().await?;
            left
        }
        AnyBench::Kafka(_) => unreachable!("no Kafka source above"),
    };
    let report_rows = bench.count(pool, "report").await?;
    let inbox_rows = bench.count(pool, "inbox").await?;
    let expected_inbox = if kind.inbox() { n as i64 } else { 0 };
    if report_rows != n as i64 || inbox_rows != expected_inbox || broker_left != 0 {
        bail!(
            "{label} round {round} {kind:?}: report {report_rows} (expected {n}), inbox \
             {inbox_rows} (expected {expected_inbox}), left on the broker {broker_left}"
        );
    }
    Ok(Phase {
        transport: label,
        round,
        kind,
        events: n,
        elapsed,
        rate: n as f64 / elapsed.as_secs_f64(),
        report_rows,
        inbox_rows,
        broker_before,
        broker_left,
        preload: preload_took,
        split: split(&acc, &handler.stats),
        cpu,
        load,
    })
}

/// Drains `n` events from `source` with the variant `kind`; returns the time to the last ack
/// and the source-side timings. The source is dropped (connection closed) at the end.
#[allow(clippy::too_many_arguments)]
async fn drain<S: DeliverySource>(
    pool: &PgPool,
    bench: &BenchSchema,
    source: S,
    handler: &ReportHandler,
    stats: &std::sync::Arc<SourceStats>,
    kind: Kind,
    batch: usize,
    wait: Duration,
    n: usize,
    timeout: Duration,
) -> Result<(Duration, crate::consume::SourceAcc)> {
    let mut source = TimedSource::new(source, std::sync::Arc::clone(stats));
    let elapsed = match kind {
        Kind::A | Kind::A2 | Kind::S => {
            let e = baseline_drain(
                pool,
                &mut source,
                handler,
                batch,
                wait,
                kind == Kind::S,
                n,
                timeout,
            )
            .await?;
            drop(source);
            e
        }
        Kind::B | Kind::C => {
            let mut consumer = PgConsumer::new(
                PgStore::with_schema(pool.clone(), bench.schema.clone()),
                source,
                handler.clone(),
                ConsumerConfig {
                    batch_size: batch,
                    batch_wait: wait,
                    ..ConsumerConfig::new("w4")
                },
            )?;
            let started = Instant::now();
            let mut processed = 0;
            while processed < n {
                if started.elapsed() > timeout {
                    bail!("PgConsumer drain timed out after {timeout:?}: {processed} of {n}");
                }
                let r = consumer.run_batch().await?;
                if r.duplicates + r.conflicts + r.dead_lettered + r.nacked + r.stale > 0 {
                    bail!("unexpected consumer outcome: {r:?}");
                }
                processed += r.processed;
            }
            let e = started.elapsed();
            drop(consumer);
            e
        }
    };
    let acc = stats.finish(Instant::now());
    Ok((elapsed, acc))
}

fn report(args: &Args, phases: &[Phase]) {
    let b = args.batch_size;
    println!(
        "### W4: consumer drain ({} events per batched phase, {} per batch-1 phase, ~300 B JSON)\n",
        args.events, args.single_events
    );
    let base_of = |p: &Phase| -> Option<f64> {
        let k = p.kind.baseline()?;
        phases
            .iter()
            .find(|q| q.transport == p.transport && q.round == p.round && q.kind == k)
            .map(|q| q.rate)
    };
    let rows: Vec<Vec<String>> = phases
        .iter()
        .map(|p| {
            vec![
                p.transport.to_owned(),
                p.round.to_string(),
                p.kind.label(b),
                p.events.to_string(),
                format!("{:.2}", p.elapsed.as_secs_f64()),
                format!("{:.0}", p.rate),
                base_of(p).map_or("-".into(), |base| {
                    format!(
                        "{:.3} (vs {})",
                        p.rate / base,
                        p.kind.baseline().unwrap().short()
                    )
                }),
                format!(
                    "{} / {} / {} {}",
                    p.report_rows,
                    p.inbox_rows,
                    p.broker_left,
                    if p.broker_before == p.events as u64 {
                        "ok"
                    } else {
                        "**MISMATCH**"
                    }
                ),
                format!("{:.1}", p.preload.as_secs_f64()),
                p.load.clone(),
            ]
        })
        .collect();
    print_table(
        &[
            "transport",
            "round",
            "phase",
            "events",
            "seconds",
            "events/s",
            "ratio vs same-round baseline",
            "report rows / inbox rows / left on broker",
            "preload s (untimed)",
            "load avg after",
        ],
        &rows,
    );

    println!(
        "#### W4: where a batch spends its time (timing decorators around the DeliverySource and the handler; ms per batch)\n"
    );
    let rows: Vec<Vec<String>> = phases
        .iter()
        .map(|p| {
            let s = &p.split;
            vec![
                p.transport.to_owned(),
                p.round.to_string(),
                p.kind.short().to_owned(),
                format!("{} (+{} empty)", s.batches, s.empty),
                format!("{:.1}", s.per_batch),
                format!("{:.3}", s.fetch_ms),
                format!("{:.3}", s.work_ms),
                format!("{:.3}", s.handler_ms),
                format!("{:.3}", s.work_ms - s.handler_ms),
                format!("{:.3}", s.settle_ms),
                shares(
                    [s.fetch_ms, s.work_ms, s.settle_ms],
                    s.fetch_ms + s.work_ms + s.settle_ms,
                ),
                format!("{:.2} / {:.2}", s.ack_ms_p50, s.ack_ms_p99),
            ]
        })
        .collect();
    print_table(
        &[
            "transport",
            "round",
            "phase",
            "batches",
            "events/batch",
            "fetch",
            "transaction (begin..commit)",
            "of which handler",
            "of which rest (inbox SQL, savepoints, BEGIN/COMMIT)",
            "acks + loop",
            "fetch / tx / acks",
            "ack call ms p50/p99",
        ],
        &rows,
    );

    println!("#### W4: CPU per 1,000 events during each phase (ms; from /proc)\n");
    print_phases_cpu(
        "bench process (consumer)",
        phases.iter().map(|p| {
            let cpu = p
                .cpu
                .cells(p.transport, p.events as f64, p.elapsed.as_secs_f64());
            (p.transport, p.round, p.kind.short().to_owned(), cpu)
        }),
    );

    println!("#### W4 summary (means over rounds)\n");
    let mut transports: Vec<&str> = phases.iter().map(|p| p.transport).collect();
    transports.dedup();
    let mut rows = Vec::new();
    for t in transports {
        let rate = |k: Kind| -> f64 {
            mean(
                &phases
                    .iter()
                    .filter(|p| p.transport == t && p.kind == k)
                    .map(|p| p.rate)
                    .collect::<Vec<_>>(),
            )
        };
        let ratio = |k: Kind| -> f64 {
            mean(
                &phases
                    .iter()
                    .filter(|p| p.transport == t && p.kind == k)
                    .filter_map(|p| base_of(p).map(|base| p.rate / base))
                    .collect::<Vec<_>>(),
            )
        };
        let (a, bb, c, a2) = (rate(Kind::A), rate(Kind::B), rate(Kind::C), rate(Kind::A2));
        let (ba, ca) = (ratio(Kind::B), ratio(Kind::C));
        rows.push(vec![
            t.to_owned(),
            format!("{a:.0}"),
            format!("{bb:.0}"),
            format!("{ba:.3}: {}", verdict(ba, 0.85)),
            format!("{a2:.0}"),
            format!("{c:.0}"),
            format!("{ca:.3}: {}", verdict(ca, 0.85)),
            format!("{c:.0}: {}", verdict(c, 10_000.0)),
            if args.phases.contains(&Kind::S) {
                format!("{:.0} ({:.3} of A')", rate(Kind::S), ratio(Kind::S))
            } else {
                "-".into()
            },
        ]);
    }
    print_table(
        &[
            "transport",
            "A ev/s",
            "B ev/s",
            "B/A (goal ≥ 0.85)",
            "A' ev/s",
            "C ev/s",
            "C/A' (goal ≥ 0.85)",
            "C absolute (goal ≥ 10000/s)",
            "S ev/s (info)",
        ],
        &rows,
    );
}
