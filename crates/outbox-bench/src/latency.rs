//! Commit-to-receive latency at a steady producer rate, relay in process, with and without
//! the `RelayWaker`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::{NewMessage, Payload, Transport};
use outbox_postgres::{PgOutbox, PgStore, PgStoreConfig, RelayWaker};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::brokers::{Arrivals, NatsBench, RabbitBench};
use crate::common::{
    BenchSchema, Env, TransportChoice, connect_pool, json_payload, loadavg, percentile, print_table,
};

/// How the relay learns about new rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Producers call `RelayWaker::wake` after each commit (NOTIFY, rate-limited).
    Waker,
    /// No wake-ups: the relay polls every `RelayConfig::poll_interval`.
    Poll,
}

/// Options of `latency`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Broker(s) to measure.
    #[arg(long, value_enum, default_value_t = TransportChoice::All)]
    transport: TransportChoice,
    /// Events per second (one event per transaction).
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Measured seconds per mode.
    #[arg(long, default_value_t = 20)]
    secs: u64,
    /// Unmeasured seconds before each measurement.
    #[arg(long, default_value_t = 3)]
    warmup_secs: u64,
    /// `RelayWaker` min_interval in milliseconds.
    #[arg(long, default_value_t = 2)]
    waker_ms: u64,
    /// Modes to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Mode::Waker, Mode::Poll])]
    modes: Vec<Mode>,
    /// Producer connections (transactions in flight at most).
    #[arg(long, default_value_t = 16)]
    producers: u32,
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
    let producer_pool = connect_pool(env, args.producers).await?;
    let relay_pool = connect_pool(env, 6).await?;
    let bench = BenchSchema::create(&producer_pool).await?;
    let result = measure(env, &producer_pool, &relay_pool, &bench, &args).await;
    bench.drop(&producer_pool).await?;
    result
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
        args.rate,
        args.secs,
        args.warmup_secs,
        args.waker_ms,
        config.poll_interval,
        bench.name(),
        loadavg()
    );
    // One store for every run: a PgStore keeps its LISTEN task for the process lifetime.
    let store = Arc::new(PgStore::new(
        relay_pool.clone(),
        PgStoreConfig {
            schema: bench.schema.clone(),
            ..PgStoreConfig::default()
        },
    ));
    let mut outcomes = Vec::new();
    for t in args.transport.list() {
        let arrivals: Arrivals = Arc::default();
        match t {
            TransportChoice::Nats => {
                let b = NatsBench::setup(env).await?;
                let sub = b.subscribe(Arc::clone(&arrivals)).await?;
                let r = run_modes(
                    "nats",
                    producer_pool,
                    bench,
                    &store,
                    Arc::clone(&b.transport),
                    &arrivals,
                    args,
                    &mut outcomes,
                )
                .await;
                sub.abort();
                let down = b.teardown().await;
                r?;
                down.context("NATS teardown")?;
            }
            TransportChoice::Kafka => {
                anyhow::bail!("The latency workload does not measure Kafka yet")
            }
            _ => {
                let b = RabbitBench::setup(env).await?;
                let sub = b.subscribe(Arc::clone(&arrivals)).await?;
                let r = run_modes(
                    "rabbitmq",
                    producer_pool,
                    bench,
                    &store,
                    Arc::clone(&b.transport),
                    &arrivals,
                    args,
                    &mut outcomes,
                )
                .await;
                sub.abort();
                let down = b.teardown().await;
                r?;
                down.context("RabbitMQ teardown")?;
            }
        }
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
    let outbox = PgOutbox::new(bench.schema.clone());
    let waker = (mode == Mode::Waker)
        .then(|| RelayWaker::spawn(pool.clone(), &outbox, Duration::from_millis(args.waker_ms)));
    let insert = Arc::new(format!(
        "INSERT INTO {}.payments (id, amount, status) VALUES ($1, $2, 'created')",
        bench.name()
    ));
    let commits: Arc<Mutex<HashMap<uuid::Uuid, Instant>>> = Arc::default();
    let in_flight = Arc::new(Semaphore::new(args.producers as usize * 4));
    let period = Duration::from_secs_f64(1.0 / args.rate as f64);
    let warmup_ticks = args.warmup_secs * args.rate;
    let total_ticks = warmup_ticks + args.secs * args.rate;
    let mut ticker = tokio::time::interval(period);
    let mut tasks = tokio::task::JoinSet::new();
    let mut measured_start = None;
    for i in 0..total_ticks {
        ticker.tick().await;
        let measured = i >= warmup_ticks;
        if measured && measured_start.is_none() {
            measured_start = Some(Instant::now());
        }
        let permit = Arc::clone(&in_flight).acquire_owned().await?;
        let (pool, outbox, waker, insert, commits) = (
            pool.clone(),
            outbox.clone(),
            waker.clone(),
            Arc::clone(&insert),
            Arc::clone(&commits),
        );
        let id = format!("{label}-{mode:?}-{i}");
        tasks.spawn(async move {
            let _permit = permit;
            let amount = 100 + (i as i64 % 900);
            let mut tx = pool.begin().await?;
            sqlx::query(AssertSqlSafe(insert.as_str().to_owned()))
                .bind(&id)
                .bind(amount)
                .execute(&mut *tx)
                .await?;
            let body = json_payload(
                &serde_json::json!({"payment_id": id, "amount": amount, "currency": "EUR",
                    "status": "created", "customer_id": "cus_9f8e7d6c5b4a"}),
                300,
            );
            let msg = NewMessage::new(
                "payment",
                &id,
                1,
                "PaymentCreated",
                Payload::bytes("application/json", body),
            );
            outbox.enqueue(&mut *tx, &msg).await?;
            tx.commit().await?;
            let committed = Instant::now();
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
    let measured_secs = measured_start.map_or(f64::NAN, |s| s.elapsed().as_secs_f64());
    // Wait for the stragglers (at most 10 s, or a few poll intervals).
    let deadline = Instant::now() + Duration::from_secs(10);
    let commits = std::mem::take(&mut *commits.lock().unwrap());
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

fn report(args: &Args, outcomes: &[Outcome]) {
    println!(
        "### Publish latency at {} events/s (commit return -> subscriber receive)\n",
        args.rate
    );
    let rows: Vec<Vec<String>> = outcomes
        .iter()
        .map(|o| {
            let p = |q| format!("{:.1}", percentile(&o.sorted_ms, q));
            vec![
                o.transport.to_owned(),
                match o.mode {
                    Mode::Waker => format!("RelayWaker ({} ms)", args.waker_ms),
                    Mode::Poll => {
                        format!("polling only ({:?})", RelayConfig::default().poll_interval)
                    }
                },
                o.produced.to_string(),
                format!("{:.0}", o.rate),
                p(0.5),
                p(0.9),
                p(0.99),
                format!("{:.1}", o.sorted_ms.last().copied().unwrap_or(f64::NAN)),
                o.missing.to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "transport",
            "wake-up",
            "events",
            "achieved ev/s",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "max ms",
            "missing",
        ],
        &rows,
    );
}
