//! The independent subscriber of the demo and the crash matrix: it records every message the
//! broker routes for a prefix, duplicates included, straight from the wire (NATS core
//! subscription on `<prefix>.>`, or an exclusive RabbitMQ queue bound to exchange `<prefix>`),
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
    if !matches!(broker, "nats" | "rabbitmq") {
        bail!("the test tools observe NATS and RabbitMQ only, not {broker}");
    }
    if broker == "nats" {
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
