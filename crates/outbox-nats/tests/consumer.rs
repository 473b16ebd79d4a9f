//! Integration tests of [`NatsSource`] against the real NATS server (JetStream enabled) at
//! `OUTBOX_TEST_NATS_URL` (default `nats://127.0.0.1:4222`). A missing server fails the tests.
//!
//! Every test uses its own stream, subject prefix and durable name and deletes its stream at
//! the end, so the tests run in parallel and leave nothing behind.
#![allow(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use outbox_core::consumer::{Delivery, DeliverySource};
use outbox_core::{DecodeError, Fingerprint, OutboxMessage, Payload, Transport};
use outbox_nats::async_nats::{self, HeaderMap, jetstream};
use outbox_nats::{
    NatsConfig, NatsConsumerConfig, NatsConsumerError, NatsDelivery, NatsSource, NatsTransport,
};
use uuid::Uuid;

fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// One test's private stream, subject space and durable name.
struct Fixture {
    stream: String,
    prefix: String,
    durable: String,
}

impl Fixture {
    fn new() -> Self {
        let id = Uuid::now_v7().simple().to_string();
        Self {
            stream: format!("OUTBOX_CTEST_{id}"),
            prefix: format!("outboxctest{id}"),
            durable: format!("consumer-{id}"),
        }
    }

    fn transport_config(&self) -> NatsConfig {
        NatsConfig {
            stream: self.stream.clone(),
            stream_subjects: vec![format!("{}.>", self.prefix)],
            subject_template: format!("{}.{{aggregate_type}}.{{event_type}}", self.prefix),
            ..NatsConfig::default()
        }
    }

    /// The transport; creating it creates the stream.
    async fn transport(&self) -> NatsTransport {
        let url = nats_url();
        match NatsTransport::connect(&url, self.transport_config()).await {
            Ok(t) => t,
            Err(e) => panic!(
                "the NATS server with JetStream must run at {url} (set OUTBOX_TEST_NATS_URL): {e}"
            ),
        }
    }

    fn consumer_config(&self, ack_wait_secs: u64) -> NatsConsumerConfig {
        NatsConsumerConfig {
            stream: self.stream.clone(),
            durable_name: self.durable.clone(),
            ack_wait_secs,
            ..NatsConsumerConfig::default()
        }
    }

    async fn source(&self, ack_wait_secs: u64) -> anyhow::Result<NatsSource> {
        Ok(NatsSource::connect(&nats_url(), self.consumer_config(ack_wait_secs)).await?)
    }

    /// Runs `body`, then deletes the stream whether the body failed or not.
    async fn run<F, Fut>(self, body: F)
    where
        F: FnOnce(Fixture) -> Fut,
        Fut: Future<Output = anyhow::Result<()>>,
    {
        let stream = self.stream.clone();
        let result = body(self).await;
        delete_stream(&stream).await;
        if let Err(e) = result {
            panic!("{e:?}");
        }
    }
}

/// An independent JetStream context for hand-made publishes and cleanup.
async fn js() -> jetstream::Context {
    let url = nats_url();
    let client = async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("the NATS server must run at {url}: {e}"));
    jetstream::new(client)
}

async fn delete_stream(name: &str) {
    if let Err(e) = js().await.delete_stream(name).await {
        eprintln!("deleting stream {name}: {e}");
    }
}

fn message(aggregate_type: &str, event_type: &str, body: &str) -> OutboxMessage {
    let payload = Payload::bytes("application/json", body.as_bytes().to_vec());
    OutboxMessage {
        id: 1,
        event_id: Uuid::now_v7(),
        aggregate_type: aggregate_type.to_owned(),
        aggregate_id: "pay-42".to_owned(),
        aggregate_version: 7,
        event_type: event_type.to_owned(),
        schema_version: 1,
        fingerprint: payload.fingerprint(),
        payload,
        headers: BTreeMap::new(),
        destination: None,
        partition_key: None,
        created_at: chrono::Utc::now(),
        attempts: 0,
    }
}

/// Fetches until `n` deliveries arrived or `within` passed.
async fn receive(
    source: &mut NatsSource,
    n: usize,
    within: Duration,
) -> anyhow::Result<Vec<NatsDelivery>> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let batch = source
            .next_batch(n - out.len(), left.min(Duration::from_secs(1)))
            .await?;
        out.extend(batch);
    }
    Ok(out)
}

