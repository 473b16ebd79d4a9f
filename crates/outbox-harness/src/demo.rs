//! `outbox demo`: a small payments service end to end.
//!
//! Eight clients create payments. Each payment is one transaction: the business row plus a
//! `PaymentCreated` intent. Every tenth transaction rolls back on purpose (its intent must never
//! leave), and every third payment is captured later in a second transaction
//! (`PaymentCaptured`, version 2, which must arrive after version 1). An in-process relay moves
//! committed intents to the broker; an independent subscriber on the broker records what
//! arrives. The verdict checks: every committed event arrived, nothing rolled back arrived,
//! per-payment order held, the outbox drained.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use outbox::secrets::redact_url as redact;
use outbox_core::broker::{BoxSource, BoxTransport, BrokerSettings, SourceOptions};
use outbox_core::consumer::{ConsumerConfig, ConsumerReport, Handler, HandlerError, OrderingGuard};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::{NewMessage, OutboxStore, Payload};
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_postgres::{PgConsumer, PgOutbox, PgStore, PgStoreConfig, RelayWaker, Schema};
use serde_json::json;
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::Context;
use crate::observer::Seen;

const SCHEMA: &str = "outbox_demo";
const DEFAULT_DB: &str = "postgres://postgres@127.0.0.1:5432/test";
const DEFAULT_BROKER: &str = "nats://127.0.0.1:4222";

/// Options of `outbox demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Payments to create.
    #[arg(long, default_value_t = 2000)]
    payments: u64,
    /// Concurrent producer clients.
    #[arg(long, default_value_t = 8)]
    clients: u64,
    /// Give up waiting for delivery after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
}

#[derive(Default)]
struct Ledger {
    committed: Mutex<HashMap<Uuid, (String, i64)>>,
    messages: Mutex<Vec<NewMessage>>,
    rolled_back: Mutex<HashSet<Uuid>>,
    produced: AtomicU64,
}

