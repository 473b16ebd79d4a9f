//! Heartbeats on PostgreSQL: the core's [`Heartbeat`](outbox_core::heartbeat) loop writing
//! `{schema}.instances` and `{schema}.activity` through [`PgStore`] (the console's overview;
//! [`crate::admin`]).
//!
//! `outbox relay` and `outbox effects run` run one. A service that embeds a consumer (or a
//! relay) starts its own:
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool, shutdown: tokio_util::sync::CancellationToken) {
//! use outbox_postgres::heartbeat::{Heartbeat, InstanceKind};
//! use outbox_postgres::{PgStore, Schema};
//! # fn consumer() -> std::sync::Arc<outbox_core::consumer::ConsumerStats> { unimplemented!() }
//! // `consumer.stats()` of the service's `PgConsumer`: its lag and throughput on the console.
//! let store = PgStore::with_schema(pool, Schema::default());
//! let beat = Heartbeat::new(store, InstanceKind::Consumer, "ledger")
//!     .expect("a valid name")
//!     .with_consumer(consumer());
//! tokio::spawn(beat.run(shutdown));
//! # }
//! ```
//!
//! What a beat writes, how often, and how an operator reads it: [`outbox_core::heartbeat`].
//! Here each beat is one upsert of the process's `instances` row, and one statement writing
//! its activity into this minute's `activity` rows: what it published or consumed since the
//! last beat added to `publish` and `consume` rows, and the levels it read (a relay's backlog,
//! a consumer's lag) kept as the highest reading in `lag`, `oldest_pending_age` and
//! `dead_letters` rows (the same table, `count` holding the reading); a relay's sweep deletes
//! `instances` rows a day old and `activity` rows two hours old.

use outbox_core::StoreError;
use outbox_core::heartbeat::{ActivityEntry, Beat, HeartbeatStore};
use outbox_core::operator::ActivityKind;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::error::store_error;
use crate::store::PgStore;

pub use outbox_core::heartbeat::{HEALTH, InstanceKind, InvalidName, route_key};

/// A process's heartbeat written to PostgreSQL.
pub type Heartbeat = outbox_core::heartbeat::Heartbeat<PgStore>;

const BEAT: &str = "INSERT INTO {s}.instances (instance_id, kind, name, host, pid, version, \
    interval_ms, stats) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
    ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = now(), stats = EXCLUDED.stats, \
    stopped_at = NULL";

/// This minute's activity rows: work counted adds up, a level (`$4`: the level kinds) keeps
/// the highest reading; entries of one kind and name are merged the same way first (one
/// INSERT may not update a row twice).
const ACTIVITY: &str = "INSERT INTO {s}.activity AS a (minute, kind, name, count) \
    SELECT date_trunc('minute', now()), k, n, \
      CASE WHEN k = ANY($4::text[]) THEN max(v) ELSE sum(v)::int8 END \
    FROM UNNEST($1::text[], $2::text[], $3::int8[]) AS u(k, n, v) GROUP BY k, n \
    ON CONFLICT (minute, kind, name) DO UPDATE SET count = CASE \
      WHEN a.kind = ANY($4::text[]) THEN GREATEST(a.count, EXCLUDED.count) \
      ELSE a.count + EXCLUDED.count END";

const STOPPED: &str = "UPDATE {s}.instances SET stopped_at = now(), heartbeat_at = now(), \
    stats = $2 WHERE instance_id = $1";

const SWEEP_INSTANCES: &str =
    "DELETE FROM {s}.instances WHERE heartbeat_at < now() - interval '1 day'";
const SWEEP_ACTIVITY: &str = "DELETE FROM {s}.activity WHERE minute < now() - interval '2 hours'";

impl HeartbeatStore for PgStore {
    async fn beat(&self, beat: &Beat<'_>) -> Result<(), StoreError> {
        sqlx::query(AssertSqlSafe(self.schema().render(BEAT)))
            .bind(beat.instance_id)
            .bind(beat.kind.as_str())
            .bind(beat.name)
            .bind(beat.host)
            .bind(beat.pid)
            .bind(beat.version)
            .bind(beat.interval_ms)
            .bind(&beat.stats)
            .execute(self.pool())
            .await
            .map_err(|e| store_error("writing the heartbeat", e))?;
        Ok(())
    }

    async fn add_activity(&self, entries: Vec<ActivityEntry>) -> Result<(), StoreError> {
        let kinds: Vec<&str> = entries.iter().map(|e| e.kind.as_str()).collect();
        let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        let values: Vec<i64> = entries.iter().map(|e| e.value).collect();
        let levels: Vec<&str> = ActivityKind::ALL
            .into_iter()
            .filter(|k| k.is_level())
            .map(ActivityKind::as_str)
            .collect();
        sqlx::query(AssertSqlSafe(self.schema().render(ACTIVITY)))
            .bind(kinds)
            .bind(names)
            .bind(values)
            .bind(levels)
            .execute(self.pool())
            .await
            .map_err(|e| store_error("writing the activity", e))?;
        Ok(())
    }

    async fn stopped(&self, instance_id: Uuid, stats: serde_json::Value) -> Result<(), StoreError> {
        sqlx::query(AssertSqlSafe(self.schema().render(STOPPED)))
            .bind(instance_id)
            .bind(stats)
            .execute(self.pool())
            .await
            .map_err(|e| store_error("recording the stop", e))?;
        Ok(())
    }

    async fn sweep(&self) -> Result<(), StoreError> {
        for sweep in [SWEEP_INSTANCES, SWEEP_ACTIVITY] {
            sqlx::query(AssertSqlSafe(self.schema().render(sweep)))
                .execute(self.pool())
                .await
                .map_err(|e| store_error("sweeping old heartbeats", e))?;
        }
        Ok(())
    }
}
