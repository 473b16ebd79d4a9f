//! The [`Transport`] conformance suite.
//!
//! A backend implements [`TransportHarness`] in its `tests/` directory and runs every case with
//! [`transport_suite!`](crate::transport_suite). Each case is a public async function taking the
//! harness, so a backend may also call one directly.
//!
//! What the cases check, for every transport:
//!
//! * `Ok` means stored: right after [`Transport::publish`] returned `Ok`, an independent reader
//!   finds the message, with the event id as the broker's message id, every CloudEvents
//!   attribute, the content type, the user headers and the exact payload bytes.
//! * A republish of the same message is byte-identical; a broker with a dedup window reports it
//!   as a duplicate and stores one copy.
//! * One aggregate's sequential publishes are stored in order.
//! * An oversize message is [`PublishErrorKind::TooLarge`] and the next publish still works.
//! * Refused destinations and reserved header names fail with the kind the backend documents,
//!   promptly, and store nothing.
//! * During an outage (connections cut, or stalled) no publish is `Ok`; each fails with a
//!   retryable kind within a bound, and publishing works again once the broker is reachable.
//! * Many concurrent publishes are all confirmed and stored.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use outbox_core::wire::{self, attr};
use outbox_core::{OutboxMessage, PublishErrorKind, Transport};
use tokio::time::Instant;

use crate::harness::Harness;
use crate::net::Proxy;
use crate::{message, wait};

/// A refusal the broker answers at once (no route, bad name) must come sooner than this: it
/// must not wait for an acknowledgement timeout.
pub const PROMPT: Duration = Duration::from_secs(5);

/// Longest a publish may take to fail during an outage (the harness's proxied transport uses
/// short timeouts).
pub const OUTAGE_ERROR_WITHIN: Duration = Duration::from_secs(20);

/// Longest a transport may take to publish again once the broker is reachable again.
pub const RECOVERY_WITHIN: Duration = Duration::from_secs(60);

/// How many publishes the concurrency case makes at once.
pub const CONCURRENT_PUBLISHES: usize = 2000;

/// One message as the broker stored it, read back by an independent client (not the
/// transport's connection), with the protocol binding undone by the harness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The broker's own message id or dedup key (`Nats-Msg-Id`, AMQP `message_id`).
    pub message_id: Option<String>,
    /// The CloudEvents attributes by bare name (`id`, `type`, `aggregateversion` ...), with any
    /// protocol escaping undone.
    pub attributes: BTreeMap<String, String>,
    /// The protocol's content type.
    pub content_type: Option<String>,
    /// The user headers: every header that is not part of the protocol binding.
    pub headers: BTreeMap<String, String>,
    /// The body.
    pub payload: Bytes,
}

/// What a transport refuses, and how its broker treats a republish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportCapabilities {
    /// The broker deduplicates by event id within a window (NATS `Nats-Msg-Id`): a republish
    /// is reported as [`PublishReceipt::duplicate`](outbox_core::PublishReceipt::duplicate)
    /// and stored once. Without dedup it is stored again, and never reported as a duplicate.
    pub deduplicates: bool,
    /// Destinations (overrides) the transport refuses, each with the kind it documents
    /// ([`PublishErrorKind::Invalid`] for what the protocol cannot express,
    /// [`PublishErrorKind::Rejected`] for what the broker cannot route). At least one.
    pub refused_destinations: Vec<(String, PublishErrorKind)>,
    /// User header names that would shadow a header of the protocol binding; each is refused
    /// as [`PublishErrorKind::Invalid`].
    pub reserved_headers: Vec<String>,
    /// Payload sizes the transport refuses as [`PublishErrorKind::TooLarge`]. At least one.
    pub too_large_payloads: Vec<usize>,
    /// A payload size it accepts, as close to the limit as the backend can tell.
    pub largest_accepted_payload: usize,
}

/// How the transport suite reaches one backend.
///
/// Every harness owns fresh broker resources (stream and subjects, or exchange and a bound
/// queue) that no other test uses, created when it is built and removed by
/// [`Harness::cleanup`]. Its transports use the default CloudEvents `source`
/// ([`wire::DEFAULT_SOURCE`]) and route every message without a destination override (any
/// aggregate type, any event type) to where [`TransportHarness::take_arrived`] reads.
pub trait TransportHarness: Harness {
    /// The transport under test.
    type Transport: Transport;

