//! HTTP plumbing of an example's axum API with request idempotency: error answers, a command's
//! `Idempotency-Key` header and JSON body ([`Command`]), answers stored under a key and
//! replayed, and the frame of a command's one transaction ([`OutboxApi`]): begun with the key's
//! record (`PgOutbox::idempotency_begin`, mapped to HTTP), ended with the outbox intent
//! (`PgOutbox::enqueue` on the same transaction), the stored answer (`idempotency_complete`),
//! the commit and a wake-up for the relays.
//!
//! What a command does in between (its checks, its business rows, which event it emits with
//! which payload and version) stays in each example's handlers.

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use outbox::postgres::{IdempotencyBegin, IdempotencyError, PgOutbox, RelayWaker};
use outbox::{Fingerprint, NewMessage};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
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

/// A failure of the service itself (such as a payload that cannot be serialised): 500.
pub fn internal(e: impl std::fmt::Display) -> ApiError {
    error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
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

/// A command's request, the last argument of its handler (an axum extractor): its
/// `Idempotency-Key` ([`idempotency_key`]) and its JSON body ([`parse_body`]), checked in that
/// order once the body is read. A request without them is refused with the 4xx of
/// [`idempotency_key`] or [`parse_body`].
#[derive(Debug)]
pub struct Command<T> {
    /// The request's idempotency key.
    pub key: String,
    /// The request's body.
    pub body: T,
}

impl<S, T> FromRequest<S> for Command<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned,
{
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let headers = req.headers().clone();
        let body = Bytes::from_request(req, state)
            .await
            .map_err(IntoResponse::into_response)?;
        let key = idempotency_key(&headers).map_err(IntoResponse::into_response)?;
        let body = parse_body(&headers, &body).map_err(IntoResponse::into_response)?;
        Ok(Self { key, body })
    }
}

/// What the handlers of an example's command API share (its axum state): the service's own
/// database, its outbox on the toolkit's schema, and the relay waker. Cheap to clone.
#[derive(Clone)]
pub struct OutboxApi {
    /// The service's own database: its business rows, the outbox, the idempotency keys.
    pub pool: PgPool,
    outbox: PgOutbox,
    waker: RelayWaker,
}

/// How a command begins ([`OutboxApi::begin`]).
pub enum Begun {
    /// A new request: the command's transaction, with the key recorded in it.
    New(CommandTx),
    /// The key already answered this request: the first answer, replayed
    /// (`Idempotent-Replayed: true`).
    Replay(Response),
}

/// A command's transaction, begun with the record of its idempotency key
/// ([`OutboxApi::begin`]): the handler writes its business rows on it (`&mut *tx`, the
/// transaction's `PgConnection`), then [`OutboxApi::finish`] ends it. Dropped without `finish`
/// (a refusal, an error), it rolls back: nothing is stored under the key.
pub struct CommandTx {
    tx: Transaction<'static, Postgres>,
    scope: &'static str,
    key: String,
}

impl Deref for CommandTx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for CommandTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

impl OutboxApi {
    /// The API of the service whose database is `pool`: the outbox on the toolkit's schema
    /// ([`crate::database::schema`]) and a relay waker, which sends the wake-ups after commit,
    /// coalesced to one per 20 ms (relays also poll, so a lost one only costs latency).
    pub fn new(pool: PgPool) -> Self {
        let outbox = PgOutbox::new(crate::database::schema());
        let waker = RelayWaker::spawn(pool.clone(), &outbox, Duration::from_millis(20));
        Self {
            pool,
            outbox,
            waker,
        }
    }

    /// Begins a command: its transaction, and in it the record of `key` under `scope` with the
    /// fingerprint of `request` (`PgOutbox::idempotency_begin`; serde_json sorts object keys,
    /// so the bytes are canonical).
    ///
    /// # Errors
    /// The 422 of a key reused with another request, or the 503 of a database error.
    pub async fn begin(
        &self,
        scope: &'static str,
        key: &str,
        request: &Value,
    ) -> Result<Begun, ApiError> {
        let mut tx = self.pool.begin().await.map_err(unavailable)?;
        let fingerprint = Fingerprint::of(request.to_string().as_bytes());
        match self
            .outbox
            .idempotency_begin(&mut tx, scope, key, fingerprint)
            .await
        {
            Ok(IdempotencyBegin::New) => Ok(Begun::New(CommandTx {
                tx,
                scope,
                key: key.to_owned(),
            })),
            Ok(IdempotencyBegin::Replay(first)) => Ok(Begun::Replay(answer(&first, true))),
            Err(IdempotencyError::Conflict { .. }) => Err(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("Idempotency-Key `{key}` was already used with a different request"),
            )),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Ends the command of `tx`: the outbox intent on its transaction
    /// (`PgOutbox::enqueue(&mut *tx, …)`), `response` stored under its key
    /// (`idempotency_complete`, made with [`stored`]), commit, a wake-up for the relays. The
    /// business rows written on `tx` commit with them or not at all. Returns the answer.
    ///
    /// # Errors
    /// The 503 of a database error (nothing committed: the client retries with the same key).
    pub async fn finish(
        &self,
        tx: CommandTx,
        intent: &NewMessage,
        response: Value,
    ) -> Result<Response, ApiError> {
        let CommandTx { mut tx, scope, key } = tx;
        self.outbox
            .enqueue(&mut *tx, intent)
            .await
            .map_err(unavailable)?;
        self.outbox
            .idempotency_complete(&mut tx, scope, &key, &response)
            .await
            .map_err(unavailable)?;
        tx.commit().await.map_err(unavailable)?;
        self.waker.wake();
        Ok(answer(&response, false))
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
