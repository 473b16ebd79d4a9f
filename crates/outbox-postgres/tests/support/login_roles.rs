//! Login roles for the least-privilege tests, shared by the `outbox-postgres` and `outbox-cli`
//! tests (the CLI's include this file by path). Roles are global to the server: each test names
//! its own (`r_<id>_<suffix>`), logs in by name (the test server trusts local connections), and
//! drops them at the end, also after a panic.
#![allow(dead_code)]

use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

/// `url` (a `postgres://` URL) logged in as `role`, without a password.
pub fn url_as(url: &str, role: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let host = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{role}@{host}")
}

/// The login roles of one test, and the statements that undo what the test made.
pub struct LoginRoles {
    /// Unique per test; part of every role name.
    pub id: String,
    url: String,
    admin: PgPool,
    names: Vec<String>,
    first: Vec<String>,
    pools: Vec<PgPool>,
    cleaned: bool,
}

impl LoginRoles {
    /// Connects to `url` as its (superuser) role, which creates and drops the roles.
    pub async fn new(url: &str) -> LoginRoles {
        let admin = PgPoolOptions::new()
            .max_connections(8)
            .connect(url)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {url} is required: {e}"));
        LoginRoles {
            id: uuid::Uuid::now_v7().simple().to_string(),
            url: url.to_owned(),
            admin,
            names: Vec::new(),
            first: Vec::new(),
            pools: Vec::new(),
            cleaned: false,
        }
    }

    /// The superuser's pool.
    pub fn admin(&self) -> &PgPool {
        &self.admin
    }

    /// The name `r_<id>_<suffix>`.
    pub fn name(&self, suffix: &str) -> String {
        format!("r_{}_{suffix}", self.id)
    }

    /// Creates the login role `r_<id>_<suffix>`.
    pub async fn create(&mut self, suffix: &str) -> String {
        let name = self.name(suffix);
        sqlx::query(AssertSqlSafe(format!("CREATE ROLE \"{name}\" LOGIN")))
            .execute(&self.admin)
            .await
            .unwrap_or_else(|e| panic!("create role {name}: {e}"));
        self.adopt(&name);
        name
    }

    /// Drops `name` at the end too (a role the code under test created).
    pub fn adopt(&mut self, name: &str) {
        self.names.push(name.to_owned());
    }

    /// Runs `sql` at the end, before the roles are dropped (e.g. dropping a schema).
    pub fn first(&mut self, sql: String) {
        self.first.push(sql);
    }

    /// The test database's URL logged in as `role`.
    pub fn url_as(&self, role: &str) -> String {
        url_as(&self.url, role)
    }

    /// A pool logged in as `role`, closed at the end.
    pub async fn pool_as(&mut self, role: &str) -> PgPool {
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&self.url_as(role))
            .await
            .unwrap_or_else(|e| panic!("log in as {role}: {e}"));
        self.pools.push(pool.clone());
        pool
    }

    fn undo_sql(&self) -> Vec<String> {
        let mut sql = self.first.clone();
        for r in &self.names {
            sql.push(format!("DROP OWNED BY \"{r}\""));
            sql.push(format!("DROP ROLE \"{r}\""));
        }
        sql
    }

    /// Closes the pools, runs the `first` statements, drops the roles with what they own.
    pub async fn cleanup(mut self) {
        for p in &self.pools {
            p.close().await;
        }
        for st in self.undo_sql() {
            sqlx::query(AssertSqlSafe(st.clone()))
                .execute(&self.admin)
                .await
                .unwrap_or_else(|e| panic!("{st}: {e}"));
        }
        self.cleaned = true;
    }
}

impl Drop for LoginRoles {
    /// After a panic: the same clean-up, on a thread and runtime of its own.
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let sql = self.undo_sql();
        let url = self.url.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let Ok(pool) = PgPoolOptions::new().connect(&url).await else {
                    return;
                };
                for st in sql {
                    let _ = sqlx::query(AssertSqlSafe(st)).execute(&pool).await;
                }
            });
        })
        .join();
    }
}
