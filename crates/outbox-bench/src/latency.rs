//! Commit-to-receive latency at a steady producer rate, relay in process, with and without
//! the `RelayWaker`; the steady producer (also W3's) and the latency table's columns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::{NewMessage, Payload, Transport};
use outbox_postgres::{PgOutbox, PgStore, RelayWaker};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::brokers::{AnyBench, Arrivals};
use crate::common::{
    BenchSchema, CpuSnap, Env, TransportChoice, connect_pool, cpu_snapshot, loadavg, payment_body,
    percentile, print_table,
};

/// How the relay learns about new rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Producers call `RelayWaker::wake` after each commit (NOTIFY, rate-limited).
    Waker,
    /// No wake-ups: the relay polls every `RelayConfig::poll_interval`.
    Poll,
}

/// The options `latency` and `w3` share: the broker(s), the steady producer's load.
#[derive(clap::Args, Debug)]
pub struct Steady {
    /// Broker(s) to measure.
    #[arg(long, value_enum, default_value_t = TransportChoice::All)]
    pub transport: TransportChoice,
    /// Events per second (one event per producer transaction).
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Measured seconds (per mode in `latency`).
    #[arg(long, default_value_t = 20)]
    pub secs: u64,
    /// Unmeasured seconds before each measurement.
    #[arg(long, default_value_t = 3)]
    pub warmup_secs: u64,
    /// `RelayWaker` min_interval in milliseconds.
    #[arg(long, default_value_t = 2)]
    pub waker_ms: u64,
    /// Producer connections (transactions in flight at most).
    #[arg(long, default_value_t = 16)]
    pub producers: u32,
}

/// Options of `latency`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    steady: Steady,
    /// Modes to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Mode::Waker, Mode::Poll])]
    modes: Vec<Mode>,
}

struct Outcome {
    transport: &'static str,
    mode: Mode,
    produced: usize,
    rate: f64,
    missing: usize,
    sorted_ms: Vec<f64>,
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    let producer_pool = connect_pool(env, args.steady.producers).await?;
    let relay_pool = connect_pool(env, 6).await?;
    BenchSchema::scope(&producer_pool, async |bench| {
        measure(env, &producer_pool, &relay_pool, bench, &args).await
    })
    .await
}

