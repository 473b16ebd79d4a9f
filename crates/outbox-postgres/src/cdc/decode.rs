//! The outbox table's rows as `pgoutput` gives them: each inserted row decoded into an
//! [`OutboxMessage`], or kept as stored with the reason it cannot be published
//! ([`CdcUnpublishable`]).

use bytes::Bytes;
use chrono::{DateTime, Utc};
use outbox_core::{ContentType, Fingerprint, OutboxMessage, Payload, UndecodableRow};
use pg_walstream::{ColumnData, ColumnInfo};
use postgres_types::{FromSql, Type};
use uuid::Uuid;

use super::CdcError;

/// A timestamp of the replication protocol (microseconds since 2000-01-01 UTC).
pub(super) fn pg_time(micros: i64) -> DateTime<Utc> {
    const PG_EPOCH_UNIX_SECS: i64 = 946_684_800;
    DateTime::from_timestamp_micros(micros.saturating_add(PG_EPOCH_UNIX_SECS * 1_000_000))
        .unwrap_or_default()
}

/// The outbox table's columns, by position in the log's tuples.
#[derive(Debug, Clone)]
pub(super) struct Columns {
    pub(super) id: usize,
    pub(super) event_id: usize,
    pub(super) aggregate_type: usize,
    pub(super) aggregate_id: usize,
    pub(super) aggregate_version: usize,
    pub(super) event_type: usize,
    pub(super) schema_version: usize,
    pub(super) content_type: usize,
    pub(super) payload: usize,
    pub(super) headers: usize,
    pub(super) destination: usize,
    pub(super) partition_key: usize,
    pub(super) created_at: usize,
}

impl Columns {
    /// The positions of the columns this release reads, each checked for its type.
    pub(super) fn of(columns: &[ColumnInfo]) -> Result<Self, CdcError> {
        let find = |name: &str, ty: &Type| -> Result<usize, CdcError> {
            let (i, c) = columns
                .iter()
                .enumerate()
                .find(|(_, c)| &*c.name == name)
                .ok_or_else(|| {
                    CdcError::Decode(format!("the log's outbox table has no column `{name}`"))
                })?;
            if c.type_id != ty.oid() {
                return Err(CdcError::Decode(format!(
                    "column `{name}` has type oid {} in the log, {} ({}) expected",
                    c.type_id,
                    ty.oid(),
                    ty.name()
                )));
            }
            Ok(i)
        };
        Ok(Self {
            id: find("id", &Type::INT8)?,
            event_id: find("event_id", &Type::UUID)?,
            aggregate_type: find("aggregate_type", &Type::TEXT)?,
            aggregate_id: find("aggregate_id", &Type::TEXT)?,
            aggregate_version: find("aggregate_version", &Type::INT8)?,
            event_type: find("event_type", &Type::TEXT)?,
            schema_version: find("schema_version", &Type::INT4)?,
            content_type: find("content_type", &Type::TEXT)?,
            payload: find("payload", &Type::BYTEA)?,
            headers: find("headers", &Type::JSONB)?,
            destination: find("destination", &Type::TEXT)?,
            partition_key: find("partition_key", &Type::TEXT)?,
            created_at: find("created_at", &Type::TIMESTAMPTZ)?,
        })
    }
}

/// A column's value from a tuple: `None` for SQL NULL.
fn value<'t, T: FromSql<'t>>(
    tuple: &'t [ColumnData],
    index: usize,
    ty: &Type,
    name: &str,
) -> Result<Option<T>, CdcError> {
    let column = tuple
        .get(index)
        .ok_or_else(|| CdcError::Decode(format!("the insert has no value for `{name}`")))?;
    if column.is_null() {
        return Ok(None);
    }
    if column.is_unchanged() || !column.is_binary() {
        return Err(CdcError::Decode(format!(
            "the insert's `{name}` is not a binary value"
        )));
    }
    T::from_sql(ty, column.as_bytes())
        .map(Some)
        .map_err(|e| CdcError::Decode(format!("`{name}`: {e}")))
}

