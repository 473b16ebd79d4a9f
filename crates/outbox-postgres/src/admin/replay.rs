//! Replay: one aggregate's published events, or those written in a time range, republished
//! with their original ids, as far as the outbox still holds them.
//!
//! Only mark mode keeps published rows (`relay.on_publish = "mark"`, until `outbox cleanup
//! --published-keep-secs` deletes them); in delete mode the outbox holds nothing to replay and a
//! replay is refused, naming the broker's own retention as the place to replay from.
//!
//! A replay makes an aggregate's published rows from a version on pending again (attempts
//! reset), in one transaction with its audit record, and wakes the relays: a polling relay
//! republishes them under their original event ids, in version order, ahead of the
//! aggregate's later pending versions. Their original publish time is kept (the relay does not
//! overwrite it when it marks them again), so retention deletes them when it would have, and
//! the inbox's keep, which covers that retention, still recognises them: consumers with an
//! inbox see redeliveries, not second effects; a consumer that lost its state, or a new one,
//! gets them again.
//!
//! **Order.** The transaction first locks the aggregate's unpublished rows (a claim in progress
//! is waited for; a later one skips the aggregate until the replay commits), then refuses when
//! a relay holds a live lease on the aggregate (it may be publishing a later version right
//! now: retry once it settled). A CDC relay streams inserts only and would publish a newer
//! version straight from the log ahead of the replayed ones: a replay is refused while one
//! reports a live heartbeat (run the polling relay for the replay).
//!
//! **The replay horizon.** A replay never replays part of what was asked: it is refused when
//! the aggregate's lowest version still held (in any state) is above the first version asked,
//! or when the versions from there to the newest held are not all held (retention or a
//! discard left a gap), or when nothing of the aggregate is held. The refusal names what is
//! held. [`ReplayPlan`] (a dry run) says how many rows a replay would take and changes
//! nothing; a replay given `expect_events` (the dry run's count) is refused when the count
//! changed meanwhile, and any replay is rolled back when fewer rows changed than planned.
//!
//! **A time range** ([`RangeSelection`], [`ReplayOps::replay`]): the events written in
//! `[created_after, created_before)` that were published, of one aggregate type or destination
//! when given, across aggregates. Two rules keep it whole and ordered:
//!
//! * *Per-aggregate extension.* For each aggregate with a published event in the range, the
//!   replay takes that aggregate's published events from its first one in the range through
//!   its newest, later ones (after the range, whatever their route) included. A consumer that
//!   rebuilds its state from the replay then ends at each aggregate's newest version, in
//!   version order, instead of at a version the aggregate has since left behind. The plan
//!   counts the events in the range and the ones the extension adds.
//! * *The replay horizon.* Retention (`outbox cleanup --published-keep-secs`) raises a mark to
//!   the newest write time (`created_at`) among the rows it deleted (`retention_marks`, schema
//!   11), so any event written after the mark is still held: a range that starts after the
//!   mark is complete; one that starts at or before it is refused, naming the mark. The mark
//!   starts at the time schema 11 was migrated (earlier deletions left no trace). What it does
//!   not see: a relay in delete mode, or a producer deleting its own rows
//!   (`delete_in_transaction`), removes rows without raising it. Run every relay of a schema in
//!   mark mode, as the console's configuration says, and after switching a schema from delete
//!   to mark mode raise the mark by hand (`UPDATE <schema>.retention_marks SET through = now()`).
//!   The per-aggregate gap check above applies to each aggregate too.
//!
//! The guards of a single aggregate hold for the whole set (locks, live leases, a CDC relay,
//! the dry-run count). A range is at most [`MAX_RANGE_AGGREGATES`] aggregates and
//! [`MAX_RANGE_EVENTS`] events in one transaction; a bigger one is refused, to be split.
//!
//! Cost: the aggregate's rows through the (aggregate, version) unique index; a time range reads
//! the published rows of the range by `created_at` (mark mode's `published_at` index does not
//! serve it: a sequential read of the table on a large outbox, acceptable for an occasional
//! operator action; narrow it by aggregate type or destination).