async fn receive_one(source: &mut NatsSource, within: Duration) -> anyhow::Result<NatsDelivery> {
    receive(source, 1, within)
        .await?
        .pop()
        .context("no delivery arrived in time")
}

async fn ack_all(deliveries: Vec<NatsDelivery>) -> anyhow::Result<()> {
    for d in deliveries {
        d.ack().await?;
    }
    Ok(())
}

/// (a) A published event arrives decoded, equal to what was published; acked, it never comes
/// again.
#[tokio::test]
async fn published_event_is_decoded_and_not_redelivered_after_ack() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let mut source = fx.source(1).await?;

            let body = r#"{"amount":100,"currency":"EUR","note":"café ✓"}"#;
            let mut msg = message("zahlung", "Zahlung.Erstellt-ü €", body);
            msg.aggregate_id = "Konto 42/ä \"x\" 100%".to_owned();
            msg.aggregate_version = 12;
            msg.schema_version = 3;
            msg.headers
                .insert("traceparent".to_owned(), TRACEPARENT.to_owned());
            msg.headers
                .insert("tenant".to_owned(), "acme corp".to_owned());
            transport.publish(&msg).await?;

            let d = receive_one(&mut source, Duration::from_secs(5)).await?;
            ensure!(d.delivery_count() == Some(1), "{:?}", d.delivery_count());
            let e = d
                .event()
                .as_ref()
                .map_err(|e| anyhow::anyhow!("decode failed: {e}"))?;
            ensure!(e.event_id == msg.event_id);
            ensure!(e.event_type == msg.event_type, "{}", e.event_type);
            ensure!(e.source == "/outbox");
            ensure!(e.aggregate_type == msg.aggregate_type);
            ensure!(e.aggregate_id == msg.aggregate_id, "{}", e.aggregate_id);
            ensure!(e.partition_key == msg.aggregate_id);
            ensure!(e.aggregate_version == 12 && e.schema_version == 3);
            ensure!(e.payload.bytes == Bytes::from(body));
            ensure!(e.payload.content_type.0 == "application/json");
            ensure!(e.fingerprint == msg.fingerprint);
            ensure!(e.fingerprint == Fingerprint::of(body.as_bytes()));
            let created = msg
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            ensure!(
                e.time
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
                    == Some(created)
            );
            ensure!(e.headers == msg.headers, "user headers: {:?}", e.headers);

            let raw = d.raw();
            ensure!(raw.payload == Bytes::from(body));
            ensure!(raw.content_type.as_deref() == Some("application/json"));
            ensure!(raw.headers.get("traceparent").map(String::as_str) == Some(TRACEPARENT));
            ensure!(raw.headers.get("Nats-Msg-Id") == Some(&msg.event_id.hyphenated().to_string()));
            ensure!(raw.headers.contains_key("ce-aggregateid"));
            ensure!(
                source.decode(raw).as_ref() == Ok(e),
                "stored decode differs"
            );

            d.ack().await?;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let again = source.next_batch(10, Duration::from_millis(500)).await?;
            ensure!(again.is_empty(), "redelivered after ack: {}", again.len());
            ensure!(source.lag().await? == Some(0));

            // A new instance on the same durable resumes after the acked message.
            drop(source);
            let mut source = fx.source(1).await?;
            let again = source.next_batch(10, Duration::from_millis(500)).await?;
            ensure!(again.is_empty(), "redelivered to a new instance after ack");
            Ok(())
        })
        .await;
}

/// (b) Not acknowledged (dropped): delivered again after the ack wait, counted.
#[tokio::test]
async fn unacked_delivery_comes_again_after_ack_wait() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let mut source = fx.source(1).await?;
            let msg = message("payment", "Created", r#"{"n":1}"#);
            transport.publish(&msg).await?;

            let first = receive_one(&mut source, Duration::from_secs(5)).await?;
            ensure!(first.delivery_count() == Some(1));
            let sent = Instant::now();
            drop(first);

            // Not before the ack wait ...
            let early = source.next_batch(1, Duration::from_millis(300)).await?;
            ensure!(early.is_empty(), "redelivered before the ack wait");
            // ... but after it.
            let second = receive_one(&mut source, Duration::from_secs(5)).await?;
            ensure!(
                sent.elapsed() >= Duration::from_millis(900),
                "came after {:?}",
                sent.elapsed()
            );
            ensure!(second.delivery_count() == Some(2));
            let e = second
                .event()
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            ensure!(e.event_id == msg.event_id);

            // Nack with a delay: again after the delay, count incremented.
            second.nack(Duration::from_millis(200)).await?;
            let third = receive_one(&mut source, Duration::from_secs(3)).await?;
            ensure!(third.delivery_count() == Some(3));
            third.ack().await?;
            tokio::time::sleep(Duration::from_millis(1500)).await;
            ensure!(
                source
                    .next_batch(1, Duration::from_millis(300))
                    .await?
                    .is_empty()
            );
            Ok(())
        })
        .await;
}

