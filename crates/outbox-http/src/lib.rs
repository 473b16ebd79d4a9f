//! [`HttpPayoutProvider`]: a [`RemoteEffect`] over HTTP, for payout services that speak this
//! small protocol (the stand-in provider of the test tools, `outbox demo-provider`, does), and
//! the worked example of writing a provider adapter.
//!
//! # The protocol
//!
//! * `POST {base}/payouts` with the header `Idempotency-Key: <work item key>` and a JSON body
//!   `{"amount": <integer, minor units>, "beneficiary": "<string>", "reference": "<string>"}`:
//!   200 or 201 with `{"payout_id": "<id>"}` when paid (or already paid for this key), 4xx
//!   when refused.
//! * `GET {base}/payouts/by-key/{key}`: 200 with `{"payout_id": …}` when a payout exists for
//!   the key; 404 with the body [`NO_PAYOUT_FOR_KEY`] when it does not.
//!
//! An adapter has one job: translate the provider's answers into the executor's vocabulary
//! without ever guessing. The rules this one follows, and any adapter should:
//!
//! - **Always send the work item's key** (`Idempotency-Key`), on every call. A provider that
//!   honours it turns a repeated call into a replay instead of a second payout.
//! - **`Succeeded` only on a definitive yes** (here 200/201 with a parsable payout id).
//! - **`Failed` only on a definitive no**: the provider answered and refused (4xx). Terminal.
//! - **`NotSent` only when the request provably never left**: the TCP connection could not be
//!   opened. Anything after the connection exists may have reached the provider.
//! - **`Unknown` for everything else**: 5xx, a reset after sending, an answer that cannot be
//!   parsed. The executor then reconciles through [`RemoteEffect::lookup`] instead of calling
//!   again.
//! - **No timeout and no retries inside.** The executor wraps every call in its own timeout
//!   (and treats the timeout as `Unknown`) and owns retries and reconciliation; an adapter that
//!   retried on its own would hide attempts from the record. Consequently a provider that
//!   accepts the TCP connection and never answers holds the call until the executor's timeout.
//! - **`NotFound` only when the provider says so.** A lookup 404 counts as "no payout for this
//!   key" only when the body says exactly that; a 404 from a wrong base URL is `Unknown`,
//!   because `NotFound` may allow a new call (and so a second payout).
//!
//! Transport: hyper's HTTP/1.1 client with a connection pool (keep-alive), over TLS (rustls)
//! for `https://` base URLs: the provider's certificate is verified against a CA file when given
//! (only those CAs) or else the system's trust store, its name against the URL's host, and a client certificate
//! can be presented ([`ProviderTls`]). An `https://` provider is never called in plain text,
//! and TLS files given with an `http://` URL are refused. A failed TLS handshake happens
//! before any request byte is sent, so it is `NotSent`.

use std::error::Error as _;
use std::fmt;
use std::path::PathBuf;

/// Why an adapter could not be built (bad URL, unreadable TLS files), or why a stand-in admin
/// request failed. The message names the option or the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProviderError(String);

type Result<T, E = ProviderError> = std::result::Result<T, E>;

macro_rules! bail {
    ($($arg:tt)*) => {
        return Err(ProviderError(format!($($arg)*)))
    };
}

/// The body of the 404 that a lookup gets for a key without a payout. Only this exact body
/// means "no payout for this key"; any other 404 (a wrong base URL) is an unknown outcome.
pub const NO_PAYOUT_FOR_KEY: &str = "no payout for this key";

/// How an HTTP URL carries credentials, for redaction
/// ([`outbox_core::secrets::Redactor`]): `http(s)://user:password@host`, where a lone value
/// before `@` is a user name (shown). No query parameter is known to be harmless, so every
/// value is masked (a provider URL has none anyway: [`HttpPayoutProvider::with_tls`] refuses a
/// query).
pub const URL_RULES: outbox_core::secrets::UrlRules = outbox_core::secrets::UrlRules {
    schemes: &["http", "https"],
    lone_userinfo_is_user: true,
    shown_params: &[],
};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use outbox_core::{CallOutcome, LookupOutcome, RemoteEffect, WorkItem};

/// Largest answer body read from the provider; a bigger one counts as unparsable.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

/// How much of a provider's answer body goes into a `Failed` / `Unknown` reason.
const REASON_BODY_CHARS: usize = 300;

/// A payout provider over HTTP(S) that deduplicates by idempotency key: `POST /payouts` to
/// pay, `GET /payouts/by-key/{key}` to reconcile (the protocol of the stand-in provider,
/// `outbox demo-provider`, and the example for a real provider's adapter). See the module docs for the outcome mapping.
///
/// The work item's payload must hold `amount` (integer, minor units) and `beneficiary`
/// (string); `reference` (string) is optional and defaults to the idempotency key.
///
/// Cheap to clone: clones share the connection pool.
#[derive(Clone)]
pub struct HttpPayoutProvider {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `http(s)://host:port` plus an optional path prefix, without a trailing slash.
    base: String,
}

