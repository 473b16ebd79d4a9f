//! The independent subscriber of the demo and the crash matrix: it records every message the
//! broker routes for a prefix, duplicates included, straight from the wire (NATS core
//! subscription on `<prefix>.>`, an exclusive RabbitMQ queue bound to exchange `<prefix>`, or
//! every partition of Kafka topic `<prefix>` from its start: the tools make a fresh topic for
//! every run and cell),
//! without any of the toolkit's consumer machinery.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// One message as an independent subscriber saw it on the broker.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_id: String,
    pub(crate) version: i64,
}

pub(crate) fn parse_ce(get: impl Fn(&str) -> Option<String>, prefix: &str) -> Option<Seen> {
    Some(Seen {
        event_id: get(&format!("{prefix}id"))?.parse().ok()?,
        aggregate_id: get(&format!("{prefix}aggregateid"))?,
        version: get(&format!("{prefix}aggregateversion"))?.parse().ok()?,
    })
}

/// A running independent subscriber; stops when dropped.
pub(crate) struct Observer {
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: CancellationToken,
}

impl Observer {
    /// Everything seen so far, in arrival order.
    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the independent subscriber: every message the broker routes for `prefix`, duplicates
/// included. It reconnects by itself (RabbitMQ: a new exclusive queue) after a broker restart.
/// For RabbitMQ the exchange `prefix` must exist.
///
/// `broker` is the registry name of the broker serving `broker_url` (`nats` or `rabbitmq`).
///
/// # Errors
/// The broker has no observer here, cannot be reached, or (RabbitMQ) the queue cannot be
/// declared and bound within 10 s.
pub(crate) async fn spawn_observer(
    broker: &str,
    broker_url: &str,
    prefix: &str,
) -> Result<Observer> {
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let stop = CancellationToken::new();
    if !matches!(broker, "nats" | "rabbitmq" | "kafka") {
        bail!("the test tools observe NATS, RabbitMQ and Kafka only, not {broker}");
    }
    if broker == "kafka" {
        kafka_observe(broker_url, prefix, &seen, &stop).await?;
    } else if broker == "nats" {
        let client = async_nats::connect(broker_url).await?;
        let mut sub = client.subscribe(format!("{prefix}.>")).await?;
        client.flush().await?;
        let seen2 = Arc::clone(&seen);
        let stop2 = stop.clone();
        tokio::spawn(async move {
            let _keep = client;
            loop {
                let m = tokio::select! {
                    m = sub.next() => m,
                    () = stop2.cancelled() => None,
                };
                let Some(m) = m else { break };
                if let Some(s) = m
                    .headers
                    .as_ref()
                    .and_then(|h| parse_ce(|k| h.get(k).map(|v| v.as_str().to_owned()), "ce-"))
                {
                    seen2.lock().unwrap().push(s);
                }
            }
        });
    } else {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let url = broker_url.to_owned();
        let exchange = prefix.to_owned();
        let seen2 = Arc::clone(&seen);
        let stop2 = stop.clone();
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            while !stop2.is_cancelled() {
                tokio::select! {
                    r = rabbit_observe(&url, &exchange, &seen2, &mut ready) => {
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "observer lost RabbitMQ; reconnecting");
                        }
                    }
                    () = stop2.cancelled() => break,
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        tokio::time::timeout(Duration::from_secs(10), ready_rx)
            .await
            .context("the RabbitMQ observer did not start within 10 s")??;
    }
    Ok(Observer { seen, stop })
}

/// Partitions of the Kafka topics the test tools make: several, so keys really spread.
pub(crate) const KAFKA_PARTITIONS: i32 = 4;

/// Reads every partition of topic `topic` from its start, on a thread of its own, until
/// `stop`; librdkafka reconnects by itself.
async fn kafka_observe(
    url: &str,
    topic: &str,
    seen: &Arc<Mutex<Vec<Seen>>>,
    stop: &CancellationToken,
) -> Result<()> {
    use outbox_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use outbox_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
    use outbox_kafka::rdkafka::error::RDKafkaErrorCode;
    use outbox_kafka::rdkafka::message::{Headers as _, Message as _};
    use outbox_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
    let mut config = outbox_kafka::rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", outbox_kafka::bootstrap_servers(url)?)
        .set(
            "group.id",
            format!("outbox-observer-{}", Uuid::now_v7().simple()),
        )
        .set("enable.auto.commit", "false");
    // The topic is made here (4 partitions) when missing: the relay creates it only at its first
    // publish, and the observer must read it from the first event on.
    let admin: AdminClient<_> = config.create()?;
    let created = admin
        .create_topics(
            [&NewTopic::new(
                topic,
                KAFKA_PARTITIONS,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await?;
    for result in created {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => bail!("cannot create Kafka topic {t}: {e}"),
        }
    }
    let consumer: BaseConsumer = config.create()?;
    let topic = topic.to_owned();
    let consumer = tokio::task::spawn_blocking(move || -> Result<BaseConsumer> {
        let metadata = consumer.fetch_metadata(Some(&topic), Duration::from_secs(10))?;
        let partitions = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len())
            .filter(|n| *n > 0)
            .with_context(|| format!("Kafka topic {topic} does not exist"))?;
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition_offset(&topic, i32::try_from(p)?, Offset::Beginning)?;
        }
        consumer.assign(&list)?;
        Ok(consumer)
    })
    .await??;
    let seen = Arc::clone(seen);
    let stop = stop.clone();
    std::thread::spawn(move || {
        while !stop.is_cancelled() {
            let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                continue;
            };
            let Ok(m) = m else { continue };
            let get = |k: &str| {
                m.headers().and_then(|h| {
                    h.iter()
                        .find(|x| x.key == k)
                        .and_then(|x| x.value)
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                })
            };
            if let Some(s) = parse_ce(get, "ce_") {
                seen.lock().unwrap().push(s);
            }
        }
    });
    Ok(())
}

