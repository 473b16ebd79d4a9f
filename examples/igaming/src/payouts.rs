//! `igaming payouts`: the payout consumer, posting each won bet's payout into the double-entry
//! ledger, in the ledger's **own** database.
//!
//! For each `BetSettled` the consumer engine begins a transaction on the ledger database,
//! records `(payouts, event_id)` in the inbox with the payload's fingerprint, and runs
//! [`Payouts::handle`] on that same transaction: for a won bet, one posting under the business
//! key `payout:<bet id>` and its two entries, debit the house and credit the player. Commit,
//! then acknowledge. Two guards, each stopping something the other cannot:
//!
//! * **The inbox** (`(consumer, event_id)` and the payload's fingerprint) absorbs a redelivery
//!   of the same event (a killed consumer, a relay that republished after a crash), and turns
//!   the same event id with **another payload** (a producer re-sending with a changed amount)
//!   into a recorded conflict (`inbox_conflicts`): never applied, loud, for an operator.
//! * **The ledger's business key** (`ledger_postings.business_key`, the primary key) refuses a
//!   second posting of one bet's payout whatever event carried it, even one with a **new event
//!   id** that the inbox would take for a new event. The handler turns that refusal into a
//!   permanent error: the delivery becomes a consumer dead letter with the reason, never a
//!   second payout.

use anyhow::Result;
use outbox::IncomingEvent;
use outbox::consumer::{Handler, HandlerError, OrderingGuard};
use support::consumer::Subscription;
use tokio_util::sync::CancellationToken;

use crate::Common;
use crate::bets::BetEvent;
use crate::db::{HOUSE_ACCOUNT, player_account};
use crate::topology::{BET_SETTLED, PAYOUTS_CONSUMER};

/// The ledger's business key of the payout of `bet`: the posting's identity.
pub fn payout_key(bet: &str) -> String {
    format!("payout:{bet}")
}

/// The handler: a won bet's payout becomes one posting with two entries.
pub struct Payouts;

impl Handler<sqlx::PgConnection> for Payouts {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        if event.event_type != BET_SETTLED {
            // The subscription is filtered to BetSettled; anything else is only recorded.
            return Ok(());
        }
        let bet = BetEvent::decode(event)?;
        let payout = bet.payout.unwrap_or(0);
        if bet.outcome.as_deref() != Some("won") || payout <= 0 {
            return Ok(());
        }
        let key = payout_key(&bet.id);
        let posted = sqlx::query(
            "INSERT INTO ledger_postings (business_key, bet_id, amount, event_id) \
             VALUES ($1, $2, $3, $4)",
        )
        .bind(&key)
        .bind(&bet.id)
        .bind(payout)
        .bind(event.event_id)
        .execute(&mut *tx)
        .await;
        if let Err(sqlx::Error::Database(e)) = &posted
            && e.code().as_deref() == Some("23505")
        {
            return Err(HandlerError::permanent(format!(
                "the ledger already holds the posting `{key}`: a second payout of bet {} \
                 (event {}) is refused by its business key",
                bet.id, event.event_id
            )));
        }
        posted?;
        for (account, side) in [
            (HOUSE_ACCOUNT.to_owned(), "debit"),
            (player_account(&bet.player), "credit"),
        ] {
            sqlx::query(
                "INSERT INTO ledger_entries (business_key, account, side, amount) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(&key)
            .bind(account)
            .bind(side)
            .bind(payout)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }
}

/// Runs the payout consumer until `shutdown`.
///
/// # Errors
/// The database or the broker is unreachable, or the database is not migrated.
pub async fn run(common: &Common, shutdown: CancellationToken) -> Result<()> {
    let topology = common.topology()?;
    let pool = crate::db::open(&crate::db::LEDGER, &common.ledger_url, 8).await?;
    // Only version 2 of each bet arrives here: no ordering guard.
    let subscription = Subscription::only(PAYOUTS_CONSUMER, BET_SETTLED, OrderingGuard::Off);
    let consumer = subscription
        .connect(&topology, &common.deployment.broker_url, pool, Payouts)
        .await?;
    support::child::serve_until_stopped("payout consumer", consumer.run(shutdown)).await;
    Ok(())
}
