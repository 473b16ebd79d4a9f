//! The operator contract ([`outbox_core::operator`]) on PostgreSQL: [`PgStore`] implements
//! every topic's trait, one file per topic holding its SQL and its `impl`. The CLI's `status`,
//! `dead-letters`, `conflicts`, `consumer-dead-letters`, `effects`, `audit`, `trace`, `pause`
//! and `replay` and the web console (`outbox-console`) read and act through those traits.
//!
//! Every read here is one statement through the table's indexes or its partial indexes of
//! open rows, except where a topic's module says otherwise; nothing here holds a lock beyond
//! its own statement. Every action runs in one transaction with its audit record (`audit`,
//! schema version 8): the change and its record commit together, and a refused action leaves
//! neither (it is logged under `outbox::audit`). The pool's role decides what is allowed: the
//! operator role acts, the read-only role only reads (`crate::roles`).
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool) -> Result<(), outbox_core::operator::OperatorError> {
//! use outbox_core::operator::prelude::*;
//! use outbox_core::operator::{Actor, DeadLetterSelection};
//! use outbox_postgres::{PgStore, PgStoreConfig};
//! let store = PgStore::new(pool, PgStoreConfig::default());
//! let overview = store.overview().await?;
//! if overview.dead_letters > 0 {
//!     let me = Actor::new("alice", "runbook")?;
//!     let requeued = store
//!         .requeue_dead_letters(&DeadLetterSelection::All, &me, "broker limit raised")
//!         .await?;
//!     println!("requeued {requeued}");
//! }
//! # Ok(()) }
//! ```

mod audit;
mod conflicts;
mod dead_letters;
mod overview;
mod pauses;
mod processes;
mod replay;
mod trace;
mod work_items;

use outbox_core::operator::{Action, OperatorError, OperatorErrorKind};
use sqlx::{PgConnection, Postgres, Transaction};

use crate::effects::EffectsError;
use crate::permission::{Component, PermissionDenied, pool_role};
use crate::store::PgStore;

/// The operator error of a database failure in `operation`, classed by its SQLSTATE.
pub(crate) fn op_err(operation: &'static str, e: sqlx::Error) -> OperatorError {
    let kind = match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Tls(_) => OperatorErrorKind::Unavailable,
        // Shutting down, starting up, too many connections, connection failures.
        sqlx::Error::Database(d)
            if matches!(
                d.code().as_deref(),
                Some("57P01" | "57P02" | "57P03" | "53300")
            ) || d.code().is_some_and(|c| c.starts_with("08")) =>
        {
            OperatorErrorKind::Unavailable
        }
        sqlx::Error::Database(d) if d.code().as_deref() == Some("42501") => {
            OperatorErrorKind::PermissionDenied
        }
        sqlx::Error::Database(d) if d.code().as_deref() == Some("42P01") => {
            OperatorErrorKind::Schema
        }
        _ => OperatorErrorKind::Other,
    };
    OperatorError::new(operation, kind, e.to_string())
}

/// The operator error of a work-item failure in `operation`.
pub(crate) fn effects_err(operation: &'static str, e: EffectsError) -> OperatorError {
    let kind = match e {
        EffectsError::Database(e) => return op_err(operation, e),
        EffectsError::NotMigrated { .. } => OperatorErrorKind::Schema,
        EffectsError::PermissionDenied(_) => OperatorErrorKind::PermissionDenied,
        EffectsError::InvalidArgument { .. } => OperatorErrorKind::InvalidRequest,
        EffectsError::NotFound { .. } => OperatorErrorKind::NotFound,
        EffectsError::NotResolvable { .. } => OperatorErrorKind::Refused,
        _ => OperatorErrorKind::Other,
    };
    OperatorError::new(operation, kind, e.to_string())
}

impl PgStore {
    /// `template` with this store's schema.
    pub(crate) fn render(&self, template: &str) -> std::sync::Arc<str> {
        self.schema().render(template)
    }

    /// An action's error: a missing grant names the operator role's grants.
    pub(crate) fn action_error(&self, operation: &'static str, e: sqlx::Error) -> OperatorError {
        match PermissionDenied::from_sqlx(
            &e,
            Some(&pool_role(self.pool())),
            Some(Component::Operator),
        ) {
            Some(denied) => OperatorError::new(
                operation,
                OperatorErrorKind::PermissionDenied,
                denied.to_string(),
            ),
            None => op_err(operation, e),
        }
    }

    /// The transaction of an action.
    pub(crate) async fn begin_action(
        &self,
        action: &Action<'_>,
    ) -> Result<Transaction<'static, Postgres>, OperatorError> {
        self.pool()
            .begin()
            .await
            .map_err(|e| op_err(action.operation(), e))
    }

    /// Ends an action: on success records it and commits, on failure rolls back (the trait's
    /// provided method logs the outcome). Returns the rows changed.
    pub(crate) async fn finish_action(
        &self,
        tx: Transaction<'static, Postgres>,
        action: &Action<'_>,
        result: Result<u64, OperatorError>,
    ) -> Result<u64, OperatorError> {
        self.finish_action_with(tx, action, result.map(|n| (n, n)))
            .await
    }

    /// As [`finish_action`](Self::finish_action), for an action that returns a value beside
    /// the rows it changed.
    pub(crate) async fn finish_action_with<T>(
        &self,
        mut tx: Transaction<'static, Postgres>,
        action: &Action<'_>,
        result: Result<(u64, T), OperatorError>,
    ) -> Result<T, OperatorError> {
        let operation = action.operation();
        match result {
            Ok((n, value)) => match audit::record(&mut tx, self.schema(), action, n).await {
                Ok(_) => tx
                    .commit()
                    .await
                    .map(|()| value)
                    .map_err(|e| op_err(operation, e)),
                Err(e) => Err(self.action_error(operation, e)),
            },
            Err(e) => Err(e),
        }
    }

    /// Wakes the relays at the transaction's commit: requeued, replayed or resumed rows (and
    /// the ones parked behind them) move at once, wherever they lie.
    pub(crate) async fn wake_relays(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(self.schema().wakeup_channel())
            .bind(crate::schema::RESCAN)
            .execute(conn)
            .await
            .map(|_| ())
    }
}
