//! The table's side of [`CdcFeed`]: the statements that settle published rows and record the
//! events left to the table (each in one snapshot, with the visibility of the log's
//! transactions), and those that look at what the table holds back (older versions, parked
//! aggregates, rows left to catch up).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use outbox_core::StoreError;
use outbox_core::relay::Settlement;
use outbox_core::relay::log::{Aggregate, Leave};

use super::row::{Row, xid_param};
use super::{CdcFeed, State};
use crate::cdc::StoredRow;
use crate::error::store_error;
use crate::store::OnPublish;

/// SQL for the full (64-bit) transaction id of the log's 32-bit `xid`, next to the 64-bit
/// `xmax` of a snapshot: the one nearest to `xmax`, by the signed 32-bit distance between the
/// low halves. A transaction in the window this feed cares about (commit flushed, not visible
/// yet) often has an id at or above `xmax`, which is one past the latest *completed*
/// transaction; ids within 2^31 either side are told apart, across an epoch boundary too.
pub(super) fn full_xid(xid: &str, xmax: &str) -> String {
    format!(
        "({xmax} + ((((({xid}) - ({xmax} & 4294967295)) + 2147483648) & 4294967295) \
         - 2147483648))"
    )
}

impl CdcFeed {
    /// The table's side of a settlement's published rows: deleted (or marked). Returns those
    /// whose transactions the settle's snapshot did not see yet (see [`CdcFeed::settle_rows`]).
    /// Dead letters are recorded with the events left to the table ([`CdcFeed::restore`]).
    pub(super) async fn write_settlement(
        &self,
        settlement: &Settlement,
        xid_of: &HashMap<i64, i64>,
    ) -> Result<HashSet<i64>, StoreError> {
        let rows: Vec<(i64, i64)> = settlement
            .published
            .iter()
            .map(|id| (*id, xid_of.get(id).copied().unwrap_or_default()))
            .collect();
        self.settle_rows(&rows).await
    }

