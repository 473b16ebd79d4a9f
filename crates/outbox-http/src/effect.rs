//! The adapter's [`RemoteEffect`]: the payout call (`POST /payouts` with the work item's key)
//! and the lookup by key that reconciles an unknown outcome.

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request};
use outbox_core::{CallOutcome, LookupOutcome, RemoteEffect, WorkItem};

use crate::client::{HttpPayoutProvider, read_body};
use crate::outcome::{call_outcome, clip, lookup_outcome};

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
pub(crate) fn encode_segment(key: &str) -> String {
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
