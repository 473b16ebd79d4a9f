//! The operations console of the outbox toolkit: a JSON API under `/api/v1` and the web page
//! built on it, as an axum [`Router`] that `outbox console` serves and that a service can mount
//! in its own axum app under a prefix ([`nested`]):
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_console::{ConsoleConfig, nested};
//! use outbox_postgres::admin::Admin;
//! use outbox_postgres::{PgStore, PgStoreConfig};
//! let admin = Admin::new(PgStore::new(pool, PgStoreConfig::default()));
//! let config = ConsoleConfig {
//!     token: std::env::var("OUTBOX_CONSOLE_TOKEN").ok(),
//!     ..ConsoleConfig::default()
//! };
//! // The page at /outbox (/outbox/ redirects there), its API under /outbox/api/v1.
//! let app = axum::Router::new().merge(nested("/outbox", admin, config)?);
//! # let _ = app; Ok(()) }
//! ```
//!
//! Everything the console reads and does goes through [`Admin`], the module `outbox status`
//! and `outbox dead-letters` use too, so the page and the CLI never disagree.
//!
//! # API (version 1)
//!
//! | method and path | what |
//! |---|---|
//! | `GET /api/v1/overview[?exact=true]` | [`Overview`](outbox_postgres::admin::Overview) as JSON; the outbox counts stop at [`OVERVIEW_COUNT_BOUND`] (`counted_up_to`; a count equal to it means at least that many) unless `exact=true`, which counts every row (seconds at millions of rows) and needs the token |
//! | `GET /api/v1/dead-letters?limit=N` | outbox dead letters, oldest first (`limit` 1 to 10,000, default 100) |
//! | `POST /api/v1/dead-letters/requeue` | body `{"event_ids": ["…"]}` or `{"all": true}`, optional `"reason"`; answers `{"requeued": n}` |
//! | `GET /api/v1/conflicts?limit=N` | inbox conflicts, newest first, with both fingerprints |
//! | `GET /api/v1/consumer-dead-letters?consumer=C&limit=N` | consumer dead letters not resolved, oldest first |
//! | `POST /api/v1/consumer-dead-letters/requeue` | body `{"ids": [1, 2]}` or `{"all": true}`, optional `"consumer"` and `"reason"`; the consumer applies them again through its inbox |
//! | `GET /api/v1/work-items?state=S&limit=N` | remote effects (work items), in one state or all |
//! | `POST /api/v1/work-items/{id}/resolve` | body `{"succeeded": "<provider reference>"}`, `{"failed": "<why>"}` or `{"resend": true}`, optional `"reason"`; answers the row as it is now (404 no such item, 409 its state does not allow it) |
//! | `GET /healthz` | liveness: the process answers (`200 ok`) |
//! | `GET /readyz` | readiness: the database answers and the schema is at this release's version (`200`, else `503` with the reason) |
//! | `GET /` | the page |
//!
//! Errors are JSON `{"error": "…"}` with 400 (bad request), 401 (no or wrong token), 403
//! (read-only mode, no token configured, a cross-site request, or the database role may not
//! act), 404 (no such item), 409 (the item's state does not allow the action), 503 (database
//! unreachable, schema missing) or 500.
//!
//! # Access
//!
//! * **Reading** needs nothing beyond reaching the address: bind the loopback address (the
//!   default) or put the console behind the network's own access control. For reading, run it
//!   as the read-only operator role (`outbox roles`), which cannot change a row whatever the
//!   console is asked.
//! * **Actions** (every `POST`) need the token: `Authorization: Bearer <token>`. The token comes
//!   from configuration or the environment (`OUTBOX_CONSOLE_TOKEN` for `outbox console`),
//!   never from the command line, and must be at least [`MIN_TOKEN_LEN`] characters. It is
//!   compared in constant time. Without a configured token every action is refused (403): the
//!   console is then read-only whatever the role could do.
//! * [`ConsoleConfig::read_only`] refuses every action (403) even with the right token.
//! * A non-loopback bind without a token is refused at start ([`check_bind`]).
//! * Cross-site requests cannot act: an action must carry the `Authorization` header and a JSON
//!   body, which a browser sends cross-site only after a CORS preflight that the console never
//!   answers; and a request whose `Origin` names another host than its `Host` is refused (403)
//!   before anything else. The page keeps the token in the tab's `sessionStorage`, not in a
//!   cookie, so nothing is sent by the browser on its own.
//! * Every action is logged at `info` under the target `outbox::audit` with the token's
//!   fingerprint (the first 8 hex digits of its SHA-256, never the token), the action, what it
//!   selected, the reason given and the outcome.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use outbox_postgres::admin::{Admin, AdminError, AdminErrorKind, Counting, Requeue};
use outbox_postgres::effects::Resolution;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

