//! Change data capture: the outbox table's committed inserts, streamed from PostgreSQL's log
//! through a logical replication slot, in commit order.
//!
//! This module is the log side of the CDC relay: it sets up the publication and the slot,
//! streams them, decodes each inserted row into an [`OutboxMessage`] and reports the log
//! position the relay confirmed. Publishing, ordering and dead letters stay in the relay's
//! engine; a CDC feed built on [`CdcStream`] confirms a transaction's position only after the
//! broker acknowledged every event of it (G3).
//!
//! # Crates
//!
//! * The replication connection (`START_REPLICATION ... LOGICAL`, standby status updates,
//!   keepalive replies, TLS, SCRAM) is `pgwire-replication`. It answers the server's keepalives
//!   and sends the confirmed position on its own worker task, so a relay waiting for a broker
//!   never trips the server's `wal_sender_timeout`.
//! * The `pgoutput` messages inside the stream (Relation, Insert) are decoded by `pg_walstream`'s
//!   parser (built without its own connection), and the column values, which are requested in
//!   binary form, by `postgres-types`, the decoders of the `postgres` crate. Nothing here parses
//!   the protocol by hand.
//!
//! # Set-up (see the guide, docs/guide/src/relay.md, "CDC relay")
//!
//! * The server runs with `wal_level = logical` (a restart), and has a free replication slot
//!   and WAL sender (`max_replication_slots`, `max_wal_senders`).
//! * [`ensure_publication`]: a publication of inserts on `<schema>.events`, named after the schema
//!   (publications live in the database's own namespace). Needs `CREATE` on the database and
//!   ownership of the table: the migrator's rights.
//! * [`create_slot`]: a `pgoutput` slot, named after the schema unless configured. Streaming needs
//!   a role with `REPLICATION` (or a superuser).
//!
//! # What the stream guarantees
//!
//! * Only committed transactions, whole, in commit order; a rolled-back insert never appears.
//!   A transaction larger than a part ([`CdcConfig::max_rows_in_memory`]) comes in parts, one
//!   after the other, its commit position with the last: the server sends a transaction only
//!   once it committed, so every part is committed already.
//! * After a restart, streaming resumes at the slot's confirmed position: every transaction that
//!   ends after it is delivered again, with the same rows (same event ids).
//! * A dropped or invalidated slot is an error ([`CdcError::SlotMissing`],
//!   [`CdcError::SlotInvalidated`]), never a silent new start.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use outbox_core::{ContentType, Fingerprint, OutboxMessage, Payload, UndecodableRow};
use pg_walstream::{ColumnData, ColumnInfo, LogicalReplicationMessage, LogicalReplicationParser};
use pgwire_replication::{
    Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, SslMode, TlsConfig,
};
use postgres_types::{FromSql, Type};
use sqlx::PgPool;
use uuid::Uuid;

use crate::schema::{Schema, quote_ident};

mod feed;
pub use feed::{CdcFeed, CdcTicket};

/// The table whose inserts are streamed.
const TABLE: &str = "events";

/// The CDC stream's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcConfig {
    /// The replication slot. Default: the schema's name. Letters, digits and `_` only (the
    /// server's rule for slot names), at most 63.
    pub slot: Option<String>,
    /// The publication. Default: the schema's name.
    pub publication: Option<String>,
    /// How often the confirmed position is sent to the server. Default 1 s.
    pub status_interval: Duration,
    /// Decoded changes buffered between the connection and the relay. Default 8,192.
    pub buffer_events: usize,
    /// The most streamed events the relay holds in memory before handing them out (and
    /// the size of the parts a large transaction is handed over in: a quarter of it). Reading
    /// the stream pauses at this count until events are settled; the server then waits, and
    /// the slot retains the WAL meanwhile. With it the relay's memory is bounded whatever a
    /// transaction's size: a transaction of a million rows is streamed part by part, each
    /// part published before the next is read, and its commit confirmed once its last part
    /// is settled (a crash in between hands the whole transaction out again: the parts
    /// already published go out again, same event ids). Default 10,000; at least 4.
    pub max_rows_in_memory: usize,
    /// The producers delete their rows in their own transactions
    /// (`PgOutbox::delete_in_transaction`): the feed then writes every event it leaves to the
    /// table (a dead letter, the events of an aggregate parked behind one) back into it before
    /// it counts as settled, or it would exist nowhere but in the log. Needs `INSERT` on the
    /// outbox table for the relay's role (docs/security.md). Default `false`: the rows are in
    /// the table already, and the relay role inserts nothing. A feed with `false` that finds
    /// such an event's row gone although its transaction committed writes it back all the
    /// same (a dead letter never ends nowhere) and warns once, naming this option.
    pub producers_delete_rows: bool,
}

impl Default for CdcConfig {
    fn default() -> Self {
        Self {
            slot: None,
            publication: None,
            status_interval: Duration::from_secs(1),
            buffer_events: 8192,
            max_rows_in_memory: 10_000,
            producers_delete_rows: false,
        }
    }
}

impl CdcConfig {
    /// The slot's name for `schema`.
    pub fn slot_name(&self, schema: &Schema) -> String {
        self.slot
            .clone()
            .unwrap_or_else(|| schema.as_str().to_owned())
    }

    /// The publication's name for `schema`.
    pub fn publication_name(&self, schema: &Schema) -> String {
        self.publication
            .clone()
            .unwrap_or_else(|| schema.as_str().to_owned())
    }
}

