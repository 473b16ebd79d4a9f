//! Outbox and consumer dead letters as the operator works with them: filtered, grouped by
//! reason, read whole, requeued or discarded by ids, by filter or all, each action audited.
//!
//! **Reasons** are grouped as ServicePulse groups failures: by the error text with its
//! numbers and UUIDs replaced by `#` and cut at 200 characters
//! ([`outbox_core::operator::reason_key`]), computed here by the database with the same rule,
//! so that a group's key selects exactly its rows in a filter.
//!
//! **Destination** in a filter is the row's own `destination` (the producer's override); rows
//! without one go where the relay's topic template sends their aggregate type, so filter those
//! by `aggregate_type`. **Time** is the event's `created_at` (when the producer wrote it).
//!
//! Every read walks the dead rows through their partial index (migration 7); groups read at
//! most [`GROUP_SCAN`] of them and say so (`complete`) when there may be more. A filter by
//! reason computes the key of each dead row it reads (no index holds it): dead letters are few
//! next to the outbox, and the read stops at the page's limit.

use outbox_core::EventId;
use outbox_core::operator::{
    Action, ConsumerDeadLetterDetail, ConsumerDeadLetterGroup, ConsumerDeadLetterGroups,
    ConsumerDeadLetterView, ConsumerSelection, DeadLetterDetail, DeadLetterFilter, DeadLetterGroup,
    DeadLetterGroups, DeadLetterOps, DeadLetterSelection, DeadLetterView, Discarded, GROUP_SCAN,
    MAX_LIST, OperatorError, PayloadView, check_limit,
};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Postgres, Row};

use super::op_err;
use crate::store::PgStore;

/// The reason key of a dead letter's error text, `{err}` being the column (see the module
/// docs).
const REASON_KEY: &str = "left(regexp_replace(coalesce({err}, ''), \
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|[0-9]+', '#', 'g'), 200)";

/// The conditions of the outbox's dead rows a [`DeadLetterSelection`] selects (binds `$1` to
/// `$7`; a condition whose value is not given is left out of the statement, so that each
/// shape of filter gets its own plan and an id lookup goes through the event-id index).
const MATCH: [&str; 7] = [
    "e.event_id = ANY($1)",
    "e.aggregate_type = $2",
    "e.event_type = $3",
    "e.destination = $4",
    "{reason} = $5",
    "e.created_at >= $6",
    "e.created_at < $7",
];

const LIST: &str = "SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, \
    e.event_type, e.attempts, e.last_error, e.created_at, \
    (SELECT count(*) FROM {s}.events b WHERE b.aggregate_type = e.aggregate_type \
       AND b.aggregate_id = e.aggregate_id AND b.aggregate_version > e.aggregate_version \
       AND b.state = 'pending'), \
    e.destination, e.content_type, e.schema_version, {reason} \
    FROM {s}.events e WHERE {match} ORDER BY e.id LIMIT $8";

const GROUPS: &str = "SELECT reason, count(*), min(created_at), max(created_at), \
    (array_agg(DISTINCT aggregate_type))[1:10], (array_agg(DISTINCT event_type))[1:10], \
    (array_agg(last_error ORDER BY id))[1] \
    FROM (SELECT e.id, e.created_at, e.aggregate_type, e.event_type, e.last_error, \
      {reason} AS reason FROM {s}.events e WHERE {match} ORDER BY e.id LIMIT $8) d \
    GROUP BY reason ORDER BY count(*) DESC, reason";

const DETAIL: &str = "SELECT e.payload, e.headers, e.partition_key, e.payload_sha256 \
    FROM {s}.events e WHERE e.event_id = $1 AND e.state = 'dead'";

const REQUEUE: &str = "UPDATE {s}.events e SET state = 'pending', attempts = 0, \
    available_at = now() WHERE {match}";

/// The discard, its audit record and the copy in one statement: the copy names the record.
const DISCARD: &str = "WITH d AS (DELETE FROM {s}.events e WHERE {match} \
      RETURNING e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version, e.event_type, \
        e.schema_version, e.content_type, e.payload, e.headers, e.destination, e.partition_key, \
        e.created_at, e.attempts, e.last_error), \
    a AS (INSERT INTO {s}.audit (actor, via, credential, action, selection, reason, affected) \
      SELECT $8, $9, $10, 'discard dead letters', $11, $12, count(*) FROM d RETURNING id), \
    c AS (INSERT INTO {s}.discarded_events (event_id, aggregate_type, aggregate_id, \
        aggregate_version, event_type, schema_version, content_type, payload, headers, \
        destination, partition_key, created_at, attempts, last_error, audit_id) \
      SELECT d.*, a.id FROM d CROSS JOIN a RETURNING 1) \
    SELECT (SELECT count(*) FROM c), (SELECT id FROM a)";

