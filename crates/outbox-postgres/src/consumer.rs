//! The consumer's side of PostgreSQL: [`PgStore`] as an [`InboxStore`] (transactions, the
//! inbox, consumer dead letters), so the core's consumer engine runs on it, and the operator
//! functions for consumer dead letters.
//!
//! ```no_run
//! # async fn run(pool: sqlx::PgPool, source: impl outbox_core::consumer::DeliverySource)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::consumer::{ConsumerConfig, Handler, HandlerError};
//! use outbox_core::IncomingEvent;
//! use outbox_postgres::{PgConsumer, PgStore, PgStoreConfig, Schema};
//!
//! struct Reporting;
//! impl Handler<sqlx::PgConnection> for Reporting {
//!     async fn handle(&self, tx: &mut sqlx::PgConnection, event: &IncomingEvent)
//!         -> Result<(), HandlerError> {
//!         sqlx::query("INSERT INTO report (id) VALUES ($1)")
//!             .bind(&event.aggregate_id).execute(&mut *tx).await?; // errors: transient
//!         Ok(())
//!     }
//! }
//!
//! let store = PgStore::new(pool, PgStoreConfig { schema: Schema::new("outbox")?, ..Default::default() });
//! let consumer = PgConsumer::new(store, source, Reporting, ConsumerConfig::new("reporting"))?;
//! consumer.run(tokio_util::sync::CancellationToken::new()).await;
//! # Ok(()) }
//! ```

use std::borrow::Cow;

use outbox_core::consumer::{
    Consumer, ConsumerDeadLetter, ConsumerDeadLetterState, InboxOutcome, InboxStore,
    NewConsumerDeadLetter, OrderingGuard, RawMessage, RequeuedDeadLetter,
};
use outbox_core::{IncomingEvent, StoreError};
use sqlx::{PgConnection, Postgres, Row, Transaction};

use crate::permission::Component;
use crate::store::PgStore;

/// The core's consumer engine on PostgreSQL: handlers receive the inbox transaction's
/// `sqlx::PgConnection`.
pub type PgConsumer<Src, H> = Consumer<PgStore, Src, H>;

/// Text for a readable column: PostgreSQL's text and jsonb cannot hold NUL, so NUL (only ever
/// in hostile or broken messages) shows as U+FFFD. The bytes are kept in the byte columns.
fn readable(s: &str) -> String {
    s.replace('\0', "\u{FFFD}")
}

/// A map as a JSON object of [`readable`] strings.
fn readable_json<'a>(pairs: impl Iterator<Item = (&'a str, String)>) -> String {
    let map: std::collections::BTreeMap<String, String> =
        pairs.map(|(k, v)| (readable(k), readable(&v))).collect();
    serde_json::to_string(&map).unwrap_or_else(|_| "{}".to_owned())
}

/// Every header of `raw` as two arrays of bytes, names and values, text headers first. A name
/// is stored as the broker gave it ([`RawMessage::header_name`] of its key), even when it is
/// not UTF-8.
fn header_columns(raw: &RawMessage) -> (Vec<Cow<'_, [u8]>>, Vec<&[u8]>) {
    raw.headers
        .iter()
        .map(|(k, v)| (RawMessage::header_name(k), v.as_bytes()))
        .chain(
            raw.binary_headers
                .iter()
                .map(|(k, v)| (RawMessage::header_name(k), v.as_ref())),
        )
        .unzip()
}

/// The columns of a dead-letter row read back into the message as it was received: from the
/// byte columns, or, for a row written before schema version 4, from the readable ones.
struct StoredRaw {
    payload: Vec<u8>,
    headers_json: String,
    content_type: Option<String>,
    header_names: Option<Vec<Vec<u8>>>,
    header_values: Option<Vec<Vec<u8>>>,
    content_type_bytes: Option<Vec<u8>>,
    metadata_json: String,
}

impl StoredRaw {
    fn into_raw(self) -> RawMessage {
        let metadata = serde_json::from_str(&self.metadata_json).unwrap_or_default();
        let (Some(names), Some(values)) = (self.header_names, self.header_values) else {
            return RawMessage {
                payload: self.payload.into(),
                headers: serde_json::from_str(&self.headers_json).unwrap_or_default(),
                content_type: self.content_type,
                metadata,
                ..RawMessage::default()
            };
        };
        let text = |b: Vec<u8>| {
            String::from_utf8(b)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
        };
        let mut raw = RawMessage {
            payload: self.payload.into(),
            content_type: self.content_type_bytes.map(text),
            metadata,
            ..RawMessage::default()
        };
        for (name, value) in names.into_iter().zip(values) {
            let key = RawMessage::header_key(&name).into_owned();
            match String::from_utf8(value) {
                // A name that is not kept as it is (not UTF-8) goes with the binary headers,
                // as the source put it there.
                Ok(v) if RawMessage::header_name(&key).as_ref() == key.as_bytes() => {
                    raw.headers.insert(key, v);
                }
                Ok(v) => {
                    raw.binary_headers.insert(key, v.into_bytes().into());
                }
                Err(e) => {
                    raw.binary_headers.insert(key, e.into_bytes().into());
                }
            }
        }
        raw
    }
}