/// Why the CDC stream failed or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdcError {
    /// A setting or the database URL is not usable (the message says which).
    #[error("CDC configuration: {0}")]
    Config(String),
    /// The server does not run with `wal_level = logical`.
    #[error(
        "PostgreSQL runs with wal_level = {found}; the CDC relay needs wal_level = logical \
         (ALTER SYSTEM SET wal_level = logical, then restart the server)"
    )]
    WalLevel {
        /// The server's setting.
        found: String,
    },
    /// The slot does not exist: it was dropped (or never created). Events committed since the
    /// last confirmed position may exist only in the outbox table now; see the guide's
    /// recovery (docs/guide/src/relay.md, "A lost slot").
    #[error(
        "replication slot `{slot}` does not exist: it was dropped or never created. Streaming \
         does not start from scratch on its own: recover as the guide says \
         (docs/guide/src/relay.md, \"a lost slot\"), which republishes what the outbox still holds"
    )]
    SlotMissing {
        /// The slot's name.
        slot: String,
    },
    /// The server invalidated the slot (for instance it retained more WAL than
    /// `max_slot_wal_keep_size`); changes after its position are gone from the log.
    #[error(
        "replication slot `{slot}` can no longer be streamed ({reason}); recover as the guide \
         says (docs/guide/src/relay.md, \"a lost slot\")"
    )]
    SlotInvalidated {
        /// The slot's name.
        slot: String,
        /// The server's words.
        reason: String,
    },
    /// Another connection streams the slot (another relay); this one may wait as a standby.
    #[error("replication slot `{slot}` is streamed by another connection ({reason})")]
    SlotBusy {
        /// The slot's name.
        slot: String,
        /// The server's words.
        reason: String,
    },
    /// The outbox table's layout in the log is not the one this release reads (a column
    /// missing or of another type), or a change could not be decoded.
    #[error("cannot decode the outbox table's change: {0}")]
    Decode(String),
    /// The replication connection failed or closed (a restart resumes from the slot).
    #[error("replication stream: {0}")]
    Stream(String),
    /// A statement of the set-up failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

impl CdcError {
    /// Whether starting the stream again later may succeed (connection failures, a slot busy
    /// with another relay), as opposed to a state an operator must fix.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Stream(_) | Self::SlotBusy { .. })
    }
}

/// The CDC relay's gauges, set by the relay's slot watch (`crate::relay`).
pub mod metric {
    /// WAL the CDC relay's slot keeps from being recycled, bytes.
    pub const SLOT_RETAINED: &str = "outbox_cdc_slot_retained_bytes";
    /// How far the CDC relay's confirmed position is behind the log, bytes.
    pub const SLOT_LAG: &str = "outbox_cdc_slot_lag_bytes";
    /// How far the CDC relay's delivery is behind the log in time: the age of the oldest
    /// streamed transaction not confirmed yet, seconds ([`super::CdcFeed::lag`]).
    pub const SLOT_LAG_SECONDS: &str = "outbox_cdc_slot_lag_seconds";
}

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

/// A timestamp of the replication protocol (microseconds since 2000-01-01 UTC).
fn pg_time(micros: i64) -> DateTime<Utc> {
    const PG_EPOCH_UNIX_SECS: i64 = 946_684_800;
    DateTime::from_timestamp_micros(micros.saturating_add(PG_EPOCH_UNIX_SECS * 1_000_000))
        .unwrap_or_default()
}

fn check_slot_name(slot: &str) -> Result<(), CdcError> {
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

/// Writes a heartbeat into the log (a non-transactional logical message, nothing in any table)
/// and returns its position. A stream that receives it with nothing outstanding reports it as
/// [`CdcEvent::Idle`], so confirming it lets the server recycle the WAL that other tables'
/// writes produced while the outbox was idle. PostgreSQL 15 and later also send keepalives
/// past skipped transactions; the heartbeat makes the bound independent of that, as
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

/// One committed transaction's inserts into the outbox table, in the order they were made; or
/// a part of them, for a transaction with more inserts than a part holds
/// ([`CdcConfig::max_rows_in_memory`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcTransaction {
    /// The transaction id.
    pub xid: u32,
    /// The position just past the commit: confirming it ([`CdcStream::confirm`]) means this
    /// transaction and everything before it in the log are done. 0 in a part that is not the
    /// last (`complete` is false): nothing may be confirmed for the transaction before its
    /// last part is done.
    pub end_lsn: u64,
    /// This is the transaction's last part (its commit): true for every transaction that fits
    /// in one part. The parts of one transaction come one after the other, with its `xid`,
    /// nothing between them; the last may hold no rows.
    pub complete: bool,
    /// The inserted rows, decoded. `attempts` is always 0.
    pub messages: Vec<OutboxMessage>,
    /// The inserted rows that cannot be published as stored, each with its reason; they are
    /// not in `messages`. Empty in the normal case.
    pub unpublishable: Vec<CdcUnpublishable>,
    /// When the transaction committed, by the server's clock.
    pub committed_at: DateTime<Utc>,
}

/// What [`CdcStream::next`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CdcEvent {
    /// A committed transaction with at least one outbox insert (decodable or not).
    Transaction(CdcTransaction),
    /// The log reached `lsn` with no outbox insert since the previous event (a keepalive of an
    /// idle outbox, a [`heartbeat`], or a transaction that inserted nothing into it). Once every earlier
    /// transaction is confirmed, confirming `lsn` lets the server recycle the WAL before it.
    Idle {
        /// The log position reached.
        lsn: u64,
    },
}

/// The outbox table's columns, by position in the log's tuples.
#[derive(Debug, Clone)]
struct Columns {
    id: usize,
    event_id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    aggregate_version: usize,
    event_type: usize,
    schema_version: usize,
    content_type: usize,
    payload: usize,
    headers: usize,
    destination: usize,
    partition_key: usize,
    created_at: usize,
}