/// The conditions of the consumer dead letters a [`ConsumerSelection`] selects (`$1` to `$3`,
/// left out when not given), among those in `{states}`.
const CONSUMER_MATCH: [&str; 3] = ["c.consumer_name = $1", "c.id = ANY($2)", "{reason} = $3"];

const CONSUMER_LIST: &str = "SELECT c.id, c.consumer_name, c.event_id, c.aggregate_type, \
    c.aggregate_id, c.aggregate_version, c.event_type, c.error, c.attempts, c.state, \
    c.created_at, {reason} FROM {s}.consumer_dead_letters c WHERE {match} ORDER BY c.id LIMIT $4";

const CONSUMER_GROUPS: &str = "SELECT consumer_name, reason, count(*), min(created_at), \
    max(created_at), (array_agg(error ORDER BY id))[1] \
    FROM (SELECT c.id, c.consumer_name, c.created_at, c.error, {reason} AS reason \
      FROM {s}.consumer_dead_letters c WHERE {match} ORDER BY c.id LIMIT $4) d \
    GROUP BY consumer_name, reason ORDER BY count(*) DESC, consumer_name, reason";

const CONSUMER_DETAIL: &str = "SELECT c.payload, c.headers, c.content_type \
    FROM {s}.consumer_dead_letters c WHERE c.id = $1";

const CONSUMER_REQUEUE: &str = "UPDATE {s}.consumer_dead_letters c SET state = 'requeued', \
    updated_at = now() WHERE {match}";

const CONSUMER_DISCARD: &str = "UPDATE {s}.consumer_dead_letters c SET state = 'resolved', \
    updated_at = now() WHERE {match}";

/// `template` with its `{match}` (`matcher`, with its own `{reason}`) and `{reason}` filled in.
fn sql(template: &str, matcher: &str, err_column: &str) -> String {
    let reason = REASON_KEY.replace("{err}", err_column);
    template
        .replace("{match}", matcher)
        .replace("{reason}", &reason)
}

/// `template` for the dead letters `which` selects.
fn outbox_sql(template: &str, which: &DeadLetterSelection) -> String {
    let none = DeadLetterFilter::default();
    let (ids, f) = match which {
        DeadLetterSelection::Ids(_) => (true, &none),
        DeadLetterSelection::Matching(f) => (false, f),
        DeadLetterSelection::All => (false, &none),
    };
    let given = [
        ids,
        f.aggregate_type.is_some(),
        f.event_type.is_some(),
        f.destination.is_some(),
        f.reason_group.is_some(),
        f.created_after.is_some(),
        f.created_before.is_some(),
    ];
    let mut matcher = vec!["e.state = 'dead'"];
    matcher.extend(MATCH.iter().zip(given).filter(|(_, g)| *g).map(|(c, _)| *c));
    sql(template, &matcher.join(" AND "), "e.last_error")
}

/// `template` for the consumer dead letters `which` selects, among those in `states` (an SQL
/// list).
fn consumer_sql(template: &str, which: &ConsumerSelection, states: &str) -> String {
    let given = [
        which.consumer.is_some(),
        which.ids.is_some(),
        which.reason_group.is_some(),
    ];
    let in_states = format!("c.state IN ({states})");
    let mut matcher = vec![in_states.as_str()];
    matcher.extend(
        CONSUMER_MATCH
            .iter()
            .zip(given)
            .filter(|(_, g)| *g)
            .map(|(c, _)| *c),
    );
    sql(template, &matcher.join(" AND "), "c.error")
}

/// A selection's values bound to its matcher's placeholders.
trait BindMatch {
    /// Binds the matcher's placeholders (`$1` to `$7` of [`MATCH`], `$1` to `$3` of
    /// [`CONSUMER_MATCH`]).
    fn bind_match<'q>(
        &self,
        q: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments>;
}

impl BindMatch for DeadLetterSelection {
    fn bind_match<'q>(
        &self,
        q: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        let none = DeadLetterFilter::default();
        let (ids, f) = match self {
            Self::Ids(ids) => (Some(ids.clone()), &none),
            Self::Matching(f) => (None, f),
            Self::All => (None, &none),
        };
        q.bind(ids)
            .bind(f.aggregate_type.clone())
            .bind(f.event_type.clone())
            .bind(f.destination.clone())
            .bind(f.reason_group.clone())
            .bind(f.created_after)
            .bind(f.created_before)
    }
}

