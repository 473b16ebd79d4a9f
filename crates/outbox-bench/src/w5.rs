//! W5: the CDC relay's drain of a backlog vs. the polling relay's drain of the same backlog,
//! interleaved in one run, on one broker (NATS by default). Both relays run the same publish
//! engine with the same configuration; only the feed differs: claims with leases and fenced
//! settles, or the replication slot with batched deletes. The CDC slot is created before its
//! backlog is written (a slot starts at the end of the log) and dropped after the drain. The
//! CDC relay drains twice per round: rows in the table (it deletes them in batches), and rows
//! deleted by the producers in their own transactions (`PgOutbox::delete_in_transaction`,
//! `CdcConfig::producers_delete_rows`), where it writes nothing to the table.
//!
//! Each round also measures the broker's ceiling as W2 does: the raw client publishing the
//! same messages at the relay's window and at `--ceiling-window` acks outstanding, the better
//! of the two. A relay, whatever its feed, cannot publish faster than that, so the CDC / polling
//! ratio is bounded by ceiling / polling, which the report prints beside it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_core::relay::Relay;
use outbox_postgres::cdc::{self, CdcConfig, CdcFeed};
use outbox_postgres::{OnPublish, PgOutbox, PgStore};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::brokers::AnyBench;
use crate::common::{
    BenchSchema, CpuSnap, Env, TransportChoice, connect_pool, cpu_snapshot, loadavg,
    print_phases_cpu, print_table,
};
use crate::timing::TimedTransport;
use crate::w2;

/// Options of `w5` (the backlog's shape and the relay's settings as in `w2`).
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    w2: w2::Args,
}

struct Round {
    round: usize,
    ceiling: f64,
    polling: f64,
    cdc: f64,
    /// The CDC relay when the producers delete their rows in their own transactions.
    cdc_producers_delete: f64,
    cdc_lag_mb: f64,
    /// CPU of each phase (raw client at its best window, polling, the two CDC drains) and its
    /// seconds: from the relay's start until every row is gone from the table.
    cpu: Vec<(&'static str, CpuSnap, f64)>,
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    let pool = connect_pool(env, 16).await?;
    BenchSchema::scope(&pool, async |bench| {
        let result = measure(env, &pool, bench, &args.w2).await;
        let slot = bench.schema.as_str();
        let removed = cdc::remove(&pool, slot, slot, Duration::from_secs(10)).await;
        removed.context("removing the bench's slot")?;
        result
    })
    .await
}

async fn measure(env: &Env, pool: &PgPool, bench: &BenchSchema, args: &w2::Args) -> Result<()> {
    let workers = args
        .workers
        .first()
        .copied()
        .unwrap_or(outbox_core::relay::RelayConfig::default().workers);
    let t = match args.transport {
        TransportChoice::All | TransportChoice::Nats => TransportChoice::Nats,
        other => other,
    };
    println!(
        "W5: {} x {} B messages over {} aggregates, {} rounds, relay workers {workers}, broker {}, \
         schema {}, load avg before {}\n",
        args.messages,
        args.payload_bytes,
        args.aggregates,
        args.rounds,
        t.label(),
        bench.name(),
        loadavg()
    );
    let publication = bench.schema.as_str().to_owned();
    cdc::ensure_publication(pool, &bench.schema, &publication).await?;
    let rounds = match t {
        TransportChoice::Nats | TransportChoice::Rabbitmq => {
            let b = AnyBench::setup(env, t).await?;
            let run = Run {
                env,
                pool,
                bench,
                args,
                workers,
                broker: &b,
            };
            let r = rounds(&run).await;
            b.teardown().await?;
            r?
        }
        _ => bail!("w5 measures nats or rabbitmq"),
    };
    report(args, t.label(), &rounds);
    println!("Load avg after: {}\n", loadavg());
    Ok(())
}

/// What every phase of the run works with.
struct Run<'a> {
    env: &'a Env,
    pool: &'a PgPool,
    bench: &'a BenchSchema,
    args: &'a w2::Args,
    /// Relay workers.
    workers: usize,
    broker: &'a AnyBench,
}

/// Takes what the broker holds after a phase that published `n` events, and purges it; fails
/// with `mismatch(held)` unless it held all of them.
async fn take_all(broker: &AnyBench, n: usize, mismatch: impl FnOnce(u64) -> String) -> Result<()> {
    let held = broker.count().await?;
    broker.purge().await?;
    if held != n as u64 {
        bail!(mismatch(held));
    }
    Ok(())
}

