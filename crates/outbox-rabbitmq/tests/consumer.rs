//! Consumer integration tests against the real RabbitMQ at `OUTBOX_TEST_AMQP_URL`
//! (default `amqp://guest:guest@127.0.0.1:5672/%2f`). A missing broker fails the tests.
//!
//! Every test uses its own exchange and queue names and deletes them at the end (queues
//! declared by the tests also expire if a failed test leaves them behind).
#![allow(missing_docs)]

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use chrono::{TimeZone, Utc};
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use outbox_core::consumer::{Delivery, DeliverySource, SourceErrorKind};
use outbox_core::wire::{self, DecodeError};
use outbox_core::{ContentType, Fingerprint, OutboxMessage, Payload, Transport};
use outbox_rabbitmq::{
    RabbitConfig, RabbitConsumerConfig, RabbitConsumerError, RabbitDelivery, RabbitSource,
    RabbitTransport,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use uuid::Uuid;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::now_v7().simple())
}

fn message(aggregate_id: &str, version: i64, body: impl Into<Bytes>) -> OutboxMessage {
    let payload = Payload {
        content_type: ContentType::json(),
        bytes: body.into(),
    };
    OutboxMessage {
        id: version,
        event_id: Uuid::now_v7(),
        aggregate_type: "payment".into(),
        aggregate_id: aggregate_id.into(),
        aggregate_version: version,
        event_type: "PaymentCreated".into(),
        schema_version: 2,
        fingerprint: Fingerprint::of(&payload.bytes),
        payload,
        headers: BTreeMap::from([("traceparent".to_owned(), TRACEPARENT.to_owned())]),
        destination: None,
        partition_key: None,
        created_at: Utc.with_ymd_and_hms(2025, 3, 4, 5, 6, 7).unwrap()
            + chrono::Duration::microseconds(123_456),
        attempts: 0,
    }
}

/// Consumer settings for a queue the test declared itself.
fn consumer_config(queue: &str) -> RabbitConsumerConfig {
    RabbitConsumerConfig {
        queue: queue.to_owned(),
        declare_queue: false,
        bind_exchange: None,
        connect_timeout_secs: 5,
        ..RabbitConsumerConfig::default()
    }
}

async fn source(url: &str, config: RabbitConsumerConfig) -> Result<RabbitSource> {
    RabbitSource::connect(url, config)
        .await
        .with_context(|| format!("RabbitMQ must run at {url} (set OUTBOX_TEST_AMQP_URL)"))
}

/// An independent client for setup, publishing by hand, inspection and cleanup.
struct Admin {
    _connection: Connection,
    channel: Channel,
}

impl Admin {
    async fn new() -> Result<Self> {
        let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .with_context(|| {
                format!(
                    "RabbitMQ must run at {} (set OUTBOX_TEST_AMQP_URL)",
                    amqp_url()
                )
            })?;
        let channel = connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self {
            _connection: connection,
            channel,
        })
    }

    /// A durable classic queue that expires if a failed test leaves it behind.
    async fn queue(&self) -> Result<String> {
        let name = unique("outbox-test-cq");
        let mut args = FieldTable::default();
        args.insert("x-expires".into(), AMQPValue::LongUInt(600_000));
        self.channel
            .queue_declare(name.as_str().into(), QueueDeclareOptions::durable(), args)
            .await?;
        Ok(name)
    }

    /// Ready messages of `queue`.
    async fn count(&self, queue: &str) -> Result<u32> {
        let q = self
            .channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok(q.message_count())
    }

    /// Publishes to `queue` through the default exchange, waiting for the broker's confirm.
    async fn publish(&self, queue: &str, body: &[u8], properties: BasicProperties) -> Result<()> {
        let confirm = self
            .channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body,
                properties.with_delivery_mode(2),
            )
            .await?
            .await?;
        ensure!(
            matches!(confirm, lapin::Confirmation::Ack(None)),
            "publish not confirmed: {confirm:?}"
        );
        Ok(())
    }

    async fn delete_queues(&self, queues: &[&str]) -> Result<()> {
        for q in queues {
            self.channel
                .queue_delete((*q).into(), QueueDeleteOptions::default())
                .await?;
        }
        Ok(())
    }

    async fn delete_exchange(&self, exchange: &str) -> Result<()> {
        self.channel
            .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
            .await?;
        Ok(())
    }
}

