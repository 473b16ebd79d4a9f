//! A minimal JSON-over-HTTP/1.1 client (hyper) for the load drivers and the verification.

use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// One answer: status, whether it was a replay of an earlier one, and the JSON body.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: StatusCode,
    /// `Idempotent-Replayed: true` was set.
    pub replayed: bool,
    /// The body as JSON (`null` when empty or not JSON).
    pub body: Value,
}

/// A pooled HTTP client with a per-request timeout.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpConnector, Full<Bytes>>,
    timeout: Duration,
}

impl HttpClient {
    /// A client whose requests give up after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(10))
            .build(connector);
        Self { client, timeout }
    }

    /// Sends `method url` with `headers` and an optional JSON body.
    ///
    /// # Errors
    /// The connection failed, the request timed out, or the body could not be read: the
    /// outcome is unknown and the caller may retry (with the same idempotency key).
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<Answer> {
        let mut req = Request::builder().method(method).uri(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let bytes = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Bytes::from(b.to_string())
            }
            None => Bytes::new(),
        };
        let req = req
            .body(Full::new(bytes))
            .context("cannot build the request")?;
        let exchange = async {
            let resp = self.client.request(req).await?;
            let status = resp.status();
            let replayed = resp
                .headers()
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true");
            let body = resp.into_body().collect().await?.to_bytes();
            let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
            anyhow::Ok(Answer {
                status,
                replayed,
                body,
            })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .with_context(|| format!("no answer within {:?}", self.timeout))?
    }

    /// `GET url`, expecting 200 with JSON.
    ///
    /// # Errors
    /// As [`HttpClient::send`], or another status.
    pub async fn get_json(&self, url: &str) -> Result<Value> {
        let a = self.send(Method::GET, url, &[], None).await?;
        if a.status != StatusCode::OK {
            anyhow::bail!("GET {url}: {} {}", a.status, a.body);
        }
        Ok(a.body)
    }
}
