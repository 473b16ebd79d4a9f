//! `w7`: failover. How long after a relay dies do its aggregates move again?
//!
//! **Polling** (`--mode polling`): `--relays` `outbox relay` processes (release build, the
//! relay's defaults: 30 s lease, live session) drain a steady producer (`--rate` events/s over
//! `--aggregates` aggregates, plain transactions of five events). `--kills` times, 1-2 s apart,
//! one relay, picked at random, is frozen (SIGSTOP) at a moment it holds live leases of
//! aggregates with pending events; those aggregates are noted, the relay is SIGKILLed (the kill's
//! moment is the clock's zero) and started again. For each noted aggregate the bench takes the
//! first message of it any subscriber receives after the kill: a survivor's publish (the leases
//! are read 100 ms after the freeze, once a statement the relay sent before it froze has ended
//! and what it published has arrived). A frozen relay's session stays open, so nothing is taken
//! from it before the kill. An aggregate not
//! republished within a minute counts as a minute.
//!
//! **CDC standby** (`--mode cdc`): two CDC relays over one slot, one streaming, one waiting.
//! `--kills` times, the streaming one is SIGKILLed, a marker event is committed at once, and the
//! time to the marker's arrival is taken; the killed relay is started again (the new standby).
//!
//! Subscribers receive every publish (NATS: a core subscription, which sees copies the stream
//! drops as duplicates; Kafka: a reader of every partition). The baseline, in the same run, is
//! the steady commit-to-receive latency of the producer's events in the seconds before the
//! first kill. CPU per 1,000 events per process from `/proc` (the relays' lives summed).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_core::{NewMessage, Payload};
use outbox_postgres::{PgOutbox, cdc};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::process::Child;
use uuid::Uuid;

use crate::brokers::{KafkaBench, NatsBench};
use crate::common::{
    BenchSchema, Env, connect_pool, cpu_snapshot, loadavg, percentile, print_table, proc_cpu_secs,
    verdict,
};
use crate::relay_process::{RelayCommand, check_bin};

/// The relay process.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Polling relays with leases and live sessions.
    Polling,
    /// A CDC relay and its standby.
    Cdc,
}

/// The broker.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broker {
    /// NATS JetStream.
    Nats,
    /// Kafka.
    Kafka,
}

/// Options of `w7`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long, value_enum, default_value = "nats")]
    broker: Broker,
    #[arg(long, value_enum, default_value = "polling")]
    mode: Mode,
    /// Kills to measure.
    #[arg(long, default_value_t = 50)]
    kills: usize,
    /// Polling relays (the CDC mode runs two).
    #[arg(long, default_value_t = 3)]
    relays: usize,
    /// Events per second of the producer.
    #[arg(long, default_value_t = 500)]
    rate: u64,
    /// Aggregates the events are spread over.
    #[arg(long, default_value_t = 1000)]
    aggregates: usize,
    /// The goal for the p99, ms.
    #[arg(long, default_value_t = 1000.0)]
    goal_ms: f64,
    /// The `outbox` binary (`cargo build --release -p outbox-cli`).
    #[arg(long, default_value = "target/release/outbox")]
    outbox_bin: PathBuf,
}

/// Every receipt of every message: event id and when.
type Log = Arc<Mutex<Vec<(Uuid, Instant)>>>;

/// What the producer committed: event id, its aggregate and when its commit returned.
type Sent = Arc<Mutex<HashMap<Uuid, (u32, Instant)>>>;

enum Bench {
    Nats(Box<NatsBench>),
    Kafka(Box<KafkaBench>),
}

impl Bench {
    fn toml(&self) -> String {
        match self {
            Bench::Nats(n) => n.relay_toml(),
            Bench::Kafka(k) => k.relay_toml(),
        }
    }

