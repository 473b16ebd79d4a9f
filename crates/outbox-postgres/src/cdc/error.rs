//! [`CdcError`]: why the CDC stream failed or could not start.

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
