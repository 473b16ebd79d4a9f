//! Header blocks the client library cannot parse, published raw (an `HPUB` written by hand on
//! a TCP socket) into the real JetStream stream, each followed by a valid event: [`NatsSource`]
//! delivers both, the hostile one as a malformed delivery holding the bytes it came with, and
//! its connection is never reset (async-nats 0.51 as published dropped the connection on each
//! of them, and JetStream sent the message again after every ack wait). Fetch and prefetch
//! modes. A missing server fails the tests.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use common::{Fixture, nats_url};
use futures::StreamExt as _;
use outbox_core::consumer::{Delivery, DeliverySource};
use outbox_core::{DecodeError, Transport};
use outbox_nats::async_nats::{self, connection::State};
use outbox_nats::{NatsSource, raw_header_block};
use outbox_testkit::harness::run;
use outbox_testkit::message;
use outbox_testkit::nats_wire::{Hostile, RawNats};
use outbox_testkit::source::{SourceSettings, ack_all, expect_nothing, receive};
use outbox_testkit::transport::TransportHarness as _;

/// The acceptance's bound: the valid event behind a hostile one arrives within this.
const WITHIN: Duration = Duration::from_secs(5);

/// A source with a long ack wait, so that a delivery lost with a dropped connection would not
/// come back within the test.
async fn source(fx: &Fixture) -> anyhow::Result<NatsSource> {
    let config = fx.consumer_config(&SourceSettings::with_ack_wait(Duration::from_secs(30)));
    Ok(NatsSource::connect(&nats_url(), config).await?)
}

/// Fails unless `source`'s client connected once (at start) and is connected now.
fn never_reset(source: &NatsSource) -> anyhow::Result<()> {
    let connects = source.client().statistics().connects.load(Ordering::SeqCst);
    ensure!(
        connects == 1,
        "the consumer's connection was reset {} times",
        connects - 1
    );
    ensure!(source.client().connection_state() == State::Connected);
    Ok(())
}

/// Each hostile form, then a valid event: both delivered within 5 s in stream order, the
/// hostile one malformed with its bytes and a reason, no disconnection; acknowledged, neither
/// comes back.
async fn hostile_then_valid(fx: &Fixture) -> anyhow::Result<()> {
    let transport = fx.transport().await?;
    let mut source = source(fx).await?;
    let mut raw = RawNats::connect(&nats_url()).await?;
    for form in Hostile::ALL {
        let poison = message::event(&format!("hostile-{form:?}"), 1, &b"{\"a\":1}"[..]);
        let headers = transport.headers_for(&poison)?;
        let block = form.block(&headers);
        raw.publish_stored(
            &transport.subject_for(&poison)?,
            &block,
            &poison.payload.bytes,
        )
        .await
        .with_context(|| format!("{form:?}"))?;
        let valid = message::event(&format!("valid-after-{form:?}"), 1, &b"{}"[..]);
        transport.publish(&valid).await?;

        let got = receive(&mut source, 2, WITHIN)
            .await
            .with_context(|| format!("{form:?} and the valid event behind it"))?;
        let (hostile, good) = (&got[0], &got[1]);
        ensure!(
            good.event().as_ref().map(|e| e.event_id) == Ok(valid.event_id),
            "{form:?}: the valid event second, got {:?}",
            good.event()
        );
        let raw_msg = hostile.raw();
        ensure!(
            raw_msg.payload == poison.payload.bytes,
            "{form:?}: the body"
        );
        ensure!(
            raw_msg.headers.get("ce-id") == Some(&poison.event_id.to_string()),
            "{form:?}: the readable id beside the defect: {raw_msg:?}"
        );
        let error = hostile.event().as_ref().err().cloned();
        match form {
            Hostile::ValueNotUtf8 => {
                let ce_type = Hostile::invalid_value(&headers);
                ensure!(
                    raw_msg.binary_headers.get("ce-type").map(|b| b.to_vec()) == ce_type,
                    "{form:?}: the value byte for byte: {raw_msg:?}"
                );
                ensure!(
                    matches!(error, Some(DecodeError::Invalid { name: "type", .. })),
                    "{form:?}: {error:?}"
                );
            }
            Hostile::LineWithoutColon | Hostile::NameNotUtf8 => {
                ensure!(
                    raw_header_block(raw_msg) == Some(block.as_slice()),
                    "{form:?}: the header block byte for byte: {raw_msg:?}"
                );
                ensure!(
                    matches!(error, Some(DecodeError::Protocol(_))),
                    "{form:?}: {error:?}"
                );
            }
        }
        ensure!(
            source.decode(raw_msg).err() == error,
            "{form:?}: a stored copy decodes as the live delivery"
        );
        ensure!(
            source.identify(raw_msg).event_id == Some(poison.event_id),
            "{form:?}: identified by the id beside the defect"
        );
        ack_all(got).await?;
    }
    expect_nothing(&mut source, Duration::from_secs(1)).await?;
    never_reset(&source)?;
    source.release().await;
    Ok(())
}

