//! The JSON API under `/api/v1`. Every read and every action takes the same steps, held here
//! once: [`read`] decodes what the route takes (its rejection a 400 `{"error": …}` with axum's
//! text), asks the store and answers JSON; [`act`] and [`act_on`] check who may act
//! ([`authorize`]), decode the body, build the audit record's actor, then do the same. Each
//! topic's module names, route by route, what it takes and what it asks of the store.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::routing::{MethodRouter, get, post};
use outbox_core::operator::{Actor, OperatorStore};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::AppState;
use crate::auth::{actor, authorize};
use crate::error::{ApiError, json};

/// Implements [`ActionBody`] for bodies with the fields `actor` and `reason`
/// (`Option<String>` both).
macro_rules! action_bodies {
    ($($t:ty),*) => {$(
        impl $crate::api::ActionBody for $t {
            fn actor(&self) -> Option<&str> {
                self.actor.as_deref()
            }

            fn take_reason(&mut self) -> String {
                self.reason.take().unwrap_or_default()
            }
        }
    )*};
}

pub(crate) mod conflicts;
pub(crate) mod consumers;
pub(crate) mod dead_letters;
pub(crate) mod pauses;
pub(crate) mod replay;
pub(crate) mod status;
pub(crate) mod work_items;

/// The state every route shares.
pub(crate) type Shared<O> = Arc<AppState<O>>;
/// One route's handler, as [`read`] and [`act`] build it.
pub(crate) type Route<O> = MethodRouter<Shared<O>>;

/// A page's size when the query gives none.
const DEFAULT_LIMIT: i64 = 100;

/// Extractors that answer what does not decode with a 400 `{"error": …}` carrying axum's own
/// text.
macro_rules! decoded {
    ($($(#[$doc:meta])* $name:ident: $inner:ident;)*) => {$(
        $(#[$doc])*
        pub(crate) struct $name<T>(pub(crate) T);

        impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for $name<T> {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
                match $inner::<T>::from_request_parts(parts, state).await {
                    Ok($inner(v)) => Ok(Self(v)),
                    Err(e) => Err(ApiError::bad_request(e.body_text())),
                }
            }
        }
    )*};
}

decoded! {
    /// The query string, as `T`.
    Q: Query;
    /// The path's parameters, as `T`.
    P: Path;
}

/// A form's empty field means "any".
fn nonempty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// The body of an action: who the page says acts and why, for the audit record.
pub(crate) trait ActionBody: DeserializeOwned + Send + 'static {
    /// The name the page sent.
    fn actor(&self) -> Option<&str>;
    /// The reason given, taken out of the body; empty when none (the store refuses the
    /// actions that require one).
    fn take_reason(&mut self) -> String;
}

/// A `GET` route: `X` decoded from the request (a query [`Q`], a path [`P`], the [`Token`]
/// check then a path, or nothing: `()`), then `f` with the state; its answer as JSON.
///
/// [`Token`]: crate::auth::Token
pub(crate) fn read<O, X, T, F, Fut>(f: F) -> Route<O>
where
    O: OperatorStore,
    X: FromRequestParts<Shared<O>> + Send + 'static,
    F: Fn(Shared<O>, X) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<T, ApiError>> + Send,
    T: Serialize,
{
    get(move |State(s): State<Shared<O>>, x: X| async move { f(s, x).await.map(json) })
}

/// A `POST` route: [`act_on`] without a path.
pub(crate) fn act<O, B, T, F, Fut>(f: F) -> Route<O>
where
    O: OperatorStore,
    B: ActionBody,
    F: Fn(Shared<O>, B, Actor, String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<T, ApiError>> + Send,
    T: Serialize,
{
    act_on(move |s, (), body, actor, reason| f(s, body, actor, reason))
}

/// A `POST` route: who may act (origin, mode and token, before the body is read:
/// [`authorize`]), the body `B`, the audit record's actor, then `X` (the path: [`P`]), then `f`
/// with the state, `X`, the body, the actor and the reason; its answer as JSON.
pub(crate) fn act_on<O, X, B, T, F, Fut>(f: F) -> Route<O>
where
    O: OperatorStore,
    X: FromRequestParts<Shared<O>> + Send + 'static,
    X::Rejection: Into<ApiError> + Send,
    B: ActionBody,
    F: Fn(Shared<O>, X, B, Actor, String) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<T, ApiError>> + Send,
    T: Serialize,
{
    post(
        move |State(s): State<Shared<O>>,
              headers: HeaderMap,
              x: Result<X, X::Rejection>,
              body: Result<Json<B>, JsonRejection>| async move {
            let credential = authorize(&s, &headers)?;
            let Json(mut body) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
            let actor = actor(body.actor(), &credential)?;
            let x = x.map_err(Into::into)?;
            let reason = body.take_reason();
            f(s, x, body, actor, reason).await.map(json)
        },
    )
}
