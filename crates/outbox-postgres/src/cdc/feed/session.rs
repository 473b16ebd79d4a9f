//! The stream sessions of [`CdcFeed`]: a session's start (or a standby's wait for the slot),
//! its catch-up from the table, reading the stream, and the session's end.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use outbox_core::relay::log::LogBatch;
use outbox_core::relay::{Feed as _, FeedBatch, PollingFeed};
use outbox_core::{StoreError, StoreErrorKind};

use super::row::log_event;
use super::{CatchUp, CdcFeed, CdcTicket, STANDBY_RETRY, State, cdc_error};
use crate::cdc::{CdcError, CdcStream};
use crate::error::store_error;
use crate::store::{PgStore, PgStoreConfig};

impl CdcFeed {
    /// Starts the stream if it is not running, with the parked aggregates read from the table.
    pub(super) async fn ensure_stream(&self, state: &mut State) -> Result<bool, StoreError> {
        if state.stream.is_some() {
            return Ok(true);
        }
        if state.retry_at.is_some_and(|at| Instant::now() < at) {
            // A standby: try before the retry's time once the slot is free.
            let streamed: Result<Option<bool>, sqlx::Error> =
                sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
                    .bind(self.config.slot_name(&self.schema))
                    .fetch_optional(&self.pool)
                    .await;
            if !matches!(streamed, Ok(Some(false))) {
                return Ok(false);
            }
        }
        let stream = match CdcStream::start(&self.url, &self.schema, &self.config).await {
            Ok(stream) => stream,
            // Another relay streams the slot: wait as a standby, quietly, and try again.
            Err(e @ CdcError::SlotBusy { .. }) => {
                if state.standby_since.is_none() {
                    tracing::info!(error = %e, "waiting as a standby until the slot is free");
                    state.standby_since = Some(Instant::now());
                }
                state.retry_at = Some(Instant::now() + STANDBY_RETRY);
                return Ok(false);
            }
            Err(e) => return Err(cdc_error(e)),
        };
        // The catch-up's ceiling: the table's last row now. Everything committed before the
        // stream's start that is still pending lies at or below it.
        self.store.listen().await;
        let ceiling: i64 = match sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT coalesce(max(id), 0) FROM {}.events",
            self.schema.quoted()
        )))
        .fetch_one(&self.pool)
        .await
        {
            Ok(ceiling) => ceiling,
            Err(e) => {
                let _ = stream.stop().await;
                return Err(store_error("reading the catch-up's ceiling", e));
            }
        };
        match state.standby_since {
            Some(since) => tracing::info!(
                slot = stream.slot(),
                waited_secs = since.elapsed().as_secs_f64(),
                "streaming the replication slot: took over from the relay that held it"
            ),
            None => tracing::info!(slot = stream.slot(), "streaming the replication slot"),
        }
        state.reset();
        self.following.store(false, Ordering::Relaxed);
        // Read again at the catch-up's end (a requeue may have emptied some).
        state.log.clear_parked();
        if let Err(e) = self.read_pauses(state).await {
            let _ = stream.stop().await;
            return Err(e);
        }
        state.stream = Some(stream);
        state.rescans = self.store.rescans();
        let mut store = PgStore::new(
            self.pool.clone(),
            PgStoreConfig {
                schema: self.schema.clone(),
                on_publish: self.on_publish,
            },
        )
        .with_claim_ceiling(ceiling);
        if let Some(session) = self.store.session() {
            store = store.with_session(session.clone());
        }
        state.catch_up = Some(CatchUp {
            feed: Arc::new(PollingFeed::new(
                Arc::new(store),
                self.claims.0,
                self.claims.1,
            )),
            ceiling,
            started: Instant::now(),
            published: 0,
        });
        Ok(true)
    }

    /// Reads the paused routes into the scheduler: what the log brings of them is left pending
    /// in the table ([`LogScheduler::set_paused_routes`](super::LogScheduler::set_paused_routes)),
    /// as the catch-up's claims leave theirs.
    pub(super) async fn read_pauses(&self, state: &mut State) -> Result<(), StoreError> {
        let routes: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT name FROM {}.pauses WHERE kind = 'route'",
            self.schema.quoted()
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| store_error("reading the paused routes", e))?;
        if state.log.set_paused_routes(routes) {
            tracing::info!(
                "a route was paused: what the log brings of it is left pending in the table \
                 until it is resumed"
            );
        }
        state.pauses_read = Some(Instant::now());
        Ok(())
    }

    /// The catch-up's next batch (`None` when it has none now), or its end: once a claim
    /// finds nothing, no batch of it is out, and no pending row at or below the ceiling is
    /// left that could be published (rows behind a dead letter and rows of a paused route
    /// wait), the parked aggregates are read, and the stream is read from then on.
    pub(super) async fn catch_up(
        &self,
        state: &mut State,
        max_rows: usize,
    ) -> Result<Option<FeedBatch<CdcTicket>>, StoreError> {
        let Some(catch_up) = state.catch_up.as_ref() else {
            return Ok(None);
        };
        let (feed, ceiling) = (Arc::clone(&catch_up.feed), catch_up.ceiling);
        let batch = feed.next_batch(max_rows).await?;
        if !batch.messages.is_empty() || !batch.undecodable.is_empty() {
            state.catch_up_out += 1;
            return Ok(Some(FeedBatch {
                ticket: CdcTicket {
                    table: Some((batch.ticket, feed)),
                    log: LogBatch::empty(state.log.session()),
                },
                messages: batch.messages,
                owned_until: batch.owned_until,
                takeovers: batch.takeovers,
                undecodable: batch.undecodable,
                liveness: batch.liveness,
            }));
        }
        if state.catch_up_out > 0 || self.pending_up_to(ceiling).await? {
            return Ok(None);
        }
        let parked: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT DISTINCT aggregate_type, aggregate_id FROM {}.events WHERE state = 'dead'",
            self.schema.quoted()
        )))
        .fetch_all(&self.pool)
        .await
        .map_err(|e| store_error("reading parked aggregates", e))?;
        let until: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text")
            .fetch_one(&self.pool)
            .await
            .map_err(|e| store_error("reading the log's position", e))?;
        let until = crate::cdc::parse_lsn(&until).map_err(cdc_error)?;
        state.log.caught_up(parked, until);
        self.following.store(true, Ordering::Relaxed);
        if let Some(done) = state.catch_up.take()
            && done.published > 0
        {
            tracing::info!(
                events = done.published,
                secs = done.started.elapsed().as_secs_f64(),
                "caught up: events pending in the table when the stream started are published; \
                 following the log"
            );
        }
        Ok(None)
    }

    /// Reads what the stream has: waits up to `wait` for the first event, then takes what
    /// follows at once, until `max_rows` events wait; never past
    /// [`CdcConfig::max_rows_in_memory`](super::CdcConfig::max_rows_in_memory) held events.
    pub(super) async fn pull(
        &self,
        state: &mut State,
        wait: Duration,
        max_rows: usize,
    ) -> Result<(), StoreError> {
        let mut wait = wait;
        loop {
            if self.memory_full(state) {
                return Ok(());
            }
            let Some(stream) = state.stream.as_mut() else {
                return Ok(());
            };
            let next = match tokio::time::timeout(wait, stream.next()).await {
                Err(_) => return Ok(()),
                Ok(Ok(Some(event))) => event,
                Ok(Ok(None)) => {
                    state.reset();
                    return Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "the replication stream ended; it is started again",
                    ));
                }
                Ok(Err(e)) => {
                    state.reset();
                    return Err(cdc_error(e));
                }
            };
            state.log.receive(log_event(next));
            if state.log.waiting_count() >= max_rows {
                return Ok(());
            }
            // The rest: only what the connection has already buffered. Waiting for more here
            // would add that wait to every event of a steady trickle.
            wait = Duration::ZERO;
        }
    }

    /// The events held reached
    /// [`CdcConfig::max_rows_in_memory`](super::CdcConfig::max_rows_in_memory): the stream is not
    /// read until some are settled. The highest count seen is kept
    /// ([`CdcFeed::peak_rows_in_memory`]).
    pub(super) fn memory_full(&self, state: &State) -> bool {
        let held = state.log.held();
        self.peak_held.fetch_max(held, Ordering::Relaxed);
        held >= self.config.max_rows_in_memory.max(1)
    }

    /// Ends the stream session: the position confirmed so far is sent, the stream closed, and
    /// everything in memory dropped; the next batch starts a new session (and its catch-up).
    pub(super) async fn end_session(&self, state: &mut State) {
        self.confirm(state);
        if let Some(stream) = state.stream.take()
            && let Err(e) = stream.stop().await
        {
            tracing::warn!(error = %e, "stopping the stream");
        }
        state.reset();
        self.following.store(false, Ordering::Relaxed);
    }
}