/// (b) A nack redelivers after its delay, far sooner than the ack wait.
#[tokio::test]
async fn nack_redelivers_after_the_delay_not_the_ack_wait() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let mut source = fx.source(30).await?;
            transport
                .publish(&message("payment", "Created", "{}"))
                .await?;

            let first = receive_one(&mut source, Duration::from_secs(5)).await?;
            ensure!(first.delivery_count() == Some(1));
            let nacked = Instant::now();
            first.nack(Duration::from_millis(200)).await?;
            let second = receive_one(&mut source, Duration::from_secs(5)).await?;
            let after = nacked.elapsed();
            ensure!(
                after >= Duration::from_millis(150) && after < Duration::from_secs(3),
                "nack(200ms) redelivered after {after:?}"
            );
            ensure!(second.delivery_count() == Some(2));

            // Nack with no delay: at once.
            second.nack(Duration::ZERO).await?;
            let third = receive_one(&mut source, Duration::from_secs(3)).await?;
            ensure!(third.delivery_count() == Some(3));
            third.ack().await?;
            Ok(())
        })
        .await;
}

/// (c) Hand-made messages that break the wire format are still deliveries, with the reason.
#[tokio::test]
async fn malformed_messages_are_deliveries_with_the_reason() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let mut source = fx.source(5).await?;
            let js = js().await;
            let subject = format!("{}.hand.made", fx.prefix);

            let good = message("payment", "Created", r#"{"x":1}"#);
            let good_headers = transport.headers_for(&good)?;
            let to_map = |pairs: &[(String, String)]| {
                let mut h = HeaderMap::new();
                for (n, v) in pairs {
                    h.insert(n.as_str(), v.as_str());
                }
                h
            };
            let replace = |name: &str, value: &str| -> Vec<(String, String)> {
                good_headers
                    .iter()
                    .map(|(n, v)| {
                        if n == name {
                            (n.clone(), value.to_owned())
                        } else {
                            (n.clone(), v.clone())
                        }
                    })
                    .collect()
            };

            // 1: no ce- headers at all.
            js.publish(subject.clone(), Bytes::from_static(b"plain"))
                .await?
                .await?;
            // 2: a bad aggregate version.
            let bad_version = replace("ce-aggregateversion", "zero");
            js.publish_with_headers(
                subject.clone(),
                to_map(&bad_version),
                good.payload.bytes.clone(),
            )
            .await?
            .await?;
            // 3: a body that is not the one fingerprinted.
            let mut altered = good_headers.clone();
            altered.retain(|(n, _)| n != "Nats-Msg-Id");
            let altered_body = Bytes::from_static(br#"{"x":2}"#);
            js.publish_with_headers(subject.clone(), to_map(&altered), altered_body.clone())
                .await?
                .await?;

            let got = receive(&mut source, 3, Duration::from_secs(5)).await?;
            ensure!(got.len() == 3, "got {} deliveries", got.len());

            // 1
            let d = &got[0];
            match d.event() {
                Err(DecodeError::Missing("specversion")) => {}
                other => bail!("no ce- headers: {other:?}"),
            }
            ensure!(d.raw().payload == Bytes::from_static(b"plain"));
            ensure!(d.raw().content_type.is_none());
            ensure!(source.decode(d.raw()) == *d.event());

            // 2
            let d = &got[1];
            let err = d.event().as_ref().err().context("bad version decoded")?;
            ensure!(
                matches!(err, DecodeError::Invalid { name: "aggregateversion", value } if value == "zero"),
                "{err:?}"
            );
            ensure!(err.to_string().contains("aggregateversion"), "{err}");
            ensure!(d.raw().payload == good.payload.bytes);
            for (n, v) in &bad_version {
                ensure!(d.raw().headers.get(n) == Some(v), "raw header {n}");
            }
            ensure!(source.decode(d.raw()) == *d.event());

            // 3
            let d = &got[2];
            match d.event() {
                Err(DecodeError::FingerprintMismatch { expected, actual }) => {
                    ensure!(*expected == good.fingerprint.to_hex());
                    ensure!(*actual == Fingerprint::of(&altered_body).to_hex());
                }
                other => bail!("altered body: {other:?}"),
            }
            ensure!(d.raw().payload == altered_body);
            ensure!(
                d.raw().headers.get("ce-payloadsha256") == Some(&good.fingerprint.to_hex())
            );
            ensure!(source.decode(d.raw()) == *d.event());

            ack_all(got).await?;
            ensure!(source.lag().await? == Some(0));
            Ok(())
        })
        .await;
}

