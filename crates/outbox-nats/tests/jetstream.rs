//! Integration tests against the real NATS server (JetStream enabled) at
//! `OUTBOX_TEST_NATS_URL` (default `nats://127.0.0.1:4222`). A missing server fails the tests.
//!
//! Every test uses its own stream name and subject prefix and deletes its stream at the end,
//! so the tests run in parallel and leave nothing behind.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use futures::StreamExt;
use outbox_core::{Fingerprint, OutboxMessage, Payload, PublishErrorKind, Transport};
use outbox_nats::async_nats::{self, jetstream};
use outbox_nats::{NatsConfig, NatsConnectError, NatsTransport};
use uuid::Uuid;

fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// One test's private stream and subject space.
struct Fixture {
    stream: String,
    prefix: String,
}

impl Fixture {
    fn new() -> Self {
        let id = Uuid::now_v7().simple().to_string();
        Self {
            stream: format!("OUTBOX_TEST_{id}"),
            prefix: format!("outboxtest{id}"),
        }
    }

    fn config(&self) -> NatsConfig {
        NatsConfig {
            stream: self.stream.clone(),
            stream_subjects: vec![format!("{}.>", self.prefix)],
            subject_template: format!("{}.{{aggregate_type}}.{{event_type}}", self.prefix),
            ..NatsConfig::default()
        }
    }

    async fn transport(&self) -> NatsTransport {
        self.transport_with(self.config()).await
    }

    async fn transport_with(&self, config: NatsConfig) -> NatsTransport {
        let url = nats_url();
        match NatsTransport::connect(&url, config).await {
            Ok(t) => t,
            Err(e) => panic!(
                "the NATS server with JetStream must run at {url} (set OUTBOX_TEST_NATS_URL): {e}"
            ),
        }
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

/// An independent client (not the transport's connection) for reading back and cleanup.
async fn reader() -> jetstream::Context {
    let url = nats_url();
    let client = async_nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("the NATS server must run at {url}: {e}"));
    jetstream::new(client)
}

async fn delete_stream(name: &str) {
    let js = reader().await;
    if let Err(e) = js.delete_stream(name).await {
        // A test that never created its stream has nothing to delete.
        eprintln!("deleting stream {name}: {e}");
    }
}

async fn stream_info(name: &str) -> anyhow::Result<jetstream::stream::Info> {
    let mut stream = reader().await.get_stream(name).await?;
    Ok(stream.info().await?.clone())
}

fn message(aggregate_type: &str, event_type: &str, payload: Payload) -> OutboxMessage {
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

fn json(body: &str) -> Payload {
    Payload::bytes("application/json", body.as_bytes().to_vec())
}

fn header<'a>(msg: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str())
}

#[tokio::test]
async fn publish_is_acked_and_read_back_with_every_header() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            assert_eq!(transport.name(), "nats");

            let body = r#"{"amount":100,"currency":"EUR","note":"café ✓"}"#;
            let mut msg = message("payment", "Payment.Created", json(body));
            msg.aggregate_id = "pay 42/ä".to_owned();
            msg.partition_key = Some("merchant-9".to_owned());
            msg.headers.insert(
                "traceparent".to_owned(),
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
            );
            msg.headers
                .insert("tenant".to_owned(), "acme corp".to_owned());
            let before = msg.clone();

            let receipt = transport.publish(&msg).await?;
            ensure!(!receipt.duplicate, "a first publish is not a duplicate");
            ensure!(msg == before, "publish must not modify the message");

            let stream = reader().await.get_stream(&fx.stream).await?;
            let consumer = stream
                .create_consumer(jetstream::consumer::pull::Config {
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ..Default::default()
                })
                .await?;
            let mut batch = consumer
                .fetch()
                .max_messages(1)
                .expires(Duration::from_secs(5))
                .messages()
                .await?;
            let got = batch
                .next()
                .await
                .context("no message in the stream")?
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            got.ack().await.map_err(|e| anyhow::anyhow!("{e}"))?;

