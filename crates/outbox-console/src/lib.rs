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
//! | `GET /api/v1/activity?kind=publish\|consume\|oldest_pending_age\|dead_letters\|lag[&minutes=N]` | the relays' publishes per route, or the consumers' committed effects per consumer, per minute; or a level per minute (its highest reading): the oldest pending age and the dead letters the relays' gauges read, each consumer's lag; over the last `minutes` (1 to 120, default 60) as the heartbeats recorded them, busiest first ([`Activity`](outbox_core::operator::Activity)): the activity charts |
//! | `GET /api/v1/instances` | the relays, consumers and executors that run a heartbeat, each `up`, `late`, `gone` or `stopped`, with their own numbers and, for a relay or a consumer, its `health`: state (`working`, `idle`, `degraded`, `failing`), last progress, last error with its kind and age, errors in the last minute ([`Instance`](outbox_core::operator::Instance), [`HealthReport`](outbox_core::health::HealthReport)) |
//! | `GET /api/v1/dead-letters?limit=N&<filter>` | outbox dead letters, oldest first (`limit` 1 to 10,000, default 100); the filter fields are those of [`DeadLetterFilter`](outbox_core::operator::DeadLetterFilter): `aggregate_type`, `event_type`, `destination`, `reason_group`, `created_after`, `created_before` (RFC 3339) |
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
//! | `POST /api/v1/pauses/pause` | body `{"route": "destination:payments"}` (a route key as `routes` shows it), or `{"consumer": "ledger"}`, with `"reason"` (required) and optional `"actor"`: the polling relays stop claiming the route (an aggregate whose next row goes there waits), or the consumer stops taking deliveries, until resumed; 409 when paused already ([`PauseTarget`](outbox_core::operator::PauseTarget)) |
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

// `auth`: the access rules (the `Host`, the token, read-only mode, an action's origin, the
// audit record's actor); `error`: the error and JSON answers; `assets`: the page and its files;
// `api`: the steps every read and every action takes (`api::read`, `api::act`), and a module a
// topic naming what each of its routes asks of the store.
mod api;
mod assets;
mod auth;
mod error;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use outbox_core::operator::OperatorStore;

use crate::api::{conflicts, consumers, dead_letters, pauses, replay, status, work_items};

/// Where the overview's outbox counts stop unless `?exact=true` is asked for
/// ([`Counting::UpTo`](outbox_core::operator::Counting::UpTo)): the page refreshes every 5 s,
/// and an exact count of a 10-million-row backlog takes seconds.
pub const OVERVIEW_COUNT_BOUND: i64 = 100_000;

/// Where the routes' counts stop ([`ProcessOps::routes`](outbox_core::operator::ProcessOps::routes)): each refresh groups that many of the
/// oldest pending rows and dead letters by route (150 ms for 100,000 on a 10-million-row
/// outbox here; the page refreshes every 5 s).
pub const ROUTES_COUNT_BOUND: i64 = 10_000;

/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;
/// The most event ids one requeue request may name.
pub const MAX_REQUEUE_IDS: usize = 10_000;

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

/// What every request's handler shares: the store and the access rules of [`ConsoleConfig`]
/// (the token kept as its SHA-256 only).
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
        token_sha: config.token.as_deref().map(auth::sha),
        read_only: config.read_only,
        reads_need_token: config.reads_need_token,
        loopback_hosts_only: config.loopback_hosts_only,
    });
    Ok(Router::new()
        .route("/", get(assets::page))
        .route("/console.js", get(assets::script))
        .route("/console.css", get(assets::style))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(status::ready::<O>))
        .route("/api/v1/overview", status::overview())
        .route("/api/v1/routes", status::routes())
        .route("/api/v1/activity", status::activity())
        .route("/api/v1/instances", status::instances())
        .route("/api/v1/consumers", consumers::list())
        .route("/api/v1/dead-letters", dead_letters::list())
        .route("/api/v1/dead-letters/groups", dead_letters::groups())
        .route("/api/v1/dead-letters/requeue", dead_letters::requeue())
        .route("/api/v1/dead-letters/discard", dead_letters::discard())
        .route("/api/v1/dead-letters/{event_id}", dead_letters::one())
        .route("/api/v1/conflicts", conflicts::list())
        .route("/api/v1/conflicts/resolve", conflicts::resolve())
        .route("/api/v1/conflicts/{id}", conflicts::one())
        .route("/api/v1/consumer-dead-letters", consumers::dead_letters())
        .route(
            "/api/v1/consumer-dead-letters/groups",
            consumers::dead_letter_groups(),
        )
        .route(
            "/api/v1/consumer-dead-letters/requeue",
            consumers::requeue(),
        )
        .route(
            "/api/v1/consumer-dead-letters/discard",
            consumers::discard(),
        )
        .route(
            "/api/v1/consumer-dead-letters/{id}",
            consumers::dead_letter(),
        )
        .route("/api/v1/work-items", work_items::list())
        .route("/api/v1/work-items/{id}/resolve", work_items::resolve())
        .route("/api/v1/work-items/{id}/reconcile", work_items::reconcile())
        .route("/api/v1/replay", replay::replay())
        .route("/api/v1/pauses", pauses::list())
        .route("/api/v1/pauses/pause", pauses::pause())
        .route("/api/v1/pauses/resume", pauses::resume())
        .route("/api/v1/audit", status::audit())
        .route("/api/v1/trace/event/{event_id}", status::trace_event())
        .route("/api/v1/trace/aggregate", status::trace_aggregate())
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::guard::<O>,
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
