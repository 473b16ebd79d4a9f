//! Calls that only the stand-in provider (`outbox demo-provider`) answers, for the test harness
//! (feature `stand-in`, which a production build leaves off).

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request};

use crate::client::{HttpPayoutProvider, read_body};
use crate::outcome::clip;
use crate::{ProviderError, Result};

/// Calls that only the stand-in provider (`outbox demo-provider`) answers, for the test harness
/// (feature `stand-in`, which a production build leaves off).
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