/// (c) A body over `max_message_bytes` is delivered as `TooLarge`.
#[tokio::test]
async fn oversized_body_is_too_large() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let config = NatsConsumerConfig {
                max_message_bytes: 16,
                ..fx.consumer_config(5)
            };
            let mut source = NatsSource::connect(&nats_url(), config).await?;
            transport
                .publish(&message("payment", "Created", &"x".repeat(17)))
                .await?;
            let d = receive_one(&mut source, Duration::from_secs(5)).await?;
            ensure!(
                *d.event() == Err(DecodeError::TooLarge { size: 17, max: 16 }),
                "{:?}",
                d.event()
            );
            ensure!(d.raw().payload.len() == 17);
            d.ack().await?;
            Ok(())
        })
        .await;
}

/// (d) Lag counts undelivered and unacknowledged messages.
#[tokio::test]
async fn lag_counts_unacked_then_zero() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let mut source = fx.source(30).await?;
            ensure!(source.lag().await? == Some(0));
            for i in 0..10 {
                transport
                    .publish(&message("payment", "Created", &format!(r#"{{"i":{i}}}"#)))
                    .await?;
            }
            ensure!(source.lag().await? == Some(10), "not delivered yet");
            let got = receive(&mut source, 10, Duration::from_secs(5)).await?;
            ensure!(got.len() == 10);
            ensure!(source.lag().await? == Some(10), "delivered, not acked");
            let mut got = got.into_iter();
            for d in got.by_ref().take(4) {
                d.ack().await?;
            }
            ensure!(source.lag().await? == Some(6), "4 acked");
            ack_all(got.collect()).await?;
            ensure!(source.lag().await? == Some(0), "all acked");
            Ok(())
        })
        .await;
}

