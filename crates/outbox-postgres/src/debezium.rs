//! The Debezium bridge: producers built for Debezium's outbox keep writing their table, and the
//! relay publishes what they write, with its claim, lease and fencing guarantees.
//!
//! A team moving from Debezium's Outbox Event Router to this relay has services that insert
//! into an outbox table in Debezium's layout (`id`, `aggregatetype`, `aggregateid`, `type`,
//! `payload`, optionally `timestamp` and `tracingspancontext`), often deleting the row again
//! in the same transaction, since Debezium reads the log and not the table. The bridge is a
//! trigger on that table, installed by [`install`] (`outbox debezium apply`): every inserted
//! row is copied, **in the producer's own transaction**, into this toolkit's `events` table,
//! where the relay claims, publishes and settles it like any other event. Nothing in the
//! producers changes, and a transaction that rolls back leaves no event (G1).
//!
//! # Why a trigger, and not a relay that reads the Debezium table
//!
//! The relay's guarantees rest on columns the Debezium layout lacks: the per-aggregate
//! version that orders an aggregate's events, the delivery state, attempts and backoff, and
//! the leases that fence a relay whose claim was taken over. Reading the Debezium table
//! directly would mean either adding those columns to the producers' table (a migration of
//! their schema) or weaker guarantees. The trigger gives each row a version in commit order
//! (the same allocation as [`crate::PgOutbox::next_aggregate_version`]: its row lock orders
//! concurrent producers of one aggregate) and stores it where every guarantee applies.
//!
//! # The copy
//!
//! | `events` column     | from the Debezium row                                             |
//! |---------------------|-------------------------------------------------------------------|
//! | `event_id`          | `table.field.event.id` (a `uuid` column, or text holding a UUID)  |
//! | `aggregate_type`    | `route.by.field` (default `aggregatetype`), as text              |
//! | `aggregate_id`      | `table.field.event.key` (default `aggregateid`), as text         |
//! | `aggregate_version` | allocated: one more than the aggregate's last                    |
//! | `event_type`        | `table.field.event.type` (default `type`), as text; `unknown` when NULL or empty (the router never reads it) |
//! | `payload`           | `table.field.event.payload`: `jsonb` and `json` as the text PostgreSQL gives them (what Debezium emits), text as UTF-8, `bytea` as it is; NULL as empty |
//! | `content_type`      | `application/json` (`json`, `jsonb`), `text/plain; charset=utf-8` (text), `application/octet-stream` (`bytea`) |
//! | `headers`           | each `header` placement of `table.fields.additional.placement`, under its alias, as the column's text; `traceparent` found in the tracing span context column |
//! | `created_at`        | `table.field.event.timestamp` (`timestamp` read as UTC, as Debezium reads it, or `timestamptz`), else the transaction's time |
//!
//! The Debezium table's row itself is left as the producer wrote it (the trigger runs after
//! the insert and returns nothing), so producers that delete it, read it back or clean the
//! table on a schedule keep working. Updates and deletes of the table are ignored, as the
//! router ignores them.
//!
//! Publishing these events as the router would (topic `outbox.event.<aggregatetype>`, key,
//! `id` header, payload value) is the Kafka transport's `format = "debezium"`.
//!
//! # Limits (the producer's transaction fails with PostgreSQL's message)
//!
//! * An event id that is NULL, not a UUID, or already used: `events` holds each id once.
//! * An aggregate type or id that is NULL, empty or longer than 255 characters.
//! * `envelope` and `partition` placements are refused at install: the transport sends the
//!   payload alone as the value and chooses partitions by key.
//!
//! # Privileges
//!
//! The trigger function is `SECURITY DEFINER`, owned by the role that installs it, with a fixed
//! `search_path` and no `EXECUTE` for `PUBLIC`: producers need no grant on the outbox schema,
//! and no other role can attach the function to a table of its own. [`install`] and
//! [`remove`] need both the Debezium table's ownership (to replace or drop its trigger) and
//! `CREATE` on the outbox schema (the migrator's): run them as a role that has both (for
//! instance the table's owner made a member of the migrator role), or have a DBA run the SQL
//! of [`bridge_sql`] (`outbox debezium sql`). Install it as a role no more powerful than that:
//! the function inserts events with the installer's rights.
//!
//! Each outbox schema has its own trigger ([`trigger_name`]), so two outboxes can bridge one
//! table without replacing each other.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, PgPool};

