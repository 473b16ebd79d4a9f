//! The environment of a run: the URLs, the schema, stream / exchange / topic names, the
//! processes' configuration, and resetting all of it between cells.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use outbox::secrets::redact_url as redact;
use outbox_core::broker::{BrokerSettings, Registry, SourceOptions};
use outbox_postgres::Schema;
use serde_json::json;
use sqlx::{AssertSqlSafe, PgPool};

use super::{CONSUMER, RELAY_LEASE_SECS, RelayMode};

pub(super) struct Env {
    pub(super) db_url: String,
    pub(super) broker_url: String,
    pub(super) broker: &'static str,
    pub(super) prefix: String,
    pub(super) schema: Schema,
    pub(super) log_dir: PathBuf,
    pub(super) exe: PathBuf,
    pub(super) pool: PgPool,
    pub(super) break_ack: bool,
    pub(super) brokers: Registry,
    pub(super) settings: BrokerSettings,
    /// Counts resets. Kafka: every cell has a topic and a consumer group of its own (a topic is
    /// not deleted: the test broker cannot take that while a consumer may still subscribe).
    pub(super) cell: std::sync::atomic::AtomicU64,
    /// This run's id, in its Kafka topic names: runs with the same prefix never share a topic.
    pub(super) run: String,
    /// The relays run in CDC mode, on a slot and publication named after the schema.
    pub(super) cdc: bool,
}

