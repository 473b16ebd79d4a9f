//! W1: producer overhead of writing the outbox row in the business transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use outbox_core::{NewMessage, Payload};
use outbox_postgres::PgOutbox;
use sqlx::{AssertSqlSafe, PgPool};

use crate::common::{
    BenchSchema, CpuSnap, Env, connect_pool, cpu_snapshot, loadavg, mean, print_table, verdict,
};

/// Options of `w1`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Concurrent clients (and pool size).
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds per measured segment.
    #[arg(long, default_value_t = 10)]
    secs: u64,
    /// Rounds; each round runs every variant once (order alternates between rounds).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Unmeasured warm-up seconds per variant before the first round.
    #[arg(long, default_value_t = 2)]
    warmup_secs: u64,
    /// Approximate size of the event payload in bytes.
    #[arg(long, default_value_t = 300)]
    payload_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// INSERT payments; COMMIT.
    Baseline,
    /// INSERT payments; enqueue(version 1); COMMIT.
    Enqueue,
    /// INSERT payments; next_aggregate_version; enqueue; COMMIT.
    VersionEnqueue,
    /// INSERT payments; enqueue(version 1) with `delete_in_transaction` (the CDC relay's
    /// option: the row is deleted again in the transaction); COMMIT.
    EnqueueDeleted,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Self::Baseline,
        Self::Enqueue,
        Self::VersionEnqueue,
        Self::EnqueueDeleted,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Baseline => "A baseline: INSERT payment",
            Self::Enqueue => "B candidate: INSERT payment + enqueue",
            Self::VersionEnqueue => "C info: INSERT + next_aggregate_version + enqueue",
            Self::EnqueueDeleted => "D info: INSERT + enqueue, row deleted in the tx (CDC)",
        }
    }
}

struct Ctx {
    pool: PgPool,
    outbox: PgOutbox,
    /// The same with `delete_in_transaction` (variant D).
    outbox_deleting: PgOutbox,
    insert_sql: String,
    /// Padding so that the serialised event is about `--payload-bytes` long.
    description: String,
}

/// The PaymentCreated event (serialised once per transaction, as an application would).
fn event_fields(id: &str, amount: i64, description: &str) -> serde_json::Value {
    serde_json::json!({
        "payment_id": id,
        "amount": amount,
        "currency": "EUR",
        "status": "created",
        "customer_id": "cus_9f8e7d6c5b4a",
        "merchant_id": "mer_1a2b3c4d",
        "method": "card",
        "card_last4": "4242",
        "description": description,
    })
}

/// Client-side time of each step of one transaction: begin, business insert,
/// next_aggregate_version, enqueue, commit.
type Steps = [Duration; 5];

async fn one_tx(ctx: &Ctx, variant: Variant, id: &str, amount: i64) -> Result<Steps> {
    let mut steps = Steps::default();
    let mut t = Instant::now();
    let mut lap = |i: usize, steps: &mut Steps| {
        let now = Instant::now();
        steps[i] += now - t;
        t = now;
    };
    let mut tx = ctx.pool.begin().await?;
    lap(0, &mut steps);
    sqlx::query(AssertSqlSafe(ctx.insert_sql.clone()))
        .bind(id)
        .bind(amount)
        .execute(&mut *tx)
        .await?;
    lap(1, &mut steps);
    if variant != Variant::Baseline {
        let version = if variant == Variant::VersionEnqueue {
            let v = ctx
                .outbox
                .next_aggregate_version(&mut *tx, "payment", id)
                .await?;
            lap(2, &mut steps);
            v
        } else {
            1
        };
        let body = serde_json::to_vec(&event_fields(id, amount, &ctx.description))?;
        let msg = NewMessage::new(
            "payment",
            id,
            version,
            "PaymentCreated",
            Payload::bytes("application/json", body),
        );
        let outbox = if variant == Variant::EnqueueDeleted {
            &ctx.outbox_deleting
        } else {
            &ctx.outbox
        };
        outbox.enqueue(&mut *tx, &msg).await?;
        lap(3, &mut steps);
    }
    tx.commit().await?;
    lap(4, &mut steps);
    Ok(steps)
}

