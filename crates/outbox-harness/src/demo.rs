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

use anyhow::Result;
use outbox::secrets::redact_url as redact;
use outbox_core::broker::{BoxTransport, BrokerSettings, SourceOptions};
use outbox_core::consumer::{ConsumerConfig, ConsumerReport, OrderingGuard};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::{NewMessage, OutboxStore, Payload};
use outbox_nats::NatsTransport;
use outbox_postgres::{PgConsumer, PgOutbox, PgStore, PgStoreConfig, RelayWaker, Schema};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::Context;
use crate::observer::Observer;

mod broker;
mod consumer;
mod verdict;

pub(crate) use broker::delete_rabbit_queue;
pub(crate) use consumer::create_report_table;
pub use consumer::{ACK_BEFORE_COMMIT_ENV, ConsumerArgs, ReportingHandler, run_consumer};

use broker::{connect_broker, demo_settings};
use consumer::drive_consumer;
use verdict::{Replay, replay, verdict};

const SCHEMA: &str = "outbox_demo";
const CONSUMER: &str = "reporting";
/// The work-item kind of the demo's payouts.
pub const PAYOUT_KIND: &str = "payout";
const DEMO_QUEUE: &str = "outbox_demo.reporting";
/// The log target of the demo's own log lines (those of its submodules too).
const LOG_TARGET: &str = "outbox_harness::demo";

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
    let db_url = ctx.database_url_or_local();
    let broker_url = ctx.broker_url_or_local();
    let broker = ctx.brokers.find(&broker_url)?.name;
    println!(
        "outbox demo: {} payments from {} clients",
        args.payments, args.clients
    );
    println!("  database {}", redact(&db_url));
    println!("  broker   {}", redact(&broker_url));

    let (pool, schema) = prepare_database(&db_url).await?;

    // Broker side: a fresh stream / exchange / topic for the demo, and an independent subscriber.
    let kafka_topic = format!("{SCHEMA}.{}", Uuid::now_v7().simple());
    let settings = demo_settings(&ctx.settings, &kafka_topic);
    let (nats, transport) = connect_broker(ctx, broker, &broker_url, &settings).await?;
    let transport = Arc::new(transport);
    let observed = if broker == "kafka" {
        kafka_topic.as_str()
    } else {
        SCHEMA
    };
    let seen = crate::observer::spawn_observer(broker, &broker_url, observed).await?;

    // The reporting consumer: its own table, its inbox, ordering guard on.
    let consumer = start_consumer(ctx, &pool, &schema, broker, &broker_url, &settings).await?;

    // Relay, in process, woken by the producers after their commits.
    let (store, shutdown, relay_task) = start_relay(&pool, &schema, &transport)?;

    let outbox = PgOutbox::new(schema.clone());
    let waker = RelayWaker::spawn(pool.clone(), &outbox, Duration::from_millis(5));
    let ledger = Arc::new(Ledger::default());
    let started = Instant::now();
    let clients = spawn_clients(&args, &pool, &outbox, &waker, &ledger);

    let watched = Watched {
        ledger: &ledger,
        seen: &seen,
        store: &store,
        consumed: &consumer.consumed,
        transport: &transport,
        nats: nats.as_ref(),
    };
    let replayed = watch(&args, started, clients, &watched).await?;
    tokio::time::sleep(Duration::from_millis(300)).await; // let stray duplicates arrive
    shutdown.cancel();
    relay_task.await?;
    consumer.stop.cancel();
    consumer.task.await?;

    let seen = seen.seen();
    let consumed = consumer.consumed.lock().unwrap().clone();
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

/// Connects the demo's pool and gives it a fresh schema with the payments table.
async fn prepare_database(db_url: &str) -> Result<(PgPool, Schema)> {
    let pool = crate::connect_db(db_url).await?;
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
    Ok((pool, schema))
}