/// Where the overview's outbox counts stop unless `?exact=true` is asked for
/// ([`Counting::UpTo`]): the page refreshes every 5 s, and an exact count of a 10-million-row
/// backlog takes seconds.
pub const OVERVIEW_COUNT_BOUND: i64 = 100_000;

/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;
/// The most event ids one requeue request may name.
pub const MAX_REQUEUE_IDS: usize = 10_000;

const PAGE: &str = include_str!("../assets/index.html");
const SCRIPT: &str = include_str!("../assets/console.js");
const STYLE: &str = include_str!("../assets/console.css");

/// How the console guards its reads and actions.
#[derive(Clone, Default)]
pub struct ConsoleConfig {
    /// The token every action must present (`Authorization: Bearer`); `None` refuses every
    /// action.
    pub token: Option<String>,
    /// Refuse every action, whatever the token.
    pub read_only: bool,
    /// Reads of the API need the token too (only the page's own files, `/healthz` and
    /// `/readyz` do not). [`serve`] turns this on when it listens on a non-loopback address.
    pub reads_need_token: bool,
    /// Answer only requests whose `Host` is a loopback name or address (`localhost`,
    /// `*.localhost`, `127.0.0.0/8`, `[::1]`, any port): a web page the operator visits cannot
    /// then read a loopback console by pointing its own domain at 127.0.0.1 (DNS rebinding).
    /// [`serve`] turns this on when it listens on a loopback address.
    pub loopback_hosts_only: bool,
}

impl std::fmt::Debug for ConsoleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleConfig")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("read_only", &self.read_only)
            .field("reads_need_token", &self.reads_need_token)
            .field("loopback_hosts_only", &self.loopback_hosts_only)
            .finish()
    }
}

/// A console that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// The token is shorter than [`MIN_TOKEN_LEN`] characters.
    #[error("the console token must be at least {MIN_TOKEN_LEN} characters long")]
    WeakToken,
    /// A non-loopback address was to be bound without a token.
    #[error(
        "refusing to listen on {0} without a token: set OUTBOX_CONSOLE_TOKEN, or listen on a loopback address"
    )]
    OpenWithoutToken(SocketAddr),
    /// Binding or serving failed.
    #[error("console server: {0}")]
    Io(#[from] std::io::Error),
}

impl ConsoleConfig {
    /// Checks the token's length.
    ///
    /// # Errors
    /// [`ConsoleError::WeakToken`] for a token shorter than [`MIN_TOKEN_LEN`] characters.
    pub fn validate(&self) -> Result<(), ConsoleError> {
        match &self.token {
            Some(t) if t.chars().count() < MIN_TOKEN_LEN => Err(ConsoleError::WeakToken),
            _ => Ok(()),
        }
    }
}

/// Refuses a non-loopback `addr` when `config` has no token (anyone who can reach the address
/// could then read every payload the outbox holds).
///
/// # Errors
/// [`ConsoleError::OpenWithoutToken`].
pub fn check_bind(addr: SocketAddr, config: &ConsoleConfig) -> Result<(), ConsoleError> {
    if config.token.is_none() && !addr.ip().is_loopback() {
        return Err(ConsoleError::OpenWithoutToken(addr));
    }
    Ok(())
}

struct AppState {
    admin: Admin,
    token_sha: Option<[u8; 32]>,
    read_only: bool,
    reads_need_token: bool,
    loopback_hosts_only: bool,
}

