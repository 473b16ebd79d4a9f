//! [`CdcConfig`]: the CDC stream's settings, and the slot's and publication's names.

use std::time::Duration;

use crate::schema::Schema;

/// The CDC stream's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcConfig {
    /// The replication slot. Default: the schema's name. Letters, digits and `_` only (the
    /// server's rule for slot names), at most 63.
    pub slot: Option<String>,
    /// The publication. Default: the schema's name.
    pub publication: Option<String>,
    /// How often the confirmed position is sent to the server. Default 1 s.
    pub status_interval: Duration,
    /// Decoded changes buffered between the connection and the relay. Default 8,192.
    pub buffer_events: usize,
    /// The most streamed events the relay holds in memory before handing them out (and
    /// the size of the parts a large transaction is handed over in: a quarter of it). Reading
    /// the stream pauses at this count until events are settled; the server then waits, and
    /// the slot retains the WAL meanwhile. With it the relay's memory is bounded whatever a
    /// transaction's size: a transaction of a million rows is streamed part by part, each
    /// part published before the next is read, and its commit confirmed once its last part
    /// is settled (a crash in between hands the whole transaction out again: the parts
    /// already published go out again, same event ids). Default 10,000; at least 4.
    pub max_rows_in_memory: usize,
    /// The producers delete their rows in their own transactions
    /// (`PgOutbox::delete_in_transaction`): the feed then writes every event it leaves to the
    /// table (a dead letter, the events of an aggregate parked behind one) back into it before
    /// it counts as settled, or it would exist nowhere but in the log. Needs `INSERT` on the
    /// outbox table for the relay's role (docs/security.md). Default `false`: the rows are in
    /// the table already, and the relay role inserts nothing. A feed with `false` that finds
    /// such an event's row gone although its transaction committed writes it back all the
    /// same (a dead letter never ends nowhere) and warns once, naming this option.
    pub producers_delete_rows: bool,
}

impl Default for CdcConfig {
    fn default() -> Self {
        Self {
            slot: None,
            publication: None,
            status_interval: Duration::from_secs(1),
            buffer_events: 8192,
            max_rows_in_memory: 10_000,
            producers_delete_rows: false,
        }
    }
}

impl CdcConfig {
    /// The slot's name for `schema`.
    pub fn slot_name(&self, schema: &Schema) -> String {
        self.slot
            .clone()
            .unwrap_or_else(|| schema.as_str().to_owned())
    }

    /// The publication's name for `schema`.
    pub fn publication_name(&self, schema: &Schema) -> String {
        self.publication
            .clone()
            .unwrap_or_else(|| schema.as_str().to_owned())
    }
}
