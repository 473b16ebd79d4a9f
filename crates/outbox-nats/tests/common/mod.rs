//! One test's private JetStream stream, subject space and durable name on the real NATS server
//! (`OUTBOX_TEST_NATS_URL`, default `nats://127.0.0.1:4222`), and the conformance harnesses of
//! `outbox-testkit` over it. A missing server fails the tests.
//!
//! The stream is created by the first transport (`ensure_stream`) and deleted by
//! [`Harness::cleanup`], so tests run in parallel and leave nothing behind.
#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;

use anyhow::Context as _;
use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::{self, ErrorCode};
use bytes::Bytes;
use outbox_core::consumer::RawMessage;
use outbox_core::{OutboxMessage, PublishErrorKind, Transport};
use outbox_nats::async_nats;
use outbox_nats::{
    CE_PREFIX, CONTENT_TYPE_HEADER, MSG_ID_HEADER, NatsConfig, NatsConsumerConfig, NatsSource,
    NatsTransport,
};
use outbox_testkit::env::NATS;
use outbox_testkit::harness::Harness;
use outbox_testkit::source::{
    LagCounts, Redelivery, SourceCapabilities, SourceHarness, SourceSettings,
};
use outbox_testkit::transport::{Received, Timeouts, TransportCapabilities, TransportHarness};
use tokio::sync::{Mutex, OnceCell};
use uuid::Uuid;

pub fn nats_url() -> String {
    NATS.url()
}

/// A client of its own (never a transport's or a source's connection), for reading back,
/// publishing by hand and cleanup.
pub async fn jetstream() -> anyhow::Result<jetstream::Context> {
    let client = async_nats::connect(nats_url())
        .await
        .map_err(|e| NATS.unreachable(e))?;
    Ok(jetstream::new(client))
}

/// One test's stream `OUTBOX_TEST_<id>` capturing `outboxtest<id>.>`, and durable
/// `consumer-<id>`.
pub struct Fixture {
    pub stream: String,
    pub prefix: String,
    pub durable: String,
    pub js: jetstream::Context,
    /// The transport the source harness publishes with; creating it creates the stream.
    publisher: OnceCell<NatsTransport>,
    /// Next stream sequence `take_arrived` reads.
    next_sequence: Mutex<u64>,
    /// The sources' `prefetch` (0: a fetch per batch).
    pub prefetch: usize,
}

impl Fixture {
    /// Names only: nothing exists on the server until a transport is made.
    pub async fn start() -> anyhow::Result<Self> {
        let id = Uuid::now_v7().simple().to_string();
        Ok(Self {
            stream: format!("OUTBOX_TEST_{id}"),
            prefix: format!("outboxtest{id}"),
            durable: format!("consumer-{id}"),
            js: jetstream().await?,
            publisher: OnceCell::new(),
            next_sequence: Mutex::new(1),
            prefetch: 0,
        })
    }

    /// As [`Fixture::start`], with sources that keep pull requests for 32 messages open (more
    /// than the suite's largest batch, so that a batch can be full).
    pub async fn start_prefetching() -> anyhow::Result<Self> {
        Ok(Self {
            prefetch: 32,
            ..Self::start().await?
        })
    }

    /// The transport configuration: this fixture's stream, subjects `<prefix>.>` and template
    /// `<prefix>.{aggregate_type}.{event_type}`, a 10 s ack timeout.
    pub fn config(&self) -> NatsConfig {
        NatsConfig {
            stream: self.stream.clone(),
            stream_subjects: vec![format!("{}.>", self.prefix)],
            subject_template: format!("{}.{{aggregate_type}}.{{event_type}}", self.prefix),
            ack_timeout_secs: 10,
            ..NatsConfig::default()
        }
    }

    pub async fn transport_with(&self, config: NatsConfig) -> anyhow::Result<NatsTransport> {
        NatsTransport::connect(&nats_url(), config)
            .await
            .map_err(|e| NATS.unreachable(e))
    }

