//! The outbox's dead letters: a page of them, their groups by reason, one whole (with the
//! token), and the two actions on a selection of them, requeue and discard.

use outbox_core::operator::{DeadLetterFilter, DeadLetterSelection, OperatorStore};
use serde::Deserialize;
use uuid::Uuid;

use super::{DEFAULT_LIMIT, P, Q, Route, Shared, act, nonempty, read};
use crate::MAX_REQUEUE_IDS;
use crate::auth::Token;
use crate::error::ApiError;

/// The query of the outbox dead-letter reads: a [`DeadLetterFilter`] and a page size.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterQuery {
    limit: Option<i64>,
    aggregate_type: Option<String>,
    event_type: Option<String>,
    destination: Option<String>,
    reason_group: Option<String>,
    created_after: Option<chrono::DateTime<chrono::Utc>>,
    created_before: Option<chrono::DateTime<chrono::Utc>>,
}

impl DeadLetterQuery {
    fn filter(self) -> (DeadLetterFilter, i64) {
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        let filter = DeadLetterFilter {
            aggregate_type: nonempty(self.aggregate_type),
            event_type: nonempty(self.event_type),
            destination: nonempty(self.destination),
            reason_group: nonempty(self.reason_group),
            created_after: self.created_after,
            created_before: self.created_before,
        };
        (filter, limit)
    }
}

/// `GET /api/v1/dead-letters`.
pub(crate) fn list<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, Q(q): Q<DeadLetterQuery>| {
        let (filter, limit) = q.filter();
        Ok(s.admin.dead_letters(&filter, limit).await?)
    })
}

/// `GET /api/v1/dead-letters/groups`.
pub(crate) fn groups<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, Q(q): Q<DeadLetterQuery>| {
        Ok(s.admin.dead_letter_groups(&q.filter().0).await?)
    })
}

/// `GET /api/v1/dead-letters/{event_id}`, with the token.
pub(crate) fn one<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, (Token, P(id)): (Token, P<Uuid>)| Ok(s.admin.dead_letter(id).await?))
}

/// The body of the outbox dead-letter actions: exactly one of `event_ids` (non-empty),
/// `"all": true` or a non-empty `filter`; `reason` (required by a discard) and `actor` go
/// into the audit record.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeadLetterActionBody {
    #[serde(default)]
    event_ids: Vec<Uuid>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    filter: Option<DeadLetterFilter>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

action_bodies!(DeadLetterActionBody);

impl DeadLetterActionBody {
    fn selection(self) -> Result<DeadLetterSelection, ApiError> {
        let filter = self.filter.filter(|f| *f != DeadLetterFilter::default());
        match (self.event_ids.is_empty(), self.all, filter) {
            (false, false, None) if self.event_ids.len() <= MAX_REQUEUE_IDS => {
                Ok(DeadLetterSelection::Ids(self.event_ids))
            }
            (false, false, None) => Err(ApiError::bad_request(format!(
                "at most {MAX_REQUEUE_IDS} event ids per request"
            ))),
            (true, true, None) => Ok(DeadLetterSelection::All),
            (true, false, Some(f)) => Ok(DeadLetterSelection::Matching(f)),
            _ => Err(ApiError::bad_request(
                "give exactly one of \"event_ids\" (a non-empty list), \"all\": true, or a non-empty \"filter\"",
            )),
        }
    }
}

/// `POST /api/v1/dead-letters/requeue`: answers `{"requeued": n}`.
pub(crate) fn requeue<O: OperatorStore>() -> Route<O> {
    act(
        async |s: Shared<O>, body: DeadLetterActionBody, actor, reason| {
            let which = body.selection()?;
            let n = s
                .admin
                .requeue_dead_letters(&which, &actor, &reason)
                .await?;
            Ok(serde_json::json!({ "requeued": n }))
        },
    )
}

/// `POST /api/v1/dead-letters/discard`: answers what the store discarded.
pub(crate) fn discard<O: OperatorStore>() -> Route<O> {
    act(
        async |s: Shared<O>, body: DeadLetterActionBody, actor, reason| {
            let which = body.selection()?;
            Ok(s.admin
                .discard_dead_letters(&which, &actor, &reason)
                .await?)
        },
    )
}