/// TLS settings of an `https://` provider. Every file is PEM.
#[derive(Debug, Clone, Default)]
pub struct ProviderTls {
    /// Certificate authorities trusted for the provider's certificate; when set, only these
    /// (otherwise the system's trust store).
    pub ca_file: Option<PathBuf>,
    /// Client certificate (chain) for mutual TLS; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// Private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

impl ProviderTls {
    fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// The rustls client configuration ([`outbox_core::tls::client_config`]): `ca_file`'s
    /// certificates (or the system's trust store without one), and the client certificate
    /// when given.
    fn client_config(&self) -> Result<rustls::ClientConfig> {
        use outbox_core::tls::{TlsFile, TlsFiles, client_config};
        client_config(TlsFiles {
            ca_file: self.ca_file.as_ref(),
            cert_file: self.cert_file.as_ref(),
            key_file: self.key_file.as_ref(),
        })
        .map_err(|e| {
            let option = match e.file {
                TlsFile::Ca => "invalid option `--provider-ca-file`: ",
                TlsFile::Cert => "invalid option `--provider-cert-file`: ",
                TlsFile::Key => "invalid option `--provider-key-file`: ",
                TlsFile::Setup => "",
            };
            ProviderError(format!("{option}{}", e.reason))
        })
    }
}

impl fmt::Debug for HttpPayoutProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpPayoutProvider")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl HttpPayoutProvider {
    /// An adapter for the provider at `base_url`, e.g. `https://payouts.example:8443` or
    /// `http://127.0.0.1:8080` (a path prefix such as `https://host/provider` is kept; the port
    /// defaults to 443 / 80), trusting the system's certificate authorities. Connects lazily.
    ///
    /// # Errors
    ///
    /// As [`HttpPayoutProvider::with_tls`].
    pub fn new(base_url: &str) -> Result<Self> {
        Self::with_tls(base_url, &ProviderTls::default())
    }

    /// Like [`HttpPayoutProvider::new`] with TLS settings for an `https://` provider.
    ///
    /// # Errors
    ///
    /// Fails when `base_url` is not an `http(s)://host[:port][/prefix]` URL (another scheme, no
    /// host, user info, a query or a fragment; the message shows the URL redacted), when TLS
    /// files are given for an `http://` URL, or when a TLS file cannot be read or parsed.
    pub fn with_tls(base_url: &str, tls: &ProviderTls) -> Result<Self> {
        let expected = "expected https://host[:port] (or http:// on a trusted network)";
        let shown = URL_RULES.redact(base_url);
        if base_url.contains('#') {
            bail!("invalid provider URL `{shown}`: a fragment is not allowed; {expected}");
        }
        let uri: Uri = base_url.parse().map_err(|e| {
            ProviderError(format!("invalid provider URL `{shown}`: {expected}: {e}"))
        })?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            Some(other) => {
                bail!("invalid provider URL `{shown}`: scheme `{other}` is not http(s); {expected}")
            }
            None => bail!("invalid provider URL `{shown}`: no scheme; {expected}"),
        };
        let Some(authority) = uri.authority() else {
            bail!("invalid provider URL `{shown}`: no host; {expected}");
        };
        if authority.host().is_empty() {
            bail!("invalid provider URL `{shown}`: no host; {expected}");
        }
        if authority.as_str().contains('@') {
            bail!("invalid provider URL `{shown}`: user info is not supported; {expected}");
        }
        if uri.query().is_some() {
            bail!("invalid provider URL `{shown}`: a query is not allowed; {expected}");
        }
        if !https && tls.is_set() {
            bail!(
                "invalid provider URL `{shown}`: TLS files are set but the URL is http://; use \
                 https:// (a provider that asks for TLS is never called in plain text)"
            );
        }
        let prefix = uri.path().trim_end_matches('/');
        let scheme = if https { "https" } else { "http" };
        let base = format!("{scheme}://{authority}{prefix}");

        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.enforce_http(false);
        let builder = HttpsConnectorBuilder::new().with_tls_config(tls.client_config()?);
        // An https base URL gets a connector that refuses plain http outright.
        let connector = if https {
            builder.https_only()
        } else {
            builder.https_or_http()
        }
        .enable_http1()
        .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(Self { client, base })
    }

    fn uri(&self, path: &str) -> Result<Uri, String> {
        let s = format!("{}{path}", self.base);
        s.parse()
            .map_err(|e| format!("cannot build the request URL `{s}`: {e}"))
    }

    /// Sends `req`; `Err(true)` when it provably never left (connect failure).
    async fn send(&self, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, (bool, String)> {
        self.client.request(req).await.map_err(|e| {
            let mut reason = e.to_string();
            let mut source = e.source();
            while let Some(s) = source {
                reason.push_str(": ");
                reason.push_str(&s.to_string());
                source = s.source();
            }
            (e.is_connect(), reason)
        })
    }
}

/// Calls that only the stand-in provider (`outbox demo-provider`) answers, for the test harness
/// (feature `stand-in`, which a production build leaves off).
#[cfg(feature = "stand-in")]
impl HttpPayoutProvider {
    /// Every payout the stand-in provider (`outbox demo-provider`) made, as its `GET /payouts`
    /// lists them. Stand-in only: a real provider has no such endpoint.
    ///
    /// # Errors
    /// The request failed or did not answer 2xx with a JSON list.
    pub async fn stand_in_payouts(&self) -> Result<Vec<serde_json::Value>> {
        let v = self.stand_in_json(Method::GET, "/payouts", None).await?;
        match v {
            serde_json::Value::Array(list) => Ok(list),
            other => bail!("GET /payouts did not return a list: {other}"),
        }
    }