            assert_eq!(
                got.subject.as_str(),
                format!("{}.payment.Payment_Created", fx.prefix)
            );
            assert_eq!(got.payload, Bytes::from(body));
            let id = msg.event_id.hyphenated().to_string();
            let time = msg
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            let expected = [
                ("ce-specversion", "1.0".to_owned()),
                ("ce-id", id.clone()),
                ("ce-source", "/outbox".to_owned()),
                ("ce-type", "Payment.Created".to_owned()),
                ("ce-subject", "pay%2042/%C3%A4".to_owned()),
                ("ce-time", time),
                ("ce-aggregatetype", "payment".to_owned()),
                ("ce-aggregateid", "pay%2042/%C3%A4".to_owned()),
                ("ce-aggregateversion", "7".to_owned()),
                ("ce-schemaversion", "1".to_owned()),
                ("ce-partitionkey", "merchant-9".to_owned()),
                (
                    "ce-payloadsha256",
                    Fingerprint::of(body.as_bytes()).to_hex(),
                ),
                ("ce-datacontenttype", "application/json".to_owned()),
                ("Content-Type", "application/json".to_owned()),
                ("Nats-Msg-Id", id),
                (
                    "traceparent",
                    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned(),
                ),
                ("tenant", "acme corp".to_owned()),
            ];
            for (name, value) in expected {
                assert_eq!(header(&got, name), Some(value.as_str()), "header {name}");
            }
            Ok(())
        })
        .await;
}

#[tokio::test]
async fn republish_is_reported_duplicate_and_stored_once() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let msg = message("payment", "PaymentCreated", json(r#"{"n":1}"#));
            let first = transport.publish(&msg).await?;
            let second = transport.publish(&msg).await?;
            ensure!(!first.duplicate, "first publish reported duplicate");
            ensure!(second.duplicate, "republish not reported duplicate");
            let info = stream_info(&fx.stream).await?;
            assert_eq!(info.state.messages, 1);
            Ok(())
        })
        .await;
}

#[tokio::test]
async fn oversized_message_is_too_large_and_transport_keeps_working() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let max = transport.client().server_info().max_payload;
            ensure!(max > 1000, "server max_payload {max} looks wrong");

            let big = message(
                "payment",
                "Big",
                Payload::bytes("application/octet-stream", vec![b'x'; max + 1]),
            );
            let err = transport.publish(&big).await.expect_err("over max_payload");
            assert_eq!(err.kind, PublishErrorKind::TooLarge, "{err}");
            assert!(!err.is_retryable());

            // The payload alone fits; with the headers the message does not.
            let edge = message(
                "payment",
                "Edge",
                Payload::bytes("application/octet-stream", vec![b'x'; max - 50]),
            );
            let err = transport.publish(&edge).await.expect_err("headers count");
            assert_eq!(err.kind, PublishErrorKind::TooLarge, "{err}");

            let small = message("payment", "Small", json("{}"));
            transport.publish(&small).await?;
            let info = stream_info(&fx.stream).await?;
            assert_eq!(info.state.messages, 1);
            Ok(())
        })
        .await;
}

#[tokio::test]
async fn stream_max_message_size_maps_to_too_large() {
    Fixture::new()
        .run(|fx| async move {
            // The stream refuses messages the server would accept: a server-side refusal.
            reader()
                .await
                .create_stream(jetstream::stream::Config {
                    name: fx.stream.clone(),
                    subjects: vec![format!("{}.>", fx.prefix)],
                    max_message_size: 2048,
                    duplicate_window: Duration::from_secs(120),
                    ..Default::default()
                })
                .await?;
            let transport = fx.transport().await;
            let msg = message(
                "payment",
                "Big",
                Payload::bytes("application/octet-stream", vec![b'x'; 4096]),
            );
            let err = transport
                .publish(&msg)
                .await
                .expect_err("stream max_msg_size");
            assert_eq!(err.kind, PublishErrorKind::TooLarge, "{err}");
            transport
                .publish(&message("payment", "Small", json("{}")))
                .await?;
            Ok(())
        })
        .await;
}

