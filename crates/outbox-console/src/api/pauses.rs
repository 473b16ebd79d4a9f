//! The pauses of routes and consumers: those in force, pausing and resuming.

use outbox_core::operator::{OperatorStore, PauseTarget};
use serde::Deserialize;

use super::{Route, Shared, act, read};
use crate::error::ApiError;

/// `GET /api/v1/pauses`.
pub(crate) fn list<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, ()| Ok(s.admin.pauses().await?))
}

/// The body of `POST /api/v1/pauses/pause` and `/resume`: one of `route` or `consumer`, a
/// `reason`, an `actor`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    #[serde(default)]
    route: Option<String>,
    #[serde(default)]
    consumer: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

action_bodies!(PauseBody);

impl PauseBody {
    fn target(self) -> Result<PauseTarget, ApiError> {
        match (self.route, self.consumer) {
            (Some(r), None) => Ok(PauseTarget::Route(r)),
            (None, Some(c)) => Ok(PauseTarget::Consumer(c)),
            _ => Err(ApiError::bad_request(
                "name exactly one of \"route\" (a route key such as \"destination:payments\") \
                 or \"consumer\"",
            )),
        }
    }
}

/// `POST /api/v1/pauses/pause`: answers the pause.
pub(crate) fn pause<O: OperatorStore>() -> Route<O> {
    act(async |s: Shared<O>, body: PauseBody, actor, reason| {
        let target = body.target()?;
        Ok(s.admin.pause(&target, &actor, &reason).await?)
    })
}

/// `POST /api/v1/pauses/resume`: answers `{"resumed": {"route" or "consumer": name}}`.
pub(crate) fn resume<O: OperatorStore>() -> Route<O> {
    act(async |s: Shared<O>, body: PauseBody, actor, reason| {
        let target = body.target()?;
        s.admin.resume(&target, &actor, &reason).await?;
        Ok(serde_json::json!({ "resumed": { target.kind(): target.name() } }))
    })
}