use chrono::{DateTime, Utc};
use outbox_core::operator::{
    MAX_RANGE_AGGREGATES, MAX_RANGE_EVENTS, OperatorError, OperatorErrorKind, RangePlan,
    RangeSelection, ReplayOps, ReplayPlan, ReplayRequest, ReplaySelection, count_changed,
};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Postgres, Row, Transaction};

use super::op_err;
use crate::store::{OnPublish, PgStore};

/// The aggregate's unpublished rows, locked: a claim in progress is waited for, a later one
/// skips the aggregate until the replay commits.
pub(super) const LOCK: &str = "SELECT 1 FROM {s}.events WHERE aggregate_type = $1 \
    AND aggregate_id = $2 AND state <> 'published' FOR UPDATE";

/// A live relay lease on the aggregate.
pub(super) const LEASED: &str = "SELECT EXISTS (SELECT 1 FROM {s}.leases \
    WHERE aggregate_type = $1 AND aggregate_id = $2 AND lease_until > now())";

/// A CDC relay with a live heartbeat (within six of its intervals).
pub(super) const CDC_RUNNING: &str = "SELECT EXISTS (SELECT 1 FROM {s}.instances \
    WHERE kind = 'relay' AND name = 'cdc' AND stopped_at IS NULL \
      AND heartbeat_at > now() - make_interval(secs => interval_ms * 6 / 1000.0))";

/// The published rows from `$3` on, the lowest and newest versions held (any state), how many
/// versions from `$3` on are held, and the first replayed row's publish time.
pub(super) const PLAN: &str = "SELECT \
      count(*) FILTER (WHERE state = 'published' AND aggregate_version >= $3), \
      min(aggregate_version), max(aggregate_version), \
      count(*) FILTER (WHERE aggregate_version >= $3), \
      min(published_at) FILTER (WHERE state = 'published' AND aggregate_version >= $3) \
    FROM {s}.events WHERE aggregate_type = $1 AND aggregate_id = $2";

/// The replay; `published_at` is kept (see the module docs).
pub(super) const REPLAY: &str = "UPDATE {s}.events SET state = 'pending', attempts = 0, \
    available_at = now() \
    WHERE aggregate_type = $1 AND aggregate_id = $2 AND state = 'published' \
      AND aggregate_version >= $3";

/// The replay horizon of a time range.
pub(super) const HORIZON: &str = "SELECT through FROM {s}.retention_marks WHERE what = 'published'";

/// The aggregates with a published event in the range `$1`..`$2` (of type `$3`, destination
/// `$4` when not null), each with its first version there and how many of its events are
/// there; at most `$5` of them (one more than a replay takes tells it is too big).
pub(super) const RANGE_AGGREGATES: &str = "SELECT aggregate_type, aggregate_id, \
      min(aggregate_version), count(*) \
    FROM {s}.events WHERE state = 'published' AND created_at >= $1 AND created_at < $2 \
      AND ($3::text IS NULL OR aggregate_type = $3) \
      AND ($4::text IS NULL OR destination = $4) \
    GROUP BY aggregate_type, aggregate_id LIMIT $5";

/// The aggregates `$1`/`$2` (from version `$3`), as a relation `a(t, i, v)`.
const AGGREGATES: &str = "unnest($1::text[], $2::text[], $3::bigint[]) AS a(t, i, v)";

/// Locks the unpublished rows of the aggregates `$1`/`$2` (as [`LOCK`] does for one).
pub(super) fn range_lock() -> String {
    format!(
        "SELECT 1 FROM {{s}}.events e JOIN {AGGREGATES} ON e.aggregate_type = a.t \
         AND e.aggregate_id = a.i WHERE e.state <> 'published' FOR UPDATE OF e"
    )
}

