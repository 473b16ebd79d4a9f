//! `outbox demo-provider`: a stand-in payment provider, run as its own HTTP server process.
//!
//! The crash matrix's last row (DESIGN.md §3) is about a remote payout: a crash after the
//! provider call and before the result is recorded. To show both sides of that boundary the
//! harness needs a provider it can inspect and whose idempotency it can switch off. This is it.
//!
//! ```text
//! POST /payouts              Idempotency-Key: K   {"reference","amount","beneficiary"}
//!                            201 new payout, 200 replay of K ("replayed": true),
//!                            400 no key / bad JSON, 422 amount <= 0 or K reused with another body
//! GET  /payouts/by-key/K     200 the payout created under K, 404 none (always 404 without idempotency)
//! GET  /payouts              every payout, for counting payouts per reference
//! POST /admin/delay          {"ms": n}: delay every later POST /payouts answer by n ms
//! GET  /admin/stats          {"payouts","replays","idempotency","delay_ms"}
//! ```
//!
//! Semantics that the crash harness relies on:
//!
//! - A payout is recorded *before* the response delay. A client that gives up waiting leaves a
//!   payout behind without knowing it: the "unknown outcome" that reconciliation must resolve by
//!   asking `GET /payouts/by-key/K`. The delay applies to `POST /payouts` only, so lookups and
//!   admin calls answer at once.
//! - With `--no-idempotency` the key is ignored: every `POST /payouts` creates a new payout and
//!   keys are not indexed, so a retried call pays twice and a lookup by key finds nothing. It is
//!   the provider the design warns about, made visible.
//! - A refusal (amount <= 0) records nothing, so a later lookup answers 404.
//!
//! State lives in memory for the process lifetime only: the harness kills the executor, never
//! the provider. Restarting the provider forgets every payout and key.
//!
//! On start the server prints exactly one line to stdout, `listening on http://ADDR`, so a parent
//! process can pass `--listen 127.0.0.1:0` and read the chosen port.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Largest request body accepted; bigger ones are answered 413 without being read.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// How long a stopping server waits for open connections to finish their answers.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Body of the 404 a lookup gets for a key without a payout: the protocol's constant, which
/// [`outbox_http::HttpPayoutProvider`] matches on exactly.
pub use outbox_http::NO_PAYOUT_FOR_KEY;

/// Options of `outbox demo-provider`.
#[derive(clap::Args, Debug, Clone)]
pub struct ProviderArgs {
    /// Address to listen on; port 0 picks a free port (read it from the first stdout line).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Ignore the Idempotency-Key: every POST /payouts creates a new payout, lookups by key
    /// always answer 404. Shows the double payout a provider without idempotency allows.
    #[arg(long)]
    pub no_idempotency: bool,
    /// Delay every POST /payouts answer by this many milliseconds, after the payout was
    /// recorded (changeable at runtime with POST /admin/delay).
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
}

/// Runs the provider until `shutdown` is cancelled, announcing its address on stdout.
///
/// # Errors
///
/// Fails when the address cannot be bound or stdout cannot be written. Errors of single
/// connections are logged and do not stop the server.
pub async fn run_provider(args: ProviderArgs, shutdown: CancellationToken) -> Result<()> {
    let server = ProviderServer::bind(&args).await?;
    let addr = server.local_addr();
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on http://{addr}")
            .and_then(|()| out.flush())
            .context("cannot write the listening address to stdout")?;
    }
    info!(
        %addr,
        idempotency = !args.no_idempotency,
        delay_ms = args.delay_ms,
        "stand-in payment provider started"
    );
    server.serve(shutdown).await;
    info!("stand-in payment provider stopped");
    Ok(())
}

/// A bound, not yet serving provider. Split from [`run_provider`] so tests can learn the port
/// without parsing stdout.
pub struct ProviderServer {
    listener: TcpListener,
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
}

impl ProviderServer {
    /// Binds `args.listen` with an empty payout book.
    ///
    /// # Errors
    ///
    /// Fails when the address cannot be bound (in use, not local, no permission).
    pub async fn bind(args: &ProviderArgs) -> Result<Self> {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener
            .local_addr()
            .context("cannot read the bound address")?;
        let state = State {
            idempotency: !args.no_idempotency,
            delay_ms: args.delay_ms,
            payouts: Vec::new(),
            by_key: HashMap::new(),
            replays: 0,
        };
        Ok(Self {
            listener,
            addr,
            state: Arc::new(Mutex::new(state)),
        })
    }