impl InboxStore for PgStore {
    type Conn = PgConnection;
    type Tx = Transaction<'static, Postgres>;

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        self.pool()
            .begin()
            .await
            .map_err(self.err(Component::Consumer, "begin"))
    }

    async fn commit(&self, tx: Self::Tx) -> Result<(), StoreError> {
        tx.commit()
            .await
            .map_err(self.err(Component::Consumer, "commit"))
    }

    async fn rollback(&self, tx: Self::Tx) -> Result<(), StoreError> {
        tx.rollback()
            .await
            .map_err(self.err(Component::Consumer, "rollback"))
    }

    async fn inbox_record<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        consumer: &'a str,
        guard: OrderingGuard,
        event: &'a IncomingEvent,
    ) -> Result<InboxOutcome, StoreError> {
        self.inbox()
            .record(conn, consumer, guard, event)
            .await
            .map_err(self.err(Component::Consumer, "inbox record"))
    }

    async fn inbox_record_many<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        consumer: &'a str,
        events: &'a [&'a IncomingEvent],
    ) -> Result<Vec<InboxOutcome>, StoreError> {
        self.inbox()
            .record_many(conn, consumer, events)
            .await
            .map_err(self.err(Component::Consumer, "inbox record"))
    }

    async fn consumer_dead_letter_insert<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        letter: NewConsumerDeadLetter<'a>,
    ) -> Result<(), StoreError> {
        let (identity, raw) = (letter.identity, letter.raw);
        let (names, values) = header_columns(raw);
        let names: Vec<&[u8]> = names.iter().map(AsRef::as_ref).collect();
        let headers_json = readable_json(
            raw.headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.clone()))
                .chain(
                    raw.binary_headers
                        .iter()
                        .map(|(k, v)| (k.as_str(), String::from_utf8_lossy(v).into_owned())),
                ),
        );
        let metadata_json =
            readable_json(raw.metadata.iter().map(|(k, v)| (k.as_str(), v.clone())));
        sqlx::query(self.q(&self.sql().insert_dead))
            .bind(letter.consumer)
            .bind(identity.event_id)
            .bind(identity.aggregate_type.as_deref())
            .bind(identity.aggregate_id.as_deref())
            .bind(identity.aggregate_version)
            .bind(identity.event_type.as_deref())
            .bind(raw.content_type.as_deref().map(readable))
            .bind(raw.payload.as_ref())
            .bind(headers_json)
            .bind(letter.error)
            .bind(i32::try_from(letter.attempts).unwrap_or(i32::MAX))
            .bind(names)
            .bind(values)
            .bind(raw.content_type.as_deref().map(str::as_bytes))
            .bind(metadata_json)
            .execute(conn)
            .await
            .map(|_| ())
            .map_err(self.err(Component::Consumer, "consumer dead letter"))
    }

    async fn consumer_dead_letter_take_requeued<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        consumer: &'a str,
        limit: usize,
    ) -> Result<Vec<RequeuedDeadLetter>, StoreError> {
        let rows = sqlx::query(self.q(&self.sql().take_requeued))
            .bind(consumer)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(conn)
            .await
            .map_err(self.err(Component::Consumer, "requeued dead letters"))?;
        rows.iter()
            .map(|row| {
                let stored = StoredRaw {
                    payload: row.try_get(1)?,
                    headers_json: row.try_get(2)?,
                    content_type: row.try_get(3)?,
                    header_names: row.try_get(5)?,
                    header_values: row.try_get(6)?,
                    content_type_bytes: row.try_get(7)?,
                    metadata_json: row.try_get(8)?,
                };
                Ok(RequeuedDeadLetter {
                    id: row.try_get(0)?,
                    raw: stored.into_raw(),
                    attempts: row.try_get(4)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(self.err(Component::Consumer, "requeued dead letters: decoding"))
    }

    async fn consumer_dead_letter_settle<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        id: i64,
        state: ConsumerDeadLetterState,
        error: Option<&'a str>,
    ) -> Result<(), StoreError> {
        sqlx::query(self.q(&self.sql().settle_requeued))
            .bind(id)
            .bind(state.as_str())
            .bind(error)
            .execute(conn)
            .await
            .map(|_| ())
            .map_err(self.err(Component::Consumer, "settle requeued dead letter"))
    }

    async fn consumer_dead_letter_count<'a>(
        &'a self,
        consumer: &'a str,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(self.q(&self.sql().count_dead))
            .bind(consumer)
            .fetch_one(self.pool())
            .await
            .map_err(self.err(Component::Consumer, "count consumer dead letters"))
    }

    async fn consumer_paused<'a>(&'a self, consumer: &'a str) -> Result<bool, StoreError> {
        sqlx::query_scalar(self.q(&self.sql().consumer_paused))
            .bind(consumer)
            .fetch_one(self.pool())
            .await
            .map_err(self.err(Component::Consumer, "read whether the consumer is paused"))
    }
}

/// A consumer dead letter from the columns `id, consumer_name, event_id, aggregate_type,
/// aggregate_id, aggregate_version, event_type, error, attempts, state, created_at`, in that
/// order.
pub(crate) fn dead_letter_from_row(
    r: &sqlx::postgres::PgRow,
) -> Result<ConsumerDeadLetter, sqlx::Error> {
    Ok(ConsumerDeadLetter {
        id: r.try_get(0)?,
        consumer_name: r.try_get(1)?,
        event_id: r.try_get(2)?,
        aggregate_type: r.try_get(3)?,
        aggregate_id: r.try_get(4)?,
        aggregate_version: r.try_get(5)?,
        event_type: r.try_get(6)?,
        error: r.try_get(7)?,
        attempts: r.try_get(8)?,
        state: r.try_get(9)?,
        created_at: r.try_get(10)?,
    })
}
