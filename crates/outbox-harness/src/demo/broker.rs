//! The demo's broker side: its stream / exchange / topic and consumer sections, and the
//! broker connections of the relay and the replay step.

use anyhow::{Context as _, Result};
use outbox::secrets::redact_url as redact;
use outbox_core::broker::{BoxTransport, BrokerSettings};
use outbox_nats::{NatsConfig, NatsTransport};
use serde_json::json;

use super::{CONSUMER, DEMO_QUEUE, SCHEMA};
use crate::Context;

/// Connects the relay's transport over `settings`. On NATS the demo's stream of a previous run
/// is deleted first, and a NATS transport of the demo's own is connected too: the replay step
/// publishes without Nats-Msg-Id.
pub(super) async fn connect_broker(
    ctx: &Context,
    broker: &str,
    broker_url: &str,
    settings: &BrokerSettings,
) -> Result<(Option<NatsTransport>, BoxTransport)> {
    let nats = if broker == "nats" {
        let client = async_nats::connect(broker_url)
            .await
            .with_context(|| format!("cannot connect to NATS at {}", redact(broker_url)))?;
        let js = async_nats::jetstream::new(client.clone());
        let _ = js.delete_stream("OUTBOX_DEMO").await;
        // Also a NATS transport of its own: the replay step publishes without Nats-Msg-Id.
        Some(NatsTransport::connect(broker_url, settings.section::<NatsConfig>("nats")?).await?)
    } else {
        None
    };
    let transport = ctx.brokers.connect_transport(broker_url, settings).await?;
    Ok((nats, transport))
}

/// The demo's stream / exchange and consumer sections over `base` (which keeps its security
/// keys and file overrides).
pub(super) fn demo_settings(base: &BrokerSettings, kafka_topic: &str) -> BrokerSettings {
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
