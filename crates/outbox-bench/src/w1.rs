//! W1: producer overhead of writing the outbox row in the business transaction.
//!
//! The business transaction is the seed's payment: `UPDATE` of an account row (its balance)
//! and `INSERT` of a payment row, by 8 clients over 10,000 accounts (each client on its own
//! accounts, so row locks never make clients wait for each other). The candidates add the
//! outbox row, about the account, with its version taken from the account's own row (the
//! same `UPDATE` also increments `version` and returns it: the recommended path,
//! [`outbox_postgres::AggregateRow`]'s module docs), from that row in a statement of its own
//! (`AggregateRow::next_version`), or from the outbox's allocator table
//! (`next_aggregate_version`). The one-row case (an `INSERT` of the payment alone, the
//! event's version 1) is measured too: the smallest transaction, where the outbox row weighs
//! most.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use outbox_core::{NewMessage, Payload};
use outbox_postgres::{AggregateRow, PgOutbox};
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
    /// Accounts the payments are spread over.
    #[arg(long, default_value_t = 10_000)]
    accounts: u64,
    /// Drops the events table's row check (migration 12's `events_publishable`) before the
    /// run, as on a table older than it: what the check costs the producer, by comparison
    /// with a run without this flag.
    #[arg(long)]
    without_row_check: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// UPDATE account; INSERT payment; COMMIT.
    Baseline,
    /// UPDATE account (version + 1 RETURNING version); INSERT payment; enqueue; COMMIT.
    OwnRow,
    /// UPDATE account; INSERT payment; AggregateRow::next_version; enqueue; COMMIT.
    OwnRowStatement,
    /// UPDATE account; INSERT payment; next_aggregate_version; enqueue; COMMIT.
    Allocator,
    /// INSERT payment; COMMIT.
    OneRow,
    /// INSERT payment; enqueue(version 1); COMMIT.
    OneRowEnqueue,
}

impl Variant {
    const ALL: [Variant; 6] = [
        Self::Baseline,
        Self::OwnRow,
        Self::OwnRowStatement,
        Self::Allocator,
        Self::OneRow,
        Self::OneRowEnqueue,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Baseline => "A baseline: UPDATE account + INSERT payment",
            Self::OwnRow => "B: A + enqueue, version from the same UPDATE",
            Self::OwnRowStatement => "B': A + AggregateRow::next_version (the row again) + enqueue",
            Self::Allocator => "C: A + next_aggregate_version + enqueue",
            Self::OneRow => "A1 one-row baseline: INSERT payment",
            Self::OneRowEnqueue => "B1 one-row: INSERT payment + enqueue",
        }
    }

    fn updates_account(self) -> bool {
        !matches!(self, Self::OneRow | Self::OneRowEnqueue)
    }

    fn enqueues(self) -> bool {
        !matches!(self, Self::Baseline | Self::OneRow)
    }
}