impl BindMatch for ConsumerSelection {
    fn bind_match<'q>(
        &self,
        q: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments> {
        q.bind(self.consumer.clone())
            .bind(self.ids.clone())
            .bind(self.reason_group.clone())
    }
}

/// Consumer dead-letter states a list shows: not resolved.
const OPEN_STATES: &str = "'dead', 'requeued'";

fn view(r: &PgRow) -> Result<DeadLetterView, sqlx::Error> {
    Ok(DeadLetterView {
        event_id: r.try_get(0)?,
        aggregate_type: r.try_get(1)?,
        aggregate_id: r.try_get(2)?,
        aggregate_version: r.try_get(3)?,
        event_type: r.try_get(4)?,
        attempts: r.try_get(5)?,
        last_error: r.try_get(6)?,
        created_at: r.try_get(7)?,
        blocked_behind: r.try_get(8)?,
        destination: r.try_get(9)?,
        content_type: r.try_get(10)?,
        schema_version: r.try_get(11)?,
        reason: r.try_get(12)?,
    })
}

fn group(r: &PgRow) -> Result<DeadLetterGroup, sqlx::Error> {
    Ok(DeadLetterGroup {
        reason: r.try_get(0)?,
        count: r.try_get(1)?,
        first_created_at: r.try_get(2)?,
        last_created_at: r.try_get(3)?,
        aggregate_types: r.try_get(4)?,
        event_types: r.try_get(5)?,
        example_error: r.try_get(6)?,
    })
}

fn consumer_group(r: &PgRow) -> Result<ConsumerDeadLetterGroup, sqlx::Error> {
    Ok(ConsumerDeadLetterGroup {
        consumer_name: r.try_get(0)?,
        reason: r.try_get(1)?,
        count: r.try_get(2)?,
        first_at: r.try_get(3)?,
        last_at: r.try_get(4)?,
        example_error: r.try_get(5)?,
    })
}

fn consumer_view(r: &PgRow) -> Result<ConsumerDeadLetterView, sqlx::Error> {
    Ok(ConsumerDeadLetterView {
        dead_letter: crate::consumer::dead_letter_from_row(r)?,
        reason: r.try_get(11)?,
    })
}

impl DeadLetterOps for PgStore {
    async fn dead_letters(
        &self,
        filter: &DeadLetterFilter,
        limit: i64,
    ) -> Result<Vec<DeadLetterView>, OperatorError> {
        check_limit("dead letters", limit)?;
        let selection = DeadLetterSelection::Matching(filter.clone());
        let sql = self.render(&outbox_sql(LIST, &selection));
        selection
            .bind_match(sqlx::query(AssertSqlSafe(sql)))
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(|e| op_err("dead letters", e))?
            .iter()
            .map(view)
            .collect::<Result<_, _>>()
            .map_err(|e| op_err("dead letters", e))
    }

    async fn dead_letter_groups(
        &self,
        filter: &DeadLetterFilter,
    ) -> Result<DeadLetterGroups, OperatorError> {
        let selection = DeadLetterSelection::Matching(filter.clone());
        let sql = self.render(&outbox_sql(GROUPS, &selection));
        selection
            .bind_match(sqlx::query(AssertSqlSafe(sql)))
            .bind(GROUP_SCAN)
            .fetch_all(self.pool())
            .await
            .map_err(|e| op_err("dead letter groups", e))?
            .iter()
            .map(group)
            .collect::<Result<_, _>>()
            .map(DeadLetterGroups::from_scan)
            .map_err(|e| op_err("dead letter groups", e))
    }