/// What one segment measured.
struct Seg {
    tps: f64,
    /// Mean milliseconds per transaction of each step.
    step_ms: [f64; 5],
    wal_bytes_per_tx: f64,
    /// CPU over the segment.
    cpu: CpuSnap,
    commits: f64,
    elapsed: f64,
}

/// Runs `clients` loops of `variant` for `secs`; returns committed transactions per second.
async fn segment(
    ctx: &Arc<Ctx>,
    variant: Variant,
    clients: usize,
    secs: Duration,
    tag: &str,
) -> Result<Seg> {
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&ctx.pool)
        .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let cpu0 = cpu_snapshot();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let ctx = Arc::clone(ctx);
        let stop = Arc::clone(&stop);
        let tag = tag.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut n: u64 = 0;
            let mut sum = Steps::default();
            while !stop.load(Ordering::Relaxed) {
                let id = format!("{tag}-{c}-{n}");
                let steps = one_tx(&ctx, variant, &id, 100 + (n as i64 % 900)).await?;
                for (a, b) in sum.iter_mut().zip(steps) {
                    *a += b;
                }
                n += 1;
            }
            anyhow::Ok((n, sum))
        }));
    }
    tokio::time::sleep(secs).await;
    stop.store(true, Ordering::Relaxed);
    let mut total = 0;
    let mut sum = Steps::default();
    for t in tasks {
        let (n, s) = t.await??;
        total += n;
        for (a, b) in sum.iter_mut().zip(s) {
            *a += b;
        }
    }
    // Transactions in progress at the deadline finish and are counted: use the real elapsed.
    let elapsed = started.elapsed();
    let cpu = cpu_snapshot().since(&cpu0);
    let wal: f64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
            .bind(&lsn)
            .fetch_one(&ctx.pool)
            .await?;
    let n = total.max(1) as f64;
    Ok(Seg {
        tps: total as f64 / elapsed.as_secs_f64(),
        step_ms: sum.map(|d| d.as_secs_f64() * 1e3 / n),
        wal_bytes_per_tx: wal / n,
        cpu,
        commits: n,
        elapsed: elapsed.as_secs_f64(),
    })
}

/// CPU milliseconds per committed transaction of one process group, over all segments.
fn per_tx(s: &[Seg], f: impl Fn(&CpuSnap) -> f64) -> f64 {
    s.iter().map(|x| f(&x.cpu)).sum::<f64>() * 1e3 / s.iter().map(|x| x.commits).sum::<f64>()
}

async fn reset(ctx: &Ctx, schema: &str) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "TRUNCATE {schema}.payments, {schema}.events, {schema}.aggregate_versions"
    )))
    .execute(&ctx.pool)
    .await?;
    sqlx::query("CHECKPOINT").execute(&ctx.pool).await?;
    Ok(())
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    let pool = connect_pool(env, args.clients as u32).await?;
    let bench = BenchSchema::create(&pool).await?;
    let schema = bench.name().to_owned();
    let ctx = Arc::new(Ctx {
        pool: pool.clone(),
        outbox: PgOutbox::new(bench.schema.clone()),
        outbox_deleting: PgOutbox::new(bench.schema.clone()).delete_in_transaction(true),
        insert_sql: format!(
            "INSERT INTO {schema}.payments (id, amount, status) VALUES ($1, $2, 'created')"
        ),
        description: {
            let probe = serde_json::to_vec(&event_fields("r0-0-1000", 500, ""))?.len();
            "x".repeat(args.payload_bytes.saturating_sub(probe))
        },
    });
    let result = measure(&ctx, &schema, &args).await;
    bench.drop(&pool).await?;
    result
}