    fn url<'a>(&self, env: &'a Env) -> &'a str {
        match self {
            Bench::Nats(_) => &env.nats_url,
            Bench::Kafka(_) => &env.kafka_url,
        }
    }

    async fn subscribe(&self, env: &Env, log: Log) -> Result<()> {
        match self {
            Bench::Nats(n) => {
                use futures::StreamExt;
                let client = async_nats::connect(&env.nats_url).await?;
                let mut sub = client.subscribe(format!("{}.>", n.prefix)).await?;
                client.flush().await?;
                tokio::spawn(async move {
                    let _client = client;
                    while let Some(m) = sub.next().await {
                        let id = m
                            .headers
                            .as_ref()
                            .and_then(|h| h.get("ce-id"))
                            .and_then(|v| v.as_str().parse().ok());
                        if let Some(id) = id {
                            log.lock().unwrap().push((id, Instant::now()));
                        }
                    }
                });
            }
            Bench::Kafka(k) => {
                use outbox_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
                use outbox_kafka::rdkafka::message::{Headers, Message};
                use outbox_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
                let mut config = outbox_kafka::rdkafka::ClientConfig::new();
                config
                    .set(
                        "bootstrap.servers",
                        outbox_kafka::bootstrap_servers(&env.kafka_url)?,
                    )
                    .set("group.id", format!("w7-{}", Uuid::now_v7().simple()))
                    .set("enable.auto.commit", "false")
                    .set("fetch.wait.max.ms", "5");
                let reader: BaseConsumer = config.create()?;
                let meta = reader.fetch_metadata(Some(k.topic()), Duration::from_secs(10))?;
                let partitions = meta
                    .topics()
                    .first()
                    .map(|t| t.partitions().len())
                    .unwrap_or(0);
                let mut tpl = TopicPartitionList::new();
                for p in 0..partitions {
                    tpl.add_partition_offset(k.topic(), p as i32, Offset::Beginning)?;
                }
                reader.assign(&tpl)?;
                std::thread::spawn(move || {
                    loop {
                        let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) else {
                            continue;
                        };
                        let at = Instant::now();
                        let id = m.headers().and_then(|h| {
                            h.iter()
                                .find(|h| h.key == "ce_id")
                                .and_then(|h| h.value)
                                .and_then(|v| std::str::from_utf8(v).ok())
                                .and_then(|v| v.parse().ok())
                        });
                        if let Some(id) = id {
                            log.lock().unwrap().push((id, at));
                        }
                    }
                });
            }
        }
        Ok(())
    }

    async fn teardown(self) -> Result<()> {
        match self {
            Bench::Nats(n) => n.teardown().await,
            Bench::Kafka(_) => Ok(()),
        }
    }
}

/// A relay process, its lease owner (polling) and the CPU of its earlier lives.
struct Proc {
    child: Child,
    owner: Option<i32>,
}

pub async fn run(env: &Env, args: Args) -> Result<()> {
    check_bin(&args.outbox_bin)?;
    if args.kills == 0 || args.aggregates == 0 || args.rate < 100 {
        bail!("--kills and --aggregates must be at least 1, --rate at least 100");
    }
    let pool = connect_pool(env, 8).await?;
    let bench = BenchSchema::create(&pool).await?;
    let broker = match args.broker {
        Broker::Nats => NatsBench::setup(env)
            .await
            .map(|b| Bench::Nats(Box::new(b))),
        Broker::Kafka => KafkaBench::setup(env)
            .await
            .map(|b| Bench::Kafka(Box::new(b))),
    };
    let broker = match broker {
        Ok(b) => b,
        Err(e) => {
            bench.drop(&pool).await?;
            return Err(e);
        }
    };
    let result = measure(env, &pool, &bench, &broker, &args).await;
    if args.mode == Mode::Cdc {
        let s = bench.name().to_owned();
        let _ = cdc::remove(&pool, &s, &s, Duration::from_secs(10)).await;
    }
    let teardown = broker.teardown().await;
    bench.drop(&pool).await?;
    let report = result?;
    teardown?;
    print_report(&report, &args);
    Ok(())
}

struct Report {
    /// Per held aggregate (polling) or per marker (CDC): kill to first receipt, ms.
    each_ms: Vec<f64>,
    /// Per kill: kill to the last of its aggregates' first receipts, ms (polling).
    per_kill_ms: Vec<f64>,
    kills: usize,
    held: usize,
    baseline_ms: Vec<f64>,
    events: usize,
    relay_cpu: f64,
    pg_cpu: f64,
    broker_cpu: f64,
    missed: usize,
}