    /// The consumer configuration for this fixture's stream and durable.
    pub fn consumer_config(&self, settings: &SourceSettings) -> NatsConsumerConfig {
        NatsConsumerConfig {
            stream: self.stream.clone(),
            durable_name: self.durable.clone(),
            ack_wait_secs: settings.ack_wait.as_secs().max(1),
            max_ack_pending: u64::from(settings.max_unacked),
            max_message_bytes: settings.max_message_bytes,
            // A prefetch over max_ack_pending is refused; the server would not fill it anyway.
            prefetch: self.prefetch.min(usize::from(settings.max_unacked)),
            ..NatsConsumerConfig::default()
        }
    }

    pub async fn stream_info(&self) -> anyhow::Result<jetstream::stream::Info> {
        let mut stream = self.js.get_stream(&self.stream).await?;
        Ok(stream.info().await?.clone())
    }

    async fn publisher(&self) -> anyhow::Result<&NatsTransport> {
        self.publisher.get_or_try_init(|| self.transport()).await
    }
}

impl Harness for Fixture {
    fn broker_url(&self) -> String {
        nats_url()
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        match self.js.delete_stream(&self.stream).await {
            Ok(_) => Ok(()),
            // A test that never made a transport has no stream.
            Err(e)
                if matches!(e.kind(), GetStreamErrorKind::JetStream(ref js)
                    if js.error_code() == ErrorCode::STREAM_NOT_FOUND) =>
            {
                Ok(())
            }
            Err(e) => Err(anyhow::anyhow!("deleting stream {}: {e}", self.stream)),
        }
    }
}

/// Undoes the binding's percent-encoding of `ce-` values (`%XX` is one UTF-8 byte).
fn percent_decoded(value: &str) -> anyhow::Result<String> {
    let mut bytes = Vec::with_capacity(value.len());
    let mut rest = value.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = tail
                .get(..2)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .with_context(|| format!("bad percent-encoding in {value:?}"))?;
            bytes.push(hex);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    Ok(String::from_utf8(bytes)?)
}

/// A stored message with the NATS binding undone: `ce-*` headers are attributes,
/// `Nats-Msg-Id` the message id, `Content-Type` the content type, the rest user headers.
fn received(message: jetstream::message::StreamMessage) -> anyhow::Result<Received> {
    let mut r = Received {
        message_id: None,
        attributes: BTreeMap::new(),
        content_type: None,
        headers: BTreeMap::new(),
        payload: message.payload,
    };
    for (name, values) in message.headers.iter() {
        let name: &str = name.as_ref();
        let value = values
            .iter()
            .map(|v| v.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let lower = name.to_ascii_lowercase();
        if let Some(attribute) = lower.strip_prefix(CE_PREFIX) {
            r.attributes
                .insert(attribute.to_owned(), percent_decoded(&value)?);
        } else if name.eq_ignore_ascii_case(MSG_ID_HEADER) {
            r.message_id = Some(value);
        } else if name.eq_ignore_ascii_case(CONTENT_TYPE_HEADER) {
            r.content_type = Some(value);
        } else {
            r.headers.insert(name.to_owned(), value);
        }
    }
    Ok(r)
}

impl TransportHarness for Fixture {
    type Transport = NatsTransport;

    async fn transport_at(&self, url: &str, timeouts: Timeouts) -> anyhow::Result<NatsTransport> {
        let config = match timeouts {
            Timeouts::Normal => self.config(),
            Timeouts::Short => NatsConfig {
                ack_timeout_secs: 2,
                ..self.config()
            },
        };
        NatsTransport::connect(url, config)
            .await
            .map_err(|e| NATS.unreachable(e))
    }

    async fn take_arrived(&self) -> anyhow::Result<Vec<Received>> {
        let mut stream = self.js.get_stream(&self.stream).await?;
        let last = stream.info().await?.state.last_sequence;
        let mut next = self.next_sequence.lock().await;
        let mut out = Vec::new();
        while *next <= last {
            let message = stream
                .get_raw_message(*next)
                .await
                .with_context(|| format!("reading sequence {next}"))?;
            out.push(received(message)?);
            *next += 1;
        }
        Ok(out)
    }

    async fn capabilities(&self) -> anyhow::Result<TransportCapabilities> {
        let max = self.js.client().server_info().max_payload;
        anyhow::ensure!(max > 8192, "the server's max_payload of {max} looks wrong");
        // The message the suite publishes at the largest accepted size, without its payload:
        // what its headers take of max_payload (plus a margin for the encoder's rounding).
        let sample = outbox_testkit::message::sized("oversize", 100, 0);
        let headers = self.publisher().await?.headers_for(&sample)?;
        let header_block = "NATS/1.0\r\n\r\n".len()
            + headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + ": \r\n".len())
                .sum::<usize>();
        Ok(TransportCapabilities {
            deduplicates: true,
            refused_destinations: vec![
                ("a..b".to_owned(), PublishErrorKind::Invalid),
                ("a.*".to_owned(), PublishErrorKind::Invalid),
                ("a.>".to_owned(), PublishErrorKind::Invalid),
                ("a b".to_owned(), PublishErrorKind::Invalid),
                (String::new(), PublishErrorKind::Invalid),
                // No stream captures it: no responders, answered at once.
                (
                    format!("nostream{}.x", Uuid::now_v7().simple()),
                    PublishErrorKind::Rejected,
                ),
            ],
            reserved_headers: [
                "Content-Type",
                "ce-id",
                "CE-Type",
                "Nats-Msg-Id",
                "nats-expected-stream",
            ]
            .map(str::to_owned)
            .to_vec(),
            // Over max_payload; and a payload that fits alone but not with its headers.
            too_large_payloads: vec![max + 1, max - 50],
            largest_accepted_payload: max - header_block - 16,
        })
    }
}

