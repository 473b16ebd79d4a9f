//! Numbered migrations, applied in one transaction under an advisory lock so that several
//! relays or services starting at once migrate exactly once.

use sha2::{Digest, Sha256};
use sqlx::{AssertSqlSafe, Connection as _, PgConnection, PgPool};

use crate::error::MigrateError;
use crate::permission::{Component, PermissionDenied};
use crate::schema::Schema;
use crate::sql::MARK_MODE_INDEXES;

/// One migration file.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Number, from 1, without gaps.
    pub version: i32,
    /// File name.
    pub name: &'static str,
    /// SQL text with `{{schema}}` placeholders.
    pub sql: &'static str,
}

/// Every migration this release knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_outbox.sql",
        sql: include_str!("../migrations/0001_outbox.sql"),
    },
    Migration {
        version: 2,
        name: "0002_inbox.sql",
        sql: include_str!("../migrations/0002_inbox.sql"),
    },
    Migration {
        version: 3,
        name: "0003_work_items.sql",
        sql: include_str!("../migrations/0003_work_items.sql"),
    },
    Migration {
        version: 4,
        name: "0004_dead_letter_raw.sql",
        sql: include_str!("../migrations/0004_dead_letter_raw.sql"),
    },
    Migration {
        version: 5,
        name: "0005_enqueue_deleted.sql",
        sql: include_str!("../migrations/0005_enqueue_deleted.sql"),
    },
    Migration {
        version: 6,
        name: "0006_lease_takeovers.sql",
        sql: include_str!("../migrations/0006_lease_takeovers.sql"),
    },
    Migration {
        version: 7,
        name: "0007_operator_indexes.sql",
        sql: include_str!("../migrations/0007_operator_indexes.sql"),
    },
    Migration {
        version: 8,
        name: "0008_operator_actions.sql",
        sql: include_str!("../migrations/0008_operator_actions.sql"),
    },
    Migration {
        version: 9,
        name: "0009_instances.sql",
        sql: include_str!("../migrations/0009_instances.sql"),
    },
    Migration {
        version: 10,
        name: "0010_pauses.sql",
        sql: include_str!("../migrations/0010_pauses.sql"),
    },
    Migration {
        version: 11,
        name: "0011_resolutions_and_horizon.sql",
        sql: include_str!("../migrations/0011_resolutions_and_horizon.sql"),
    },
    Migration {
        version: 12,
        name: "0012_publishable_rows.sql",
        sql: include_str!("../migrations/0012_publishable_rows.sql"),
    },
    Migration {
        version: 13,
        name: "0013_lease_owners.sql",
        sql: include_str!("../migrations/0013_lease_owners.sql"),
    },
];

/// The schema version this release needs.
pub fn current_version() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

fn render(m: &Migration, schema: &Schema) -> String {
    m.sql.replace("{{schema}}", &schema.quoted())
}

fn checksum(sql: &str) -> Vec<u8> {
    Sha256::digest(sql.as_bytes()).to_vec()
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Versions applied by this call (empty when already up to date).
    pub applied: Vec<i32>,
    /// Schema version after the call.
    pub version: i32,
}

/// Creates or upgrades the outbox tables in `schema`.
///
/// Runs in one transaction holding `pg_advisory_xact_lock` on a key derived from the schema
/// name; concurrent callers wait and then find nothing left to do. Applied migrations are
/// recorded with a checksum in `<schema>.schema_migrations`.
///
/// # Errors
/// * [`MigrateError::NewerSchema`]: the database was migrated by a newer release.
/// * [`MigrateError::Modified`]: an applied migration differs from this release's text.
/// * [`MigrateError::PermissionDenied`]: the connected role may not create or change the schema
///   (it is not the migrator that owns it); nothing was applied.
/// * [`MigrateError::Database`]: connection or SQL failure (nothing was applied).
pub async fn migrate(pool: &PgPool, schema: &Schema) -> Result<MigrateReport, MigrateError> {
    match migrate_in_tx(pool, schema).await {
        Err(MigrateError::Database(e)) => Err(denied(pool, e, Some(Component::Migrator)).await),
        other => other,
    }
}