async fn rounds(run: &Run<'_>) -> Result<Vec<Round>> {
    let (pool, bench, args, workers, broker) =
        (run.pool, run.bench, run.args, run.workers, run.broker);
    let n = args.messages;
    let timeout = Duration::from_secs(args.timeout_secs);
    let store = PgStore::with_schema(pool.clone(), bench.schema.clone());
    let mut out = Vec::new();
    let windows = [
        w2::relay_config(args, workers).max_in_flight,
        args.ceiling_window,
    ];
    for round in 1..=args.rounds {
        // The ceiling: the raw client at the relay's window and at the ceiling window.
        let mut ceiling = 0.0_f64;
        let mut cpu = Vec::new();
        let mut raw_cpu = None;
        for window in windows.into_iter().filter(|w| *w > 0) {
            let cpu0 = cpu_snapshot();
            let elapsed = broker
                .baseline(&w2::synthetic(args), window, args.baseline_tasks)
                .await?;
            take_all(broker, n, |held| {
                format!("round {round}: the raw client left {held} of {n} in the broker")
            })
            .await?;
            let used = cpu_snapshot().since(&cpu0);
            let rate = n as f64 / elapsed.as_secs_f64();
            eprintln!("  round {round} raw client, window {window}: {rate:>8.0} ev/s");
            if rate > ceiling {
                raw_cpu = Some((used, elapsed.as_secs_f64()));
            }
            ceiling = ceiling.max(rate);
        }
        if let Some((used, secs)) = raw_cpu {
            cpu.push(("raw client (ceiling)", used, secs));
        }

        // Polling.
        w2::enqueue_backlog(pool, bench, args).await?;
        let cpu0 = cpu_snapshot();
        let (elapsed, _) = w2::drain(
            pool,
            bench,
            &store,
            Arc::clone(broker.transport()),
            w2::relay_config(args, workers),
            n,
            timeout,
        )
        .await?;
        cpu.push((
            "polling relay",
            cpu_snapshot().since(&cpu0),
            elapsed.as_secs_f64(),
        ));
        take_all(broker, n, |held| {
            format!("polling round {round}: the broker holds {held} of {n}")
        })
        .await?;
        let polling = n as f64 / elapsed.as_secs_f64();
        eprintln!(
            "  round {round} polling: {polling:>8.0} ev/s ({:.2} s)",
            elapsed.as_secs_f64()
        );

        // CDC: the slot first, then the same backlog; once with rows in the table (the relay
        // deletes them in batches), once deleted by the producers in their transactions.
        let mut cdc = [0.0_f64; 2];
        let mut lag = 0;
        for (i, producers_delete) in [false, true].into_iter().enumerate() {
            let (rate, bytes, used) =
                cdc_drain(run, producers_delete).await.with_context(|| {
                    format!("CDC round {round}, producers delete: {producers_delete}")
                })?;
            let phase = if producers_delete {
                "CDC relay, rows deleted by the producers"
            } else {
                "CDC relay"
            };
            cpu.push((phase, used, n as f64 / rate));
            cdc[i] = rate;
            lag = bytes;
            eprintln!(
                "  round {round} cdc{}: {rate:>8.0} ev/s ({:.0} MB of log to read)",
                if producers_delete {
                    ", rows deleted by the producers"
                } else {
                    ""
                },
                bytes as f64 / 1e6
            );
        }
        out.push(Round {
            round,
            ceiling,
            polling,
            cdc: cdc[0],
            cdc_producers_delete: cdc[1],
            cdc_lag_mb: lag as f64 / 1e6,
            cpu,
        });
    }
    Ok(out)
}