impl SourceHarness for Fixture {
    type Source = NatsSource;

    async fn source_at(&self, url: &str, settings: &SourceSettings) -> anyhow::Result<NatsSource> {
        self.publisher().await?;
        NatsSource::connect(url, self.consumer_config(settings))
            .await
            .map_err(|e| NATS.unreachable(e))
    }

    async fn publish(&self, message: &OutboxMessage) -> anyhow::Result<()> {
        self.publisher().await?.publish(message).await?;
        Ok(())
    }

    fn encode(&self, message: &OutboxMessage) -> anyhow::Result<RawMessage> {
        let publisher = self
            .publisher
            .get()
            .context("encode before any source or publish made the transport")?;
        Ok(RawMessage {
            payload: message.payload.bytes.clone(),
            headers: publisher.headers_for(message)?.into_iter().collect(),
            content_type: Some(message.payload.content_type.0.clone()),
            ..RawMessage::default()
        })
    }

    fn attribute_header(&self, attribute: &str) -> String {
        format!("{CE_PREFIX}{attribute}")
    }

    async fn publish_raw(&self, raw: &RawMessage) -> anyhow::Result<()> {
        let subject = format!("{}.raw", self.prefix);
        let mut headers = async_nats::HeaderMap::new();
        for (name, value) in &raw.headers {
            headers.insert(name.as_str(), value.as_str());
        }
        if let Some(content_type) = &raw.content_type
            && !raw
                .headers
                .keys()
                .any(|n| n.eq_ignore_ascii_case(CONTENT_TYPE_HEADER))
        {
            headers.insert(CONTENT_TYPE_HEADER, content_type.as_str());
        }
        let payload: Bytes = raw.payload.clone();
        let ack = if headers.is_empty() {
            self.js.publish(subject, payload).await?
        } else {
            self.js
                .publish_with_headers(subject, headers, payload)
                .await?
        };
        ack.await.context("no PublishAck for a hand-made message")?;
        Ok(())
    }

    fn set_attribute_bytes(&self, raw: &mut RawMessage, attribute: &str, value: &[u8]) {
        let encoded: String = value.iter().map(|b| format!("%{b:02X}")).collect();
        raw.headers
            .insert(format!("{CE_PREFIX}{attribute}"), encoded);
    }

    fn capabilities(&self) -> SourceCapabilities {
        SourceCapabilities {
            counts_deliveries: true,
            dropped_delivery: Redelivery::AfterAckWait,
            lag: LagCounts::WaitingAndUnacknowledged,
            failed_ack_redelivers: false,
            count_grows_across_cuts: false,
        }
    }
}