fn long(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// The headers `RabbitTransport` would publish for `msg`, as an AMQP table.
fn wire_headers(msg: &OutboxMessage) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in wire::attributes(msg, wire::DEFAULT_SOURCE) {
        table.insert(format!("cloudEvents_{name}").into(), long(&value));
    }
    for (name, value) in &msg.headers {
        table.insert(name.as_str().into(), long(value));
    }
    table
}

fn table_as_text(table: &FieldTable) -> BTreeMap<String, String> {
    table
        .inner()
        .iter()
        .map(|(k, v)| {
            let AMQPValue::LongString(s) = v else {
                panic!("test headers are long strings")
            };
            (
                k.as_str().to_owned(),
                String::from_utf8(s.as_bytes().to_vec()).unwrap(),
            )
        })
        .collect()
}

/// Calls `next_batch` until `n` deliveries arrived or `within` elapsed.
async fn receive(
    source: &mut RabbitSource,
    n: usize,
    within: Duration,
) -> Result<Vec<RabbitDelivery>> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    while out.len() < n {
        ensure!(
            Instant::now() < deadline,
            "got {} of {n} deliveries within {within:?}",
            out.len()
        );
        out.extend(
            source
                .next_batch(n - out.len(), Duration::from_millis(500))
                .await?,
        );
    }
    Ok(out)
}

async fn receive_one(source: &mut RabbitSource) -> Result<RabbitDelivery> {
    Ok(receive(source, 1, Duration::from_secs(10))
        .await?
        .pop()
        .expect("one"))
}