async fn measure(
    env: &Env,
    pool: &PgPool,
    bench: &BenchSchema,
    broker: &Bench,
    args: &Args,
) -> Result<Report> {
    let s = bench.name().to_owned();
    if args.mode == Mode::Cdc {
        cdc::ensure_publication(pool, &bench.schema, &s).await?;
        cdc::create_slot(pool, &s).await?;
    }
    let config = std::env::temp_dir().join(format!("outbox-bench-w7-{s}.toml"));
    let mode = match args.mode {
        Mode::Polling => "polling",
        Mode::Cdc => "cdc",
    };
    std::fs::write(
        &config,
        format!("[relay]\nmode = \"{mode}\"\n\n{}", broker.toml()),
    )?;
    let command = RelayCommand {
        bin: &args.outbox_bin,
        config: &config,
        database_url: &env.database_url,
        broker_url: broker.url(env),
        schema: &s,
        log: "error",
    };
    let spawn = || command.spawn();
    let log: Log = Arc::default();
    broker.subscribe(env, Arc::clone(&log)).await?;
    let sent: Sent = Arc::default();
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = tokio::spawn(produce(
        pool.clone(),
        bench.schema.clone(),
        args.rate,
        args.aggregates,
        Arc::clone(&sent),
        stop.clone(),
    ));

    let mut relays = Vec::new();
    let mut relay_cpu = 0.0;
    let count = if args.mode == Mode::Cdc {
        2
    } else {
        args.relays.max(2)
    };
    for _ in 0..count {
        relays.push(start(pool, &s, args.mode, spawn()?).await?);
        if args.mode == Mode::Cdc {
            // The first streams before the second starts, which then waits as a standby.
            wait_streamed(pool, &s, None).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    let cpu_before = cpu_snapshot();
    // Steady state, then the baseline: commit-to-receive of the last 5 s before the kills.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let baseline_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let baseline_ms = latencies(&log, &sent, baseline_from, Instant::now());
    let mut each_ms = Vec::new();
    let mut per_kill_ms = Vec::new();
    let mut held_total = 0;
    let mut missed = 0;
    let mut rng = fastrand::Rng::with_seed(7);
    let mut streaming = 0;
    for kill in 0..args.kills {
        tokio::time::sleep(Duration::from_millis(1000 + rng.u64(0..1000))).await;
        match args.mode {
            Mode::Polling => {
                let i = rng.usize(0..relays.len());
                let held = freeze_holding(pool, &s, &relays[i]).await?;
                relay_cpu += relays[i].child.id().and_then(proc_cpu_secs).unwrap_or(0.0);
                relays[i].child.start_kill()?;
                let killed = Instant::now();
                relays[i].child.wait().await?;
                relays[i] = start(pool, &s, args.mode, spawn()?).await?;
                // Each noted aggregate's first receipt after the kill.
                let deadline = killed + Duration::from_secs(60);
                let mut firsts: HashMap<u32, f64> = HashMap::new();
                let mut explained = false;
                while firsts.len() < held.len() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    firsts = first_receipts(&log, &sent, &held, killed);
                    if !explained && killed.elapsed() > Duration::from_secs(1) {
                        explained = true;
                        let waiting: Vec<String> = held
                            .iter()
                            .filter(|a| !firsts.contains_key(a))
                            .map(|a| format!("agg-{a}"))
                            .collect();
                        if !waiting.is_empty() {
                            explain(pool, &s, &waiting).await;
                        }
                    }
                }
                missed += held.len() - firsts.len();
                held_total += held.len();
                // Never republished within the minute: counted as a minute, not left out.
                let never = (held.len() - firsts.len()) as f64;
                if never > 0.0 {
                    per_kill_ms.push(60_000.0);
                    each_ms.extend(std::iter::repeat_n(60_000.0, never as usize));
                }
                if let Some(max) = firsts.values().copied().reduce(f64::max) {
                    per_kill_ms.push(max);
                }
                each_ms.extend(firsts.values());
            }
            Mode::Cdc => {
                let victim = streaming;
                let old = wait_streamed(pool, &s, None).await?;
                relay_cpu += relays[victim]
                    .child
                    .id()
                    .and_then(proc_cpu_secs)
                    .unwrap_or(0.0);
                relays[victim].child.start_kill()?;
                let killed = Instant::now();
                let marker = marker(pool, &bench.schema, kill).await?;
                relays[victim].child.wait().await?;
                let deadline = killed + Duration::from_secs(60);
                let arrived = loop {
                    if let Some(at) = log
                        .lock()
                        .unwrap()
                        .iter()
                        .find(|(id, _)| *id == marker)
                        .map(|(_, at)| *at)
                    {
                        break Some(at);
                    }
                    if Instant::now() > deadline {
                        break None;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                };
                match arrived {
                    Some(at) => each_ms.push(at.duration_since(killed).as_secs_f64() * 1000.0),
                    None => {
                        missed += 1;
                        each_ms.push(60_000.0);
                    }
                }
                held_total += 1;
                // The other one streams now; the killed one comes back as the standby.
                wait_streamed(pool, &s, Some(old)).await?;
                relays[victim] = start(pool, &s, args.mode, spawn()?).await?;
                streaming = 1 - victim;
            }
        }
        eprintln!("w7: kill {} of {}", kill + 1, args.kills);
    }
    stop.cancel();
    producer.await??;
    let events = sent.lock().unwrap().len();
    // Until every event arrived, for the CPU figures (a minute at most).
    let all: Vec<Uuid> = sent.lock().unwrap().keys().copied().collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen: HashSet<Uuid> = log.lock().unwrap().iter().map(|(id, _)| *id).collect();
        let missing = all.iter().filter(|id| !seen.contains(id)).count();
        if missing == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("{missing} of {} events never arrived", all.len());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for r in &mut relays {
        relay_cpu += r.child.id().and_then(proc_cpu_secs).unwrap_or(0.0);
    }
    let cpu = cpu_snapshot().since(&cpu_before);
    for r in &mut relays {
        let _ = crate::relay_process::stop(&mut r.child, "TERM").await;
    }
    let _ = std::fs::remove_file(&config);
    Ok(Report {
        each_ms,
        per_kill_ms,
        kills: args.kills,
        held: held_total,
        baseline_ms,
        events,
        relay_cpu,
        pg_cpu: cpu.pg,
        broker_cpu: match args.broker {
            Broker::Nats => cpu.nats,
            Broker::Kafka => cpu.kafka,
        },
        missed,
    })
}

/// The steady producer: every 10 ms one transaction of `rate / 100` events, each the next
/// version of a random aggregate.
async fn produce(
    pool: PgPool,
    schema: outbox_postgres::Schema,
    rate: u64,
    aggregates: usize,
    sent: Sent,
    stop: tokio_util::sync::CancellationToken,
) -> Result<()> {
    let outbox = PgOutbox::new(schema);
    let per_tick = (rate / 100).max(1) as usize;
    let mut versions = vec![0i64; aggregates];
    let mut rng = fastrand::Rng::with_seed(3);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while !stop.is_cancelled() {
        tick.tick().await;
        let batch: Vec<(u32, NewMessage)> = (0..per_tick)
            .map(|_| {
                let a = rng.usize(0..aggregates);
                versions[a] += 1;
                let payload = Payload::json(&serde_json::json!({ "a": a })).expect("json");
                let m = NewMessage::new(
                    "payment",
                    format!("agg-{a}"),
                    versions[a],
                    "PaymentUpdated",
                    payload,
                );
                (a as u32, m)
            })
            .collect();
        let messages: Vec<NewMessage> = batch.iter().map(|(_, m)| m.clone()).collect();
        let mut tx = pool.begin().await?;
        outbox.enqueue_batch(&mut *tx, &messages).await?;
        tx.commit().await?;
        let at = Instant::now();
        let mut sent = sent.lock().unwrap();
        for (a, m) in batch {
            sent.insert(m.event_id, (a, at));
        }
    }
    Ok(())
}

/// A marker event committed now; its id.
async fn marker(pool: &PgPool, schema: &outbox_postgres::Schema, n: usize) -> Result<Uuid> {
    let m = NewMessage::new(
        "marker",
        format!("marker-{n}"),
        1,
        "Marker",
        Payload::json(&serde_json::json!({ "n": n }))?,
    );
    PgOutbox::new(schema.clone()).enqueue(pool, &m).await?;
    Ok(m.event_id)
}

/// Waits for `child` to register its session's owner (polling) and returns it as a [`Proc`].
async fn start(pool: &PgPool, s: &str, mode: Mode, mut child: Child) -> Result<Proc> {
    if mode == Mode::Cdc {
        return Ok(Proc { child, owner: None });
    }
    let known = owners(pool, s).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(o) = owners(pool, s).await?.difference(&known).next() {
            return Ok(Proc {
                child,
                owner: Some(*o),
            });
        }
        if let Some(status) = child.try_wait()? {
            bail!("a relay ended as it started: {status}");
        }
        if Instant::now() > deadline {
            bail!("a relay registered no session within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn owners(pool: &PgPool, s: &str) -> Result<HashSet<i32>> {
    Ok(
        sqlx::query_scalar::<_, i32>(AssertSqlSafe(format!("SELECT owner FROM {s}.lease_owners")))
            .fetch_all(pool)
            .await?
            .into_iter()
            .collect(),
    )
}

/// Freezes `relay` (SIGSTOP) at a moment it holds live leases of aggregates with pending
/// events (looked at again until it does, 30 s at most) and returns those aggregates.
async fn freeze_holding(pool: &PgPool, s: &str, relay: &Proc) -> Result<HashSet<u32>> {
    let pid = relay.child.id().context("the relay ended")?;
    let owner = relay.owner.context("a polling relay without an owner")?;
    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([format!("-{sig}"), pid.to_string()])
            .status()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        signal("STOP")?;
        // A statement it sent just before it froze (a mark, a release) ends meanwhile: what
        // is read then is what it really holds, and whatever it published before has arrived,
        // so a receipt after the kill is a survivor's.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let held: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT l.aggregate_id FROM {s}.leases l WHERE l.owner = $1 \
             AND l.lease_until > now() AND EXISTS (SELECT 1 FROM {s}.events e \
               WHERE e.aggregate_type = l.aggregate_type AND e.aggregate_id = l.aggregate_id \
               AND e.state = 'pending')"
        )))
        .bind(owner)
        .fetch_all(pool)
        .await?;
        if !held.is_empty() {
            return Ok(held
                .iter()
                .filter_map(|a| a.strip_prefix("agg-")?.parse().ok())
                .collect());
        }
        signal("CONT")?;
        if Instant::now() > deadline {
            bail!("the relay held no lease of a pending aggregate for 30 s");
        }
        tokio::time::sleep(Duration::from_millis(fastrand::u64(1..10))).await;
    }
}