use crate::schema::{Schema, quote_ident};

/// Name of the bridge's trigger into `schema` (one per outbox schema, so two outboxes can bridge
/// one table): `outbox_debezium_bridge_<schema>`, or a hash of the schema's name where that
/// would pass PostgreSQL's 63-byte limit.
pub fn trigger_name(schema: &Schema) -> String {
    let name = format!("outbox_debezium_bridge_{}", schema.as_str());
    if name.len() <= 63 {
        return name;
    }
    let digest = Sha256::digest(schema.as_str().as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("outbox_debezium_bridge_{hex}")
}

/// The Debezium-layout table and its column names (`[debezium]` in the CLI's config file), with
/// the option names and defaults of Debezium's Outbox Event Router, so a connector's table
/// settings carry over as they are (its routing and value settings are the Kafka transport's:
/// `topic_template`, `debezium_payload`).
///
/// ```
/// let t: outbox_postgres::debezium::DebeziumTable = toml::from_str(r#"
///     table = "public.outbox"
///     "table.field.event.key" = "aggregate_id"
///     "table.fields.additional.placement" = "type:header:eventType"
/// "#).unwrap();
/// assert_eq!(t.id, "id");
/// assert_eq!(t.route_by, "aggregatetype");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebeziumTable {
    /// The table, `schema.table` or `table` (found through the search path), as SQL names:
    /// quote a name that is not lower case (`"Sales"."Outbox"`).
    pub table: String,
    /// Event id column (`table.field.event.id`, default `id`).
    #[serde(rename = "table.field.event.id", default = "default_id")]
    pub id: String,
    /// Aggregate id column, the record key (`table.field.event.key`, default `aggregateid`).
    #[serde(rename = "table.field.event.key", default = "default_key")]
    pub key: String,
    /// Event type column (`table.field.event.type`, default `type`).
    #[serde(rename = "table.field.event.type", default = "default_type")]
    pub event_type: String,
    /// Payload column (`table.field.event.payload`, default `payload`).
    #[serde(rename = "table.field.event.payload", default = "default_payload")]
    pub payload: String,
    /// Timestamp column (`table.field.event.timestamp`, no default): the event's time.
    #[serde(rename = "table.field.event.timestamp", default)]
    pub timestamp: Option<String>,
    /// Aggregate type column, which names the topic (`route.by.field`, default `aggregatetype`).
    #[serde(rename = "route.by.field", default = "default_route_by")]
    pub route_by: String,
    /// Tracing span context column (`tracing.span.context.field`): its `traceparent` entry
    /// becomes the event's `traceparent` header. Default: `tracingspancontext` when the table
    /// has such a column.
    #[serde(rename = "tracing.span.context.field", default)]
    pub tracing_span_context: Option<String>,
    /// Extra columns as headers (`table.fields.additional.placement`): a comma-separated list
    /// of `column:header` or `column:header:alias`.
    #[serde(rename = "table.fields.additional.placement", default)]
    pub additional_placement: Option<String>,
}

fn default_id() -> String {
    "id".into()
}
fn default_key() -> String {
    "aggregateid".into()
}
fn default_type() -> String {
    "type".into()
}
fn default_payload() -> String {
    "payload".into()
}
fn default_route_by() -> String {
    "aggregatetype".into()
}