    /// A transport on this harness's resources, connected to the broker at `url` (the
    /// broker's own, or a [`Proxy`]'s) with `timeouts`.
    fn transport_at(
        &self,
        url: &str,
        timeouts: Timeouts,
    ) -> impl Future<Output = anyhow::Result<Self::Transport>> + Send;

    /// The messages stored since the previous call, in the order the broker stored them, read
    /// with an independent client. Reads only what is already stored: it never waits for more.
    fn take_arrived(&self) -> impl Future<Output = anyhow::Result<Vec<Received>>> + Send;

    /// What the transport refuses (may ask the broker for its limits).
    fn capabilities(&self) -> impl Future<Output = anyhow::Result<TransportCapabilities>> + Send;

    /// A transport connected straight to the broker, with [`Timeouts::Normal`].
    fn transport(&self) -> impl Future<Output = anyhow::Result<Self::Transport>> + Send {
        async move {
            let url = self.broker_url();
            self.transport_at(&url, Timeouts::Normal).await
        }
    }

    /// A transport whose connections go through `proxy`, with [`Timeouts::Short`].
    fn transport_through(
        &self,
        proxy: &Proxy,
    ) -> impl Future<Output = anyhow::Result<Self::Transport>> + Send {
        async move {
            let url = proxy.url(&self.broker_url())?;
            self.transport_at(&url, Timeouts::Short)
                .await
                .context("connecting through the proxy")
        }
    }
}

/// How long a transport waits before it gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeouts {
    /// The backend's usual settings, with acknowledgement timeouts of several seconds (refusals
    /// must still come within [`PROMPT`]).
    Normal,
    /// For outages: a publish that gets no acknowledgement fails within a few seconds (well
    /// within [`OUTAGE_ERROR_WITHIN`]), and reconnect attempts are not held back for long.
    Short,
}

/// Runs every transport case as its own `#[tokio::test]`, each on a fresh harness from
/// `$start`: an async function (or closure) returning `anyhow::Result<impl TransportHarness>`.
///
/// ```ignore
/// mod transport {
///     outbox_testkit::transport_suite!(crate::common::Fixture::start);
/// }
/// ```
#[macro_export]
macro_rules! transport_suite {
    ($start:expr) => {
        $crate::__conformance_cases!(transport, $start;
            publish_is_stored_with_the_event_id_and_attributes,
            republish_is_byte_identical,
            sequential_publishes_keep_per_aggregate_order,
            oversize_is_too_large_and_the_next_publish_works,
            refused_destinations_and_reserved_headers_fail_as_documented,
            cut_connection_fails_retryably_then_recovers,
            stalled_connection_is_never_ok_then_recovers,
            concurrent_publishes_are_all_confirmed,
        );
    };
}

/// Checks that `got` is `message` as published: event id as the message id, every CloudEvents
/// attribute (and no stray one), content type, user headers and payload bytes.
///
/// # Errors
/// Naming the first difference.
pub fn check_received(got: &Received, message: &OutboxMessage) -> anyhow::Result<()> {
    let id = message.event_id.hyphenated().to_string();
    ensure!(
        got.message_id.as_deref() == Some(id.as_str()),
        "the broker's message id is {:?}, not the event id {id}",
        got.message_id
    );
    let expected: BTreeMap<&str, String> = wire::attributes(message, wire::DEFAULT_SOURCE)
        .into_iter()
        .collect();
    for (name, value) in &expected {
        ensure!(
            got.attributes.get(*name) == Some(value),
            "event {id}: attribute `{name}` stored as {:?}, published as {value:?}",
            got.attributes.get(*name)
        );
    }
    let content_type = &message.payload.content_type.0;
    for (name, value) in &got.attributes {
        ensure!(
            expected.contains_key(name.as_str())
                || (name == "datacontenttype" && value == content_type),
            "event {id}: unexpected attribute `{name}` = {value:?}"
        );
    }
    ensure!(
        got.content_type.as_ref() == Some(content_type),
        "event {id}: content type stored as {:?}, published as {content_type:?}",
        got.content_type
    );
    ensure!(
        got.headers == message.headers,
        "event {id}: user headers stored as {:?}, published as {:?}",
        got.headers,
        message.headers
    );
    ensure!(
        got.payload == message.payload.bytes,
        "event {id}: the stored payload ({} bytes) is not the published one ({} bytes)",
        got.payload.len(),
        message.payload.bytes.len()
    );
    Ok(())
}

