//! The inbox's conflicts: a page of them, one whole (with the token), and resolving them.

use outbox_core::operator::{ConflictFilter, OperatorStore};
use serde::Deserialize;
use uuid::Uuid;

use super::{DEFAULT_LIMIT, P, Q, Route, Shared, act, read};
use crate::auth::Token;

/// The query of `GET /api/v1/conflicts`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConflictQuery {
    limit: Option<i64>,
    event_id: Option<Uuid>,
    open: Option<bool>,
}

/// `GET /api/v1/conflicts`.
pub(crate) fn list<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, Q(q): Q<ConflictQuery>| {
        let filter = ConflictFilter {
            event_id: q.event_id,
            open_only: q.open.unwrap_or(false),
        };
        Ok(s.admin
            .conflicts(filter, q.limit.unwrap_or(DEFAULT_LIMIT))
            .await?)
    })
}

/// `GET /api/v1/conflicts/{id}`, with the token.
pub(crate) fn one<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, (Token, P(id)): (Token, P<i64>)| Ok(s.admin.conflict(id).await?))
}

/// The body of `POST /api/v1/conflicts/resolve`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveConflictsBody {
    ids: Vec<i64>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

action_bodies!(ResolveConflictsBody);

/// `POST /api/v1/conflicts/resolve`.
pub(crate) fn resolve<O: OperatorStore>() -> Route<O> {
    act(
        async |s: Shared<O>, body: ResolveConflictsBody, actor, reason| {
            Ok(s.admin
                .resolve_conflicts(&body.ids, &actor, &reason)
                .await?)
        },
    )
}