    /// The address actually bound (the chosen port when `--listen` had port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves HTTP/1.1 (keep-alive) until `shutdown` is cancelled, then stops accepting, lets
    /// open connections finish their current answer (a pending response delay is cut short) and
    /// closes them, waiting at most a few seconds.
    pub async fn serve(self, shutdown: CancellationToken) {
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        let state = Arc::clone(&self.state);
                        let shutdown = shutdown.clone();
                        conns.spawn(serve_connection(stream, peer, state, shutdown));
                    }
                    Err(e) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
        drop(self.listener);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while conns.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!(
                open = conns.len(),
                "connections still open after the drain timeout; closing them"
            );
            conns.abort_all();
        }
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    state: Arc<Mutex<State>>,
    shutdown: CancellationToken,
) {
    let handler_shutdown = shutdown.clone();
    let service = service_fn(move |req| {
        let state = Arc::clone(&state);
        let shutdown = handler_shutdown.clone();
        async move { Ok::<_, Infallible>(handle(&state, &shutdown, req).await) }
    });
    let conn = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        // Clients that give up mid-answer (the timeout scenario) end up here: not an error of
        // the provider.
        debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// One payout as the provider keeps it and lists it.
#[derive(Debug, Clone, Serialize)]
struct Payout {
    payout_id: String,
    reference: String,
    amount: i64,
    beneficiary: String,
    /// As received; `None` when the request had no key (only possible without idempotency).
    idempotency_key: Option<String>,
    created_at_ms: i64,
}

impl Payout {
    fn same_request(&self, req: &PayoutRequest) -> bool {
        self.reference == req.reference
            && self.amount == req.amount
            && self.beneficiary == req.beneficiary
    }

    fn to_json(&self, replayed: Option<bool>) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_else(|_| json!({}));
        if let Some(replayed) = replayed {
            v["replayed"] = json!(replayed);
        }
        v
    }
}

/// Body of `POST /payouts`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PayoutRequest {
    reference: String,
    amount: i64,
    beneficiary: String,
}

/// Body of `POST /admin/delay`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DelayRequest {
    ms: u64,
}

/// The provider's whole memory.
#[derive(Debug)]
struct State {
    idempotency: bool,
    delay_ms: u64,
    payouts: Vec<Payout>,
    /// Idempotency key -> index into `payouts`. Stays empty without idempotency.
    by_key: HashMap<String, usize>,
    replays: u64,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock cannot leave the book half-written (every update is one
    // push plus one insert), so a poisoned lock is still usable.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

type Resp = Response<Full<Bytes>>;

fn respond(status: StatusCode, body: &serde_json::Value) -> Resp {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn error(status: StatusCode, message: &str) -> Resp {
    respond(status, &json!({ "error": message }))
}

fn method_not_allowed(allow: &'static str) -> Resp {
    let mut resp = error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("method not allowed (allowed: {allow})"),
    );
    resp.headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    resp
}

async fn handle(
    state: &Mutex<State>,
    shutdown: &CancellationToken,
    req: Request<Incoming>,
) -> Resp {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    match (path.as_str(), &method) {
        ("/payouts", &Method::POST) => create_payout(state, shutdown, req).await,
        ("/payouts", &Method::GET) => list_payouts(state),
        ("/payouts", _) => method_not_allowed("GET, POST"),
        ("/admin/delay", &Method::POST) => set_delay(state, req).await,
        ("/admin/delay", _) => method_not_allowed("POST"),
        ("/admin/stats", &Method::GET) => stats(state),
        ("/admin/stats", _) => method_not_allowed("GET"),
        (p, m) => match p.strip_prefix("/payouts/by-key/") {
            Some(segment) if m == Method::GET => lookup(state, segment),
            Some(_) => method_not_allowed("GET"),
            None => error(
                StatusCode::NOT_FOUND,
                &format!("no such route: {method} {path}"),
            ),
        },
    }
}

/// Reads a JSON body of at most [`MAX_BODY_BYTES`], or the error answer to send instead.
async fn read_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, Resp> {
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("request body larger than {MAX_BODY_BYTES} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let bytes = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return Err(too_large()),
        Err(e) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the request body: {e}"),
            ));
        }
    };
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("request body is not the expected JSON: {e}"),
        )
    })
}

