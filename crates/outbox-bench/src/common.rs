//! Shared pieces: service addresses, fresh schemas, statistics, markdown tables.

use std::time::Duration;

use anyhow::{Context, Result};
use outbox_postgres::Schema;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

/// Service addresses (defaults, overridable through the environment).
#[derive(Debug, Clone)]
pub struct Env {
    pub database_url: String,
    pub nats_url: String,
    pub amqp_url: String,
    pub kafka_url: String,
}

impl Env {
    pub fn from_env() -> Self {
        let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
        Self {
            database_url: var(
                "OUTBOX_BENCH_DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
            nats_url: var("OUTBOX_BENCH_NATS_URL", "nats://127.0.0.1:4222"),
            amqp_url: var(
                "OUTBOX_BENCH_AMQP_URL",
                "amqp://guest:guest@127.0.0.1:5672/%2f",
            ),
            kafka_url: var("OUTBOX_BENCH_KAFKA_URL", "kafka://127.0.0.1:9092"),
        }
    }
}

/// Which broker(s) a workload runs against. `all` is NATS and RabbitMQ; Kafka (`--transport
/// kafka`) is measured by W2 and W3, on its own (its broker here is a test broker, tansu).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportChoice {
    Nats,
    Rabbitmq,
    Kafka,
    All,
}

impl TransportChoice {
    pub fn list(self) -> Vec<TransportChoice> {
        match self {
            Self::All => vec![Self::Nats, Self::Rabbitmq],
            one => vec![one],
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Nats => "nats",
            Self::Rabbitmq => "rabbitmq",
            Self::Kafka => "kafka",
            Self::All => "all",
        }
    }
}

/// A random lower-case suffix for schema / stream / exchange names.
pub fn random_suffix() -> String {
    {
        let s = uuid::Uuid::now_v7().simple().to_string();
        s[s.len() - 10..].to_owned()
    }
}

/// The 1-, 5- and 15-minute load averages (to spot a disturbed run).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

pub fn run_header(env: &Env) -> String {
    let now = chrono::Utc::now().format("%Y-%m-%d %H:%M:%S UTC");
    let cmd: Vec<String> = std::env::args().skip(1).collect();
    format!(
        "# outbox-bench {}\n\n{now} | load avg {} | db {} | nats {} | amqp {}\n",
        cmd.join(" "),
        loadavg(),
        redact(&env.database_url),
        redact(&env.nats_url),
        redact(&env.amqp_url)
    )
}

/// The URL with every credential hidden (the toolkit's one redaction function).
pub fn redact(url: &str) -> String {
    outbox::secrets::redact_url(url)
}

pub async fn connect_pool(env: &Env, size: u32) -> Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(size)
        .min_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect(&env.database_url)
        .await
        .with_context(|| format!("cannot connect to {}", redact(&env.database_url)))
}

/// A fresh, migrated schema with a random name; [`BenchSchema::drop`] removes it.
pub struct BenchSchema {
    pub schema: Schema,
}

impl BenchSchema {
    pub async fn create(pool: &PgPool) -> Result<Self> {
        let schema = Schema::new(&format!("bench_{}", random_suffix())).expect("valid name");
        outbox_postgres::migrate(pool, &schema)
            .await
            .context("migrating the bench schema")?;
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {}.payments (id text PRIMARY KEY, amount bigint NOT NULL, \
             status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())",
            schema.as_str()
        )))
        .execute(pool)
        .await?;
        Ok(Self { schema })
    }

    pub fn name(&self) -> &str {
        self.schema.as_str()
    }

    pub async fn drop(self, pool: &PgPool) -> Result<()> {
        sqlx::query(AssertSqlSafe(format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            self.name()
        )))
        .execute(pool)
        .await?;
        Ok(())
    }

    /// Runs `measure` on a fresh schema, then drops it: the drop's error first, then
    /// `measure`'s.
    pub async fn scope<T>(
        pool: &PgPool,
        measure: impl AsyncFnOnce(&BenchSchema) -> Result<T>,
    ) -> Result<T> {
        let bench = Self::create(pool).await?;
        let result = measure(&bench).await;
        bench.drop(pool).await?;
        result
    }

    /// Rows of table `table` of the schema.
    pub async fn count(&self, pool: &PgPool, table: &str) -> Result<i64> {
        Ok(sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {}.{table}",
            self.name()
        )))
        .fetch_one(pool)
        .await?)
    }
}