/// (e) Startup fails fast and clearly.
#[tokio::test]
async fn connect_fails_clearly() {
    let fx = Fixture::new();
    // Missing stream.
    let started = Instant::now();
    match NatsSource::connect(&nats_url(), fx.consumer_config(5)).await {
        Err(NatsConsumerError::StreamNotFound { stream }) => assert_eq!(stream, fx.stream),
        other => panic!("missing stream: {other:?}"),
    }
    let e = NatsSource::connect(&nats_url(), fx.consumer_config(5))
        .await
        .unwrap_err();
    assert!(e.to_string().contains(&fx.stream), "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // Unreachable server.
    let started = Instant::now();
    match NatsSource::connect("nats://127.0.0.1:1", fx.consumer_config(5)).await {
        Err(NatsConsumerError::Connect { .. } | NatsConsumerError::ConnectTimedOut { .. }) => {}
        other => panic!("unreachable server: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));

    // Bad config, before any connection.
    let bad = NatsConsumerConfig {
        durable_name: "a.b".to_owned(),
        ..fx.consumer_config(5)
    };
    match NatsSource::connect("nats://127.0.0.1:1", bad).await {
        Err(NatsConsumerError::Config(e)) => assert_eq!(e.key, "durable_name"),
        other => panic!("bad config: {other:?}"),
    }
}

/// An existing durable is reused and brought to the configuration; one that cannot serve
/// (not explicit acks) is refused.
#[tokio::test]
async fn existing_consumer_is_updated_or_refused() {
    Fixture::new()
        .run(|fx| async move {
            let _transport = fx.transport().await;
            let source = fx.source(5).await?;
            ensure!(source.consumer().cached_info().config.ack_wait == Duration::from_secs(5));
            drop(source);
            let mut source = fx.source(7).await?;
            let info = source.consumer().cached_info().clone();
            ensure!(
                info.config.ack_wait == Duration::from_secs(7),
                "not updated"
            );
            ensure!(info.name == fx.durable);
            ensure!(source.lag().await? == Some(0));

            let stream = js().await.get_stream(&fx.stream).await?;
            stream
                .create_consumer(jetstream::consumer::pull::Config {
                    durable_name: Some("no-acks".to_owned()),
                    ack_policy: jetstream::consumer::AckPolicy::None,
                    ..Default::default()
                })
                .await?;
            let config = NatsConsumerConfig {
                durable_name: "no-acks".to_owned(),
                ..fx.consumer_config(5)
            };
            match NatsSource::connect(&nats_url(), config).await {
                Err(e @ NatsConsumerError::Consumer { .. }) => {
                    ensure!(e.to_string().contains("explicit acks"), "{e}")
                }
                other => bail!("consumer without acks: {other:?}"),
            }
            Ok(())
        })
        .await;
}

/// (f) Batches are bounded by `max`; repeated calls drain everything; an empty fetch waits.
#[tokio::test]
async fn batches_drain_all_messages() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let mut source = fx.source(30).await?;
            let mut published = BTreeSet::new();
            for i in 0..50 {
                let m = message("payment", "Created", &format!(r#"{{"i":{i}}}"#));
                published.insert(m.event_id);
                transport.publish(&m).await?;
            }

            let mut seen = BTreeSet::new();
            let started = Instant::now();
            let mut calls = 0;
            while seen.len() < 50 {
                calls += 1;
                ensure!(calls <= 20, "not drained after {calls} calls");
                let t = Instant::now();
                let batch = source.next_batch(20, Duration::from_secs(1)).await?;
                ensure!(batch.len() <= 20, "batch of {}", batch.len());
                ensure!(!batch.is_empty(), "empty batch with messages waiting");
                ensure!(
                    t.elapsed() < Duration::from_millis(900),
                    "a batch with messages available took {:?}",
                    t.elapsed()
                );
                for d in batch {
                    let e = d.event().as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
                    ensure!(seen.insert(e.event_id), "duplicate {}", e.event_id);
                    d.ack().await?;
                }
            }
            ensure!(seen == published);
            ensure!(started.elapsed() < Duration::from_secs(10));

            // Nothing left: an empty batch, after waiting (the runner does not spin).
            let t = Instant::now();
            let empty = source.next_batch(20, Duration::from_secs(1)).await?;
            ensure!(empty.is_empty());
            ensure!(
                t.elapsed() >= Duration::from_millis(800),
                "empty fetch returned after {:?}",
                t.elapsed()
            );
            ensure!(
                source
                    .next_batch(0, Duration::from_secs(1))
                    .await?
                    .is_empty()
            );
            ensure!(source.lag().await? == Some(0));
            Ok(())
        })
        .await;
}

/// Short fetches end near their expiry even when nothing arrives, and a message published
/// between fetches is still delivered (ending a fetch at its deadline loses nothing). The 5 s
/// fetches seen under load in the W3 benchmark do not reproduce on an idle machine, so this
/// guards the deadline's safety rather than reproducing the stall; the bound is generous (2 s)
/// so that it checks liveness, not speed.
#[tokio::test]
async fn short_fetches_end_near_their_expiry_and_lose_nothing() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let mut source = fx.source(3).await?;
            let mut slowest = Duration::ZERO;
            let mut got = Vec::new();
            for i in 0..20 {
                if i % 5 == 4 {
                    transport
                        .publish(&message("payment", "Created", &format!(r#"{{"i":{i}}}"#)))
                        .await?;
                }
                let started = std::time::Instant::now();
                let batch = source.next_batch(10, Duration::from_millis(50)).await?;
                slowest = slowest.max(started.elapsed());
                got.extend(batch);
            }
            ensure!(
                slowest < Duration::from_secs(2),
                "a 50 ms fetch took {slowest:?}"
            );
            // Whatever the short fetches did not pick up arrives with a normal one.
            while got.len() < 4 {
                let more = receive(&mut source, 4 - got.len(), Duration::from_secs(10)).await?;
                ensure!(!more.is_empty(), "published messages went missing");
                got.extend(more);
            }
            ensure!(got.len() == 4, "{} deliveries for 4 messages", got.len());
            ack_all(got).await?;
            Ok(())
        })
        .await;
}
