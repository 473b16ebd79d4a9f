//! Checking a role's grants against its components' and reporting what is missing.

use super::*;

// ---------------------------------------------------------------------------------------------
// Checking and reporting

/// Lists what `role` lacks of `component`'s grants in `schema`, each as the GRANT fragment that
/// would add it (`UPDATE (state) ON TABLE "outbox"."events"`).
pub(super) async fn missing_privileges(
    conn: &mut PgConnection,
    schema: &Schema,
    role: &str,
    component: Component,
) -> Result<Vec<String>, sqlx::Error> {
    if component == Component::Migrator {
        return Ok(Vec::new());
    }
    let s = schema.quoted();
    // Objects by OID: resolving a name would itself need USAGE on the schema.
    let oids: Vec<(String, i64)> = sqlx::query_as(
        "SELECT c.relname::text, c.oid::int8 FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE n.nspname = $1 AND c.relname = ANY($2)",
    )
    .bind(schema.as_str())
    .bind(covered_objects().collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    // (description, check, column); a column-level privilege is checked column by column and
    // reported with the missing columns only.
    let mut checks: Vec<(String, String, Option<&'static str>)> = vec![(
        format!("USAGE ON SCHEMA {s}"),
        format!("has_schema_privilege($1, '{}', 'USAGE')", schema.as_str()),
        None,
    )];
    for (o, access) in access_of(&[component]) {
        let on = format!("ON {} {s}.\"{}\"", o.kind.keyword(), o.name);
        let Some((_, oid)) = oids.iter().find(|(name, _)| name == o.name) else {
            return Err(sqlx::Error::Protocol(format!(
                "{} {s}.{} does not exist: run `outbox migrate`",
                o.kind.keyword().to_lowercase(),
                o.name
            )));
        };
        let object = format!("{oid}::oid");
        for (keyword, merged) in [
            ("SELECT", &access.select),
            ("INSERT", &access.insert),
            ("UPDATE", &access.update),
        ] {
            match merged {
                Merged::No => {}
                Merged::Table => checks.push((
                    format!("{keyword} {on}"),
                    format!("has_table_privilege($1, {object}, '{keyword}')"),
                    None,
                )),
                Merged::Some(cols) => {
                    for col in cols {
                        checks.push((
                            format!("{keyword} ({{}}) {on}"),
                            format!("has_column_privilege($1, {object}, '{col}', '{keyword}')"),
                            Some(col),
                        ));
                    }
                }
            }
        }
        if access.delete {
            checks.push((
                format!("DELETE {on}"),
                format!("has_table_privilege($1, {object}, 'DELETE')"),
                None,
            ));
        }
        if access.usage {
            checks.push((
                format!("USAGE {on}"),
                format!("has_sequence_privilege($1, {object}, 'USAGE')"),
                None,
            ));
        }
    }
    let sql = format!(
        "SELECT ARRAY[{}]",
        checks
            .iter()
            .map(|(_, c, _)| c.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let held: Vec<bool> = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(role)
        .fetch_one(&mut *conn)
        .await?;
    // Group missing columns under their privilege, keeping the order of the checks.
    let mut missing: Vec<(String, Vec<&str>)> = Vec::new();
    for ((what, _, col), ok) in checks.iter().zip(held) {
        if ok {
            continue;
        }
        match (col, missing.iter_mut().find(|(w, _)| w == what)) {
            (Some(c), Some((_, cols))) => cols.push(c),
            (Some(c), None) => missing.push((what.clone(), vec![c])),
            (None, _) => missing.push((what.clone(), Vec::new())),
        }
    }
    Ok(missing
        .into_iter()
        .map(|(what, cols)| {
            if cols.is_empty() {
                what
            } else {
                what.replacen("{}", &cols.join(", "), 1)
            }
        })
        .collect())
}

/// Refuses when the connected role cannot act as the owner of the schema and of every object
/// the grants cover.
pub(super) async fn refuse_not_owner(
    conn: &mut PgConnection,
    schema: &Schema,
) -> Result<(), RolesError> {
    let not_owned: Vec<String> = sqlx::query_scalar(
        "SELECT 'schema ' || n.nspname::text FROM pg_catalog.pg_namespace n \
         WHERE n.nspname = $1 AND NOT pg_catalog.pg_has_role(current_user, n.nspowner, 'USAGE') \
         UNION ALL \
         (SELECT c.relname::text FROM pg_catalog.pg_class c \
          JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = $1 AND c.relname = ANY($2) \
          AND NOT pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') ORDER BY 1)",
    )
    .bind(schema.as_str())
    .bind(covered_objects().collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    if not_owned.is_empty() {
        return Ok(());
    }
    let role: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut *conn)
        .await?;
    Err(RolesError::NotOwner {
        role,
        schema: schema.to_string(),
        objects: not_owned,
    })
}

/// Checks that the connected role holds every grant `component` needs in `schema` (for the
/// migrator: owns the schema and its objects), and that the schema is at this release's
/// version. Components call it at startup to fail at once, naming what is missing, rather than
/// at their first statement.
///
/// # Errors
/// * [`RolesError::Missing`]: the role lacks grants; the error lists each one.
/// * [`RolesError::NotOwner`]: checking the migrator, the role does not own everything.
/// * [`RolesError::Schema`]: [`crate::check_schema`] failed (including its
///   [`MigrateError::PermissionDenied`]).
/// * [`RolesError::Database`].
pub async fn check_privileges(
    pool: &PgPool,
    schema: &Schema,
    component: Component,
) -> Result<(), RolesError> {
    // The version first (a missing table cannot be checked), unless the role cannot even
    // read it: then the list below says exactly what it lacks.
    let version = match check_schema(pool, schema).await {
        Err(e) if !matches!(e, MigrateError::PermissionDenied(_)) => return Err(e.into()),
        other => other,
    };
    let mut conn = pool.acquire().await?;
    if component == Component::Migrator {
        refuse_not_owner(&mut conn, schema).await?;
        return Ok(version?);
    }
    let role: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut *conn)
        .await?;
    let missing = missing_privileges(&mut conn, schema, &role, component).await?;
    if !missing.is_empty() {
        return Err(RolesError::Missing {
            role,
            component,
            missing,
        });
    }
    version?;
    Ok(())
}