/// Takes what arrived and checks that it is exactly `expected`, in that order.
///
/// # Errors
/// Naming the first difference.
pub async fn expect_stored<H: TransportHarness>(
    h: &H,
    expected: &[&OutboxMessage],
) -> anyhow::Result<()> {
    let arrived = h.take_arrived().await?;
    ensure!(
        arrived.len() == expected.len(),
        "{} messages stored; exactly the {} acknowledged ones may be",
        arrived.len(),
        expected.len()
    );
    for (got, message) in arrived.iter().zip(expected) {
        check_received(got, message)?;
    }
    Ok(())
}

/// A destination for messages: long ones are shortened.
fn shown(destination: &str) -> String {
    if destination.len() > 40 {
        let head: String = destination.chars().take(20).collect();
        format!("{head:?}... ({} bytes)", destination.len())
    } else {
        format!("{destination:?}")
    }
}

/// `Ok` means stored: one publish of an event with every field exercising the encoding is
/// read back at once, with the event id as the broker's message id and every CloudEvents
/// attribute, user header and payload byte as published; publishing does not alter the
/// message.
///
/// # Errors
/// The first broken expectation.
pub async fn publish_is_stored_with_the_event_id_and_attributes<H: TransportHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let transport = h.transport().await?;
    ensure!(!transport.name().is_empty(), "the transport has no name");
    let msg = message::rich();
    let before = msg.clone();
    let receipt = transport
        .publish(&msg)
        .await
        .context("publishing one event")?;
    ensure!(
        !receipt.duplicate,
        "a first publish was reported as a duplicate"
    );
    ensure!(msg == before, "publish altered the message");
    expect_stored(h, &[&msg]).await
}

/// A republish (the relay's retry after a crash) carries the same event id and byte-identical
/// payload, headers and attributes. A broker with dedup reports it as a duplicate and stores
/// one copy; one without stores a second, identical copy and does not claim a duplicate.
///
/// # Errors
/// The first broken expectation.
pub async fn republish_is_byte_identical<H: TransportHarness>(h: &H) -> anyhow::Result<()> {
    let caps = h.capabilities().await?;
    let transport = h.transport().await?;
    let msg = message::rich();
    let first = transport.publish(&msg).await.context("first publish")?;
    ensure!(
        !first.duplicate,
        "a first publish was reported as a duplicate"
    );
    let second = transport.publish(&msg).await.context("republish")?;
    let arrived = h.take_arrived().await?;
    if caps.deduplicates {
        ensure!(
            second.duplicate,
            "a republish inside the dedup window was not reported as a duplicate"
        );
        ensure!(
            arrived.len() == 1,
            "{} copies stored; dedup keeps one",
            arrived.len()
        );
    } else {
        ensure!(
            !second.duplicate,
            "a republish was reported as a duplicate by a broker the harness says has no dedup"
        );
        ensure!(
            arrived.len() == 2,
            "{} copies stored after a publish and a republish",
            arrived.len()
        );
        ensure!(
            arrived[0] == arrived[1],
            "the republished copy differs from the first: {:?} vs {:?}",
            arrived[0],
            arrived[1]
        );
    }
    for copy in &arrived {
        check_received(copy, &msg)?;
    }
    Ok(())
}

