//! NATS-specific transport tests against the real server (JetStream enabled) at
//! `OUTBOX_TEST_NATS_URL` (default `nats://127.0.0.1:4222`): the NATS binding's subject and
//! header spelling, stream creation and its dedup window, a stream's own size limit, startup
//! errors. What every transport must do is in the conformance suite (`conformance.rs`).
//! A missing server fails the tests.

mod common;

use std::time::{Duration, Instant};

use anyhow::ensure;
use bytes::Bytes;
use common::{Fixture, nats_url};
use outbox_core::{Fingerprint, Payload, PublishErrorKind, Transport};
use outbox_nats::async_nats::jetstream;
use outbox_nats::{NatsConfig, NatsConnectError, NatsTransport};
use outbox_testkit::harness::run;
use outbox_testkit::message::{self, TRACEPARENT};
use outbox_testkit::transport::TransportHarness as _;

/// The subject comes from the template with each value made a token; every header is spelled
/// as the crate documents it, `ce-` values percent-encoded.
#[tokio::test]
async fn subject_and_headers_are_spelled_as_documented() {
    run(Fixture::start(), async |fx: &Fixture| {
        let transport = fx.transport().await?;
        assert_eq!(transport.name(), "nats");
        let body = r#"{"amount":100,"currency":"EUR","note":"café ✓"}"#;
        let mut msg = message::with_payload(
            message::event("pay 42/ä", 7, Bytes::new()),
            Payload::bytes("application/json", body),
        );
        msg.event_type = "Payment.Created".to_owned();
        msg.partition_key = Some("merchant-9".to_owned());
        msg.headers
            .insert("traceparent".to_owned(), TRACEPARENT.to_owned());
        msg.headers
            .insert("tenant".to_owned(), "acme corp".to_owned());
        transport.publish(&msg).await?;

        let stored = fx
            .js
            .get_stream(&fx.stream)
            .await?
            .get_raw_message(1)
            .await?;
        assert_eq!(
            stored.subject.as_str(),
            format!("{}.payment.Payment_Created", fx.prefix)
        );
        assert_eq!(stored.payload, Bytes::from(body));
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
            ("traceparent", TRACEPARENT.to_owned()),
            ("tenant", "acme corp".to_owned()),
        ];
        for (name, value) in &expected {
            assert_eq!(
                stored.headers.get(*name).map(|v| v.as_str()),
                Some(value.as_str()),
                "header {name}"
            );
        }
        assert_eq!(
            stored.headers.iter().count(),
            expected.len(),
            "no other header"
        );
        Ok(())
    })
    .await;
}

/// A stream whose `max_message_size` is below the server's `max_payload` refuses on the server
/// side; that refusal is `TooLarge` too, and the next publish works.
#[tokio::test]
async fn stream_max_message_size_maps_to_too_large() {
    run(Fixture::start(), async |fx: &Fixture| {
        fx.js
            .create_stream(jetstream::stream::Config {
                name: fx.stream.clone(),
                subjects: vec![format!("{}.>", fx.prefix)],
                max_message_size: 2048,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await?;
        let transport = fx.transport().await?;
        let err = transport
            .publish(&message::sized("pay-1", 1, 4096))
            .await
            .expect_err("over the stream's max_msg_size");
        assert_eq!(err.kind, PublishErrorKind::TooLarge, "{err}");
        transport.publish(&message::event("pay-1", 2, "{}")).await?;
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
async fn created_stream_has_configured_dedup_window_and_existing_is_left_alone() {
    run(Fixture::start(), async |fx: &Fixture| {
        let config = NatsConfig {
            duplicate_window_secs: 300,
            ..fx.config()
        };
        let _t = fx.transport_with(config).await?;
        let info = fx.stream_info().await?;
        assert_eq!(info.config.duplicate_window, Duration::from_secs(300));
        assert_eq!(info.config.storage, jetstream::stream::StorageType::File);
        assert_eq!(info.config.subjects, vec![format!("{}.>", fx.prefix)]);

        // A second start with a different window neither fails nor changes the stream.
        let config = NatsConfig {
            duplicate_window_secs: 600,
            ..fx.config()
        };
        let t = fx.transport_with(config).await?;
        let info = fx.stream_info().await?;
        assert_eq!(info.config.duplicate_window, Duration::from_secs(300));
        t.publish(&message::event("pay-1", 1, "{}")).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn without_ensure_stream_a_missing_stream_is_not_created() {
    run(Fixture::start(), async |fx: &Fixture| {
        let config = NatsConfig {
            ensure_stream: false,
            ..fx.config()
        };
        let transport = fx.transport_with(config).await?;
        ensure!(
            fx.js.get_stream(&fx.stream).await.is_err(),
            "stream was created although ensure_stream is off"
        );
        let err = transport
            .publish(&message::event("pay-1", 1, "{}"))
            .await
            .expect_err("no stream");
        assert_eq!(err.kind, PublishErrorKind::Rejected, "{err}");
        Ok(())
    })
    .await;
}
