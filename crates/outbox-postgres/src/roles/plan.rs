//! Role names and the plan: the grant and bootstrap scripts of a set of roles.

use super::*;

// ---------------------------------------------------------------------------------------------
// Role names and the plan

/// A validated role name. Letters, digits, `_`, `.`, `@` and `-` (so cloud IAM names such as
/// `relay@project.iam` fit), 1 to 63 bytes; never `public`, `none` or a `pg_` name. Always
/// written quoted, so case is kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RoleName(String);

impl RoleName {
    /// Validates `name`.
    ///
    /// # Errors
    /// [`RolesError::InvalidRole`] naming the rule it breaks.
    pub fn new(name: &str) -> Result<Self, RolesError> {
        let bad = |reason: &str| {
            Err(RolesError::InvalidRole {
                name: name.to_owned(),
                reason: reason.to_owned(),
            })
        };
        if name.is_empty() || name.len() > 63 {
            return bad("use 1 to 63 bytes");
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'-'))
        {
            return bad("use ASCII letters, digits, `_`, `.`, `@` and `-` only");
        }
        let lower = name.to_ascii_lowercase();
        if lower.starts_with("pg_") {
            return bad("`pg_` names are reserved by PostgreSQL");
        }
        if matches!(
            lower.as_str(),
            "public" | "none" | "current_user" | "current_role" | "session_user"
        ) {
            return bad("this name means something else to GRANT");
        }
        Ok(Self(name.to_owned()))
    }

    /// `<schema>_<component>`, the default name of a component's role.
    ///
    /// # Errors
    /// [`RolesError::InvalidRole`] when the result is longer than 63 bytes.
    pub fn default_for(schema: &Schema, component: Component) -> Result<Self, RolesError> {
        Self::new(&format!("{schema}_{component}"))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `"name"`.
    fn quoted(&self) -> String {
        crate::schema::quote_ident(&self.0)
    }
}

impl fmt::Display for RoleName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which role serves which component in one schema; renders and applies the scripts.
///
/// ```
/// use outbox_postgres::roles::{Component, RoleName, RolePlan};
/// use outbox_postgres::Schema;
///
/// let plan = RolePlan::new(Schema::new("outbox").unwrap())
///     .with_role(Component::Relay, RoleName::new("relay_svc").unwrap());
/// assert!(plan.grant_script().contains(
///     "GRANT USAGE ON SEQUENCE \"outbox\".\"lease_token_seq\" TO \"relay_svc\";"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolePlan {
    pub(super) schema: Schema,
    pub(super) roles: BTreeMap<Component, RoleName>,
}

impl RolePlan {
    /// A plan for `schema` with no roles yet.
    pub fn new(schema: Schema) -> Self {
        Self {
            schema,
            roles: BTreeMap::new(),
        }
    }

    /// Every component with its default role name `<schema>_<component>`.
    ///
    /// # Errors
    /// [`RolesError::InvalidRole`] when the schema name is too long for the defaults (name
    /// the roles with [`RolePlan::with_role`]).
    pub fn with_defaults(schema: Schema) -> Result<Self, RolesError> {
        let mut plan = Self::new(schema);
        for c in Component::ALL {
            let name = RoleName::default_for(&plan.schema, c)?;
            plan.roles.insert(c, name);
        }
        Ok(plan)
    }