    /// Deletes (or marks) published rows; returns the ids of those whose inserting
    /// transaction was not visible yet, which are left for a later settle.
    ///
    /// The log hands a transaction out once its commit record is flushed, which is a moment
    /// before the server makes it visible to other sessions. A relay quick enough to publish
    /// and settle within that moment finds no row to delete, and the row would stay behind,
    /// published, for the polling relay to publish again and for the CDC relay's "behind the
    /// table" check to hold its aggregate (W3 in CDC mode left 4-21 rows per run so). So the
    /// rows the plain statement did not find are looked at again with their transactions
    /// ([`CdcFeed::settle_unseen`]): a row the producer deleted in its transaction is gone for
    /// good, a row of a transaction not visible yet is left for later
    /// ([`CdcFeed::settle_late`]), and its position is not confirmed before.
    pub(super) async fn settle_rows(
        &self,
        rows: &[(i64, i64)],
    ) -> Result<HashSet<i64>, StoreError> {
        if rows.is_empty() {
            return Ok(HashSet::new());
        }
        let sql = format!("{} RETURNING id", self.settle_write("$1"));
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let found: HashSet<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(&ids)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| store_error("settling published rows", e))?
            .into_iter()
            .collect();
        let unseen: Vec<(i64, i64)> = rows
            .iter()
            .filter(|r| !found.contains(&r.0))
            .copied()
            .collect();
        self.settle_unseen(&unseen).await
    }

    /// The statement that settles published rows whose ids are the array `ids`: deletes
    /// them, or marks the pending ones published ([`OnPublish`]).
    fn settle_write(&self, ids: &str) -> String {
        let s = self.schema.quoted();
        match self.on_publish {
            OnPublish::Delete => format!("DELETE FROM {s}.events WHERE id = ANY({ids})"),
            OnPublish::Mark => format!(
                "UPDATE {s}.events SET state = 'published', \
                 published_at = coalesce(published_at, now()) \
                 WHERE id = ANY({ids}) AND state = 'pending'"
            ),
        }
    }

    /// Rows the settle did not find: each is deleted (or marked) if the statement's snapshot
    /// sees its inserting transaction (it became visible meanwhile) and counts as settled
    /// either way then (a row of a visible transaction that is not there was deleted by its
    /// producer, or marked already); the ids of transactions still not visible are returned.
    async fn settle_unseen(&self, rows: &[(i64, i64)]) -> Result<HashSet<i64>, StoreError> {
        if rows.is_empty() {
            return Ok(HashSet::new());
        }
        let write = self.settle_write("ARRAY(SELECT id FROM r WHERE seen)");
        // One statement, so the write and the visibility check share the snapshot.
        let sql = format!(
            "WITH snap AS MATERIALIZED ( \
               SELECT pg_current_snapshot() AS s, \
                      pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS xmax), \
             r AS MATERIALIZED ( \
               SELECT u.id, pg_visible_in_snapshot({full}::text::xid8, snap.s) AS seen \
               FROM unnest($1::int8[], $2::int8[]) AS u(id, x), snap), \
             w AS ({write}) \
             SELECT id FROM r WHERE NOT seen",
            full = full_xid("u.x", "snap.xmax")
        );
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let xids: Vec<i64> = rows.iter().map(|r| r.1).collect();
        let late: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(&ids)
            .bind(&xids)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| store_error("settling published rows", e))?;
        Ok(late.into_iter().collect())
    }

    /// Settles the late rows ([`LogScheduler::late_rows`](super::LogScheduler::late_rows)) whose
    /// transactions are visible now.
    pub(super) async fn settle_late(&self, state: &mut State) -> Result<(), StoreError> {
        if state.log.late_rows().is_empty() {
            return Ok(());
        }
        let rows: Vec<(i64, i64)> = state
            .log
            .late_rows()
            .iter()
            .map(|l| (l.id, xid_param(l.source_tx)))
            .collect();
        let still = self.settle_rows(&rows).await?;
        state.log.late_settled(&still);
        Ok(())
    }

    /// Records the events left to the table
    /// ([`LogScheduler::restore_list`](super::LogScheduler::restore_list)), then counts them as
    /// settled: a dead letter's row is marked `dead` with its error; the row of an event that is
    /// gone from the table although its transaction is visible (its producer deleted it in the
    /// transaction, [`CdcConfig::producers_delete_rows`](super::CdcConfig::producers_delete_rows))
    /// is written back first, as the producer wrote it, `dead` or pending. An event whose
    /// transaction is not visible yet (its commit is in the log a moment before other sessions see
    /// it) stays in the list for the next call, and its position unconfirmed: without that check
    /// its dead letter would find no row, count as settled, and the row would stay pending unseen.
    /// On an error all stay in the list.
    pub(super) async fn restore(&self, state: &mut State) -> Result<(), StoreError> {
        if state.log.restore_list().is_empty() {
            return Ok(());
        }
        let (late, written) = self.leave_rows(state.log.restore_list()).await?;
        if written > 0
            && !self.config.producers_delete_rows
            && !self.told_rows_gone.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                rows = written,
                "streamed rows were gone from the outbox table although their transactions \
                 committed: the producers delete their rows in their transactions. The relay \
                 wrote them back (dead letters, events parked behind one); set \
                 relay.cdc_producers_delete_rows = true and grant the relay INSERT on the \
                 outbox table (docs/guide/src/security.md)"
            );
        }
        state.log.restored(&late);
        Ok(())
    }

    /// The statement of [`CdcFeed::restore`], in one snapshot. Returns the ids of events whose
    /// transactions are not visible yet, and how many rows were written back.
    pub(super) async fn leave_rows(
        &self,
        leaves: &[Leave<Row>],
    ) -> Result<(HashSet<i64>, i64), StoreError> {
        let rows: Vec<StoredRow> = leaves.iter().map(|l| l.event.row.stored()).collect();
        let col = |f: fn(&StoredRow) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
        // The state a row written back gets: a row that cannot be published would break the
        // table's constraint as a pending row, and can only end as a dead letter anyway.
        let insert_state: Vec<&str> = leaves
            .iter()
            .map(|l| match (&l.dead, &l.event.row) {
                (Some(_), _) | (None, Row::Unpublishable(_)) => "dead",
                (None, Row::Message(_)) => "pending",
            })
            .collect();
        let error: Vec<Option<String>> = leaves
            .iter()
            .map(|l| match (&l.dead, &l.event.row) {
                (Some(e), _) => Some(e.clone()),
                (None, Row::Unpublishable(u)) => Some(format!(
                    "cannot be published as stored: {}; correct the row, then requeue it",
                    u.row.reason
                )),
                (None, Row::Message(_)) => None,
            })
            .collect();
        let dead: Vec<bool> = leaves.iter().map(|l| l.dead.is_some()).collect();
        let s = self.schema.quoted();
        let sql = format!(
            "WITH snap AS MATERIALIZED ( \
               SELECT pg_current_snapshot() AS s, \
                      pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS xmax), \
             u AS MATERIALIZED ( \
               SELECT u.*, pg_visible_in_snapshot({full}::text::xid8, snap.s) AS seen \
               FROM unnest($1::int8[], $2::uuid[], $3::text[], $4::text[], $5::int8[], \
                 $6::text[], $7::int4[], $8::text[], $9::bytea[], $10::text[], $11::text[], \
                 $12::text[], $13::text[], $14::int4[], $15::text[], $16::text[], $17::bool[], \
                 $18::int8[]) \
                 AS u(id, event_id, aggregate_type, aggregate_id, aggregate_version, \
                 event_type, schema_version, content_type, payload, headers, destination, \
                 partition_key, created_at, attempts, state, last_error, dead, x), snap), \
             gone AS MATERIALIZED ( \
               SELECT u.* FROM u WHERE u.seen AND NOT EXISTS ( \
                 SELECT 1 FROM {s}.events e WHERE e.event_id = u.event_id)), \
             ins AS ( \
               INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, \
                 aggregate_version, event_type, schema_version, content_type, payload, \
                 headers, destination, partition_key, created_at, attempts, state, last_error) \
               SELECT coalesce(g.event_id, gen_random_uuid()), g.aggregate_type, \
                 g.aggregate_id, g.aggregate_version, coalesce(g.event_type, '(unreadable)'), \
                 coalesce(g.schema_version, 1), coalesce(g.content_type, \
                 'application/octet-stream'), coalesce(g.payload, ''::bytea), \
                 coalesce(g.headers, '{{}}')::jsonb, g.destination, g.partition_key, \
                 coalesce(g.created_at::timestamptz, now()), g.attempts, g.state, g.last_error \
               FROM gone g ORDER BY g.id \
               ON CONFLICT DO NOTHING RETURNING 1), \
             marked AS ( \
               UPDATE {s}.events e SET state = 'dead', attempts = u.attempts, \
                 last_error = u.last_error \
               FROM u WHERE u.seen AND u.dead AND e.event_id = u.event_id \
                 AND e.state = 'pending' RETURNING 1) \
             SELECT coalesce((SELECT array_agg(id) FROM u WHERE NOT seen), '{{}}'), \
               (SELECT count(*) FROM ins), (SELECT count(*) FROM marked)",
            full = full_xid("u.x", "snap.xmax")
        );
        let (late, written, _marked): (Vec<i64>, i64, i64) =
            sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(rows.iter().map(|r| r.id).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.event_id).collect::<Vec<_>>())
                .bind(col(|r| Some(r.aggregate_type.clone())))
                .bind(col(|r| Some(r.aggregate_id.clone())))
                .bind(rows.iter().map(|r| r.aggregate_version).collect::<Vec<_>>())
                .bind(col(|r| r.event_type.clone()))
                .bind(rows.iter().map(|r| r.schema_version).collect::<Vec<_>>())
                .bind(col(|r| r.content_type.clone()))
                .bind(rows.iter().map(|r| r.payload.clone()).collect::<Vec<_>>())
                .bind(col(|r| r.headers.clone()))
                .bind(col(|r| r.destination.clone()))
                .bind(col(|r| r.partition_key.clone()))
                .bind(col(|r| r.created_at.map(crate::cdc::pg_time_text)))
                .bind(rows.iter().map(|r| r.attempts).collect::<Vec<_>>())
                .bind(insert_state)
                .bind(error)
                .bind(dead)
                .bind(
                    leaves
                        .iter()
                        .map(|l| xid_param(l.event.source_tx))
                        .collect::<Vec<_>>(),
                )
                .fetch_one(&self.pool)
                .await
                .map_err(|e| store_error("recording events left to the table", e))?;
        Ok((late.into_iter().collect(), written))
    }

    /// Of the aggregates about to be handed out for the first time in this session, those
    /// with a lower version pending or dead in the table than the head the stream gives
    /// (a polling relay beside this one holds it, a requeue not seen yet): they wait for it,
    /// then for a new session's catch-up.
    ///
    /// Each comes with whether it is *blocked*: an older row is dead, or pending on a paused
    /// route (the catch-up leaves those), so only a requeue or a resume moves it; the others
    /// wait for the rows to be published.
    pub(super) async fn behind_the_table(
        &self,
        heads: &[(Aggregate, i64)],
    ) -> Result<HashMap<Aggregate, bool>, StoreError> {
        if heads.is_empty() {
            return Ok(HashMap::new());
        }
        let types: Vec<&str> = heads.iter().map(|((t, _), _)| t.as_str()).collect();
        let ids: Vec<&str> = heads.iter().map(|((_, i), _)| i.as_str()).collect();
        let versions: Vec<i64> = heads.iter().map(|(_, v)| *v).collect();
        let s = self.schema.quoted();
        let rows: Vec<(String, String, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT h.t, h.i, bool_or(e.state = 'dead' OR {paused}) \
             FROM unnest($1::text[], $2::text[], $3::int8[]) AS h(t, i, v) \
             JOIN {s}.events e ON e.aggregate_type = h.t AND e.aggregate_id = h.i \
               AND e.aggregate_version < h.v AND e.state IN ('pending', 'dead') \
             GROUP BY h.t, h.i",
            paused = self.paused_sql("e."),
        )))
        .bind(&types)
        .bind(&ids)
        .bind(&versions)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| store_error("checking for older pending versions", e))?;
        Ok(rows.into_iter().map(|(t, i, b)| ((t, i), b)).collect())
    }

    /// Whether the events row `alias` (`"e."`) is on a paused route.
    fn paused_sql(&self, alias: &str) -> String {
        format!(
            "EXISTS (SELECT 1 FROM {}.pauses z WHERE z.kind = 'route' AND z.name = {})",
            self.schema.quoted(),
            crate::sql::route_key(alias)
        )
    }

    /// Of the parked aggregates none of whose events waits to be recorded in the table, those that
    /// are no longer blocked (no dead row, no pending row on a paused route): a requeue or a resume
    /// whose wake-up this feed missed. Looked at every [`PARKED_RECHECK`](super::PARKED_RECHECK).
    pub(super) async fn unblocked(&self, state: &State) -> Result<Vec<Aggregate>, StoreError> {
        let parked = state.log.parked_settled();
        if parked.is_empty() {
            return Ok(Vec::new());
        }
        let types: Vec<&str> = parked.iter().map(|(t, _)| t.as_str()).collect();
        let ids: Vec<&str> = parked.iter().map(|(_, i)| i.as_str()).collect();
        let s = self.schema.quoted();
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT h.t, h.i FROM unnest($1::text[], $2::text[]) AS h(t, i) \
             WHERE NOT EXISTS (SELECT 1 FROM {s}.events e WHERE e.aggregate_type = h.t \
               AND e.aggregate_id = h.i \
               AND (e.state = 'dead' OR (e.state = 'pending' AND {paused})))",
            paused = self.paused_sql("e."),
        )))
        .bind(&types)
        .bind(&ids)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| store_error("looking at the parked aggregates", e))
    }

    /// Whether a head the catch-up must publish is left at or below `ceiling`: a pending row
    /// with no unpublished earlier version of its aggregate (the claim's heads; rows behind a
    /// dead letter are not heads) and not on a paused route (those wait for a requeue or a
    /// resume, which start a new catch-up). Heads held by another relay's lease or in backoff
    /// count: the catch-up waits for them.
    pub(super) async fn pending_up_to(&self, ceiling: i64) -> Result<bool, StoreError> {
        let s = self.schema.quoted();
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT EXISTS (SELECT 1 FROM {s}.events e WHERE e.state = 'pending' AND e.id <= $1 \
               AND NOT EXISTS (SELECT 1 FROM {s}.events p \
                 WHERE p.aggregate_type = e.aggregate_type AND p.aggregate_id = e.aggregate_id \
                   AND p.aggregate_version < e.aggregate_version AND p.state <> 'published') \
               AND NOT EXISTS (SELECT 1 FROM {s}.pauses z WHERE z.kind = 'route' \
                 AND z.name = {key}))",
            key = crate::sql::route_key("e.")
        )))
        .bind(ceiling)
        .fetch_one(&self.pool)
        .await
        .map_err(|e| store_error("looking for rows left to catch up", e))
    }
}
