//! Inbox retention that cannot delete a dedup identity inside the replay horizon (G9).
//!
//! An inbox row is what makes a redelivery harmless. Deleting it while the same event can still
//! arrive again (the broker still holds it, the outbox can still republish it, an operator can
//! still requeue it) would let that event apply twice. So the retention must be at least the
//! *replay horizon*: the longest of those windows. [`InboxRetention::validate`] refuses a
//! configuration that breaks this, naming both numbers; [`InboxMaintainer`] deletes old rows in
//! small batches, and only on the one instance that holds the maintainer lock.

use std::time::Duration;

use sqlx::{AssertSqlSafe, Connection, PgConnection};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::schema::Schema;

/// The windows during which an already-processed event can be delivered again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayHorizon {
    /// How long the broker keeps messages a consumer may re-read (JetStream stream `max_age`,
    /// a replayable queue's retention). Use the stream's configured value, not a hope.
    pub broker_retention: Duration,
    /// How long published outbox rows are kept and can be republished (mark mode, replays).
    pub outbox_retention: Duration,
    /// How long after failing a dead letter (outbox or consumer) may still be requeued.
    pub dead_letter_requeue_window: Duration,
}

impl ReplayHorizon {
    /// The longest window and its name.
    pub fn longest(&self) -> (Duration, &'static str) {
        [
            (self.broker_retention, "broker_retention"),
            (self.outbox_retention, "outbox_retention"),
            (
                self.dead_letter_requeue_window,
                "dead_letter_requeue_window",
            ),
        ]
        .into_iter()
        .max_by_key(|(d, _)| *d)
        .expect("three candidates")
    }
}

/// Why a retention configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unsafe inbox retention: keep = {keep_secs} s is shorter than the replay horizon {horizon_secs} s ({horizon_name}); an event replayed after its inbox identity was deleted would apply twice. Raise the retention to at least {horizon_secs} s or shorten {horizon_name}"
)]
pub struct RetentionError {
    /// The configured retention, seconds.
    pub keep_secs: u64,
    /// The replay horizon, seconds.
    pub horizon_secs: u64,
    /// Which window sets the horizon.
    pub horizon_name: &'static str,
}

/// Inbox retention settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxRetention {
    /// Keep inbox identities at least this long after they were received.
    pub keep: Duration,
    /// The replay horizon it must cover.
    pub horizon: ReplayHorizon,
    /// Rows deleted per statement (short transactions, little lock time).
    pub batch_size: i64,
    /// Pause between cleanup rounds.
    pub interval: Duration,
}

impl InboxRetention {
    /// Refuses a retention shorter than the replay horizon.
    ///
    /// # Errors
    /// [`RetentionError`] naming both numbers.
    pub fn validate(&self) -> Result<(), RetentionError> {
        let (horizon, name) = self.horizon.longest();
        if self.keep < horizon {
            return Err(RetentionError {
                keep_secs: self.keep.as_secs(),
                horizon_secs: horizon.as_secs(),
                horizon_name: name,
            });
        }
        Ok(())
    }
}

/// Deletes up to `batch_size` inbox rows received more than `keep` ago. Returns how many.
///
/// # Errors
/// [`sqlx::Error`].
pub async fn inbox_cleanup_batch(
    conn: &mut PgConnection,
    schema: &Schema,
    keep: Duration,
    batch_size: i64,
) -> Result<u64, sqlx::Error> {
    let s = format!("\"{}\"", schema.as_str());
    let sql = format!(
        "DELETE FROM {s}.inbox WHERE ctid = ANY(ARRAY(SELECT ctid FROM {s}.inbox \
         WHERE received_at < now() - $1 * interval '1 millisecond' LIMIT $2))"
    );
    Ok(sqlx::query(AssertSqlSafe(sql))
        .bind(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX))
        .bind(batch_size)
        .execute(conn)
        .await?
        .rows_affected())
}

/// Runs inbox cleanup on exactly one instance: the one holding a session-level advisory lock.
///
/// Every consumer process may run a maintainer; they elect themselves with
/// `pg_try_advisory_lock` on a dedicated connection. The lock lives as long as that
/// connection: if the leader dies or its connection breaks, PostgreSQL releases the lock and
/// another instance takes over at its next attempt. A leader that loses its connection stops
/// deleting at once (its next statement fails) and competes again.
pub struct InboxMaintainer {
    database_url: String,
    schema: Schema,
    retention: InboxRetention,
    work_items_keep: Option<Duration>,
}