async fn create_payout(
    state: &Mutex<State>,
    shutdown: &CancellationToken,
    req: Request<Incoming>,
) -> Resp {
    let key = match req.headers().get("idempotency-key") {
        None => None,
        Some(v) => match v.to_str() {
            Ok(k) => Some(k.to_owned()),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "Idempotency-Key header is not visible ASCII",
                );
            }
        },
    };
    let body: PayoutRequest = match read_json(req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let (resp, delay_ms) = {
        let mut st = lock(state);
        let delay_ms = st.delay_ms;
        (record_payout(&mut st, key, body), delay_ms)
    };
    // The payout (if any) is already in the book: a client that stops waiting now does not
    // undo it. Stopping the server cuts the delay short.
    if delay_ms > 0 {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
            () = shutdown.cancelled() => {}
        }
    }
    resp
}

fn record_payout(st: &mut State, key: Option<String>, body: PayoutRequest) -> Resp {
    if st.idempotency {
        let Some(key) = key.filter(|k| !k.is_empty()) else {
            return error(
                StatusCode::BAD_REQUEST,
                "missing Idempotency-Key header (this provider requires one)",
            );
        };
        if let Some(&i) = st.by_key.get(&key) {
            if !st.payouts[i].same_request(&body) {
                return error(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency key reused with a different request",
                );
            }
            st.replays += 1;
            return respond(StatusCode::OK, &st.payouts[i].to_json(Some(true)));
        }
        if body.amount <= 0 {
            return refuse_amount(body.amount);
        }
        let i = push_payout(st, Some(key.clone()), body);
        st.by_key.insert(key, i);
        respond(StatusCode::CREATED, &st.payouts[i].to_json(Some(false)))
    } else {
        if body.amount <= 0 {
            return refuse_amount(body.amount);
        }
        let i = push_payout(st, key, body);
        respond(StatusCode::CREATED, &st.payouts[i].to_json(Some(false)))
    }
}

fn refuse_amount(amount: i64) -> Resp {
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        &format!("amount must be positive, got {amount}"),
    )
}

fn push_payout(st: &mut State, key: Option<String>, body: PayoutRequest) -> usize {
    let i = st.payouts.len();
    st.payouts.push(Payout {
        payout_id: format!("po_{}", i + 1),
        reference: body.reference,
        amount: body.amount,
        beneficiary: body.beneficiary,
        idempotency_key: key,
        created_at_ms: chrono::Utc::now().timestamp_millis(),
    });
    i
}

fn lookup(state: &Mutex<State>, segment: &str) -> Resp {
    let Some(key) = percent_decode(segment) else {
        return error(
            StatusCode::BAD_REQUEST,
            "key path segment is not valid percent-encoded UTF-8",
        );
    };
    let st = lock(state);
    // Without idempotency `by_key` is empty: such a provider cannot answer by your key.
    match st.by_key.get(&key) {
        Some(&i) => respond(StatusCode::OK, &st.payouts[i].to_json(None)),
        None => error(StatusCode::NOT_FOUND, NO_PAYOUT_FOR_KEY),
    }
}

fn list_payouts(state: &Mutex<State>) -> Resp {
    let st = lock(state);
    let all: Vec<_> = st.payouts.iter().map(|p| p.to_json(None)).collect();
    respond(StatusCode::OK, &serde_json::Value::Array(all))
}

async fn set_delay(state: &Mutex<State>, req: Request<Incoming>) -> Resp {
    let body: DelayRequest = match read_json(req).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    lock(state).delay_ms = body.ms;
    info!(delay_ms = body.ms, "response delay changed");
    respond(StatusCode::OK, &json!({ "delay_ms": body.ms }))
}

fn stats(state: &Mutex<State>) -> Resp {
    let st = lock(state);
    respond(
        StatusCode::OK,
        &json!({
            "payouts": st.payouts.len(),
            "replays": st.replays,
            "idempotency": st.idempotency,
            "delay_ms": st.delay_ms,
        }),
    )
}

/// Decodes `%XX` escapes; `None` for a malformed escape or a result that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decode_handles_escapes_and_rejects_garbage() {
        assert_eq!(
            percent_decode("a%2Fb%20c:d-e").as_deref(),
            Some("a/b c:d-e")
        );
        assert_eq!(percent_decode("%C3%A9").as_deref(), Some("é"));
        assert_eq!(percent_decode("%2"), None);
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%+1"), None);
        assert_eq!(percent_decode("%FF"), None);
    }
}
