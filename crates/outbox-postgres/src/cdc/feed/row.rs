//! The streamed events as the log scheduler holds them ([`Row`]), and what it takes of a
//! [`CdcEvent`].

use outbox_core::OutboxMessage;
use outbox_core::relay::log::{LogEvent, LogItem, LogRow, LogTransaction};

use crate::cdc::{CdcEvent, CdcUnpublishable, StoredRow};

/// A streamed event: a message to publish, or a row that cannot be published as stored (the
/// engine dead-letters it with its reason, and its aggregate waits behind it).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // The large variant is the common one: no box per event.
pub(super) enum Row {
    Message(OutboxMessage),
    Unpublishable(Box<CdcUnpublishable>),
}

impl LogRow for Row {
    fn id(&self) -> i64 {
        match self {
            Self::Message(m) => m.id,
            Self::Unpublishable(u) => u.row.id,
        }
    }

    fn version(&self) -> i64 {
        match self {
            Self::Message(m) => m.aggregate_version,
            Self::Unpublishable(u) => u.row.aggregate_version,
        }
    }

    fn key(&self) -> (&str, &str) {
        match self {
            Self::Message(m) => (&m.aggregate_type, &m.aggregate_id),
            Self::Unpublishable(u) => (&u.row.aggregate_type, &u.row.aggregate_id),
        }
    }

    fn attempted(&self) -> Self {
        let mut row = self.clone();
        match &mut row {
            Self::Message(m) => m.attempts += 1,
            Self::Unpublishable(u) => u.stored.attempts += 1,
        }
        row
    }

    fn item(&self) -> LogItem<'_> {
        match self {
            Self::Message(m) => LogItem::Message(m),
            Self::Unpublishable(u) => LogItem::Undecodable(&u.row),
        }
    }

    fn route(&self) -> (Option<&str>, &str) {
        match self {
            Self::Message(m) => (m.destination.as_deref(), &m.aggregate_type),
            Self::Unpublishable(u) => (u.stored.destination.as_deref(), &u.row.aggregate_type),
        }
    }
}

impl Row {
    pub(super) fn stored(&self) -> StoredRow {
        match self {
            Self::Message(m) => StoredRow::of(m),
            Self::Unpublishable(u) => u.stored.clone(),
        }
    }
}

/// What the scheduler takes of a streamed event: a transaction's rows, each aggregate's in
/// version order wherever the unpublishable ones were.
pub(super) fn log_event(event: CdcEvent) -> LogEvent<Row> {
    match event {
        CdcEvent::Idle { lsn } => LogEvent::Idle { position: lsn },
        CdcEvent::Transaction(tx) => {
            let mut rows: Vec<Row> = tx.messages.into_iter().map(Row::Message).collect();
            if !tx.unpublishable.is_empty() {
                rows.extend(
                    tx.unpublishable
                        .into_iter()
                        .map(|u| Row::Unpublishable(Box::new(u))),
                );
                rows.sort_by_key(LogRow::version);
            }
            LogEvent::Transaction(LogTransaction {
                source_tx: u64::from(tx.xid),
                end: tx.end_lsn,
                complete: tx.complete,
                committed_at: tx.committed_at,
                rows,
            })
        }
    }
}

/// The log's 32-bit transaction id of a streamed event, for the visibility checks.
pub(super) fn xid_param(source_tx: u64) -> i64 {
    i64::try_from(source_tx).unwrap_or_default()
}
