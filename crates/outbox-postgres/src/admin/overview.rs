//! The overview's numbers on PostgreSQL. Exact counts are [`OutboxStore::stats`], one pass
//! over the table (about 2 s at 10 million pending rows here); bounded counts
//! ([`Counting::UpTo`]) read the pending rows through the table's order and the retrying and
//! dead ones through their partial indexes (migration 7), each stopped at the bound; the rest
//! reads partial indexes of open rows.

use outbox_core::operator::{Counting, OperatorError, Overview, OverviewOps};
use outbox_core::{OutboxStats, OutboxStore};
use sqlx::AssertSqlSafe;

use super::{effects_err, op_err};
use crate::store::{OnPublish, PgStore, stats_from_row};

/// Open consumer dead letters (not resolved; requeued ones count until the consumer settles
/// them), as `outbox status` has always counted them.
const COUNT_CONSUMER_DEAD: &str =
    "SELECT count(*) FROM {s}.consumer_dead_letters WHERE state <> 'resolved'";

/// The outbox numbers of [`OverviewOps::overview_counting`] with [`Counting::UpTo`], each count
/// stopped at `$1` rows: the pending rows through the table's order, the retrying and dead
/// ones through their partial indexes (migration 7), in-flight rows from the leases. `{published}`
/// counts kept published rows in mark mode (their index), and is 0 in delete mode.
const BOUNDED_STATS: &str = "SELECT \
      (SELECT count(*) FROM (SELECT 1 FROM {s}.events WHERE state = 'pending' LIMIT $1) c), \
      (SELECT EXTRACT(EPOCH FROM now() - e.created_at)::float8 FROM {s}.events e \
         WHERE e.state = 'pending' ORDER BY e.id LIMIT 1), \
      (SELECT count(*) FROM (SELECT 1 FROM {s}.leases l JOIN {s}.events f \
         ON f.aggregate_type = l.aggregate_type AND f.aggregate_id = l.aggregate_id \
         WHERE l.lease_until > now() AND f.state = 'pending' LIMIT $1) c), \
      (SELECT count(*) FROM (SELECT 1 FROM {s}.events \
         WHERE state = 'pending' AND attempts > 0 LIMIT $1) c), \
      (SELECT count(*) FROM (SELECT 1 FROM {s}.events WHERE state = 'dead' LIMIT $1) c), \
      {published}";

/// Failed work items, counted up to `$1`.
const COUNT_FAILED_ITEMS: &str =
    "SELECT count(*) FROM (SELECT 1 FROM {s}.work_items WHERE state = 'failed' LIMIT $1) c";

impl OverviewOps for PgStore {
    async fn ready(&self) -> Result<(), OperatorError> {
        self.check()
            .await
            .map_err(|e| OperatorError::store("readiness", &e))
    }

    async fn overview_counting(&self, counting: Counting) -> Result<Overview, OperatorError> {
        let pool = self.pool();
        let schema = self.schema();
        let counted_up_to = counting.bound("overview")?;
        let s = match counted_up_to {
            None => self
                .stats()
                .await
                .map_err(|e| OperatorError::store("overview", &e))?,
            Some(bound) => self.bounded_stats(bound).await?,
        };
        let inbox_conflicts = self
            .inbox()
            .conflict_count(pool)
            .await
            .map_err(|e| op_err("overview: inbox conflicts", e))?;
        let consumer_dead_letters: i64 =
            sqlx::query_scalar(AssertSqlSafe(schema.render(COUNT_CONSUMER_DEAD)))
                .fetch_one(pool)
                .await
                .map_err(|e| op_err("overview: consumer dead letters", e))?;
        let effects = match counting {
            Counting::Exact => self.effects().stats(pool, None).await,
            // The open states through their partial indexes; the failed ones counted up to
            // the bound (the settled history is never read whole).
            Counting::UpTo(bound) => match self.effects().backlog(pool, None).await {
                Ok(mut open) => {
                    let failed =
                        sqlx::query_scalar(AssertSqlSafe(schema.render(COUNT_FAILED_ITEMS)))
                            .bind(bound)
                            .fetch_one(pool)
                            .await
                            .map_err(|e| op_err("overview: work items", e))?;
                    open.failed = failed;
                    Ok(open)
                }
                Err(e) => Err(e),
            },
        }
        .map_err(|e| effects_err("overview: work items", e))?;
        Ok(Overview::from_counts(
            schema.as_str(),
            counted_up_to,
            &s,
            inbox_conflicts,
            consumer_dead_letters,
            &effects,
        ))
    }
}

impl PgStore {
    pub(super) async fn bounded_stats(&self, bound: i64) -> Result<OutboxStats, OperatorError> {
        let published = match self.config().on_publish {
            OnPublish::Delete => "0::int8",
            OnPublish::Mark => {
                "(SELECT count(*) FROM (SELECT 1 FROM {s}.events WHERE state = 'published' LIMIT $1) c)"
            }
        };
        let sql = self
            .schema()
            .render(&BOUNDED_STATS.replace("{published}", published));
        let r = sqlx::query(AssertSqlSafe(sql))
            .bind(bound)
            .fetch_one(self.pool())
            .await
            .map_err(|e| op_err("overview", e))?;
        stats_from_row(&r).map_err(|e| op_err("overview", e))
    }
}