impl Columns {
    /// The positions of the columns this release reads, each checked for its type.
    fn of(columns: &[ColumnInfo]) -> Result<Self, CdcError> {
        let find = |name: &str, ty: &Type| -> Result<usize, CdcError> {
            let (i, c) = columns
                .iter()
                .enumerate()
                .find(|(_, c)| &*c.name == name)
                .ok_or_else(|| {
                    CdcError::Decode(format!("the log's outbox table has no column `{name}`"))
                })?;
            if c.type_id != ty.oid() {
                return Err(CdcError::Decode(format!(
                    "column `{name}` has type oid {} in the log, {} ({}) expected",
                    c.type_id,
                    ty.oid(),
                    ty.name()
                )));
            }
            Ok(i)
        };
        Ok(Self {
            id: find("id", &Type::INT8)?,
            event_id: find("event_id", &Type::UUID)?,
            aggregate_type: find("aggregate_type", &Type::TEXT)?,
            aggregate_id: find("aggregate_id", &Type::TEXT)?,
            aggregate_version: find("aggregate_version", &Type::INT8)?,
            event_type: find("event_type", &Type::TEXT)?,
            schema_version: find("schema_version", &Type::INT4)?,
            content_type: find("content_type", &Type::TEXT)?,
            payload: find("payload", &Type::BYTEA)?,
            headers: find("headers", &Type::JSONB)?,
            destination: find("destination", &Type::TEXT)?,
            partition_key: find("partition_key", &Type::TEXT)?,
            created_at: find("created_at", &Type::TIMESTAMPTZ)?,
        })
    }
}

/// A column's value from a tuple: `None` for SQL NULL.
fn value<'t, T: FromSql<'t>>(
    tuple: &'t [ColumnData],
    index: usize,
    ty: &Type,
    name: &str,
) -> Result<Option<T>, CdcError> {
    let column = tuple
        .get(index)
        .ok_or_else(|| CdcError::Decode(format!("the insert has no value for `{name}`")))?;
    if column.is_null() {
        return Ok(None);
    }
    if column.is_unchanged() || !column.is_binary() {
        return Err(CdcError::Decode(format!(
            "the insert's `{name}` is not a binary value"
        )));
    }
    T::from_sql(ty, column.as_bytes())
        .map(Some)
        .map_err(|e| CdcError::Decode(format!("`{name}`: {e}")))
}

/// [`value`] of a NOT NULL column.
fn required<'t, T: FromSql<'t>>(
    tuple: &'t [ColumnData],
    index: usize,
    ty: &Type,
    name: &str,
) -> Result<T, CdcError> {
    value(tuple, index, ty, name)?
        .ok_or_else(|| CdcError::Decode(format!("the insert's `{name}` is NULL")))
}

/// A `jsonb` value's text as stored, undecoded: the binary form is a version byte (1) and the
/// text. Kept as text so that a value `serde_json` cannot read (a number beyond `f64`) is still
/// reported with its reason and written back as it was.
struct JsonText(String);

impl<'a> FromSql<'a> for JsonText {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        match raw.split_first() {
            Some((1, text)) => Ok(Self(std::str::from_utf8(text)?.to_owned())),
            _ => Err("unsupported jsonb version".into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }
}

/// A `timestamptz` as the server stores it, microseconds since 2000-01-01 UTC: `infinity` and
/// `-infinity` (which the column accepts) are `i64::MAX` and `i64::MIN`.
struct PgMicros(i64);

impl<'a> FromSql<'a> for PgMicros {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(i64::from_be_bytes(raw.try_into()?)))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ
    }
}

/// An outbox row's columns as the log gave them, each `None` when it could not be read (the
/// first such problem is kept). What a row left to the table is written back from: every value
/// exactly as the producer stored it, also when it cannot be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredRow {
    pub(crate) id: i64,
    pub(crate) event_id: Option<Uuid>,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_version: i64,
    pub(crate) event_type: Option<String>,
    pub(crate) schema_version: Option<i32>,
    pub(crate) content_type: Option<String>,
    pub(crate) payload: Option<Vec<u8>>,
    /// The `headers` value's JSON text.
    pub(crate) headers: Option<String>,
    pub(crate) destination: Option<String>,
    pub(crate) partition_key: Option<String>,
    /// `created_at` in the server's microseconds ([`PgMicros`]).
    pub(crate) created_at: Option<i64>,
    /// Delivery attempts so far (0 as streamed).
    pub(crate) attempts: i32,
}

impl StoredRow {
    /// The row of a decoded message (its headers as a JSON object of strings).
    pub(crate) fn of(m: &OutboxMessage) -> Self {
        const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800 * 1_000_000;
        Self {
            id: m.id,
            event_id: Some(m.event_id),
            aggregate_type: m.aggregate_type.clone(),
            aggregate_id: m.aggregate_id.clone(),
            aggregate_version: m.aggregate_version,
            event_type: Some(m.event_type.clone()),
            schema_version: Some(m.schema_version),
            content_type: Some(m.payload.content_type.0.clone()),
            payload: Some(m.payload.bytes.to_vec()),
            headers: Some(serde_json::to_string(&m.headers).expect("string map serialises")),
            destination: m.destination.clone(),
            partition_key: m.partition_key.clone(),
            created_at: Some(m.created_at.timestamp_micros() - PG_EPOCH_UNIX_MICROS),
            attempts: m.attempts,
        }
    }
}

/// A row the log gave that cannot be published as stored ([`UndecodableRow`]: a header value
/// that is not a string, a header name no binding can carry, a column that does not decode).
/// The relay dead-letters it with its reason and its aggregate waits behind it; the columns are
/// kept to write it back as a dead letter where the producer deleted its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcUnpublishable {
    /// Its key, event id when readable, and what is wrong with it.
    pub row: UndecodableRow,
    pub(crate) stored: StoredRow,
}

/// Reads the columns that are not the row's key, keeping the first problem.
struct Reader<'t> {
    tuple: &'t [ColumnData],
    problem: Option<String>,
}

