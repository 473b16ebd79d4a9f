//! The operations console of the outbox toolkit: a JSON API under `/api/v1` and the web page
//! built on it, as an axum [`Router`] that `outbox console` serves and that a service can mount
//! in its own axum app under a prefix ([`nested`]):
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_console::{ConsoleConfig, nested};
//! use outbox_postgres::{PgStore, PgStoreConfig};
//! // Any store that implements the operator contract (`outbox_core::operator`).
//! let store = PgStore::new(pool, PgStoreConfig::default());
//! let config = ConsoleConfig {
//!     token: std::env::var("OUTBOX_CONSOLE_TOKEN").ok(),
//!     ..ConsoleConfig::default()
//! };
//! // The page at /outbox (/outbox/ redirects there), its API under /outbox/api/v1.
//! let app = axum::Router::new().merge(nested("/outbox", store, config)?);
//! # let _ = app; Ok(()) }
//! ```
//!
//! Everything the console reads and does goes through the operator contract
//! ([`OperatorStore`]), which `outbox status` and `outbox dead-letters` use too, so the page
//! and the CLI never disagree, and the console works on every store that implements it.
//!
//! # API (version 1)
//!
//! | method and path | what |
//! |---|---|
//! | `GET /api/v1/overview[?exact=true]` | [`Overview`](outbox_core::operator::Overview) as JSON; the outbox counts stop at [`OVERVIEW_COUNT_BOUND`] (`counted_up_to`; a count equal to it means at least that many) unless `exact=true`, which counts every row (seconds at millions of rows) and needs the token |
//! | `GET /api/v1/routes` | per route (the rows' destination, or their aggregate type): pending rows, the oldest one's age and dead letters, counted among the oldest [`ROUTES_COUNT_BOUND`] (`complete` says whether that was all), and publishes per minute over the last 15 minutes from the relays' heartbeats ([`Routes`](outbox_core::operator::Routes)) |
//! | `GET /api/v1/consumers` | per consumer: its processes up, its lag and the effects it committed per minute over the last 15 minutes as its engines report them through their heartbeats, whether it is paused, its open dead letters and its conflicts ([`ConsumerView`](outbox_core::operator::ConsumerView)) |
//! | `GET /api/v1/instances` | the relays, consumers and executors that run a heartbeat, each `up`, `late`, `gone` or `stopped`, with their own numbers and, for a relay or a consumer, its `health`: state (`working`, `idle`, `degraded`, `failing`), last progress, last error with its kind and age, errors in the last minute ([`Instance`](outbox_core::operator::Instance), [`HealthReport`](outbox_core::health::HealthReport)) |
//! | `GET /api/v1/dead-letters?limit=N&<filter>` | outbox dead letters, oldest first (`limit` 1 to 10,000, default 100); the filter fields are those of [`DeadLetterFilter`]: `aggregate_type`, `event_type`, `destination`, `reason_group`, `created_after`, `created_before` (RFC 3339) |
//! | `GET /api/v1/dead-letters/groups?<filter>` | the matching dead letters grouped by reason ([`DeadLetterGroups`](outbox_core::operator::DeadLetterGroups)); a group's `reason` is a filter's `reason_group` |
//! | `GET /api/v1/dead-letters/{event_id}` | one dead letter whole, payload and headers included; **needs the token** (and a role that may read payloads: the operator's) |
//! | `POST /api/v1/dead-letters/requeue` | body: exactly one of `{"event_ids": ["…"]}`, `{"all": true}`, `{"filter": {…}}`; optional `"reason"` and `"actor"`; answers `{"requeued": n}` |
//! | `POST /api/v1/dead-letters/discard` | the same selection, `"reason"` required: the dead letters are kept whole in `discarded_events` and never published; answers `{"discarded": n, "audit_id": id}` |
//! | `GET /api/v1/conflicts?limit=N[&event_id=…][&open=true]` | inbox conflicts, newest first (the open ones only with `open=true`), with both fingerprints and, once resolved, when, by whom and why |
//! | `GET /api/v1/conflicts/{id}` | one conflict with the conflicting payload and, where this database still holds it, the first; **needs the token** |
//! | `POST /api/v1/conflicts/resolve` | body `{"ids": [1, 2], "reason": "…"}` (`"reason"` required, optional `"actor"`): the conflicts leave the open list, nothing is applied or undone (the consumer's effect stays the first payload's); answers `{"resolved": n, "audit_id": id}`, 404 when no id is a conflict ([`ConflictOps::resolve_conflicts`](outbox_core::operator::ConflictOps::resolve_conflicts)) |
//! | `GET /api/v1/consumer-dead-letters?consumer=C&reason_group=R&limit=N` | consumer dead letters not resolved, oldest first |
//! | `GET /api/v1/consumer-dead-letters/groups?consumer=C` | the same grouped by consumer and reason |
//! | `GET /api/v1/consumer-dead-letters/{id}` | one, with the payload and headers as received; **needs the token** |
//! | `POST /api/v1/consumer-dead-letters/requeue` | body `{"ids": [1, 2]}` or `{"all": true}`, optional `"consumer"`, `"reason_group"`, `"reason"`, `"actor"`; the consumer applies them again through its inbox |
//! | `POST /api/v1/consumer-dead-letters/discard` | the same selection, `"reason"` required: they become `resolved`, never applied |
//! | `GET /api/v1/work-items?state=S&limit=N` | remote effects (work items), in one state or all, with their calls and reconciliation lookups |
//! | `POST /api/v1/work-items/{id}/resolve` | body `{"succeeded": "<provider reference>"}`, `{"failed": "<why>"}` or `{"resend": true}`, optional `"reason"`, `"actor"`; answers the row as it is now (404 no such item, 409 its state does not allow it) |
//! | `POST /api/v1/work-items/{id}/reconcile` | an unknown outcome's lookup is due now (409 when it is not unknown) |
//! | `POST /api/v1/replay` | body `{"aggregate_type": "payment", "aggregate_id": "42", "from_version": 3, "dry_run": true}`, then the same with `"expect_events": <the dry run's count>` and a `"reason"`: one aggregate's published events pending again under their original ids (mark mode only); 409 in delete mode, beyond the replay horizon, while a relay holds the aggregate or a CDC relay runs, or when the count changed; 404 when nothing of it is held; answers [`ReplayPlan`](outbox_core::operator::ReplayPlan). Or a time range: `{"created_after": "…", "created_before": "…"}` (RFC 3339, optional `"aggregate_type"`, `"destination"`): the published events written in it, each aggregate extended to its newest version, refused (409) when the range starts at or before the replay horizon (the newest write time among the rows retention deleted; it starts at the migration to schema 11) or is too big; answers [`RangePlan`](outbox_core::operator::RangePlan) |
//! | `GET /api/v1/pauses` | the routes and consumers paused, with who paused them, when and why ([`Pause`](outbox_core::operator::Pause)) |
//! | `POST /api/v1/pauses/pause` | body `{"route": "destination:payments"}` (a route key as `routes` shows it), or `{"consumer": "ledger"}`, with `"reason"` (required) and optional `"actor"`: the polling relays stop claiming the route (an aggregate whose next row goes there waits), or the consumer stops taking deliveries, until resumed; 409 when paused already ([`PauseTarget`]) |
//! | `POST /api/v1/pauses/resume` | the same body (`"reason"` optional): ends the pause; 404 when it is not paused |
//! | `GET /api/v1/audit?limit=N&before=ID` | the recorded actions (CLI's and console's), newest first |
//! | `GET /api/v1/trace/event/{event_id}` | everything this database holds of an event ([`EventTrace`](outbox_core::operator::EventTrace)) |
//! | `GET /api/v1/trace/aggregate?aggregate_type=T&aggregate_id=I&limit=N` | an aggregate's outbox rows, discarded events and each consumer's last applied version |
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
//! * Every action is recorded in the database's `audit` table in the action's own transaction
//!   (who: the name the page sends as `"actor"`, else "console operator", with the token's
//!   fingerprint, the first 8 hex digits of its SHA-256, as its credential; the database role;
//!   what it selected; the reason; how many rows), and logged under the target
//!   `outbox::audit` (failed attempts too, which change nothing and are only logged). The
//!   name is what the operator typed: one shared token proves only that its holder acted.
//! * The payloads and headers of outbox dead letters, consumer dead letters and conflicts are
//!   shown only to the token's holder, and only when the console's database role may read them
//!   (the operator role; the read-only role never reads them). A work item's payload (what the
//!   remote effect does) is shown with the work items and in traces, as `outbox effects list`
//!   prints it to the read-only role.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use outbox_core::operator::{
    Actor, ConsumerSelection, Counting, DeadLetterFilter, DeadLetterSelection, OperatorError,
    OperatorErrorKind, OperatorStore, PauseTarget, RangeSelection, ReplaySelection, Resolution,
};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

