//! The API's answers: an error as a status and a JSON `{"error": …}`, a value as JSON, neither
//! kept by a cache.

use std::convert::Infallible;

use axum::Json;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use outbox_core::operator::{OperatorError, OperatorErrorKind};

/// An API error: a status and a JSON `{"error": …}`.
pub(crate) struct ApiError(pub(crate) StatusCode, pub(crate) String);

impl ApiError {
    /// A 400: the request's query, path or body is not one the API takes.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self(StatusCode::BAD_REQUEST, message.into())
    }
}

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

/// The rejection of an extractor that cannot fail (`()`), for [`act_on`](crate::api::act_on).
impl From<Infallible> for ApiError {
    fn from(never: Infallible) -> Self {
        match never {}
    }
}

/// The headers of every answer: no cache keeps it, no browser guesses its type.
pub(crate) fn no_store(h: &mut HeaderMap) {
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
}

/// `v` as a JSON answer (200).
pub(crate) fn json<T: serde::Serialize>(v: T) -> Response {
    let mut r = Json(v).into_response();
    no_store(r.headers_mut());
    r
}