/// Runs `outbox demo` and prints its verdict; exit status 1 when a check failed.
pub async fn run(args: DemoArgs, ctx: &Context) -> Result<std::process::ExitCode> {
    let db_url = ctx
        .database_url
        .clone()
        .unwrap_or_else(|| DEFAULT_DB.to_owned());
    let broker_url = ctx
        .broker_url
        .clone()
        .unwrap_or_else(|| DEFAULT_BROKER.to_owned());
    let broker = ctx.brokers.find(&broker_url)?.name;
    println!(
        "outbox demo: {} payments from {} clients",
        args.payments, args.clients
    );
    println!("  database {}", redact(&db_url));
    println!("  broker   {}", redact(&broker_url));

    let pool = crate::connect_db(&db_url).await?;
    let schema = Schema::new(SCHEMA).expect("valid");
    sqlx::query(AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"
    )))
    .execute(&pool)
    .await?;
    outbox_postgres::migrate(&pool, &schema).await?;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {SCHEMA}.payments (id text PRIMARY KEY, amount bigint NOT NULL, \
         status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
    )))
    .execute(&pool)
    .await?;

    // Broker side: a fresh stream / exchange / topic for the demo, and an independent subscriber.
    let kafka_topic = format!("{SCHEMA}.{}", Uuid::now_v7().simple());
    let settings = demo_settings(&ctx.settings, &kafka_topic);
    let nats = if broker == "nats" {
        let client = async_nats::connect(&broker_url)
            .await
            .with_context(|| format!("cannot connect to NATS at {}", redact(&broker_url)))?;
        let js = async_nats::jetstream::new(client.clone());
        let _ = js.delete_stream("OUTBOX_DEMO").await;
        // Also a NATS transport of its own: the replay step publishes without Nats-Msg-Id.
        Some(NatsTransport::connect(&broker_url, settings.section::<NatsConfig>("nats")?).await?)
    } else {
        None
    };
    let transport = Arc::new(
        ctx.brokers
            .connect_transport(&broker_url, &settings)
            .await?,
    );
    let observed = if broker == "kafka" {
        kafka_topic.as_str()
    } else {
        SCHEMA
    };
    let seen = crate::observer::spawn_observer(broker, &broker_url, observed).await?;

    // The reporting consumer: its own table, its inbox, ordering guard on.
    create_report_table(&pool, &schema).await?;
    if broker == "rabbitmq" {
        delete_rabbit_queue(&broker_url, DEMO_QUEUE).await?;
    }
    let source = ctx
        .brokers
        .connect_source(
            &broker_url,
            &settings,
            &SourceOptions {
                consumer: CONSUMER.into(),
            },
        )
        .await?;
    let consumer = PgConsumer::new(
        PgStore::with_schema(pool.clone(), schema.clone()),
        source,
        ReportingHandler::new(&schema),
        ConsumerConfig {
            batch_size: 100,
            batch_wait: Duration::from_millis(200),
            ordering: OrderingGuard::Wait,
            gap_delay: Duration::from_millis(200),
            ..ConsumerConfig::new(CONSUMER)
        },
    )?;
    let consumed: Arc<Mutex<ConsumerReport>> = Arc::default();
    let consumer_stop = CancellationToken::new();
    let consumer_task = tokio::spawn(drive_consumer(
        consumer,
        Arc::clone(&consumed),
        consumer_stop.clone(),
    ));

    // Relay, in process, woken by the producers after their commits.
    let store = Arc::new(PgStore::new(
        pool.clone(),
        PgStoreConfig {
            schema: schema.clone(),
            ..Default::default()
        },
    ));
    let relay = Arc::new(Relay::new(
        Arc::clone(&store),
        Arc::clone(&transport),
        RelayConfig {
            poll_interval: Duration::from_millis(100),
            ..RelayConfig::default()
        },
    )?);
    let shutdown = CancellationToken::new();
    let relay_task = tokio::spawn(Arc::clone(&relay).run(shutdown.clone()));

    let outbox = PgOutbox::new(schema.clone());
    let waker = RelayWaker::spawn(pool.clone(), &outbox, Duration::from_millis(5));
    let ledger = Arc::new(Ledger::default());
    let started = Instant::now();
    let mut clients = Vec::new();
    for c in 0..args.clients {
        let (pool, outbox, waker, ledger) = (
            pool.clone(),
            outbox.clone(),
            waker.clone(),
            Arc::clone(&ledger),
        );
        let n = args.payments;
        let stride = args.clients;
        clients.push(tokio::spawn(async move {
            let mut i = c;
            while i < n {
                produce_one(&pool, &outbox, &ledger, i).await?;
                waker.wake();
                i += stride;
            }
            anyhow::Ok(())
        }));
    }

    // Progress until every committed event was applied by the consumer, or the timeout.
    let deadline = started + Duration::from_secs(args.timeout_secs);
    let mut producers_done = false;
    let mut replayed: Option<Replay> = None;
    // On a terminal a bar of the payments' events applied by the consumer; elsewhere the line
    // every half second, as before.
    let bar = crate::progress::Progress::new(0, "demo");
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !producers_done && clients.iter().all(|c| c.is_finished()) {
            producers_done = true;
            for c in clients.drain(..) {
                c.await??;
            }
        }
        let committed = ledger.committed.lock().unwrap().len();
        let distinct: HashSet<Uuid> = seen.seen().iter().map(|s| s.event_id).collect();
        let pending = store.stats().await.map(|s| s.pending).unwrap_or(-1);
        let c = consumed.lock().unwrap().clone();
        let line = format!(
            "produced {:>5} | committed {:>5} | rolled back {:>4} | on the broker {:>5} | outbox pending {:>5} | consumed {:>5} | duplicates absorbed {:>3}",
            ledger.produced.load(Ordering::Relaxed),
            committed,
            ledger.rolled_back.lock().unwrap().len(),
            distinct.len(),
            pending,
            c.processed,
            c.duplicates
        );
        if bar.is_shown() {
            // The bar counts the consumer's events against the committed ones; the message
            // keeps what else matters short enough for an 80-column terminal.
            bar.set_length(committed as u64);
            bar.set(
                c.processed as u64,
                format!(
                    "dups absorbed {} · broker {} · pending {pending}",
                    c.duplicates,
                    distinct.len()
                ),
            );
        } else {
            println!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64());
        }
        let drained = producers_done
            && pending == 0
            && distinct.len() >= committed
            && c.processed >= committed;
        if drained && replayed.is_none() {
            // What a relay that crashed between the broker's ack and its mark does: publish
            // again, same event ids. The inbox must absorb every copy that reaches it.
            let r = replay(&transport, nats.as_ref(), &ledger).await?;
            bar.println(&format!(
                "replaying {} delivered events as a crashed relay would ({} dropped by the broker's dedup window, {} delivered again)",
                r.sent, r.broker_deduplicated, r.expected_at_consumer
            ));
            replayed = Some(r);
            continue;
        }
        if let Some(r) = &replayed
            && drained
            && c.duplicates >= r.expected_at_consumer
        {
            break;
        }
        if Instant::now() > deadline {
            bar.println(&format!("timed out after {}s", args.timeout_secs));
            break;
        }
    }
    bar.finish();
    tokio::time::sleep(Duration::from_millis(300)).await; // let stray duplicates arrive
    shutdown.cancel();
    relay_task.await?;
    consumer_stop.cancel();
    consumer_task.await?;

    let seen = seen.seen();
    let consumed = consumed.lock().unwrap().clone();
    verdict(
        &pool,
        &ledger,
        &seen,
        &consumed,
        replayed.unwrap_or_default(),
        &schema,
        started.elapsed(),
    )
    .await
}

