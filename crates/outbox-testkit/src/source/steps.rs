//! The helpers the source cases share: receiving, expecting nothing, checking a decoded event,
//! a delivery count, a redelivery and lag.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use outbox_core::OutboxMessage;
use outbox_core::consumer::{Delivery, DeliverySource};
use outbox_core::wire::{self, IncomingEvent};
use tokio::time::Instant;

use super::{DELIVERY_WITHIN, LagCounts, SourceCapabilities, SourceHarness, SourceSettings};
use crate::message;

/// Calls [`DeliverySource::next_batch`] until `n` deliveries arrived.
///
/// # Errors
/// A source error, or fewer than `n` deliveries within `within`.
pub async fn receive<S: DeliverySource>(
    source: &mut S,
    n: usize,
    within: Duration,
) -> anyhow::Result<Vec<S::Delivery>> {
    let deadline = Instant::now() + within;
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        ensure!(
            !left.is_zero(),
            "{} of {n} deliveries arrived within {within:?}",
            out.len()
        );
        let batch = source
            .next_batch(n - out.len(), left.min(Duration::from_secs(1)))
            .await
            .context("next_batch")?;
        out.extend(batch);
    }
    Ok(out)
}

/// One delivery, within `within`.
///
/// # Errors
/// As [`receive`].
pub async fn receive_one<S: DeliverySource>(
    source: &mut S,
    within: Duration,
) -> anyhow::Result<S::Delivery> {
    let mut one = receive(source, 1, within).await?;
    one.pop().context("no delivery")
}

/// Waits `wait` for deliveries and fails if any comes.
///
/// # Errors
/// A source error, or a delivery (named by event id or decode error).
pub async fn expect_nothing<S: DeliverySource>(
    source: &mut S,
    wait: Duration,
) -> anyhow::Result<()> {
    let batch = source.next_batch(10, wait).await.context("next_batch")?;
    if let Some(d) = batch.first() {
        bail!(
            "{} unexpected deliveries, the first {}",
            batch.len(),
            describe(d)
        );
    }
    Ok(())
}

/// The decoded event of a delivery that must be valid.
///
/// # Errors
/// The decode error.
pub fn event_of<D: Delivery>(delivery: &D) -> anyhow::Result<&IncomingEvent> {
    delivery
        .event()
        .as_ref()
        .map_err(|e| anyhow::anyhow!("a valid event was delivered as malformed: {e}"))
}

/// Acknowledges every delivery.
///
/// # Errors
/// The first ack that failed.
pub async fn ack_all<D: Delivery>(deliveries: Vec<D>) -> anyhow::Result<()> {
    for d in deliveries {
        d.ack().await.context("ack")?;
    }
    Ok(())
}

/// A delivery as a failure message names it: the event (id, aggregate and version) or the
/// decode error, its delivery count, and where the broker says it was read from (the raw
/// message's metadata: a Kafka offset, a stream sequence), so a duplicate or a skip shows which.
pub(super) fn describe<D: Delivery>(d: &D) -> String {
    let what = match d.event() {
        Ok(e) => format!(
            "event {} ({} {} v{})",
            e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version
        ),
        Err(e) => format!("malformed message ({e})"),
    };
    format!(
        "{what}, delivery count {:?}, read at {:?}",
        d.delivery_count(),
        d.raw().metadata
    )
}