async fn migrate_in_tx(pool: &PgPool, schema: &Schema) -> Result<MigrateReport, MigrateError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('outbox.migrate.' || $1, 0))")
        .bind(schema.as_str())
        .execute(&mut *tx)
        .await?;
    let q = schema.quoted();
    // Only when missing: even `IF NOT EXISTS` needs CREATE on the database, which a migrator
    // given its schema by the bootstrap (`outbox roles apply --bootstrap`) does not have.
    if !schema_exists(&mut tx, schema).await? {
        sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA IF NOT EXISTS {q}")))
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {q}.schema_migrations (version integer PRIMARY KEY, \
         name text NOT NULL, checksum bytea NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
    )))
    .execute(&mut *tx)
    .await?;
    let applied: Vec<(i32, String, Vec<u8>)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT version, name, checksum FROM {q}.schema_migrations ORDER BY version"
    )))
    .fetch_all(&mut *tx)
    .await?;

    let known = current_version();
    if let Some((found, _, _)) = applied.iter().find(|(v, _, _)| *v > known) {
        return Err(MigrateError::NewerSchema {
            schema: schema.to_string(),
            found: *found,
            known,
        });
    }
    for (version, _, sum) in &applied {
        let m = MIGRATIONS
            .iter()
            .find(|m| m.version == *version)
            .expect("versions above `known` were refused");
        if checksum(&render(m, schema)) != *sum {
            return Err(MigrateError::Modified {
                schema: schema.to_string(),
                version: *version,
                name: m.name.to_owned(),
            });
        }
    }

    let mut report = MigrateReport {
        applied: Vec::new(),
        version: applied.last().map_or(0, |a| a.0),
    };
    let from = report.version;
    for m in MIGRATIONS.iter().filter(|m| m.version > from) {
        let sql = render(m, schema);
        sqlx::raw_sql(AssertSqlSafe(sql.clone()))
            .execute(&mut *tx)
            .await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {q}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)"
        )))
        .bind(m.version)
        .bind(m.name)
        .bind(checksum(&sql))
        .execute(&mut *tx)
        .await?;
        report.applied.push(m.version);
        report.version = m.version;
    }
    tx.commit().await?;
    Ok(report)
}

/// Pending rows that break the rules of the events table (migration 12), found by
/// [`unpublishable_pending`]: written before the table refused them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpublishablePending {
    /// How many pending rows break a rule.
    pub count: i64,
    /// The first of them by id, at most the limit asked for.
    pub rows: Vec<UnpublishableRowReport>,
}

/// One row of [`UnpublishablePending`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpublishableRowReport {
    /// Event id.
    pub event_id: uuid::Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Version.
    pub aggregate_version: i64,
    /// The rule it breaks, as the relay's dead letter will say it.
    pub problem: String,
}

const UNPUBLISHABLE_PENDING: &str = "SELECT count(*) OVER () AS n, event_id, aggregate_type, \
    aggregate_id, aggregate_version, problem FROM (SELECT e.id, e.event_id, e.aggregate_type, \
    e.aggregate_id, e.aggregate_version, {s}.event_row_problem(e.aggregate_type, \
    e.aggregate_id, e.event_type, e.headers, e.content_type, e.destination, e.partition_key) \
    AS problem FROM {s}.events e WHERE e.state = 'pending') r WHERE problem IS NOT NULL \
    ORDER BY id LIMIT $1";