async fn measure(
    env: &Env,
    producer_pool: &PgPool,
    relay_pool: &PgPool,
    bench: &BenchSchema,
    args: &Args,
) -> Result<()> {
    let config = RelayConfig::default();
    println!(
        "Latency: {} events/s, {} s measured after {} s warm-up, waker min_interval {} ms, \
         relay poll_interval {:?}, schema {}, load avg before {}\n",
        args.steady.rate,
        args.steady.secs,
        args.steady.warmup_secs,
        args.steady.waker_ms,
        config.poll_interval,
        bench.name(),
        loadavg()
    );
    // One store for every run: a PgStore keeps its LISTEN task for the process lifetime.
    let store = Arc::new(PgStore::with_schema(
        relay_pool.clone(),
        bench.schema.clone(),
    ));
    let mut outcomes = Vec::new();
    for t in args.steady.transport.list() {
        let arrivals: Arrivals = Arc::default();
        if t == TransportChoice::Kafka {
            anyhow::bail!("The latency workload does not measure Kafka yet")
        }
        let b = AnyBench::setup(env, t).await?;
        let sub = b.subscribe(Arc::clone(&arrivals)).await?;
        let r = run_modes(
            t.label(),
            producer_pool,
            bench,
            &store,
            Arc::clone(b.transport()),
            &arrivals,
            args,
            &mut outcomes,
        )
        .await;
        sub.abort();
        let name = b.name();
        let down = b.teardown().await;
        r?;
        down.with_context(|| format!("{name} teardown"))?;
    }
    report(args, &outcomes);
    println!("Load avg after: {}\n", loadavg());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn run_modes<T: Transport>(
    label: &'static str,
    producer_pool: &PgPool,
    bench: &BenchSchema,
    store: &Arc<PgStore>,
    transport: Arc<T>,
    arrivals: &Arrivals,
    args: &Args,
    outcomes: &mut Vec<Outcome>,
) -> Result<()> {
    for &mode in &args.modes {
        arrivals.lock().unwrap().clear();
        let relay = Arc::new(Relay::new(
            Arc::clone(store),
            Arc::clone(&transport),
            RelayConfig::default(),
        )?);
        let shutdown = CancellationToken::new();
        let relay_task = tokio::spawn(Arc::clone(&relay).run(shutdown.clone()));
        let r = produce(label, mode, producer_pool, bench, arrivals, args).await;
        shutdown.cancel();
        relay_task.await?;
        let o = r?;
        eprintln!(
            "  {label} {mode:?}: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} events, {} missing, load {})",
            percentile(&o.sorted_ms, 0.5),
            percentile(&o.sorted_ms, 0.99),
            o.sorted_ms.last().copied().unwrap_or(f64::NAN),
            o.produced,
            o.missing,
            loadavg()
        );
        outcomes.push(o);
    }
    Ok(())
}

async fn produce(
    label: &'static str,
    mode: Mode,
    pool: &PgPool,
    bench: &BenchSchema,
    arrivals: &Arrivals,
    args: &Args,
) -> Result<Outcome> {
    let produced = produce_steady(
        pool,
        bench,
        &args.steady,
        mode == Mode::Waker,
        |i| format!("{label}-{mode:?}-{i}"),
        Instant::now,
        false,
    )
    .await?;
    let (commits, measured_secs) = (produced.commits, produced.measured_secs);
    // Wait for the stragglers (at most 10 s, or a few poll intervals).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let missing = {
            let a = arrivals.lock().unwrap();
            commits.keys().filter(|id| !a.contains_key(id)).count()
        };
        if missing == 0 || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a = arrivals.lock().unwrap();
    let mut sorted_ms = Vec::with_capacity(commits.len());
    let mut missing = 0;
    for (id, committed) in &commits {
        match a.get(id) {
            Some(received) => {
                sorted_ms.push(received.saturating_duration_since(*committed).as_secs_f64() * 1e3)
            }
            None => missing += 1,
        }
    }
    sorted_ms.sort_by(f64::total_cmp);
    Ok(Outcome {
        transport: label,
        mode,
        produced: commits.len(),
        rate: commits.len() as f64 / measured_secs,
        missing,
        sorted_ms,
    })
}

/// What [`produce_steady`] did.
pub struct Produced<C> {
    /// The measured events' commit stamps, by event id.
    pub commits: HashMap<uuid::Uuid, C>,
    /// Events produced, warm-up included.
    pub total: usize,
    /// Seconds from the first measured tick to the last commit.
    pub measured_secs: f64,
    /// CPU used during the measured window (when asked for).
    pub cpu: Option<CpuSnap>,
}

