//! The write path: everything here runs on the caller's executor (their open transaction) and
//! never opens, commits or rolls back a transaction of its own.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::limits::MessageLimits;
use outbox_core::{Fingerprint, NewMessage, ReservedHeaders};
use sqlx::{AssertSqlSafe, PgConnection, PgExecutor, PgPool};
use tokio::sync::mpsc;
use tracing::warn;

use crate::error::{EnqueueError, IdempotencyError};
use crate::permission::{Component, PermissionDenied};
use crate::schema::Schema;
use crate::sql::Sql;

/// The header names the events table refuses in a pending row (migration 12, the
/// `events_publishable` constraint), in any case: prefixes `ce-`, `ce_`, `cloudevents` and
/// `nats-`, and the name `content-type`. They are the names the transports of the toolkit set
/// themselves when that migration was written (each transport declares its own in its registry
/// entry), fixed in the schema so that a plain-SQL producer cannot write a row the relay could
/// not publish to any of them.
///
/// [`PgOutbox`] refuses them before any SQL runs, and the relay dead-letters a row that holds
/// one (written before the constraint). A broker that reserves other names is served by
/// [`PgOutbox::reserve_headers`] with the registry's reservations; the table does not know them,
/// and that broker's transport refuses such a row at publish.
pub const RESERVED_HEADERS: ReservedHeaders = ReservedHeaders {
    prefixes: &["ce-", "ce_", "cloudevents", "nats-"],
    names: &["content-type"],
};

/// The producer API for one schema. Cheap to clone; build it once at startup.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_core::{NewMessage, Payload};
/// use outbox_postgres::{PgOutbox, Schema};
///
/// let outbox = PgOutbox::new(Schema::new("outbox")?);
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO payments (id, amount) VALUES ($1, $2)")
///     .bind("pay-1").bind(100_i64).execute(&mut *tx).await?;
/// let version = outbox.next_aggregate_version(&mut *tx, "payment", "pay-1").await?;
/// let msg = NewMessage::new("payment", "pay-1", version, "PaymentCreated",
///     Payload::json(&serde_json::json!({"id": "pay-1", "amount": 100}))?);
/// outbox.enqueue(&mut *tx, &msg).await?;
/// tx.commit().await?; // business row and intent commit together, or neither does
/// # Ok(()) }
/// ```
///
/// # Limits
///
/// Every message is checked before any SQL runs: [`NewMessage::validate_reserving`] (field
/// lengths, header names and values, a printable media type, valid JSON when the content type
/// says JSON, and no header name the table reserves, [`RESERVED_HEADERS`], or that
/// [`PgOutbox::reserve_headers`] added) and the size limits of [`MessageLimits`] (payload, header
/// count and sizes; defaults in its docs, set others with [`PgOutbox::with_limits`]). A refused
/// message is an
/// [`EnqueueError::Invalid`] naming the rule, and nothing is written. Producers that write the
/// table with plain SQL bypass these checks and must keep their own bounds.
///
/// # Rows deleted in the transaction (CDC relay only)
///
/// With [`PgOutbox::delete_in_transaction`], every enqueue deletes its rows again in the same
/// transaction and the same round trip (the schema's `enqueue_deleted` function): the log still
/// carries the inserts, which the CDC relay streams and publishes, and the table stays empty,
/// so the relay has nothing to delete afterwards. Debezium's outbox users know the pattern.
/// What it gives up, and why it is off by default:
///
/// * **Only the CDC relay** delivers such events; the polling relay never sees them. Turn the
///   option off, and let the CDC relay drain its slot, before switching to polling.
/// * **A lost slot loses them**: the recovery of a dropped or invalidated slot republishes what
///   the table holds (docs/guide/src/relay.md, "A lost slot"), and these rows are not there.
/// * **Duplicates** of an event id or of an aggregate version are refused only within one
///   `enqueue` / `enqueue_batch` call ([`EnqueueError::DuplicateEventId`],
///   [`EnqueueError::VersionConflict`]): each call deletes its rows before it returns, and the
///   unique constraints see only rows still in the table. Version order is unaffected
///   ([`PgOutbox::next_aggregate_version`] keeps its own counter).
/// * **Grants**: the producer's role also needs `DELETE` and `SELECT (event_id)` on `events`;
///   the roles of `outbox roles` do not have them. Without them the enqueue fails with
///   [`EnqueueError::PermissionDenied`].
///
/// An event the CDC relay cannot publish (a dead letter, or one of an aggregate waiting behind
/// a dead letter) is written back into the table by the relay when it runs with
/// `CdcConfig::producers_delete_rows` (`relay.cdc_producers_delete_rows`), so nothing is lost
/// there.
#[derive(Debug, Clone)]
pub struct PgOutbox {
    schema: Schema,
    sql: Arc<Sql>,
    limits: MessageLimits,
    reserved_headers: Vec<ReservedHeaders>,
    delete_in_transaction: bool,
}