async fn measure(ctx: &Arc<Ctx>, schema: &str, args: &Args) -> Result<()> {
    let secs = Duration::from_secs(args.secs);
    println!(
        "W1: {} clients, {} rounds x {} s per variant, schema {schema}, load avg before {}\n",
        args.clients,
        args.rounds,
        args.secs,
        loadavg()
    );
    if args.warmup_secs > 0 {
        for v in Variant::ALL {
            reset(ctx, schema).await?;
            segment(
                ctx,
                v,
                args.clients,
                Duration::from_secs(args.warmup_secs),
                "warm",
            )
            .await?;
        }
    }
    let mut tps: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    let mut segs: Vec<Vec<Seg>> = (0..Variant::ALL.len()).map(|_| Vec::new()).collect();
    let mut rows = Vec::new();
    for round in 0..args.rounds {
        let mut order: Vec<usize> = (0..Variant::ALL.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let mut this_round = [f64::NAN; Variant::ALL.len()];
        for i in order {
            reset(ctx, schema).await?;
            let v = Variant::ALL[i];
            let seg = segment(ctx, v, args.clients, secs, &format!("r{round}")).await?;
            let t = seg.tps;
            segs[i].push(seg);
            eprintln!(
                "  round {} {:<50} {:>8.0} tx/s  (load {})",
                round + 1,
                v.label(),
                t,
                loadavg()
            );
            this_round[i] = t;
            tps[i].push(t);
        }
        let mut row = vec![format!("{}", round + 1)];
        row.extend(this_round.iter().map(|t| format!("{t:.0}")));
        row.extend(
            this_round[1..]
                .iter()
                .map(|t| format!("{:.3}", t / this_round[0])),
        );
        rows.push(row);
    }
    let m: Vec<f64> = tps.iter().map(|v| mean(v)).collect();
    let mut row = vec!["**mean**".to_owned()];
    row.extend(m.iter().map(|t| format!("**{t:.0}**")));
    row.extend(m[1..].iter().map(|t| format!("**{:.3}**", t / m[0])));
    rows.push(row);
    println!(
        "### W1: producer transactions per second ({} clients)\n",
        args.clients
    );
    print_table(
        &[
            "round",
            "A baseline tx/s",
            "B +enqueue tx/s",
            "C +next_version+enqueue tx/s",
            "D +enqueue, row deleted in tx, tx/s",
            "B/A",
            "C/A",
            "D/A",
        ],
        &rows,
    );
    let ratio = m[1] / m[0];
    println!(
        "Goal B/A >= 0.90: {:.3} -> {} (C/A = {:.3}, D/A = {:.3}, informational). Load avg \
         after: {}\n",
        ratio,
        verdict(ratio, 0.90),
        m[2] / m[0],
        m[3] / m[0],
        loadavg()
    );
    println!(
        "#### W1: where a transaction's time goes (client-side mean ms per transaction, all rounds)\n"
    );
    let rows: Vec<Vec<String>> = Variant::ALL
        .iter()
        .zip(&segs)
        .map(|(v, s)| {
            let step = |k: usize| mean(&s.iter().map(|x| x.step_ms[k]).collect::<Vec<_>>());
            let total: f64 = (0..5).map(step).sum();
            vec![
                v.label().to_owned(),
                format!("{:.2}", step(0)),
                format!("{:.2}", step(1)),
                format!("{:.2}", step(2)),
                format!("{:.2}", step(3)),
                format!("{:.2}", step(4)),
                format!("{total:.2}"),
                format!(
                    "{:.0}",
                    mean(&s.iter().map(|x| x.wal_bytes_per_tx).collect::<Vec<_>>())
                ),
                format!("{:.3}", per_tx(s, |c| c.pg)),
                format!("{:.3}", per_tx(s, |c| c.me)),
                format!(
                    "{:.2}",
                    s.iter().map(|x| x.cpu.other()).sum::<f64>()
                        / s.iter().map(|x| x.elapsed).sum::<f64>()
                ),
                format!(
                    "{:.0}%",
                    s.iter().map(|x| x.cpu.busy).sum::<f64>()
                        / s.iter().map(|x| x.cpu.total).sum::<f64>()
                        * 100.0
                ),
            ]
        })
        .collect();
    print_table(
        &[
            "variant",
            "BEGIN",
            "INSERT payment",
            "next_aggregate_version",
            "enqueue",
            "COMMIT",
            "total",
            "WAL bytes/tx",
            "PostgreSQL CPU ms/tx",
            "bench client CPU ms/tx",
            "other load (cores)",
            "machine busy",
        ],
        &rows,
    );
    Ok(())
}
