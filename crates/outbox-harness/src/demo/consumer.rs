//! The demo's reporting consumer: its tables, its handler (report, effect log, payout work
//! items), and `outbox demo-consumer`, the consumer as its own process.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use outbox::secrets::redact_url as redact;
use outbox_core::broker::{BoxSource, BrokerSettings, SourceOptions};
use outbox_core::consumer::{ConsumerConfig, ConsumerReport, Handler, HandlerError, OrderingGuard};
use outbox_postgres::{PgConsumer, PgStore, Schema};
use serde_json::json;
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;

use super::{CONSUMER, LOG_TARGET, PAYOUT_KIND};
use crate::Context;

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

pub(super) async fn drive_consumer(
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
                tracing::warn!(target: LOG_TARGET, error = %e, "demo consumer error; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
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
    tracing::info!(target: LOG_TARGET, consumer = %args.name, broker = %redact(broker_url), "consumer started");
    // The engine's counts are logged as the process stops: the crash tests read how many
    // redeliveries the inbox absorbed.
    let stats = if std::env::var(ACK_BEFORE_COMMIT_ENV).is_ok_and(|v| v == "1") {
        tracing::warn!(
            target: LOG_TARGET,
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
        target: LOG_TARGET,
        received = counts.received,
        processed = counts.processed,
        duplicates = counts.duplicates,
        stale = counts.stale,
        dead_lettered = counts.dead_lettered,
        "consumer stopped"
    );
    Ok(())
}