impl DebeziumTable {
    /// The defaults for `table`.
    pub fn new(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            id: default_id(),
            key: default_key(),
            event_type: default_type(),
            payload: default_payload(),
            timestamp: None,
            route_by: default_route_by(),
            tracing_span_context: None,
            additional_placement: None,
        }
    }

    /// The `header` placements as `(column, header name)`.
    ///
    /// # Errors
    /// [`DebeziumError::Config`] for an item that is not `column:placement[:alias]`, an
    /// `envelope` or `partition` placement, or a header named `id` (the event id's).
    pub fn header_placements(&self) -> Result<Vec<(String, String)>, DebeziumError> {
        let Some(list) = &self.additional_placement else {
            return Ok(Vec::new());
        };
        let key = "table.fields.additional.placement";
        let mut out = Vec::new();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let parts: Vec<&str> = item.split(':').map(str::trim).collect();
            let (column, placement, alias) = match parts[..] {
                [c, p] => (c, p, c),
                [c, p, a] => (c, p, a),
                _ => {
                    return Err(DebeziumError::config(
                        key,
                        format!("`{item}` is not `column:placement` or `column:placement:alias`"),
                    ));
                }
            };
            if column.is_empty() || alias.is_empty() {
                return Err(DebeziumError::config(
                    key,
                    format!("`{item}` has an empty name"),
                ));
            }
            match placement.to_ascii_lowercase().as_str() {
                "header" => {}
                "envelope" | "partition" => {
                    return Err(DebeziumError::config(
                        key,
                        format!(
                            "`{item}`: `{placement}` placements are not supported; the relay sends \
                             the payload alone as the value and picks the partition by key (use \
                             `header`)"
                        ),
                    ));
                }
                other => {
                    return Err(DebeziumError::config(
                        key,
                        format!("`{item}`: unknown placement `{other}` (use `header`)"),
                    ));
                }
            }
            if alias.eq_ignore_ascii_case("id") {
                return Err(DebeziumError::config(
                    key,
                    format!("`{item}`: the header `id` carries the event id"),
                ));
            }
            out.push((column.to_owned(), alias.to_owned()));
        }
        Ok(out)
    }
}