impl<'t> Reader<'t> {
    /// A nullable column; `None` (and the problem kept) when it cannot be read.
    fn nullable<T: FromSql<'t>>(&mut self, index: usize, ty: &Type, name: &str) -> Option<T> {
        match value(self.tuple, index, ty, name) {
            Ok(v) => v,
            Err(e) => {
                let reason = match e {
                    CdcError::Decode(reason) => reason,
                    other => other.to_string(),
                };
                self.problem
                    .get_or_insert(format!("column `{name}` cannot be read: {reason}"));
                None
            }
        }
    }

    /// A NOT NULL column; NULL is a problem too.
    fn required<T: FromSql<'t>>(&mut self, index: usize, ty: &Type, name: &str) -> Option<T> {
        let v = self.nullable(index, ty, name);
        if v.is_none() {
            self.problem
                .get_or_insert(format!("column `{name}` is NULL"));
        }
        v
    }
}

/// One inserted row of the log, decoded on its own: the message, or, for a row that cannot be
/// published as stored, why ([`CdcUnpublishable`]). Only a row whose id or aggregate key
/// cannot be read is an error (the stream stops there: nothing after it is skipped), which the
/// table's types and constraints rule out.
fn decode_row(
    c: &Columns,
    tuple: &[ColumnData],
) -> Result<Result<OutboxMessage, CdcUnpublishable>, CdcError> {
    let mut r = Reader {
        tuple,
        problem: None,
    };
    let stored = StoredRow {
        id: required(tuple, c.id, &Type::INT8, "id")?,
        aggregate_type: required(tuple, c.aggregate_type, &Type::TEXT, "aggregate_type")?,
        aggregate_id: required(tuple, c.aggregate_id, &Type::TEXT, "aggregate_id")?,
        aggregate_version: required(tuple, c.aggregate_version, &Type::INT8, "aggregate_version")?,
        event_id: r.required::<Uuid>(c.event_id, &Type::UUID, "event_id"),
        event_type: r.required(c.event_type, &Type::TEXT, "event_type"),
        schema_version: r.required(c.schema_version, &Type::INT4, "schema_version"),
        content_type: r.required(c.content_type, &Type::TEXT, "content_type"),
        payload: r.required(c.payload, &Type::BYTEA, "payload"),
        headers: r
            .required::<JsonText>(c.headers, &Type::JSONB, "headers")
            .map(|j| j.0),
        destination: r.nullable(c.destination, &Type::TEXT, "destination"),
        partition_key: r.nullable(c.partition_key, &Type::TEXT, "partition_key"),
        created_at: r
            .required::<PgMicros>(c.created_at, &Type::TIMESTAMPTZ, "created_at")
            .map(|m| m.0),
        attempts: 0,
    };
    let message = match r.problem {
        Some(problem) => Err(problem),
        None => message_of(&stored),
    };
    Ok(message.map_err(|reason| CdcUnpublishable {
        row: UndecodableRow {
            id: stored.id,
            event_id: stored.event_id,
            aggregate_type: stored.aggregate_type.clone(),
            aggregate_id: stored.aggregate_id.clone(),
            aggregate_version: stored.aggregate_version,
            reason,
        },
        stored,
    }))
}

/// The message of a row whose every column was read, or why it cannot be published as stored.
fn message_of(s: &StoredRow) -> Result<OutboxMessage, String> {
    let missing = |name: &str| format!("column `{name}` is NULL");
    let headers = s.headers.as_deref().ok_or_else(|| missing("headers"))?;
    let headers: serde_json::Value = serde_json::from_str(headers)
        .map_err(|e| format!("column `headers` cannot be read: {e}"))?;
    let headers = outbox_core::headers_from_json(headers)?;
    let micros = s.created_at.ok_or_else(|| missing("created_at"))?;
    let created_at = pg_time_checked(micros).ok_or_else(|| {
        "column `created_at` is out of the range of a date (infinity?)".to_owned()
    })?;
    let payload = s.payload.clone().ok_or_else(|| missing("payload"))?;
    let message = OutboxMessage {
        id: s.id,
        event_id: s.event_id.ok_or_else(|| missing("event_id"))?,
        aggregate_type: s.aggregate_type.clone(),
        aggregate_id: s.aggregate_id.clone(),
        aggregate_version: s.aggregate_version,
        event_type: s.event_type.clone().ok_or_else(|| missing("event_type"))?,
        schema_version: s.schema_version.ok_or_else(|| missing("schema_version"))?,
        // `payload_sha256` is a generated column, which PostgreSQL before 18 leaves out of the
        // log: the same SHA-256, computed here.
        fingerprint: Fingerprint::of(&payload),
        payload: Payload {
            content_type: ContentType(
                s.content_type
                    .clone()
                    .ok_or_else(|| missing("content_type"))?,
            ),
            bytes: Bytes::from(payload),
        },
        headers,
        destination: s.destination.clone(),
        partition_key: s.partition_key.clone(),
        created_at,
        attempts: s.attempts,
    };
    message
        .check_publishable_reserving(&[crate::RESERVED_HEADERS])
        .map_err(|e| e.to_string())?;
    Ok(message)
}

/// [`StoredRow::created_at`] as SQL text for `::timestamptz`: `infinity` as such; a date
/// `chrono` does not represent (beyond the year 262,143) as `now`, the time of the write.
pub(crate) fn pg_time_text(micros: i64) -> String {
    match micros {
        i64::MAX => "infinity".to_owned(),
        i64::MIN => "-infinity".to_owned(),
        m => pg_time_checked(m).map_or_else(
            || "now".to_owned(),
            |t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        ),
    }
}

/// A timestamp of the server's storage (microseconds since 2000-01-01 UTC), `None` outside
/// the dates `chrono` represents (`infinity`).
fn pg_time_checked(micros: i64) -> Option<DateTime<Utc>> {
    const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800 * 1_000_000;
    DateTime::from_timestamp_micros(micros.checked_add(PG_EPOCH_UNIX_MICROS)?)
}