/// The pending rows of `schema` that break the rules of the events table (migration 12 adds
/// them without reading the table, so rows written before it are not checked), the first
/// `limit` of them with the rule each breaks. The relay dead-letters each such row with the
/// same reason when it reaches it; `outbox migrate` prints them so that they are known before.
/// Reads every pending row once (one scan of the pending rows, no lock beyond a read's).
///
/// # Errors
/// A database error; [`MigrateError::NotMigrated`] or [`MigrateError::NewerSchema`] when the
/// schema is not at this release's version.
pub async fn unpublishable_pending(
    pool: &PgPool,
    schema: &Schema,
    limit: i64,
) -> Result<UnpublishablePending, MigrateError> {
    use sqlx::Row as _;
    check_schema(pool, schema).await?;
    let rows = sqlx::query(AssertSqlSafe(schema.render(UNPUBLISHABLE_PENDING)))
        .bind(limit.max(1))
        .fetch_all(pool)
        .await?;
    let mut report = UnpublishablePending::default();
    for row in &rows {
        report.count = row.try_get("n")?;
        report.rows.push(UnpublishableRowReport {
            event_id: row.try_get("event_id")?,
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            aggregate_version: row.try_get("aggregate_version")?,
            problem: row.try_get("problem")?,
        });
    }
    Ok(report)
}

/// Creates the indexes mark mode needs ([`crate::OnPublish::Mark`]: published rows stay in
/// the table), those not there yet, and returns the names it created. `outbox migrate` calls
/// it when `relay.on_publish = "mark"`.
///
/// Three partial indexes on `events`: pending rows by id (the claim's scan of heads), unpublished
/// rows by aggregate and version (the claim's order check and per-aggregate run), published
/// rows by `published_at` (the retention job, [`outbox_core::maintenance`]). Without them each
/// claim reads past every published row kept, and slows down as they accumulate. They are not
/// part of the numbered migrations because delete mode does not need them and would pay for
/// them on every producer insert.
///
/// Each index is built with `CREATE INDEX CONCURRENTLY`, which does not stop producers or
/// relays on a live table. It takes longer than a plain build and, before it ends, waits for
/// every transaction of the database that began before it: one left idle in a transaction
/// holds it up until it ends. An index left invalid by an interrupted build is dropped and
/// built again. Two callers build each index once: they take turns on an advisory lock of
/// their own (not [`migrate`]'s), waited for by polling, so that no caller holds a snapshot
/// the other's build would wait for. Idempotent; safe to run while the relay works.
///
/// # Errors
/// [`MigrateError::NotMigrated`] or [`MigrateError::NewerSchema`] when the schema is not at this
/// release's version (run [`migrate`] first), [`MigrateError::PermissionDenied`] when the role
/// may not create indexes on `events` (it is not the migrator),
/// [`MigrateError::IndexNotBuilt`] when an index is not valid after its build,
/// [`MigrateError::Database`].
pub async fn migrate_mark_mode(
    pool: &PgPool,
    schema: &Schema,
) -> Result<Vec<&'static str>, MigrateError> {
    check_schema(pool, schema).await?;
    // A connection of its own, closed at the end: the session lock dies with it, also when
    // this future is dropped half-way.
    let mut conn = pool.acquire().await?.detach();
    let result = build_mark_mode_indexes(&mut conn, schema).await;
    let _ = conn.close().await;
    match result {
        Err(MigrateError::Database(e)) => Err(denied(pool, e, Some(Component::Migrator)).await),
        other => other,
    }
}

async fn build_mark_mode_indexes(
    conn: &mut PgConnection,
    schema: &Schema,
) -> Result<Vec<&'static str>, MigrateError> {
    // Polled, never waited for inside a statement: a caller blocked in a lock wait would keep
    // a snapshot open, and the holder's concurrent build would wait for it in turn.
    while !sqlx::query_scalar::<_, bool>(
        "SELECT pg_try_advisory_lock(hashtextextended('outbox.mark_mode_indexes.' || $1, 0))",
    )
    .bind(schema.as_str())
    .fetch_one(&mut *conn)
    .await?
    {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let q = schema.quoted();
    let mut created = Vec::new();
    for (name, definition) in MARK_MODE_INDEXES {
        match index_validity(conn, schema, name).await? {
            Some(true) => continue,
            Some(false) => {
                sqlx::raw_sql(AssertSqlSafe(format!(
                    "DROP INDEX CONCURRENTLY IF EXISTS {q}.{name}"
                )))
                .execute(&mut *conn)
                .await?;
            }
            None => {}
        }
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {q}.events {definition}"
        )))
        .execute(&mut *conn)
        .await?;
        if index_validity(conn, schema, name).await? != Some(true) {
            return Err(MigrateError::IndexNotBuilt {
                schema: schema.to_string(),
                index: (*name).to_owned(),
            });
        }
        created.push(*name);
    }
    Ok(created)
}

