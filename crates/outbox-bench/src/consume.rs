//! Consumer-side pieces shared by W3 and W4: the effect handler, timing decorators around a
//! [`DeliverySource`] and its deliveries, the baseline consumer loop *without* the inbox, the
//! preload publisher and the per-transport sources.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use chrono::Utc;
use futures::StreamExt;
use outbox_core::consumer::{Delivery, DeliverySource, SourceError};
use outbox_core::consumer::{Handler, HandlerError};
use outbox_core::{IncomingEvent, OutboxMessage, Payload, Transport};
use outbox_testkit::tap::{Tap, Tapped};
use sqlx::{Acquire, AssertSqlSafe, PgConnection, PgPool};

use crate::common::{payment_body, synthetic_message};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `CREATE TABLE <schema>.report`: the handler's effect, one row per event.
pub async fn create_report_table(pool: &PgPool, schema: &str) -> Result<()> {
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {schema}.report (event_id uuid PRIMARY KEY, aggregate_id text NOT NULL, \
         amount bigint NOT NULL, applied_at timestamptz NOT NULL)"
    )))
    .execute(pool)
    .await?;
    Ok(())
}

/// Time spent inside the handler.
#[derive(Default)]
pub struct HandlerStats {
    pub calls: AtomicU64,
    pub nanos: AtomicU64,
}