async fn produce_one(pool: &PgPool, outbox: &PgOutbox, ledger: &Ledger, i: u64) -> Result<()> {
    let id = format!("pay-{i:06}");
    let amount = 100 + (i as i64 % 900);
    let mut tx = pool.begin().await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {SCHEMA}.payments (id, amount, status) VALUES ($1, $2, 'created')"
    )))
    .bind(&id)
    .bind(amount)
    .execute(&mut *tx)
    .await?;
    let v = outbox
        .next_aggregate_version(&mut *tx, "payment", &id)
        .await?;
    let created = NewMessage::new(
        "payment",
        &id,
        v,
        "PaymentCreated",
        Payload::json(&serde_json::json!({"payment_id": id, "amount": amount, "currency": "EUR"}))?,
    );
    outbox.enqueue(&mut *tx, &created).await?;
    ledger.produced.fetch_add(1, Ordering::Relaxed);
    if i % 10 == 9 {
        tx.rollback().await?; // e.g. a failed validation after the write: nothing may leave
        ledger.rolled_back.lock().unwrap().insert(created.event_id);
        return Ok(());
    }
    tx.commit().await?;
    ledger
        .committed
        .lock()
        .unwrap()
        .insert(created.event_id, (id.clone(), v));
    ledger.messages.lock().unwrap().push(created);

    if i.is_multiple_of(3) {
        let mut tx = pool.begin().await?;
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {SCHEMA}.payments SET status = 'captured' WHERE id = $1"
        )))
        .bind(&id)
        .execute(&mut *tx)
        .await?;
        let v = outbox
            .next_aggregate_version(&mut *tx, "payment", &id)
            .await?;
        let captured = NewMessage::new(
            "payment",
            &id,
            v,
            "PaymentCaptured",
            Payload::json(&serde_json::json!({"payment_id": id, "amount": amount}))?,
        );
        outbox.enqueue(&mut *tx, &captured).await?;
        tx.commit().await?;
        ledger.produced.fetch_add(1, Ordering::Relaxed);
        ledger
            .committed
            .lock()
            .unwrap()
            .insert(captured.event_id, (id, v));
        ledger.messages.lock().unwrap().push(captured);
    }
    Ok(())
}