/// Why the bridge could not be installed or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DebeziumError {
    /// A setting is wrong.
    #[error("invalid Debezium bridge setting `{key}`: {message}")]
    Config {
        /// The option, e.g. `table.field.event.payload`.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The table does not exist (or is not visible to this role), or is not a table.
    #[error("the Debezium outbox table `{table}` {why}")]
    Table {
        /// The name as configured.
        table: String,
        /// What is wrong with it.
        why: String,
    },
    /// The database refused a statement (privileges included: creating the trigger needs the
    /// table's ownership or its TRIGGER privilege).
    #[error("database error while installing the Debezium bridge: {0}")]
    Database(#[from] sqlx::Error),
}

impl DebeziumError {
    fn config(key: &'static str, message: impl Into<String>) -> Self {
        Self::Config {
            key,
            message: message.into(),
        }
    }
}

/// What the catalog says about the table.
struct Found {
    /// The quoted, schema-qualified name.
    name: String,
    /// Column name -> base type name (`uuid`, `jsonb`, `varchar`, ...).
    columns: BTreeMap<String, String>,
}

async fn find(pool: &PgPool, table: &DebeziumTable) -> Result<Found, DebeziumError> {
    let row: Option<(i64, String, String)> = sqlx::query_as(
        "SELECT c.oid::bigint, quote_ident(n.nspname) || '.' || quote_ident(c.relname), \
                c.relkind::text \
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE c.oid = to_regclass($1)",
    )
    .bind(&table.table)
    .fetch_optional(pool)
    .await?;
    let Some((oid, name, kind)) = row else {
        return Err(DebeziumError::Table {
            table: table.table.clone(),
            why: "does not exist (or this role cannot see it)".into(),
        });
    };
    if kind != "r" && kind != "p" {
        return Err(DebeziumError::Table {
            table: table.table.clone(),
            why: "is not a table (a view or other relation has no insert to bridge)".into(),
        });
    }
    let columns: Vec<(String, String)> = sqlx::query_as(
        "SELECT a.attname::text, \
                CASE WHEN t.typtype = 'd' THEN bt.typname ELSE t.typname END::text \
           FROM pg_attribute a \
           JOIN pg_type t ON t.oid = a.atttypid \
           LEFT JOIN pg_type bt ON bt.oid = t.typbasetype \
          WHERE a.attrelid = $1::oid AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(oid)
    .fetch_all(pool)
    .await?;
    Ok(Found {
        name,
        columns: columns.into_iter().collect(),
    })
}

fn is_text(ty: &str) -> bool {
    matches!(ty, "text" | "varchar" | "bpchar" | "name" | "citext")
}

/// The SQL of the bridge for `table` (as [`install`] runs it), read from the catalog.
///
/// # Errors
/// [`DebeziumError::Config`] for a missing column or one of a type the bridge cannot read,
/// [`DebeziumError::Table`] for a table that is not there, [`DebeziumError::Database`].
pub async fn bridge_sql(
    pool: &PgPool,
    schema: &Schema,
    table: &DebeziumTable,
) -> Result<String, DebeziumError> {
    let found = find(pool, table).await?;
    render(schema, table, &found)
}

/// Names go into the function's body, which is dollar-quoted: quoting makes every other
/// character safe, but not `$` (it could end the body) nor control characters.
fn check_name(key: &'static str, name: &str) -> Result<(), DebeziumError> {
    if name.is_empty() || name.contains('$') || name.chars().any(char::is_control) {
        return Err(DebeziumError::config(
            key,
            format!(
                "`{}` cannot be bridged: a name must not be empty nor hold `$` or control characters",
                name.escape_debug()
            ),
        ));
    }
    Ok(())
}

fn render(schema: &Schema, table: &DebeziumTable, found: &Found) -> Result<String, DebeziumError> {
    check_name("table", &found.name)?;
    let id = event_id(table, found)?;
    let (route, _) = found.column("route.by.field", &table.route_by)?;
    let (key, _) = found.column("table.field.event.key", &table.key)?;
    let (ty, _) = found.column("table.field.event.type", &table.event_type)?;
    let (payload, content_type) = payload(table, found)?;
    let created_at = created_at(table, found)?;
    let headers = headers(table, found)?;
    Ok(function_sql(
        schema,
        found,
        &Values {
            id,
            route,
            key,
            ty,
            payload,
            content_type,
            headers,
            created_at,
        },
    ))
}

impl Found {
    /// The column `name` (of the setting `key`) as the trigger reads it (`NEW.` and the quoted
    /// name), with its type.
    fn column(&self, key: &'static str, name: &str) -> Result<(String, String), DebeziumError> {
        check_name(key, name)?;
        let ty = self.columns.get(name).ok_or_else(|| {
            DebeziumError::config(
                key,
                format!("the table {} has no column `{name}`", self.name),
            )
        })?;
        Ok((format!("NEW.{}", quote_ident(name)), ty.clone()))
    }
}

/// The event id's expression: a `uuid` column as it is, text cast to `uuid`.
fn event_id(table: &DebeziumTable, found: &Found) -> Result<String, DebeziumError> {
    let (id, id_ty) = found.column("table.field.event.id", &table.id)?;
    Ok(match id_ty.as_str() {
        "uuid" => id,
        t if is_text(t) => format!("{id}::uuid"),
        t => {
            return Err(DebeziumError::config(
                "table.field.event.id",
                format!(
                    "column `{}` is {t}; the event id must be uuid or text",
                    table.id
                ),
            ));
        }
    })
}

/// The payload's expression (as bytes) and its content type, by the column's type.
fn payload(table: &DebeziumTable, found: &Found) -> Result<(String, &'static str), DebeziumError> {
    let (payload, payload_ty) = found.column("table.field.event.payload", &table.payload)?;
    Ok(match payload_ty.as_str() {
        "jsonb" | "json" => (
            format!("convert_to({payload}::text, 'UTF8')"),
            "application/json",
        ),
        t if is_text(t) => (
            format!("convert_to({payload}::text, 'UTF8')"),
            "text/plain; charset=utf-8",
        ),
        "bytea" => (payload, "application/octet-stream"),
        t => {
            return Err(DebeziumError::config(
                "table.field.event.payload",
                format!(
                    "column `{}` is {t}; the payload must be jsonb, json, text or bytea",
                    table.payload
                ),
            ));
        }
    })
}

/// `created_at`'s expression: the timestamp column (a `timestamp` read as UTC), else the
/// transaction's time.
fn created_at(table: &DebeziumTable, found: &Found) -> Result<String, DebeziumError> {
    Ok(match &table.timestamp {
        None => "now()".to_owned(),
        Some(name) => {
            let (ts, ts_ty) = found.column("table.field.event.timestamp", name)?;
            match ts_ty.as_str() {
                "timestamp" => format!("coalesce({ts} AT TIME ZONE 'UTC', now())"),
                "timestamptz" => format!("coalesce({ts}, now())"),
                t => {
                    return Err(DebeziumError::config(
                        "table.field.event.timestamp",
                        format!("column `{name}` is {t}; it must be timestamp or timestamptz"),
                    ));
                }
            }
        }
    })
}

/// The headers' expression: the `header` placements under their aliases, and the
/// `traceparent` of the tracing span context column (configured, or `tracingspancontext` when
/// the table has one).
fn headers(table: &DebeziumTable, found: &Found) -> Result<String, DebeziumError> {
    let mut header_pairs = Vec::new();
    for (col, alias) in table.header_placements()? {
        check_name("table.fields.additional.placement", &alias)?;
        let (value, _) = found.column("table.fields.additional.placement", &col)?;
        header_pairs.push(format!("{}, {value}::text", quote_literal(&alias)));
    }
    let tracing = match &table.tracing_span_context {
        Some(name) => Some(found.column("tracing.span.context.field", name)?),
        None => found
            .columns
            .contains_key("tracingspancontext")
            .then(|| found.column("tracing.span.context.field", "tracingspancontext"))
            .transpose()?,
    };
    if let Some((ctx, _)) = tracing {
        // A serialized java.util.Properties: `traceparent=<value>` on a line of its own, with
        // `:` and `=` possibly escaped by a backslash.
        header_pairs.push(format!(
            "'traceparent', replace(substring({ctx}::text from '(?:^|\\n)traceparent\\s*[=:]\\s*([^\\r\\n]+)'), '\\', '')"
        ));
    }
    Ok(if header_pairs.is_empty() {
        "'{}'::jsonb".to_owned()
    } else {
        format!(
            "jsonb_strip_nulls(jsonb_build_object({}))",
            header_pairs.join(", ")
        )
    })
}

/// The expressions of an `events` row's columns from the inserted row (`NEW`).
struct Values {
    id: String,
    route: String,
    key: String,
    ty: String,
    payload: String,
    content_type: &'static str,
    headers: String,
    created_at: String,
}

/// The bridge's SQL: the trigger function inserting [`Values`] into `schema`'s `events`, and
/// the trigger on the table.
fn function_sql(schema: &Schema, found: &Found, v: &Values) -> String {
    let (id, route, key, ty) = (&v.id, &v.route, &v.key, &v.ty);
    let (payload, headers, created_at) = (&v.payload, &v.headers, &v.created_at);
    let s = schema.quoted();
    let function = format!("{s}.{}", function_name(&found.name));
    let mut sql = String::new();
    let _ = write!(
        sql,
        "CREATE OR REPLACE FUNCTION {function}() RETURNS trigger\n\
         LANGUAGE plpgsql SECURITY DEFINER\n\
         SET search_path = pg_catalog, pg_temp SET standard_conforming_strings = on AS $outbox$\n\
         DECLARE\n    version bigint;\n\
         BEGIN\n\
         \x20   -- Bridge of {table} into {s}.events (outbox debezium apply): one event per inserted row,\n\
         \x20   -- in the producer's transaction, versioned per aggregate in commit order.\n\
         \x20   INSERT INTO {s}.aggregate_versions AS v (aggregate_type, aggregate_id, last_version)\n\
         \x20        VALUES ({route}::text, {key}::text, 1)\n\
         \x20   ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET last_version = v.last_version + 1\n\
         \x20   RETURNING v.last_version INTO version;\n\
         \x20   INSERT INTO {s}.events (event_id, aggregate_type, aggregate_id, aggregate_version,\n\
         \x20                           event_type, content_type, payload, headers, created_at)\n\
         \x20        VALUES ({id}, {route}::text, {key}::text, version,\n\
         \x20                coalesce(nullif({ty}::text, ''), 'unknown'), {ct},\n\
         \x20                coalesce({payload}, ''::bytea), {headers}, {created_at});\n\
         \x20   RETURN NULL;\n\
         END\n$outbox$;\n\
         -- A trigger function runs whatever role fires the trigger; nobody needs to call it.\n\
         REVOKE ALL ON FUNCTION {function}() FROM PUBLIC;\n\
         DROP TRIGGER IF EXISTS {trigger} ON {table};\n\
         CREATE TRIGGER {trigger} AFTER INSERT ON {table}\n\
         \x20   FOR EACH ROW EXECUTE FUNCTION {function}();\n",
        table = found.name,
        ct = quote_literal(v.content_type),
        trigger = quote_ident(&trigger_name(schema)),
    );
    sql
}

/// The bridge function's name: one per table, stable for a table's name.
fn function_name(qualified: &str) -> String {
    let digest = Sha256::digest(qualified.as_bytes());
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("debezium_bridge_{hex}")
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The function the bridge's trigger on `table` calls (`pg_trigger.tgfoid`): its oid and its
/// name as SQL (`regprocedure`), or `None` when there is no bridge into `schema`.
async fn bridge_function(
    tx: &mut sqlx::PgConnection,
    schema: &Schema,
    table: &DebeziumTable,
) -> Result<Option<(i64, String)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT t.tgfoid::bigint, t.tgfoid::regprocedure::text FROM pg_trigger t \
          WHERE t.tgrelid = to_regclass($1) AND t.tgname = $2",
    )
    .bind(&table.table)
    .bind(trigger_name(schema))
    .fetch_optional(tx)
    .await
}

/// Installs (or replaces) the bridge on `table`, in one transaction: from then on every row
/// inserted into it is an event of `schema`'s outbox. Running it again with other settings
/// replaces the bridge.
///
/// # Errors
/// As [`bridge_sql`]; [`DebeziumError::Database`] when the role may not create the function
/// in `schema` or the trigger on the table.
pub async fn install(
    pool: &PgPool,
    schema: &Schema,
    table: &DebeziumTable,
) -> Result<(), DebeziumError> {
    let found = find(pool, table).await?;
    let sql = render(schema, table, &found)?;
    let mut tx = pool.begin().await?;
    // The function of a bridge installed before the table was renamed has another name: it
    // goes once the new trigger replaced the old.
    let previous = bridge_function(&mut tx, schema, table).await?;
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *tx).await?;
    let current = bridge_function(&mut tx, schema, table).await?;
    if let Some((oid, previous)) = previous
        && current.is_some_and(|(now, _)| now != oid)
    {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP FUNCTION IF EXISTS {previous};"
        )))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Removes the bridge from `table`: rows inserted afterwards are no longer events. Removing a
