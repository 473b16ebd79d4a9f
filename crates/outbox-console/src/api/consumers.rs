//! The consumers: each one's numbers, and their dead letters (a page, the groups by consumer
//! and reason, one whole with the token, and the actions requeue and discard).

use outbox_core::operator::{ConsumerSelection, OperatorStore};
use serde::Deserialize;

use super::{DEFAULT_LIMIT, P, Q, Route, Shared, act, nonempty, read};
use crate::MAX_REQUEUE_IDS;
use crate::auth::Token;
use crate::error::ApiError;

/// `GET /api/v1/consumers`.
pub(crate) fn list<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, ()| Ok(s.admin.consumers().await?))
}

/// The query of the consumer dead-letter reads.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumerListQuery {
    consumer: Option<String>,
    reason_group: Option<String>,
    limit: Option<i64>,
}

impl ConsumerListQuery {
    fn selection(self) -> (ConsumerSelection, i64) {
        let which = ConsumerSelection {
            consumer: nonempty(self.consumer),
            ids: None,
            reason_group: nonempty(self.reason_group),
        };
        (which, self.limit.unwrap_or(DEFAULT_LIMIT))
    }
}

/// `GET /api/v1/consumer-dead-letters`.
pub(crate) fn dead_letters<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, Q(q): Q<ConsumerListQuery>| {
        let (which, limit) = q.selection();
        Ok(s.admin.consumer_dead_letters(&which, limit).await?)
    })
}

/// `GET /api/v1/consumer-dead-letters/groups`.
pub(crate) fn dead_letter_groups<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, Q(q): Q<ConsumerListQuery>| {
        Ok(s.admin
            .consumer_dead_letter_groups(&q.selection().0)
            .await?)
    })
}

/// `GET /api/v1/consumer-dead-letters/{id}`, with the token.
pub(crate) fn dead_letter<O: OperatorStore>() -> Route<O> {
    read(async |s: Shared<O>, (Token, P(id)): (Token, P<i64>)| {
        Ok(s.admin.consumer_dead_letter(id).await?)
    })
}

/// The body of the consumer dead-letter actions: `ids` (non-empty) or `"all": true`, either
/// narrowed by `consumer` and `reason_group`; `reason` (required by a discard) and `actor`
/// go into the audit record.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumerActionBody {
    #[serde(default)]
    ids: Vec<i64>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    consumer: Option<String>,
    #[serde(default)]
    reason_group: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    actor: Option<String>,
}

action_bodies!(ConsumerActionBody);

impl ConsumerActionBody {
    fn selection(self) -> Result<ConsumerSelection, ApiError> {
        let ids = match (self.all, self.ids.is_empty()) {
            (true, true) => None,
            (false, false) if self.ids.len() <= MAX_REQUEUE_IDS => Some(self.ids),
            (false, false) => {
                return Err(ApiError::bad_request(format!(
                    "at most {MAX_REQUEUE_IDS} ids per request"
                )));
            }
            _ => {
                return Err(ApiError::bad_request(
                    "give either \"ids\" (a non-empty list) or \"all\": true",
                ));
            }
        };
        // As given: an empty reason group is the group of empty errors, not "any" (a form's
        // empty field means "any" only in reads).
        Ok(ConsumerSelection {
            consumer: self.consumer,
            ids,
            reason_group: self.reason_group,
        })
    }
}

/// `POST /api/v1/consumer-dead-letters/requeue`: answers `{"requeued": n}`.
pub(crate) fn requeue<O: OperatorStore>() -> Route<O> {
    act(
        async |s: Shared<O>, body: ConsumerActionBody, actor, reason| {
            let which = body.selection()?;
            let n = s
                .admin
                .requeue_consumer_dead_letters(&which, &actor, &reason)
                .await?;
            Ok(serde_json::json!({ "requeued": n }))
        },
    )
}

/// `POST /api/v1/consumer-dead-letters/discard`: answers `{"discarded": n}`.
pub(crate) fn discard<O: OperatorStore>() -> Route<O> {
    act(
        async |s: Shared<O>, body: ConsumerActionBody, actor, reason| {
            let which = body.selection()?;
            let n = s
                .admin
                .discard_consumer_dead_letters(&which, &actor, &reason)
                .await?;
            Ok(serde_json::json!({ "discarded": n }))
        },
    )
}