async fn verdict(
    pool: &PgPool,
    ledger: &Ledger,
    seen: &[Seen],
    consumed: &ConsumerReport,
    replayed: Replay,
    schema: &Schema,
    elapsed: Duration,
) -> Result<std::process::ExitCode> {
    let committed = ledger.committed.lock().unwrap().clone();
    let rolled_back = ledger.rolled_back.lock().unwrap().clone();
    let mut first: Vec<&Seen> = Vec::new();
    let mut ids = HashSet::new();
    for s in seen {
        if ids.insert(s.event_id) {
            first.push(s);
        }
    }
    let duplicates = seen.len() - first.len();
    let missing = committed.keys().filter(|id| !ids.contains(id)).count();
    let leaked = rolled_back.iter().filter(|id| ids.contains(id)).count();
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut out_of_order = 0;
    for s in &first {
        let l = last.entry(&s.aggregate_id).or_insert(0);
        if s.version <= *l {
            out_of_order += 1;
        }
        *l = s.version;
    }
    let s = schema.as_str();
    let one = |sql: String| async move {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
            .fetch_one(pool)
            .await
    };
    let rows = one(format!("SELECT count(*) FROM {s}.payments")).await?;
    let pending = one(format!("SELECT count(*) FROM {s}.events")).await?;
    let inbox_rows = one(format!(
        "SELECT count(*) FROM {s}.inbox WHERE consumer_name = '{CONSUMER}' AND outcome = 'applied'"
    ))
    .await?;
    let report_rows = one(format!("SELECT count(*) FROM {s}.payment_report")).await?;
    let effects = one(format!(
        "SELECT coalesce(sum(events_applied), 0)::int8 FROM {s}.payment_report"
    ))
    .await?;
    let orphan_effects = one(format!(
        "SELECT count(*) FROM {s}.payment_report r WHERE NOT EXISTS \
         (SELECT 1 FROM {s}.payments p WHERE p.id = r.payment_id)"
    ))
    .await?;
    let dead = one(format!("SELECT count(*) FROM {s}.consumer_dead_letters")).await?;
    let committed_n = committed.len() as i64;
    println!();
    println!("committed payments (business rows)      {rows}");
    println!("committed events                        {committed_n}");
    println!(
        "rolled-back transactions                {}",
        rolled_back.len()
    );
    println!("events on the broker (distinct)         {}", first.len());
    println!("wire duplicates seen by the subscriber  {duplicates}");
    println!("missing committed events                {missing}");
    println!("rolled-back events that leaked          {leaked}");
    println!("per-payment order violations            {out_of_order}");
    println!("rows left in the outbox                 {pending}");
    println!("consumer: events applied (inbox)        {inbox_rows}");
    println!("consumer: effects in payment_report     {effects} over {report_rows} payments");
    println!("consumer: effects without a payment     {orphan_effects}");
    println!(
        "consumer: replayed {} -> broker dedup {}, inbox absorbed {} (expected {})",
        replayed.sent,
        replayed.broker_deduplicated,
        consumed.duplicates,
        replayed.expected_at_consumer
    );
    println!(
        "consumer: dead letters / conflicts      {dead} / {}",
        consumed.conflicts
    );
    println!(
        "consumer: stale / retried / requeued    {} / {} / {}",
        consumed.stale, consumed.nacked, consumed.requeued_resolved
    );
    println!(
        "elapsed                                 {:.1}s",
        elapsed.as_secs_f64()
    );
    let ok = missing == 0
        && leaked == 0
        && out_of_order == 0
        && pending == 0
        && committed_n > 0
        && inbox_rows == committed_n
        && effects == committed_n
        && report_rows == rows
        && orphan_effects == 0
        && dead == 0
        && consumed.duplicates >= replayed.expected_at_consumer;
    if ok {
        println!(
            "VERDICT: PASS: every committed payment event reached the broker in order and had exactly one effect at the consumer; nothing rolled back leaked; every replay was absorbed"
        );
        Ok(std::process::ExitCode::SUCCESS)
    } else {
        println!("VERDICT: FAIL");
        if committed.is_empty() {
            bail!("no event was committed");
        }
        Ok(std::process::ExitCode::from(1))
    }
}