/// The console's routes (API, health and page), to serve or to `nest` under a prefix.
///
/// # Errors
/// [`ConsoleError::WeakToken`] for a token shorter than [`MIN_TOKEN_LEN`].
pub fn router(admin: Admin, config: ConsoleConfig) -> Result<Router, ConsoleError> {
    config.validate()?;
    let state = Arc::new(AppState {
        admin,
        token_sha: config.token.as_deref().map(sha),
        read_only: config.read_only,
        reads_need_token: config.reads_need_token,
        loopback_hosts_only: config.loopback_hosts_only,
    });
    Ok(Router::new()
        .route("/", get(page))
        .route("/console.js", get(script))
        .route("/console.css", get(style))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/api/v1/overview", get(overview))
        .route("/api/v1/dead-letters", get(dead_letters))
        .route("/api/v1/dead-letters/requeue", post(requeue))
        .route("/api/v1/conflicts", get(conflicts))
        .route("/api/v1/consumer-dead-letters", get(consumer_dead_letters))
        .route(
            "/api/v1/consumer-dead-letters/requeue",
            post(requeue_consumer_dead_letters),
        )
        .route("/api/v1/work-items", get(work_items))
        .route("/api/v1/work-items/{id}/resolve", post(resolve_work_item))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            guard,
        ))
        .with_state(state))
}

/// [`router`] nested under `prefix` (`/ops/outbox`, no trailing `/`) in a router of its own, to
/// merge into a service's app: the page answers at `prefix` (and `prefix/` redirects there; a
/// plain `Router::nest` answers only the first), its files and API under `prefix/`.
///
/// # Errors
/// [`ConsoleError::WeakToken`] for a token shorter than [`MIN_TOKEN_LEN`].
///
/// # Panics
/// When `prefix` is empty, `/`, or does not start with `/` or ends with `/` (axum's rule for
/// a nest path).
pub fn nested(prefix: &str, admin: Admin, config: ConsoleConfig) -> Result<Router, ConsoleError> {
    // `prefix/` redirects to `prefix`, which passes the console's own guard.
    let to = prefix.to_owned();
    Ok(Router::new().nest(prefix, router(admin, config)?).route(
        &format!("{prefix}/"),
        get(move || async move { axum::response::Redirect::permanent(&to) }),
    ))
}

/// The checks every request passes first: the `Host` (when [`ConsoleConfig::loopback_hosts_only`])
/// and, for the API when [`ConsoleConfig::reads_need_token`], the token.
async fn guard(
    State(s): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if s.loopback_hosts_only {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or_else(|| req.uri().authority().map(|a| a.as_str()));
        if !host.is_some_and(is_loopback_host) {
            return ApiError(
                StatusCode::FORBIDDEN,
                "this console answers loopback host names only (localhost, 127.0.0.1, [::1])"
                    .into(),
            )
            .into_response();
        }
    }
    if s.reads_need_token
        && req.uri().path().starts_with("/api/")
        && let Err(e) = check_token(&s, req.headers())
    {
        return e.into_response();
    }
    next.run(req).await
}

/// `localhost`, `*.localhost`, an address in 127.0.0.0/8 or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let is_port = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit());
    let name = match host.strip_prefix('[') {
        Some(v6) => {
            return v6.split_once(']').is_some_and(|(addr, rest)| {
                addr == "::1" && (rest.is_empty() || rest.strip_prefix(':').is_some_and(is_port))
            });
        }
        None => host
            .rsplit_once(':')
            .map_or(host, |(name, port)| if is_port(port) { name } else { host }),
    };
    let name = name.to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Serves [`router`] on `listener` until `shutdown` completes, after [`check_bind`]. On a