/// Pending rows of the outbox table of schema `s`.
pub async fn pending(pool: &PgPool, s: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {s}.events WHERE state = 'pending'"
    )))
    .fetch_one(pool)
    .await?)
}

/// `ANALYZE` of the outbox table of schema `s` (planner statistics as autovacuum would have
/// them for a table this size), then a `CHECKPOINT`: a freshly written backlog settled before
/// it is measured.
pub async fn analyze_and_checkpoint(pool: &PgPool, s: &str) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!("ANALYZE {s}.events")))
        .execute(pool)
        .await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    Ok(())
}

/// Percentile (nearest rank) of an ascending sorted slice.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// `a / b / c` as percentages of `whole` (`12% / 80% / 8%`).
pub fn shares([a, b, c]: [f64; 3], whole: f64) -> String {
    format!(
        "{:.0}% / {:.0}% / {:.0}%",
        a / whole * 100.0,
        b / whole * 100.0,
        c / whole * 100.0
    )
}

/// The ~300-byte JSON body of a `PaymentCreated` event of payment `id`.
pub fn payment_body(id: &str, amount: i64) -> Vec<u8> {
    json_payload(
        &serde_json::json!({"payment_id": id, "amount": amount, "currency": "EUR",
            "status": "created", "customer_id": "cus_9f8e7d6c5b4a"}),
        300,
    )
}

/// Prints a markdown table.
pub fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    println!("| {} |", headers.join(" | "));
    println!(
        "|{}|",
        headers
            .iter()
            .map(|h| format!("{}:", "-".repeat(h.len().max(3) + 1)))
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in rows {
        println!("| {} |", r.join(" | "));
    }
    println!();
}

/// "MET" or "MISSED BY x%" for a value that should be at least `goal`.
pub fn verdict(value: f64, goal: f64) -> String {
    if value >= goal {
        "MET".into()
    } else {
        format!("MISSED BY {:.1}%", (goal - value) / goal * 100.0)
    }
}

/// A JSON object of exactly `len` bytes (padded with a `pad` string field).
pub fn json_payload(fields: &serde_json::Value, len: usize) -> Vec<u8> {
    let base = serde_json::to_vec(fields).expect("serialisable");
    let mut obj = fields.clone();
    // `,"pad":""` adds 9 bytes to an object.
    let pad = len.saturating_sub(base.len() + 9);
    obj["pad"] = serde_json::Value::String("x".repeat(pad));
    serde_json::to_vec(&obj).expect("serialisable")
}

/// CPU seconds consumed so far, read from `/proc` (Linux, services on this machine).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSnap {
    /// PostgreSQL processes (`postgres`).
    pub pg: f64,
    /// nats-server.
    pub nats: f64,
    /// RabbitMQ (`beam.smp`).
    pub rabbit: f64,
    /// The Kafka-protocol test broker (`tansu`).
    pub kafka: f64,
    /// This benchmark process (includes the in-process relay).
    pub me: f64,
    /// Whole machine, busy (non-idle, non-iowait) CPU seconds.
    pub busy: f64,
    /// Whole machine, all CPU seconds.
    pub total: f64,
}

const CLK_TCK: f64 = 100.0;

fn proc_ticks(stat: &str) -> Option<(String, f64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat[open + 1..close].to_owned();
    let f: Vec<&str> = stat[close + 1..].split_whitespace().collect();
    let t = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    Some((comm, t(11) + t(12) + t(13) + t(14)))
}

/// CPU seconds process `pid` consumed so far (user and system, its waited-for children's
/// too), from `/proc/<pid>/stat`; `None` once it is gone.
pub fn proc_cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    proc_ticks(&stat).map(|(_, ticks)| ticks / CLK_TCK)
}

