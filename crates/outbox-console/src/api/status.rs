//! What runs and how it goes: readiness, the overview, the routes, the activity per minute,
//! the instances, the audit log and the traces of an event or an aggregate.

use axum::extract::State;
use axum::http::HeaderMap;
use outbox_core::operator::{ActivityKind, Counting, OperatorStore};
use serde::Deserialize;
use uuid::Uuid;

use super::{DEFAULT_LIMIT, P, Q, Route, Shared, read};
use crate::auth::check_token;
use crate::error::ApiError;
use crate::{OVERVIEW_COUNT_BOUND, ROUTES_COUNT_BOUND};

/// `GET /readyz`: `ready`, or the store's error (503 when the database does not answer or
/// its schema is not this release's).
pub(crate) async fn ready<O: OperatorStore>(
    State(s): State<Shared<O>>,
) -> Result<&'static str, ApiError> {
    s.admin.ready().await?;
    Ok("ready")
}

/// The query of `GET /api/v1/overview`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OverviewQuery {
    #[serde(default)]
    exact: bool,
}

/// `GET /api/v1/overview[?exact=true]`.
pub(crate) fn overview<O: OperatorStore>() -> Route<O> {
    read(
        async |s: Shared<O>, (Q(q), headers): (Q<OverviewQuery>, HeaderMap)| {
            let counting = if q.exact {
                // A full count costs seconds on a large backlog: not for anyone who can reach the
                // port.
                check_token(&s, &headers)?;
                Counting::Exact
            } else {
                Counting::UpTo(OVERVIEW_COUNT_BOUND)
            };
            Ok(s.admin.overview_counting(counting).await?)
        },
    )
}

/// `GET /api/v1/routes`.
pub(crate) fn routes<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, ()| Ok(s.admin.routes(ROUTES_COUNT_BOUND).await?))
}

/// The window of `GET /api/v1/activity` when none is given, minutes.
const DEFAULT_ACTIVITY_MINUTES: usize = 60;

/// The query of `GET /api/v1/activity`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ActivityQuery {
    kind: ActivityKind,
    minutes: Option<usize>,
}

/// `GET /api/v1/activity?kind=publish|consume|oldest_pending_age|dead_letters|lag[&minutes=N]`.
pub(crate) fn activity<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, Q(q): Q<ActivityQuery>| {
        let minutes = q.minutes.unwrap_or(DEFAULT_ACTIVITY_MINUTES);
        Ok(s.admin.activity(q.kind, minutes).await?)
    })
}

/// `GET /api/v1/instances`.
pub(crate) fn instances<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, ()| Ok(s.admin.instances().await?))
}

/// The query of `GET /api/v1/audit`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    limit: Option<i64>,
    before: Option<i64>,
}

/// `GET /api/v1/audit`.
pub(crate) fn audit<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, Q(q): Q<AuditQuery>| {
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
        Ok(s.admin.audit(q.before, limit).await?)
    })
}

/// `GET /api/v1/trace/event/{event_id}`.
pub(crate) fn trace_event<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, P(id): P<Uuid>| Ok(s.admin.trace_event(id).await?))
}

/// The query of `GET /api/v1/trace/aggregate`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AggregateQuery {
    aggregate_type: String,
    aggregate_id: String,
    limit: Option<i64>,
}

/// `GET /api/v1/trace/aggregate`.
pub(crate) fn trace_aggregate<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, Q(q): Q<AggregateQuery>| {
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
        Ok(s.admin
            .trace_aggregate(&q.aggregate_type, &q.aggregate_id, limit)
            .await?)
    })
}