/// The steady producer: `load.rate` transactions a second, each a `payments` row and its
/// `PaymentCreated` event (id `id(i)` for tick `i`), `load.secs` measured after
/// `load.warmup_secs` unmeasured, at most `load.producers * 4` in flight. With `waker`, a
/// `RelayWaker` is woken after each commit. `stamp` stamps each measured commit as it
/// returns; with `cpu`, the CPU of the measured window is taken too.
pub async fn produce_steady<C: Send + 'static>(
    pool: &PgPool,
    bench: &BenchSchema,
    load: &Steady,
    waker: bool,
    id: impl Fn(u64) -> String,
    stamp: fn() -> C,
    cpu: bool,
) -> Result<Produced<C>> {
    let outbox = PgOutbox::new(bench.schema.clone());
    let waker = waker
        .then(|| RelayWaker::spawn(pool.clone(), &outbox, Duration::from_millis(load.waker_ms)));
    let insert = Arc::new(format!(
        "INSERT INTO {}.payments (id, amount, status) VALUES ($1, $2, 'created')",
        bench.name()
    ));
    let commits: Arc<Mutex<HashMap<uuid::Uuid, C>>> = Arc::default();
    let in_flight = Arc::new(Semaphore::new(load.producers as usize * 4));
    let period = Duration::from_secs_f64(1.0 / load.rate as f64);
    let warmup_ticks = load.warmup_secs * load.rate;
    let total_ticks = warmup_ticks + load.secs * load.rate;
    let mut ticker = tokio::time::interval(period);
    let mut tasks = tokio::task::JoinSet::new();
    let mut measured_start = None;
    let mut cpu0 = cpu.then(cpu_snapshot);
    for i in 0..total_ticks {
        ticker.tick().await;
        let measured = i >= warmup_ticks;
        if measured && measured_start.is_none() {
            measured_start = Some(Instant::now());
            if cpu {
                cpu0 = Some(cpu_snapshot());
            }
        }
        let permit = Arc::clone(&in_flight).acquire_owned().await?;
        let (pool, outbox, waker, insert, commits) = (
            pool.clone(),
            outbox.clone(),
            waker.clone(),
            Arc::clone(&insert),
            Arc::clone(&commits),
        );
        let id = id(i);
        tasks.spawn(async move {
            let _permit = permit;
            let amount = 100 + (i as i64 % 900);
            let mut tx = pool.begin().await?;
            sqlx::query(AssertSqlSafe(insert.as_str().to_owned()))
                .bind(&id)
                .bind(amount)
                .execute(&mut *tx)
                .await?;
            let body = payment_body(&id, amount);
            let msg = NewMessage::new(
                "payment",
                &id,
                1,
                "PaymentCreated",
                Payload::bytes("application/json", body),
            );
            outbox.enqueue(&mut *tx, &msg).await?;
            tx.commit().await?;
            let committed = stamp();
            if measured {
                commits.lock().unwrap().insert(msg.event_id, committed);
            }
            if let Some(w) = &waker {
                w.wake();
            }
            anyhow::Ok(())
        });
        while let Some(done) = tasks.try_join_next() {
            done??;
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let cpu = cpu0.map(|cpu0| cpu_snapshot().since(&cpu0));
    let measured_secs = measured_start.map_or(f64::NAN, |s| s.elapsed().as_secs_f64());
    let commits = std::mem::take(&mut *commits.lock().unwrap());
    Ok(Produced {
        commits,
        total: total_ticks as usize,
        measured_secs,
        cpu,
    })
}

/// The headers of [`latency_cells`].
pub const LATENCY_HEADERS: [&str; 6] = [
    "events",
    "achieved ev/s",
    "p50 ms",
    "p90 ms",
    "p99 ms",
    "max ms",
];

/// A latency table's cells: `events`, the achieved `rate`, the p50, p90, p99 and max of the
/// ascending `sorted_ms`.
pub fn latency_cells(events: usize, rate: f64, sorted_ms: &[f64]) -> [String; 6] {
    let p = |q| format!("{:.1}", percentile(sorted_ms, q));
    [
        events.to_string(),
        format!("{rate:.0}"),
        p(0.5),
        p(0.9),
        p(0.99),
        format!("{:.1}", sorted_ms.last().copied().unwrap_or(f64::NAN)),
    ]
}

fn report(args: &Args, outcomes: &[Outcome]) {
    println!(
        "### Publish latency at {} events/s (commit return -> subscriber receive)\n",
        args.steady.rate
    );
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let wake_up = match o.mode {
                Mode::Waker => format!("RelayWaker ({} ms)", args.steady.waker_ms),
                Mode::Poll => format!("polling only ({:?})", RelayConfig::default().poll_interval),
            };
            let mut row = vec![o.transport.to_owned(), wake_up];
            row.extend(latency_cells(o.produced, o.rate, &o.sorted_ms));
            row.push(o.missing.to_string());
            row
        })
        .collect();
    print_table(
        &[
            &["transport", "wake-up"][..],
            &LATENCY_HEADERS,
            &["missing"],
        ]
        .concat(),
        &rows,
    );
}
