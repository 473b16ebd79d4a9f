//! HTTP plumbing of an example's axum API with request idempotency: error answers, the
//! `Idempotency-Key` header, JSON bodies, answers stored under a key and replayed, and the
//! mapping of the toolkit's `idempotency_begin` to HTTP.
//!
//! The command itself (its one transaction: `idempotency_begin`, the business rows, the outbox
//! intent, `idempotency_complete`, commit) stays in each example's handlers.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use outbox::Fingerprint;
use outbox::postgres::{IdempotencyBegin, IdempotencyError, PgOutbox};
use serde_json::{Value, json};
use tracing::warn;

/// Longest accepted `Idempotency-Key`.
pub const MAX_KEY_LEN: usize = 255;

/// An error answer, `{"error": message}` with its status. Nothing is stored under the
/// idempotency key of a refused or failed request.
#[derive(Debug)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for the client.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(json!({ "error": self.message }))).into_response()
    }
}

/// An error answer.
pub fn error(status: StatusCode, message: impl Into<String>) -> ApiError {
    ApiError {
        status,
        message: message.into(),
    }
}

/// A database failure: 503, so the client retries (with the same key).
pub fn unavailable(e: impl std::fmt::Display) -> ApiError {
    warn!(error = %e, "database error");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("database unavailable, retry with the same Idempotency-Key: {e}"),
    )
}

/// The answer stored under an idempotency key: status and body.
pub fn stored(status: StatusCode, body: Value) -> Value {
    json!({ "status": status.as_u16(), "body": body })
}

/// Turns a stored answer back into a response; `replayed` adds `Idempotent-Replayed: true`.
pub fn answer(stored: &Value, replayed: bool) -> Response {
    let status = stored["status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::OK);
    let mut resp = (status, axum::Json(stored["body"].clone())).into_response();
    if replayed {
        resp.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    resp
}

/// The request's `Idempotency-Key`, or the 400 to answer.
///
/// # Errors
/// The 400 of a missing or malformed key.
pub fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "missing Idempotency-Key header: every command needs one (retry with the same key)",
        ));
    };
    match v.to_str() {
        Ok(k) if !k.is_empty() && k.len() <= MAX_KEY_LEN && !k.contains(' ') => Ok(k.to_owned()),
        _ => Err(error(
            StatusCode::BAD_REQUEST,
            format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
        )),
    }
}

/// A JSON body, or the 4xx to answer. An empty body reads as `{}`.
///
/// # Errors
/// 415 for another content type, 400 for a body that is not the expected JSON.
pub fn parse_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ApiError> {
    if !body.is_empty()
        && let Some(ct) = headers.get(header::CONTENT_TYPE)
        && !ct.to_str().unwrap_or("").starts_with("application/json")
    {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the body must be application/json",
        ));
    }
    let body: &[u8] = if body.is_empty() { b"{}" } else { body };
    serde_json::from_slice(body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the body is not the expected JSON: {e}"),
        )
    })
}

/// Records the key in `tx` (`PgOutbox::idempotency_begin`). `None`: new, run the command.
/// `Some(first)`: the stored first answer, to replay.
///
/// # Errors
/// The 422 of a key reused with another request, or the 503 of a database error.
pub async fn begin_idempotent(
    outbox: &PgOutbox,
    tx: &mut sqlx::PgConnection,
    scope: &str,
    key: &str,
    fingerprint: Fingerprint,
) -> Result<Option<Value>, ApiError> {
    match outbox.idempotency_begin(tx, scope, key, fingerprint).await {
        Ok(IdempotencyBegin::New) => Ok(None),
        Ok(IdempotencyBegin::Replay(first)) => Ok(Some(first)),
        Err(IdempotencyError::Conflict { .. }) => Err(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("Idempotency-Key `{key}` was already used with a different request"),
        )),
        Err(e) => Err(unavailable(e)),
    }
}

/// Serves `router` on `listen` until `shutdown`: binds ([`bind`]), logs `<what> listening`,
/// announces readiness, serves with a graceful shutdown, logs `<what> stopped`.
///
/// # Errors
/// The address cannot be bound, or the server failed.
pub async fn serve(
    router: axum::Router,
    listen: SocketAddr,
    what: &str,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<()> {
    let listener = bind(listen).await?;
    tracing::info!(addr = %listen, "{what} listening");
    crate::child::announce_ready();
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .context("the HTTP server failed")?;
    tracing::info!("{what} stopped");
    Ok(())
}

/// Binds `addr`, retrying for a few seconds: after a crash the port can still be held for a
/// moment.
///
/// # Errors
/// The address stayed unavailable for 5 s.
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    let mut tries = 0;
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) if tries < 50 => {
                tries += 1;
                warn!(%addr, error = %e, "cannot bind yet; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("cannot listen on {addr}")),
        }
    }
}
