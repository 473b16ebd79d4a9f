//! A lost connection: reported as `Unavailable`, an ack on it never a success, and deliveries
//! again once the broker is back.

use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use outbox_core::consumer::{Delivery, DeliverySource, SourceErrorKind};

use super::steps::*;
use super::{RECOVERY_WITHIN, SourceHarness, SourceSettings};
use crate::{message, wait};

/// Through a [`Proxy`]: an event is held unacknowledged, then the connection is cut. The
/// source reports the loss as [`SourceErrorKind::Unavailable`] (never a delivery on the cut
/// link), and acknowledging the held delivery fails as `Unavailable`: it never pretends. Once
/// restored, the source delivers again (only `Unavailable` meanwhile): an event published after
/// the outage arrives, and the held one comes again (counted at least 2) where a failed ack
/// certainly did not apply; once all are acknowledged, lag is 0.
///
/// # Errors
/// The first broken expectation.
///
/// [`Proxy`]: crate::net::Proxy
pub async fn connection_loss_keeps_unacknowledged_deliveries<H: SourceHarness>(
    h: &H,
) -> anyhow::Result<()> {
    let caps = h.capabilities();
    let settings = SourceSettings::with_ack_wait(Duration::from_secs(2));
    let proxy = h.outage_proxy().await?;
    let mut source = h.source_through(&proxy, &settings).await?;
    let (lost, held) = publish_and_receive(h, &mut source, "loss").await?;

    proxy.cut();
    let err = wait::until(
        "the source reports the lost connection",
        RECOVERY_WITHIN,
        async || match source.next_batch(10, Duration::from_millis(200)).await {
            Ok(batch) if batch.is_empty() => Ok(None),
            Ok(batch) => bail!("{} deliveries on a cut connection", batch.len()),
            Err(e) => Ok(Some(e)),
        },
    )
    .await?;
    ensure!(
        err.kind == SourceErrorKind::Unavailable,
        "the lost connection was reported as {err}, not Unavailable"
    );
    let held_metadata = held.raw().metadata.clone();
    match held.ack().await {
        Ok(()) => bail!("an ack on a cut connection reported success"),
        Err(e) => ensure!(
            e.kind == SourceErrorKind::Unavailable,
            "an ack on a cut connection failed as {e}, not Unavailable"
        ),
    }

    proxy.restore();
    let after = message::event("loss", 2, &b"{\"n\":2}"[..]);
    h.publish(&after).await?;
    let (mut lost_again, mut after_seen) = (false, false);
    wait::until(
        "the event after the outage (and, where a failed ack is final, the held one) delivered",
        RECOVERY_WITHIN,
        async || {
            match source.next_batch(10, Duration::from_millis(500)).await {
                Err(e) => ensure!(
                    e.kind == SourceErrorKind::Unavailable,
                    "while reconnecting: {e}, not Unavailable"
                ),
                Ok(batch) => {
                    for d in batch {
                        let id = event_of(&d)?.event_id;
                        if id == lost.event_id {
                            lost_again = true;
                            // Where the broker may take back a redelivery that went to the
                            // dead connection (JetStream, about 1 run in 20), the count may not
                            // have grown; the attempt cap then parks one delivery later.
                            if caps.counts_deliveries {
                                let count = d.delivery_count().unwrap_or(0);
                                let least = if caps.count_grows_across_cuts { 2 } else { 1 };
                                ensure!(
                                    count >= least,
                                    "delivered again, counted {count}: first {held_metadata:?}, \
                                     again {:?}",
                                    d.raw().metadata
                                );
                            }
                        } else if id == after.event_id {
                            after_seen = true;
                        } else {
                            bail!("an unknown event {id}");
                        }
                        d.ack().await.context("ack after the reconnect")?;
                    }
                }
            }
            let settled = after_seen && (lost_again || !caps.failed_ack_redelivers);
            Ok((settled && matches!(source.lag().await, Ok(Some(0) | None))).then_some(()))
        },
    )
    .await
    .with_context(|| {
        format!("event after the outage seen: {after_seen}, held event seen again: {lost_again}")
    })?;
    check_lag(
        &mut source,
        &caps,
        0,
        0,
        "all acknowledged after the outage",
    )
    .await
}
