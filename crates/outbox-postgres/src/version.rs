//! Versions from the aggregate's own row: [`AggregateRow`].

use std::sync::Arc;

use sqlx::postgres::Postgres;
use sqlx::{AssertSqlSafe, PgExecutor};

use crate::schema::{plain_identifier, quote_ident};

/// Why an [`AggregateRow`] was refused: a name that is not a plain SQL identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid {what} `{name}`: use 1 to 63 characters, lower-case ASCII letters, digits and `_`, not starting with a digit (a table may be `schema.table`)"
)]
pub struct InvalidAggregateRow {
    /// `table`, `id column` or `version column`.
    pub what: &'static str,
    /// The name given.
    pub name: String,
}

/// Why [`AggregateRow::next_version`] failed. The caller's transaction should be rolled back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AggregateRowError {
    /// No row has this id: the aggregate does not exist (yet). Insert its row, with version 1,
    /// in the transaction that creates it, and give its first event version 1.
    #[error("no row in {table} has this id: the aggregate does not exist")]
    NotFound {
        /// The table, as configured.
        table: String,
    },
    /// Any database error: a missing table or column, a type mismatch between the id given and
    /// the id column, a version column that is not an integer, a lock timeout you configured,
    /// a lost connection.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}

/// An aggregate table whose rows carry their own version column: where an aggregate's event
/// versions come from when the aggregate has a row of its own.
///
/// The relay publishes an aggregate's events in version order, which is only safe when the
/// versions also *commit* in that order. Two ways give that guarantee:
///
/// * [`crate::PgOutbox::next_aggregate_version`]: the outbox's allocator table, one counter row
///   per aggregate, locked until the caller's transaction ends. Works for any aggregate, costs
///   one more statement and one more row write per transaction.
/// * **The aggregate's own row** (an account, a payment, a bet): a `version` column incremented
///   by the same `UPDATE` that changes the aggregate. The `UPDATE` takes the row lock the
///   business change needs anyway; a second transaction on the same aggregate waits for the
///   first to end, then increments the committed value (READ COMMITTED re-reads the row), so
///   the versions commit in order, and a rolled-back increment gives its version back. This is
///   the cheaper path (W1 in BENCHMARKS.md) and the one to prefer.
///
/// The cheapest form is no extra statement at all: add `version = version + 1` and
/// `RETURNING version` to the business `UPDATE` and pass the returned value to
/// [`outbox_core::NewMessage::new`]:
///
/// ```sql
/// UPDATE accounts SET balance = balance - $1, version = version + 1
///  WHERE id = $2 RETURNING version
/// ```
///
/// [`AggregateRow::next_version`] is the same as a statement of its own, for transactions
/// whose business change does not update the aggregate's row. Both forms follow these rules:
///
/// * **One increment, one event**: every increment goes with exactly one event of that version,
///   enqueued in the same transaction. A column that also changes without an event (an
///   optimistic-locking counter, say) leaves gaps, and a consumer that waits for the next
///   version ([`crate::OrderingGuard`]) waits for a version that never comes: give the outbox
///   a column of its own.
/// * **The same transaction**: the executor is the transaction that enqueues. A pool compiles,
///   but then the increment commits alone.
/// * **A unique id column**: each increment must touch one row.
/// * A new aggregate's row is inserted with version 1 (`INSERT ... (version) VALUES (1)`) in
///   the transaction that creates it, and its first event carries version 1.
/// * Under REPEATABLE READ or SERIALIZABLE, the second of two concurrent writers of one
///   aggregate fails with a serialization error (SQLSTATE 40001) instead of waiting: retry its
///   transaction, as for any write conflict at those levels.
///
/// # Example
/// ```no_run
/// # async fn f(pool: sqlx::PgPool, outbox: outbox_postgres::PgOutbox) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_core::{NewMessage, Payload};
/// use outbox_postgres::AggregateRow;
///
/// let accounts = AggregateRow::new("public.accounts", "id", "version")?;
/// let mut tx = pool.begin().await?;
/// let version = accounts.next_version(&mut *tx, "acc-1").await?;
/// let event = NewMessage::new("account", "acc-1", version, "AccountFrozen",
///     Payload::json(&serde_json::json!({"id": "acc-1"}))?);
/// outbox.enqueue(&mut *tx, &event).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AggregateRow {
    table: String,
    sql: Arc<str>,
}