    /// Sets the stand-in provider's answer delay (`POST /admin/delay`). Stand-in only.
    ///
    /// # Errors
    /// The request failed or did not answer 2xx.
    pub async fn stand_in_set_delay(&self, ms: u64) -> Result<()> {
        self.stand_in_json(
            Method::POST,
            "/admin/delay",
            Some(serde_json::json!({ "ms": ms })),
        )
        .await
        .map(drop)
    }

    async fn stand_in_json(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value> {
        let req = Request::builder()
            .method(method.clone())
            .uri(self.uri(path).map_err(ProviderError)?)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .map_err(|e| ProviderError(format!("{method} {path}: {e}")))?;
        let resp = self
            .send(req)
            .await
            .map_err(|(_, reason)| ProviderError(format!("{method} {path}: {reason}")))?;
        let status = resp.status();
        let bytes = read_body(resp).await.map_err(ProviderError)?;
        if !status.is_success() {
            bail!(
                "{method} {path}: {status}: {}",
                clip(&String::from_utf8_lossy(&bytes))
            );
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ProviderError(format!("{method} {path}: answer is not JSON: {e}")))
    }
}

/// The JSON body of `POST /payouts` for `item`, or why the payload cannot make one.
fn payout_body(item: &WorkItem) -> Result<serde_json::Value, String> {
    let p = &item.payload;
    let amount = p
        .get("amount")
        .and_then(serde_json::Value::as_i64)
        .ok_or_else(|| {
            format!(
                "work item payload has no integer `amount` (payload: {})",
                clip(&p.to_string())
            )
        })?;
    let beneficiary = p
        .get("beneficiary")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| {
            format!(
                "work item payload has no string `beneficiary` (payload: {})",
                clip(&p.to_string())
            )
        })?;
    let reference = match p.get("reference") {
        None | Some(serde_json::Value::Null) => item.idempotency_key.as_str(),
        Some(serde_json::Value::String(r)) => r.as_str(),
        Some(other) => {
            return Err(format!(
                "work item payload `reference` is not a string: {other}"
            ));
        }
    };
    Ok(serde_json::json!({
        "reference": reference,
        "amount": amount,
        "beneficiary": beneficiary,
    }))
}