/// Where the overview's outbox counts stop unless `?exact=true` is asked for
/// ([`Counting::UpTo`]): the page refreshes every 5 s, and an exact count of a 10-million-row
/// backlog takes seconds.
pub const OVERVIEW_COUNT_BOUND: i64 = 100_000;

/// Where the routes' counts stop ([`ProcessOps::routes`](outbox_core::operator::ProcessOps::routes)): each refresh groups that many of the
/// oldest pending rows and dead letters by route (150 ms for 100,000 on a 10-million-row
/// outbox here; the page refreshes every 5 s).
pub const ROUTES_COUNT_BOUND: i64 = 10_000;

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

struct AppState<O> {
    admin: O,
    token_sha: Option<[u8; 32]>,
    read_only: bool,
    reads_need_token: bool,
    loopback_hosts_only: bool,
}

/// The console's routes (API, health and page), to serve or to `nest` under a prefix.
///
/// # Errors
/// [`ConsoleError::WeakToken`] for a token shorter than [`MIN_TOKEN_LEN`].
pub fn router<O: OperatorStore>(admin: O, config: ConsoleConfig) -> Result<Router, ConsoleError> {
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
        .route("/readyz", get(ready::<O>))
        .route("/api/v1/overview", get(overview::<O>))
        .route("/api/v1/routes", get(routes::<O>))
        .route("/api/v1/instances", get(instances::<O>))
        .route("/api/v1/consumers", get(consumers::<O>))
        .route("/api/v1/dead-letters", get(dead_letters::<O>))
        .route("/api/v1/dead-letters/groups", get(dead_letter_groups::<O>))
        .route("/api/v1/dead-letters/requeue", post(requeue::<O>))
        .route("/api/v1/dead-letters/discard", post(discard::<O>))
        .route("/api/v1/dead-letters/{event_id}", get(dead_letter::<O>))
        .route("/api/v1/conflicts", get(conflicts::<O>))
        .route("/api/v1/conflicts/resolve", post(resolve_conflicts::<O>))
        .route("/api/v1/conflicts/{id}", get(conflict::<O>))
        .route(
            "/api/v1/consumer-dead-letters",
            get(consumer_dead_letters::<O>),
        )
        .route(
            "/api/v1/consumer-dead-letters/groups",
            get(consumer_dead_letter_groups::<O>),
        )
        .route(
            "/api/v1/consumer-dead-letters/requeue",
            post(requeue_consumer_dead_letters::<O>),
        )
        .route(
            "/api/v1/consumer-dead-letters/discard",
            post(discard_consumer_dead_letters::<O>),
        )
        .route(
            "/api/v1/consumer-dead-letters/{id}",
            get(consumer_dead_letter::<O>),
        )
        .route("/api/v1/work-items", get(work_items::<O>))
        .route(
            "/api/v1/work-items/{id}/reconcile",
            post(reconcile_work_item::<O>),
        )
        .route("/api/v1/audit", get(audit_log::<O>))
        .route("/api/v1/replay", post(replay::<O>))
        .route("/api/v1/pauses", get(pauses::<O>))
        .route("/api/v1/pauses/pause", post(pause::<O>))
        .route("/api/v1/pauses/resume", post(resume::<O>))
        .route("/api/v1/trace/event/{event_id}", get(trace_event::<O>))
        .route("/api/v1/trace/aggregate", get(trace_aggregate::<O>))
        .route(
            "/api/v1/work-items/{id}/resolve",
            post(resolve_work_item::<O>),
        )
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            guard::<O>,
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
pub fn nested<O: OperatorStore>(
    prefix: &str,
    admin: O,
    config: ConsoleConfig,
) -> Result<Router, ConsoleError> {
    // `prefix/` redirects to `prefix`, which passes the console's own guard.
    let to = prefix.to_owned();
    Ok(Router::new().nest(prefix, router(admin, config)?).route(
        &format!("{prefix}/"),
        get(move || async move { axum::response::Redirect::permanent(&to) }),
    ))
}

/// The checks every request passes first: the `Host` (when [`ConsoleConfig::loopback_hosts_only`])
/// and, for the API when [`ConsoleConfig::reads_need_token`], the token.
async fn guard<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
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
pub async fn serve<O: OperatorStore>(
    listener: tokio::net::TcpListener,
    admin: O,
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

impl From<OperatorError> for ApiError {
    fn from(e: OperatorError) -> Self {
        let status = match e.kind {
            OperatorErrorKind::Unavailable | OperatorErrorKind::Schema => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            OperatorErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            OperatorErrorKind::InvalidRequest => StatusCode::BAD_REQUEST,
            OperatorErrorKind::NotFound => StatusCode::NOT_FOUND,
            OperatorErrorKind::Refused => StatusCode::CONFLICT,
            // `Other`, and any class a later release adds.
            _ => StatusCode::INTERNAL_SERVER_ERROR,
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

async fn ready<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
) -> Result<&'static str, ApiError> {
    s.admin.ready().await?;
    Ok("ready")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverviewQuery {
    #[serde(default)]
    exact: bool,
}

async fn overview<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    query: Result<Query<OverviewQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    let counting = if q.exact {
        // A full count costs seconds on a large backlog: not for anyone who can reach the port.
        check_token(&s, &headers)?;
        Counting::Exact
    } else {
        Counting::UpTo(OVERVIEW_COUNT_BOUND)
    };
    Ok(json(s.admin.overview_counting(counting).await?))
}

async fn routes<O: OperatorStore>(State(s): State<Arc<AppState<O>>>) -> Result<Response, ApiError> {
    Ok(json(s.admin.routes(ROUTES_COUNT_BOUND).await?))
}

async fn instances<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
) -> Result<Response, ApiError> {
    Ok(json(s.admin.instances().await?))
}

type QueryRejection = axum::extract::rejection::QueryRejection;
type JsonRejection = axum::extract::rejection::JsonRejection;
type PathRejection = axum::extract::rejection::PathRejection;

fn bad_query(e: QueryRejection) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, e.body_text())
}

