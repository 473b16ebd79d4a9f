//! Errors of the producer API and migrations.

use outbox_core::{EventId, MessageError, StoreError, StoreErrorKind};

use crate::permission::{Component, PermissionDenied};

/// Why [`crate::PgOutbox::enqueue`] failed. The caller's transaction should be rolled back on
/// any of these (PostgreSQL aborts it anyway after a failed statement).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    /// The message broke a rule or a size limit before reaching the database; nothing was
    /// written and the caller's transaction is still usable. The [`MessageError`] names the
    /// rule (e.g. [`MessageError::PayloadTooLarge`] with the size and the limit).
    #[error("invalid message: {0}")]
    Invalid(#[from] MessageError),
    /// An event with this id is already stored: event ids are never reused.
    #[error("event id {0} is already in the outbox")]
    DuplicateEventId(EventId),
    /// This aggregate already has an event with this version.
    #[error("aggregate {aggregate_type}/{aggregate_id} already has version {version}")]
    VersionConflict {
        /// Aggregate type.
        aggregate_type: String,
        /// Aggregate id.
        aggregate_id: String,
        /// The version that was taken.
        version: i64,
    },
    /// The connected role lacks a producer grant (SQLSTATE 42501).
    #[error("{0}")]
    PermissionDenied(PermissionDenied),
    /// Any other database error (connection lost, schema missing ...).
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Why request idempotency refused a command.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdempotencyError {
    /// The key was used before with a different request: a client bug or a key collision. The
    /// command must not run.
    #[error("idempotency key `{key}` was first used with a different request")]
    Conflict {
        /// The key.
        key: String,
    },
    /// A transaction committed a `begin` without `complete`; the stored result is unknown.
    #[error("idempotency key `{key}` has no stored response (begin committed without complete)")]
    Incomplete {
        /// The key.
        key: String,
    },
    /// `complete` was called for a key that `begin` did not create in this transaction.
    #[error("idempotency key `{key}` is not open in this transaction")]
    NotStarted {
        /// The key.
        key: String,
    },
    /// The connected role lacks a producer grant (SQLSTATE 42501).
    #[error("{0}")]
    PermissionDenied(PermissionDenied),
    /// Database error.
    #[error("database error: {0}")]
    Database(sqlx::Error),
}

impl From<sqlx::Error> for IdempotencyError {
    fn from(e: sqlx::Error) -> Self {
        match PermissionDenied::from_sqlx(&e, None, Some(Component::Producer)) {
            Some(p) => Self::PermissionDenied(p),
            None => Self::Database(e),
        }
    }
}

/// Why migrations failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// The database holds a schema version this library does not know: it was migrated by a
    /// newer release. Upgrade this binary; never run an older one against it.
    #[error(
        "schema `{schema}` is at version {found}, newer than the {known} this release knows; upgrade the outbox binary/library"
    )]
    NewerSchema {
        /// Schema name.
        schema: String,
        /// Highest version in the database.
        found: i32,
        /// Highest version known here.
        known: i32,
    },
    /// An applied migration's text differs from this release's: the schema was changed by hand
    /// or by a modified release.
    #[error(
        "migration {version} applied in schema `{schema}` differs from this release's ({name})"
    )]
    Modified {
        /// Schema name.
        schema: String,
        /// Migration number.
        version: i32,
        /// Migration name.
        name: String,
    },
    /// The schema was not migrated (or only partly): run `outbox migrate`.
    #[error(
        "schema `{schema}` is at version {found}, this release needs {needed}: run `outbox migrate`"
    )]
    NotMigrated {
        /// Schema name.
        schema: String,
        /// Version found (0 = none).
        found: i32,
        /// Version needed.
        needed: i32,
    },
    /// The connected role may not read the schema (or, migrating, may not change it): a
    /// missing grant, not a missing migration. The message names the role and what to run.
    #[error("{0}")]
    PermissionDenied(PermissionDenied),
    /// A mark-mode index ([`crate::migrate_mark_mode`]) is not there, or not valid, after its
    /// build: another object holds its name, or the build was interrupted. The message names it.
    #[error(
        "index `{index}` of schema `{schema}` is missing or invalid after `CREATE INDEX CONCURRENTLY`: another relation may hold the name; drop it, then run `outbox migrate` again"
    )]
    IndexNotBuilt {
        /// Schema name.
        schema: String,
        /// Index name.
        index: String,
    },
    /// Database error.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// Maps a driver error to the core's store error kinds.
pub(crate) fn store_error(context: &str, e: sqlx::Error) -> StoreError {
    store_error_as(None, None, context, e)
}

/// [`store_error`], naming `role` and the `component` whose grants the statement needs when
/// the database refused it for lack of a privilege.
pub(crate) fn store_error_as(
    role: Option<&str>,
    component: Option<Component>,
    context: &str,
    e: sqlx::Error,
) -> StoreError {
    if let Some(denied) = PermissionDenied::from_sqlx(&e, role, component) {
        return StoreError::with_source(
            StoreErrorKind::PermissionDenied,
            format!("{context}: {denied}"),
            e,
        );
    }
    let kind = match &e {
        sqlx::Error::Encode(_) => StoreErrorKind::InvalidData,
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => StoreErrorKind::Unavailable,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // undefined_table / undefined_column / invalid_schema_name
            Some("42P01" | "42703" | "3F000") => StoreErrorKind::Schema,
            // connection exceptions, admin shutdown, cannot connect now
            Some(c) if c.starts_with("08") || c.starts_with("57P") => StoreErrorKind::Unavailable,
            // serialization failure, deadlock
            Some("40001" | "40P01") => StoreErrorKind::Contention,
            Some(c) if c.starts_with("23") => StoreErrorKind::Constraint,
            // data exceptions (bytes or text the column cannot hold, NUL in text, bad encoding)
            // and program limits (an index row larger than a btree page can hold)
            Some(c) if c.starts_with("22") || c == "54000" => StoreErrorKind::InvalidData,
            Some("42501") => StoreErrorKind::PermissionDenied,
            _ => StoreErrorKind::Other,
        },
        _ => StoreErrorKind::Other,
    };
    StoreError::with_source(kind, format!("{context}: {e}"), e)
}
