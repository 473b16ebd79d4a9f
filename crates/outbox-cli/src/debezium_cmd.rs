//! `outbox debezium apply|sql|remove`: the bridge that turns rows inserted into a
//! Debezium-layout outbox table into events of this outbox (`outbox_postgres::debezium`).

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Subcommand;
use outbox_postgres::Schema;
use outbox_postgres::debezium::{self, DebeziumTable};
use sqlx::PgPool;

#[derive(Subcommand, Debug)]
pub(crate) enum DebeziumCmd {
    /// Install or replace the bridge trigger on the table of the config's `[debezium]` section
    /// (column names as Debezium's `table.field.event.*` options) or `--table`.
    Apply(DebeziumArgs),
    /// Print the SQL `apply` runs (to review it, or to have it run by the table's owner).
    Sql(DebeziumArgs),
    /// Remove the bridge: rows inserted into the table afterwards are no longer events.
    Remove(DebeziumArgs),
}

#[derive(clap::Args, Debug)]
pub(crate) struct DebeziumArgs {
    /// The Debezium-layout table, `schema.table` (wins over `[debezium] table`; the other
    /// settings keep their Debezium defaults unless the config file's section sets them).
    #[arg(long)]
    table: Option<String>,
}

impl DebeziumCmd {
    fn args(&self) -> &DebeziumArgs {
        match self {
            Self::Apply(a) | Self::Sql(a) | Self::Remove(a) => a,
        }
    }
}

/// The table's settings: the file's section, with `--table` over its table.
fn settings(cmd: &DebeziumCmd, file: Option<&DebeziumTable>) -> Result<DebeziumTable> {
    match (cmd.args().table.as_deref(), file) {
        (Some(table), Some(section)) => Ok(DebeziumTable {
            table: table.to_owned(),
            ..section.clone()
        }),
        (Some(table), None) => Ok(DebeziumTable::new(table)),
        (None, Some(section)) => Ok(section.clone()),
        (None, None) => bail!(
            "invalid configuration `debezium.table`: not set (use --table or a [debezium] section \
             in the config file)"
        ),
    }
}

pub(crate) async fn run(
    cmd: DebeziumCmd,
    pool: &PgPool,
    schema: &Schema,
    file: Option<&DebeziumTable>,
) -> Result<ExitCode> {
    let table = settings(&cmd, file)?;
    table.header_placements()?;
    match cmd {
        DebeziumCmd::Apply(_) => {
            debezium::install(pool, schema, &table).await?;
            println!(
                "bridge installed: every row inserted into {} becomes an event of schema `{schema}`",
                table.table
            );
        }
        DebeziumCmd::Sql(_) => print!("{}", debezium::bridge_sql(pool, schema, &table).await?),
        DebeziumCmd::Remove(_) => {
            debezium::remove(pool, schema, &table).await?;
            println!("bridge removed from {}", table.table);
        }
    }
    Ok(ExitCode::SUCCESS)
}