/// [`value`] of a NOT NULL column.
fn required<'t, T: FromSql<'t>>(
    tuple: &'t [ColumnData],
    index: usize,
    ty: &Type,
    name: &str,
) -> Result<T, CdcError> {
    value(tuple, index, ty, name)?
        .ok_or_else(|| CdcError::Decode(format!("the insert's `{name}` is NULL")))
}

/// A `jsonb` value's text as stored, undecoded: the binary form is a version byte (1) and the
/// text. Kept as text so that a value `serde_json` cannot read (a number beyond `f64`) is still
/// reported with its reason and written back as it was.
struct JsonText(String);

impl<'a> FromSql<'a> for JsonText {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        match raw.split_first() {
            Some((1, text)) => Ok(Self(std::str::from_utf8(text)?.to_owned())),
            _ => Err("unsupported jsonb version".into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }
}

/// A `timestamptz` as the server stores it, microseconds since 2000-01-01 UTC: `infinity` and
/// `-infinity` (which the column accepts) are `i64::MAX` and `i64::MIN`.
struct PgMicros(i64);

impl<'a> FromSql<'a> for PgMicros {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(i64::from_be_bytes(raw.try_into()?)))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::TIMESTAMPTZ
    }
}

/// An outbox row's columns as the log gave them, each `None` when it could not be read (the
/// first such problem is kept). What a row left to the table is written back from: every value
/// exactly as the producer stored it, also when it cannot be published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredRow {
    pub(crate) id: i64,
    pub(crate) event_id: Option<Uuid>,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_version: i64,
    pub(crate) event_type: Option<String>,
    pub(crate) schema_version: Option<i32>,
    pub(crate) content_type: Option<String>,
    pub(crate) payload: Option<Vec<u8>>,
    /// The `headers` value's JSON text.
    pub(crate) headers: Option<String>,
    pub(crate) destination: Option<String>,
    pub(crate) partition_key: Option<String>,
    /// `created_at` in the server's microseconds ([`PgMicros`]).
    pub(crate) created_at: Option<i64>,
    /// Delivery attempts so far (0 as streamed).
    pub(crate) attempts: i32,
}

impl StoredRow {
    /// The row of a decoded message (its headers as a JSON object of strings).
    pub(crate) fn of(m: &OutboxMessage) -> Self {
        const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800 * 1_000_000;
        Self {
            id: m.id,
            event_id: Some(m.event_id),
            aggregate_type: m.aggregate_type.clone(),
            aggregate_id: m.aggregate_id.clone(),
            aggregate_version: m.aggregate_version,
            event_type: Some(m.event_type.clone()),
            schema_version: Some(m.schema_version),
            content_type: Some(m.payload.content_type.0.clone()),
            payload: Some(m.payload.bytes.to_vec()),
            headers: Some(serde_json::to_string(&m.headers).expect("string map serialises")),
            destination: m.destination.clone(),
            partition_key: m.partition_key.clone(),
            created_at: Some(m.created_at.timestamp_micros() - PG_EPOCH_UNIX_MICROS),
            attempts: m.attempts,
        }
    }
}

/// A row the log gave that cannot be published as stored ([`UndecodableRow`]: a header value
/// that is not a string, a header name no binding can carry, a column that does not decode).
/// The relay dead-letters it with its reason and its aggregate waits behind it; the columns are
/// kept to write it back as a dead letter where the producer deleted its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdcUnpublishable {
    /// Its key, event id when readable, and what is wrong with it.
    pub row: UndecodableRow,
    pub(crate) stored: StoredRow,
}

/// Reads the columns that are not the row's key, keeping the first problem.
struct Reader<'t> {
    tuple: &'t [ColumnData],
    problem: Option<String>,
}