#[tokio::test]
async fn connect_to_dead_address_fails_fast() {
    let config = NatsConfig {
        connect_timeout_secs: 2,
        ..NatsConfig::default()
    };
    let started = Instant::now();
    let result = NatsTransport::connect("nats://127.0.0.1:1", config).await;
    let elapsed = started.elapsed();
    match result {
        Err(
            NatsConnectError::Connect { url, .. } | NatsConnectError::ConnectTimedOut { url, .. },
        ) => {
            assert_eq!(url, "nats://127.0.0.1:1");
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("connected to a dead address"),
    }
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
}

#[tokio::test]
async fn invalid_config_is_refused_before_connecting() {
    let config = NatsConfig {
        stream: "bad.name".to_owned(),
        ..NatsConfig::default()
    };
    match NatsTransport::connect(&nats_url(), config).await {
        Err(NatsConnectError::Config(e)) => assert_eq!(e.key, "stream"),
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("accepted an invalid stream name"),
    }
}

#[tokio::test]
async fn subject_without_stream_is_rejected() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let mut msg = message("payment", "Orphan", json("{}"));
            msg.destination = Some(format!("nostream{}.x", Uuid::now_v7().simple()));
            let started = Instant::now();
            let err = transport.publish(&msg).await.expect_err("no stream bound");
            assert_eq!(err.kind, PublishErrorKind::Rejected, "{err}");
            assert!(err.is_retryable());
            // No responders is answered at once, not after the ack timeout.
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "{:?}",
                started.elapsed()
            );
            Ok(())
        })
        .await;
}

#[tokio::test]
async fn invalid_subject_is_invalid() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            for bad in ["a..b", "a.*", "a.>", "a b", ""] {
                let mut msg = message("payment", "X", json("{}"));
                msg.destination = Some(bad.to_owned());
                let err = transport.publish(&msg).await.expect_err(bad);
                assert_eq!(err.kind, PublishErrorKind::Invalid, "{bad:?}: {err}");
            }
            let mut msg = message("payment", "X", json("{}"));
            msg.headers
                .insert("Content-Type".to_owned(), "text/plain".to_owned());
            let err = transport.publish(&msg).await.expect_err("reserved header");
            assert_eq!(err.kind, PublishErrorKind::Invalid, "{err}");
            Ok(())
        })
        .await;
}

#[tokio::test]
async fn two_thousand_concurrent_publishes() {
    Fixture::new()
        .run(|fx| async move {
            let transport = fx.transport().await;
            let messages: Vec<OutboxMessage> = (0..2000)
                .map(|i| {
                    let mut m = message("payment", "Created", json(&format!(r#"{{"i":{i}}}"#)));
                    m.aggregate_id = format!("pay-{i}");
                    m
                })
                .collect();
            let results =
                futures::future::join_all(messages.iter().map(|m| transport.publish(m))).await;
            for (i, r) in results.iter().enumerate() {
                if let Err(e) = r {
                    panic!("publish {i} failed: {e}");
                }
            }
            ensure!(results.iter().all(|r| matches!(r, Ok(rc) if !rc.duplicate)));
            let info = stream_info(&fx.stream).await?;
            assert_eq!(info.state.messages, 2000);
            Ok(())
        })
        .await;
}

#[tokio::test]
async fn created_stream_has_configured_dedup_window_and_existing_is_left_alone() {
    Fixture::new()
        .run(|fx| async move {
            let config = NatsConfig {
                duplicate_window_secs: 300,
                ..fx.config()
            };
            let _t = fx.transport_with(config).await;
            let info = stream_info(&fx.stream).await?;
            assert_eq!(info.config.duplicate_window, Duration::from_secs(300));
            assert_eq!(info.config.storage, jetstream::stream::StorageType::File);
            assert_eq!(info.config.subjects, vec![format!("{}.>", fx.prefix)]);

            // A second start with a different window neither fails nor changes the stream.
            let config = NatsConfig {
                duplicate_window_secs: 600,
                ..fx.config()
            };
            let t = fx.transport_with(config).await;
            let info = stream_info(&fx.stream).await?;
            assert_eq!(info.config.duplicate_window, Duration::from_secs(300));
            t.publish(&message("payment", "Created", json("{}")))
                .await?;
            Ok(())
        })
        .await;
}

#[tokio::test]
async fn without_ensure_stream_a_missing_stream_is_not_created() {
    Fixture::new()
        .run(|fx| async move {
            let config = NatsConfig {
                ensure_stream: false,
                ..fx.config()
            };
            let transport = fx.transport_with(config).await;
            ensure!(
                reader().await.get_stream(&fx.stream).await.is_err(),
                "stream was created although ensure_stream is off"
            );
            let err = transport
                .publish(&message("payment", "Created", json("{}")))
                .await
                .expect_err("no stream");
            assert_eq!(err.kind, PublishErrorKind::Rejected, "{err}");
            Ok(())
        })
        .await;
}