    async fn dead_letter(&self, event_id: EventId) -> Result<DeadLetterDetail, OperatorError> {
        const OP: &str = "dead letter";
        let mut list = self
            .dead_letter_rows(&DeadLetterSelection::Ids(vec![event_id]))
            .await?;
        let Some(dead_letter) = list.pop() else {
            return Err(OperatorError::not_found(
                OP,
                format!("{event_id} is not an outbox dead letter"),
            ));
        };
        let row = sqlx::query(AssertSqlSafe(self.render(DETAIL)))
            .bind(event_id)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| self.action_error(OP, e))?
            .ok_or_else(|| {
                OperatorError::not_found(OP, format!("{event_id} is not an outbox dead letter"))
            })?;
        let decode = || -> Result<DeadLetterDetail, sqlx::Error> {
            Ok(DeadLetterDetail {
                dead_letter,
                payload: PayloadView::of(row.try_get(0)?),
                headers: row.try_get(1)?,
                partition_key: row.try_get(2)?,
            })
        };
        decode().map_err(|e| op_err(OP, e))
    }

    async fn apply_requeue_dead_letters(
        &self,
        action: &Action<'_>,
        which: &DeadLetterSelection,
    ) -> Result<u64, OperatorError> {
        let mut tx = self.begin_action(action).await?;
        let sql = self.render(&outbox_sql(REQUEUE, which));
        let result = match which
            .bind_match(sqlx::query(AssertSqlSafe(sql)))
            .execute(&mut *tx)
            .await
        {
            Ok(r) if r.rows_affected() > 0 => {
                // Delivered at commit: relays move the requeued events (and the ones parked
                // behind them) at once.
                self.wake_relays(&mut tx).await.map(|_| r.rows_affected())
            }
            Ok(r) => Ok(r.rows_affected()),
            Err(e) => Err(e),
        }
        .map_err(|e| self.action_error(action.operation(), e));
        self.finish_action(tx, action, result).await
    }

    async fn apply_discard_dead_letters(
        &self,
        action: &Action<'_>,
        which: &DeadLetterSelection,
    ) -> Result<Discarded, OperatorError> {
        const OP: &str = "discard dead letters";
        let actor = action.actor();
        let sql = self.render(&outbox_sql(DISCARD, which));
        let mut conn = self.pool().begin().await.map_err(|e| op_err(OP, e))?;
        let result = which
            .bind_match(sqlx::query(AssertSqlSafe(sql)))
            .bind(actor.name())
            .bind(actor.via())
            .bind(actor.credential())
            .bind(action.selection())
            .bind(action.reason())
            .fetch_one(&mut *conn)
            .await
            .and_then(|r| {
                Ok(Discarded {
                    discarded: u64::try_from(r.try_get::<i64, _>(0)?).unwrap_or(0),
                    audit_id: r.try_get(1)?,
                })
            })
            .map_err(|e| self.action_error(OP, e));
        // The events that waited behind the discarded ones may be claimed now, wherever they
        // lie: the relays' next claims read from the table's start.
        let result = match result {
            Ok(d) if d.discarded > 0 => self
                .wake_relays(&mut conn)
                .await
                .map(|_| d)
                .map_err(|e| self.action_error(OP, e)),
            other => other,
        };
        match result {
            Ok(d) => conn.commit().await.map(|()| d).map_err(|e| op_err(OP, e)),
            Err(e) => Err(e),
        }
    }

    async fn consumer_dead_letters(
        &self,
        which: &ConsumerSelection,
        limit: i64,
    ) -> Result<Vec<ConsumerDeadLetterView>, OperatorError> {
        check_limit("consumer dead letters", limit)?;
        let sql = consumer_sql(CONSUMER_LIST, which, OPEN_STATES);
        which
            .bind_match(sqlx::query(AssertSqlSafe(self.render(&sql))))
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(|e| op_err("consumer dead letters", e))?
            .iter()
            .map(consumer_view)
            .collect::<Result<_, _>>()
            .map_err(|e| op_err("consumer dead letters", e))
    }

    async fn consumer_dead_letter_groups(
        &self,
        which: &ConsumerSelection,
    ) -> Result<ConsumerDeadLetterGroups, OperatorError> {
        let sql = consumer_sql(CONSUMER_GROUPS, which, OPEN_STATES);
        which
            .bind_match(sqlx::query(AssertSqlSafe(self.render(&sql))))
            .bind(GROUP_SCAN)
            .fetch_all(self.pool())
            .await
            .map_err(|e| op_err("consumer dead letter groups", e))?
            .iter()
            .map(consumer_group)
            .collect::<Result<_, _>>()
            .map(ConsumerDeadLetterGroups::from_scan)
            .map_err(|e| op_err("consumer dead letter groups", e))
    }

    async fn consumer_dead_letter(
        &self,
        id: i64,
    ) -> Result<ConsumerDeadLetterDetail, OperatorError> {
        const OP: &str = "consumer dead letter";
        let which = ConsumerSelection {
            ids: Some(vec![id]),
            ..ConsumerSelection::default()
        };
        let sql = consumer_sql(CONSUMER_LIST, &which, "'dead', 'requeued', 'resolved'");
        let dead_letter = which
            .bind_match(sqlx::query(AssertSqlSafe(self.render(&sql))))
            .bind(1_i64)
            .fetch_optional(self.pool())
            .await
            .map_err(|e| op_err(OP, e))?
            .as_ref()
            .map(consumer_view)
            .transpose()
            .map_err(|e| op_err(OP, e))?
            .ok_or_else(|| OperatorError::not_found(OP, format!("no consumer dead letter {id}")))?;
        let row = sqlx::query(AssertSqlSafe(self.render(CONSUMER_DETAIL)))
            .bind(id)
            .fetch_one(self.pool())
            .await
            .map_err(|e| self.action_error(OP, e))?;
        let decode = || -> Result<ConsumerDeadLetterDetail, sqlx::Error> {
            Ok(ConsumerDeadLetterDetail {
                dead_letter,
                payload: PayloadView::of(row.try_get(0)?),
                headers: row.try_get(1)?,
                content_type: row.try_get(2)?,
            })
        };
        decode().map_err(|e| op_err(OP, e))
    }

    async fn apply_requeue_consumer_dead_letters(
        &self,
        action: &Action<'_>,
        which: &ConsumerSelection,
    ) -> Result<u64, OperatorError> {
        self.consumer_action(action, CONSUMER_REQUEUE, which).await
    }

    async fn apply_discard_consumer_dead_letters(
        &self,
        action: &Action<'_>,
        which: &ConsumerSelection,
    ) -> Result<u64, OperatorError> {
        self.consumer_action(action, CONSUMER_DISCARD, which).await
    }
}