/// Prints, for aggregates still waiting a second after a kill, what holds them: their lease
/// (owner, takeovers, time left, swept or not) and their pending head.
async fn explain(pool: &PgPool, s: &str, waiting: &[String]) {
    /// (aggregate, owner, takeovers, lease left, swept, head due in, attempts)
    type Waiting = (
        String,
        Option<i32>,
        Option<i32>,
        Option<String>,
        Option<bool>,
        Option<String>,
        Option<i32>,
    );
    let rows: Result<Vec<Waiting>, _> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT a, l.owner, l.takeovers, (l.lease_until - now())::text, \
               l.orphaned_at IS NOT NULL, (h.available_at - now())::text, h.attempts \
             FROM unnest($1::text[]) a \
             LEFT JOIN {s}.leases l ON l.aggregate_type = 'payment' AND l.aggregate_id = a \
             LEFT JOIN LATERAL (SELECT e.available_at, e.attempts FROM {s}.events e \
               WHERE e.aggregate_type = 'payment' AND e.aggregate_id = a AND e.state = 'pending' \
               ORDER BY e.aggregate_version LIMIT 1) h ON true LIMIT 10"
    )))
    .bind(waiting)
    .fetch_all(pool)
    .await;
    let owners = owners(pool, s).await.unwrap_or_default();
    eprintln!(
        "w7: {} aggregates still waiting 1 s after the kill (owners now {owners:?}); \
         (aggregate, owner, takeovers, lease left, swept, head due in, attempts): {rows:?}",
        waiting.len()
    );
}