/// The first of the aggregates `$1`/`$2` a relay holds a live lease on.
pub(super) fn range_leased() -> String {
    format!(
        "SELECT l.aggregate_type, l.aggregate_id FROM {{s}}.leases l JOIN {AGGREGATES} \
         ON l.aggregate_type = a.t AND l.aggregate_id = a.i WHERE l.lease_until > now() LIMIT 1"
    )
}

/// Per aggregate: the published rows from its version `$3` on, and whether the versions from
/// there to its newest are all held; the first aggregate with a gap, if any.
pub(super) fn range_plan() -> String {
    format!(
        "WITH p AS (SELECT a.t, a.i, \
           count(*) FILTER (WHERE e.state = 'published') AS published, \
           count(*) AS held, max(e.aggregate_version) - a.v + 1 AS span \
         FROM {AGGREGATES} JOIN {{s}}.events e ON e.aggregate_type = a.t \
           AND e.aggregate_id = a.i AND e.aggregate_version >= a.v GROUP BY a.t, a.i, a.v) \
         SELECT coalesce(sum(published), 0)::bigint, \
           (SELECT t || '/' || i FROM p WHERE held <> span LIMIT 1) FROM p"
    )
}

/// The time-range replay; `published_at` is kept.
pub(super) fn range_replay() -> String {
    format!(
        "UPDATE {{s}}.events e SET state = 'pending', attempts = 0, available_at = now() \
         FROM {AGGREGATES} WHERE e.aggregate_type = a.t AND e.aggregate_id = a.i \
           AND e.state = 'published' AND e.aggregate_version >= a.v"
    )
}

impl ReplayOps for PgStore {
    async fn apply_replay(
        &self,
        request: &ReplayRequest<'_, ReplaySelection>,
    ) -> Result<ReplayPlan, OperatorError> {
        const OP: &str = "replay";
        let which = request.which;
        // A refusal changes nothing and writes no record (the provided method logs it).
        let refuse = |kind, message: String| OperatorError::new(OP, kind, message);
        self.replay_allowed(OP)?;
        let (t, i) = (&which.aggregate_type, &which.aggregate_id);
        let from = which.from_version.unwrap_or(1);
        let mut tx = self.begin_action(request.action).await?;
        let q = |sql: &str| {
            sqlx::query(AssertSqlSafe(self.render(sql)))
                .bind(t.clone())
                .bind(i.clone())
        };
        let err = |e| self.action_error(OP, e);
        q(LOCK).execute(&mut *tx).await.map_err(err)?;
        let leased: bool = q(LEASED)
            .fetch_one(&mut *tx)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(err)?;
        if leased {
            return Err(refuse(
                OperatorErrorKind::Refused,
                format!(
                    "a relay holds {t}/{i} right now (it may be publishing a later version): \
                     retry once it settled, in a few seconds"
                ),
            ));
        }
        if let Some(message) = self.replay_cdc_refusal(&mut tx).await.map_err(err)? {
            return Err(refuse(OperatorErrorKind::Refused, message));
        }
        let r = q(PLAN).bind(from).fetch_one(&mut *tx).await.map_err(err)?;
        let decode = || -> Result<(ReplayPlan, i64), sqlx::Error> {
            Ok((
                ReplayPlan {
                    events: r.try_get(0)?,
                    lowest_version_held: r.try_get(1)?,
                    newest_version_held: r.try_get(2)?,
                    first_published_at: r.try_get(4)?,
                    dry_run: request.dry_run,
                },
                r.try_get(3)?,
            ))
        };
        let (plan, held_from) = decode().map_err(|e| op_err(OP, e))?;
        let (Some(lowest), Some(newest)) = (plan.lowest_version_held, plan.newest_version_held)
        else {
            return Err(OperatorError::not_found(
                OP,
                format!(
                    "nothing of {t}/{i} is held by the outbox (never written here, or deleted by retention)"
                ),
            ));
        };
        if lowest > from {
            return Err(refuse(
                OperatorErrorKind::Refused,
                format!(
                    "beyond the replay horizon: {t}/{i} versions below {lowest} are no longer held \
                     (retention or a discard removed them); replay from version {lowest}, or from \
                     the broker's retention"
                ),
            ));
        }
        if from <= newest && held_from != newest - from + 1 {
            return Err(refuse(
                OperatorErrorKind::Refused,
                format!(
                    "beyond the replay horizon: versions {from} to {newest} of {t}/{i} are not all \
                     held ({held_from} of {}; retention or a discard removed some)",
                    newest - from + 1
                ),
            ));
        }
        if let Some(message) = count_changed(request.expect_events, plan.events) {
            return Err(refuse(OperatorErrorKind::Refused, message));
        }
        let replay = q(REPLAY).bind(from);
        let events = self
            .finish_replay(tx, request, OP, plan.events, replay)
            .await?;
        Ok(ReplayPlan { events, ..plan })
    }