/// The in-process reporting consumer, running until `stop`.
struct RunningConsumer {
    consumed: Arc<Mutex<ConsumerReport>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Creates the report tables and starts the reporting consumer (inbox, ordering guard on).
async fn start_consumer(
    ctx: &Context,
    pool: &PgPool,
    schema: &Schema,
    broker: &str,
    broker_url: &str,
    settings: &BrokerSettings,
) -> Result<RunningConsumer> {
    create_report_table(pool, schema).await?;
    if broker == "rabbitmq" {
        delete_rabbit_queue(broker_url, DEMO_QUEUE).await?;
    }
    let source = ctx
        .brokers
        .connect_source(
            broker_url,
            settings,
            &SourceOptions {
                consumer: CONSUMER.into(),
            },
        )
        .await?;
    let consumer = PgConsumer::new(
        PgStore::with_schema(pool.clone(), schema.clone()),
        source,
        ReportingHandler::new(schema),
        ConsumerConfig {
            batch_size: 100,
            batch_wait: Duration::from_millis(200),
            ordering: OrderingGuard::Wait,
            gap_delay: Duration::from_millis(200),
            ..ConsumerConfig::new(CONSUMER)
        },
    )?;
    let consumed: Arc<Mutex<ConsumerReport>> = Arc::default();
    let stop = CancellationToken::new();
    let task = tokio::spawn(drive_consumer(
        consumer,
        Arc::clone(&consumed),
        stop.clone(),
    ));
    Ok(RunningConsumer {
        consumed,
        stop,
        task,
    })
}

/// Starts the in-process relay over `transport`; it runs until the returned token is
/// cancelled.
fn start_relay(
    pool: &PgPool,
    schema: &Schema,
    transport: &Arc<BoxTransport>,
) -> Result<(Arc<PgStore>, CancellationToken, JoinHandle<()>)> {
    let store = Arc::new(PgStore::new(
        pool.clone(),
        PgStoreConfig {
            schema: schema.clone(),
            ..Default::default()
        },
    ));
    let relay = Arc::new(Relay::new(
        Arc::clone(&store),
        Arc::clone(transport),
        RelayConfig {
            poll_interval: Duration::from_millis(100),
            ..RelayConfig::default()
        },
    )?);
    let shutdown = CancellationToken::new();
    let relay_task = tokio::spawn(Arc::clone(&relay).run(shutdown.clone()));
    Ok((store, shutdown, relay_task))
}

/// Starts `--clients` producers; client `c` creates payments `c`, `c + clients`, … and wakes
/// the relay after each.
fn spawn_clients(
    args: &DemoArgs,
    pool: &PgPool,
    outbox: &PgOutbox,
    waker: &RelayWaker,
    ledger: &Arc<Ledger>,
) -> Vec<JoinHandle<Result<()>>> {
    let mut clients = Vec::new();
    for c in 0..args.clients {
        let (pool, outbox, waker, ledger) = (
            pool.clone(),
            outbox.clone(),
            waker.clone(),
            Arc::clone(ledger),
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
    clients
}

/// What the progress loop reads: the producers' ledger, the independent subscriber, the
/// outbox, the consumer's counts, and the transports the replay step publishes with.
struct Watched<'a> {
    ledger: &'a Ledger,
    seen: &'a Observer,
    store: &'a PgStore,
    consumed: &'a Mutex<ConsumerReport>,
    transport: &'a BoxTransport,
    nats: Option<&'a NatsTransport>,
}

/// Shows the progress every half second until every committed event was applied by the
/// consumer and the replay was absorbed, or the timeout. Answers the replay step's counts.
async fn watch(
    args: &DemoArgs,
    started: Instant,
    mut clients: Vec<JoinHandle<Result<()>>>,
    w: &Watched<'_>,
) -> Result<Option<Replay>> {
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
        let committed = w.ledger.committed.lock().unwrap().len();
        let distinct: HashSet<Uuid> = w.seen.seen().iter().map(|s| s.event_id).collect();
        let pending = w.store.stats().await.map(|s| s.pending).unwrap_or(-1);
        let c = w.consumed.lock().unwrap().clone();
        show_progress(
            &bar,
            started,
            w.ledger,
            committed,
            distinct.len(),
            pending,
            &c,
        );
        let drained = producers_done
            && pending == 0
            && distinct.len() >= committed
            && c.processed >= committed;
        if drained && replayed.is_none() {
            // What a relay that crashed between the broker's ack and its mark does: publish
            // again, same event ids. The inbox must absorb every copy that reaches it.
            let r = replay(w.transport, w.nats, w.ledger).await?;
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
    Ok(replayed)
}

/// One progress step: the bar on a terminal, else a line.
fn show_progress(
    bar: &crate::progress::Progress,
    started: Instant,
    ledger: &Ledger,
    committed: usize,
    distinct: usize,
    pending: i64,
    c: &ConsumerReport,
) {
    let line = format!(
        "produced {:>5} | committed {:>5} | rolled back {:>4} | on the broker {:>5} | outbox pending {:>5} | consumed {:>5} | duplicates absorbed {:>3}",
        ledger.produced.load(Ordering::Relaxed),
        committed,
        ledger.rolled_back.lock().unwrap().len(),
        distinct,
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
                c.duplicates, distinct
            ),
        );
    } else {
        println!("[{:>5.1}s] {line}", started.elapsed().as_secs_f64());
    }
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