fn bad_body(e: JsonRejection) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, e.body_text())
}

fn bad_path(e: PathRejection) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, e.body_text())
}

/// The query of the outbox dead-letter reads: a [`DeadLetterFilter`] and a page size.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterQuery {
    limit: Option<i64>,
    aggregate_type: Option<String>,
    event_type: Option<String>,
    destination: Option<String>,
    reason_group: Option<String>,
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    created_before: Option<chrono::DateTime<chrono::Utc>>,
}

impl DeadLetterQuery {
    fn filter(self) -> (DeadLetterFilter, i64) {
        let limit = self.limit.unwrap_or(100);
        let filter = DeadLetterFilter {
            aggregate_type: nonempty(self.aggregate_type),
            event_type: nonempty(self.event_type),
            destination: nonempty(self.destination),
            reason_group: nonempty(self.reason_group),
            created_after: self.created_after,
            created_before: self.created_before,
        };
        (filter, limit)
    }
}

/// A form's empty field means "any".
fn nonempty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

async fn dead_letters<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    query: Result<Query<DeadLetterQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (filter, limit) = query.map_err(bad_query)?.0.filter();
    Ok(json(s.admin.dead_letters(&filter, limit).await?))
}

async fn dead_letter_groups<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    query: Result<Query<DeadLetterQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (filter, _) = query.map_err(bad_query)?.0.filter();
    Ok(json(s.admin.dead_letter_groups(&filter).await?))
}