/// The replication connection's settings from a `postgres://` URL, and the TLS settings of a
/// second try when `sslmode` asks for one (see [`tls_of`]).
fn replication_config(
    url: &str,
    slot: &str,
    publication: &str,
) -> Result<(ReplicationConfig, Option<TlsConfig>), CdcError> {
    let parsed = url::Url::parse(url)
        .map_err(|e| CdcError::Config(format!("the database URL is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "postgres" | "postgresql") {
        return Err(CdcError::Config(format!(
            "the database URL's scheme is `{}`, postgres:// expected",
            parsed.scheme()
        )));
    }
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|e| CdcError::Config(format!("the database URL: {e}")))
    };
    let host = parsed.host_str().unwrap_or("localhost").to_owned();
    let user = match parsed.username() {
        "" => std::env::var("PGUSER").unwrap_or_else(|_| "postgres".to_owned()),
        u => decode(u)?,
    };
    let password = match parsed.password() {
        Some(p) => decode(p)?,
        None => std::env::var("PGPASSWORD").unwrap_or_default(),
    };
    let database = match parsed.path().trim_start_matches('/') {
        "" => user.clone(),
        d => decode(d)?,
    };
    let query: HashMap<String, String> = parsed.query_pairs().into_owned().collect();
    let (tls, fallback) = tls_of(&query)?;
    Ok((
        ReplicationConfig::new(host, user, password, database, slot, publication)
            .with_port(parsed.port().unwrap_or(5432))
            .with_tls(tls)
            .with_binary(true)
            .with_application_name("outbox-cdc"),
        fallback,
    ))
}

/// The replication connection's TLS from the URL's `sslmode`, `sslrootcert`, `sslcert` and
/// `sslkey`, as libpq (and the pool on the same URL) reads them, and the TLS of a second try:
///
/// * `prefer`, and no `sslmode` (libpq's default): TLS when the server offers it, without
///   verifying its certificate; plain text when the server answers that it has no TLS, or, on a
///   second try, when the TLS connection fails (a failed handshake, a `pg_hba.conf` that only
///   lets this client in without TLS).
/// * `allow`: plain text first; TLS (unverified) on a second try when that fails (a server that
///   only lets this client in with TLS).
/// * `disable`, `require`, `verify-ca`, `verify-full`: one try, as named; `require` and the
///   verify modes never fall back to plain text.
fn tls_of(query: &HashMap<String, String>) -> Result<(TlsConfig, Option<TlsConfig>), CdcError> {
    let ca = query.get("sslrootcert").map(std::path::PathBuf::from);
    let client_cert = |tls: TlsConfig| match (query.get("sslcert"), query.get("sslkey")) {
        (Some(cert), Some(key)) => tls.with_client_cert(cert, key),
        _ => tls,
    };
    let prefer = || {
        client_cert(TlsConfig {
            mode: SslMode::Prefer,
            ..TlsConfig::default()
        })
    };
    Ok(match query.get("sslmode").map(String::as_str) {
        None | Some("prefer") => (prefer(), Some(TlsConfig::disabled())),
        Some("allow") => (
            TlsConfig::disabled(),
            Some(client_cert(TlsConfig::require())),
        ),
        Some("disable") => (TlsConfig::disabled(), None),
        Some("require") => (client_cert(TlsConfig::require()), None),
        Some("verify-ca") => (client_cert(TlsConfig::verify_ca(ca)), None),
        Some("verify-full") => (client_cert(TlsConfig::verify_full(ca)), None),
        Some(other) => {
            return Err(CdcError::Config(format!(
                "the database URL's sslmode `{other}` is not one of disable, allow, prefer, \
                 require, verify-ca, verify-full"
            )));
        }
    })
}

/// The transaction [`CdcStream`] is receiving: its xid, commit time and the rows so far.
/// The transaction being received.
#[derive(Debug)]
struct OpenTransaction {
    xid: u32,
    committed_at: DateTime<Utc>,
    messages: Vec<OutboxMessage>,
    unpublishable: Vec<CdcUnpublishable>,
    /// Parts handed over already.
    parts: u64,
}

impl OpenTransaction {
    fn rows(&self) -> usize {
        self.messages.len() + self.unpublishable.len()
    }

    /// The rows received since the last part, as a part (or the whole transaction).
    fn part(&mut self, end_lsn: u64, complete: bool) -> CdcTransaction {
        self.parts += 1;
        CdcTransaction {
            xid: self.xid,
            end_lsn,
            complete,
            messages: std::mem::take(&mut self.messages),
            unpublishable: std::mem::take(&mut self.unpublishable),
            committed_at: self.committed_at,
        }
    }
}

/// The outbox table's inserts streamed from a replication slot. See the module's docs.
pub struct CdcStream {
    client: ReplicationClient,
    parser: LogicalReplicationParser,
    schema: Schema,
    slot: String,
    /// Relation ids of the outbox table seen in this session, with its column positions.
    tables: HashMap<u32, Columns>,
    /// Relation ids of other tables of the publication (their inserts are skipped).
    others: HashMap<u32, String>,
    /// The transaction being received.
    open: Option<OpenTransaction>,
    /// The rows of a part ([`CdcConfig::max_rows_in_memory`]).
    part_rows: usize,
    /// The highest position passed to [`CdcStream::confirm`].
    confirmed: std::sync::atomic::AtomicU64,
    status_interval: Duration,
}