    async fn apply_replay_range(
        &self,
        request: &ReplayRequest<'_, RangeSelection>,
    ) -> Result<RangePlan, OperatorError> {
        // A refusal changes nothing and writes no record (the provided method logs it).
        self.replay_allowed(RANGE_OP)?;
        let mut tx = self.begin_action(request.action).await?;
        let (plan, found) = self.plan_range(&mut tx, request).await?;
        let replay = found.bind(self, &range_replay());
        let events = self
            .finish_replay(tx, request, RANGE_OP, plan.events, replay)
            .await?;
        Ok(RangePlan { events, ..plan })
    }
}

impl PgStore {
    /// Whether a replay may run at all: only in mark mode (a store that deletes its published
    /// rows holds nothing to replay).
    ///
    /// # Errors
    /// [`OperatorError`] of kind `Refused` in `operation`, in delete mode.
    pub(super) fn replay_allowed(&self, operation: &'static str) -> Result<(), OperatorError> {
        if self.config().on_publish == OnPublish::Delete {
            return Err(OperatorError::refused(
                operation,
                "the outbox keeps no published events (relay.on_publish = \"delete\"): nothing \
                 can be replayed from it; replay from the broker's retention, or run in mark mode",
            ));
        }
        Ok(())
    }

    /// The refusal of a replay while a CDC relay runs, if one does.
    pub(super) async fn replay_cdc_refusal(
        &self,
        tx: &mut Transaction<'static, Postgres>,
    ) -> Result<Option<String>, sqlx::Error> {
        let cdc: bool = sqlx::query_scalar(AssertSqlSafe(self.render(CDC_RUNNING)))
            .fetch_one(&mut **tx)
            .await?;
        Ok(cdc.then(|| {
            "a CDC relay is running: it streams inserts only, so it would not see the replayed \
             rows and could publish a newer version ahead of them. Stop it and run the polling \
             relay for the replay (docs/guide/src/relay.md, \"CDC relay\")"
                .to_owned()
        }))
    }