impl HandlerStats {
    pub fn total(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

/// The effect used by every variant (with and without the inbox): parse the JSON payload and
/// `INSERT` one `report` row stamped with `clock_timestamp()`. With `many`, the engine's batch
/// call (`Handler::handle_many`) writes a batch's rows with one `INSERT … SELECT FROM UNNEST`;
/// otherwise it is the trait's default, one `INSERT` per event.
#[derive(Clone)]
pub struct ReportHandler {
    insert: Arc<str>,
    insert_many: Option<Arc<str>>,
    pub stats: Arc<HandlerStats>,
}

impl ReportHandler {
    pub fn new(schema: &str) -> Self {
        Self {
            insert: format!(
                "INSERT INTO {schema}.report (event_id, aggregate_id, amount, applied_at) \
                 VALUES ($1, $2, $3, clock_timestamp())"
            )
            .into(),
            insert_many: None,
            stats: Arc::default(),
        }
    }

    /// The same effect, a batch's rows written by one statement.
    pub fn many(schema: &str) -> Self {
        Self {
            insert_many: Some(
                format!(
                    "INSERT INTO {schema}.report (event_id, aggregate_id, amount, applied_at) \
                     SELECT u.*, clock_timestamp() \
                     FROM UNNEST($1::uuid[], $2::text[], $3::int8[]) AS u"
                )
                .into(),
            ),
            ..Self::new(schema)
        }
    }
}

fn amount(event: &IncomingEvent) -> Result<i64, HandlerError> {
    let body: serde_json::Value = serde_json::from_slice(&event.payload.bytes)
        .map_err(|e| HandlerError::Permanent(format!("payload is not JSON: {e}")))?;
    Ok(body["amount"].as_i64().unwrap_or(0))
}

impl Handler<PgConnection> for ReportHandler {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        let t = Instant::now();
        sqlx::query(AssertSqlSafe(Arc::clone(&self.insert)))
            .bind(event.event_id)
            .bind(&event.aggregate_id)
            .bind(amount(event)?)
            .execute(&mut *tx)
            .await?;
        let s = &self.stats;
        s.calls.fetch_add(1, Ordering::Relaxed);
        s.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    async fn handle_many(
        &self,
        tx: &mut PgConnection,
        events: &[&IncomingEvent],
    ) -> Result<(), HandlerError> {
        let Some(insert) = &self.insert_many else {
            for event in events {
                self.handle(tx, event).await?;
            }
            return Ok(());
        };
        let t = Instant::now();
        let ids: Vec<uuid::Uuid> = events.iter().map(|e| e.event_id).collect();
        let aggregates: Vec<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
        let amounts = events
            .iter()
            .map(|e| amount(e))
            .collect::<Result<Vec<i64>, _>>()?;
        sqlx::query(AssertSqlSafe(Arc::clone(insert)))
            .bind(&ids)
            .bind(&aggregates)
            .bind(&amounts)
            .execute(&mut *tx)
            .await?;
        let s = &self.stats;
        s.calls.fetch_add(events.len() as u64, Ordering::Relaxed);
        s.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Accumulated per-batch timings of a consumer loop (runner or baseline), seen from the
/// source: `fetch` = inside `next_batch` (non-empty batches), `work` = from the batch's
/// arrival to the first ack call of one of its deliveries (transaction: inbox SQL, handlers,
/// savepoints, commit), `settle` = from that ack call to the next `next_batch` call (acks,
/// loop overhead). When the acks are sent beside the next batch (`Consumer::run`) and none
/// was called before the next `next_batch`, the whole gap counts as `work`.
#[derive(Default, Clone)]
pub struct SourceAcc {
    pub batches: usize,
    pub deliveries: usize,
    pub empty: usize,
    pub empty_wait: Duration,
    /// Longest single `next_batch` call (empty or not).
    pub fetch_max: Duration,
    pub fetch: Duration,
    pub work: Duration,
    pub settle: Duration,
    pub ack_us: Vec<u32>,
    pub nacks: usize,
    last_fetched: Option<Instant>,
    first_ack: Option<Instant>,
    /// Non-empty batches handed out so far: the batch a delivery belongs to.
    seq: u64,
}

/// What a [`TimedSource`] saw.
#[derive(Default)]
pub struct SourceStats {
    acc: Mutex<SourceAcc>,
    pub acked: AtomicU64,
    /// When `ack` was called, by event id (recorded with `record_ack_times`).
    ack_at: Mutex<HashMap<uuid::Uuid, Instant>>,
    record_ack_times: bool,
}

impl SourceStats {
    pub fn new(record_ack_times: bool) -> Arc<Self> {
        Arc::new(Self {
            record_ack_times,
            ..Self::default()
        })
    }

    fn close_batch(acc: &mut SourceAcc, now: Instant) {
        if let Some(f) = acc.last_fetched.take() {
            let a = acc.first_ack.take().unwrap_or(now);
            acc.work += a.saturating_duration_since(f);
            acc.settle += now.saturating_duration_since(a);
        }
    }

    /// Closes the last batch at `now` and returns the totals.
    pub fn finish(&self, now: Instant) -> SourceAcc {
        let mut acc = self.acc.lock().unwrap();
        Self::close_batch(&mut acc, now);
        acc.clone()
    }

    pub fn take_ack_times(&self) -> HashMap<uuid::Uuid, Instant> {
        std::mem::take(&mut *self.ack_at.lock().unwrap())
    }
}

/// A [`DeliverySource`] that times the inner one and the acks of its deliveries.
pub type TimedSource<S> = Tapped<S, SourceStats>;

impl Tap for SourceStats {
    /// The batch a delivery belongs to.
    type Mark = u64;

    fn fetching(&self) {
        Self::close_batch(&mut self.acc.lock().unwrap(), Instant::now());
    }

    fn fetched<D: Delivery>(&self, started: Instant, batch: &[D]) -> Vec<u64> {
        let now = Instant::now();
        let mut acc = self.acc.lock().unwrap();
        acc.fetch_max = acc.fetch_max.max(now - started);
        if batch.is_empty() {
            acc.empty += 1;
            acc.empty_wait += now - started;
        } else {
            acc.batches += 1;
            acc.deliveries += batch.len();
            acc.fetch += now - started;
            acc.last_fetched = Some(now);
            acc.seq += 1;
        }
        vec![acc.seq; batch.len()]
    }

    fn acking<D: Delivery>(&self, batch: &u64, delivery: &D) {
        let now = Instant::now();
        {
            let mut acc = self.acc.lock().unwrap();
            if acc.seq == *batch && acc.last_fetched.is_some() {
                acc.first_ack.get_or_insert(now);
            }
        }
        if self.record_ack_times
            && let Ok(e) = delivery.event()
        {
            self.ack_at.lock().unwrap().insert(e.event_id, now);
        }
    }

    fn acked(&self, _batch: u64, took: Duration, result: &Result<(), SourceError>) {
        let us = u32::try_from(took.as_micros()).unwrap_or(u32::MAX);
        self.acc.lock().unwrap().ack_us.push(us);
        if result.is_ok() {
            self.acked.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn nacking(&self, _batch: u64) {
        self.acc.lock().unwrap().nacks += 1;
    }
}

/// Per-batch split of one consumer phase, for the "where the time goes" tables.
#[derive(Debug, Clone, Default)]
pub struct ConsumerSplit {
    pub batches: usize,
    pub empty: usize,
    pub per_batch: f64,
    pub fetch_ms: f64,
    pub work_ms: f64,
    pub handler_ms: f64,
    pub settle_ms: f64,
    pub empty_wait_ms_total: f64,
    pub fetch_max_ms: f64,
    pub ack_ms_p50: f64,
    pub ack_ms_p99: f64,
    pub nacks: usize,
}

pub fn split(acc: &SourceAcc, handler: &HandlerStats) -> ConsumerSplit {
    let b = acc.batches.max(1) as f64;
    let mut ack: Vec<f64> = acc.ack_us.iter().map(|u| f64::from(*u) / 1e3).collect();
    ack.sort_by(f64::total_cmp);
    ConsumerSplit {
        batches: acc.batches,
        empty: acc.empty,
        per_batch: acc.deliveries as f64 / b,
        fetch_ms: ms(acc.fetch) / b,
        work_ms: ms(acc.work) / b,
        handler_ms: ms(handler.total()) / b,
        settle_ms: ms(acc.settle) / b,
        empty_wait_ms_total: ms(acc.empty_wait),
        fetch_max_ms: ms(acc.fetch_max),
        ack_ms_p50: crate::common::percentile(&ack, 0.5),
        ack_ms_p99: crate::common::percentile(&ack, 0.99),
        nacks: acc.nacks,
    }
}

/// The baseline consumer: the same source and handler, **no inbox**. Per batch of up to
/// `batch_size` deliveries: begin, the handler for each (inside its own savepoint with
/// `savepoints`), commit, then ack all of them concurrently (as `run_batch` does). Returns when
/// `n` events were applied and acknowledged.
#[allow(clippy::too_many_arguments)]
pub async fn baseline_drain<S: DeliverySource>(
    pool: &PgPool,
    source: &mut S,
    handler: &ReportHandler,
    batch_size: usize,
    batch_wait: Duration,
    savepoints: bool,
    n: usize,
    timeout: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    let mut applied = 0;
    while applied < n {
        if started.elapsed() > timeout {
            bail!("baseline drain timed out after {timeout:?}: {applied} of {n} applied");
        }
        let deliveries = source.next_batch(batch_size, batch_wait).await?;
        if deliveries.is_empty() {
            continue;
        }
        let mut tx = pool.begin().await?;
        for d in &deliveries {
            let event = d
                .event()
                .as_ref()
                .map_err(|e| anyhow!("malformed delivery: {e}"))?;
            if savepoints && deliveries.len() > 1 {
                let mut sp = tx.begin().await?;
                handler
                    .handle(&mut sp, event)
                    .await
                    .map_err(|e| anyhow!("{e}"))?;
                sp.commit().await?;
            } else {
                handler
                    .handle(&mut tx, event)
                    .await
                    .map_err(|e| anyhow!("{e}"))?;
            }
        }
        tx.commit().await?;
        applied += deliveries.len();
        for r in futures::future::join_all(deliveries.into_iter().map(Delivery::ack)).await {
            r?;
        }
    }
    Ok(started.elapsed())
}

/// `n` synthetic events (fresh ids, one aggregate each, version 1, ~300-byte JSON).
pub fn synthetic_events(tag: &str, n: usize) -> Vec<OutboxMessage> {
    let now = Utc::now();
    (0..n)
        .map(|i| {
            let id = format!("{tag}-{i:06}");
            let amount = 100 + (i as i64 % 900);
            let payload = Payload::bytes("application/json", payment_body(&id, amount));
            synthetic_message(i as i64 + 1, id, 1, payload, now)
        })
        .collect()
}

/// Publishes `msgs` with the real transport (confirmed), at most `window` outstanding.
pub async fn preload<T: Transport>(
    transport: &T,
    msgs: &[OutboxMessage],
    window: usize,
) -> Result<Duration> {
    let started = Instant::now();
    let results: Vec<_> = futures::stream::iter(msgs.iter())
        .map(|m| transport.publish(m))
        .buffer_unordered(window)
        .collect()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
        bail!("{failed} preload publishes failed, first: {e}");
    }
    Ok(started.elapsed())
}