/// One CDC drain of a fresh backlog: the slot, the backlog (through an outbox that deletes
/// its rows in the producer's transaction when `producers_delete`), the relay until the broker
/// holds every event; then, untimed, the rows deleted and the slot dropped. Returns events per
/// second, the log the slot had to read, in bytes, and the CPU spent from the relay's start
/// until the table was empty (its deletes included).
async fn cdc_drain(run: &Run<'_>, producers_delete: bool) -> Result<(f64, i64, CpuSnap)> {
    let (pool, bench, args, workers, broker) =
        (run.pool, run.bench, run.args, run.workers, run.broker);
    let n = args.messages;
    let timeout = Duration::from_secs(args.timeout_secs);
    let slot = bench.schema.as_str().to_owned();
    cdc::create_slot(pool, &slot).await?;
    let outbox = PgOutbox::new(bench.schema.clone()).delete_in_transaction(producers_delete);
    w2::enqueue_backlog_with(pool, bench, args, outbox).await?;
    let lag = cdc::slot_state(pool, &slot)
        .await?
        .map_or(0, |s| s.lag_bytes);
    let feed = Arc::new(CdcFeed::new(
        &run.env.database_url,
        pool.clone(),
        bench.schema.clone(),
        CdcConfig {
            producers_delete_rows: producers_delete,
            ..CdcConfig::default()
        },
        OnPublish::Delete,
    ));
    let relay = Arc::new(Relay::with_feed(
        Arc::clone(&feed),
        Arc::new(TimedTransport::new(Arc::clone(broker.transport()))),
        w2::relay_config(args, workers),
    )?);
    let stop = CancellationToken::new();
    let cpu0 = cpu_snapshot();
    let started = Instant::now();
    let task = tokio::spawn(Arc::clone(&relay).run(stop.clone()));
    let mut held = 0;
    while held < n as u64 {
        if started.elapsed() > timeout {
            stop.cancel();
            let _ = task.await;
            bail!("CDC drain timed out after {timeout:?}: {held} of {n} published");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        held = broker.count().await?;
    }
    let elapsed = started.elapsed();
    // Untimed: the last rows deleted, then the relay and its slot gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = bench.count(pool, "events").await?;
        if left == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{left} rows left after the drain");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let used = cpu_snapshot().since(&cpu0);
    stop.cancel();
    task.await?;
    feed.shutdown().await?;
    // The slot goes (the publication stays for the next round).
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Err(e) = cdc::drop_slot(pool, &slot).await {
        if Instant::now() > deadline {
            bail!("dropping the slot: {e}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    broker.purge().await?;
    if held != n as u64 {
        bail!("the broker holds {held} of {n}");
    }
    Ok((n as f64 / elapsed.as_secs_f64(), lag, used))
}

fn report(args: &w2::Args, broker: &str, rounds: &[Round]) {
    println!(
        "### W5: drain of {} x {} B events ({} aggregates), CDC vs polling, {broker}\n",
        args.messages, args.payload_bytes, args.aggregates
    );
    let mut rows: Vec<Vec<String>> = rounds
        .iter()
        .map(|r| {
            vec![
                r.round.to_string(),
                format!("{:.0}", r.ceiling),
                format!("{:.0}", r.polling),
                format!("{:.0}", r.cdc),
                format!("{:.2}", r.cdc / r.polling),
                format!("{:.0}", r.cdc_producers_delete),
                format!("{:.2}", r.cdc_producers_delete / r.polling),
                format!("{:.2}", r.ceiling / r.polling),
                format!("{:.2}", r.cdc / r.ceiling),
                format!("{:.0}", r.cdc_lag_mb),
            ]
        })
        .collect();
    let mean = |f: fn(&Round) -> f64| rounds.iter().map(f).sum::<f64>() / rounds.len() as f64;
    let ratio = mean(|r| r.cdc) / mean(|r| r.polling);
    let ratio_pd = mean(|r| r.cdc_producers_delete) / mean(|r| r.polling);
    let verdict = |r: f64| if r >= 1.5 { "MET" } else { "MISSED" };
    rows.push(vec![
        "mean".into(),
        format!("{:.0}", mean(|r| r.ceiling)),
        format!("{:.0}", mean(|r| r.polling)),
        format!("{:.0}", mean(|r| r.cdc)),
        format!("**{ratio:.2}** (goal ≥ 1.5: {})", verdict(ratio)),
        format!("{:.0}", mean(|r| r.cdc_producers_delete)),
        format!("**{ratio_pd:.2}** (goal ≥ 1.5: {})", verdict(ratio_pd)),
        format!("{:.2}", mean(|r| r.ceiling) / mean(|r| r.polling)),
        format!("{:.2}", mean(|r| r.cdc) / mean(|r| r.ceiling)),
        "-".into(),
    ]);
    print_table(
        &[
            "round",
            "raw client ceiling ev/s",
            "polling relay ev/s",
            "CDC relay ev/s",
            "CDC / polling",
            "CDC relay, rows deleted by the producers, ev/s",
            "that / polling",
            "ceiling / polling (the bound of CDC / polling)",
            "CDC / ceiling",
            "log to read (MB)",
        ],
        &rows,
    );
    println!(
        "#### W5: CPU per 1,000 events during each phase (ms; from /proc; a relay's phase runs \
         from its start until the table is empty)\n"
    );
    print_phases_cpu(
        "bench process (relay / raw client)",
        rounds.iter().flat_map(|r| {
            r.cpu.iter().map(move |(phase, cpu, secs)| {
                let cells = cpu.cells(broker, args.messages as f64, *secs);
                (broker, r.round, (*phase).to_owned(), cells)
            })
        }),
    );
}
