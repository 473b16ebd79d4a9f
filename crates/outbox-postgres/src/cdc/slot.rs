//! The publication and the replication slot: their set-up, state and removal, and the
//! heartbeats that let an idle outbox's slot advance.

use std::time::Duration;

use pgwire_replication::Lsn;
use sqlx::PgPool;

use super::{CdcError, TABLE};
use crate::schema::{Schema, quote_ident};

/// Whether the publication `name` publishes `<schema>.events` (what a CDC relay checks at its
/// start).
///
/// # Errors
/// [`CdcError::Database`] when the catalogue cannot be read.
pub async fn publication_exists(
    pool: &PgPool,
    schema: &Schema,
    name: &str,
) -> Result<bool, CdcError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_publication_tables \
         WHERE pubname = $1 AND schemaname = $2 AND tablename = $3)",
    )
    .bind(name)
    .bind(schema.as_str())
    .bind(TABLE)
    .fetch_one(pool)
    .await?)
}

/// Creates the publication of inserts on `<schema>.events` named `name` if it does not exist.
/// Returns whether it was created.
///
/// # Errors
/// [`CdcError::Database`] when the statement fails (for instance the role lacks `CREATE` on the
/// database), [`CdcError::Config`] when a publication of that name exists but does not publish
/// the outbox table's inserts.
pub async fn ensure_publication(
    pool: &PgPool,
    schema: &Schema,
    name: &str,
) -> Result<bool, CdcError> {
    let existing: Option<(bool, bool)> = sqlx::query_as(
        "SELECT p.pubinsert, EXISTS (SELECT 1 FROM pg_publication_tables t \
           WHERE t.pubname = p.pubname AND t.schemaname = $2 AND t.tablename = $3) \
         FROM pg_publication p WHERE p.pubname = $1",
    )
    .bind(name)
    .bind(schema.as_str())
    .bind(TABLE)
    .fetch_optional(pool)
    .await?;
    match existing {
        Some((true, true)) => Ok(false),
        Some(_) => Err(CdcError::Config(format!(
            "publication `{name}` exists but does not publish inserts on {schema}.{TABLE}"
        ))),
        None => {
            let sql = format!(
                "CREATE PUBLICATION {} FOR TABLE {}.{TABLE} WITH (publish = 'insert')",
                quote_ident(name),
                schema.quoted()
            );
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await?;
            Ok(true)
        }
    }
}

/// Drops the publication `name` if it exists.
///
/// # Errors
/// [`CdcError::Database`] when the statement fails.
pub async fn drop_publication(pool: &PgPool, name: &str) -> Result<(), CdcError> {
    let sql = format!("DROP PUBLICATION IF EXISTS {}", quote_ident(name));
    sqlx::query(sqlx::AssertSqlSafe(sql)).execute(pool).await?;
    Ok(())
}