/// Payloads and headers: only for the token's holder (and only under a role that may read
/// them, the operator's).
async fn dead_letter<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Response, ApiError> {
    check_token(&s, &headers)?;
    let Path(id) = id.map_err(bad_path)?;
    Ok(json(s.admin.dead_letter(id).await?))
}

/// The body of the outbox dead-letter actions: exactly one of `event_ids` (non-empty),
/// `"all": true` or a non-empty `filter`; `reason` (required by a discard) and `actor` go
/// into the audit record.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterActionBody {
    #[serde(default)]
    event_ids: Vec<Uuid>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    filter: Option<DeadLetterFilter>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

impl DeadLetterActionBody {
    fn selection(&self) -> Result<DeadLetterSelection, ApiError> {
        let filter = self
            .filter
            .clone()
            .filter(|f| *f != DeadLetterFilter::default());
        match (self.event_ids.is_empty(), self.all, filter) {
            (false, false, None) if self.event_ids.len() <= MAX_REQUEUE_IDS => {
                Ok(DeadLetterSelection::Ids(self.event_ids.clone()))
            }
            (false, false, None) => Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("at most {MAX_REQUEUE_IDS} event ids per request"),
            )),
            (true, true, None) => Ok(DeadLetterSelection::All),
            (true, false, Some(f)) => Ok(DeadLetterSelection::Matching(f)),
            _ => Err(ApiError(
                StatusCode::BAD_REQUEST,
                "give exactly one of \"event_ids\" (a non-empty list), \"all\": true, or a non-empty \"filter\"".into(),
            )),
        }
    }
}

