//! `outbox roles …`: the least-privilege roles of each component. Print the SQL for a review
//! (`print`), run it (`apply`), or check that the connected role holds a component's grants
//! (`check`). The grants are decided in `outbox_postgres::roles`.

use std::process::ExitCode;

use anyhow::{Context, Result};
use outbox_postgres::roles::{Component, RoleName, RolePlan, check_privileges};
use outbox_postgres::{DEFAULT_SCHEMA, Schema};

use crate::config::{self, FileConfig};

/// `outbox roles` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum RolesCmd {
    /// Print the SQL: the grants (the migrator runs them after every `outbox migrate`), or with
    /// --bootstrap the one-time set-up a superuser runs. Needs no database.
    Print(PlanArgs),
    /// Run the SQL on the database: the grants as the migrator, or with --bootstrap the
    /// one-time set-up as a superuser. Idempotent.
    Apply(PlanArgs),
    /// Check that the connected role holds every grant of a component; lists what is missing.
    Check {
        /// The component the connected role serves: migrator, producer, relay, consumer,
        /// executor, maintainer, reader or operator.
        #[arg(long, value_parser = parse_component)]
        component: Component,
    },
}

/// Which role serves which component. With no component flag, every component gets its
/// default role `<schema>_<component>`; with some, only those are covered.
#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// The one-time set-up instead of the grants: create missing roles NOLOGIN, give the
    /// schema and its objects to the migrator, let every role connect.
    #[arg(long)]
    bootstrap: bool,
    /// Role that owns the schema and runs `outbox migrate` (default `<schema>_migrator`).
    #[arg(long, value_name = "ROLE")]
    migrator: Option<String>,
    /// Role of the producers (`PgOutbox`).
    #[arg(long, value_name = "ROLE")]
    producer: Option<String>,
    /// Role of `outbox relay`.
    #[arg(long, value_name = "ROLE")]
    relay: Option<String>,
    /// Role of the consumers (`PgConsumer`, `PgInbox`).
    #[arg(long, value_name = "ROLE")]
    consumer: Option<String>,
    /// Role of `outbox effects run`.
    #[arg(long, value_name = "ROLE")]
    executor: Option<String>,
    /// Role of `outbox cleanup`.
    #[arg(long, value_name = "ROLE")]
    maintainer: Option<String>,
    /// Role of the read-only operator (`status`, every `list`).
    #[arg(long, value_name = "ROLE")]
    reader: Option<String>,
    /// Role of the operator (the reader's reads plus requeue and resolve).
    #[arg(long, value_name = "ROLE")]
    operator: Option<String>,
}

fn parse_component(s: &str) -> Result<Component, String> {
    s.parse()
}

impl PlanArgs {
    fn plan(&self, schema: Schema) -> Result<RolePlan> {
        let named = [
            (Component::Producer, &self.producer),
            (Component::Relay, &self.relay),
            (Component::Consumer, &self.consumer),
            (Component::Executor, &self.executor),
            (Component::Maintainer, &self.maintainer),
            (Component::Reader, &self.reader),
            (Component::Operator, &self.operator),
        ];
        let role = |c: Component, name: &Option<String>| -> Result<RoleName> {
            match name {
                Some(n) => RoleName::new(n).with_context(|| format!("invalid option `--{c}`")),
                None => RoleName::default_for(&schema, c).with_context(|| {
                    format!(
                        "no default role name for the {c} in schema `{schema}`: name it with --{c}"
                    )
                }),
            }
        };
        let mut plan = RolePlan::new(schema.clone()).with_role(
            Component::Migrator,
            role(Component::Migrator, &self.migrator)?,
        );
        let any = named.iter().any(|(_, n)| n.is_some());
        for (c, name) in named {
            if !any || name.is_some() {
                plan = plan.with_role(c, role(c, name)?);
            }
        }
        Ok(plan)
    }
}

/// The schema from the flag or environment, the file, or the default; no database needed.
fn schema(flag: Option<String>, file: &FileConfig) -> Result<Schema> {
    let name = flag
        .or_else(|| file.schema.clone())
        .unwrap_or_else(|| DEFAULT_SCHEMA.to_owned());
    Schema::new(&name).map_err(|e| anyhow::anyhow!("invalid configuration `schema`: {e}"))
}

/// Runs an `outbox roles` subcommand.
pub async fn run(
    cmd: RolesCmd,
    database_url: Option<String>,
    schema_flag: Option<String>,
    file: &FileConfig,
    brokers: &outbox::broker::Registry,
) -> Result<ExitCode> {
    if let RolesCmd::Print(args) = &cmd {
        let plan = args.plan(schema(schema_flag, file)?)?;
        if args.bootstrap {
            print!("{}", plan.bootstrap_script()?);
        } else {
            print!("{}", plan.grant_script());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let resolved = config::resolve(database_url, None, schema_flag, file, brokers)?;
    let pool =
        outbox_postgres::connect(&resolved.database_url, 4, std::time::Duration::from_secs(5))
            .await?;
    let schema = resolved.schema;
    match cmd {
        RolesCmd::Print(_) => unreachable!("printed above"),
        RolesCmd::Apply(args) => {
            let plan = args.plan(schema.clone())?;
            if args.bootstrap {
                let report = plan
                    .apply_bootstrap(&pool)
                    .await
                    .context("bootstrap failed; nothing was changed")?;
                if report.created.is_empty() {
                    println!("every role existed");
                } else {
                    println!("created NOLOGIN: {}", report.created.join(", "));
                }
                let migrator = plan
                    .role(Component::Migrator)
                    .expect("the plan always has a migrator");
                println!(
                    "schema `{schema}` and its objects belong to `{migrator}`; next, as `{migrator}`: `outbox migrate`, then `outbox roles apply`"
                );
            } else {
                let report = plan
                    .apply_grants(&pool)
                    .await
                    .context("grants not applied; nothing was changed")?;
                for (role, components) in report.roles {
                    let names: Vec<&str> = components.iter().map(|c| c.as_str()).collect();
                    println!("{role}: {} grants", names.join(" + "));
                }
                println!(
                    "schema `{schema}`: {} statement(s) applied",
                    report.statements
                );
            }
        }
        RolesCmd::Check { component } => {
            check_privileges(&pool, &schema, component).await?;
            let role: String = sqlx::query_scalar("SELECT current_user::text")
                .fetch_one(&pool)
                .await?;
            println!("role `{role}` holds the {component} grants on schema `{schema}`");
        }
    }
    Ok(ExitCode::SUCCESS)
}