/// Percent-encodes one path segment: RFC 3986 `pchar`s stay (so `:` `-` `@` read as they
/// are), everything else, notably `/ ? # %`, space and non-ASCII, becomes `%XX`. A key of only
/// dots is fully encoded so no proxy mistakes it for `.` / `..`.
fn encode_segment(key: &str) -> String {
    let all_dots = !key.is_empty() && key.bytes().all(|b| b == b'.');
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        let keep = !all_dots && (b.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&b));
        if keep {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Cuts a provider answer to a length fit for a reason string.
fn clip(s: &str) -> String {
    match s.char_indices().nth(REASON_BODY_CHARS) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// The `payout_id` of a payout JSON answer.
fn payout_id(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let id = v.get("payout_id")?.as_str()?;
    (!id.is_empty()).then(|| id.to_owned())
}

/// Maps a `POST /payouts` answer to a call outcome.
fn call_outcome(status: StatusCode, body: &[u8]) -> CallOutcome {
    let text = clip(&String::from_utf8_lossy(body));
    if status == StatusCode::OK || status == StatusCode::CREATED {
        return match payout_id(body) {
            Some(reference) => CallOutcome::Succeeded { reference },
            None => CallOutcome::Unknown {
                reason: format!("provider answered {status} without a payout_id: {text}"),
            },
        };
    }
    // 408, 409 and 429 are 4xx but not refusals of the payout: the provider did not decide
    // (or will not say). 409 is what idempotency-key providers answer while a request with the
    // same key is still in progress. Reconciliation has to ask.
    if status.is_client_error()
        && status != StatusCode::REQUEST_TIMEOUT
        && status != StatusCode::CONFLICT
        && status != StatusCode::TOO_MANY_REQUESTS
    {
        return CallOutcome::Failed {
            reason: format!("provider refused the payout with {status}: {text}"),
        };
    }
    CallOutcome::Unknown {
        reason: format!("provider answered {status}: {text}"),
    }
}

/// Maps a `GET /payouts/by-key/{key}` answer to a lookup outcome.
fn lookup_outcome(status: StatusCode, body: &[u8]) -> LookupOutcome {
    let text = clip(&String::from_utf8_lossy(body));
    match status {
        StatusCode::OK => match payout_id(body) {
            Some(reference) => LookupOutcome::Succeeded { reference },
            None => LookupOutcome::Unknown {
                reason: format!("lookup answered 200 without a payout_id: {text}"),
            },
        },
        StatusCode::NOT_FOUND if is_no_payout_answer(body) => LookupOutcome::NotFound,
        _ => LookupOutcome::Unknown {
            reason: format!("lookup answered {status}: {text}"),
        },
    }
}

fn is_no_payout_answer(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error")?.as_str().map(|e| e == NO_PAYOUT_FOR_KEY))
        .unwrap_or(false)
}

/// Reads an answer body of at most [`MAX_ANSWER_BYTES`].
async fn read_body(resp: Response<Incoming>) -> Result<Bytes, String> {
    Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| format!("cannot read the answer body: {e}"))
}

impl RemoteEffect for HttpPayoutProvider {
    /// `POST /payouts` with `Idempotency-Key: item.idempotency_key`. 200/201 -> `Succeeded`
    /// (payout id as reference), 4xx except 408/409/429 -> `Failed`, connect failure -> `NotSent`,
    /// anything else -> `Unknown`. A payload without `amount`/`beneficiary` is `Failed` without
    /// a request: no retry can fix it.
    async fn call(&self, item: &WorkItem) -> CallOutcome {
        let body = match payout_body(item) {
            Ok(b) => b,
            Err(reason) => return CallOutcome::Failed { reason },
        };
        let key = match HeaderValue::from_str(&item.idempotency_key) {
            Ok(k) => k,
            Err(_) => {
                return CallOutcome::Failed {
                    reason: format!(
                        "idempotency key {:?} cannot be sent as an HTTP header (not visible ASCII)",
                        item.idempotency_key
                    ),
                };
            }
        };
        let uri = match self.uri("/payouts") {
            Ok(u) => u,
            Err(reason) => return CallOutcome::Failed { reason },
        };
        let req = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header(CONTENT_TYPE, "application/json")
            .header("idempotency-key", key)
            .body(Full::new(Bytes::from(body.to_string())));
        let req = match req {
            Ok(r) => r,
            Err(e) => {
                return CallOutcome::Failed {
                    reason: format!("cannot build the request: {e}"),
                };
            }
        };
        let resp = match self.send(req).await {
            Ok(r) => r,
            Err((true, reason)) => {
                return CallOutcome::NotSent {
                    reason: format!("cannot connect to the provider at {}: {reason}", self.base),
                };
            }
            Err((false, reason)) => {
                return CallOutcome::Unknown {
                    reason: format!("request to {} failed after connecting: {reason}", self.base),
                };
            }
        };
        let status = resp.status();
        match read_body(resp).await {
            Ok(body) => call_outcome(status, &body),
            // The status line already is the provider's decision when it is a refusal.
            Err(reason) => match call_outcome(status, b"") {
                CallOutcome::Failed { .. } => CallOutcome::Failed {
                    reason: format!("provider refused the payout with {status} ({reason})"),
                },
                _ => CallOutcome::Unknown {
                    reason: format!("provider answered {status} ({reason})"),
                },
            },
        }
    }

    /// `GET /payouts/by-key/{key}`. 200 -> `Succeeded`, the provider's own 404 -> `NotFound`,
    /// anything else (including a failed connection) -> `Unknown`. This provider never
    /// records refusals, so a lookup never yields `Failed`.
    async fn lookup(&self, item: &WorkItem) -> LookupOutcome {
        let path = format!("/payouts/by-key/{}", encode_segment(&item.idempotency_key));
        let uri = match self.uri(&path) {
            Ok(u) => u,
            Err(reason) => return LookupOutcome::Unknown { reason },
        };
        let req = match Request::get(uri).body(Full::new(Bytes::new())) {
            Ok(r) => r,
            Err(e) => {
                return LookupOutcome::Unknown {
                    reason: format!("cannot build the lookup request: {e}"),
                };
            }
        };
        let resp = match self.send(req).await {
            Ok(r) => r,
            Err((_, reason)) => {
                return LookupOutcome::Unknown {
                    reason: format!("lookup at {} failed: {reason}", self.base),
                };
            }
        };
        let status = resp.status();
        match read_body(resp).await {
            Ok(body) => lookup_outcome(status, &body),
            Err(reason) => LookupOutcome::Unknown {
                reason: format!("lookup answered {status} ({reason})"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use serde_json::{Value, json};
    use tokio::task::JoinHandle;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use outbox_stand_in::{ProviderArgs, ProviderServer};

    #[test]
    fn provider_urls_keep_the_user_and_mask_the_rest() {
        assert_eq!(
            URL_RULES.redact("https://ops:pw@pay.example/x#frag"),
            "https://ops:***@pay.example/x#***"
        );
        assert_eq!(
            URL_RULES.redact("http://ops@pay:8080"),
            "http://ops@pay:8080"
        );
        assert_eq!(
            URL_RULES.redact("HTTPS://h/x?token=t"),
            "HTTPS://h/x?token=***"
        );
        let e =
            HttpPayoutProvider::with_tls("https://ops:hunter2@h/x?k=t0k", &ProviderTls::default())
                .unwrap_err()
                .to_string();
        assert!(!e.contains("hunter2") && !e.contains("t0k"), "{e}");
    }

    /// A provider serving in this process on a free port.
    struct Running {
        base: String,
        shutdown: CancellationToken,
        task: JoinHandle<()>,
    }

    impl Running {
        async fn start(no_idempotency: bool) -> Self {
            let args = ProviderArgs {
                listen: "127.0.0.1:0".parse().unwrap(),
                no_idempotency,
                delay_ms: 0,
            };
            let server = ProviderServer::bind(&args).await.unwrap();
            let base = format!("http://{}", server.local_addr());
            let shutdown = CancellationToken::new();
            let task = tokio::spawn(server.serve(shutdown.clone()));
            Self {
                base,
                shutdown,
                task,
            }
        }

        fn adapter(&self) -> HttpPayoutProvider {
            HttpPayoutProvider::new(&self.base).unwrap()
        }

        /// Sends a raw request; answers status and JSON body (`Null` when not JSON).
        async fn raw(
            &self,
            method: Method,
            path: &str,
            key: Option<&str>,
            body: impl Into<Bytes>,
        ) -> (StatusCode, Value) {
            let client: Client<HttpConnector, Full<Bytes>> =
                Client::builder(TokioExecutor::new()).build(HttpConnector::new());
            // Plain HTTP straight to the in-process provider, never through a TLS proxy.
            let mut req = Request::builder()
                .method(method)
                .uri(format!("{}{path}", self.base));
            if let Some(k) = key {
                req = req.header("idempotency-key", k);
            }
            let resp = client
                .request(req.body(Full::new(body.into())).unwrap())
                .await
                .unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            )
        }

        async fn payouts(&self) -> Vec<Value> {
            let (status, v) = self.raw(Method::GET, "/payouts", None, "").await;
            assert_eq!(status, StatusCode::OK);
            v.as_array().unwrap().clone()
        }

        async fn stats(&self) -> Value {
            let (status, v) = self.raw(Method::GET, "/admin/stats", None, "").await;
            assert_eq!(status, StatusCode::OK);
            v
        }

        async fn set_delay(&self, ms: u64) {
            let body = json!({ "ms": ms }).to_string();
            let (status, _) = self.raw(Method::POST, "/admin/delay", None, body).await;
            assert_eq!(status, StatusCode::OK);
        }

        async fn stop(self) {
            self.shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(10), self.task)
                .await
                .expect("the provider stops promptly")
                .unwrap();
        }
    }

    fn item(key: &str, payload: Value) -> WorkItem {
        WorkItem {
            id: 1,
            kind: "payout".to_owned(),
            idempotency_key: key.to_owned(),
            payload,
            event_id: None,
            attempts: 1,
            created_at: chrono::Utc::now(),
        }
    }

    fn payout(reference: &str, amount: i64) -> Value {
        json!({ "reference": reference, "amount": amount, "beneficiary": "acct-42" })
    }

    fn succeeded(outcome: CallOutcome) -> String {
        match outcome {
            CallOutcome::Succeeded { reference } => reference,
            other => panic!("expected Succeeded, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn repeated_call_with_the_same_key_is_one_payout() {
        let p = Running::start(false).await;
        let a = p.adapter();
        let it = item("payments:evt-1", payout("pay-1", 1500));

        let first = succeeded(a.call(&it).await);
        let second = succeeded(a.call(&it).await);
        assert_eq!(first, "po_1");
        assert_eq!(second, first, "the replay returns the same payout");

        let all = p.payouts().await;
        assert_eq!(all.len(), 1, "one payout: {all:?}");
        assert_eq!(all[0]["reference"], "pay-1");
        assert_eq!(all[0]["amount"], 1500);
        assert_eq!(all[0]["idempotency_key"], "payments:evt-1");
        let stats = p.stats().await;
        assert_eq!(stats["payouts"], 1);
        assert_eq!(stats["replays"], 1);
        assert_eq!(stats["idempotency"], true);

        assert_eq!(
            a.lookup(&it).await,
            LookupOutcome::Succeeded {
                reference: first.clone()
            }
        );
        p.stop().await;
    }

    #[tokio::test]
    async fn same_key_with_a_different_body_is_failed() {
        let p = Running::start(false).await;
        let a = p.adapter();
        succeeded(a.call(&item("k-1", payout("pay-1", 100))).await);
        match a.call(&item("k-1", payout("pay-1", 200))).await {
            CallOutcome::Failed { reason } => {
                assert!(reason.contains("422"), "{reason}");
                assert!(reason.contains("different request"), "{reason}");
            }
            other => panic!("expected Failed, got {other:?}"),
        }
        assert_eq!(p.payouts().await.len(), 1);
        p.stop().await;
    }

    #[tokio::test]
    async fn without_idempotency_the_same_key_pays_twice_and_lookup_finds_nothing() {
        let p = Running::start(true).await;
        let a = p.adapter();
        let it = item("payments:evt-2", payout("pay-2", 700));

        let first = succeeded(a.call(&it).await);
        let second = succeeded(a.call(&it).await);
        assert_ne!(first, second, "a second payout");

        let all = p.payouts().await;
        assert_eq!(all.len(), 2, "{all:?}");
        assert!(all.iter().all(|x| x["reference"] == "pay-2"));
        assert!(all.iter().all(|x| x["idempotency_key"] == "payments:evt-2"));
        assert_eq!(a.lookup(&it).await, LookupOutcome::NotFound);
        let stats = p.stats().await;
        assert_eq!(stats["idempotency"], false);
        assert_eq!(stats["replays"], 0);
        p.stop().await;
    }

    #[tokio::test]
    async fn a_call_that_times_out_leaves_a_payout_that_lookup_finds() {
        let p = Running::start(false).await;
        let a = p.adapter();
        let it = item("payments:evt-3", payout("pay-3", 900));
        p.set_delay(3_000).await;

        // The executor's timeout, as it would wrap the call.
        let timed_out = tokio::time::timeout(Duration::from_millis(200), a.call(&it)).await;
        assert!(
            timed_out.is_err(),
            "the call outlives the client's patience"
        );

        // Recorded before the delay; lookups are not delayed.
        let all = p.payouts().await;
        assert_eq!(all.len(), 1, "{all:?}");
        let reference = all[0]["payout_id"].as_str().unwrap().to_owned();
        assert_eq!(
            a.lookup(&it).await,
            LookupOutcome::Succeeded {
                reference: reference.clone()
            }
        );

        p.set_delay(0).await;
        assert_eq!(
            succeeded(a.call(&it).await),
            reference,
            "a replay, not a second payout"
        );
        assert_eq!(p.payouts().await.len(), 1);
        assert_eq!(p.stats().await["delay_ms"], 0);
        p.stop().await;
    }

    #[tokio::test]
    async fn connection_refused_is_not_sent() {
        let unused: SocketAddr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let a = HttpPayoutProvider::new(&format!("http://{unused}")).unwrap();
        let it = item("k-refused", payout("pay-r", 1));
        match a.call(&it).await {
            CallOutcome::NotSent { reason } => assert!(reason.contains("connect"), "{reason}"),
            other => panic!("expected NotSent, got {other:?}"),
        }
        assert!(matches!(a.lookup(&it).await, LookupOutcome::Unknown { .. }));
    }

    #[tokio::test]
    async fn a_stopped_provider_refuses_connections() {
        let p = Running::start(false).await;
        let a = p.adapter();
        succeeded(a.call(&item("k-a", payout("pay-a", 5))).await);
        p.stop().await;
        let outcome = a.call(&item("k-b", payout("pay-b", 5))).await;
        assert!(
            matches!(outcome, CallOutcome::NotSent { .. }),
            "got {outcome:?}"
        );
    }

    #[tokio::test]
    async fn zero_amount_is_failed_and_records_nothing() {
        let p = Running::start(false).await;
        let a = p.adapter();
        let it = item("k-zero", payout("pay-0", 0));
        match a.call(&it).await {
            CallOutcome::Failed { reason } => {
                assert!(reason.contains("422"), "{reason}");
                assert!(reason.contains("amount must be positive"), "{reason}");
            }
            other => panic!("expected Failed, got {other:?}"),
        }
        assert!(p.payouts().await.is_empty());
        assert_eq!(a.lookup(&it).await, LookupOutcome::NotFound);
        p.stop().await;
    }

    #[tokio::test]
    async fn listing_shows_every_payout_and_keys_with_reserved_characters_work() {
        let p = Running::start(false).await;
        let a = p.adapter();
        let odd = item(
            "pay/ments? #1 100%",
            json!({ "amount": 3, "beneficiary": "b" }),
        );
        let plain = item("payments:evt-9", payout("pay-9", 4));
        let odd_id = succeeded(a.call(&odd).await);
        let plain_id = succeeded(a.call(&plain).await);
        assert_eq!(
            a.lookup(&odd).await,
            LookupOutcome::Succeeded { reference: odd_id }
        );
        assert_eq!(
            a.lookup(&plain).await,
            LookupOutcome::Succeeded {
                reference: plain_id
            }
        );

        let all = p.payouts().await;
        assert_eq!(all.len(), 2);
        // `reference` defaults to the idempotency key.
        assert_eq!(all[0]["reference"], "pay/ments? #1 100%");
        assert_eq!(all[1]["reference"], "pay-9");
        for x in &all {
            for field in [
                "payout_id",
                "reference",
                "amount",
                "beneficiary",
                "idempotency_key",
            ] {
                assert!(!x[field].is_null(), "{field} missing in {x}");
            }
            assert!(x["created_at_ms"].as_i64().unwrap() > 0);
        }
        p.stop().await;
    }

    #[tokio::test]
    async fn raw_api_status_codes() {
        let p = Running::start(false).await;
        let body = payout("pay-x", 10).to_string();

        let (s, v) = p
            .raw(Method::POST, "/payouts", Some("k-x"), body.clone())
            .await;
        assert_eq!(s, StatusCode::CREATED);
        assert_eq!(v["replayed"], false);
        let (s, v) = p
            .raw(Method::POST, "/payouts", Some("k-x"), body.clone())
            .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["replayed"], true);
        assert_eq!(v["payout_id"], "po_1");

        let (s, v) = p.raw(Method::POST, "/payouts", None, body.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(v["error"].as_str().unwrap().contains("Idempotency-Key"));

        let (s, v) = p
            .raw(Method::POST, "/payouts", Some("k-y"), "{not json")
            .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(v["error"].as_str().unwrap().contains("JSON"), "{v}");

        let big = vec![b' '; outbox_stand_in::MAX_BODY_BYTES + 1];
        let (s, _) = p.raw(Method::POST, "/payouts", Some("k-z"), big).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);

        let (s, _) = p.raw(Method::GET, "/nowhere", None, "").await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        let (s, v) = p.raw(Method::GET, "/payouts/by-key/k-x", None, "").await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["payout_id"], "po_1");
        assert!(v.get("replayed").is_none());
        let (s, v) = p.raw(Method::GET, "/payouts/by-key/k-q", None, "").await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        assert_eq!(v["error"], NO_PAYOUT_FOR_KEY);
        let (s, _) = p.raw(Method::DELETE, "/payouts", None, "").await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        let (s, _) = p.raw(Method::POST, "/admin/delay", None, "{}").await;
        assert_eq!(s, StatusCode::BAD_REQUEST);

        assert_eq!(p.payouts().await.len(), 1);
        p.stop().await;
    }

    #[tokio::test]
    async fn a_wrong_base_path_is_not_read_as_not_found() {
        let p = Running::start(false).await;
        let a = HttpPayoutProvider::new(&format!("{}/wrong-prefix", p.base)).unwrap();
        let it = item("k-w", payout("pay-w", 1));
        assert!(matches!(a.lookup(&it).await, LookupOutcome::Unknown { .. }));
        // POST to a missing route is a 404: the provider answered and did nothing.
        assert!(matches!(a.call(&it).await, CallOutcome::Failed { .. }));
        assert!(p.payouts().await.is_empty());
        p.stop().await;
    }

    #[tokio::test]
    async fn a_payload_without_amount_is_failed_without_a_request() {
        let p = Running::start(false).await;
        let a = p.adapter();
        let outcome = a.call(&item("k-p", json!({ "beneficiary": "b" }))).await;
        match outcome {
            CallOutcome::Failed { reason } => assert!(reason.contains("amount"), "{reason}"),
            other => panic!("expected Failed, got {other:?}"),
        }
        let outcome = a
            .call(&item(
                "k-p",
                json!({ "amount": 1, "beneficiary": "b", "reference": 7 }),
            ))
            .await;
        assert!(matches!(outcome, CallOutcome::Failed { .. }), "{outcome:?}");
        assert!(p.payouts().await.is_empty());
        assert_eq!(p.stats().await["payouts"], 0);
        p.stop().await;
    }

    #[test]
    fn answers_map_to_outcomes() {
        let ok = br#"{"payout_id":"po_7","replayed":true}"#;
        assert_eq!(
            call_outcome(StatusCode::OK, ok),
            CallOutcome::Succeeded {
                reference: "po_7".to_owned()
            }
        );
        assert!(matches!(
            call_outcome(StatusCode::CREATED, b"<html>"),
            CallOutcome::Unknown { .. }
        ));
        for s in [400, 404, 422] {
            let status = StatusCode::from_u16(s).unwrap();
            assert!(matches!(
                call_outcome(status, b"{}"),
                CallOutcome::Failed { .. }
            ));
        }
        for s in [202, 204, 301, 408, 409, 429, 500, 502, 503] {
            let status = StatusCode::from_u16(s).unwrap();
            assert!(
                matches!(call_outcome(status, b"{}"), CallOutcome::Unknown { .. }),
                "{s}"
            );
        }
        let not_found = format!(r#"{{"error":"{NO_PAYOUT_FOR_KEY}"}}"#);
        assert_eq!(
            lookup_outcome(StatusCode::NOT_FOUND, not_found.as_bytes()),
            LookupOutcome::NotFound
        );
        assert!(matches!(
            lookup_outcome(StatusCode::NOT_FOUND, b"not found"),
            LookupOutcome::Unknown { .. }
        ));
        assert!(matches!(
            lookup_outcome(StatusCode::INTERNAL_SERVER_ERROR, b""),
            LookupOutcome::Unknown { .. }
        ));
        assert_eq!(
            lookup_outcome(StatusCode::OK, ok),
            LookupOutcome::Succeeded {
                reference: "po_7".to_owned()
            }
        );
    }

    #[test]
    fn key_segments_are_encoded_minimally() {
        assert_eq!(encode_segment("payments:evt-1"), "payments:evt-1");
        assert_eq!(encode_segment("a/b?c#d%e f"), "a%2Fb%3Fc%23d%25e%20f");
        assert_eq!(encode_segment("é"), "%C3%A9");
        assert_eq!(encode_segment(".."), "%2E%2E");
        assert_eq!(encode_segment("a.b"), "a.b");
    }

    #[test]
    fn base_urls_are_validated() {
        for good in [
            "http://127.0.0.1:8080",
            "http://127.0.0.1:8080/",
            "http://localhost:1/prefix/",
            "https://127.0.0.1:8443",
            "https://payouts.example/v1/",
        ] {
            let a = HttpPayoutProvider::new(good).unwrap_or_else(|e| panic!("{good}: {e:#}"));
            assert!(!a.base.ends_with('/'), "{}", a.base);
        }
        assert_eq!(
            HttpPayoutProvider::new("http://localhost:1/prefix/")
                .unwrap()
                .base,
            "http://localhost:1/prefix"
        );
        for (bad, why) in [
            ("ftp://127.0.0.1:21", "scheme"),
            ("127.0.0.1:8080", "https://host"),
            ("/payouts", "https://host"),
            ("http://u:hunter2@127.0.0.1:1", "user info"),
            ("https://127.0.0.1:1/?token=hunter2", "query"),
            ("http://127.0.0.1:1/#hunter2", "fragment"),
            ("not a url", "https://host"),
        ] {
            let e = HttpPayoutProvider::new(bad).expect_err(bad);
            let msg = format!("{e:#}");
            assert!(msg.contains(why), "{bad}: {msg}");
            assert!(
                !msg.contains("hunter2"),
                "{bad}: the secret is shown: {msg}"
            );
        }
    }

    #[test]
    fn tls_settings_are_checked_before_any_call() {
        let pki = outbox_testkit::tls::TestPki::new("provider-settings");
        let with_ca = ProviderTls {
            ca_file: Some(pki.ca_file()),
            ..ProviderTls::default()
        };
        let e = HttpPayoutProvider::with_tls("http://127.0.0.1:1", &with_ca).unwrap_err();
        assert!(format!("{e:#}").contains("https://"), "{e:#}");
        assert!(HttpPayoutProvider::with_tls("https://127.0.0.1:1", &with_ca).is_ok());
        let missing = ProviderTls {
            ca_file: Some("/nonexistent/outbox/ca.pem".into()),
            ..ProviderTls::default()
        };
        let e = HttpPayoutProvider::with_tls("https://127.0.0.1:1", &missing).unwrap_err();
        assert!(format!("{e:#}").contains("--provider-ca-file"), "{e:#}");
        let half = ProviderTls {
            cert_file: Some(pki.client("c").cert),
            ..ProviderTls::default()
        };
        let e = HttpPayoutProvider::with_tls("https://127.0.0.1:1", &half).unwrap_err();
        assert!(format!("{e:#}").contains("--provider-key-file"), "{e:#}");
    }

    /// The stand-in provider behind a TLS terminator with a certificate from a test CA (and,
    /// with `mutual`, requiring a client certificate from that CA).
    async fn behind_tls(
        pki: &outbox_testkit::tls::TestPki,
        mutual: bool,
    ) -> (Running, outbox_testkit::tls::TlsProxy) {
        let p = Running::start(false).await;
        let upstream: SocketAddr = p.base.trim_start_matches("http://").parse().unwrap();
        let server = pki.server("provider", &["localhost", "127.0.0.1"]);
        let ca = pki.ca_file();
        let config =
            outbox_testkit::tls::TestPki::server_config(&server, mutual.then_some(ca.as_path()));
        let proxy = outbox_testkit::tls::TlsProxy::start(upstream, config).await;
        (p, proxy)
    }

    #[tokio::test]
    async fn https_provider_is_called_over_verified_tls() {
        let pki = outbox_testkit::tls::TestPki::new("provider-https");
        let (p, proxy) = behind_tls(&pki, false).await;
        let tls = ProviderTls {
            ca_file: Some(pki.ca_file()),
            ..ProviderTls::default()
        };
        let a = HttpPayoutProvider::with_tls(&format!("https://localhost:{}", proxy.port()), &tls)
            .unwrap();
        let it = item("k-tls", payout("pay-tls", 42));
        let reference = succeeded(a.call(&it).await);
        assert_eq!(a.lookup(&it).await, LookupOutcome::Succeeded { reference });
        assert!(proxy.handshakes_ok() >= 1);
        assert_eq!(p.payouts().await.len(), 1);

        // The system's trust store alone does not know the test CA: refused before sending.
        let untrusted =
            HttpPayoutProvider::new(&format!("https://localhost:{}", proxy.port())).unwrap();
        match untrusted
            .call(&item("k-untrusted", payout("pay-u", 1)))
            .await
        {
            CallOutcome::NotSent { reason } => {
                assert!(reason.to_lowercase().contains("certificate"), "{reason}")
            }
            other => panic!("expected NotSent for an unknown CA, got {other:?}"),
        }
        // A name the certificate does not carry is refused too.
        let other_name = pki.server("other", &["payouts.example"]);
        let config = outbox_testkit::tls::TestPki::server_config(&other_name, None);
        let upstream: SocketAddr = p.base.trim_start_matches("http://").parse().unwrap();
        let wrong = outbox_testkit::tls::TlsProxy::start(upstream, config).await;
        let a = HttpPayoutProvider::with_tls(&format!("https://localhost:{}", wrong.port()), &tls)
            .unwrap();
        assert!(matches!(
            a.call(&item("k-name", payout("pay-n", 1))).await,
            CallOutcome::NotSent { .. }
        ));
        // Plain HTTP to a provider that speaks TLS never succeeds.
        let plain = HttpPayoutProvider::new(&format!("http://localhost:{}", proxy.port())).unwrap();
        assert!(!matches!(
            plain.call(&item("k-plain", payout("pay-p", 1))).await,
            CallOutcome::Succeeded { .. }
        ));
        assert_eq!(
            p.payouts().await.len(),
            1,
            "no refused call reached the provider"
        );
        p.stop().await;
    }

    #[tokio::test]
    async fn a_client_certificate_is_presented_when_the_provider_requires_one() {
        let pki = outbox_testkit::tls::TestPki::new("provider-mtls");
        let (p, proxy) = behind_tls(&pki, true).await;
        let base = format!("https://localhost:{}", proxy.port());
        let ca_only = ProviderTls {
            ca_file: Some(pki.ca_file()),
            ..ProviderTls::default()
        };
        let a = HttpPayoutProvider::with_tls(&base, &ca_only).unwrap();
        assert!(!matches!(
            a.call(&item("k-nocert", payout("pay-x", 1))).await,
            CallOutcome::Succeeded { .. }
        ));
        let client = pki.client("executor");
        let mtls = ProviderTls {
            ca_file: Some(pki.ca_file()),
            cert_file: Some(client.cert),
            key_file: Some(client.key),
        };
        let a = HttpPayoutProvider::with_tls(&base, &mtls).unwrap();
        succeeded(a.call(&item("k-cert", payout("pay-c", 2))).await);
        assert_eq!(p.payouts().await.len(), 1);
        p.stop().await;
    }
}