impl std::fmt::Debug for CdcStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcStream")
            .field("schema", &self.schema)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl CdcStream {
    /// Starts streaming the slot of `schema` (see [`CdcConfig`]) from its confirmed position,
    /// over a replication connection to `url` (`sslmode`, `sslrootcert`, `sslcert` and `sslkey`
    /// are honoured as libpq honours them, `prefer` by default: TLS whenever the server offers
    /// it; a missing user or password falls back to `PGUSER` / `PGPASSWORD`).
    ///
    /// # Errors
    /// [`CdcError::Config`] for a bad URL or slot name, [`CdcError::SlotMissing`],
    /// [`CdcError::SlotInvalidated`] and [`CdcError::SlotBusy`] as the server reports them,
    /// [`CdcError::Stream`] when the connection or authentication fails.
    pub async fn start(url: &str, schema: &Schema, config: &CdcConfig) -> Result<Self, CdcError> {
        let slot = config.slot_name(schema);
        check_slot_name(&slot)?;
        let publication = config.publication_name(schema);
        let (replication, fallback) = replication_config(url, &slot, &publication)?;
        let replication = replication
            .with_start_lsn(Lsn::ZERO)
            .with_status_interval(config.status_interval)
            .with_buffer_size(config.buffer_events);
        let connect = async |replication: ReplicationConfig| {
            let mut client = ReplicationClient::connect(replication)
                .await
                .map_err(|e| classify(&slot, e))?;
            client
                .wait_started()
                .await
                .map_err(|e| classify(&slot, e))?;
            Ok::<_, CdcError>(client)
        };
        let client = match connect(replication.clone()).await {
            Ok(client) => client,
            // A connection that failed (not the slot's state): the second try `sslmode`
            // allows, as libpq makes it.
            Err(CdcError::Stream(first)) if fallback.is_some() => {
                let tls = fallback.unwrap_or_default();
                tracing::info!(error = %first, tls = tls.mode.requires_tls(),
                    "the replication connection failed; trying again as sslmode allows");
                connect(replication.with_tls(tls)).await?
            }
            Err(e) => return Err(e),
        };
        Ok(Self {
            client,
            parser: LogicalReplicationParser::with_protocol_version(1),
            schema: schema.clone(),
            slot,
            tables: HashMap::new(),
            others: HashMap::new(),
            open: None,
            part_rows: (config.max_rows_in_memory / 4).max(1),
            confirmed: std::sync::atomic::AtomicU64::new(0),
            status_interval: config.status_interval,
        })
    }

    /// The slot streamed.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// The next committed transaction with outbox inserts (or the next part of one, see
    /// [`CdcTransaction::complete`]), or the position an idle log reached. `None` when the
    /// stream ended ([`CdcStream::stop`]).
    ///
    /// # Errors
    /// [`CdcError::Decode`] when a change of the outbox table cannot be told apart (its id or
    /// aggregate key cannot be read, or the stream is broken: it stops there, nothing after it
    /// is skipped; a row that is only unpublishable is in
    /// [`CdcTransaction::unpublishable`]), [`CdcError::Stream`] and the slot errors as for
    /// [`CdcStream::start`].
    pub async fn next(&mut self) -> Result<Option<CdcEvent>, CdcError> {
        loop {
            let Some(event) = self
                .client
                .recv()
                .await
                .map_err(|e| classify(&self.slot, e))?
            else {
                return Ok(None);
            };
            match event {
                ReplicationEvent::Begin {
                    xid,
                    commit_time_micros,
                    ..
                } => {
                    self.open = Some(OpenTransaction {
                        xid,
                        committed_at: pg_time(commit_time_micros),
                        messages: Vec::new(),
                        unpublishable: Vec::new(),
                        parts: 0,
                    });
                }
                ReplicationEvent::XLogData { data, .. } => {
                    self.change(&data)?;
                    // A large transaction goes out part by part: the relay's memory holds a
                    // part, not the transaction.
                    if let Some(open) = self.open.as_mut()
                        && open.rows() >= self.part_rows
                    {
                        return Ok(Some(CdcEvent::Transaction(open.part(0, false))));
                    }
                }
                ReplicationEvent::Commit { end_lsn, .. } => {
                    let mut open = self
                        .open
                        .take()
                        .ok_or_else(|| CdcError::Stream("a commit without its begin".to_owned()))?;
                    let end_lsn = end_lsn.as_u64();
                    return Ok(Some(if open.rows() == 0 && open.parts == 0 {
                        CdcEvent::Idle { lsn: end_lsn }
                    } else {
                        // After parts, the last one even if empty: it carries the commit.
                        CdcEvent::Transaction(open.part(end_lsn, true))
                    }));
                }
                ReplicationEvent::KeepAlive { wal_end, .. } if self.open.is_none() => {
                    return Ok(Some(CdcEvent::Idle {
                        lsn: wal_end.as_u64(),
                    }));
                }
                ReplicationEvent::Message {
                    transactional: false,
                    lsn,
                    prefix,
                    ..
                } if prefix == HEARTBEAT_PREFIX && self.open.is_none() => {
                    return Ok(Some(CdcEvent::Idle { lsn: lsn.as_u64() }));
                }
                ReplicationEvent::StoppedAt { .. } => return Ok(None),
                _ => {}
            }
        }
    }

    /// One pgoutput message of the open transaction (or a Relation between transactions).
    fn change(&mut self, data: &Bytes) -> Result<(), CdcError> {
        let message = self
            .parser
            .parse_wal_message(data)
            .map_err(|e| CdcError::Decode(e.to_string()))?
            .message;
        match message {
            LogicalReplicationMessage::Relation {
                relation_id,
                namespace,
                relation_name,
                columns,
                ..
            } => {
                if &*namespace == self.schema.as_str() && &*relation_name == TABLE {
                    self.tables.insert(relation_id, Columns::of(&columns)?);
                    self.others.remove(&relation_id);
                } else {
                    self.tables.remove(&relation_id);
                    self.others
                        .insert(relation_id, format!("{namespace}.{relation_name}"));
                }
            }
            LogicalReplicationMessage::Insert { relation_id, tuple } => {
                let Some(columns) = self.tables.get(&relation_id) else {
                    if self.others.contains_key(&relation_id) {
                        return Ok(());
                    }
                    // pgoutput sends a relation's description before its first change in
                    // every session: an insert of an unknown relation is a broken stream.
                    return Err(CdcError::Decode(format!(
                        "an insert into relation {relation_id}, whose description the stream \
                         did not send"
                    )));
                };
                let row = decode_row(columns, &tuple.columns)?;
                let open = self.open.as_mut().ok_or_else(|| {
                    CdcError::Stream("an insert outside a transaction".to_owned())
                })?;
                match row {
                    Ok(message) => open.messages.push(message),
                    Err(bad) => open.unpublishable.push(bad),
                }
            }
            // Types, origins, truncates, deletes and updates (the publication publishes
            // inserts only) carry nothing for the relay.
            _ => {}
        }
        Ok(())
    }

    /// Confirms that everything in the log up to `lsn` is done: the server may recycle it, and
    /// a restart resumes after it. Monotonic (a lower `lsn` than an earlier call is ignored);
    /// sent with the next status update (within `status_interval`).
    pub fn confirm(&self, lsn: u64) {
        self.confirmed
            .fetch_max(lsn, std::sync::atomic::Ordering::Relaxed);
        self.client.update_applied_lsn(Lsn::from_u64(lsn));
    }

    /// Stops streaming. The position last confirmed is sent to the server first (waiting at
    /// most two status intervals for the connection's next status update), so a restart does
    /// not deliver confirmed transactions again.
    ///
    /// # Errors
    /// [`CdcError::Stream`] when the connection failed while closing. The server then keeps the
    /// position of the last status update it received: transactions confirmed after it are
    /// delivered again (same rows), never lost.
    pub async fn stop(mut self) -> Result<(), CdcError> {
        let confirmed = self.confirmed.load(std::sync::atomic::Ordering::Relaxed);
        let metrics = self.client.metrics();
        let deadline = tokio::time::Instant::now() + self.status_interval * 2;
        while metrics.last_applied_lsn().as_u64() < confirmed
            && self.client.is_running()
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if metrics.last_applied_lsn().as_u64() < confirmed {
            tracing::warn!(
                slot = %self.slot,
                confirmed,
                sent = metrics.last_applied_lsn().as_u64(),
                "stopping before the confirmed position reached the server: a restart delivers \
                 the transactions after the last position sent again"
            );
        }
        self.client
            .shutdown()
            .await
            .map_err(|e| classify(&self.slot, e))
    }
}