struct Ctx {
    pool: PgPool,
    outbox: PgOutbox,
    accounts: AggregateRow,
    /// The account's balance update, and the same incrementing and returning its version.
    update_sql: String,
    update_versioned_sql: String,
    insert_sql: String,
    /// Padding so that the serialised event is about `--payload-bytes` long.
    description: String,
    n_accounts: u64,
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

/// Client-side time of each step of one transaction: begin, account update, payment
/// insert, version statement, enqueue, commit.
type Steps = [Duration; 6];

async fn one_tx(
    ctx: &Ctx,
    variant: Variant,
    id: &str,
    account: &str,
    amount: i64,
) -> Result<Steps> {
    let mut steps = Steps::default();
    let mut t = Instant::now();
    let mut lap = |i: usize, steps: &mut Steps| {
        let now = Instant::now();
        steps[i] += now - t;
        t = now;
    };
    let mut tx = ctx.pool.begin().await?;
    lap(0, &mut steps);
    let mut version = 1;
    if variant == Variant::OwnRow {
        version = sqlx::query_scalar(AssertSqlSafe(ctx.update_versioned_sql.clone()))
            .bind(amount)
            .bind(account)
            .fetch_one(&mut *tx)
            .await?;
        lap(1, &mut steps);
    } else if variant.updates_account() {
        sqlx::query(AssertSqlSafe(ctx.update_sql.clone()))
            .bind(amount)
            .bind(account)
            .execute(&mut *tx)
            .await?;
        lap(1, &mut steps);
    }
    sqlx::query(AssertSqlSafe(ctx.insert_sql.clone()))
        .bind(id)
        .bind(amount)
        .execute(&mut *tx)
        .await?;
    lap(2, &mut steps);
    if variant == Variant::OwnRowStatement {
        version = ctx.accounts.next_version(&mut *tx, account).await?;
        lap(3, &mut steps);
    } else if variant == Variant::Allocator {
        version = ctx
            .outbox
            .next_aggregate_version(&mut *tx, "account", account)
            .await?;
        lap(3, &mut steps);
    }
    if variant.enqueues() {
        let body = serde_json::to_vec(&event_fields(id, amount, &ctx.description))?;
        let (aggregate_type, aggregate_id) = if variant.updates_account() {
            ("account", account)
        } else {
            ("payment", id)
        };
        let msg = NewMessage::new(
            aggregate_type,
            aggregate_id,
            version,
            "PaymentCreated",
            Payload::bytes("application/json", body),
        );
        ctx.outbox.enqueue(&mut *tx, &msg).await?;
        lap(4, &mut steps);
    }
    tx.commit().await?;
    lap(5, &mut steps);
    Ok(steps)
}

/// What one segment measured.
struct Seg {
    tps: f64,
    /// Mean milliseconds per transaction of each step.
    step_ms: [f64; 6],
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
                // Each client on its own accounts: no lock waits between clients.
                let account = format!("acc-{}", (n * clients as u64 + c as u64) % ctx.n_accounts);
                let steps = one_tx(&ctx, variant, &id, &account, 100 + (n as i64 % 900)).await?;
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

/// B/A, B'/A, C/A and B1/A1 of one round's (or the means') transactions per second, in
/// [`Variant::ALL`]'s order.
fn ratios(t: &[f64]) -> [f64; 4] {
    [t[1] / t[0], t[2] / t[0], t[3] / t[0], t[5] / t[4]]
}

/// CPU milliseconds per committed transaction of one process group, over all segments.
fn per_tx(s: &[Seg], f: impl Fn(&CpuSnap) -> f64) -> f64 {
    s.iter().map(|x| f(&x.cpu)).sum::<f64>() * 1e3 / s.iter().map(|x| x.commits).sum::<f64>()
}

async fn reset(ctx: &Ctx, schema: &str) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "TRUNCATE {schema}.payments, {schema}.events, {schema}.aggregate_versions, \
         {schema}.accounts"
    )))
    .execute(&ctx.pool)
    .await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {schema}.accounts (id, balance, version) \
         SELECT 'acc-' || g, 0, 0 FROM generate_series(0, $1 - 1) g"
    )))
    .bind(i64::try_from(ctx.n_accounts)?)
    .execute(&ctx.pool)
    .await?;
    sqlx::query(AssertSqlSafe(format!("VACUUM ANALYZE {schema}.accounts")))
        .execute(&ctx.pool)
        .await?;
    sqlx::query("CHECKPOINT").execute(&ctx.pool).await?;
    Ok(())
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    let pool = connect_pool(env, args.clients as u32).await?;
    let bench = BenchSchema::create(&pool).await?;
    let schema = bench.name().to_owned();
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {schema}.accounts (id text PRIMARY KEY, balance bigint NOT NULL, \
         version bigint NOT NULL)"
    )))
    .execute(&pool)
    .await?;
    if args.without_row_check {
        sqlx::query(AssertSqlSafe(format!(
            "ALTER TABLE {schema}.events DROP CONSTRAINT events_publishable"
        )))
        .execute(&pool)
        .await?;
        println!("(without the row check of migration 12)");
    }
    let ctx = Arc::new(Ctx {
        pool: pool.clone(),
        outbox: PgOutbox::new(bench.schema.clone()),
        accounts: AggregateRow::new(&format!("{schema}.accounts"), "id", "version")?,
        update_sql: format!("UPDATE {schema}.accounts SET balance = balance + $1 WHERE id = $2"),
        update_versioned_sql: format!(
            "UPDATE {schema}.accounts SET balance = balance + $1, version = version + 1 \
             WHERE id = $2 RETURNING version"
        ),
        insert_sql: format!(
            "INSERT INTO {schema}.payments (id, amount, status) VALUES ($1, $2, 'created')"
        ),
        n_accounts: args.accounts.max(1),
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
        row.extend(ratios(&this_round).iter().map(|r| format!("{r:.3}")));
        rows.push(row);
    }
    let m: Vec<f64> = tps.iter().map(|v| mean(v)).collect();
    let mut row = vec!["**mean**".to_owned()];
    row.extend(m.iter().map(|t| format!("**{t:.0}**")));
    row.extend(ratios(&m).iter().map(|r| format!("**{r:.3}**")));
    rows.push(row);
    println!(
        "### W1: producer transactions per second ({} clients)\n",
        args.clients
    );
    print_table(
        &[
            "round",
            "A: UPDATE account + INSERT payment, tx/s",
            "B: + enqueue, version from the same UPDATE",
            "B': + AggregateRow::next_version + enqueue",
            "C: + next_aggregate_version + enqueue",
            "A1: INSERT payment",
            "B1: + enqueue",
            "B/A",
            "B'/A",
            "C/A",
            "B1/A1",
        ],
        &rows,
    );
    let r = ratios(&m);
    println!(
        "Goal B/A >= 0.85 (version from the aggregate's own row): {:.3} -> {}. Informational: \
         B'/A = {:.3}, C/A (allocator table) = {:.3}, one-row B1/A1 = {:.3}. Load avg after: {}\n",
        r[0],
        verdict(r[0], 0.85),
        r[1],
        r[2],
        r[3],
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
            let total: f64 = (0..6).map(step).sum();
            vec![
                v.label().to_owned(),
                format!("{:.2}", step(0)),
                format!("{:.2}", step(1)),
                format!("{:.2}", step(2)),
                format!("{:.2}", step(3)),
                format!("{:.2}", step(4)),
                format!("{:.2}", step(5)),
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
            "UPDATE account",
            "INSERT payment",
            "version statement",
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