/// The lag of consumer group `group` on Kafka topic `topic`: end offsets minus committed
/// offsets (the partition's start where the group committed nothing); `u64::MAX` while the
/// topic does not exist yet.
pub(crate) async fn kafka_group_lag(url: &str, topic: &str, group: &str) -> Result<u64> {
    use outbox_kafka::rdkafka::consumer::{BaseConsumer, Consumer as _};
    use outbox_kafka::rdkafka::topic_partition_list::{Offset, TopicPartitionList};
    let mut config = outbox_kafka::rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", outbox_kafka::bootstrap_servers(url)?)
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    let consumer: BaseConsumer = config.create()?;
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || -> Result<u64> {
        let timeout = Duration::from_secs(10);
        let metadata = consumer.fetch_metadata(Some(&topic), timeout)?;
        let Some(partitions) = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len())
        else {
            return Ok(u64::MAX);
        };
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(&topic, i32::try_from(p)?);
        }
        let committed = consumer.committed_offsets(list, timeout)?;
        let mut lag = 0u64;
        for e in committed.elements() {
            let (low, high) = consumer.fetch_watermarks(&topic, e.partition(), timeout)?;
            let from = match e.offset() {
                Offset::Offset(o) => o,
                _ => low,
            };
            lag += u64::try_from(high - from).unwrap_or(0);
        }
        Ok(lag)
    })
    .await?
}

async fn rabbit_observe(
    url: &str,
    exchange: &str,
    seen: &Mutex<Vec<Seen>>,
    ready: &mut Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<()> {
    use lapin::options::{
        BasicAckOptions, BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    let q = ch
        .queue_declare(
            "".into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    ch.queue_bind(
        q.name().clone(),
        exchange.into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    let mut consumer = ch
        .basic_consume(
            q.name().clone(),
            "outbox-observer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    if let Some(r) = ready.take() {
        let _ = r.send(());
    }
    while let Some(d) = consumer.next().await {
        let d = d?;
        let headers = d.properties.headers().clone().unwrap_or_default();
        let get = |k: &str| match headers.inner().get(k) {
            Some(AMQPValue::LongString(s)) => Some(s.to_string()),
            _ => None,
        };
        if let Some(s) = parse_ce(get, "cloudEvents_") {
            seen.lock().unwrap().push(s);
        }
        let _ = d.ack(BasicAckOptions::default()).await;
    }
    bail!("observer consumer ended")
}