/// bridge that is not there does nothing.
///
/// # Errors
/// [`DebeziumError::Table`] for a table that is not there, [`DebeziumError::Database`].
pub async fn remove(
    pool: &PgPool,
    schema: &Schema,
    table: &DebeziumTable,
) -> Result<(), DebeziumError> {
    let found = find(pool, table).await?;
    let trigger = trigger_name(schema);
    let mut tx = pool.begin().await?;
    // The function through the trigger, not by name: the table may have been renamed since
    // the bridge was installed.
    let function = bridge_function(&mut tx, schema, table)
        .await?
        .map(|(_, f)| f);
    let mut sql = format!(
        "DROP TRIGGER IF EXISTS {} ON {};\n",
        quote_ident(&trigger),
        found.name
    );
    if let Some(function) = function {
        let _ = writeln!(sql, "DROP FUNCTION IF EXISTS {function};");
    }
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found() -> Found {
        Found {
            name: "public.outbox".into(),
            columns: [
                ("id", "uuid"),
                ("aggregatetype", "varchar"),
                ("aggregateid", "varchar"),
                ("type", "varchar"),
                ("payload", "jsonb"),
                ("timestamp", "timestamp"),
                ("tracingspancontext", "varchar"),
                ("eventType", "text"),
            ]
            .into_iter()
            .map(|(a, b)| (a.to_owned(), b.to_owned()))
            .collect(),
        }
    }

    #[test]
    fn the_defaults_read_the_documented_layout() {
        let schema = Schema::new("outbox").unwrap();
        let sql = render(&schema, &DebeziumTable::new("public.outbox"), &found()).unwrap();
        assert!(sql.contains("NEW.\"aggregatetype\"::text"), "{sql}");
        assert!(
            sql.contains("convert_to(NEW.\"payload\"::text, 'UTF8')"),
            "{sql}"
        );
        assert!(sql.contains("'traceparent'"), "{sql}");
        assert!(sql.contains("AFTER INSERT ON public.outbox"), "{sql}");
        assert!(sql.contains("REVOKE ALL ON FUNCTION"), "{sql}");
        assert!(sql.contains("outbox_debezium_bridge_outbox"), "{sql}");
        assert!(
            sql.contains("created_at)") && sql.contains("now());"),
            "{sql}"
        );
    }

    #[test]
    fn settings_are_checked_against_the_table() {
        let schema = Schema::new("outbox").unwrap();
        let mut t = DebeziumTable::new("public.outbox");
        t.payload = "body".into();
        let e = render(&schema, &t, &found()).unwrap_err().to_string();
        assert!(
            e.contains("table.field.event.payload") && e.contains("no column `body`"),
            "{e}"
        );
        let mut t = DebeziumTable::new("public.outbox");
        t.timestamp = Some("type".into());
        let e = render(&schema, &t, &found()).unwrap_err().to_string();
        assert!(e.contains("timestamp or timestamptz"), "{e}");
        t.timestamp = Some("timestamp".into());
        let sql = render(&schema, &t, &found()).unwrap();
        assert!(sql.contains("AT TIME ZONE 'UTC'"), "{sql}");
        // A `$` could end the dollar-quoted body: refused, as are control characters.
        for alias in ["x$outbox$", "a\nb"] {
            t.additional_placement = Some(format!("eventType:header:{alias}"));
            let e = render(&schema, &t, &found()).unwrap_err().to_string();
            assert!(e.contains("must not"), "{e}");
        }
        let long = Schema::new(&"s".repeat(60)).unwrap();
        assert!(trigger_name(&long).len() <= 63);
    }

    #[test]
    fn placements() {
        let mut t = DebeziumTable::new("x");
        t.additional_placement = Some(" eventType:header:type , type:HEADER".into());
        assert_eq!(
            t.header_placements().unwrap(),
            vec![
                ("eventType".to_owned(), "type".to_owned()),
                ("type".to_owned(), "type".to_owned())
            ]
        );
        for bad in [
            "a:envelope",
            "a:partition",
            "a:header:id",
            "a",
            "a:b:c:d",
            "a:nowhere",
        ] {
            t.additional_placement = Some(bad.into());
            assert!(t.header_placements().is_err(), "{bad}");
        }
    }
}