/// Two aggregates publish 25 versions each, one after the other per aggregate and both at
/// once: each aggregate's versions are stored in order, nothing is lost or doubled.
///
/// # Errors
/// The first broken expectation.
pub async fn sequential_publishes_keep_per_aggregate_order<H: TransportHarness>(
    h: &H,
) -> anyhow::Result<()> {
    const VERSIONS: i64 = 25;
    let transport = h.transport().await?;
    let publish_in_order = |aggregate: &'static str| {
        let transport = &transport;
        async move {
            for version in 1..=VERSIONS {
                let m = message::event(aggregate, version, format!("{{\"v\":{version}}}"));
                transport
                    .publish(&m)
                    .await
                    .with_context(|| format!("publishing {aggregate} v{version}"))?;
            }
            anyhow::Ok(())
        }
    };
    let (a, b) = tokio::join!(publish_in_order("order-a"), publish_in_order("order-b"));
    a?;
    b?;
    let arrived = h.take_arrived().await?;
    ensure!(
        arrived.len() == 2 * usize::try_from(VERSIONS)?,
        "{} messages stored for {} publishes",
        arrived.len(),
        2 * VERSIONS
    );
    for aggregate in ["order-a", "order-b"] {
        let versions: Vec<i64> = arrived
            .iter()
            .filter(|r| r.attributes.get(attr::AGGREGATE_ID).map(String::as_str) == Some(aggregate))
            .map(|r| {
                r.attributes
                    .get(attr::AGGREGATE_VERSION)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(-1)
            })
            .collect();
        ensure!(
            versions == (1..=VERSIONS).collect::<Vec<_>>(),
            "{aggregate}'s versions were stored in the order {versions:?}"
        );
    }
    Ok(())
}

/// Every size the harness names as too large is [`PublishErrorKind::TooLarge`] (not
/// retryable) and stores nothing; the largest accepted size and a small message right after
/// are published and stored intact.
///
/// # Errors
/// The first broken expectation.
pub async fn oversize_is_too_large_and_the_next_publish_works<H: TransportHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities().await?;
    ensure!(
        !caps.too_large_payloads.is_empty(),
        "the harness names no payload size the transport refuses"
    );
    ensure!(
        caps.too_large_payloads
            .iter()
            .all(|&len| len > caps.largest_accepted_payload),
        "the harness's sizes contradict each other: {caps:?}"
    );
    let transport = h.transport().await?;
    for (version, &len) in (1..).zip(&caps.too_large_payloads) {
        let big = message::sized("oversize", version, len);
        match transport.publish(&big).await {
            Ok(receipt) => {
                bail!("a {len}-byte payload was accepted ({receipt:?}); it is too large")
            }
            Err(e) => {
                ensure!(
                    e.kind == PublishErrorKind::TooLarge,
                    "a {len}-byte payload failed with {e}, not TooLarge"
                );
                ensure!(!e.is_retryable(), "TooLarge must not be retried: {e}");
            }
        }
    }
    let fits = message::sized("oversize", 100, caps.largest_accepted_payload);
    transport.publish(&fits).await.with_context(|| {
        format!(
            "publishing {} bytes, which the harness says fit",
            caps.largest_accepted_payload
        )
    })?;
    let small = publish_after_refusals(&transport, "oversize").await?;
    expect_stored(h, &[&fits, &small]).await
}

/// Each refused destination fails with the kind the backend documents, within [`PROMPT`]
/// (a refusal is not a timeout), and so does each reserved header name (`Invalid`); nothing
/// is stored, and the transport publishes the next message normally.
///
/// # Errors
/// The first broken expectation.
pub async fn refused_destinations_and_reserved_headers_fail_as_documented<H: TransportHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities().await?;
    ensure!(
        !caps.refused_destinations.is_empty(),
        "the harness names no destination the transport refuses"
    );
    let transport = h.transport().await?;
    let mut refusals: Vec<(String, OutboxMessage, PublishErrorKind)> = Vec::new();
    for (destination, kind) in &caps.refused_destinations {
        let mut m = message::event("refused", 1, &b"{}"[..]);
        m.destination = Some(destination.clone());
        refusals.push((format!("destination {}", shown(destination)), m, *kind));
    }
    for name in &caps.reserved_headers {
        let mut m = message::event("refused", 1, &b"{}"[..]);
        m.headers.insert(name.clone(), "x".to_owned());
        refusals.push((format!("header {name:?}"), m, PublishErrorKind::Invalid));
    }
    for (what, m, kind) in &refusals {
        let started = Instant::now();
        let result = transport.publish(m).await;
        let took = started.elapsed();
        match result {
            Ok(receipt) => bail!("{what} was published ({receipt:?}); it must fail as {kind:?}"),
            Err(e) => {
                ensure!(
                    e.kind == *kind,
                    "{what} failed with {e}, documented as {kind:?}"
                );
                ensure!(
                    took < PROMPT,
                    "{what} was refused only after {took:?}: an immediate refusal must not wait for a timeout"
                );
            }
        }
    }
    let ok = publish_after_refusals(&transport, "refused").await?;
    expect_stored(h, &[&ok]).await
}