fn event_id(d: &RabbitDelivery) -> Uuid {
    d.event().as_ref().expect("a valid event").event_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn published_event_is_received_decoded_and_acked() -> Result<()> {
    let exchange = unique("outbox-test-x");
    let queue = unique("outbox-test-q");
    let transport = RabbitTransport::connect(
        &amqp_url(),
        RabbitConfig {
            exchange: exchange.clone(),
            ..RabbitConfig::default()
        },
    )
    .await
    .with_context(|| format!("RabbitMQ must run at {}", amqp_url()))?;
    let admin = Admin::new().await?;
    // The source declares and binds its own (durable) queue.
    let mut source = source(
        &amqp_url(),
        RabbitConsumerConfig {
            queue: queue.clone(),
            bind_exchange: Some(exchange.clone()),
            ..RabbitConsumerConfig::default()
        },
    )
    .await?;
    ensure!(source.is_connected());
    let result = async {
        let aggregate_id = "zahlung-ü-€-日本 42";
        let msg = message(
            aggregate_id,
            7,
            &b"{\"amount\": 100, \"currency\":\"EUR\"}"[..],
        );
        transport.publish(&msg).await?;

        let d = receive_one(&mut source).await?;
        let e = d.event().as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        assert_eq!(e.event_id, msg.event_id);
        assert_eq!(e.event_type, msg.event_type);
        assert_eq!(e.source, wire::DEFAULT_SOURCE);
        assert_eq!(e.aggregate_type, msg.aggregate_type);
        assert_eq!(e.aggregate_id, aggregate_id);
        assert_eq!(e.aggregate_version, 7);
        assert_eq!(e.schema_version, 2);
        assert_eq!(e.partition_key, aggregate_id);
        assert_eq!(e.time, Some(msg.created_at));
        assert_eq!(e.payload, msg.payload, "content type and bytes unchanged");
        assert_eq!(e.fingerprint, msg.fingerprint);
        assert_eq!(
            e.headers,
            BTreeMap::from([("traceparent".to_owned(), TRACEPARENT.to_owned())]),
            "user headers only"
        );
        assert_eq!(d.delivery_count(), Some(1));
        let raw = d.raw();
        assert_eq!(raw.payload, msg.payload.bytes);
        assert_eq!(raw.content_type.as_deref(), Some("application/json"));
        assert_eq!(raw.headers.len(), 13, "{:?}", raw.headers);
        assert_eq!(raw.headers["cloudEvents_aggregateid"], aggregate_id);
        assert_eq!(source.decode(raw).as_ref(), Ok(e));

        d.ack().await?;
        assert_eq!(source.lag().await?, Some(0));
        // Closing would requeue an unacknowledged delivery: the queue stays empty only if
        // the ack reached the broker.
        source.close().await;
        assert_eq!(admin.count(&queue).await?, 0, "acked message must be gone");
        Ok::<_, anyhow::Error>(())
    }
    .await;
    transport.close().await;
    admin.delete_queues(&[&queue]).await?;
    admin.delete_exchange(&exchange).await?;
    result
}

/// A TCP proxy whose connections the test can cut, to simulate a network failure.
struct Proxy {
    port: u16,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let conns = Arc::clone(&connections);
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns.lock().unwrap().push(task);
            }
        });
        Ok(Self {
            port,
            connections,
            accept,
        })
    }

    /// Drops every proxied connection (both sides see the socket close).
    fn cut(&self) {
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// `url` with its host and port replaced by this proxy's.
    fn url(&self, url: &str) -> Result<String> {
        let (scheme, rest) = url.split_once("://").context("URL without scheme")?;
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let userinfo = authority.rfind('@').map_or("", |at| &authority[..=at]);
        Ok(format!(
            "{scheme}://{userinfo}127.0.0.1:{}{tail}",
            self.port
        ))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

fn upstream_of(url: &str) -> Result<String> {
    let uri: lapin::uri::AMQPUri = url.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    Ok(format!("{}:{}", uri.authority.host, uri.authority.port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unacked_delivery_is_redelivered_after_the_connection_drops_and_the_source_reconnects()
-> Result<()> {
    let admin = Admin::new().await?;
    let queue = admin.queue().await?;
    let proxy = Proxy::start(upstream_of(&amqp_url())?).await?;
    let url = proxy.url(&amqp_url())?;
    let mut source = source(
        &url,
        RabbitConsumerConfig {
            reconnect_min_delay_ms: 300,
            ..consumer_config(&queue)
        },
    )
    .await?;
    let result = async {
        let msg = message("pay-1", 1, &b"{}"[..]);
        admin
            .publish(
                &queue,
                &msg.payload.bytes,
                BasicProperties::default().with_headers(wire_headers(&msg)),
            )
            .await?;
        let first = receive_one(&mut source).await?;
        assert_eq!(event_id(&first), msg.event_id);
        assert_eq!(first.delivery_count(), Some(1));

        proxy.cut();
        // The loss is reported as Unavailable (once lapin noticed the closed socket).
        let deadline = Instant::now() + Duration::from_secs(10);
        let err = loop {
            ensure!(Instant::now() < deadline, "connection loss never reported");
            match source.next_batch(10, Duration::from_millis(200)).await {
                Ok(batch) => ensure!(batch.is_empty(), "unexpected delivery on a cut link"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind, SourceErrorKind::Unavailable, "{err}");
        ensure!(!source.is_connected());
        // Acking on the dead channel must fail, never pretend success.
        let ack = first.ack().await;
        assert_eq!(
            ack.as_ref().map_err(|e| e.kind),
            Err(SourceErrorKind::Unavailable),
            "{ack:?}"
        );
        // Right after the loss, calls fail fast instead of reconnecting in a loop.
        let t = Instant::now();
        let err = source
            .next_batch(10, Duration::from_secs(5))
            .await
            .expect_err("within the reconnect delay");
        assert_eq!(err.kind, SourceErrorKind::Unavailable);
        ensure!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());

        // A later call reconnects; the broker redelivers the unacknowledged message.
        let deadline = Instant::now() + Duration::from_secs(15);
        let again = loop {
            ensure!(Instant::now() < deadline, "no redelivery after reconnect");
            match source.next_batch(10, Duration::from_millis(500)).await {
                Ok(mut batch) if !batch.is_empty() => {
                    assert_eq!(batch.len(), 1);
                    break batch.pop().expect("one");
                }
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.kind, SourceErrorKind::Unavailable, "{e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        ensure!(source.is_connected());
        assert_eq!(event_id(&again), msg.event_id);
        assert_eq!(
            again.delivery_count(),
            Some(2),
            "tracked across the reconnect"
        );
        again.ack().await?;
        source.close().await;
        assert_eq!(admin.count(&queue).await?, 0);
        Ok::<_, anyhow::Error>(())
    }
    .await;
    admin.delete_queues(&[&queue]).await?;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_source_gets_the_unacked_delivery_when_the_first_is_dropped() -> Result<()> {
    let admin = Admin::new().await?;
    let queue = admin.queue().await?;
    let result = async {
        let mut first = source(&amqp_url(), consumer_config(&queue)).await?;
        let msg = message("pay-2", 1, &b"{\"x\":1}"[..]);
        admin
            .publish(
                &queue,
                &msg.payload.bytes,
                BasicProperties::default().with_headers(wire_headers(&msg)),
            )
            .await?;
        let held = receive_one(&mut first).await?;
        assert_eq!(event_id(&held), msg.event_id);
        drop(first);

        let mut second = source(&amqp_url(), consumer_config(&queue)).await?;
        let d = receive_one(&mut second).await?;
        assert_eq!(event_id(&d), msg.event_id);
        let count = d.delivery_count().expect("always known");
        ensure!(count >= 2, "redelivered flag must count, got {count}");
        let stale = held.ack().await;
        ensure!(
            stale.is_err(),
            "ack on the dropped source's channel: {stale:?}"
        );
        d.ack().await?;
        second.close().await;
        assert_eq!(admin.count(&queue).await?, 0);
        Ok::<_, anyhow::Error>(())
    }
    .await;
    admin.delete_queues(&[&queue]).await?;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nack_and_drop_requeue_with_growing_delivery_count() -> Result<()> {
    let admin = Admin::new().await?;
    let queue = admin.queue().await?;
    let result = async {
        let mut source = source(
            &amqp_url(),
            RabbitConsumerConfig {
                requeue_delay_cap_ms: 300,
                ..consumer_config(&queue)
            },
        )
        .await?;
        let msg = message("pay-3", 1, &b"{}"[..]);
        admin
            .publish(
                &queue,
                &msg.payload.bytes,
                BasicProperties::default().with_headers(wire_headers(&msg)),
            )
            .await?;
        let d = receive_one(&mut source).await?;
        assert_eq!(d.delivery_count(), Some(1));

        // The requested delay is capped.
        let t = Instant::now();
        d.nack(Duration::from_secs(30)).await?;
        let took = t.elapsed();
        ensure!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "nack waited {took:?}"
        );
        let d = receive_one(&mut source).await?;
        assert_eq!(event_id(&d), msg.event_id);
        assert_eq!(d.delivery_count(), Some(2));

        let t = Instant::now();
        d.nack(Duration::from_millis(50)).await?;
        ensure!(t.elapsed() >= Duration::from_millis(50));
        let d = receive_one(&mut source).await?;
        assert_eq!(d.delivery_count(), Some(3));

        // Dropped without ack or nack: requeued at once, not held until the channel closes.
        drop(d);
        let d = receive_one(&mut source).await?;
        assert_eq!(event_id(&d), msg.event_id);
        assert_eq!(d.delivery_count(), Some(4));
        d.ack().await?;
        source.close().await;
        assert_eq!(admin.count(&queue).await?, 0);
        Ok::<_, anyhow::Error>(())
    }
    .await;
    admin.delete_queues(&[&queue]).await?;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quorum_queue_delivery_count_comes_from_the_broker() -> Result<()> {
    let admin = Admin::new().await?;
    let queue = unique("outbox-test-qq");
    let mut args = FieldTable::default();
    args.insert("x-queue-type".into(), long("quorum"));
    admin
        .channel
        .queue_declare(queue.as_str().into(), QueueDeclareOptions::durable(), args)
        .await?;
    let result = async {
        let mut source = source(&amqp_url(), consumer_config(&queue)).await?;
        // No event id: this source cannot track it, only the broker's header can count.
        admin
            .publish(&queue, b"no id", BasicProperties::default())
            .await?;
        let d = receive_one(&mut source).await?;
        assert_eq!(d.delivery_count(), Some(1));
        d.nack(Duration::ZERO).await?;
        let d = receive_one(&mut source).await?;
        assert_eq!(d.delivery_count(), Some(2));
        d.nack(Duration::ZERO).await?;
        let d = receive_one(&mut source).await?;
        assert_eq!(
            d.raw().headers.get("x-delivery-count").map(String::as_str),
            Some("2")
        );
        assert_eq!(d.delivery_count(), Some(3), "x-delivery-count + 1");
        ensure!(d.event().is_err());
        d.ack().await?;
        source.close().await;
        assert_eq!(admin.count(&queue).await?, 0);
        Ok::<_, anyhow::Error>(())
    }
    .await;
    admin.delete_queues(&[&queue]).await?;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_messages_are_deliveries_with_the_reason_and_the_raw_message() -> Result<()> {
    let admin = Admin::new().await?;
    let queue = admin.queue().await?;
    let result = async {
        let mut source = source(
            &amqp_url(),
            RabbitConsumerConfig {
                max_message_bytes: 1024,
                ..consumer_config(&queue)
            },
        )
        .await?;

        let valid = message("pay-4", 3, &b"{\"ok\":true}"[..]);
        let mut bad_version = message("pay-4", 4, &b"{\"v\":\"abc\"}"[..]);
        bad_version.headers.insert("x-extra".into(), "1".into());
        let mut bad_version_headers = wire_headers(&bad_version);
        bad_version_headers.insert("cloudEvents_aggregateversion".into(), long("abc"));
        let tampered = message("pay-4", 5, &b"{\"amount\":100}"[..]);
        let big = message("pay-4", 6, vec![b'x'; 2000]);

        struct Case {
            body: Bytes,
            headers: FieldTable,
            content_type: Option<&'static str>,
            check: fn(&DecodeError) -> bool,
            names: &'static str,
        }
        let cases = [
            Case {
                body: Bytes::from_static(b"plain text, no CloudEvents headers"),
                headers: FieldTable::default(),
                content_type: Some("text/plain"),
                check: |e| *e == DecodeError::Missing("specversion"),
                names: "specversion",
            },
            Case {
                body: bad_version.payload.bytes.clone(),
                headers: bad_version_headers,
                content_type: Some("application/json"),
                check: |e| {
                    matches!(e, DecodeError::Invalid { name: "aggregateversion", value } if value == "abc")
                },
                names: "aggregateversion",
            },
            Case {
                // Headers of one body, sent with another: the fingerprint catches it.
                body: Bytes::from_static(b"{\"amount\":999}"),
                headers: wire_headers(&tampered),
                content_type: Some("application/json"),
                check: |e| matches!(e, DecodeError::FingerprintMismatch { .. }),
                names: "fingerprint",
            },
            Case {
                body: big.payload.bytes.clone(),
                headers: wire_headers(&big),
                content_type: Some("application/json"),
                check: |e| matches!(e, DecodeError::TooLarge { size: 2000, max: 1024 }),
                names: "exceeds the limit",
            },
        ];
        for case in &cases {
            let mut p = BasicProperties::default().with_headers(case.headers.clone());
            if let Some(ct) = case.content_type {
                p = p.with_content_type(ct.into());
            }
            admin.publish(&queue, &case.body, p).await?;
        }
        admin
            .publish(
                &queue,
                &valid.payload.bytes,
                BasicProperties::default()
                    .with_headers(wire_headers(&valid))
                    .with_content_type("application/json".into()),
            )
            .await?;

        // One queue, one consumer: deliveries come in publish order.
        let deliveries = receive(&mut source, cases.len() + 1, Duration::from_secs(10)).await?;
        for (case, d) in cases.iter().zip(&deliveries) {
            let err = d.event().as_ref().expect_err("malformed");
            ensure!((case.check)(err), "unexpected error {err:?}");
            ensure!(
                err.to_string().contains(case.names),
                "`{err}` should name {}",
                case.names
            );
            let raw = d.raw();
            assert_eq!(raw.payload, case.body);
            assert_eq!(raw.headers, table_as_text(&case.headers));
            assert_eq!(raw.content_type.as_deref(), case.content_type);
            assert_eq!(source.decode(raw).as_ref(), Err(err), "same result from storage");
        }
        let ok = deliveries.last().expect("valid one");
        let e = ok.event().as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
        assert_eq!((e.event_id, e.aggregate_version), (valid.event_id, 3));
        assert_eq!(source.decode(ok.raw()).as_ref(), Ok(e));

        for d in deliveries {
            d.ack().await?;
        }
        source.close().await;
        assert_eq!(admin.count(&queue).await?, 0);
        Ok::<_, anyhow::Error>(())
    }
    .await;
    admin.delete_queues(&[&queue]).await?;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lag_counts_ready_messages() -> Result<()> {
    let admin = Admin::new().await?;
    let queue = admin.queue().await?;
    let result = async {
        // Prefetch 1: once one delivery is held unacknowledged, nothing else leaves the queue.
        let mut source = source(
            &amqp_url(),
            RabbitConsumerConfig {
                prefetch: 1,
                ..consumer_config(&queue)
            },
        )
        .await?;
        assert_eq!(source.lag().await?, Some(0));
        admin
            .publish(&queue, b"first", BasicProperties::default())
            .await?;
        let held = receive_one(&mut source).await?;
        for i in 0..10 {
            admin
                .publish(
                    &queue,
                    format!("m{i}").as_bytes(),
                    BasicProperties::default(),
                )
                .await?;
        }
        assert_eq!(
            source.lag().await?,
            Some(10),
            "10 ready, the held one is not counted"
        );
        assert_eq!(admin.count(&queue).await?, 10);

        held.ack().await?;
        let mut bodies = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while bodies.len() < 10 {
            ensure!(Instant::now() < deadline, "drained only {}", bodies.len());
            for d in source.next_batch(10, Duration::from_millis(500)).await? {
                bodies.push(d.raw().payload.clone());
                d.ack().await?;
            }
        }
        assert_eq!(source.lag().await?, Some(0));
        source.close().await;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    admin.delete_queues(&[&queue]).await?;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_respect_max_and_drain_the_queue() -> Result<()> {
    let admin = Admin::new().await?;
    let queue = admin.queue().await?;
    let result = async {
        let mut source = source(&amqp_url(), consumer_config(&queue)).await?;
        for i in 0..50 {
            admin
                .publish(
                    &queue,
                    format!("m{i}").as_bytes(),
                    BasicProperties::default(),
                )
                .await?;
        }
        // With prefetch 256 every message is pushed to the consumer.
        let deadline = Instant::now() + Duration::from_secs(10);
        while source.lag().await? != Some(0) {
            ensure!(Instant::now() < deadline, "messages never left the queue");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;

        let mut seen = HashSet::new();
        let mut sizes = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        while seen.len() < 50 {
            ensure!(Instant::now() < deadline, "drained only {}", seen.len());
            let batch = source.next_batch(20, Duration::from_secs(1)).await?;
            ensure!(batch.len() <= 20, "batch of {}", batch.len());
            sizes.push(batch.len());
            for d in batch {
                ensure!(
                    seen.insert(d.raw().payload.clone()),
                    "duplicate {:?}",
                    d.raw().payload
                );
                d.ack().await?;
            }
        }
        assert_eq!(
            sizes[..3],
            [20, 20, 10],
            "already-arrived deliveries are batched"
        );
        let t = Instant::now();
        let empty = source.next_batch(20, Duration::from_millis(300)).await?;
        ensure!(empty.is_empty());
        ensure!(
            t.elapsed() >= Duration::from_millis(250),
            "waited for the first delivery"
        );
        source.close().await;
        assert_eq!(admin.count(&queue).await?, 0);
        Ok::<_, anyhow::Error>(())
    }
    .await;
    admin.delete_queues(&[&queue]).await?;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connect_fails_fast_and_clearly() -> Result<()> {
    let quick = |queue: &str| RabbitConsumerConfig {
        connect_timeout_secs: 1,
        ..consumer_config(queue)
    };
    // Nothing listens on port 1.
    let t = Instant::now();
    let err = RabbitSource::connect("amqp://guest:s3cret@127.0.0.1:1/%2f", quick("q"))
        .await
        .expect_err("unreachable");
    ensure!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    ensure!(
        matches!(&err, RabbitConsumerError::Unreachable { endpoint, .. } if endpoint == "127.0.0.1:1//"),
        "{err:?}"
    );
    ensure!(!err.to_string().contains("s3cret"), "{err}");
    ensure!(err.to_string().contains("127.0.0.1:1"), "{err}");

    // A peer that accepts TCP and never speaks AMQP: bounded by connect_timeout_secs.
    let silent = TcpListener::bind("127.0.0.1:0").await?;
    let port = silent.local_addr()?.port();
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let t = Instant::now();
    let err = RabbitSource::connect(&format!("amqp://127.0.0.1:{port}/%2f"), quick("q"))
        .await
        .expect_err("silent peer");
    hold.abort();
    ensure!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    ensure!(
        matches!(err, RabbitConsumerError::TimedOut { .. }),
        "{err:?}"
    );

    // Wrong credentials.
    let uri: lapin::uri::AMQPUri = amqp_url().parse().map_err(|e: String| anyhow::anyhow!(e))?;
    let bad_creds = format!(
        "amqp://nobody:wrong@{}:{}/%2f",
        uri.authority.host, uri.authority.port
    );
    let err = RabbitSource::connect(&bad_creds, quick("q"))
        .await
        .expect_err("bad credentials");
    ensure!(
        matches!(
            err,
            RabbitConsumerError::Unreachable { .. } | RabbitConsumerError::TimedOut { .. }
        ),
        "{err:?}"
    );

    // Bad input never reaches the network.
    let err = RabbitSource::connect("http://nope", quick("q"))
        .await
        .expect_err("bad url");
    ensure!(matches!(err, RabbitConsumerError::InvalidUrl(_)), "{err:?}");
    let err = RabbitSource::connect(
        &amqp_url(),
        RabbitConsumerConfig {
            prefetch: 0,
            ..quick("q")
        },
    )
    .await
    .expect_err("bad config");
    ensure!(
        matches!(&err, RabbitConsumerError::Config(c) if c.key == "prefetch"),
        "{err:?}"
    );

    // The broker refuses setup steps: a missing queue, a missing exchange to bind to.
    let missing = unique("outbox-test-missing");
    let err = RabbitSource::connect(&amqp_url(), quick(&missing))
        .await
        .expect_err("missing queue");
    match &err {
        RabbitConsumerError::Setup { step, message, .. } => {
            ensure!(*step == "basic.consume", "{err}");
            ensure!(message.contains(&missing), "{err}");
        }
        other => bail!("expected a setup error, got {other:?}"),
    }
    let admin = Admin::new().await?;
    let queue = admin.queue().await?;
    let no_exchange = unique("outbox-test-nox");
    let err = RabbitSource::connect(
        &amqp_url(),
        RabbitConsumerConfig {
            bind_exchange: Some(no_exchange.clone()),
            ..quick(&queue)
        },
    )
    .await
    .expect_err("missing exchange");
    ensure!(
        matches!(&err, RabbitConsumerError::Setup { step: "queue.bind", message, .. } if message.contains(&no_exchange)),
        "{err:?}"
    );
    admin.delete_queues(&[&queue]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binding_routes_the_exchange_into_the_queue() -> Result<()> {
    // declare_queue = false with a binding: the source binds the existing queue itself.
    let exchange = unique("outbox-test-x");
    let transport = RabbitTransport::connect(
        &amqp_url(),
        RabbitConfig {
            exchange: exchange.clone(),
            ..RabbitConfig::default()
        },
    )
    .await
    .with_context(|| format!("RabbitMQ must run at {}", amqp_url()))?;
    let admin = Admin::new().await?;
    let queue = admin.queue().await?;
    let result = async {
        let mut source = source(
            &amqp_url(),
            RabbitConsumerConfig {
                bind_exchange: Some(exchange.clone()),
                ..consumer_config(&queue)
            },
        )
        .await?;
        let msg = message("pay-5", 1, &b"{}"[..]);
        transport.publish(&msg).await?;
        let d = receive_one(&mut source).await?;
        assert_eq!(event_id(&d), msg.event_id);
        d.ack().await?;
        source.close().await;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    transport.close().await;
    admin.delete_queues(&[&queue]).await?;
    admin.delete_exchange(&exchange).await?;
    result
}
