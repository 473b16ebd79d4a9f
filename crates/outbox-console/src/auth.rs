//! Who may read and who may act: the checks every request passes first ([`guard`]), the token
//! ([`check_token`], [`Token`]), the rules of an action (origin, read-only mode, token:
//! [`authorize`]) and the audit record's [`actor`].

use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use outbox_core::operator::{Actor, OperatorStore};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::AppState;
use crate::error::ApiError;

/// The checks every request passes first: the `Host` (when
/// [`ConsoleConfig::loopback_hosts_only`](crate::ConsoleConfig::loopback_hosts_only)) and, for
/// the API when [`ConsoleConfig::reads_need_token`](crate::ConsoleConfig::reads_need_token), the
/// token.
pub(crate) async fn guard<O: OperatorStore>(
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

/// The SHA-256 of `s`: the token is kept, and compared, as its digest.
pub(crate) fn sha(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// The token's check as an extractor, for the reads that show payloads and headers (only to
/// the token's holder, and only under a role that may read them, the operator's). Put first,
/// it runs before the extractors after it.
pub(crate) struct Token;

impl<O: OperatorStore> FromRequestParts<Arc<AppState<O>>> for Token {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &Arc<AppState<O>>) -> Result<Self, ApiError> {
        check_token(s, &parts.headers).map(|_| Self)
    }
}

/// Who may act: checks the origin, the mode and the token, in that order. Returns the token's
/// fingerprint for the audit record.
pub(crate) fn authorize<O>(s: &AppState<O>, headers: &HeaderMap) -> Result<String, ApiError> {
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
pub(crate) fn check_token<O>(s: &AppState<O>, headers: &HeaderMap) -> Result<String, ApiError> {
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

/// The audit record's actor of a console action: the name the page sent (what the operator
/// typed; otherwise "console operator") with the token's fingerprint as its credential.
pub(crate) fn actor(name: Option<&str>, credential: &str) -> Result<Actor, ApiError> {
    let name = name
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .unwrap_or("console operator");
    Ok(Actor::new(name, "console")?.with_credential(format!("token {credential}")))
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