/// Publishes a small event of `aggregate` (version 1000) after refused publishes: the
/// transport must still work.
async fn publish_after_refusals<T: Transport>(
    transport: &T,
    aggregate: &str,
) -> anyhow::Result<OutboxMessage> {
    let ok = message::event(aggregate, 1000, &b"{}"[..]);
    transport
        .publish(&ok)
        .await
        .context("the publish after the refused ones")?;
    Ok(ok)
}

/// The broker becomes unreachable with its connections closed (crash, restart, network
/// reset): see [`outage`].
///
/// # Errors
/// The first broken expectation.
pub async fn cut_connection_fails_retryably_then_recovers<H: TransportHarness>(
    h: &H,
) -> anyhow::Result<()> {
    outage(h, Outage::Cut).await
}

/// The broker becomes unreachable with its connections left open and silent (a
/// packet-dropping network): see [`outage`]. The acknowledgement never comes, so the publish
/// must time out, never succeed.
///
/// # Errors
/// The first broken expectation.
pub async fn stalled_connection_is_never_ok_then_recovers<H: TransportHarness>(
    h: &H,
) -> anyhow::Result<()> {
    outage(h, Outage::Stall).await
}

/// How [`outage`] makes the broker unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// [`Proxy::cut`].
    Cut,
    /// [`Proxy::stall`].
    Stall,
}

