//! Delivery, redelivery and nack: a published event is decoded and gone once acknowledged; a
//! dropped or crashed consumer's delivery comes again; a nack delivers again after its delay.

use std::time::Duration;

use anyhow::{Context as _, ensure};
use outbox_core::consumer::{Delivery, DeliverySource};
use tokio::time::Instant;

use super::steps::*;
use super::{DELIVERY_WITHIN, Redelivery, SourceHarness, SourceSettings};
use crate::message;

/// A published event (every field exercising the encoding) is delivered once, counted 1,
/// decoded into exactly the published fields, with its raw message (body, content type, every
/// header the transport sent) kept, and [`DeliverySource::decode`] of that raw message gives the
/// same event. Acknowledged, it is not delivered again after the ack wait, lag is 0, and a
/// restarted consumer does not get it either.
///
/// # Errors
/// The first broken expectation.
pub async fn delivered_event_is_decoded_and_gone_once_acked<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::with_ack_wait(Duration::from_secs(1));
    let mut source = h.source(&settings).await?;
    let msg = message::rich();
    h.publish(&msg).await?;

    let d = receive_one(&mut source, DELIVERY_WITHIN).await?;
    check_count(&caps, &d, 1, "first delivery")?;
    let event = event_of(&d)?;
    check_event(event, &msg)?;
    let raw = d.raw();
    ensure!(
        raw.payload == msg.payload.bytes,
        "raw body differs from the payload"
    );
    ensure!(
        raw.content_type.as_ref() == Some(&msg.payload.content_type.0),
        "raw content type {:?}",
        raw.content_type
    );
    let sent = h.encode(&msg)?;
    for (name, value) in &sent.headers {
        ensure!(
            raw.headers.get(name) == Some(value),
            "raw header `{name}` is {:?}; the transport sent {value:?}",
            raw.headers.get(name)
        );
    }
    ensure!(
        source.decode(raw).as_ref() == Ok(event),
        "decoding the kept raw message gives {:?}, the live delivery {event:?}",
        source.decode(raw)
    );

    ack_and_expect_it_gone(&mut source, d, &caps, &settings).await?;
    drop(source);
    let mut restarted = h.source(&settings).await?;
    expect_nothing(&mut restarted, Duration::from_secs(1))
        .await
        .context("a restarted consumer after the ack")
}

/// A delivery dropped without ack or nack (the handler gave up before its commit) is
/// delivered again, counted 2: after its ack wait (2 s) where the broker has one (nothing in
/// the first 300 ms, and not sooner than 80 % of it, measured from when the client had the
/// delivery), at once where the source requeues it. Acknowledged, it stays gone.
///
/// # Errors
/// The first broken expectation.
pub async fn dropped_delivery_is_delivered_again<H: SourceHarness>(h: &H) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::with_ack_wait(Duration::from_secs(2));
    let mut source = h.source(&settings).await?;
    let (msg, first) = publish_and_receive(h, &mut source, "dropped").await?;
    let delivered = Instant::now();
    drop(first);

    let again = match caps.dropped_delivery {
        Redelivery::AfterAckWait => {
            expect_nothing(&mut source, Duration::from_millis(300))
                .await
                .context("before the ack wait expired")?;
            let again = receive_one(&mut source, DELIVERY_WITHIN).await?;
            let after = delivered.elapsed();
            ensure!(
                after >= settings.ack_wait.mul_f64(0.8),
                "delivered again {after:?} after being dropped, before the ack wait of {:?}",
                settings.ack_wait
            );
            again
        }
        Redelivery::AtOnce => receive_one(&mut source, DELIVERY_WITHIN).await?,
    };
    is_again(&caps, &again, &msg, 2, "after the drop")?;
    ack_and_expect_it_gone(&mut source, again, &caps, &settings).await
}

/// A consumer crashes while holding an unacknowledged delivery (its source and delivery vanish
/// before any commit): the next consumer gets the event, counted 2; acknowledged there, a third
/// consumer does not get it.
///
/// # Errors
/// The first broken expectation.
pub async fn crashed_consumer_leaves_its_delivery_to_the_next<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::with_ack_wait(Duration::from_secs(1));
    let mut crashing = h.source(&settings).await?;
    let (msg, held) = publish_and_receive(h, &mut crashing, "crashed").await?;
    drop(crashing);
    drop(held);

    let mut next = h.source(&settings).await?;
    let again = receive_one(&mut next, DELIVERY_WITHIN + settings.ack_wait).await?;
    is_again(&caps, &again, &msg, 2, "at the next consumer")?;
    again.ack().await.context("ack")?;
    drop(next);
    let mut third = h.source(&settings).await?;
    expect_nothing(&mut third, settings.ack_wait + Duration::from_secs(1))
        .await
        .context("a third consumer after the ack")
}

/// `nack(500 ms)` delivers again no sooner than the delay and within 5 s more (the ack wait
/// is 30 s), counted 2; `nack(0)` delivers again, counted 3; acknowledged, lag is 0.
///
/// # Errors
/// The first broken expectation.
pub async fn nack_delivers_again_after_its_delay<H: SourceHarness>(h: &H) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::default();
    let mut source = h.source(&settings).await?;
    let (msg, first) = publish_and_receive(h, &mut source, "nacked").await?;
    let delay = Duration::from_millis(500);
    let nacked = Instant::now();
    first.nack(delay).await.context("nack")?;
    let second = receive_one(&mut source, DELIVERY_WITHIN).await?;
    let after = nacked.elapsed();
    ensure!(
        after >= delay.mul_f64(0.9) && after < delay + Duration::from_secs(5),
        "nack({delay:?}) delivered again after {after:?} (the ack wait is {:?})",
        settings.ack_wait
    );
    is_again(&caps, &second, &msg, 2, "after nack with a delay")?;

    second.nack(Duration::ZERO).await.context("nack(0)")?;
    let third = receive_one(&mut source, DELIVERY_WITHIN).await?;
    is_again(&caps, &third, &msg, 3, "after nack(0)")?;
    third.ack().await.context("ack")?;
    check_lag(&mut source, &caps, 0, 0, "all acknowledged").await
}