/// The outcome of [`PgOutbox::idempotency_begin`].
#[derive(Debug, Clone, PartialEq)]
pub enum IdempotencyBegin {
    /// First time this key is seen: run the command, then call
    /// [`PgOutbox::idempotency_complete`] in the same transaction.
    New,
    /// The command already ran with the same request: return this stored response, run nothing.
    Replay(serde_json::Value),
}

impl PgOutbox {
    /// The producer API for `schema`.
    pub fn new(schema: Schema) -> Self {
        let sql = Arc::new(Sql::new(&schema));
        Self {
            schema,
            sql,
            limits: MessageLimits::default(),
            reserved_headers: vec![RESERVED_HEADERS],
            delete_in_transaction: false,
        }
    }

    /// Deletes every row it writes again in the same transaction, for the CDC relay. See "Rows
    /// deleted in the transaction" above: the polling relay cannot deliver such events, and a
    /// lost slot loses them.
    ///
    /// ```
    /// use outbox_postgres::{PgOutbox, Schema};
    /// let outbox = PgOutbox::new(Schema::new("outbox").unwrap()).delete_in_transaction(true);
    /// assert!(outbox.deletes_in_transaction());
    /// ```
    pub fn delete_in_transaction(mut self, on: bool) -> Self {
        self.delete_in_transaction = on;
        self
    }

    /// Whether enqueues delete their rows in the same transaction.
    pub fn deletes_in_transaction(&self) -> bool {
        self.delete_in_transaction
    }

