//! `outbox effects …`: run the remote-effect executor against an HTTP payout provider, and
//! inspect or resolve work items by hand.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use outbox::effect::{Executor, ExecutorConfig};
use outbox_core::operator::Resolution;
use outbox_core::operator::prelude::*;
use outbox_http::{HttpPayoutProvider, ProviderTls};
use outbox_postgres::PgStore;
use outbox_postgres::Schema;
use outbox_postgres::heartbeat::InstanceKind;
use outbox_postgres::roles::Component;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::config::redact;

/// `outbox effects` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum EffectsCmd {
    /// Run the executor until SIGTERM: claim work items, call the provider with their
    /// idempotency key, record the outcome, reconcile unknown outcomes by key.
    Run(RunArgs),
    /// Work items per state, the reconciliation backlog and the oldest unknown age.
    Status {
        /// Only this kind.
        #[arg(long)]
        kind: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// List work items, oldest first.
    List {
        /// Only this state: pending, in_progress, unknown, succeeded, failed.
        #[arg(long)]
        state: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: i64,
    },
    /// Settle an unknown item after checking with the provider yourself, or call again.
    Resolve {
        /// Work item id (from `list`).
        id: i64,
        /// The provider confirmed the effect; its reference.
        #[arg(long, group = "decision")]
        succeeded: Option<String>,
        /// The provider confirmed it did not happen and must not; the reason.
        #[arg(long, group = "decision")]
        failed: Option<String>,
        /// Call the provider again with the same key.
        #[arg(long, group = "decision")]
        resend: bool,
        #[command(flatten)]
        action: crate::admin_cmd::ActionArgs,
    },
    /// Look up an unknown outcome now: its next lookup by idempotency key is due at once (a
    /// running `effects run` does it on its next claim).
    Reconcile {
        /// Work item id (from `list --state unknown`).
        id: i64,
        #[command(flatten)]
        action: crate::admin_cmd::ActionArgs,
    },
}

/// Options of `outbox effects run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Work-item kind to execute.
    #[arg(long, default_value = "payout")]
    kind: String,
    /// Base URL of the payout provider (`https://host[:port][/prefix]`, or `http://` on a
    /// trusted network).
    #[arg(long, env = "OUTBOX_PROVIDER_URL", hide_env_values = true)]
    provider_url: String,
    /// PEM file of the certificate authorities trusted for the provider's certificate, instead
    /// of the system's trust store (https only).
    #[arg(long, env = "OUTBOX_PROVIDER_CA_FILE")]
    provider_ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS with the provider (needs --provider-key-file).
    #[arg(long, env = "OUTBOX_PROVIDER_CERT_FILE")]
    provider_cert_file: Option<PathBuf>,
    /// PEM private key of --provider-cert-file.
    #[arg(long, env = "OUTBOX_PROVIDER_KEY_FILE")]
    provider_key_file: Option<PathBuf>,
    /// Timeout of one call or lookup; a timed-out call is an unknown outcome.
    #[arg(long, default_value_t = 10_000)]
    call_timeout_ms: u64,
    /// Lease of a claim; must exceed ceil(batch / concurrency) × call timeout + 2 s.
    #[arg(long, default_value_t = 30.0)]
    lease_secs: f64,
    /// Items claimed per pass.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Minimum age of an unknown item before its first lookup.
    #[arg(long, default_value_t = 2000)]
    reconcile_after_ms: u64,
    /// Park items the provider has no record of instead of calling again with the same key
    /// (for providers that do not deduplicate by key).
    #[arg(long)]
    no_resend_when_not_found: bool,
    /// Serve Prometheus metrics here, e.g. 127.0.0.1:9091 (no authentication: keep it on
    /// loopback).
    #[arg(long, env = "OUTBOX_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
}

impl RunArgs {
    /// The provider's base URL as given (it may carry secrets: redact before showing it).
    pub fn provider_url(&self) -> &str {
        &self.provider_url
    }
}