/// loopback address it answers loopback host names only; on any other address every API read
/// needs the token as well ([`ConsoleConfig`]).
///
/// # Errors
/// [`ConsoleError`]: the bind check, a weak token, or the server failing.
pub async fn serve(
    listener: tokio::net::TcpListener,
    admin: Admin,
    config: ConsoleConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ConsoleError> {
    let addr = listener.local_addr()?;
    check_bind(addr, &config)?;
    let mut config = config;
    if addr.ip().is_loopback() {
        config.loopback_hosts_only = true;
    } else {
        config.reads_need_token = true;
    }
    let app = router(admin, config)?;
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

fn sha(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// An API error: a status and a JSON `{"error": …}`.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response();
        no_store(r.headers_mut());
        r
    }
}

impl From<AdminError> for ApiError {
    fn from(e: AdminError) -> Self {
        let status = match e.kind {
            AdminErrorKind::Unavailable | AdminErrorKind::Schema => StatusCode::SERVICE_UNAVAILABLE,
            AdminErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            AdminErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            AdminErrorKind::NotFound => StatusCode::NOT_FOUND,
            AdminErrorKind::Refused => StatusCode::CONFLICT,
            AdminErrorKind::Other => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self(status, e.to_string())
    }
}

fn no_store(h: &mut HeaderMap) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

fn json<T: serde::Serialize>(v: T) -> Response {
    let mut r = Json(v).into_response();
    no_store(r.headers_mut());
    r
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    let h = r.headers_mut();
    no_store(h);
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'; form-action 'none'; base-uri 'self'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// The page, with a `<base>` of the path it was asked under (through any prefix a service
/// nested the console at), so its files and API calls resolve under that prefix whether or not
/// the address ended with `/`.
async fn page(axum::extract::OriginalUri(uri): axum::extract::OriginalUri) -> Response {
    let path = uri.path();
    let base = if path.ends_with('/') {
        path.to_owned()
    } else {
        format!("{path}/")
    };
    let escaped = base
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&#39;");
    let mut r = asset("text/html; charset=utf-8", "");
    *r.body_mut() = axum::body::Body::from(PAGE.replace("{{BASE}}", &escaped));
    r
}

async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}

async fn ready(State(s): State<Arc<AppState>>) -> Result<&'static str, ApiError> {
    s.admin.ready().await?;
    Ok("ready")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverviewQuery {
    #[serde(default)]
    exact: bool,
}

async fn overview(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    query: Result<Query<OverviewQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let counting = if q.exact {
        // A full count costs seconds on a large backlog: not for anyone who can reach the port.
        check_token(&s, &headers)?;
        Counting::Exact
    } else {
        Counting::UpTo(OVERVIEW_COUNT_BOUND)
    };
    Ok(json(s.admin.overview_counting(counting).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<i64>,
}

async fn dead_letters(
    State(s): State<Arc<AppState>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    Ok(json(s.admin.dead_letters(q.limit.unwrap_or(100)).await?))
}

async fn conflicts(
    State(s): State<Arc<AppState>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    Ok(json(s.admin.conflicts(q.limit.unwrap_or(100)).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumerListQuery {
    consumer: Option<String>,
    limit: Option<i64>,
}

async fn consumer_dead_letters(
    State(s): State<Arc<AppState>>,
    query: Result<Query<ConsumerListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    Ok(json(
        s.admin
            .consumer_dead_letters(q.consumer.as_deref(), q.limit.unwrap_or(100))
            .await?,
    ))
}

/// The body of `POST /api/v1/consumer-dead-letters/requeue`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumerRequeueBody {
    #[serde(default)]
    ids: Vec<i64>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    consumer: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

async fn requeue_consumer_dead_letters(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Json<ConsumerRequeueBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let actor = authorize(&s, &headers)?;
    let Json(body) = body.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let ids = match (body.all, body.ids.is_empty()) {
        (true, true) => None,
        (false, false) if body.ids.len() <= MAX_REQUEUE_IDS => Some(body.ids.as_slice()),
        (false, false) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("at most {MAX_REQUEUE_IDS} ids per request"),
            ));
        }
        _ => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "give either \"ids\" (a non-empty list) or \"all\": true".into(),
            ));
        }
    };
    let what = match ids {
        None => "all".to_owned(),
        Some(ids) => format!("{} id(s)", ids.len()),
    };
    let consumer = body.consumer.as_deref();
    let reason = body.reason.as_deref().unwrap_or_default();
    let result = s.admin.requeue_consumer_dead_letters(consumer, ids).await;
    audit(
        &actor,
        "requeue consumer dead letters",
        &what,
        reason,
        result.as_ref().copied(),
    );
    Ok(json(serde_json::json!({ "requeued": result? })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkItemQuery {
    state: Option<String>,
    limit: Option<i64>,
}

async fn work_items(
    State(s): State<Arc<AppState>>,
    query: Result<Query<WorkItemQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    Ok(json(
        s.admin
            .work_items(q.state.as_deref(), q.limit.unwrap_or(100))
            .await?,
    ))
}

/// The body of `POST /api/v1/work-items/{id}/resolve`: exactly one of the three.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    #[serde(default)]
    succeeded: Option<String>,
    #[serde(default)]
    failed: Option<String>,
    #[serde(default)]
    resend: bool,
    #[serde(default)]
    reason: Option<String>,
}

async fn resolve_work_item(
    State(s): State<Arc<AppState>>,
    id: Result<axum::extract::Path<i64>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
    body: Result<Json<ResolveBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let actor = authorize(&s, &headers)?;
    let axum::extract::Path(id) =
        id.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let Json(body) = body.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let resolution = match (body.succeeded, body.failed, body.resend) {
        (Some(reference), None, false) if !reference.is_empty() => {
            Resolution::Succeeded { reference }
        }
        (None, Some(reason), false) if !reason.is_empty() => Resolution::Failed { reason },
        (None, None, true) => Resolution::Resend,
        _ => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "give exactly one of \"succeeded\": \"<provider reference>\", \"failed\": \"<why>\", \"resend\": true".into(),
            ));
        }
    };
    let what = format!("work item {id}: {resolution:?}");
    let reason = body.reason.as_deref().unwrap_or_default();
    let result = s.admin.resolve_work_item(id, resolution).await;
    audit(
        &actor,
        "resolve work item",
        &what,
        reason,
        result.as_ref().map(|_| 1),
    );
    Ok(json(result?))
}

