//! The user's side of the engine: the [`Handler`] that applies an event on the inbox's
//! transaction, and the [`HandlerError`] that says whether a retry can help.

use std::future::Future;

use crate::wire::IncomingEvent;

/// A handler error, saying whether a retry can help.
///
/// Any error type converts into it with `?` as [`HandlerError::Transient`] (deadlocks,
/// serialization failures, a connection lost mid-handler all pass with a retry); return
/// [`HandlerError::Permanent`] yourself for what can never succeed. Like `anyhow::Error`, this
/// type does not implement [`std::error::Error`] itself, which is what makes that conversion
/// possible; it implements [`std::fmt::Display`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandlerError {
    /// May succeed later (a lock timeout, a dependency briefly down): redelivered with backoff.
    Transient(String),
    /// Will never succeed for this event (unknown schema version, invalid business state):
    /// dead-lettered at once.
    Permanent(String),
}

impl HandlerError {
    /// A permanent error with `reason`.
    pub fn permanent(reason: impl std::fmt::Display) -> Self {
        Self::Permanent(reason.to_string())
    }

    /// A transient error with `reason`.
    pub fn transient(reason: impl std::fmt::Display) -> Self {
        Self::Transient(reason.to_string())
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Transient(m) => write!(f, "transient: {m}"),
            Self::Permanent(m) => write!(f, "permanent: {m}"),
        }
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    /// Errors inside a handler are transient unless the handler says otherwise.
    fn from(e: E) -> Self {
        Self::Transient(e.to_string())
    }
}

/// The user's effect. It runs on the transaction that also holds the inbox row (`conn`, the
/// store's connection type: `sqlx::PgConnection` for PostgreSQL); it must not commit, and it
/// must not call remote services whose effect cannot be rolled back (write a work item instead,
/// see [`crate::effect`]). It may run more than once for one event (redeliveries, and in batch
/// mode a redo after another delivery's rollback); only a committed run counts. A panic inside
/// `handle` is caught: it counts as [`HandlerError::Transient`] (`handler panicked: …`), its
/// writes roll back, and the delivery is dead-lettered after `max_attempts` like any other
/// transient failure.
pub trait Handler<C>: Send + Sync + 'static {
    /// Applies `event` using `conn`.
    ///
    /// # Errors
    /// [`HandlerError`]: transient errors are retried, permanent ones dead-lettered.
    fn handle<'a>(
        &'a self,
        conn: &'a mut C,
        event: &'a IncomingEvent,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a;

    /// Applies several new events, in the order given, on one transaction. The engine's batch
    /// path (`batch_size > 1`, [`OrderingGuard::Off`]) calls it once per batch of two or more
    /// deliveries with every event the inbox found new, instead of [`Handler::handle`] per
    /// event (a batch of one delivery goes through `handle`). Override it to write a
    /// batch's effects with fewer statements (one multi-row `INSERT … SELECT FROM UNNEST(…)`):
    /// round trips inside the transaction are most of a consumer's latency, and a batch's
    /// transaction holds its deliveries until the commit.
    ///
    /// It must have exactly the effect of calling `handle` for each event in turn: when it
    /// fails (or panics), the whole batch is rolled back and redone one transaction per
    /// delivery with `handle`, which then decides each delivery's fate (a retry, a dead
    /// letter). The default calls `handle` for each event and stops at the first error.
    ///
    /// # Errors
    /// [`HandlerError`]: any error only triggers the redo one delivery at a time.
    ///
    /// [`OrderingGuard::Off`]: crate::consumer::OrderingGuard::Off
    fn handle_many<'a>(
        &'a self,
        conn: &'a mut C,
        events: &'a [&'a IncomingEvent],
    ) -> impl Future<Output = Result<(), HandlerError>> + Send + 'a
    where
        C: Send,
    {
        async move {
            for event in events {
                self.handle(conn, event).await?;
            }
            Ok(())
        }
    }
}