impl InboxMaintainer {
    /// A maintainer; refuses an unsafe retention.
    ///
    /// # Errors
    /// [`RetentionError`].
    pub fn new(
        database_url: impl Into<String>,
        schema: Schema,
        retention: InboxRetention,
    ) -> Result<Self, RetentionError> {
        retention.validate()?;
        Ok(Self {
            database_url: database_url.into(),
            schema,
            retention,
            work_items_keep: None,
        })
    }

    /// Also deletes `succeeded` remote-effect work items resolved more than `keep` ago, in the
    /// same elected rounds and batch size ([`crate::effects::purge_succeeded`]). Work items in
    /// any other state are kept.
    pub fn with_work_item_retention(mut self, keep: Duration) -> Self {
        self.work_items_keep = Some(keep);
        self
    }

    /// One election + cleanup round. Returns `Ok(None)` when another instance is the leader,
    /// else the rows deleted (inbox identities, plus settled work items when
    /// [`Self::with_work_item_retention`] was set).
    ///
    /// # Errors
    /// [`sqlx::Error`].
    pub async fn round(&self, conn: &mut PgConnection) -> Result<Option<u64>, sqlx::Error> {
        let leader: bool = sqlx::query_scalar(
            "SELECT pg_try_advisory_lock(hashtextextended('outbox.inbox_maintainer.' || $1, 0))",
        )
        .bind(self.schema.as_str())
        .fetch_one(&mut *conn)
        .await?;
        if !leader {
            return Ok(None);
        }
        let mut total = 0;
        loop {
            let n = inbox_cleanup_batch(
                conn,
                &self.schema,
                self.retention.keep,
                self.retention.batch_size,
            )
            .await?;
            total += n;
            if n < self.retention.batch_size as u64 {
                break;
            }
        }
        if let Some(keep) = self.work_items_keep {
            loop {
                let n = crate::effects::purge_succeeded(
                    conn,
                    &self.schema,
                    keep,
                    self.retention.batch_size,
                )
                .await?;
                total += n;
                if n < self.retention.batch_size as u64 {
                    break;
                }
            }
        }
        Ok(Some(total))
    }

    /// Runs rounds every `interval` until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut conn: Option<PgConnection> = None;
        while !shutdown.is_cancelled() {
            if conn.is_none() {
                match PgConnection::connect(&self.database_url).await {
                    Ok(c) => conn = Some(c),
                    Err(e) => warn!(error = %e, "inbox maintainer cannot connect"),
                }
            }
            if let Some(c) = conn.as_mut() {
                match self.round(c).await {
                    Ok(Some(n)) if n > 0 => {
                        info!(
                            deleted = n,
                            "retention: old inbox identities (and settled work items, if enabled) deleted"
                        )
                    }
                    Ok(_) => {}
                    Err(e) => {
                        warn!(error = %e, "inbox maintainer lost its connection; competing again");
                        conn = None;
                    }
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.retention.interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(b: u64, o: u64, d: u64) -> ReplayHorizon {
        ReplayHorizon {
            broker_retention: Duration::from_secs(b),
            outbox_retention: Duration::from_secs(o),
            dead_letter_requeue_window: Duration::from_secs(d),
        }
    }

    #[test]
    fn retention_shorter_than_the_horizon_is_refused_with_both_numbers() {
        let r = InboxRetention {
            keep: Duration::from_secs(3600),
            horizon: h(86_400, 0, 7_200),
            batch_size: 1000,
            interval: Duration::from_secs(60),
        };
        let e = r.validate().unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("3600") && text.contains("86400") && text.contains("broker_retention"),
            "{text}"
        );
        assert!(
            InboxRetention {
                keep: Duration::from_secs(86_400),
                ..r
            }
            .validate()
            .is_ok()
        );
        assert_eq!(
            h(1, 5, 3).longest(),
            (Duration::from_secs(5), "outbox_retention")
        );
    }
}