    /// Uses `limits` instead of [`MessageLimits::default`] for every enqueue.
    ///
    /// ```
    /// use outbox_core::limits::MessageLimits;
    /// use outbox_postgres::{PgOutbox, Schema};
    /// let outbox = PgOutbox::new(Schema::new("outbox").unwrap())
    ///     .with_limits(MessageLimits { max_payload_bytes: 256 * 1024, ..MessageLimits::default() });
    /// assert_eq!(outbox.limits().max_payload_bytes, 256 * 1024);
    /// ```
    pub fn with_limits(mut self, limits: MessageLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits every enqueue checks.
    pub fn limits(&self) -> &MessageLimits {
        &self.limits
    }

    /// Also refuses, at enqueue, the header names of `reserved`, besides the table's own
    /// ([`RESERVED_HEADERS`]): typically every broker's of the build, so that a broker whose
    /// binding reserves names the table does not know refuses them here rather than at publish.
    ///
    /// ```
    /// use outbox_core::{NewMessage, Payload, ReservedHeaders};
    /// use outbox_postgres::{PgOutbox, RESERVED_HEADERS, Schema};
    /// // A broker of the build, as `outbox::brokers().reserved_headers()` lists them.
    /// const ACME: ReservedHeaders = ReservedHeaders { prefixes: &["acme-"], names: &[] };
    /// let outbox = PgOutbox::new(Schema::new("outbox").unwrap()).reserve_headers([ACME]);
    /// assert_eq!(outbox.reserved_headers(), &[RESERVED_HEADERS, ACME]);
    /// ```
    pub fn reserve_headers(mut self, reserved: impl IntoIterator<Item = ReservedHeaders>) -> Self {
        for r in reserved {
            if !self.reserved_headers.contains(&r) {
                self.reserved_headers.push(r);
            }
        }
        self
    }

    /// The header names every enqueue refuses: the table's, then those added.
    pub fn reserved_headers(&self) -> &[ReservedHeaders] {
        &self.reserved_headers
    }

    /// Validation and limits, before any SQL runs.
    fn check(&self, message: &NewMessage) -> Result<(), EnqueueError> {
        message.validate_reserving(&self.reserved_headers)?;
        self.limits.check(message)?;
        Ok(())
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Writes one outbox row with the caller's executor, normally `&mut *tx` of the
    /// transaction that also writes the business rows.
    ///
    /// # Transactions
    /// Never commits: the row becomes visible to the relay when, and only if, the caller's
    /// transaction commits.
    ///
    /// # Errors
    /// [`EnqueueError::Invalid`] before any SQL runs, when the message breaks a rule or a
    /// limit (see "Limits" on [`PgOutbox`]; the [`outbox_core::MessageError`] inside names it:
    /// `PayloadTooLarge`, `TooManyHeaders`, `HeaderValueTooLong`, `HeadersTooLarge`,
    /// `BadContentType`, `PayloadNotJson`, `BadHeaderValue` …); the caller's transaction is
    /// untouched then. [`EnqueueError::DuplicateEventId`] or [`EnqueueError::VersionConflict`]
    /// from the unique constraints; [`EnqueueError::PermissionDenied`] when the role lacks the
    /// producer grants; otherwise [`EnqueueError::Database`]. After a database error the
    /// caller's transaction is aborted.
    pub async fn enqueue<'e, E: PgExecutor<'e>>(
        &self,
        executor: E,
        message: &NewMessage,
    ) -> Result<(), EnqueueError> {
        self.check(message)?;
        if self.delete_in_transaction {
            let sql = &self.sql.enqueue_deleted;
            return self
                .insert_rows(executor, std::slice::from_ref(message), sql)
                .await;
        }
        let headers = serde_json::to_string(&message.headers).expect("string map serialises");
        sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.insert_event)))
            .bind(message.event_id)
            .bind(&message.aggregate_type)
            .bind(&message.aggregate_id)
            .bind(message.aggregate_version)
            .bind(&message.event_type)
            .bind(message.schema_version)
            .bind(&message.payload.content_type.0)
            .bind(message.payload.bytes.as_ref())
            .bind(headers)
            .bind(&message.destination)
            .bind(&message.partition_key)
            .execute(executor)
            .await
            .map_err(|e| classify(e, std::slice::from_ref(message)))?;
        Ok(())
    }

    /// Writes several outbox rows in one statement (one round trip), in the given order.
    ///
    /// # Errors
    /// As [`PgOutbox::enqueue`]; nothing is written when any message is invalid.
    pub async fn enqueue_batch<'e, E: PgExecutor<'e>>(
        &self,
        executor: E,
        messages: &[NewMessage],
    ) -> Result<(), EnqueueError> {
        if messages.is_empty() {
            return Ok(());
        }
        for m in messages {
            self.check(m)?;
        }
        let sql = if self.delete_in_transaction {
            &self.sql.enqueue_deleted
        } else {
            &self.sql.insert_events
        };
        self.insert_rows(executor, messages, sql).await
    }

    /// Binds `messages` as the eleven column arrays of the multi-row insert (and of the
    /// schema's `enqueue_deleted` function, which inserts and deletes the rows again: see
    /// [`PgOutbox::delete_in_transaction`]) and runs `sql`.
    async fn insert_rows<'e, E: PgExecutor<'e>>(
        &self,
        executor: E,
        messages: &[NewMessage],
        sql: &Arc<str>,
    ) -> Result<(), EnqueueError> {
        let col = |f: fn(&NewMessage) -> String| messages.iter().map(f).collect::<Vec<_>>();
        let ids: Vec<_> = messages.iter().map(|m| m.event_id).collect();
        let versions: Vec<i64> = messages.iter().map(|m| m.aggregate_version).collect();
        let schema_versions: Vec<i32> = messages.iter().map(|m| m.schema_version).collect();
        let payloads: Vec<&[u8]> = messages.iter().map(|m| m.payload.bytes.as_ref()).collect();
        let destinations: Vec<Option<String>> =
            messages.iter().map(|m| m.destination.clone()).collect();
        let keys: Vec<Option<String>> = messages.iter().map(|m| m.partition_key.clone()).collect();
        sqlx::query(AssertSqlSafe(Arc::clone(sql)))
            .bind(ids)
            .bind(col(|m| m.aggregate_type.clone()))
            .bind(col(|m| m.aggregate_id.clone()))
            .bind(versions)
            .bind(col(|m| m.event_type.clone()))
            .bind(schema_versions)
            .bind(col(|m| m.payload.content_type.0.clone()))
            .bind(payloads)
            .bind(col(|m| {
                serde_json::to_string(&m.headers).expect("string map serialises")
            }))
            .bind(destinations)
            .bind(keys)
            .execute(executor)
            .await
            .map_err(|e| classify(e, messages))?;
        Ok(())
    }

    /// Allocates the next version of an aggregate (1 for a new one) inside the caller's
    /// transaction.
    ///
    /// # Transactions, locks
    /// Takes a row lock on the aggregate's counter that is held until the caller's transaction
    /// ends. A second transaction allocating for the same aggregate waits for the first to
    /// commit or roll back, so an aggregate's versions always commit in version order, which is
    /// what lets the relay publish them in order. Allocate late in the transaction to keep the
    /// lock short; different aggregates never wait for each other.
    ///
    /// # Errors
    /// [`sqlx::Error`] from the database (including a lock timeout you configured).
    pub async fn next_aggregate_version<'e, E: PgExecutor<'e>>(
        &self,
        executor: E,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(AssertSqlSafe(Arc::clone(&self.sql.next_version)))
            .bind(aggregate_type)
            .bind(aggregate_id)
            .fetch_one(executor)
            .await
    }

    /// Starts an idempotent command inside the caller's transaction: records `key` within
    /// `scope` with the request's fingerprint, or finds the earlier record.
    ///
    /// This is *request* idempotency (a client retrying `CreatePayment`). It is unrelated to the
    /// consumer inbox, which deduplicates *events*.
    ///
    /// # Transactions, locks
    /// The insert takes the key's unique-index lock until the caller's transaction ends, so a
    /// concurrent request with the same key waits, then sees the committed result (a replay) or,
    /// if the first rolled back, becomes the new owner.
    ///
    /// # Errors
    /// * [`IdempotencyError::Conflict`]: the key was used with a different request fingerprint.
    /// * [`IdempotencyError::Incomplete`]: a committed record has no response.
    /// * [`IdempotencyError::PermissionDenied`]: the role lacks the producer grants.
    /// * [`IdempotencyError::Database`].
    pub async fn idempotency_begin(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        request: Fingerprint,
    ) -> Result<IdempotencyBegin, IdempotencyError> {
        let inserted = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.idem_insert)))
            .bind(scope)
            .bind(key)
            .bind(&request.0[..])
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if inserted == 1 {
            return Ok(IdempotencyBegin::New);
        }
        let (stored, response): (Vec<u8>, Option<serde_json::Value>) =
            sqlx::query_as(AssertSqlSafe(Arc::clone(&self.sql.idem_select)))
                .bind(scope)
                .bind(key)
                .fetch_one(&mut *conn)
                .await?;
        if stored != request.0 {
            return Err(IdempotencyError::Conflict {
                key: key.to_owned(),
            });
        }
        match response {
            Some(r) => Ok(IdempotencyBegin::Replay(r)),
            None => Err(IdempotencyError::Incomplete {
                key: key.to_owned(),
            }),
        }
    }

    /// Stores the command's response for later replays, in the same transaction as
    /// [`PgOutbox::idempotency_begin`] and the command's writes.
    ///
    /// # Errors
    /// [`IdempotencyError::NotStarted`] when no open record exists for the key;
    /// [`IdempotencyError::PermissionDenied`] when the role lacks the producer grants;
    /// [`IdempotencyError::Database`].
    pub async fn idempotency_complete(
        &self,
        conn: &mut PgConnection,
        scope: &str,
        key: &str,
        response: &serde_json::Value,
    ) -> Result<(), IdempotencyError> {
        let n = sqlx::query(AssertSqlSafe(Arc::clone(&self.sql.idem_complete)))
            .bind(scope)
            .bind(key)
            .bind(response)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        if n == 1 {
            Ok(())
        } else {
            Err(IdempotencyError::NotStarted {
                key: key.to_owned(),
            })
        }
    }

    /// Sends one wake-up to the relays of this schema. Call it *after* your commit, never
    /// inside the business transaction: `NOTIFY` takes a global lock at commit time and would
    /// serialise every producer commit. Prefer [`RelayWaker`], which coalesces wake-ups.
    ///
    /// # Errors
    /// [`sqlx::Error`]; a lost wake-up only delays delivery until the relay's next poll.
    pub async fn notify_relays<'e, E: PgExecutor<'e>>(
        &self,
        executor: E,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(self.schema.wakeup_channel())
            .execute(executor)
            .await
            .map(|_| ())
    }
}