    /// A replay's end, once planned: a dry run rolls back (nothing changed, nothing to record)
    /// and returns `planned`. Otherwise `replay` makes the rows pending; exactly the `planned`
    /// rows changed wakes the relays (at commit) and commits with the audit record, returning
    /// how many; any other count refuses it and rolls back.
    pub(super) async fn finish_replay<W>(
        &self,
        mut tx: Transaction<'static, Postgres>,
        request: &ReplayRequest<'_, W>,
        operation: &'static str,
        planned: i64,
        replay: Query<'static, Postgres, PgArguments>,
    ) -> Result<i64, OperatorError> {
        if request.dry_run {
            let _ = tx.rollback().await;
            return Ok(planned);
        }
        let result = match replay.execute(&mut *tx).await {
            Ok(r) if i64::try_from(r.rows_affected()) == Ok(planned) => self
                .wake_relays(&mut tx)
                .await
                .map(|_| r.rows_affected())
                .map_err(|e| self.action_error(operation, e)),
            Ok(r) => Err(OperatorError {
                operation,
                kind: OperatorErrorKind::Refused,
                message: format!(
                    "{} row(s) changed where {planned} were planned (retention deleted some \
                     meanwhile): nothing was replayed; dry-run again",
                    r.rows_affected()
                ),
            }),
            Err(e) => Err(self.action_error(operation, e)),
        };
        let n = self.finish_action(tx, request.action, result).await?;
        Ok(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

/// The aggregates of a time range ([`RANGE_AGGREGATES`]) as the replay binds them: each one's
/// type, id and first version in the range, and how many events the range holds.
struct RangeAggregates {
    types: Vec<String>,
    ids: Vec<String>,
    froms: Vec<i64>,
    in_range: i64,
}

impl RangeAggregates {
    /// How many aggregates the range has.
    fn count(&self) -> i64 {
        i64::try_from(self.types.len()).unwrap_or(i64::MAX)
    }

    /// The statement `sql` of the schema, the aggregates bound as `$1`, `$2` and `$3`.
    fn bind(&self, store: &PgStore, sql: &str) -> Query<'static, Postgres, PgArguments> {
        sqlx::query(AssertSqlSafe(store.render(sql)))
            .bind(self.types.clone())
            .bind(self.ids.clone())
            .bind(self.froms.clone())
    }
}

/// The operation of a time-range replay, as its errors and audit record name it.
const RANGE_OP: &str = "replay range";

/// A refusal of a time-range replay.
fn range_refused(message: String) -> OperatorError {
    OperatorError {
        operation: RANGE_OP,
        kind: OperatorErrorKind::Refused,
        message,
    }
}

/// The refusal of a range too big for one replay.
fn too_big(events: i64, aggregates: i64) -> String {
    let aggregates = if aggregates > MAX_RANGE_AGGREGATES {
        format!("more than {MAX_RANGE_AGGREGATES}")
    } else {
        aggregates.to_string()
    };
    format!(
        "the range takes {events} event(s) of {aggregates} aggregate(s), later versions \
         included: more than one replay takes ({MAX_RANGE_EVENTS} events, \
         {MAX_RANGE_AGGREGATES} aggregates); split it into shorter ranges"
    )
}

impl PgStore {
    /// The plan of a time-range replay in `tx`, with its aggregates (locked, see the module
    /// docs), or its refusal: beyond the replay horizon, nothing in the range, too big, an
    /// aggregate a relay holds, a CDC relay running, a gap, a count changed since the dry run.
    async fn plan_range(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        request: &ReplayRequest<'_, RangeSelection>,
    ) -> Result<(RangePlan, RangeAggregates), OperatorError> {
        let which = request.which;
        let horizon = self.range_horizon(tx, which).await?;
        let Some(found) = self
            .range_aggregates(tx, which)
            .await
            .map_err(|e| self.action_error(RANGE_OP, e))?
        else {
            return Err(OperatorError::not_found(
                RANGE_OP,
                "no published event was written in the range (with the filter given)",
            ));
        };
        let aggregates = found.count();
        if aggregates > MAX_RANGE_AGGREGATES || found.in_range > MAX_RANGE_EVENTS {
            return Err(range_refused(too_big(found.in_range, aggregates)));
        }
        self.range_guards(tx, &found).await?;
        let events = self.range_events(tx, &found).await?;
        let plan = RangePlan {
            events,
            in_range: found.in_range,
            aggregates,
            horizon,
            dry_run: request.dry_run,
        };
        if let Some(message) = count_changed(request.expect_events, plan.events) {
            return Err(range_refused(message));
        }
        Ok((plan, found))
    }

    /// The replay horizon ([`HORIZON`]), or the refusal of a range that starts at or before it.
    async fn range_horizon(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        which: &RangeSelection,
    ) -> Result<Option<DateTime<Utc>>, OperatorError> {
        let horizon: Option<DateTime<Utc>> =
            sqlx::query_scalar(AssertSqlSafe(self.render(HORIZON)))
                .fetch_optional(&mut **tx)
                .await
                .map_err(|e| self.action_error(RANGE_OP, e))?;
        if let Some(h) = horizon
            && which.created_after <= h
        {
            return Err(range_refused(format!(
                "beyond the replay horizon: retention deleted events published up to {}; a \
                 range must start after it (or replay from the broker's retention)",
                h.to_rfc3339()
            )));
        }
        Ok(horizon)
    }

    /// The guards of a single aggregate, for all of the range's: their unpublished rows
    /// locked, then a refusal when a relay holds one of them or a CDC relay runs.
    async fn range_guards(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        found: &RangeAggregates,
    ) -> Result<(), OperatorError> {
        let err = |e| self.action_error(RANGE_OP, e);
        found
            .bind(self, &range_lock())
            .execute(&mut **tx)
            .await
            .map_err(err)?;
        if let Some(held) = found
            .bind(self, &range_leased())
            .fetch_optional(&mut **tx)
            .await
            .map_err(err)?
        {
            let (t, i): (String, String) = (
                held.try_get(0).unwrap_or_default(),
                held.try_get(1).unwrap_or_default(),
            );
            return Err(range_refused(format!(
                "a relay holds {t}/{i} right now (it may be publishing a later version): \
                 retry once it settled, in a few seconds"
            )));
        }
        if let Some(message) = self.replay_cdc_refusal(tx).await.map_err(err)? {
            return Err(range_refused(message));
        }
        Ok(())
    }

    /// The events the replay takes ([`range_plan`]), or its refusal: an aggregate with a gap
    /// in its versions, or more events than one replay takes.
    async fn range_events(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        found: &RangeAggregates,
    ) -> Result<i64, OperatorError> {
        let r = found
            .bind(self, &range_plan())
            .fetch_one(&mut **tx)
            .await
            .map_err(|e| self.action_error(RANGE_OP, e))?;
        let (events, gap): (i64, Option<String>) = (|| Ok((r.try_get(0)?, r.try_get(1)?)))()
            .map_err(|e: sqlx::Error| op_err(RANGE_OP, e))?;
        if let Some(aggregate) = gap {
            return Err(range_refused(format!(
                "beyond the replay horizon: the versions of {aggregate} from its first one in \
                 the range to its newest are not all held (retention or a discard removed \
                 some); replay it alone from a version still held"
            )));
        }
        if events > MAX_RANGE_EVENTS {
            return Err(range_refused(too_big(events, found.count())));
        }
        Ok(events)
    }

    /// The aggregates with a published event in the range (at most one more than a replay
    /// takes, so that a bigger range is told apart); `None` when there is none.
    async fn range_aggregates(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        which: &RangeSelection,
    ) -> Result<Option<RangeAggregates>, sqlx::Error> {
        let rows = sqlx::query(AssertSqlSafe(self.render(RANGE_AGGREGATES)))
            .bind(which.created_after)
            .bind(which.created_before)
            .bind(which.aggregate_type.as_deref())
            .bind(which.destination.as_deref())
            .bind(MAX_RANGE_AGGREGATES + 1)
            .fetch_all(&mut **tx)
            .await?;
        if rows.is_empty() {
            return Ok(None);
        }
        let mut found = RangeAggregates {
            types: Vec::with_capacity(rows.len()),
            ids: Vec::with_capacity(rows.len()),
            froms: Vec::with_capacity(rows.len()),
            in_range: 0,
        };
        for r in &rows {
            found.types.push(r.try_get(0)?);
            found.ids.push(r.try_get(1)?);
            found.froms.push(r.try_get(2)?);
            found.in_range += r.try_get::<i64, _>(3)?;
        }
        Ok(Some(found))
    }
}