impl AggregateRow {
    /// An aggregate table `table` (`name` or `schema.name`) keyed by `id_column`, whose
    /// `version_column` holds the version of the aggregate's latest event (a `bigint` or
    /// `integer`, `NOT NULL`).
    ///
    /// # Errors
    /// [`InvalidAggregateRow`] when a name is not a plain lower-case identifier (the names are
    /// placed, quoted, in SQL text; a name with upper-case letters or other characters would
    /// read differently in `psql`, so it is refused rather than guessed).
    pub fn new(
        table: &str,
        id_column: &str,
        version_column: &str,
    ) -> Result<Self, InvalidAggregateRow> {
        let refuse = |what: &'static str, name: &str| InvalidAggregateRow {
            what,
            name: name.to_owned(),
        };
        let parts: Vec<&str> = table.split('.').collect();
        if parts.len() > 2 || !parts.iter().all(|p| plain_identifier(p)) {
            return Err(refuse("table", table));
        }
        if !plain_identifier(id_column) {
            return Err(refuse("id column", id_column));
        }
        if !plain_identifier(version_column) {
            return Err(refuse("version column", version_column));
        }
        let quoted_table = parts
            .iter()
            .map(|p| quote_ident(p))
            .collect::<Vec<_>>()
            .join(".");
        let (id, version) = (quote_ident(id_column), quote_ident(version_column));
        Ok(Self {
            table: table.to_owned(),
            sql: format!(
                "UPDATE {quoted_table} SET {version} = {version} + 1 WHERE {id} = $1 \
                 RETURNING {version}::int8"
            )
            .into(),
        })
    }

    /// The statement [`AggregateRow::next_version`] runs, for review or for a statement of
    /// your own (`$1` is the aggregate id).
    pub fn statement(&self) -> &str {
        &self.sql
    }

    /// Increments the version of aggregate `id` in the caller's transaction and returns it:
    /// the version of the event about to be enqueued.
    ///
    /// # Transactions, locks
    /// Takes the aggregate row's lock until the caller's transaction ends: a second
    /// transaction on the same aggregate waits, then increments past this one's version, so
    /// the aggregate's versions commit in version order (what the relay's ordering relies on).
    /// If the business change updates this row anyway, fold the increment into that `UPDATE`
    /// instead (see [`AggregateRow`]): the same guarantee with no extra statement.
    ///
    /// # Errors
    /// [`AggregateRowError::NotFound`] when no row has this id (nothing was changed);
    /// [`AggregateRowError::Database`] otherwise. After a database error the caller's
    /// transaction is aborted.
    pub async fn next_version<'e, 'q, E, I>(
        &self,
        executor: E,
        id: I,
    ) -> Result<i64, AggregateRowError>
    where
        E: PgExecutor<'e>,
        I: 'q + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send,
    {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(Arc::clone(&self.sql)))
            .bind(id)
            .fetch_optional(executor)
            .await?
            .ok_or_else(|| AggregateRowError::NotFound {
                table: self.table.clone(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_identifiers_and_the_statement_quotes_them() {
        let row = AggregateRow::new("bank.accounts", "id", "version").unwrap();
        assert_eq!(
            row.statement(),
            "UPDATE \"bank\".\"accounts\" SET \"version\" = \"version\" + 1 WHERE \"id\" = $1 \
             RETURNING \"version\"::int8"
        );
        assert!(AggregateRow::new("accounts", "account_id", "v").is_ok());
        for (table, id, version, what) in [
            ("a.b.c", "id", "version", "table"),
            ("Accounts", "id", "version", "table"),
            ("accounts;drop", "id", "version", "table"),
            ("", "id", "version", "table"),
            ("accounts", "id\"", "version", "id column"),
            ("accounts", "id", "1v", "version column"),
        ] {
            let err = AggregateRow::new(table, id, version).unwrap_err();
            assert_eq!(err.what, what, "{table} {id} {version}");
        }
    }
}