impl PgStore {
    async fn dead_letter_rows(
        &self,
        selection: &DeadLetterSelection,
    ) -> Result<Vec<DeadLetterView>, OperatorError> {
        let sql = self.render(&outbox_sql(LIST, selection));
        selection
            .bind_match(sqlx::query(AssertSqlSafe(sql)))
            .bind(MAX_LIST)
            .fetch_all(self.pool())
            .await
            .map_err(|e| op_err("dead letter", e))?
            .iter()
            .map(view)
            .collect::<Result<_, _>>()
            .map_err(|e| op_err("dead letter", e))
    }

    /// Runs `action` as `template` on the consumer dead letters `which` selects (in state
    /// `dead`), with its audit record.
    async fn consumer_action(
        &self,
        action: &Action<'_>,
        template: &str,
        which: &ConsumerSelection,
    ) -> Result<u64, OperatorError> {
        let mut tx = self.begin_action(action).await?;
        let sql = self.render(&consumer_sql(template, which, "'dead'"));
        let result = which
            .bind_match(sqlx::query(AssertSqlSafe(sql)))
            .execute(&mut *tx)
            .await
            .map(|r| r.rows_affected())
            .map_err(|e| self.action_error(action.operation(), e));
        self.finish_action(tx, action, result).await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_placeholder_is_filled_and_only_given_conditions_are_in_the_statement() {
        use super::{ConsumerSelection, DeadLetterFilter, DeadLetterSelection};
        let by_reason = DeadLetterSelection::Matching(DeadLetterFilter {
            reason_group: Some("x".into()),
            ..DeadLetterFilter::default()
        });
        for which in [
            DeadLetterSelection::All,
            DeadLetterSelection::Ids(vec![]),
            by_reason.clone(),
        ] {
            for t in [super::LIST, super::GROUPS, super::REQUEUE, super::DISCARD] {
                let s = super::outbox_sql(t, &which);
                assert!(!s.contains("{match}") && !s.contains("{reason}") && !s.contains("{err}"));
                assert!(s.contains("e.state = 'dead'"));
                assert_eq!(
                    s.contains("ANY($1)"),
                    matches!(which, DeadLetterSelection::Ids(_))
                );
                assert_eq!(s.contains("= $5"), which == by_reason);
            }
        }
        let one = ConsumerSelection {
            consumer: Some("ledger".into()),
            ..ConsumerSelection::default()
        };
        for t in [
            super::CONSUMER_LIST,
            super::CONSUMER_GROUPS,
            super::CONSUMER_REQUEUE,
            super::CONSUMER_DISCARD,
        ] {
            let s = super::consumer_sql(t, &one, "'dead'");
            assert!(!s.contains("{match}") && !s.contains("{reason}") && !s.contains("{err}"));
            assert!(s.contains("c.state IN ('dead')") && s.contains("c.consumer_name = $1"));
            assert!(!s.contains("ANY($2)") && !s.contains("= $3"));
        }
    }
}
