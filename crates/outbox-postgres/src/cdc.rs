//! Change data capture: the outbox table's committed inserts, streamed from PostgreSQL's log
//! through a logical replication slot, in commit order.
//!
//! This module is the log side of the CDC relay: it sets up the publication and the slot,
//! streams them, decodes each inserted row into an [`OutboxMessage`] and reports the log
//! position the relay confirmed. Publishing, ordering and dead letters stay in the relay's
//! engine; a CDC feed built on [`CdcStream`] confirms a transaction's position only after the
//! broker acknowledged every event of it (G3).
//!
//! [`OutboxMessage`]: outbox_core::OutboxMessage
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

mod config;
mod connection;
mod decode;
mod error;
mod feed;
mod slot;
mod stream;

pub use config::CdcConfig;
pub use decode::CdcUnpublishable;
pub(crate) use decode::{StoredRow, pg_time_text};
pub use error::CdcError;
pub use feed::{CdcFeed, CdcTicket};
pub(crate) use slot::parse_lsn;
pub use slot::{
    HEARTBEAT_PREFIX, SlotState, create_slot, drop_publication, drop_slot, ensure_publication,
    heartbeat, publication_exists, remove, slot_state,
};
pub use stream::{CdcEvent, CdcStream, CdcTransaction};

/// The table whose inserts are streamed.
const TABLE: &str = "events";

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

#[cfg(test)]
mod tests;