impl<'t> Reader<'t> {
    /// A nullable column; `None` (and the problem kept) when it cannot be read.
    fn nullable<T: FromSql<'t>>(&mut self, index: usize, ty: &Type, name: &str) -> Option<T> {
        match value(self.tuple, index, ty, name) {
            Ok(v) => v,
            Err(e) => {
                let reason = match e {
                    CdcError::Decode(reason) => reason,
                    other => other.to_string(),
                };
                self.problem
                    .get_or_insert(format!("column `{name}` cannot be read: {reason}"));
                None
            }
        }
    }

    /// A NOT NULL column; NULL is a problem too.
    fn required<T: FromSql<'t>>(&mut self, index: usize, ty: &Type, name: &str) -> Option<T> {
        let v = self.nullable(index, ty, name);
        if v.is_none() {
            self.problem
                .get_or_insert(format!("column `{name}` is NULL"));
        }
        v
    }
}

/// One inserted row of the log, decoded on its own: the message, or, for a row that cannot be
/// published as stored, why ([`CdcUnpublishable`]). Only a row whose id or aggregate key
/// cannot be read is an error (the stream stops there: nothing after it is skipped), which the
/// table's types and constraints rule out.
pub(super) fn decode_row(
    c: &Columns,
    tuple: &[ColumnData],
) -> Result<Result<OutboxMessage, CdcUnpublishable>, CdcError> {
    let mut r = Reader {
        tuple,
        problem: None,
    };
    let stored = StoredRow {
        id: required(tuple, c.id, &Type::INT8, "id")?,
        aggregate_type: required(tuple, c.aggregate_type, &Type::TEXT, "aggregate_type")?,
        aggregate_id: required(tuple, c.aggregate_id, &Type::TEXT, "aggregate_id")?,
        aggregate_version: required(tuple, c.aggregate_version, &Type::INT8, "aggregate_version")?,
        event_id: r.required::<Uuid>(c.event_id, &Type::UUID, "event_id"),
        event_type: r.required(c.event_type, &Type::TEXT, "event_type"),
        schema_version: r.required(c.schema_version, &Type::INT4, "schema_version"),
        content_type: r.required(c.content_type, &Type::TEXT, "content_type"),
        payload: r.required(c.payload, &Type::BYTEA, "payload"),
        headers: r
            .required::<JsonText>(c.headers, &Type::JSONB, "headers")
            .map(|j| j.0),
        destination: r.nullable(c.destination, &Type::TEXT, "destination"),
        partition_key: r.nullable(c.partition_key, &Type::TEXT, "partition_key"),
        created_at: r
            .required::<PgMicros>(c.created_at, &Type::TIMESTAMPTZ, "created_at")
            .map(|m| m.0),
        attempts: 0,
    };
    Ok(match r.problem {
        Some(problem) => Err(unpublishable(stored, problem)),
        None => message_of(stored).map_err(|unpublishable| *unpublishable),
    })
}

/// A row that cannot be published as stored, kept whole with `reason`.
fn unpublishable(stored: StoredRow, reason: String) -> CdcUnpublishable {
    CdcUnpublishable {
        row: UndecodableRow {
            id: stored.id,
            event_id: stored.event_id,
            aggregate_type: stored.aggregate_type.clone(),
            aggregate_id: stored.aggregate_id.clone(),
            aggregate_version: stored.aggregate_version,
            reason,
        },
        stored,
    }
}

/// What a row whose every column was read needs beside its values to become a message.
struct Checked {
    headers: std::collections::BTreeMap<String, String>,
    created_at: DateTime<Utc>,
}

