//! PostgreSQL of a run: connections, a service's database ([`ServiceDatabase`]: its migration,
//! and the check that a process's database was migrated), and the fresh databases of a run
//! (created at its start, dropped at its end unless kept).

use std::time::Duration;

use anyhow::{Context, Result};
use outbox::postgres::Schema;
use sqlx::PgPool;

/// The toolkit's schema in every database of the examples.
pub const OUTBOX_SCHEMA: &str = "outbox";

/// The toolkit's schema ([`OUTBOX_SCHEMA`]).
pub fn schema() -> Schema {
    Schema::new(OUTBOX_SCHEMA).expect("a plain identifier")
}

/// A pool of at most `max` connections to `url`, failing early with the cause.
///
/// # Errors
/// The server is unreachable, the database does not exist, authentication failed.
pub async fn connect(url: &str, max: u32) -> Result<PgPool> {
    Ok(outbox::postgres::connect(url, max, Duration::from_secs(5)).await?)
}

/// Migrates a service's database: the toolkit's schema first ([`OUTBOX_SCHEMA`], with the
/// library's `outbox::postgres::migrate`), then the service's own `tables`, each statement in
/// turn (`CREATE TABLE IF NOT EXISTS …`, so a second migration changes nothing). `what` names
/// the database in errors (`payments`, `ledger`).
///
/// # Errors
/// Any database error, naming the step that failed.
pub async fn migrate(pool: &PgPool, what: &str, tables: &[&str]) -> Result<()> {
    outbox::postgres::migrate(pool, &schema())
        .await
        .with_context(|| format!("cannot migrate the outbox schema of the {what} database"))?;
    for sql in tables {
        sqlx::query(sqlx::AssertSqlSafe(*sql))
            .execute(pool)
            .await
            .with_context(|| format!("cannot create the tables of the {what} database"))?;
    }
    Ok(())
}

/// Refuses to start a process on a database that was not migrated: the toolkit's schema and
/// `table` must be there. `migrate` names the command that migrates (for the message).
///
/// # Errors
/// The toolkit's schema is missing or from another release, or `table` is missing.
pub async fn check(pool: &PgPool, table: &str, migrate: &str) -> Result<()> {
    outbox::postgres::check_schema(pool, &schema())
        .await
        .with_context(|| format!("the database is not migrated: run `{migrate}`"))?;
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(table)
        .fetch_one(pool)
        .await?;
    if !exists {
        anyhow::bail!("table `{table}` is missing: run `{migrate}`");
    }
    Ok(())
}

/// A service's own database in an example: the toolkit's schema ([`OUTBOX_SCHEMA`]) and the
/// service's tables. Each example declares its databases as constants of this type.
#[derive(Debug, Clone, Copy)]
pub struct ServiceDatabase {
    /// Its name in messages (`payments`, `ledger`), also the end of a run's database name.
    pub name: &'static str,
    /// The service's tables, created in turn: each its name and its statement
    /// (`CREATE TABLE IF NOT EXISTS …`). A process looks for the first one before it starts.
    pub tables: &'static [(&'static str, &'static str)],
}

impl ServiceDatabase {
    /// Migrates the database of `pool` ([`migrate`]): the toolkit's schema, then the tables.
    ///
    /// # Errors
    /// Any database error, naming the step that failed.
    pub async fn migrate(&self, pool: &PgPool) -> Result<()> {
        let statements: Vec<&str> = self.tables.iter().map(|(_, sql)| *sql).collect();
        migrate(pool, self.name, &statements).await
    }

    /// A pool of at most `max` connections to this database at `url`, refusing a database that
    /// was not migrated ([`check`] of its first table in the `public` schema; `migrate` names
    /// the command that migrates, for the message).
    ///
    /// # Errors
    /// The database is unreachable ([`connect`]) or not migrated.
    pub async fn open(&self, url: &str, max: u32, migrate: &str) -> Result<PgPool> {
        let pool = connect(url, max).await?;
        let first = self.tables.first().map_or("", |(table, _)| table);
        check(&pool, &format!("public.{first}"), migrate).await?;
        Ok(pool)
    }
}

/// `url` with its database replaced by `name`.
///
/// # Errors
/// `url` is not a URL.
pub fn with_database(url: &str, name: &str) -> Result<String> {
    let mut u = url::Url::parse(url).context("invalid option `--database-url`")?;
    u.set_path(&format!("/{name}"));
    Ok(u.to_string())
}

/// The fresh databases of one run on one server.
pub struct FreshDatabases {
    admin: PgPool,
    server_url: String,
    names: Vec<String>,
}

impl FreshDatabases {
    /// Creates `names` (dropped first if a former run left them) on the server of
    /// `server_url`, through its database.
    ///
    /// # Errors
    /// The server is unreachable or the role may not create databases.
    pub async fn create(server_url: &str, names: &[String]) -> Result<Self> {
        let admin = connect(server_url, 2)
            .await
            .context("PostgreSQL is needed (see README, Quick start)")?;
        for db in names {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
            )))
            .execute(&admin)
            .await?;
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {db}")))
                .execute(&admin)
                .await
                .with_context(|| format!("cannot create database {db}"))?;
        }
        Ok(Self {
            admin,
            server_url: server_url.to_owned(),
            names: names.to_vec(),
        })
    }

    /// The URL of the database `name` (one of those created).
    ///
    /// # Errors
    /// The server URL is not a URL.
    pub fn url(&self, name: &str) -> Result<String> {
        with_database(&self.server_url, name)
    }

    /// The names of the databases, in the order created.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Drops the databases (a failure is a warning: the run's result stands).
    pub async fn drop_all(&self) {
        for db in &self.names {
            if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {db} WITH (FORCE)"
            )))
            .execute(&self.admin)
            .await
            {
                eprintln!("warning: cannot drop database {db}: {e}");
            }
        }
    }
}