/// The server's errors about the slot, told apart from connection failures.
fn classify(slot: &str, e: pgwire_replication::PgWireError) -> CdcError {
    let text = e.to_string();
    if text.contains("42704") || text.contains("does not exist") {
        CdcError::SlotMissing {
            slot: slot.to_owned(),
        }
    } else if text.contains("55006") || text.contains("is active for PID") {
        CdcError::SlotBusy {
            slot: slot.to_owned(),
            reason: text,
        }
    } else if text.contains("can no longer get changes")
        || text.contains("has been invalidated")
        || text.contains("55000")
    {
        CdcError::SlotInvalidated {
            slot: slot.to_owned(),
            reason: text,
        }
    } else {
        CdcError::Stream(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_names_follow_the_servers_rule() {
        assert!(check_slot_name("outbox").is_ok());
        assert!(check_slot_name("t_0123_abc").is_ok());
        for bad in ["", "Outbox", "a-b", "a b", &"x".repeat(64)] {
            assert!(check_slot_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_url_gives_the_replication_connection() {
        let (c, fallback) = replication_config(
            "postgres://relay:p%40ss@db.example:6543/shop?sslmode=verify-full&sslrootcert=/ca.pem",
            "outbox",
            "outbox",
        )
        .unwrap();
        assert_eq!(fallback, None, "never plain text where TLS was required");
        assert_eq!(c.host, "db.example");
        assert_eq!(c.port, 6543);
        assert_eq!(c.user, "relay");
        assert_eq!(c.password, "p@ss");
        assert_eq!(c.database, "shop");
        assert!(c.tls.mode.verifies_hostname());
        assert_eq!(
            c.tls.ca_pem_path.as_deref(),
            Some(std::path::Path::new("/ca.pem"))
        );
        assert!(c.binary);

        let e = replication_config("mysql://x/y", "s", "p").unwrap_err();
        assert!(e.to_string().contains("postgres://"), "{e}");
        let e = replication_config("postgres://x/y?sslmode=sometimes", "s", "p").unwrap_err();
        assert!(e.to_string().contains("sometimes"), "{e}");
    }

    #[test]
    fn sslmode_gives_the_tries_libpq_makes() {
        let modes = |url: &str| {
            let (c, fallback) = replication_config(url, "s", "p").unwrap();
            (c.tls.mode, fallback.map(|t| t.mode))
        };
        for url in ["postgres://x/y", "postgres://x/y?sslmode=prefer"] {
            assert_eq!(
                modes(url),
                (SslMode::Prefer, Some(SslMode::Disable)),
                "{url}"
            );
        }
        assert_eq!(
            modes("postgres://x/y?sslmode=allow"),
            (SslMode::Disable, Some(SslMode::Require))
        );
        assert_eq!(
            modes("postgres://x/y?sslmode=disable"),
            (SslMode::Disable, None)
        );
        assert_eq!(
            modes("postgres://x/y?sslmode=require"),
            (SslMode::Require, None)
        );
        let (c, fallback) =
            replication_config("postgres://x/y?sslcert=/c.pem&sslkey=/k.pem", "s", "p").unwrap();
        assert!(c.tls.is_mtls() && fallback.is_some());
    }

    #[test]
    fn slot_errors_are_told_apart() {
        let e = |s: &str| pgwire_replication::PgWireError::Server(s.to_owned());
        assert!(matches!(
            classify(
                "s",
                e("replication slot \"s\" does not exist (SQLSTATE 42704)")
            ),
            CdcError::SlotMissing { .. }
        ));
        assert!(matches!(
            classify(
                "s",
                e("replication slot \"s\" is active for PID 42 (SQLSTATE 55006)")
            ),
            CdcError::SlotBusy { .. }
        ));
        assert!(matches!(
            classify(
                "s",
                e("can no longer get changes from replication slot \"s\" (SQLSTATE 55000)")
            ),
            CdcError::SlotInvalidated { .. }
        ));
        assert!(classify("s", e("connection reset")).is_transient());
    }

    /// The pgoutput row decoder over generated tuples (outbox_testkit::fuzz): each column as
    /// the log gives it, or NULL, an unchanged-TOAST marker, the text form, bytes of the wrong
    /// length, hostile text, JSON that is not an object of strings, an `infinity` time. The
    /// decoder returns; only a key column that cannot be read stops the stream; a row it
    /// decodes is one the relay can publish, with the values it was given; a row it refuses
    /// keeps its key and a reason without NUL, and its stored columns are what the log gave.
    mod fuzz {
        use outbox_testkit::fuzz::proptest::prelude::*;
        use outbox_testkit::fuzz::{self, hostile_text};

        use super::*;

        const COLUMNS: Columns = Columns {
            id: 0,
            event_id: 1,
            aggregate_type: 2,
            aggregate_id: 3,
            aggregate_version: 4,
            event_type: 5,
            schema_version: 6,
            content_type: 7,
            payload: 8,
            headers: 9,
            destination: 10,
            partition_key: 11,
            created_at: 12,
        };
        const KEY: [usize; 4] = [0, 2, 3, 4];

        fn text(s: &str) -> Vec<u8> {
            s.as_bytes().to_vec()
        }

        fn jsonb(s: &str) -> Vec<u8> {
            let mut v = vec![1];
            v.extend_from_slice(s.as_bytes());
            v
        }

        /// The binary value of each column of a valid row.
        fn valid() -> impl Strategy<Value = Vec<Vec<u8>>> {
            (
                any::<i64>(),
                any::<u128>(),
                1i64..1000,
                -1_000_000_000_000i64..1_000_000_000_000,
            )
                .prop_map(|(id, event_id, version, micros)| {
                    vec![
                        id.to_be_bytes().to_vec(),
                        event_id.to_be_bytes().to_vec(),
                        text("payment"),
                        text("pay-1"),
                        version.to_be_bytes().to_vec(),
                        text("PaymentCreated"),
                        1i32.to_be_bytes().to_vec(),
                        text("application/json"),
                        br#"{"amount":1}"#.to_vec(),
                        jsonb(r#"{"traceparent": "00-ab"}"#),
                        text("payments.created"),
                        text("pay-1"),
                        micros.to_be_bytes().to_vec(),
                    ]
                })
        }

        /// What one column turns into.
        #[derive(Debug, Clone)]
        enum Change {
            Null,
            Unchanged,
            /// The text form instead of the binary one.
            Text,
            /// One byte short.
            Short,
            /// These bytes as the binary value.
            Bytes(Vec<u8>),
        }

        impl Change {
            fn apply(&self, valid: &[u8]) -> ColumnData {
                match self {
                    Self::Null => ColumnData::null(),
                    Self::Unchanged => ColumnData::unchanged(),
                    Self::Text => ColumnData::text(valid.to_vec()),
                    Self::Short => {
                        ColumnData::binary(valid[..valid.len().saturating_sub(1)].to_vec())
                    }
                    Self::Bytes(b) => ColumnData::binary(b.clone()),
                }
            }
        }

        fn change() -> impl Strategy<Value = Change> {
            prop_oneof![
                Just(Change::Null),
                Just(Change::Unchanged),
                Just(Change::Text),
                Just(Change::Short),
                hostile_text(12).prop_map(|t| Change::Bytes(t.into_bytes())),
                prop::sample::select(vec![
                    r#"{"t": null}"#,
                    r#"{"n": 1e999}"#,
                    r#"{"ce-id": "x"}"#,
                    "[1]",
                    "{",
                    "\"s\"",
                    r#"{"x": "a\u0007"}"#,
                ])
                .prop_map(|j| Change::Bytes(jsonb(j))),
                Just(Change::Bytes(i64::MAX.to_be_bytes().to_vec())),
                prop::collection::vec(any::<u8>(), 0..10).prop_map(Change::Bytes),
            ]
        }

        #[test]
        fn any_tuple_of_the_log() {
            let strategy = (
                valid(),
                prop::collection::vec((0usize..13, change()), 0..3),
                0usize..14,
            );
            fuzz::runner()
                .run(&strategy, |(values, changes, cut)| {
                    let mut tuple: Vec<ColumnData> =
                        values.iter().cloned().map(ColumnData::binary).collect();
                    let mut touched = Vec::new();
                    for (column, change) in &changes {
                        tuple[*column] = change.apply(&values[*column]);
                        touched.push(*column);
                    }
                    // Now and then a tuple shorter than the relation (a column missing).
                    if cut < 13 && changes.len() == 2 {
                        tuple.truncate(cut);
                        touched.extend(cut..13);
                    }
                    let key_touched = touched.iter().any(|c| KEY.contains(c));
                    match decode_row(&COLUMNS, &tuple) {
                        Err(e) => prop_assert!(
                            key_touched,
                            "the stream stopped on {e} for a row whose key was readable"
                        ),
                        Ok(Ok(m)) => {
                            prop_assert!(
                                m.check_publishable_reserving(&[crate::RESERVED_HEADERS])
                                    .is_ok(),
                                "{m:?}"
                            );
                            if !touched.contains(&0) {
                                prop_assert_eq!(
                                    m.id,
                                    i64::from_be_bytes(values[0].clone().try_into().unwrap())
                                );
                            }
                            if !touched.contains(&8) {
                                prop_assert_eq!(m.payload.bytes.as_ref(), values[8].as_slice());
                            }
                            prop_assert_eq!(m.fingerprint, Fingerprint::of(&m.payload.bytes));
                        }
                        Ok(Err(u)) => {
                            prop_assert!(
                                !touched.is_empty(),
                                "a valid row was refused: {}",
                                u.row.reason
                            );
                            prop_assert!(!u.row.reason.contains('\0'), "{:?}", u.row.reason);
                            prop_assert!(u.row.reason.chars().count() < 4096);
                            prop_assert_eq!(u.stored.id, u.row.id);
                        }
                    }
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
