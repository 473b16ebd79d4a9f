//! The adapter and its transport: the base URL's checks, the TLS settings, the pooled HTTP(S)
//! client, and sending a request.

use std::error::Error as _;
use std::fmt;
use std::path::PathBuf;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::{ProviderError, Result, URL_RULES};

/// Largest answer body read from the provider; a bigger one counts as unparsable.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

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
    pub(crate) base: String,
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

    pub(crate) fn uri(&self, path: &str) -> Result<Uri, String> {
        let s = format!("{}{path}", self.base);
        s.parse()
            .map_err(|e| format!("cannot build the request URL `{s}`: {e}"))
    }

    /// Sends `req`; `Err(true)` when it provably never left (connect failure).
    pub(crate) async fn send(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, (bool, String)> {
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

/// Reads an answer body of at most [`MAX_ANSWER_BYTES`].
pub(crate) async fn read_body(resp: Response<Incoming>) -> Result<Bytes, String> {
    Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| format!("cannot read the answer body: {e}"))
}