async fn requeue<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    body: Result<Json<DeadLetterActionBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let which = body.selection()?;
    let reason = body.reason.unwrap_or_default();
    let n = s
        .admin
        .requeue_dead_letters(&which, &actor, &reason)
        .await?;
    Ok(json(serde_json::json!({ "requeued": n })))
}

async fn discard<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    body: Result<Json<DeadLetterActionBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let which = body.selection()?;
    let reason = body.reason.unwrap_or_default();
    Ok(json(
        s.admin
            .discard_dead_letters(&which, &actor, &reason)
            .await?,
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConflictQuery {
    limit: Option<i64>,
    event_id: Option<Uuid>,
    open: Option<bool>,
}

async fn conflicts<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    query: Result<Query<ConflictQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    Ok(json(
        s.admin
            .conflicts(q.event_id, q.open.unwrap_or(false), q.limit.unwrap_or(100))
            .await?,
    ))
}

/// The body of `POST /api/v1/conflicts/resolve`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveConflictsBody {
    ids: Vec<i64>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

async fn resolve_conflicts<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    body: Result<Json<ResolveConflictsBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let reason = body.reason.unwrap_or_default();
    Ok(json(
        s.admin
            .resolve_conflicts(&body.ids, &actor, &reason)
            .await?,
    ))
}