const CONSUMER: &str = "reporting";
/// The work-item kind of the demo's payouts.
pub const PAYOUT_KIND: &str = "payout";
const DEMO_QUEUE: &str = "outbox_demo.reporting";

/// The demo's stream / exchange and consumer sections over `base` (which keeps its security
/// keys and file overrides).
fn demo_settings(base: &BrokerSettings, kafka_topic: &str) -> BrokerSettings {
    let section = |name: &str, extra: serde_json::Value| {
        let mut v = base.raw_section(name).cloned().unwrap_or_else(|| json!({}));
        if let (Some(obj), serde_json::Value::Object(add)) = (v.as_object_mut(), extra) {
            obj.extend(add);
        }
        v
    };
    let mut s = base.clone();
    s.set_section(
        "nats",
        section(
            "nats",
            json!({
                "stream": "OUTBOX_DEMO",
                "stream_subjects": [format!("{SCHEMA}.>")],
                "subject_template": format!("{SCHEMA}.{{aggregate_type}}.{{event_type}}"),
            }),
        ),
    );
    s.set_section(
        "rabbitmq",
        section("rabbitmq", json!({ "exchange": SCHEMA })),
    );
    s.set_section(
        "nats_consumer",
        section(
            "nats_consumer",
            json!({ "stream": "OUTBOX_DEMO", "durable_name": CONSUMER, "ack_wait_secs": 10 }),
        ),
    );
    s.set_section(
        "rabbitmq_consumer",
        section(
            "rabbitmq_consumer",
            json!({ "queue": DEMO_QUEUE, "bind_exchange": SCHEMA, "binding_key": "#" }),
        ),
    );
    // Kafka: a topic (and group) of this run's own; a topic is not deleted afterwards.
    s.set_section(
        "kafka",
        section("kafka", json!({ "topic_template": kafka_topic })),
    );
    s.set_section(
        "kafka_consumer",
        section(
            "kafka_consumer",
            json!({ "topics": [kafka_topic], "group_id": format!("{CONSUMER}-{kafka_topic}") }),
        ),
    );
    s
}

pub(crate) async fn delete_rabbit_queue(url: &str, queue: &str) -> Result<()> {
    let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let _ = ch
        .queue_delete(queue.into(), lapin::options::QueueDeleteOptions::default())
        .await;
    let _ = conn.close(200, "bye".into()).await;
    Ok(())
}

pub(crate) async fn create_report_table(pool: &PgPool, schema: &Schema) -> Result<()> {
    let s = schema.as_str();
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {s}.payment_report (payment_id text PRIMARY KEY, \
         amount bigint NOT NULL, status text NOT NULL, events_applied integer NOT NULL)"
    )))
    .execute(pool)
    .await?;
    // One row per applied event and deliberately no unique key: a second effect of the same
    // event would be a second row here, which is what the crash matrix counts.
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {s}.effect_log (seq bigserial PRIMARY KEY, \
         consumer_name text NOT NULL, event_id uuid NOT NULL, aggregate_id text NOT NULL, \
         aggregate_version bigint NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )))
    .execute(pool)
    .await?;
    Ok(())
}

/// The reporting consumer's effect: one row per payment, counting the events applied to it, one
/// `effect_log` row per applied event, and (with payouts on) one payout work item per created
/// payment, all in the consumer's inbox transaction.
pub struct ReportingHandler {
    insert: String,
    capture: String,
    log: String,
    consumer: String,
    payouts: Option<outbox_postgres::effects::PgEffects>,
}

