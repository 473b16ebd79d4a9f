//! Lag and batches: lag counts what waits and falls to 0; batches hold at most `max`, come in
//! publish order, drain everything, and an empty one waits.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use outbox_core::consumer::{Delivery, DeliverySource};
use tokio::time::Instant;

use super::steps::*;
use super::{DELIVERY_WITHIN, LagCounts, SourceHarness, SourceSettings};
use crate::{message, wait};

/// With one unacknowledged delivery allowed: lag is 0 on an empty source; one event held and
/// ten more published, lag counts the ten waiting (plus the held one where the broker counts
/// unacknowledged deliveries); the held one acknowledged and the next one held, one less;
/// everything acknowledged, 0.
///
/// # Errors
/// The first broken expectation.
pub async fn lag_counts_waiting_messages_then_falls_to_zero<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings {
        max_unacked: 1,
        ..SourceSettings::default()
    };
    let mut source = h.source(&settings).await?;
    check_lag(&mut source, &caps, 0, 0, "nothing published").await?;
    if caps.lag == LagCounts::Nothing {
        return Ok(());
    }
    h.publish(&message::event("lag", 1, &b"{}"[..])).await?;
    let held = receive_one(&mut source, DELIVERY_WITHIN).await?;
    for version in 2..=11 {
        h.publish(&message::event("lag", version, &b"{}"[..]))
            .await?;
    }
    check_lag(&mut source, &caps, 10, 1, "one held, ten published").await?;
    held.ack().await.context("ack")?;
    let next = receive_one(&mut source, DELIVERY_WITHIN).await?;
    ensure!(
        event_of(&next)?.aggregate_version == 2,
        "not the next event"
    );
    check_lag(
        &mut source,
        &caps,
        9,
        1,
        "the first acknowledged, the next held",
    )
    .await?;
    next.ack().await.context("ack")?;
    for version in 3..=11 {
        let d = receive_one(&mut source, DELIVERY_WITHIN).await?;
        ensure!(
            event_of(&d)?.aggregate_version == version,
            "expected version {version}, got {}",
            describe(&d)
        );
        d.ack().await.context("ack")?;
    }
    check_lag(&mut source, &caps, 0, 0, "all acknowledged").await
}

/// Fifty events of one aggregate: batches of at most 20 (at least one full) that come as soon
/// as messages are there, in publish order, without duplicates, drain everything; then an empty
/// batch waits for its wait (the runner does not spin), a batch of at most 0 is empty at once,
/// and lag is 0.
///
/// # Errors
/// The first broken expectation.
pub async fn batches_respect_max_and_drain_in_order<H: SourceHarness>(h: &H) -> anyhow::Result<()> {
    const EVENTS: i64 = 50;
    const MAX: usize = 20;
    let batch_wait = Duration::from_secs(5);
    let caps = h.capabilities();
    let mut source = h.source(&SourceSettings::default()).await?;
    for version in 1..=EVENTS {
        h.publish(&message::event(
            "batch",
            version,
            format!("{{\"v\":{version}}}"),
        ))
        .await?;
    }
    if caps.lag == LagCounts::Waiting {
        // Where lag counts only undelivered messages, 0 means the broker handed all of them to
        // the consumer: batches can then be full.
        wait::until(
            "the broker hands every message to the consumer",
            DELIVERY_WITHIN,
            async || Ok((source.lag().await.context("lag")? == Some(0)).then_some(())),
        )
        .await?;
    }

    let mut order = Vec::new();
    let mut sizes = Vec::new();
    while order.len() < usize::try_from(EVENTS)? {
        ensure!(
            sizes.len() < 2 * usize::try_from(EVENTS)?,
            "not drained after {} batches of sizes {sizes:?}",
            sizes.len()
        );
        let started = Instant::now();
        let batch = source
            .next_batch(MAX, batch_wait)
            .await
            .context("next_batch")?;
        let took = started.elapsed();
        ensure!(
            batch.len() <= MAX,
            "a batch of {} for max {MAX}",
            batch.len()
        );
        ensure!(
            !batch.is_empty(),
            "an empty batch while {} events wait",
            usize::try_from(EVENTS)? - order.len()
        );
        ensure!(
            took < batch_wait,
            "a batch took {took:?} although messages were waiting"
        );
        sizes.push(batch.len());
        for d in batch {
            order.push(event_of(&d)?.aggregate_version);
            d.ack().await.context("ack")?;
        }
    }
    ensure!(
        order == (1..=EVENTS).collect::<Vec<_>>(),
        "delivered in the order {order:?}"
    );
    ensure!(
        sizes.contains(&MAX),
        "no batch was full (sizes {sizes:?}): a batch takes up to max of the waiting messages"
    );

    let started = Instant::now();
    let empty = source
        .next_batch(MAX, Duration::from_secs(1))
        .await
        .context("next_batch")?;
    let took = started.elapsed();
    ensure!(
        empty.is_empty(),
        "{} deliveries after the drain",
        empty.len()
    );
    ensure!(
        took >= Duration::from_millis(800),
        "an empty batch returned after {took:?}, before its 1 s wait: the runner would spin"
    );
    let started = Instant::now();
    let none = source
        .next_batch(0, batch_wait)
        .await
        .context("next_batch(0)")?;
    ensure!(none.is_empty(), "a batch of at most 0 held {}", none.len());
    ensure!(
        started.elapsed() < batch_wait,
        "a batch of at most 0 waited {:?}",
        started.elapsed()
    );
    check_lag(&mut source, &caps, 0, 0, "all acknowledged").await
}