/// The audit line of an action (target `outbox::audit`).
fn audit(
    actor: &str,
    action: &str,
    selection: &str,
    reason: &str,
    outcome: Result<u64, &AdminError>,
) {
    match outcome {
        Ok(n) => {
            tracing::info!(target: "outbox::audit", actor, action, selection, reason, affected = n, "console action");
        }
        Err(e) => {
            tracing::warn!(target: "outbox::audit", actor, action, selection, reason, error = %e, "console action failed");
        }
    }
}

/// The body of `POST /api/v1/dead-letters/requeue`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequeueBody {
    #[serde(default)]
    event_ids: Vec<Uuid>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    reason: Option<String>,
}

/// Who may act: checks the origin, the mode and the token, in that order. Returns the token's
/// fingerprint for the audit line.
fn authorize(s: &AppState, headers: &HeaderMap) -> Result<String, ApiError> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let origin_host = origin
            .to_str()
            .ok()
            .and_then(|o| o.split_once("://"))
            .map(|(_, rest)| rest);
        if host.is_none() || origin_host != host {
            return Err(ApiError(
                StatusCode::FORBIDDEN,
                "cross-site request refused: the Origin does not match the Host".into(),
            ));
        }
    }
    if s.read_only {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "the console is read-only: actions are refused".into(),
        ));
    }
    check_token(s, headers)
}

/// The token's check; returns its fingerprint (the first 8 hex digits of its SHA-256).
fn check_token(s: &AppState, headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(expected) = &s.token_sha else {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "actions are disabled: no console token is configured (OUTBOX_CONSOLE_TOKEN)".into(),
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            ApiError(
                StatusCode::UNAUTHORIZED,
                "this action needs the console token (Authorization: Bearer <token>)".into(),
            )
        })?;
    let given = sha(given);
    if !bool::from(given.ct_eq(expected)) {
        return Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "wrong console token".into(),
        ));
    }
    Ok(given[..4].iter().map(|b| format!("{b:02x}")).collect())
}

async fn requeue(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Json<RequeueBody>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    let actor = authorize(&s, &headers)?;
    let Json(body) = body.map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.body_text()))?;
    let which = match (body.all, body.event_ids.is_empty()) {
        (true, true) => Requeue::All,
        (false, false) if body.event_ids.len() <= MAX_REQUEUE_IDS => Requeue::Ids(body.event_ids),
        (false, false) => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("at most {MAX_REQUEUE_IDS} event ids per request"),
            ));
        }
        _ => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "give either \"event_ids\" (a non-empty list) or \"all\": true".into(),
            ));
        }
    };
    let what = match &which {
        Requeue::All => "all".to_owned(),
        Requeue::Ids(ids) => format!("{} event id(s)", ids.len()),
    };
    let reason = body.reason.unwrap_or_default();
    let result = s.admin.requeue_dead_letters(which).await;
    audit(
        &actor,
        "requeue dead letters",
        &what,
        &reason,
        result.as_ref().copied(),
    );
    Ok(json(serde_json::json!({ "requeued": result? })))
}

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn loopback_host_names_and_nothing_else() {
        for ok in [
            "localhost",
            "LOCALHOST:80",
            "127.0.0.1:8080",
            "127.1.2.3",
            "[::1]",
            "[::1]:9",
            "console.localhost:8080",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for refused in [
            "",
            "evil.com",
            "localhost.evil.com",
            "127.0.0.1.evil.com",
            "[::1]evil",
            "[::1]:",
            "[::1]:80x",
            "[::2]",
            "::1",
            "10.0.0.1",
            "localhost:",
            "0.0.0.0",
        ] {
            assert!(!is_loopback_host(refused), "{refused}");
        }
    }
}
