//! `fintech payments`: the payments HTTP API (axum) on the payments database.
//!
//! ```text
//! POST /payments                Idempotency-Key: K   {"account": "acc-1", "amount": 1250}
//!      201 {"id","account","amount","status":"created","version":1}
//! POST /payments/{id}/capture   Idempotency-Key: K   (no body, or {})
//!      200 {"id","account","amount","status":"captured","version":2}
//!      404 no such payment, 409 not capturable (already captured)
//! GET  /payments/{id}           200 the payment, 404
//! GET  /health                  200
//! ```
//!
//! Every command runs in **one** transaction, the service's own: the idempotency record of the
//! request key, the business row, the outbox intent (`PgOutbox::enqueue` on the same
//! transaction) and the stored response commit together or not at all. The transaction's frame
//! is `support::api::OutboxApi` (`begin`: the key's record; `finish`: the intent, the stored
//! response, the commit); each handler writes its business row in between. A handler's last
//! argument, `support::api::Command`, is the request's `Idempotency-Key` and JSON body.
//!
//! * **Request idempotency** (`PgOutbox::idempotency_begin` / `idempotency_complete`): a retry
//!   with the same key and the same request returns the first answer (with the header
//!   `Idempotent-Replayed: true`) and writes nothing; the same key with a different request is
//!   422. A request that failed (4xx, 5xx) stores nothing, so its key can be used again.
//! * **Versions from the aggregate's own row**: a new payment's row starts at version 1 with
//!   `PaymentCreated` (version 1); the capture's `UPDATE … SET version = version + 1 …
//!   RETURNING version` gives `PaymentCaptured` its version. The row lock the capture takes
//!   orders the commits, so the relay can publish each payment's events in order.
//! * Bad input is a clear 4xx: a missing or malformed `Idempotency-Key` or body is 400, an
//!   invalid amount or account 422.

use std::net::SocketAddr;

use anyhow::Result;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use outbox::{NewMessage, Payload};
use serde::Deserialize;
use serde_json::json;
use support::api::{ApiError, Begun, Command, OutboxApi, error, internal, stored, unavailable};
use tokio_util::sync::CancellationToken;

use crate::Common;
use crate::topology::{AGGREGATE, PAYMENT_CAPTURED, PAYMENT_CREATED};

/// Idempotency scope of `POST /payments`.
const SCOPE_CREATE: &str = "create-payment";
/// Idempotency scope of `POST /payments/{id}/capture`.
const SCOPE_CAPTURE: &str = "capture-payment";
/// Longest accepted account name.
const MAX_ACCOUNT_LEN: usize = 64;

/// Serves the API on `listen` until `shutdown`.
///
/// # Errors
/// The database is unreachable or not migrated, or the address cannot be bound.
pub async fn serve(common: &Common, listen: SocketAddr, shutdown: CancellationToken) -> Result<()> {
    let pool = crate::db::open(&crate::db::PAYMENTS, &common.payments_url, 16).await?;
    // The outbox on the payments database, and wake-ups for the relays after each commit.
    let app = OutboxApi::new(pool);
    support::api::serve(router(app), listen, "payments API", shutdown).await?;
    Ok(())
}

fn router(app: OutboxApi) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/payments", post(create_payment))
        .route("/payments/{id}", get(get_payment))
        .route("/payments/{id}/capture", post(capture_payment))
        .with_state(app)
}

/// Body of `POST /payments`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreatePayment {
    /// The paying account.
    account: String,
    /// Minor units (cents), positive.
    amount: i64,
}

/// Body of `POST /payments/{id}/capture`: nothing, or an empty object.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CapturePayment {}

