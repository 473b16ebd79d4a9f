//! Replaying published events: one aggregate's from a version, or those written in a time
//! range.

use outbox_core::operator::{
    OperatorStore, RangePlan, RangeSelection, ReplayPlan, ReplaySelection,
};
use serde::{Deserialize, Serialize};

use super::{Route, Shared, act};
use crate::error::ApiError;

/// The body of `POST /api/v1/replay`: the aggregate ([`ReplaySelection`]'s fields) or the
/// range ([`RangeSelection`]'s), `dry_run`, `expect_events` (the dry run's count), `reason`
/// (required unless a dry run), `actor`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    #[serde(default)]
    aggregate_type: Option<String>,
    #[serde(default)]
    aggregate_id: Option<String>,
    #[serde(default)]
    from_version: Option<i64>,
    #[serde(default)]
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    created_before: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default)]
    destination: Option<String>,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    expect_events: Option<i64>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

action_bodies!(ReplayBody);

/// What a replay names: one aggregate or one time range.
enum Replay {
    Aggregate(ReplaySelection),
    Range(RangeSelection),
}

/// What a replay answers, as the store returns it.
#[derive(Serialize)]
#[serde(untagged)]
enum Plan {
    Aggregate(ReplayPlan),
    Range(RangePlan),
}

impl ReplayBody {
    fn selection(self) -> Result<Replay, ApiError> {
        match self {
            Self {
                created_after: Some(created_after),
                created_before: Some(created_before),
                aggregate_id: None,
                from_version: None,
                aggregate_type,
                destination,
                ..
            } => Ok(Replay::Range(RangeSelection {
                created_after,
                created_before,
                aggregate_type,
                destination,
            })),
            Self {
                aggregate_type: Some(aggregate_type),
                aggregate_id: Some(aggregate_id),
                created_after: None,
                created_before: None,
                destination: None,
                from_version,
                ..
            } => Ok(Replay::Aggregate(ReplaySelection {
                aggregate_type,
                aggregate_id,
                from_version,
            })),
            _ => Err(ApiError::bad_request(
                "name one aggregate (\"aggregate_type\", \"aggregate_id\", optional \
                 \"from_version\") or one time range (\"created_after\", \"created_before\", \
                 optional \"aggregate_type\", \"destination\")",
            )),
        }
    }
}

/// `POST /api/v1/replay`: answers the plan ([`ReplayPlan`] or [`RangePlan`]).
pub(crate) fn replay<O: OperatorStore>() -> Route<O> {
    act(async |s: Shared<O>, body: ReplayBody, actor, reason| {
        let (dry_run, expect) = (body.dry_run, body.expect_events);
        Ok(match body.selection()? {
            Replay::Range(which) => Plan::Range(
                s.admin
                    .replay(&which, dry_run, expect, &actor, &reason)
                    .await?,
            ),
            Replay::Aggregate(which) => Plan::Aggregate(
                s.admin
                    .replay(&which, dry_run, expect, &actor, &reason)
                    .await?,
            ),
        })
    })
}