/// Through a [`Proxy`]: a publish before the outage is `Ok`; during it, three attempts each fail
/// within [`OUTAGE_ERROR_WITHIN`] with [`PublishErrorKind::Unavailable`] or
/// [`PublishErrorKind::TimedOut`], never `Ok`; once restored, republishing the same message (as
/// the relay does) succeeds within [`RECOVERY_WITHIN`], with only retryable errors meanwhile,
/// and a new message after it too. Every acknowledged message is stored, nothing else is, and
/// the message published during the outage is stored once where the broker deduplicates.
///
/// # Errors
/// The first broken expectation.
pub async fn outage<H: TransportHarness>(h: &H, outage: Outage) -> anyhow::Result<()> {
    let caps = h.capabilities().await?;
    let proxy = h.outage_proxy().await?;
    let transport = h.transport_through(&proxy).await?;
    let before = message::event("outage", 1, &b"{\"n\":1}"[..]);
    transport
        .publish(&before)
        .await
        .context("publishing before the outage")?;

    match outage {
        Outage::Cut => proxy.cut(),
        Outage::Stall => proxy.stall(),
    }
    let during = message::event("outage", 2, &b"{\"n\":2}"[..]);
    for attempt in 1..=3 {
        let result = tokio::time::timeout(OUTAGE_ERROR_WITHIN, transport.publish(&during))
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "attempt {attempt} during the outage ({outage:?}) was still waiting after \
                     {OUTAGE_ERROR_WITHIN:?}; it must give up with a retryable error"
                )
            })?;
        match result {
            Ok(receipt) => bail!(
                "attempt {attempt} during the outage ({outage:?}) returned Ok({receipt:?}): \
                 nothing can have acknowledged it"
            ),
            Err(e) => ensure!(
                matches!(
                    e.kind,
                    PublishErrorKind::Unavailable | PublishErrorKind::TimedOut
                ),
                "attempt {attempt} during the outage ({outage:?}) failed with {e}; expected \
                 Unavailable or TimedOut"
            ),
        }
    }

    proxy.restore();
    let mut last_error = None;
    wait::until(
        "publishing again once the broker is reachable",
        RECOVERY_WITHIN,
        async || match tokio::time::timeout(OUTAGE_ERROR_WITHIN, transport.publish(&during)).await {
            Err(_) => {
                bail!("a publish after the broker came back hung for {OUTAGE_ERROR_WITHIN:?}")
            }
            Ok(Ok(_)) => Ok(Some(())),
            Ok(Err(e)) if e.is_retryable() => {
                last_error = Some(e);
                Ok(None)
            }
            Ok(Err(e)) => bail!("a non-retryable error after the broker came back: {e}"),
        },
    )
    .await
    .with_context(|| format!("the last error: {last_error:?}"))?;
    let after = message::event("outage", 3, &b"{\"n\":3}"[..]);
    transport
        .publish(&after)
        .await
        .context("publishing after recovery")?;

    let arrived = h.take_arrived().await?;
    let copies = |m: &OutboxMessage| {
        let id = m.event_id.hyphenated().to_string();
        arrived
            .iter()
            .filter(|r| r.message_id.as_deref() == Some(id.as_str()))
            .count()
    };
    ensure!(
        copies(&before) == 1,
        "{} copies of the event before the outage",
        copies(&before)
    );
    ensure!(
        copies(&after) == 1,
        "{} copies of the event after it",
        copies(&after)
    );
    let during_copies = copies(&during);
    if caps.deduplicates {
        ensure!(
            during_copies == 1,
            "{during_copies} copies of the event retried across the outage; dedup keeps one"
        );
    } else {
        ensure!(
            during_copies >= 1,
            "the event acknowledged after the outage is not stored"
        );
    }
    ensure!(
        arrived.len() == 2 + during_copies,
        "{} messages stored, including some this case never published",
        arrived.len()
    );
    for r in &arrived {
        let m = [&before, &during, &after]
            .into_iter()
            .find(|m| r.message_id.as_deref() == Some(m.event_id.hyphenated().to_string().as_str()))
            .context("a stored message with an unknown id")?;
        check_received(r, m)?;
    }
    Ok(())
}

/// [`CONCURRENT_PUBLISHES`] publishes of different aggregates at once on one transport: all
/// are confirmed (none a duplicate) and exactly those are stored.
///
/// # Errors
/// The first broken expectation.
pub async fn concurrent_publishes_are_all_confirmed<H: TransportHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let transport = h.transport().await?;
    let messages: Vec<OutboxMessage> = (0..CONCURRENT_PUBLISHES)
        .map(|i| message::event(&format!("many-{i}"), 1, format!("{{\"i\":{i}}}")))
        .collect();
    let started = Instant::now();
    let results = futures::future::join_all(messages.iter().map(|m| transport.publish(m))).await;
    let took = started.elapsed();
    let failed: Vec<String> = results
        .iter()
        .zip(&messages)
        .filter_map(|(r, m)| match r {
            Ok(receipt) if receipt.duplicate => Some(format!("{}: reported duplicate", m.event_id)),
            Ok(_) => None,
            Err(e) => Some(format!("{}: {e}", m.event_id)),
        })
        .collect();
    ensure!(
        failed.is_empty(),
        "{} of {CONCURRENT_PUBLISHES} concurrent publishes failed, first: {}",
        failed.len(),
        failed[0]
    );
    let arrived = h.take_arrived().await?;
    let mut stored: Vec<&str> = arrived
        .iter()
        .filter_map(|r| r.message_id.as_deref())
        .collect();
    stored.sort_unstable();
    let mut published: Vec<String> = messages
        .iter()
        .map(|m| m.event_id.hyphenated().to_string())
        .collect();
    published.sort_unstable();
    ensure!(
        arrived.len() == CONCURRENT_PUBLISHES && stored == published,
        "{} messages stored ({} with a message id) for {CONCURRENT_PUBLISHES} confirmed \
         publishes, or other ids",
        arrived.len(),
        stored.len()
    );
    eprintln!("{CONCURRENT_PUBLISHES} concurrent publishes confirmed in {took:?}");
    Ok(())
}