async fn conflict<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Response, ApiError> {
    check_token(&s, &headers)?;
    let Path(id) = id.map_err(bad_path)?;
    Ok(json(s.admin.conflict(id).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumerListQuery {
    consumer: Option<String>,
    reason_group: Option<String>,
    limit: Option<i64>,
}

impl ConsumerListQuery {
    fn selection(self) -> (ConsumerSelection, i64) {
        (
            ConsumerSelection {
                consumer: nonempty(self.consumer),
                ids: None,
                reason_group: nonempty(self.reason_group),
            },
            self.limit.unwrap_or(100),
        )
    }
}

async fn consumer_dead_letters<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    query: Result<Query<ConsumerListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (which, limit) = query.map_err(bad_query)?.0.selection();
    Ok(json(s.admin.consumer_dead_letters(&which, limit).await?))
}

async fn consumer_dead_letter_groups<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    query: Result<Query<ConsumerListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (which, _) = query.map_err(bad_query)?.0.selection();
    Ok(json(s.admin.consumer_dead_letter_groups(&which).await?))
}

async fn consumer_dead_letter<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Response, ApiError> {
    check_token(&s, &headers)?;
    let Path(id) = id.map_err(bad_path)?;
    Ok(json(s.admin.consumer_dead_letter(id).await?))
}

/// The body of the consumer dead-letter actions: `ids` (non-empty) or `"all": true`, either
/// narrowed by `consumer` and `reason_group`; `reason` (required by a discard) and `actor`
/// go into the audit record.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumerActionBody {
    #[serde(default)]
    ids: Vec<i64>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    consumer: Option<String>,
    #[serde(default)]
    reason_group: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

impl ConsumerActionBody {
    fn selection(&self) -> Result<ConsumerSelection, ApiError> {
        let ids = match (self.all, self.ids.is_empty()) {
            (true, true) => None,
            (false, false) if self.ids.len() <= MAX_REQUEUE_IDS => Some(self.ids.clone()),
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
        // As given: an empty reason group is the group of empty errors, not "any" (a form's
        // empty field means "any" only in reads).
        Ok(ConsumerSelection {
            consumer: self.consumer.clone(),
            ids,
            reason_group: self.reason_group.clone(),
        })
    }
}

async fn requeue_consumer_dead_letters<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    body: Result<Json<ConsumerActionBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let which = body.selection()?;
    let reason = body.reason.unwrap_or_default();
    let n = s
        .admin
        .requeue_consumer_dead_letters(&which, &actor, &reason)
        .await?;
    Ok(json(serde_json::json!({ "requeued": n })))
}

async fn discard_consumer_dead_letters<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    body: Result<Json<ConsumerActionBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let which = body.selection()?;
    let reason = body.reason.unwrap_or_default();
    let n = s
        .admin
        .discard_consumer_dead_letters(&which, &actor, &reason)
        .await?;
    Ok(json(serde_json::json!({ "discarded": n })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkItemQuery {
    state: Option<String>,
    limit: Option<i64>,
}

async fn work_items<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    query: Result<Query<WorkItemQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    Ok(json(
        s.admin
            .work_items(nonempty(q.state).as_deref(), q.limit.unwrap_or(100))
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
    #[serde(default)]
    actor: Option<String>,
}

async fn resolve_work_item<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    id: Result<Path<i64>, PathRejection>,
    headers: HeaderMap,
    body: Result<Json<ResolveBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let Path(id) = id.map_err(bad_path)?;
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
    let reason = body.reason.unwrap_or_default();
    Ok(json(
        s.admin
            .resolve_work_item(id, resolution, &actor, &reason)
            .await?,
    ))
}

/// The body of `POST /api/v1/work-items/{id}/reconcile`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileBody {
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

async fn reconcile_work_item<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    id: Result<Path<i64>, PathRejection>,
    headers: HeaderMap,
    body: Result<Json<ReconcileBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let Path(id) = id.map_err(bad_path)?;
    let reason = body.reason.unwrap_or_default();
    s.admin.reconcile_work_item(id, &actor, &reason).await?;
    Ok(json(serde_json::json!({ "reconcile": id })))
}

/// The body of `POST /api/v1/replay`: the aggregate ([`ReplaySelection`]'s fields),
/// `dry_run`, `expect_events` (the dry run's count), `reason` (required unless a dry run),
/// `actor`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    #[serde(default)]
    aggregate_type: Option<String>,
    #[serde(default)]
    aggregate_id: Option<String>,
    #[serde(default)]
    from_version: Option<i64>,
    #[serde(default)]
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    created_before: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    destination: Option<String>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    expect_events: Option<i64>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

async fn replay<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    body: Result<Json<ReplayBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let reason = body.reason.clone().unwrap_or_default();
    match body {
        ReplayBody {
            created_after: Some(created_after),
            created_before: Some(created_before),
            aggregate_id: None,
            from_version: None,
            aggregate_type,
            destination,
            dry_run,
            expect_events,
            ..
        } => {
            let which = RangeSelection {
                created_after,
                created_before,
                aggregate_type,
                destination,
            };
            Ok(json(
                s.admin
                    .replay_range(&which, dry_run, expect_events, &actor, &reason)
                    .await?,
            ))
        }
        ReplayBody {
            aggregate_type: Some(aggregate_type),
            aggregate_id: Some(aggregate_id),
            created_after: None,
            created_before: None,
            destination: None,
            from_version,
            dry_run,
            expect_events,
            ..
        } => {
            let which = ReplaySelection {
                aggregate_type,
                aggregate_id,
                from_version,
            };
            Ok(json(
                s.admin
                    .replay(&which, dry_run, expect_events, &actor, &reason)
                    .await?,
            ))
        }
        _ => Err(ApiError(
            StatusCode::BAD_REQUEST,
            "name one aggregate (\"aggregate_type\", \"aggregate_id\", optional \
             \"from_version\") or one time range (\"created_after\", \"created_before\", \
             optional \"aggregate_type\", \"destination\")"
                .into(),
        )),
    }
}

/// The body of `POST /api/v1/pauses/pause` and `/resume`: one of `route` or `consumer`, a
/// `reason`, an `actor`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    #[serde(default)]
    route: Option<String>,
    #[serde(default)]
    consumer: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

impl PauseBody {
    fn target(&self) -> Result<PauseTarget, ApiError> {
        match (&self.route, &self.consumer) {
            (Some(r), None) => Ok(PauseTarget::Route(r.clone())),
            (None, Some(c)) => Ok(PauseTarget::Consumer(c.clone())),
            _ => Err(ApiError(
                StatusCode::BAD_REQUEST,
                "name exactly one of \"route\" (a route key such as \"destination:payments\") \
                 or \"consumer\""
                    .into(),
            )),
        }
    }
}

async fn consumers<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
) -> Result<Response, ApiError> {
    Ok(json(s.admin.consumers().await?))
}