/// Creates the `pgoutput` slot `slot` if it does not exist, or replaces it if the server
/// invalidated it (`wal_status = 'lost'`: it can never be streamed again, and keeping it only
/// keeps the relay failing). Returns whether a slot was created: a new slot starts at the
/// current end of the log, so only events committed after this call are streamed (the polling
/// relay, or the recovery, publishes older ones). A slot that can still be streamed is kept as
/// it is, and so is one another relay created or replaced at the same moment (then `false`).
///
/// # Errors
/// [`CdcError::WalLevel`] when the server does not run with `wal_level = logical`,
/// [`CdcError::Config`] for an invalid slot name or a slot of another plugin,
/// [`CdcError::Database`] when a statement fails (no free slot, no `REPLICATION` right, an
/// invalidated slot that a connection still holds).
pub async fn create_slot(pool: &PgPool, slot: &str) -> Result<bool, CdcError> {
    check_slot_name(slot)?;
    let level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(pool)
        .await?;
    if level != "logical" {
        return Err(CdcError::WalLevel { found: level });
    }
    let existing: Option<(Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT plugin::text, wal_status FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await?;
    match existing {
        Some((Some(plugin), status)) if plugin == "pgoutput" => {
            if status.as_deref() != Some("lost") {
                return Ok(false);
            }
            tracing::warn!(%slot, "replacing the invalidated replication slot: events committed \
                since its last confirmed position are only in the table now; run the polling \
                relay to publish them (docs/guide/src/relay.md, \"a lost slot\")");
            // Only while it is still the lost one: a relay started beside this one may have
            // replaced it already, and its new slot must stay.
            sqlx::query(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND wal_status = 'lost'",
            )
            .bind(slot)
            .execute(pool)
            .await?;
        }
        Some((other, _)) => {
            return Err(CdcError::Config(format!(
                "replication slot `{slot}` exists with plugin {other:?}, not pgoutput"
            )));
        }
        None => {}
    }
    match sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(slot)
        .execute(pool)
        .await
    {
        Ok(_) => Ok(true),
        // Created by another relay in the meantime (duplicate_object): that one is kept.
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42710") => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Drops the slot `slot` if it exists (it must not be streamed at that moment).
///
/// # Errors
/// [`CdcError::Database`] when the statement fails (for instance the slot is active).
pub async fn drop_slot(pool: &PgPool, slot: &str) -> Result<(), CdcError> {
    sqlx::query(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name = $1",
    )
    .bind(slot)
    .execute(pool)
    .await?;
    Ok(())
}

/// Takes CDC down for a schema: ends the connection streaming slot `slot` if there is one
/// (the server terminates its WAL sender), drops the slot, then the publication. For
/// decommissioning CDC and for tests; a relay still running on the slot stops with "slot
/// dropped". Waits at most `wait` for a WAL sender to let go of the slot.
///
/// # Errors
/// [`CdcError::Database`] when a statement fails or the slot is still held after `wait`.
pub async fn remove(
    pool: &PgPool,
    slot: &str,
    publication: &str,
    wait: Duration,
) -> Result<(), CdcError> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active",
        )
        .bind(slot)
        .execute(pool)
        .await?;
        match drop_slot(pool, slot).await {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    drop_publication(pool, publication).await
}

pub(super) fn check_slot_name(slot: &str) -> Result<(), CdcError> {
    let ok = !slot.is_empty()
        && slot.len() <= 63
        && slot
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(CdcError::Config(format!(
            "invalid replication slot name `{slot}`: lower-case letters, digits and `_`, at most \
             63"
        )))
    }
}

/// The prefix of the logical messages [`heartbeat`] writes.
pub const HEARTBEAT_PREFIX: &str = "outbox.heartbeat";

/// Writes a heartbeat into the log (a non-transactional logical message, nothing in any table) and
/// returns its position. A stream that receives it with nothing outstanding reports it as
/// [`CdcEvent::Idle`](super::CdcEvent::Idle), so confirming it lets the server recycle the WAL that
/// other tables' writes produced while the outbox was idle. PostgreSQL 15 and later also send
/// keepalives past skipped transactions; the heartbeat makes the bound independent of that, as
/// Debezium's `heartbeat.action.query` does.
///
/// # Errors
/// [`CdcError::Database`] when the statement fails (it needs `wal_level = logical`).
pub async fn heartbeat(pool: &PgPool) -> Result<u64, CdcError> {
    let lsn: String =
        sqlx::query_scalar("SELECT pg_logical_emit_message(false, $1, ''::text)::text")
            .bind(HEARTBEAT_PREFIX)
            .fetch_one(pool)
            .await?;
    parse_lsn(&lsn)
}

/// A `X/Y` position as PostgreSQL prints it.
pub(crate) fn parse_lsn(text: &str) -> Result<u64, CdcError> {
    Lsn::parse(text)
        .map(Lsn::as_u64)
        .map_err(|e| CdcError::Decode(format!("position `{text}`: {e}")))
}

/// A replication slot as the server sees it: what it holds back, and whether it can still be
/// streamed. The numbers behind the `outbox_cdc_slot_*` gauges and `outbox status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotState {
    /// A connection streams it now.
    pub active: bool,
    /// The server's `wal_status`: `reserved`, `extended`, `unreserved` (about to be lost) or
    /// `lost` (invalidated: it can no longer be streamed).
    pub wal_status: String,
    /// WAL the slot keeps from being recycled: the current position minus its `restart_lsn`,
    /// in bytes.
    pub retained_bytes: i64,
    /// The current position minus its confirmed position, in bytes: how far the relay is
    /// behind the log.
    pub lag_bytes: i64,
}

/// The state of slot `slot`, `None` when it does not exist.
///
/// # Errors
/// [`CdcError::Database`] when the query fails.
pub async fn slot_state(pool: &PgPool, slot: &str) -> Result<Option<SlotState>, CdcError> {
    #[derive(sqlx::FromRow)]
    struct Row {
        active: bool,
        wal_status: Option<String>,
        retained: Option<i64>,
        lag: Option<i64>,
    }
    let row: Option<Row> = sqlx::query_as(
        "SELECT active, wal_status, \
           pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 AS retained, \
           pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8 AS lag \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|r| SlotState {
        active: r.active,
        wal_status: r.wal_status.unwrap_or_else(|| "lost".to_owned()),
        retained_bytes: r.retained.unwrap_or(0),
        lag_bytes: r.lag.unwrap_or(0),
    }))
}