/// `POST /payments`.
async fn create_payment(
    State(app): State<OutboxApi>,
    Command { key, body: req }: Command<CreatePayment>,
) -> Result<Response, ApiError> {
    if req.amount <= 0 {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "amount must be a positive number of minor units, got {}",
                req.amount
            ),
        ));
    }
    if req.account.is_empty()
        || req.account.len() > MAX_ACCOUNT_LEN
        || req.account.chars().any(char::is_control)
    {
        return Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("account must be 1 to {MAX_ACCOUNT_LEN} printable characters"),
        ));
    }
    // The request as the key remembers it.
    let request = json!({ "account": req.account, "amount": req.amount });
    let mut tx = match app.begin(SCOPE_CREATE, &key, &request).await? {
        Begun::New(tx) => tx,
        Begun::Replay(first) => return Ok(first),
    };
    let id = format!("pay_{}", uuid::Uuid::now_v7().simple());
    sqlx::query(
        "INSERT INTO payments (id, account, amount, status, version) \
         VALUES ($1, $2, $3, 'created', 1)",
    )
    .bind(&id)
    .bind(&req.account)
    .bind(req.amount)
    .execute(&mut *tx)
    .await
    .map_err(unavailable)?;
    // A new aggregate's row starts at version 1, and so does its first event.
    let event = event(&id, 1, PAYMENT_CREATED, &req.account, req.amount)?;
    let body = json!({
        "id": id, "account": req.account, "amount": req.amount, "status": "created", "version": 1,
    });
    let response = stored(StatusCode::CREATED, body);
    // The intent and the stored answer on the same transaction as the row, then commit.
    app.finish(tx, &event, response).await
}

/// `POST /payments/{id}/capture`.
async fn capture_payment(
    State(app): State<OutboxApi>,
    Path(id): Path<String>,
    Command { key, .. }: Command<CapturePayment>,
) -> Result<Response, ApiError> {
    let request = json!({ "capture": id });
    let mut tx = match app.begin(SCOPE_CAPTURE, &key, &request).await? {
        Begun::New(tx) => tx,
        Begun::Replay(first) => return Ok(first),
    };
    // The aggregate's own row gives the version: the UPDATE that captures increments it, under
    // the row lock that orders this payment's commits.
    let row: Option<(i64, String, i64)> = sqlx::query_as(
        "UPDATE payments SET status = 'captured', version = version + 1, captured_at = now() \
         WHERE id = $1 AND status = 'created' RETURNING version, account, amount",
    )
    .bind(&id)
    .fetch_optional(&mut *tx)
    .await
    .map_err(unavailable)?;
    let Some((version, account, amount)) = row else {
        // Rolled back with `tx`: nothing is stored under the key.
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM payments WHERE id = $1")
                .bind(&id)
                .fetch_optional(&mut *tx)
                .await
                .map_err(unavailable)?;
        return Err(match status {
            None => error(StatusCode::NOT_FOUND, format!("no payment `{id}`")),
            Some(s) => error(
                StatusCode::CONFLICT,
                format!("payment `{id}` is {s}: only a created payment can be captured"),
            ),
        });
    };
    let event = event(&id, version, PAYMENT_CAPTURED, &account, amount)?;
    let body = json!({
        "id": id, "account": account, "amount": amount, "status": "captured", "version": version,
    });
    let response = stored(StatusCode::OK, body);
    app.finish(tx, &event, response).await
}

/// The integration event of `payment` at `version`.
fn event(
    payment: &str,
    version: i64,
    event_type: &str,
    account: &str,
    amount: i64,
) -> Result<NewMessage, ApiError> {
    let payload = Payload::json(&json!({ "id": payment, "account": account, "amount": amount }))
        .map_err(internal)?;
    Ok(NewMessage::new(
        AGGREGATE, payment, version, event_type, payload,
    ))
}

/// `GET /payments/{id}`.
async fn get_payment(
    State(app): State<OutboxApi>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let row: Option<(String, i64, String, i64)> =
        sqlx::query_as("SELECT account, amount, status, version FROM payments WHERE id = $1")
            .bind(&id)
            .fetch_optional(&app.pool)
            .await
            .map_err(unavailable)?;
    match row {
        Some((account, amount, status, version)) => Ok(axum::Json(json!({
            "id": id, "account": account, "amount": amount, "status": status, "version": version,
        }))
        .into_response()),
        None => Err(error(StatusCode::NOT_FOUND, format!("no payment `{id}`"))),
    }
}
