//! The page and its script and style, served with a strict content security policy.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::error::no_store;

const PAGE: &str = include_str!("../assets/index.html");
const SCRIPT: &str = include_str!("../assets/console.js");
const STYLE: &str = include_str!("../assets/console.css");

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
pub(crate) async fn page(axum::extract::OriginalUri(uri): axum::extract::OriginalUri) -> Response {
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

/// `/console.js`.
pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

/// `/console.css`.
pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