/// Checks that `event` carries exactly the fields of `message` as published with the default
/// CloudEvents source.
///
/// # Errors
/// Naming the first difference.
pub fn check_event(event: &IncomingEvent, message: &OutboxMessage) -> anyhow::Result<()> {
    let field = |name: &str, got: &dyn std::fmt::Debug, published: &dyn std::fmt::Debug| {
        anyhow::anyhow!(
            "event {}: `{name}` decoded as {got:?}, published as {published:?}",
            message.event_id
        )
    };
    macro_rules! same {
        ($name:literal, $got:expr, $published:expr) => {
            if $got != $published {
                return Err(field($name, &$got, &$published));
            }
        };
    }
    same!("event_id", event.event_id, message.event_id);
    same!("event_type", event.event_type, message.event_type);
    same!("source", event.source.as_str(), wire::DEFAULT_SOURCE);
    same!(
        "aggregate_type",
        event.aggregate_type,
        message.aggregate_type
    );
    same!("aggregate_id", event.aggregate_id, message.aggregate_id);
    same!(
        "aggregate_version",
        event.aggregate_version,
        message.aggregate_version
    );
    same!(
        "schema_version",
        event.schema_version,
        message.schema_version
    );
    same!(
        "partition_key",
        event.partition_key.as_str(),
        message.partition_key()
    );
    same!("time", event.time, Some(message.created_at));
    same!(
        "content type",
        event.payload.content_type,
        message.payload.content_type
    );
    same!("fingerprint", event.fingerprint, message.fingerprint);
    same!("headers", event.headers, message.headers);
    ensure!(
        event.payload.bytes == message.payload.bytes,
        "event {}: the payload differs ({} bytes decoded, {} published)",
        message.event_id,
        event.payload.bytes.len(),
        message.payload.bytes.len()
    );
    Ok(())
}

/// Checks a delivery's count where the backend counts.
pub(super) fn check_count<D: Delivery>(
    caps: &SourceCapabilities,
    d: &D,
    expected: u32,
    when: &str,
) -> anyhow::Result<()> {
    if caps.counts_deliveries {
        ensure!(
            d.delivery_count() == Some(expected),
            "{when}: delivery count {:?}, expected {expected}",
            d.delivery_count()
        );
    }
    Ok(())
}

/// Publishes one event of `aggregate` and receives it on `source`: its first delivery,
/// counted 1.
pub(super) async fn publish_and_receive<H: SourceHarness>(
    h: &H,
    source: &mut H::Source,
    aggregate: &str,
) -> anyhow::Result<(OutboxMessage, <H::Source as DeliverySource>::Delivery)> {
    let msg = message::event(aggregate, 1, &b"{\"n\":1}"[..]);
    h.publish(&msg).await?;
    let first = receive_one(source, DELIVERY_WITHIN).await?;
    is_again(&h.capabilities(), &first, &msg, 1, "first delivery")?;
    Ok((msg, first))
}

/// Checks that `d` is `msg` delivered for the `count`th time (where the backend counts).
pub(super) fn is_again<D: Delivery>(
    caps: &SourceCapabilities,
    d: &D,
    msg: &OutboxMessage,
    count: u32,
    when: &str,
) -> anyhow::Result<()> {
    ensure!(
        event_of(d)?.event_id == msg.event_id,
        "{when}: {} came instead of event {}",
        describe(d),
        msg.event_id
    );
    check_count(caps, d, count, when)
}

/// Acknowledges `d`, then checks that nothing comes again (not even after the ack wait) and
/// that lag is 0.
pub(super) async fn ack_and_expect_it_gone<S: DeliverySource>(
    source: &mut S,
    d: S::Delivery,
    caps: &SourceCapabilities,
    settings: &SourceSettings,
) -> anyhow::Result<()> {
    d.ack().await.context("ack")?;
    expect_nothing(source, settings.ack_wait + Duration::from_secs(1))
        .await
        .context("after the ack")?;
    check_lag(source, caps, 0, 0, "all acknowledged").await
}

/// Checks `lag` against `waiting` undelivered and `unacked` delivered, unacknowledged messages,
/// as the backend counts them.
pub(super) async fn check_lag<S: DeliverySource>(
    source: &mut S,
    caps: &SourceCapabilities,
    waiting: u64,
    unacked: u64,
    when: &str,
) -> anyhow::Result<()> {
    let expected = match caps.lag {
        LagCounts::Nothing => None,
        LagCounts::Waiting => Some(waiting),
        LagCounts::WaitingAndUnacknowledged => Some(waiting + unacked),
    };
    let lag = source.lag().await.context("lag")?;
    ensure!(
        lag == expected,
        "{when} ({waiting} waiting, {unacked} unacknowledged): lag {lag:?}, expected {expected:?} \
         ({:?})",
        caps.lag
    );
    Ok(())
}
