//! `igaming history`: the player-history projection, with its **own** database and the
//! toolkit's consumer inbox.
//!
//! `bet_history` holds one row per bet with its state (accepted, won, lost) and the number of
//! events applied to it; `player_totals` one row per player (bets, staked, won, paid out). The
//! consumer engine records `(history, event_id)` and runs [`History::handle`] on the same
//! transaction, commits, then acknowledges: a redelivery is absorbed by the inbox, so the
//! totals never count an event twice. The ordering guard `Wait` applies a bet's `BetSettled`
//! only after its `BetAccepted`. The consumer is the library's `PgConsumer::new` with the inbox
//! in the history database (`support::consumer::Subscription::connect`).

use anyhow::Result;
use outbox::IncomingEvent;
use outbox::consumer::{Handler, HandlerError, OrderingGuard};
use support::consumer::{Subscription, unknown_event_type};
use tokio_util::sync::CancellationToken;

use crate::Common;
use crate::bets::BetEvent;
use crate::topology::{BET_ACCEPTED, BET_SETTLED, HISTORY_CONSUMER};

/// The projection, written on the inbox transaction.
pub struct History;

impl Handler<sqlx::PgConnection> for History {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        let bet = BetEvent::decode(event)?;
        match event.event_type.as_str() {
            BET_ACCEPTED => {
                bet.bind(sqlx::query(
                    "INSERT INTO bet_history (bet_id, player, market, stake, odds_x100, state, events) \
                     VALUES ($1, $2, $3, $4, $5, 'accepted', 1)",
                ))
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO player_totals (player, bets, staked, won, paid_out) \
                     VALUES ($1, 1, $2, 0, 0) ON CONFLICT (player) DO UPDATE \
                     SET bets = player_totals.bets + 1, staked = player_totals.staked + $2",
                )
                .bind(&bet.player)
                .bind(bet.stake)
                .execute(&mut *tx)
                .await?;
            }
            BET_SETTLED => {
                let (Some(outcome), Some(payout)) = (bet.outcome.as_deref(), bet.payout) else {
                    return Err(HandlerError::permanent(
                        "BetSettled without outcome or payout",
                    ));
                };
                let updated = sqlx::query(
                    "UPDATE bet_history SET state = $2, payout = $3, events = events + 1, \
                     updated_at = now() WHERE bet_id = $1 AND state = 'accepted'",
                )
                .bind(&bet.id)
                .bind(outcome)
                .bind(payout)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if updated != 1 {
                    // Unreachable under the ordering guard; retrying (then a dead letter) is
                    // louder than skipping it.
                    return Err(HandlerError::Transient(format!(
                        "bet {} is not in the history as accepted",
                        bet.id
                    )));
                }
                let won = i64::from(outcome == "won");
                sqlx::query(
                    "UPDATE player_totals SET won = won + $2, paid_out = paid_out + $3 \
                     WHERE player = $1",
                )
                .bind(&bet.player)
                .bind(won)
                .bind(payout)
                .execute(&mut *tx)
                .await?;
            }
            other => return Err(unknown_event_type(other)),
        }
        Ok(())
    }
}

/// Runs the projection until `shutdown`.
///
/// # Errors
/// The database or the broker is unreachable, or the database is not migrated.
pub async fn run(common: &Common, shutdown: CancellationToken) -> Result<()> {
    let topology = common.topology()?;
    let pool = crate::db::open(&crate::db::HISTORY, &common.history_url, 8).await?;
    // `Wait`: a bet's `BetSettled` is applied only after its `BetAccepted`.
    let subscription = Subscription::all(HISTORY_CONSUMER, OrderingGuard::Wait);
    let consumer = subscription
        .connect(&topology, &common.deployment.broker_url, pool, History)
        .await?;
    support::child::serve_until_stopped("history consumer", consumer.run(shutdown)).await;
    Ok(())
}