async fn pauses<O: OperatorStore>(State(s): State<Arc<AppState<O>>>) -> Result<Response, ApiError> {
    Ok(json(s.admin.pauses().await?))
}

async fn pause<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    body: Result<Json<PauseBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let target = body.target()?;
    let reason = body.reason.unwrap_or_default();
    Ok(json(s.admin.pause(&target, &actor, &reason).await?))
}

async fn resume<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    headers: HeaderMap,
    body: Result<Json<PauseBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let (body, actor) = action(&s, &headers, body)?;
    let target = body.target()?;
    let reason = body.reason.unwrap_or_default();
    s.admin.resume(&target, &actor, &reason).await?;
    Ok(json(
        serde_json::json!({ "resumed": { target.kind(): target.name() } }),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    limit: Option<i64>,
    before: Option<i64>,
}

async fn audit_log<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    Ok(json(s.admin.audit(q.before, q.limit.unwrap_or(100)).await?))
}

async fn trace_event<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    id: Result<Path<Uuid>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = id.map_err(bad_path)?;
    Ok(json(s.admin.trace_event(id).await?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AggregateQuery {
    aggregate_type: String,
    aggregate_id: String,
    limit: Option<i64>,
}

async fn trace_aggregate<O: OperatorStore>(
    State(s): State<Arc<AppState<O>>>,
    query: Result<Query<AggregateQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(bad_query)?;
    Ok(json(
        s.admin
            .trace_aggregate(&q.aggregate_type, &q.aggregate_id, q.limit.unwrap_or(100))
            .await?,
    ))
}

/// A body of an action, which may name its actor.
trait ActionBody {
    /// The name the page sent.
    fn actor(&self) -> Option<&str>;
}

macro_rules! action_bodies {
    ($($t:ty),*) => {$(
        impl ActionBody for $t {
            fn actor(&self) -> Option<&str> {
                self.actor.as_deref()
            }
        }
    )*};
}
action_bodies!(
    DeadLetterActionBody,
    ConsumerActionBody,
    ResolveBody,
    ReconcileBody,
    ReplayBody,
    PauseBody,
    ResolveConflictsBody
);

/// The start of every action: the origin, mode and token checks (before the body is read),
/// then the body and the audit record's actor.
fn action<O, B: ActionBody>(
    s: &AppState<O>,
    headers: &HeaderMap,
    body: Result<Json<B>, JsonRejection>,
) -> Result<(B, Actor), ApiError> {
    let credential = authorize(s, headers)?;
    let Json(body) = body.map_err(bad_body)?;
    let actor = actor(body.actor(), &credential)?;
    Ok((body, actor))
}

/// The audit record's actor of a console action: the name the page sent (what the operator
/// typed; otherwise "console operator") with the token's fingerprint as its credential.
fn actor(name: Option<&str>, credential: &str) -> Result<Actor, ApiError> {
    let name = name
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .unwrap_or("console operator");
    Ok(Actor::new(name, "console")?.with_credential(format!("token {credential}")))
}

/// Who may act: checks the origin, the mode and the token, in that order. Returns the token's
/// fingerprint for the audit record.
fn authorize<O>(s: &AppState<O>, headers: &HeaderMap) -> Result<String, ApiError> {
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
fn check_token<O>(s: &AppState<O>, headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(expected) = &s.token_sha else {
        return Err(ApiError(
            StatusCode::FORBIDDEN,
            "actions are disabled: no console token is configured (OUTBOX_CONSOLE_TOKEN)".into(),
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme is case-insensitive (RFC 9110 §11.1).
        .and_then(|v| {
            v.get(..7)
                .filter(|scheme| scheme.eq_ignore_ascii_case("bearer "))
                .map(|_| &v[7..])
        })
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
