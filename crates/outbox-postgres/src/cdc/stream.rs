//! [`CdcStream`]: the outbox table's committed inserts from the replication slot, as
//! transactions (in parts for large ones) and idle positions.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use outbox_core::OutboxMessage;
use pg_walstream::{LogicalReplicationMessage, LogicalReplicationParser};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};

use super::connection::{classify, replication_config};
use super::decode::{Columns, decode_row, pg_time};
use super::slot::check_slot_name;
use super::{CdcConfig, CdcError, CdcUnpublishable, HEARTBEAT_PREFIX, TABLE};
use crate::schema::Schema;

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
    /// The log reached `lsn` with no outbox insert since the previous event (a keepalive of an idle
    /// outbox, a [`heartbeat`](super::heartbeat), or a transaction that inserted nothing into it).
    /// Once every earlier transaction is confirmed, confirming `lsn` lets the server recycle the
    /// WAL before it.
    Idle {
        /// The log position reached.
        lsn: u64,
    },
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
