//! Errors shared by the engines and the traits they run against.

use std::error::Error as StdError;

/// What went wrong in a store call (any of the store traits), coarse enough to decide what to
/// do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The database could not be reached or the connection broke. Retry later.
    Unavailable,
    /// The transaction lost to a concurrent one (serialization failure, deadlock): the same work
    /// usually succeeds when retried soon, but a delivery that loses every time is a defect
    /// (a handler that deadlocks with itself), so the consumer engine counts it against
    /// `max_attempts` like any other database error instead of waiting it out as an outage.
    Contention,
    /// A claim's lease token no longer owns the rows: another relay took them over after the
    /// lease expired. The caller must drop the batch without marking anything.
    LeaseLost,
    /// The schema in the database is missing, older or newer than this library understands.
    Schema,
    /// A constraint rejected the write (duplicate event id or aggregate version, bad value).
    Constraint,
    /// The database refused the values themselves (bytes it cannot store, a key longer than an
    /// index can hold): retrying the same write can never succeed.
    InvalidData,
    /// The database refused the statement for lack of a privilege: a role is missing a grant.
    PermissionDenied,
    /// Anything else the database reported.
    Other,
}

/// Error returned by the store traits' methods.
#[derive(Debug, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct StoreError {
    kind: StoreErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl StoreError {
    /// Builds an error of `kind` with a human message.
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Builds an error of `kind` that wraps the driver's error.
    pub fn with_source(
        kind: StoreErrorKind,
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The human message (without the kind).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True when waiting and trying again may succeed (an outage, not a bug or a lost lease).
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, StoreErrorKind::Unavailable)
    }
}

/// A configuration value an engine refused, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration `{key}`: {reason}")]
pub struct ConfigError {
    /// The offending key (the field name of the engine's config struct).
    pub key: &'static str,
    /// What is wrong.
    pub reason: String,
}

impl ConfigError {
    /// Builds an error for `key`.
    pub fn new(key: &'static str, reason: impl Into<String>) -> Self {
        Self {
            key,
            reason: reason.into(),
        }
    }
}