/// The mark-mode indexes ([`migrate_mark_mode`]) that `schema` lacks, or has only invalid (an
/// interrupted build). The relay checks this at startup in mark mode.
///
/// # Errors
/// A database error (the catalog is readable by every role).
pub async fn missing_mark_mode_indexes(
    pool: &PgPool,
    schema: &Schema,
) -> Result<Vec<&'static str>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut missing = Vec::new();
    for (name, _) in MARK_MODE_INDEXES {
        if index_validity(&mut conn, schema, name).await? != Some(true) {
            missing.push(*name);
        }
    }
    Ok(missing)
}

/// `Some(valid)` for an index named `name` on `schema`'s `events` table, `None` when there is
/// none (another relation of that name is not it).
async fn index_validity(
    conn: &mut PgConnection,
    schema: &Schema,
    name: &str,
) -> Result<Option<bool>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_catalog.pg_index i \
         JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         JOIN pg_catalog.pg_class t ON t.oid = i.indrelid \
         WHERE n.nspname = $1 AND c.relname = $2 AND t.relname = 'events'",
    )
    .bind(schema.as_str())
    .bind(name)
    .fetch_optional(conn)
    .await
}

async fn schema_exists(conn: &mut PgConnection, schema: &Schema) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = $1)")
        .bind(schema.as_str())
        .fetch_one(conn)
        .await
}

/// `e` as [`MigrateError::PermissionDenied`] naming the connected role when it is SQLSTATE
/// 42501, else [`MigrateError::Database`].
async fn denied(pool: &PgPool, e: sqlx::Error, component: Option<Component>) -> MigrateError {
    if PermissionDenied::from_sqlx(&e, None, None).is_none() {
        return MigrateError::Database(e);
    }
    let role: Option<String> = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(pool)
        .await
        .ok();
    let denied = PermissionDenied::from_sqlx(&e, role.as_deref(), component)
        .expect("checked to be 42501 above");
    MigrateError::PermissionDenied(denied)
}

/// Checks, without changing anything, that `schema` is at exactly the version this release
/// needs. Relays call this at startup.
///
/// The tables are looked up in `pg_catalog`, which every role can read, so a role without
/// grants on the schema is told so ([`MigrateError::PermissionDenied`]) instead of being sent
/// to migrate a schema that exists.
///
/// # Errors
/// [`MigrateError::NotMigrated`], [`MigrateError::NewerSchema`],
/// [`MigrateError::PermissionDenied`] (the role cannot read `schema_migrations`: it lacks its
/// component's grants) or a database error.
pub async fn check_schema(pool: &PgPool, schema: &Schema) -> Result<(), MigrateError> {
    let exists: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = 'schema_migrations' AND c.relkind = 'r')",
    )
    .bind(schema.as_str())
    .fetch_one(pool)
    .await?;
    let found: i32 = if exists {
        match sqlx::query_scalar(AssertSqlSafe(
            schema.render("SELECT coalesce(max(version), 0) FROM {s}.schema_migrations"),
        ))
        .fetch_one(pool)
        .await
        {
            Ok(v) => v,
            Err(e) => return Err(denied(pool, e, None).await),
        }
    } else {
        0
    };
    let needed = current_version();
    if found > needed {
        return Err(MigrateError::NewerSchema {
            schema: schema.to_string(),
            found,
            known: needed,
        });
    }
    if found < needed {
        return Err(MigrateError::NotMigrated {
            schema: schema.to_string(),
            found,
            needed,
        });
    }
    Ok(())
}