impl Env {
    pub(super) fn relay_name(&self) -> &'static str {
        if self.cdc {
            RelayMode::Cdc.name()
        } else {
            RelayMode::Polling.name()
        }
    }

    /// Drops the CDC slot and publication of this prefix, if there are any (ending a relay
    /// that still streams it).
    pub(super) async fn remove_slot(&self) -> Result<()> {
        let name = self.schema.as_str();
        outbox_postgres::cdc::remove(&self.pool, name, name, Duration::from_secs(10))
            .await
            .with_context(|| format!("cannot drop the replication slot `{name}`"))
    }

    /// The current cell's Kafka topic.
    pub(super) fn kafka_topic(&self) -> String {
        format!(
            "{}.{}.c{}",
            self.prefix,
            self.run,
            self.cell.load(std::sync::atomic::Ordering::SeqCst)
        )
    }
    /// The current cell's Kafka consumer group.
    pub(super) fn kafka_group(&self) -> String {
        format!("{CONSUMER}-{}", self.kafka_topic())
    }
    /// What the observer watches: the Kafka topic, or the prefix of the stream / exchange.
    pub(super) fn observed(&self) -> String {
        if self.broker == "kafka" {
            self.kafka_topic()
        } else {
            self.prefix.clone()
        }
    }
    pub(super) fn stream(&self) -> String {
        self.prefix.to_ascii_uppercase()
    }
    pub(super) fn queue(&self) -> String {
        format!("{}.{CONSUMER}", self.prefix)
    }
    /// The cell's stream / exchange and consumer queue over the given settings.
    fn settings(&self) -> BrokerSettings {
        let mut s = self.settings.clone();
        let p = &self.prefix;
        s.set_section(
            "nats",
            json!({
                "stream": self.stream(),
                "stream_subjects": [format!("{p}.>")],
                "subject_template": format!("{p}.{{aggregate_type}}.{{event_type}}"),
            }),
        );
        s.set_section("rabbitmq", json!({ "exchange": p }));
        s.set_section(
            "rabbitmq_consumer",
            json!({ "queue": self.queue(), "bind_exchange": p, "binding_key": "#" }),
        );
        s.set_section(
            "kafka",
            json!({ "topic_template": self.kafka_topic(), "delivery_timeout_secs": 1 }),
        );
        s.set_section(
            "kafka_consumer",
            json!({ "topics": [self.kafka_topic()], "group_id": self.kafka_group() }),
        );
        s
    }
    /// The processes' config file. One relay worker: a crash point freezes or kills the whole
    /// process, and a second worker caught in the middle of its claim transaction would hold
    /// row locks through a freeze (the lease cell then saw the other relay claim nothing).
    fn config_toml(&self) -> String {
        format!(
            "[relay]\nlease_secs = {RELAY_LEASE_SECS}\npublish_timeout_secs = 1.0\n\
             lease_safety_margin_secs = 0.5\npoll_interval_ms = 100\nbatch_size = 50\n\
             workers = 1\nmode = \"{mode}\"\n\n\
             [nats]\nstream = \"{stream}\"\nstream_subjects = [\"{p}.>\"]\n\
             subject_template = \"{p}.{{aggregate_type}}.{{event_type}}\"\n\n\
             [rabbitmq]\nexchange = \"{p}\"\n\n\
             [kafka]\ntopic_template = \"{topic}\"\ndelivery_timeout_secs = 1\n\n\
             [kafka_consumer.properties]\n\"session.timeout.ms\" = \"6000\"\n\
             \"heartbeat.interval.ms\" = \"1000\"\n",
            stream = self.stream(),
            p = self.prefix,
            topic = self.kafka_topic(),
            mode = if self.cdc { "cdc" } else { "polling" },
        )
    }

    /// Drops everything of the previous cell and sets up the schema, stream / exchange.
    pub(super) async fn reset(&self) -> Result<()> {
        let s = self.schema.as_str();
        // The previous cell's slot (its relays are gone) or a CDC run's of the same prefix.
        self.remove_slot().await?;
        sqlx::query(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {s} CASCADE")))
            .execute(&self.pool)
            .await?;
        outbox_postgres::migrate(&self.pool, &self.schema).await?;
        if self.cdc {
            // The slot before any event: everything the producer commits is streamed.
            outbox_postgres::cdc::ensure_publication(&self.pool, &self.schema, s).await?;
            outbox_postgres::cdc::create_slot(&self.pool, s).await?;
        }
        crate::workload::create_payments_table(&self.pool, &self.schema).await?;
        crate::demo::create_report_table(&self.pool, &self.schema).await?;
        self.cell.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if self.broker == "kafka" {
            // A fresh topic and group (kafka_topic): nothing of the previous cell to drop.
        } else if self.broker == "nats" {
            let client = async_nats::connect(&self.broker_url)
                .await
                .with_context(|| {
                    format!("cannot connect to NATS at {}", redact(&self.broker_url))
                })?;
            let js = async_nats::jetstream::new(client);
            let _ = js.delete_stream(self.stream()).await;
        } else {
            crate::demo::delete_rabbit_queue(&self.broker_url, &self.queue()).await?;
        }
        // Declares the stream (NATS) or the exchange (RabbitMQ) before any process starts.
        let _ = self
            .brokers
            .connect_transport(&self.broker_url, &self.settings())
            .await?;
        if self.broker == "rabbitmq" {
            // The consumer's queue must be bound before the first publish, as in any deployment:
            // a message routed only to the observer's queue would never reach the consumer.
            let _ = self
                .brokers
                .connect_source(
                    &self.broker_url,
                    &self.settings(),
                    &SourceOptions {
                        consumer: CONSUMER.into(),
                    },
                )
                .await?;
        }
        std::fs::write(self.log_dir.join("outbox.toml"), self.config_toml())?;
        Ok(())
    }

    /// Messages the consumer has not settled yet, as the broker counts them.
    pub(super) async fn broker_backlog(&self) -> Result<u64> {
        if self.broker == "kafka" {
            return crate::observer::kafka_group_lag(
                &self.broker_url,
                &self.kafka_topic(),
                &self.kafka_group(),
            )
            .await;
        }
        if self.broker == "nats" {
            let client = async_nats::connect(&self.broker_url).await?;
            let js = async_nats::jetstream::new(client);
            let stream = js
                .get_stream(self.stream())
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            let info = match stream.consumer_info(CONSUMER).await {
                Ok(i) => i.clone(),
                // Not created yet: the consumer process has not started its subscription.
                Err(_) => return Ok(u64::MAX),
            };
            Ok(info.num_pending + info.num_ack_pending as u64)
        } else {
            let conn = lapin::Connection::connect(
                &self.broker_url,
                lapin::ConnectionProperties::default(),
            )
            .await?;
            let ch = conn.create_channel().await?;
            let q = ch
                .queue_declare(
                    self.queue().as_str().into(),
                    lapin::options::QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    lapin::types::FieldTable::default(),
                )
                .await;
            let n = match q {
                Ok(q) => u64::from(q.message_count()),
                Err(_) => u64::MAX,
            };
            let _ = conn.close(200, "bye".into()).await;
            Ok(n)
        }
    }
}