pub fn cpu_snapshot() -> CpuSnap {
    let mut s = CpuSnap::default();
    let me = std::process::id().to_string();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !name.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let Some((comm, ticks)) = proc_ticks(&stat) else {
                continue;
            };
            let secs = ticks / CLK_TCK;
            if name == me {
                s.me += secs;
            } else if comm == "postgres" {
                s.pg += secs;
            } else if comm == "nats-server" {
                s.nats += secs;
            } else if comm == "beam.smp" {
                s.rabbit += secs;
            } else if comm == "tansu" {
                s.kafka += secs;
            }
        }
    }
    if let Ok(stat) = std::fs::read_to_string("/proc/stat")
        && let Some(line) = stat.lines().next()
    {
        let v: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let total: f64 = v.iter().take(8).sum();
        let idle = v.get(3).copied().unwrap_or(0.0) + v.get(4).copied().unwrap_or(0.0);
        s.total = total / CLK_TCK;
        s.busy = (total - idle) / CLK_TCK;
    }
    s
}

impl CpuSnap {
    /// `self - earlier`.
    pub fn since(&self, earlier: &CpuSnap) -> CpuSnap {
        CpuSnap {
            pg: self.pg - earlier.pg,
            nats: self.nats - earlier.nats,
            rabbit: self.rabbit - earlier.rabbit,
            kafka: self.kafka - earlier.kafka,
            me: self.me - earlier.me,
            busy: self.busy - earlier.busy,
            total: self.total - earlier.total,
        }
    }

    /// CPU seconds of the broker `transport` names (`nats`, `rabbitmq`, `kafka`).
    pub fn broker(&self, transport: &str) -> f64 {
        match transport {
            "nats" => self.nats,
            "kafka" => self.kafka,
            _ => self.rabbit,
        }
    }

    /// CPU seconds of everything else (other agents' builds and tests, the kernel ...).
    pub fn other(&self) -> f64 {
        (self.busy - self.pg - self.nats - self.rabbit - self.kafka - self.me).max(0.0)
    }

    /// The CPU table's cells (see [`cpu_headers`]) of a window of `events` events and `secs`
    /// seconds on broker `transport`: PostgreSQL, the broker and this process in ms per 1,000
    /// events, the other load in cores, how busy the machine was.
    pub fn cells(&self, transport: &str, events: f64, secs: f64) -> [String; 5] {
        let k = 1e6 / events;
        [
            format!("{:.1}", self.pg * k),
            format!("{:.1}", self.broker(transport) * k),
            format!("{:.1}", self.me * k),
            format!("{:.2}", self.other() / secs),
            format!("{:.0}%", self.busy / self.total * 100.0),
        ]
    }
}

/// The headers of [`CpuSnap::cells`]; `me` names this process's column.
pub fn cpu_headers(me: &str) -> [&str; 5] {
    [
        "PostgreSQL",
        "broker",
        me,
        "other load (cores)",
        "machine busy",
    ]
}

/// Prints the CPU table of a workload's phases: per phase its transport, round and name, then
/// its [`CpuSnap::cells`]; `me` names this process's column.
pub fn print_phases_cpu<'a>(
    me: &str,
    phases: impl Iterator<Item = (&'a str, usize, String, [String; 5])>,
) {
    let rows: Vec<Vec<String>> = phases
        .map(|(transport, round, phase, cpu)| {
            let mut row = vec![transport.to_owned(), round.to_string(), phase];
            row.extend(cpu);
            row
        })
        .collect();
    print_table(
        &[&["transport", "round", "phase"][..], &cpu_headers(me)].concat(),
        &rows,
    );
}

/// A `payment` / `PaymentCreated` event as the relay would have claimed it (storage id `id`, a
/// fresh event id, `aggregate_id` at `version`), for the raw clients' baselines.
pub fn synthetic_message(
    id: i64,
    aggregate_id: String,
    version: i64,
    payload: outbox_core::Payload,
    now: chrono::DateTime<chrono::Utc>,
) -> outbox_core::OutboxMessage {
    outbox_core::OutboxMessage {
        id,
        event_id: uuid::Uuid::now_v7(),
        aggregate_type: "payment".into(),
        aggregate_id,
        aggregate_version: version,
        event_type: "PaymentCreated".into(),
        schema_version: 1,
        fingerprint: outbox_core::Fingerprint::of(&payload.bytes),
        payload,
        headers: Default::default(),
        destination: None,
        partition_key: None,
        created_at: now,
        attempts: 0,
    }
}