#[tokio::test]
async fn hostile_header_blocks_are_delivered_without_a_reset() {
    run(Fixture::start(), hostile_then_valid).await;
}

#[tokio::test]
async fn hostile_header_blocks_are_delivered_without_a_reset_when_prefetching() {
    run(Fixture::start_prefetching(), hostile_then_valid).await;
}

/// A user header whose value is not UTF-8 (a producer writing Latin-1) is no reason to refuse
/// the event: it decodes, the header reaching the handler with U+FFFD for the invalid byte, as
/// on the other brokers.
#[tokio::test]
async fn a_user_header_that_is_not_utf8_still_decodes() {
    run(Fixture::start(), async |fx: &Fixture| {
        let transport = fx.transport().await?;
        let mut source = source(fx).await?;
        let mut raw = RawNats::connect(&nats_url()).await?;
        let event = message::event("latin-1", 1, &b"{}"[..]);
        let mut lines: Vec<Vec<u8>> = transport
            .headers_for(&event)?
            .iter()
            .map(|(n, v)| format!("{n}: {v}").into_bytes())
            .collect();
        lines.push(b"tenant: caf\xe9".to_vec());
        let lines: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
        let block = outbox_testkit::nats_wire::header_block(&lines);
        raw.publish_stored(
            &transport.subject_for(&event)?,
            &block,
            &event.payload.bytes,
        )
        .await?;
        let got = receive(&mut source, 1, WITHIN).await?;
        let decoded = got[0]
            .event()
            .as_ref()
            .map_err(|e| anyhow::anyhow!("refused: {e}"))?;
        ensure!(decoded.event_id == event.event_id);
        ensure!(decoded.headers.get("tenant").map(String::as_str) == Some("caf\u{FFFD}"));
        ensure!(got[0].raw().binary_headers["tenant"].as_ref() == b"caf\xe9");
        ack_all(got).await?;
        never_reset(&source)?;
        Ok(())
    })
    .await;
}

// The client library's own view, without the source: a plain subscription gets the message,
// with the block as received and the connection kept.
#[tokio::test]
async fn the_client_hands_over_what_it_cannot_parse() {
    run(Fixture::start(), async |fx: &Fixture| {
        let _transport = fx.transport().await?;
        let client = async_nats::connect(nats_url()).await?;
        let subject = format!("{}.plain.x", fx.prefix);
        let mut sub = client.subscribe(subject.clone()).await?;
        client.flush().await?;
        let mut raw = RawNats::connect(&nats_url()).await?;
        let block = Hostile::NameNotUtf8.block(&[("ce-id".into(), "1".into())]);
        // Stored by the stream too (it captures `<prefix>.>`); the subscription sees it live.
        raw.publish_stored(&subject, &block, b"body").await?;
        let message = tokio::time::timeout(WITHIN, sub.next())
            .await
            .context("nothing delivered")?
            .context("subscription ended")?;
        ensure!(message.headers.is_none());
        ensure!(message.invalid_headers.as_deref() == Some(block.as_slice()));
        ensure!(message.payload.as_ref() == b"body");
        client.flush().await?;
        ensure!(client.statistics().connects.load(Ordering::SeqCst) == 1);
        Ok(())
    })
    .await;
}