impl ReportingHandler {
    /// For the report table in `schema`, consumer `reporting`, without payouts.
    pub fn new(schema: &Schema) -> Self {
        Self::with_payouts(schema, CONSUMER, false)
    }

    /// For consumer `consumer`; with `payouts`, each `PaymentCreated` also writes a payout work
    /// item whose idempotency key is derived from the consumer and the event.
    pub fn with_payouts(schema: &Schema, consumer: &str, payouts: bool) -> Self {
        let t = format!("{}.payment_report", schema.as_str());
        Self {
            insert: format!(
                "INSERT INTO {t} (payment_id, amount, status, events_applied) VALUES ($1, $2, 'created', 1)"
            ),
            capture: format!(
                "UPDATE {t} SET status = 'captured', events_applied = events_applied + 1 WHERE payment_id = $1"
            ),
            log: format!(
                "INSERT INTO {}.effect_log (consumer_name, event_id, aggregate_id, aggregate_version) \
                 VALUES ($1, $2, $3, $4)",
                schema.as_str()
            ),
            consumer: consumer.to_owned(),
            payouts: payouts.then(|| outbox_postgres::effects::PgEffects::new(schema.clone())),
        }
    }
}

impl Handler<sqlx::PgConnection> for ReportingHandler {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &outbox_core::IncomingEvent,
    ) -> Result<(), HandlerError> {
        if event.schema_version != 1 {
            return Err(HandlerError::Permanent(format!(
                "unknown schema version {} of {}",
                event.schema_version, event.event_type
            )));
        }
        let body: serde_json::Value = serde_json::from_slice(&event.payload.bytes)
            .map_err(|e| HandlerError::Permanent(format!("payload is not JSON: {e}")))?;
        let amount = body["amount"].as_i64().unwrap_or(0);
        match event.event_type.as_str() {
            "PaymentCreated" => {
                sqlx::query(AssertSqlSafe(self.insert.clone()))
                    .bind(&event.aggregate_id)
                    .bind(amount)
                    .execute(&mut *tx)
                    .await?;
                if let Some(effects) = &self.payouts {
                    use outbox_postgres::effects::{NewWorkItem, idempotency_key};
                    let item = NewWorkItem {
                        kind: PAYOUT_KIND.into(),
                        idempotency_key: idempotency_key(
                            PAYOUT_KIND,
                            &self.consumer,
                            event.event_id,
                        ),
                        payload: serde_json::json!({
                            "reference": event.aggregate_id,
                            "amount": amount,
                            "beneficiary": format!("merchant-of-{}", event.aggregate_id),
                        }),
                        event_id: Some(event.event_id),
                        consumer_name: Some(self.consumer.clone()),
                    };
                    effects
                        .enqueue(&mut *tx, &item)
                        .await
                        .map_err(|e| HandlerError::Transient(format!("payout work item: {e}")))?;
                }
            }
            "PaymentCaptured" => {
                let n = sqlx::query(AssertSqlSafe(self.capture.clone()))
                    .bind(&event.aggregate_id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                if n == 0 {
                    return Err(HandlerError::Transient(
                        "PaymentCaptured before PaymentCreated was applied".into(),
                    ));
                }
            }
            other => {
                return Err(HandlerError::Permanent(format!(
                    "unknown event type {other}"
                )));
            }
        }
        sqlx::query(AssertSqlSafe(self.log.clone()))
            .bind(&self.consumer)
            .bind(event.event_id)
            .bind(&event.aggregate_id)
            .bind(event.aggregate_version)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

async fn drive_consumer(
    mut consumer: PgConsumer<BoxSource, ReportingHandler>,
    totals: Arc<Mutex<ConsumerReport>>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        match consumer.run_batch().await {
            Ok(r) => {
                *totals.lock().unwrap() += &r;
            }
            Err(e) => {
                tracing::warn!(error = %e, "demo consumer error; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// What the replay step sent and what should reach the consumer.
#[derive(Debug, Default, Clone, Copy)]
struct Replay {
    sent: usize,
    broker_deduplicated: usize,
    expected_at_consumer: usize,
}

/// Republishes up to 50 delivered events with the relay's transport (same event ids, same
/// bytes). On NATS the stream's duplicate window drops them, so the demo also sends 20 copies
/// without a `Nats-Msg-Id`, as a republish after the window would arrive.
async fn replay(
    transport: &BoxTransport,
    nats: Option<&NatsTransport>,
    ledger: &Ledger,
) -> Result<Replay> {
    use outbox_core::Transport;
    let messages: Vec<NewMessage> = ledger
        .messages
        .lock()
        .unwrap()
        .iter()
        .take(50)
        .cloned()
        .collect();
    let mut r = Replay::default();
    let mut out = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let msg = outbox_core::OutboxMessage {
            id: i as i64,
            event_id: m.event_id,
            aggregate_type: m.aggregate_type.clone(),
            aggregate_id: m.aggregate_id.clone(),
            aggregate_version: m.aggregate_version,
            event_type: m.event_type.clone(),
            schema_version: m.schema_version,
            payload: m.payload.clone(),
            fingerprint: m.payload.fingerprint(),
            headers: m.headers.clone(),
            destination: m.destination.clone(),
            partition_key: m.partition_key.clone(),
            created_at: chrono::Utc::now(),
            attempts: 0,
        };
        let receipt = transport.publish(&msg).await?;
        r.sent += 1;
        if receipt.duplicate {
            r.broker_deduplicated += 1;
        } else {
            r.expected_at_consumer += 1;
        }
        out.push(msg);
    }
    if let Some(t) = nats {
        for msg in out.iter().take(20) {
            let subject = t.subject_for(msg)?;
            let mut headers = async_nats::HeaderMap::new();
            for (k, v) in t.headers_for(msg)? {
                if !k.eq_ignore_ascii_case("Nats-Msg-Id") {
                    headers.insert(k.as_str(), v.as_str());
                }
            }
            let js = async_nats::jetstream::new(t.client().clone());
            js.publish_with_headers(subject, headers, msg.payload.bytes.clone())
                .await?
                .await?;
            r.sent += 1;
            r.expected_at_consumer += 1;
        }
    }
    Ok(r)
}

/// Options of `outbox demo-consumer`.
#[derive(clap::Args, Debug)]
pub struct ConsumerArgs {
    /// Consumer name (the inbox key is (name, event_id)).
    #[arg(long, default_value = CONSUMER)]
    name: String,
    /// NATS: stream to consume.
    #[arg(long, default_value = "OUTBOX")]
    nats_stream: String,
    /// NATS: durable consumer name (defaults to --name).
    #[arg(long)]
    nats_durable: Option<String>,
    /// NATS: seconds before an unacknowledged delivery is redelivered.
    #[arg(long, default_value_t = 5)]
    ack_wait_secs: u64,
    /// RabbitMQ: queue to consume (declared, durable).
    #[arg(long, default_value = "outbox-consumer")]
    rabbit_queue: String,
    /// RabbitMQ: exchange to bind the queue to with `#`.
    #[arg(long, default_value = "outbox")]
    rabbit_exchange: String,
    /// Kafka: topic to consume (a leading `^` makes it a pattern).
    #[arg(long, default_value = r"^outbox\..*")]
    kafka_topic: String,
    /// Kafka: consumer group (defaults to --name).
    #[arg(long)]
    kafka_group: Option<String>,
    /// Deliveries per transaction.
    #[arg(long, default_value_t = 1)]
    batch_size: usize,
    /// Ordering guard: off, wait or apply_anyway.
    #[arg(long, default_value = "off")]
    ordering: String,
    /// Also write one payout work item per created payment (executed by `outbox effects run`).
    #[arg(long)]
    payouts: bool,
}

/// Test-only: with this variable set to `1`, `outbox demo-consumer` acknowledges every delivery
/// as soon as it arrives, before its transaction commits. It exists so that the crash matrix can
/// prove it notices a broken consumer (guarantee G6); never set it anywhere else.
pub const ACK_BEFORE_COMMIT_ENV: &str = "OUTBOX_TEST_ACK_BEFORE_COMMIT";

/// Runs the reporting consumer until `shutdown`.
pub async fn run_consumer(
    args: ConsumerArgs,
    pool: PgPool,
    schema: Schema,
    broker_url: &str,
    ctx: &Context,
    shutdown: CancellationToken,
) -> Result<()> {
    let ordering = match args.ordering.as_str() {
        "off" => OrderingGuard::Off,
        "wait" => OrderingGuard::Wait,
        "apply_anyway" => OrderingGuard::ApplyAnyway,
        other => {
            bail!("invalid configuration `ordering`: `{other}` is not off, wait or apply_anyway")
        }
    };
    outbox_postgres::check_schema(&pool, &schema).await?;
    create_report_table(&pool, &schema).await?;
    let mut settings = ctx.settings.clone();
    // The options given here over each consumer section of the config file (whose other keys,
    // TLS or librdkafka properties for instance, stay as they are).
    let over = |settings: &mut BrokerSettings, name: &str, keys: serde_json::Value| {
        let mut section = settings
            .raw_section(name)
            .cloned()
            .unwrap_or_else(|| json!({}));
        if let (Some(section), Some(keys)) = (section.as_object_mut(), keys.as_object()) {
            section.extend(keys.clone());
        }
        settings.set_section(name, section);
    };
    over(
        &mut settings,
        "nats_consumer",
        json!({
            "stream": args.nats_stream,
            "durable_name": args.nats_durable.clone().unwrap_or_else(|| args.name.clone()),
            "ack_wait_secs": args.ack_wait_secs,
        }),
    );
    over(
        &mut settings,
        "rabbitmq_consumer",
        json!({
            "queue": args.rabbit_queue,
            "bind_exchange": args.rabbit_exchange,
            "binding_key": "#",
        }),
    );
    over(
        &mut settings,
        "kafka_consumer",
        json!({
            "topics": [args.kafka_topic],
            "group_id": args.kafka_group.clone().unwrap_or_else(|| args.name.clone()),
        }),
    );
    let source = ctx
        .brokers
        .connect_source(
            broker_url,
            &settings,
            &SourceOptions {
                consumer: args.name.clone(),
            },
        )
        .await?;
    let handler = ReportingHandler::with_payouts(&schema, &args.name, args.payouts);
    let config = ConsumerConfig {
        batch_size: args.batch_size,
        ordering,
        gap_delay: Duration::from_millis(200),
        ..ConsumerConfig::new(args.name.clone())
    };
    tracing::info!(consumer = %args.name, broker = %redact(broker_url), "consumer started");
    // The engine's counts are logged as the process stops: the crash tests read how many
    // redeliveries the inbox absorbed.
    let stats = if std::env::var(ACK_BEFORE_COMMIT_ENV).is_ok_and(|v| v == "1") {
        tracing::warn!(
            "{ACK_BEFORE_COMMIT_ENV}=1: acknowledging before commit (broken on purpose)"
        );
        let source = crate::ack_first::AckFirstSource(source);
        let consumer =
            PgConsumer::new(PgStore::with_schema(pool, schema), source, handler, config)?;
        let stats = consumer.stats();
        consumer.run(shutdown).await;
        stats
    } else {
        let consumer =
            PgConsumer::new(PgStore::with_schema(pool, schema), source, handler, config)?;
        let stats = consumer.stats();
        consumer.run(shutdown).await;
        stats
    };
    let counts = stats.snapshot();
    tracing::info!(
        received = counts.received,
        processed = counts.processed,
        duplicates = counts.duplicates,
        stale = counts.stale,
        dead_lettered = counts.dead_lettered,
        "consumer stopped"
    );
    Ok(())
}
