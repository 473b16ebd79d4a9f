//! `fintech capture`: the capture worker of the payments service, two engines in one process.
//!
//! 1. **A consumer of `PaymentCaptured`** (inbox `capture` in the payments database: the
//!    worker belongs to the payments service, so it uses the service's database). Its handler
//!    writes one durable work item of kind `provider-capture` on the inbox transaction
//!    (`PgEffects::enqueue`), with the idempotency key `capture:<payment id>`: one capture per
//!    payment, whatever is redelivered. It does not call the provider: a call inside a
//!    database transaction could neither be rolled back nor be known to have happened.
//! 2. **The executor** (`outbox::effect::Executor` with `outbox::http::HttpPayoutProvider`):
//!    claims pending items under a lease, calls the provider with the item's key, records the
//!    answer. An unknown outcome (a timeout, a 5xx, an executor killed between the call and the
//!    record) is never called again blindly: after `reconcile_after` the executor asks the
//!    provider about the key and settles the item with what it finds.
//!
//! The provider deduplicates by the key, so even a repeated call captures once; the
//! verification of `fintech run` counts captures per payment at the provider.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use outbox::Backoff;
use outbox::IncomingEvent;
use outbox::consumer::{Handler, HandlerError, OrderingGuard};
use outbox::effect::{Executor, ExecutorConfig};
use outbox::http::HttpPayoutProvider;
use outbox::postgres::{NewWorkItem, PgEffects, PgStore};
use serde_json::json;
use support::consumer::Subscription;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::Common;
use crate::reporting::PaymentEvent;
use crate::topology::{CAPTURE_CONSUMER, CAPTURE_KIND, PAYMENT_CAPTURED};

/// The idempotency key of the provider capture of `payment`: the business effect's name, so
/// one payment can never be captured under two keys.
pub fn capture_key(payment: &str) -> String {
    format!("capture:{payment}")
}

/// The handler: a `PaymentCaptured` becomes a work item on the inbox transaction.
struct CaptureIntent {
    effects: PgEffects,
}

impl Handler<sqlx::PgConnection> for CaptureIntent {
    async fn handle(
        &self,
        tx: &mut sqlx::PgConnection,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        if event.event_type != PAYMENT_CAPTURED {
            // The subscription is filtered to PaymentCaptured; anything else is recorded in the
            // inbox and ignored.
            return Ok(());
        }
        let p = PaymentEvent::decode(event)?;
        let item = NewWorkItem {
            kind: CAPTURE_KIND.into(),
            idempotency_key: capture_key(&p.id),
            payload: json!({ "reference": p.id, "amount": p.amount, "beneficiary": p.account }),
            event_id: Some(event.event_id),
            consumer_name: Some(CAPTURE_CONSUMER.into()),
        };
        self.effects
            .enqueue(&mut *tx, &item)
            .await
            .map_err(|e| HandlerError::Transient(format!("capture work item: {e}")))?;
        Ok(())
    }
}

/// Runs the capture consumer and the executor until `shutdown`.
///
/// # Errors
/// The database, the broker or the provider URL is unusable, or the database is not
/// migrated.
pub async fn run(common: &Common, provider_url: &str, shutdown: CancellationToken) -> Result<()> {
    let topology = common.topology()?;
    let schema = crate::db::schema();
    let pool = crate::db::open(&crate::db::PAYMENTS, &common.payments_url, 12).await?;

    // Only version 2 of each payment arrives here: no ordering guard.
    let subscription = Subscription::only(CAPTURE_CONSUMER, PAYMENT_CAPTURED, OrderingGuard::Off);
    let intent = CaptureIntent {
        effects: PgEffects::new(schema.clone()),
    };
    let consumer = subscription
        .connect(
            &topology,
            &common.deployment.broker_url,
            pool.clone(),
            intent,
        )
        .await?;

    let provider = HttpPayoutProvider::new(provider_url)?;
    let quick = Backoff {
        base: Duration::from_millis(200),
        max: Duration::from_secs(2),
    };
    let config = ExecutorConfig {
        lease: topology.executor_lease(),
        call_timeout: topology.call_timeout(),
        reconcile_after: topology.reconcile_after(),
        poll_interval: Duration::from_millis(100),
        lookup_backoff: if topology.is_fast() {
            quick
        } else {
            ExecutorConfig::new(CAPTURE_KIND).lookup_backoff
        },
        retry_backoff: quick,
        ..ExecutorConfig::new(CAPTURE_KIND)
    };
    let executor = Arc::new(
        Executor::new(PgStore::with_schema(pool, schema), provider, config)
            .context("cannot start the executor")?,
    );

    info!(provider = %outbox::secrets::redact_url(provider_url), "capture worker started");
    support::child::announce_ready();
    let executing = tokio::spawn(Arc::clone(&executor).run(shutdown.clone()));
    consumer.run(shutdown).await;
    let _ = executing.await;
    info!("capture worker stopped");
    Ok(())
}
