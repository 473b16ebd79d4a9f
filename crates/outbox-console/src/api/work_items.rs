//! The remote effects (work items): a page of them, and the two actions on one, resolving it
//! by hand and asking for its reconciliation now.

use outbox_core::operator::{OperatorStore, Resolution};
use serde::Deserialize;

use super::{DEFAULT_LIMIT, P, Q, Route, Shared, act_on, nonempty, read};
use crate::error::ApiError;

/// The query of `GET /api/v1/work-items`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkItemQuery {
    state: Option<String>,
    limit: Option<i64>,
}

/// `GET /api/v1/work-items`.
pub(crate) fn list<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, Q(q): Q<WorkItemQuery>| {
        let state = nonempty(q.state);
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT);
        Ok(s.admin.work_items(state.as_deref(), limit).await?)
    })
}

/// The body of `POST /api/v1/work-items/{id}/resolve`: exactly one of the three.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    #[serde(default)]
    succeeded: Option<String>,
    #[serde(default)]
    failed: Option<String>,
    #[serde(default)]
    resend: bool,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

/// The body of `POST /api/v1/work-items/{id}/reconcile`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileBody {
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

action_bodies!(ResolveBody, ReconcileBody);

impl ResolveBody {
    fn resolution(self) -> Result<Resolution, ApiError> {
        match (self.succeeded, self.failed, self.resend) {
            (Some(reference), None, false) if !reference.is_empty() => {
                Ok(Resolution::Succeeded { reference })
            }
            (None, Some(reason), false) if !reason.is_empty() => Ok(Resolution::Failed { reason }),
            (None, None, true) => Ok(Resolution::Resend),
            _ => Err(ApiError::bad_request(
                "give exactly one of \"succeeded\": \"<provider reference>\", \"failed\": \"<why>\", \"resend\": true",
            )),
        }
    }
}

/// `POST /api/v1/work-items/{id}/resolve`: answers the row as it is now.
pub(crate) fn resolve<O: OperatorStore>() -> Route<O> {
    act_on(
        async |s: Shared<O>, P(id): P<i64>, body: ResolveBody, actor, reason| {
            let resolution = body.resolution()?;
            Ok(s.admin
                .resolve_work_item(id, resolution, &actor, &reason)
                .await?)
        },
    )
}

/// `POST /api/v1/work-items/{id}/reconcile`: answers `{"reconcile": id}`.
pub(crate) fn reconcile<O: OperatorStore>() -> Route<O> {
    act_on(
        async |s: Shared<O>, P(id): P<i64>, _: ReconcileBody, actor, reason| {
            s.admin.reconcile_work_item(id, &actor, &reason).await?;
            Ok(serde_json::json!({ "reconcile": id }))
        },
    )
}