/// Runs an `outbox effects` subcommand.
pub async fn run(cmd: EffectsCmd, pool: PgPool, schema: Schema) -> Result<()> {
    let admin = PgStore::with_schema(pool.clone(), schema.clone());
    admin.ready().await?;
    match cmd {
        EffectsCmd::Run(a) => {
            // Fail now, naming every missing grant, rather than at the first claim.
            outbox_postgres::roles::check_privileges(&pool, &schema, Component::Executor)
                .await
                .context("cannot start the executor")?;
            if !(a.lease_secs.is_finite() && a.lease_secs > 0.0) {
                bail!("invalid option `--lease-secs`: must be a positive number of seconds");
            }
            let tls = ProviderTls {
                ca_file: a.provider_ca_file.clone(),
                cert_file: a.provider_cert_file.clone(),
                key_file: a.provider_key_file.clone(),
            };
            let provider = HttpPayoutProvider::with_tls(&a.provider_url, &tls)?;
            let config = ExecutorConfig {
                batch_size: a.batch_size,
                concurrency: a.concurrency,
                lease: Duration::from_secs_f64(a.lease_secs),
                call_timeout: Duration::from_millis(a.call_timeout_ms),
                reconcile_after: Duration::from_millis(a.reconcile_after_ms),
                resend_when_not_found: !a.no_resend_when_not_found,
                ..ExecutorConfig::new(a.kind.clone())
            };
            let executor = Arc::new(
                Executor::<PgStore, _>::new(PgStore::with_schema(pool, schema), provider, config)
                    .context("cannot start the executor")?,
            );
            let readiness = outbox::health::Readiness::new();
            if let Some(addr) = a.metrics_addr {
                crate::metrics::serve(addr, readiness.clone()).await?;
            }
            let shutdown = CancellationToken::new();
            tokio::spawn(outbox::cancel_on_signal(shutdown.clone()));
            let beat = tokio::spawn(
                crate::commands::heartbeat(&admin, InstanceKind::Executor, &a.kind)?
                    .run(shutdown.clone()),
            );
            tracing::info!(kind = %a.kind, provider = %redact(&a.provider_url), "executor started");
            readiness.running();
            executor.run(shutdown.clone()).await;
            readiness.stopped();
            shutdown.cancel();
            let _ = beat.await;
            tracing::info!("executor stopped");
        }
        EffectsCmd::Status { kind, json } => {
            let s = admin.work_item_stats(kind.as_deref()).await?;
            let unknown_age = s.oldest_unknown_age.map_or(0.0, |d| d.as_secs_f64());
            let pending_age = s.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64());
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "pending": s.pending,
                        "in_progress": s.in_progress,
                        "unknown": s.unknown,
                        "succeeded": s.succeeded,
                        "failed": s.failed,
                        "oldest_unknown_age_seconds": unknown_age,
                        "oldest_pending_age_seconds": pending_age,
                    })
                );
            } else {
                println!("pending                     {}", s.pending);
                println!("in progress                 {}", s.in_progress);
                println!("unknown (to reconcile)      {}", s.unknown);
                println!("oldest unknown age (s)      {unknown_age:.3}");
                println!("oldest pending age (s)      {pending_age:.3}");
                println!("succeeded                   {}", s.succeeded);
                println!("failed                      {}", s.failed);
            }
        }
        EffectsCmd::List { state, limit } => {
            let list = admin.work_items(state.as_deref(), limit).await?;
            if list.is_empty() {
                println!("no work items");
            }
            for w in list {
                println!(
                    "#{}  {}  {}  key={}  attempts={} lookups={}  ref={}  since {}\n    last_error: {}",
                    w.id,
                    w.kind,
                    w.state,
                    w.idempotency_key,
                    w.attempts,
                    w.lookups,
                    w.reference.as_deref().unwrap_or("-"),
                    w.created_at.to_rfc3339(),
                    w.last_error.as_deref().unwrap_or("-")
                );
            }
        }
        EffectsCmd::Resolve {
            id,
            succeeded,
            failed,
            resend,
            action,
        } => {
            let resolution = match (succeeded, failed, resend) {
                (Some(reference), None, false) => Resolution::Succeeded { reference },
                (None, Some(reason), false) => Resolution::Failed { reason },
                (None, None, true) => Resolution::Resend,
                _ => bail!("give exactly one of --succeeded REF, --failed REASON, --resend"),
            };
            let row = admin
                .resolve_work_item(id, resolution, &action.actor()?, action.reason())
                .await?;
            println!("work item #{} is now {}", row.id, row.state);
        }
        EffectsCmd::Reconcile { id, action } => {
            admin
                .reconcile_work_item(id, &action.actor()?, action.reason())
                .await?;
            println!("work item #{id}: its lookup is due now");
        }
    }
    Ok(())
}
