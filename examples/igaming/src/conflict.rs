//! The conflict of `igaming run`: one already-delivered `BetSettled` sent again **with the same
//! event id and a changed payload** (a bigger payout), straight to the broker, the way a buggy
//! producer would (a producer that rebuilt the event from changed data and re-published it
//! under the id it had used before).
//!
//! Then the other mistake a producer can make: the same settlement re-emitted under a **new
//! event id** (a producer that lost track of what it sent and emitted the event again). The
//! inboxes take it for a new event; the history projection's ordering guard absorbs it as an
//! old version of the bet, and the ledger's business key `payout:<bet id>` refuses a second
//! posting: the payout consumer dead-letters it with that reason, and nothing is paid twice.
//!
//! The message is published with the broker's transport from `outbox::brokers()`
//! (`Transport::publish` of an `OutboxMessage`), as the relay would. On NATS, JetStream's
//! duplicate window drops a message whose `Nats-Msg-Id` (the event id) it saw within the
//! window, whatever its payload: the run's stream has a 2 s window, and a re-send the broker
//! reports as a duplicate is sent again after the window. Then it reaches the consumers, whose
//! inboxes find the event id with another fingerprint: an `inbox_conflicts` row, never applied.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox::{NewMessage, OutboxMessage, Payload, Transport};
use sqlx::PgPool;

use crate::bets::BetEvent;
use crate::topology::{AGGREGATE, BET_SETTLED, Topology};

/// What was re-sent.
#[derive(Debug, Clone)]
pub struct Injected {
    /// The bet whose settlement was re-sent.
    pub bet_id: String,
    /// The event id, the same as the delivered one's.
    pub event_id: outbox::EventId,
    /// The payout the ledger posted from the original event.
    pub original_payout: i64,
    /// The payout of the changed payload.
    pub changed_payout: i64,
    /// Re-sends the broker dropped as duplicates (NATS duplicate window) before one got through.
    pub dropped_by_broker: u32,
    /// The new event id the same settlement (the original payout) was re-emitted under.
    pub reemitted_event_id: outbox::EventId,
}

/// Picks a payout already posted in the ledger, rebuilds its `BetSettled` from the bets database
/// with the same event id and a payout 10 times bigger, and publishes it. `Ok(None)`: no payout
/// posted yet, try later.
///
/// # Errors
/// The databases or the broker cannot be reached, or the broker kept dropping the re-send.
pub async fn inject(
    broker_url: &str,
    topology: &Topology,
    bets: &PgPool,
    ledger: &PgPool,
    say: impl Fn(&str),
) -> Result<Option<Injected>> {
    let posted: Option<(String, uuid::Uuid, i64)> = sqlx::query_as(
        "SELECT bet_id, event_id, amount FROM ledger_postings ORDER BY posted_at LIMIT 1",
    )
    .fetch_optional(ledger)
    .await?;
    let Some((bet_id, event_id, original_payout)) = posted else {
        return Ok(None);
    };
    let (player, market, stake, odds_x100, version): (String, String, i64, i32, i64) =
        sqlx::query_as("SELECT player, market, stake, odds_x100, version FROM bets WHERE id = $1")
            .bind(&bet_id)
            .fetch_one(bets)
            .await
            .context("the paid bet is not in the bets database")?;
    let changed_payout = original_payout * 10;
    let settled = |payout| BetEvent {
        id: bet_id.clone(),
        player: player.clone(),
        market: market.clone(),
        stake,
        odds_x100: i64::from(odds_x100),
        outcome: Some("won".into()),
        payout: Some(payout),
    };
    let payload = Payload::json(&settled(changed_payout))?;
    let message = NewMessage::new(AGGREGATE, bet_id.clone(), version, BET_SETTLED, payload)
        .with_event_id(event_id)
        .stored(0, chrono::Utc::now());
    let transport = outbox::brokers()
        .connect_transport(broker_url, &topology.transport_settings())
        .await
        .context("cannot connect a transport to re-send the event")?;
    let mut dropped_by_broker = 0;
    loop {
        let receipt = transport
            .publish(&message)
            .await
            .map_err(|e| anyhow::anyhow!("cannot re-send the event: {e}"))?;
        if !receipt.duplicate {
            break;
        }
        dropped_by_broker += 1;
        if dropped_by_broker == 1 {
            say(
                "the broker dropped the re-send as a duplicate (NATS duplicate window): again after the window",
            );
        }
        if dropped_by_broker > 20 {
            bail!("the broker kept dropping the re-sent event as a duplicate");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The same settlement under a new event id: a new message to the broker and the inboxes.
    let payload = Payload::json(&settled(original_payout))?;
    let reemitted = OutboxMessage {
        event_id: uuid::Uuid::now_v7(),
        fingerprint: payload.fingerprint(),
        payload,
        ..message
    };
    let receipt = transport
        .publish(&reemitted)
        .await
        .map_err(|e| anyhow::anyhow!("cannot re-emit the event: {e}"))?;
    if receipt.duplicate {
        bail!("the broker took a new event id for a duplicate");
    }
    Ok(Some(Injected {
        bet_id,
        event_id,
        original_payout,
        changed_payout,
        dropped_by_broker,
        reemitted_event_id: reemitted.event_id,
    }))
}