fn classify(e: sqlx::Error, messages: &[NewMessage]) -> EnqueueError {
    if let sqlx::Error::Database(db) = &e {
        let detail = db.message().to_owned();
        match db.constraint() {
            Some("events_event_id_key") => {
                let id = messages
                    .iter()
                    .find(|m| detail.contains(&m.event_id.to_string()))
                    .unwrap_or(&messages[0])
                    .event_id;
                return EnqueueError::DuplicateEventId(id);
            }
            Some("events_aggregate_version_key") => {
                let m = &messages[0];
                if messages.len() == 1 {
                    return EnqueueError::VersionConflict {
                        aggregate_type: m.aggregate_type.clone(),
                        aggregate_id: m.aggregate_id.clone(),
                        version: m.aggregate_version,
                    };
                }
            }
            _ => {}
        }
    }
    match PermissionDenied::from_sqlx(&e, None, Some(Component::Producer)) {
        Some(p) => EnqueueError::PermissionDenied(p),
        None => EnqueueError::Database(e),
    }
}

/// Coalescing, rate-limited wake-ups for relays, sent outside any business transaction.
///
/// [`RelayWaker::wake`] never blocks and never fails: it flags that a wake-up is due. A
/// background task sends at most one `NOTIFY` per `min_interval`, so a producer committing
/// 10,000 times a second costs the database at most `1 / min_interval` tiny notifications.
/// Relays also poll, so a lost wake-up only costs latency.
#[derive(Debug, Clone)]
pub struct RelayWaker {
    tx: mpsc::Sender<()>,
}

impl RelayWaker {
    /// Starts the background sender on the current tokio runtime. It stops when the last clone
    /// of the waker is dropped or when `pool` is closed, whichever comes first; wake-ups after
    /// that are ignored.
    pub fn spawn(pool: PgPool, outbox: &PgOutbox, min_interval: Duration) -> Self {
        let (tx, mut rx) = mpsc::channel::<()>(1);
        let outbox = outbox.clone();
        tokio::spawn(async move {
            let send = async {
                while rx.recv().await.is_some() {
                    if let Err(e) = outbox.notify_relays(&pool).await {
                        warn!(error = %e, "relay wake-up failed; relays will pick the work up on their next poll");
                    }
                    tokio::time::sleep(min_interval).await;
                }
            };
            tokio::select! {
                () = pool.close_event() => {}
                () = send => {}
            }
        });
        Self { tx }
    }

    /// Asks for a wake-up (call after commit).
    pub fn wake(&self) {
        let _ = self.tx.try_send(());
    }

    /// Whether the background sender still runs (false once its pool was closed).
    pub fn is_running(&self) -> bool {
        !self.tx.is_closed()
    }
}