    /// Sets the role of `component` (replacing one set before).
    #[must_use]
    pub fn with_role(mut self, component: Component, role: RoleName) -> Self {
        self.roles.insert(component, role);
        self
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The role of `component`, if the plan has one.
    pub fn role(&self, component: Component) -> Option<&RoleName> {
        self.roles.get(&component)
    }

    /// Each role that gets grants, with the components it serves (the migrator excepted: it
    /// owns the objects and gets none).
    /// In component order.
    fn grantees(&self) -> Vec<(&RoleName, Vec<Component>)> {
        let mut by_role: Vec<(&RoleName, Vec<Component>)> = Vec::new();
        for (c, r) in &self.roles {
            if *c == Component::Migrator {
                continue;
            }
            match by_role.iter_mut().find(|(have, _)| *have == r) {
                Some((_, components)) => components.push(*c),
                None => by_role.push((r, vec![*c])),
            }
        }
        by_role
    }

    /// Refuses a role that is both the migrator and a component: the owner has every privilege
    /// on its objects, so the component could not be limited.
    fn validate_grants(&self) -> Result<(), RolesError> {
        if let Some(m) = self.roles.get(&Component::Migrator)
            && let Some((c, _)) = self
                .roles
                .iter()
                .find(|(c, r)| **c != Component::Migrator && *r == m)
        {
            return Err(RolesError::OwnerAsComponent {
                role: m.to_string(),
                component: *c,
            });
        }
        Ok(())
    }

    /// The grant statements, in order, without transaction control.
    pub fn grant_statements(&self) -> Vec<String> {
        let s = self.schema.quoted();
        let grantees = self.grantees();
        if grantees.is_empty() {
            return Vec::new();
        }
        let all: Vec<String> = grantees.iter().map(|(r, _)| r.quoted()).collect();
        let all = all.join(", ");
        let mut out = vec![
            format!(
                "SELECT pg_advisory_xact_lock(hashtextextended('outbox.migrate.{}', 0))",
                self.schema
            ),
            format!("REVOKE ALL ON SCHEMA {s} FROM {all}"),
            format!("REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {all}"),
            format!("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {s} FROM {all}"),
        ];
        for (role, components) in grantees {
            let r = role.quoted();
            out.push(format!("GRANT USAGE ON SCHEMA {s} TO {r}"));
            for (o, access) in access_of(&components) {
                out.push(format!(
                    "GRANT {} ON {} {s}.\"{}\" TO {r}",
                    access.render(),
                    o.kind.keyword(),
                    o.name
                ));
            }
        }
        out
    }

    /// The grants as a script for `psql`: one transaction, with comments.
    pub fn grant_script(&self) -> String {
        let mut text = format!(
            "-- Least-privilege grants on schema \"{}\" (schema version {}).\n\
             -- Run as the migrator after every `outbox migrate`. Idempotent: each role below\n\
             -- first loses every privilege in the schema, then gets exactly these.\n\
             BEGIN;\n",
            self.schema,
            current_version()
        );
        let statements = self.grant_statements();
        let grantees = self.grantees();
        let mut roles = grantees.iter().peekable();
        for st in statements {
            // A comment before the first statement of each role.
            if let Some((role, components)) = roles.peek()
                && st.starts_with("GRANT USAGE ON SCHEMA")
                && st.ends_with(&format!(" TO {}", role.quoted()))
            {
                text.push('\n');
                for c in components.iter() {
                    text.push_str(&format!("-- {c} ({role}): {}\n", c.purpose()));
                }
                roles.next();
            }
            text.push_str(&st);
            text.push_str(";\n");
        }
        text.push_str("COMMIT;\n");
        text
    }

    /// The bootstrap statements, in order, without transaction control.
    ///
    /// # Errors
    /// [`RolesError::NoMigrator`] when the plan has no migrator role.
    pub fn bootstrap_statements(&self) -> Result<Vec<String>, RolesError> {
        let migrator = self
            .roles
            .get(&Component::Migrator)
            .ok_or(RolesError::NoMigrator)?;
        self.validate_grants()?;
        let s = self.schema.quoted();
        let schema_literal = format!("'{}'", self.schema);
        let m = migrator.quoted();
        let mut roles: Vec<&RoleName> = Vec::new();
        for r in self.roles.values() {
            if !roles.contains(&r) {
                roles.push(r);
            }
        }
        let mut out = Vec::new();
        for r in &roles {
            out.push(format!(
                "DO $outbox$ BEGIN\n\
                 \x20 IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{r}') THEN\n\
                 \x20   CREATE ROLE {} NOLOGIN;\n\
                 \x20 END IF;\n\
                 END $outbox$",
                r.quoted()
            ));
        }
        out.push(format!("CREATE SCHEMA IF NOT EXISTS {s} AUTHORIZATION {m}"));
        out.push(format!("ALTER SCHEMA {s} OWNER TO {m}"));
        out.push(format!(
            "DO $outbox$ DECLARE o record; BEGIN\n\
             \x20 FOR o IN SELECT c.relname, c.relkind FROM pg_catalog.pg_class c\n\
             \x20     JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace\n\
             \x20     WHERE n.nspname = {schema_literal} AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')\n\
             \x20       AND c.relowner <> (SELECT oid FROM pg_catalog.pg_roles WHERE rolname = '{migrator}')\n\
             \x20       AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid = 'pg_class'::regclass\n\
             \x20                       AND d.objid = c.oid AND d.deptype IN ('a', 'i'))\n\
             \x20 LOOP\n\
             \x20   EXECUTE format('ALTER %s %I.%I OWNER TO %I',\n\
             \x20     CASE o.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW'\n\
             \x20       WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END, {schema_literal}, o.relname, '{migrator}');\n\
             \x20 END LOOP;\n\
             END $outbox$"
        ));
        let list: Vec<String> = roles.iter().map(|r| r.quoted()).collect();
        out.push(format!(
            "DO $outbox$ BEGIN\n\
             \x20 EXECUTE format('GRANT CONNECT ON DATABASE %I TO {}', current_database());\n\
             END $outbox$",
            list.join(", ")
        ));
        Ok(out)
    }

    /// The bootstrap as a script for `psql`: one transaction, with comments.
    ///
    /// # Errors
    /// [`RolesError::NoMigrator`] when the plan has no migrator role.
    pub fn bootstrap_script(&self) -> Result<String, RolesError> {
        let mut text = format!(
            "-- One-time set-up of schema \"{}\", run as a superuser: missing roles are created\n\
             -- NOLOGIN (make your login roles members), the schema and every object in it belong\n\
             -- to the migrator, every role may connect. Idempotent.\n\
             BEGIN;\n",
            self.schema
        );
        for st in self.bootstrap_statements()? {
            if st.starts_with("CREATE SCHEMA") {
                text.push_str(
                    "-- The schema belongs to the migrator: it alone creates and changes tables.\n",
                );
            } else if st.starts_with("DO $outbox$ DECLARE") {
                text.push_str(
                    "-- Objects created by another role (an install migrated as a superuser) move to\n\
                     -- the migrator; identity and serial sequences follow their tables.\n",
                );
            }
            text.push_str(&st);
            text.push_str(";\n");
        }
        text.push_str("COMMIT;\n");
        Ok(text)
    }

    /// Applies the grants in one transaction, under the migration lock. Run it as the
    /// migrator (the owner of the schema's objects) after every `outbox migrate`.
    ///
    /// # Transactions, locks
    /// One transaction holding the advisory lock `outbox migrate` takes, so grants never
    /// interleave with a migration. Each named role first loses every privilege in the schema,
    /// then gets exactly its components' grants; before the commit, every grant is verified.
    ///
    /// # Errors
    /// * [`RolesError::Schema`]: the schema is not at this release's version (migrate first).
    /// * [`RolesError::UnknownRoles`]: a named role does not exist (create it, or run the
    ///   bootstrap).
    /// * [`RolesError::NotOwner`]: the connected role does not own every object (run as the
    ///   migrator, or bootstrap as a superuser to hand the objects to the migrator).
    /// * [`RolesError::OwnerAsComponent`]: a component's role owns objects in the schema or is
    ///   a superuser, so no grant could limit it.
    /// * [`RolesError::Missing`]: a grant did not take (nothing is committed then).
    /// * [`RolesError::Database`].
    pub async fn apply_grants(&self, pool: &PgPool) -> Result<ApplyReport, RolesError> {
        self.validate_grants()?;
        check_schema(pool, &self.schema).await?;
        let grantees = self.grantees();
        let mut tx = pool.begin().await?;
        let names: Vec<String> = grantees.iter().map(|(r, _)| r.to_string()).collect();
        self.refuse_unknown(&mut tx, &names).await?;
        // GRANT by anyone but the owner is only a warning ("no privileges were granted").
        refuse_not_owner(&mut tx, &self.schema).await?;
        for (role, components) in &grantees {
            let owns_or_super: bool = sqlx::query_scalar(
                "SELECT r.rolsuper OR EXISTS (SELECT FROM pg_catalog.pg_class c \
                 JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $2 AND pg_catalog.pg_has_role(r.oid, c.relowner, 'USAGE')) \
                 OR EXISTS (SELECT FROM pg_catalog.pg_namespace n WHERE n.nspname = $2 \
                 AND pg_catalog.pg_has_role(r.oid, n.nspowner, 'USAGE')) \
                 FROM pg_catalog.pg_roles r WHERE r.rolname = $1",
            )
            .bind(role.as_str())
            .bind(self.schema.as_str())
            .fetch_one(&mut *tx)
            .await?;
            if owns_or_super {
                return Err(RolesError::OwnerAsComponent {
                    role: role.to_string(),
                    component: components[0],
                });
            }
        }
        let statements = self.grant_statements();
        for st in &statements {
            sqlx::raw_sql(AssertSqlSafe(st.clone()))
                .execute(&mut *tx)
                .await?;
        }
        for (role, components) in &grantees {
            for c in components {
                let missing = missing_privileges(&mut tx, &self.schema, role.as_str(), *c).await?;
                if !missing.is_empty() {
                    return Err(RolesError::Missing {
                        role: role.to_string(),
                        component: *c,
                        missing,
                    });
                }
            }
        }
        tx.commit().await?;
        Ok(ApplyReport {
            roles: grantees
                .into_iter()
                .map(|(r, c)| (r.to_string(), c))
                .collect(),
            statements: statements.len(),
        })
    }

    /// Runs the bootstrap in one transaction. Run it once, as a superuser (or a role with
    /// CREATEROLE that may act as the migrator and create schemas).
    ///
    /// # Errors
    /// * [`RolesError::NoMigrator`], [`RolesError::OwnerAsComponent`]: the plan is incomplete
    ///   or names the migrator for a component.
    /// * [`RolesError::BootstrapDenied`]: the connected role may not create roles or schemas.
    /// * [`RolesError::Database`].
    pub async fn apply_bootstrap(&self, pool: &PgPool) -> Result<BootstrapReport, RolesError> {
        let statements = self.bootstrap_statements()?;
        let mut tx = pool.begin().await?;
        let names: Vec<String> = self.roles.values().map(|r| r.to_string()).collect();
        let existing: Vec<String> = sqlx::query_scalar(
            "SELECT rolname::text FROM pg_catalog.pg_roles WHERE rolname = ANY($1)",
        )
        .bind(&names)
        .fetch_all(&mut *tx)
        .await?;
        let mut created: Vec<String> = names
            .into_iter()
            .filter(|n| !existing.contains(n))
            .collect();
        created.sort();
        created.dedup();
        for st in statements {
            if let Err(e) = sqlx::raw_sql(AssertSqlSafe(st)).execute(&mut *tx).await {
                return Err(match PermissionDenied::from_sqlx(&e, None, None) {
                    Some(p) => RolesError::BootstrapDenied {
                        role: pool_role(pool),
                        detail: p.detail,
                    },
                    None => RolesError::Database(e),
                });
            }
        }
        tx.commit().await?;
        Ok(BootstrapReport { created })
    }

    async fn refuse_unknown(
        &self,
        conn: &mut PgConnection,
        names: &[String],
    ) -> Result<(), RolesError> {
        let existing: Vec<String> = sqlx::query_scalar(
            "SELECT rolname::text FROM pg_catalog.pg_roles WHERE rolname = ANY($1)",
        )
        .bind(names)
        .fetch_all(conn)
        .await?;
        let unknown: Vec<(Component, String)> = self
            .roles
            .iter()
            .filter(|(c, r)| **c != Component::Migrator && !existing.contains(&r.0))
            .map(|(c, r)| (*c, r.to_string()))
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(RolesError::UnknownRoles { roles: unknown })
        }
    }
}

/// What [`RolePlan::apply_grants`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyReport {
    /// Each role that got grants, with its components.
    pub roles: Vec<(String, Vec<Component>)>,
    /// Statements run.
    pub statements: usize,
}

/// What [`RolePlan::apply_bootstrap`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapReport {
    /// Roles that did not exist and were created `NOLOGIN`.
    pub created: Vec<String>,
}