/// For each aggregate of `held`, ms from `killed` to its first receipt after it.
fn first_receipts(
    log: &Log,
    sent: &Sent,
    held: &HashSet<u32>,
    killed: Instant,
) -> HashMap<u32, f64> {
    let log = log.lock().unwrap();
    let sent = sent.lock().unwrap();
    let mut firsts = HashMap::new();
    for (id, at) in log.iter().rev() {
        if *at <= killed {
            break;
        }
        if let Some((a, _)) = sent.get(id)
            && held.contains(a)
        {
            firsts.insert(*a, at.duration_since(killed).as_secs_f64() * 1000.0);
        }
    }
    firsts
}

/// Commit-to-first-receipt, ms, of the events committed between `from` and `to`.
fn latencies(log: &Log, sent: &Sent, from: Instant, to: Instant) -> Vec<f64> {
    let log = log.lock().unwrap();
    let sent = sent.lock().unwrap();
    let mut first: HashMap<Uuid, Instant> = HashMap::new();
    for (id, at) in log.iter() {
        first.entry(*id).or_insert(*at);
    }
    let mut out: Vec<f64> = sent
        .iter()
        .filter(|(_, (_, at))| *at >= from && *at < to)
        .filter_map(|(id, (_, committed))| {
            first
                .get(id)
                .map(|r| r.saturating_duration_since(*committed).as_secs_f64() * 1000.0)
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

/// Waits until the slot is streamed by a WAL sender other than `not` and returns its pid.
async fn wait_streamed(pool: &PgPool, slot: &str, not: Option<i32>) -> Result<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pid: Option<i32> = sqlx::query_scalar(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1 AND active",
        )
        .bind(slot)
        .fetch_optional(pool)
        .await?
        .flatten();
        if let Some(pid) = pid
            && Some(pid) != not
        {
            return Ok(pid);
        }
        if Instant::now() > deadline {
            bail!("the slot was not streamed within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn print_report(r: &Report, args: &Args) {
    let mut each = r.each_ms.clone();
    each.sort_by(f64::total_cmp);
    let mut per_kill = r.per_kill_ms.clone();
    per_kill.sort_by(f64::total_cmp);
    let p = |v: &[f64], q: f64| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.0}", percentile(v, q))
        }
    };
    let max = |v: &[f64]| v.last().map_or("-".to_owned(), |m| format!("{m:.0}"));
    let what = match args.mode {
        Mode::Polling => "each held aggregate: kill -> first publish by a survivor",
        Mode::Cdc => "marker committed at the kill -> its publish by the standby",
    };
    println!(
        "\n### W7 failover: {:?}, {:?}, {} kills, {} events at {} /s over {} aggregates; load \
         avg {}\n",
        args.mode,
        args.broker,
        r.kills,
        r.events,
        args.rate,
        args.aggregates,
        loadavg()
    );
    let mut rows = vec![vec![
        what.to_owned(),
        r.each_ms.len().to_string(),
        p(&each, 0.5),
        p(&each, 0.99),
        max(&each),
    ]];
    if args.mode == Mode::Polling {
        rows.push(vec![
            "each kill: kill -> last of its aggregates republished".to_owned(),
            per_kill.len().to_string(),
            p(&per_kill, 0.5),
            p(&per_kill, 0.99),
            max(&per_kill),
        ]);
    }
    rows.push(vec![
        "baseline: steady commit -> receive, same run".to_owned(),
        r.baseline_ms.len().to_string(),
        p(&r.baseline_ms, 0.5),
        p(&r.baseline_ms, 0.99),
        max(&r.baseline_ms),
    ]);
    print_table(&["measured", "n", "p50 ms", "p99 ms", "max ms"], &rows);
    let p99 = if each.is_empty() {
        f64::INFINITY
    } else {
        percentile(&each, 0.99)
    };
    let per_k = |secs: f64| format!("{:.1}", secs * 1000.0 / (r.events as f64 / 1000.0));
    println!(
        "\nheld aggregates noted: {} ({} never republished within 60 s); CPU-ms per 1,000 \
         events: relays {}, PostgreSQL {}, broker {}",
        r.held,
        r.missed,
        per_k(r.relay_cpu),
        per_k(r.pg_cpu),
        per_k(r.broker_cpu)
    );
    println!(
        "verdict (p99 {p99:.0} ms against {:.0} ms): {}",
        args.goal_ms,
        verdict(args.goal_ms / p99.max(f64::MIN_POSITIVE), 1.0)
    );
}
