//! `paused`: what a paused route costs the claim. A paused route's pending rows stay in the
//! table; a claim from the table's start walks past those ahead of the first claimable ones.
//! With the claim window on (`outbox_postgres::ClaimWindow`), a slow claim moves the next
//! claims' start past them, so only one claim in a while (the walk from the start) pays for
//! them. Measured on one table, in one run, for each size of the paused backlog ahead of
//! 100,000 claimable rows: the claim with nothing paused (the baseline; the same rows are
//! claimable), then with the route paused, window off (the default), then window on (p50,
//! p99, and the slowest: a walk from the start).

use std::time::Instant;

use anyhow::{Result, bail};
use outbox_core::operator::prelude::*;
use outbox_core::operator::{Actor, PauseTarget};
use outbox_core::relay::RelayConfig;
use outbox_core::{ClaimParams, OutboxStore, ReleaseParams};
use outbox_postgres::PgStore;
use sqlx::{AssertSqlSafe, PgPool};

use crate::common::{BenchSchema, Env, connect_pool, percentile, print_table};

/// Options of `paused`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Sizes of the paused route's backlog ahead of the claimable rows, measured in turn
    /// (each adds to the one before).
    #[arg(long, value_delimiter = ',', default_values_t = [10_000u64, 100_000, 1_000_000])]
    pub(crate) paused: Vec<u64>,
    /// Claimable rows behind them (one aggregate each, the route of their aggregate type).
    #[arg(long, default_value_t = 100_000)]
    pub(crate) claimable: u64,
    /// Claims per measurement.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) claims: u64,
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    let pool = connect_pool(env, 4).await?;
    BenchSchema::scope(&pool, async |bench| measure(&pool, bench, &args).await).await
}

async fn measure(pool: &PgPool, bench: &BenchSchema, args: &Args) -> Result<()> {
    let s = bench.name();
    let store = PgStore::with_schema(pool.clone(), bench.schema.clone());
    let admin = store.clone();
    let windowed = store
        .clone()
        .with_claim_window(outbox_postgres::ClaimWindow::default());
    let me = Actor::new("outbox-bench", "bench")?;
    let route = PauseTarget::destination("held");
    println!(
        "paused: claims of one relay batch ({} rows) ahead of {} claimable rows, {} claims each\n",
        RelayConfig::default().batch_size,
        args.claimable,
        args.claims
    );
    let mut rows = Vec::new();
    let mut held = 0;
    for &size in &args.paused {
        if size <= held {
            bail!("--paused sizes must grow: {size} after {held}");
        }
        // The paused route's rows take the lowest ids: everything claimable is renumbered
        // behind them.
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM {s}.events WHERE destination IS NULL"
        )))
        .execute(pool)
        .await?;
        insert(pool, s, held, size, Some("held")).await?;
        insert(pool, s, 0, args.claimable, None).await?;
        sqlx::query(AssertSqlSafe(format!("VACUUM (ANALYZE) {s}.events")))
            .execute(pool)
            .await?;
        held = size;
        let baseline = claims(&store, args.claims).await?;
        admin.pause(&route, &me, "bench").await?;
        let paused = claims(&store, args.claims).await?;
        let window = claims(&windowed, args.claims).await?;
        admin.resume(&route, &me, "bench").await?;
        let p50 = |v: &[f64]| percentile(v, 0.5);
        println!(
            "{size} paused rows ahead: p50 {:.1} ms paused, {:.1} ms with the window, {:.1} ms not",
            p50(&paused),
            p50(&window),
            p50(&baseline)
        );
        rows.push(vec![
            size.to_string(),
            format!("{:.1}", p50(&baseline)),
            format!("{:.1}", p50(&paused)),
            format!("{:.1}", p50(&paused) / p50(&baseline)),
            format!(
                "{:.2}",
                (p50(&paused) - p50(&baseline)) * 1000.0 / size as f64
            ),
            format!("{:.1}", p50(&window)),
            format!("{:.1}", window.last().copied().unwrap_or_default()),
            format!("{:.1}", p50(&window) / p50(&baseline)),
        ]);
    }
    print_table(
        &[
            "paused rows ahead",
            "claim p50, nothing paused (ms)",
            "claim p50, route paused (ms)",
            "paused / not",
            "µs per paused row",
            "p50 paused, window on (ms)",
            "slowest, window on (ms)",
            "window on / not",
        ],
        &rows,
    );
    Ok(())
}

/// Rows `from..to` of one route: `destination` set, or the aggregate type's (`None`).
async fn insert(
    pool: &PgPool,
    s: &str,
    from: u64,
    to: u64,
    destination: Option<&str>,
) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, aggregate_version, \
         event_type, payload, destination) \
         SELECT gen_random_uuid(), 'payment', coalesce($3, 'f') || g, 1, 'PaymentCreated', \
           convert_to('{{}}', 'UTF8'), $3::text \
         FROM generate_series($1::int8, $2::int8 - 1) g"
    )))
    .bind(from as i64)
    .bind(to as i64)
    .bind(destination)
    .execute(pool)
    .await?;
    Ok(())
}

/// `n` claims of one relay batch with the relay's defaults, each released untouched, so that
/// every claim reads the same table; their latencies (ms), sorted. A claim that finds nothing
/// is an error.
pub(crate) async fn claims(store: &PgStore, n: u64) -> Result<Vec<f64>> {
    let d = RelayConfig::default();
    let mut samples = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        let batch = store
            .claim_batch(ClaimParams {
                max_rows: d.batch_size,
                max_per_aggregate: d.max_per_aggregate,
                lease: d.lease,
                scope: Default::default(),
            })
            .await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
        if batch.messages.is_empty() {
            bail!("a claim found nothing");
        }
        store
            .release(ReleaseParams {
                token: batch.token,
                ids: &[],
            })
            .await?;
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples)
}