/// The checks of a row's values that need no message: every NOT NULL column present, the
/// headers a JSON object of strings, `created_at` a date.
fn check(s: &StoredRow) -> Result<Checked, String> {
    let missing = |name: &str| format!("column `{name}` is NULL");
    let nulls = [
        ("event_id", s.event_id.is_none()),
        ("event_type", s.event_type.is_none()),
        ("schema_version", s.schema_version.is_none()),
        ("content_type", s.content_type.is_none()),
        ("payload", s.payload.is_none()),
    ];
    if let Some((name, _)) = nulls.iter().find(|(_, null)| *null) {
        return Err(missing(name));
    }
    let headers = s.headers.as_deref().ok_or_else(|| missing("headers"))?;
    let headers: serde_json::Value = serde_json::from_str(headers)
        .map_err(|e| format!("column `headers` cannot be read: {e}"))?;
    let headers = outbox_core::headers_from_json(headers)?;
    let micros = s.created_at.ok_or_else(|| missing("created_at"))?;
    let created_at = pg_time_checked(micros).ok_or_else(|| {
        "column `created_at` is out of the range of a date (infinity?)".to_owned()
    })?;
    Ok(Checked {
        headers,
        created_at,
    })
}

/// The message of a row whose every column was read, its values moved into it (the payload is
/// not copied), or the row back, as it was, with why it cannot be published as stored (boxed:
/// the rare path).
fn message_of(s: StoredRow) -> Result<OutboxMessage, Box<CdcUnpublishable>> {
    let checked = match check(&s) {
        Ok(checked) => checked,
        Err(reason) => return Err(Box::new(unpublishable(s, reason))),
    };
    // `check` found every value below present: the defaults are never taken.
    let StoredRow {
        id,
        event_id,
        aggregate_type,
        aggregate_id,
        aggregate_version,
        event_type,
        schema_version,
        content_type,
        payload,
        headers: headers_text,
        destination,
        partition_key,
        created_at: micros,
        attempts,
    } = s;
    let payload = payload.unwrap_or_default();
    let message = OutboxMessage {
        id,
        event_id: event_id.unwrap_or_default(),
        aggregate_type,
        aggregate_id,
        aggregate_version,
        event_type: event_type.unwrap_or_default(),
        schema_version: schema_version.unwrap_or_default(),
        // `payload_sha256` is a generated column, which PostgreSQL before 18 leaves out of the
        // log: the same SHA-256, computed here.
        fingerprint: Fingerprint::of(&payload),
        payload: Payload {
            content_type: ContentType(content_type.unwrap_or_default()),
            bytes: Bytes::from(payload),
        },
        headers: checked.headers,
        destination,
        partition_key,
        created_at: checked.created_at,
        attempts,
    };
    match message.check_publishable_reserving(&[crate::RESERVED_HEADERS]) {
        Ok(()) => Ok(message),
        Err(e) => {
            // Back to the row as stored: the values moved out, the headers' own text.
            let stored = StoredRow {
                headers: headers_text,
                created_at: micros,
                payload: Some(Vec::from(message.payload.bytes)),
                content_type: Some(message.payload.content_type.0),
                id: message.id,
                event_id: Some(message.event_id),
                aggregate_type: message.aggregate_type,
                aggregate_id: message.aggregate_id,
                aggregate_version: message.aggregate_version,
                event_type: Some(message.event_type),
                schema_version: Some(message.schema_version),
                destination: message.destination,
                partition_key: message.partition_key,
                attempts: message.attempts,
            };
            Err(Box::new(unpublishable(stored, e.to_string())))
        }
    }
}

/// [`StoredRow::created_at`] as SQL text for `::timestamptz`: `infinity` as such; a date
/// `chrono` does not represent (beyond the year 262,143) as `now`, the time of the write.
pub(crate) fn pg_time_text(micros: i64) -> String {
    match micros {
        i64::MAX => "infinity".to_owned(),
        i64::MIN => "-infinity".to_owned(),
        m => pg_time_checked(m).map_or_else(
            || "now".to_owned(),
            |t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        ),
    }
}

/// A timestamp of the server's storage (microseconds since 2000-01-01 UTC), `None` outside
/// the dates `chrono` represents (`infinity`).
fn pg_time_checked(micros: i64) -> Option<DateTime<Utc>> {
    const PG_EPOCH_UNIX_MICROS: i64 = 946_684_800 * 1_000_000;
    DateTime::from_timestamp_micros(micros.checked_add(PG_EPOCH_UNIX_MICROS)?)
}
