//! `fintech reporting`: the reporting service, with its **own** database and the toolkit's
//! consumer inbox.
//!
//! For each delivery the consumer engine (`PgConsumer`) begins a transaction on the reporting
//! database, records `(reporting, event_id)` with the payload's fingerprint, runs
//! [`Reporting::handle`] on that same transaction, commits, and only then acknowledges. A
//! redelivery (a killed consumer, a relay that republished after a crash) is absorbed by the
//! inbox; the ordering guard `Wait` applies a payment's `PaymentCaptured` only after its
//! `PaymentCreated`. The consumer is the library's `PgConsumer::new` with the inbox in the
//! reporting database (`support::consumer::Subscription::connect`).

use anyhow::Result;
use outbox::IncomingEvent;
use outbox::consumer::{Handler, HandlerError, OrderingGuard};
use serde::Deserialize;
use support::consumer::{Subscription, unknown_event_type};
use tokio_util::sync::CancellationToken;

use crate::Common;
use crate::topology::{PAYMENT_CAPTURED, PAYMENT_CREATED, REPORTING_CONSUMER};

/// The payload of both payment events.
#[derive(Debug, Deserialize)]
pub struct PaymentEvent {
    /// The payment id (also the aggregate id).
    pub id: String,
    /// The paying account.
    pub account: String,
    /// Minor units.
    pub amount: i64,
}

impl PaymentEvent {
    /// Decodes `event`'s JSON payload; a payload that does not decode never will (permanent).
    ///
    /// # Errors
    /// [`HandlerError::Permanent`] for an unknown schema version or a malformed payload.
    pub fn decode(event: &IncomingEvent) -> Result<Self, HandlerError> {
        support::consumer::decode(event, "payment event")
    }
}

/// The reporting effect: one `payment_report` row per payment, its status and the number of
/// events applied to it, written on the inbox transaction.
pub struct Reporting;

impl Handler<sqlx::PgConnection> for Reporting {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        let p = PaymentEvent::decode(event)?;
        match event.event_type.as_str() {
            PAYMENT_CREATED => {
                sqlx::query(
                    "INSERT INTO payment_report (payment_id, account, amount, status, events) \
                     VALUES ($1, $2, $3, 'created', 1)",
                )
                .bind(&p.id)
                .bind(&p.account)
                .bind(p.amount)
                .execute(&mut *tx)
                .await?;
            }
            PAYMENT_CAPTURED => {
                let n = sqlx::query(
                    "UPDATE payment_report SET status = 'captured', events = events + 1, \
                     updated_at = now() WHERE payment_id = $1 AND status = 'created'",
                )
                .bind(&p.id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if n != 1 {
                    // The ordering guard makes this unreachable; were it reached, retrying
                    // (and then a dead letter) is louder than a silent skip.
                    return Err(HandlerError::Transient(format!(
                        "payment {} is not in the report as created",
                        p.id
                    )));
                }
            }
            other => return Err(unknown_event_type(other)),
        }
        Ok(())
    }
}

/// Runs the reporting consumer until `shutdown`.
///
/// # Errors
/// The database or the broker is unreachable, or the database is not migrated.
pub async fn run(common: &Common, shutdown: CancellationToken) -> Result<()> {
    let topology = common.topology()?;
    let pool = crate::db::open(&crate::db::REPORTING, &common.reporting_url, 8).await?;
    // `Wait`: a payment's `PaymentCaptured` is applied only after its `PaymentCreated`.
    let subscription = Subscription::all(REPORTING_CONSUMER, OrderingGuard::Wait);
    let consumer = subscription
        .connect(&topology, &common.deployment.broker_url, pool, Reporting)
        .await?;
    support::child::serve_until_stopped("reporting consumer", consumer.run(shutdown)).await;
    Ok(())
}
