//! The operator commands, one function each, over the library's admin operations.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use outbox::broker::Registry;
use outbox::maintenance::{InboxRetention, Maintainer, MaintenanceConfig, ReplayHorizon};
use outbox::relay::Relay;
use outbox::{DeadLetterListParams, OutboxStore, RequeueParams};
use outbox_postgres::roles::{Component, PermissionDenied, check_privileges, pool_role};
use outbox_postgres::{PgStore, PgStoreConfig, Schema};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::config::{FileConfig, redact};
use crate::{CleanupArgs, ConsumerDeadLetterCmd, DeadLetterCmd};

/// Relay leases that expired this long ago belong to crashed relays: the maintainer deletes them.
const LEASE_REAP_AFTER: Duration = Duration::from_secs(600);

/// `outbox migrate`.
pub async fn migrate(pool: &PgPool, schema: &Schema) -> Result<ExitCode> {
    let report = outbox_postgres::migrate(pool, schema).await?;
    if report.applied.is_empty() {
        println!(
            "schema `{schema}` is up to date (version {})",
            report.version
        );
    } else {
        println!(
            "schema `{schema}` migrated to version {} (applied {:?})",
            report.version, report.applied
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `outbox relay`: runs until SIGTERM / Ctrl-C, with one elected lease reaper per schema.
pub async fn relay(
    store: PgStore,
    brokers: &Registry,
    broker_url: &str,
    settings: &outbox::broker::BrokerSettings,
    file: &FileConfig,
    metrics_addr: Option<std::net::SocketAddr>,
) -> Result<ExitCode> {
    let relay_config = file.relay.to_relay_config()?;
    store.check().await.context("cannot start the relay")?;
    // Fail now, naming every missing grant, rather than at the first claim or settle.
    check_privileges(store.pool(), store.schema(), Component::Relay)
        .await
        .context("cannot start the relay")?;
    let transport = brokers.connect_transport(broker_url, settings).await?;
    let addr = metrics_addr.or(file
        .metrics_addr
        .as_deref()
        .map(|a| a.parse().context("invalid configuration `metrics_addr`"))
        .transpose()?);
    if let Some(addr) = addr {
        crate::metrics::install(addr)?;
        info!(%addr, "serving Prometheus metrics");
    }
    let schema = store.schema().clone();
    let relay = Arc::new(Relay::new(
        Arc::new(store),
        Arc::new(transport),
        relay_config,
    )?);
    let shutdown = CancellationToken::new();
    tokio::spawn(outbox::cancel_on_signal(shutdown.clone()));
    // Leases of crashed relays are reaped by one elected relay.
    let reaper = Maintainer::<PgStore>::new(
        Arc::clone(relay.store()),
        MaintenanceConfig {
            lease_reap_after: Some(LEASE_REAP_AFTER),
            ..Default::default()
        },
    )?;
    let reaping = tokio::spawn(reaper.run(shutdown.clone()));
    info!(schema = %schema, broker = %redact(broker_url), "relay started");
    relay.run(shutdown).await;
    let _ = reaping.await;
    Ok(ExitCode::SUCCESS)
}

/// `outbox status`.
pub async fn status(
    pool: PgPool,
    store_config: PgStoreConfig,
    json: bool,
    relay_metrics: Option<String>,
) -> Result<ExitCode> {
    let resolved_schema = store_config.schema.clone();
    let store = PgStore::new(pool, store_config);
    store.check().await?;
    let s = store.stats().await?;
    let conflicts = outbox_postgres::PgInbox::new(resolved_schema.clone())
        .conflict_count(store.pool())
        .await?;
    let consumer_dead =
        outbox_postgres::consumer_dead_letter_list(store.pool(), &resolved_schema, None, i64::MAX)
            .await?
            .len();
    let effects = outbox_postgres::effects::PgEffects::new(resolved_schema.clone())
        .stats(store.pool(), None)
        .await?;
    let unknown_age = effects.oldest_unknown_age.map_or(0.0, |d| d.as_secs_f64());
    let relay = match &relay_metrics {
        Some(addr) => Some(crate::scrape::fetch(addr).await?),
        None => None,
    };
    let age = s.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64());
    let total = |name: &str| {
        relay
            .as_ref()
            .map(|r| r.totals.get(name).copied().unwrap_or(0.0))
    };
    let q = |p: f64| relay.as_ref().and_then(|r| r.latency_quantile(p));
    use outbox_core::relay::metric as m;
    if json {
        let mut v = serde_json::json!({
            "schema": resolved_schema.as_str(),
            "pending": s.pending,
            "oldest_pending_age_seconds": age,
            "in_flight": s.in_flight,
            "retrying": s.retrying,
            "dead_letters": s.dead,
            "published_retained": s.published_retained,
            "inbox_conflicts": conflicts,
            "consumer_dead_letters": consumer_dead,
            "work_items": {
                "pending": effects.pending,
                "in_progress": effects.in_progress,
                "unknown": effects.unknown,
                "oldest_unknown_age_seconds": unknown_age,
                "failed": effects.failed,
            },
        });
        if relay.is_some() {
            v["relay"] = serde_json::json!({
                "published_total": total(m::PUBLISHED),
                "publish_failures_total": total(m::PUBLISH_FAILURES),
                "dead_lettered_total": total(m::DEAD_LETTERED),
                "broker_duplicates_total": total(m::BROKER_DUPLICATES),
                "lease_lost_total": total(m::LEASE_LOST),
                "publish_latency_p50_seconds_le": q(0.5),
                "publish_latency_p99_seconds_le": q(0.99),
            });
        }
        println!("{v}");
    } else {
        println!("schema                      {}", resolved_schema);
        println!("pending                     {}", s.pending);
        println!("oldest pending age (s)      {age:.3}");
        println!("in flight (leased)          {}", s.in_flight);
        println!("retrying (failed >= once)   {}", s.retrying);
        println!("dead letters                {}", s.dead);
        println!("published (kept, mark mode) {}", s.published_retained);
        println!("inbox conflicts             {conflicts}");
        println!("consumer dead letters       {consumer_dead}");
        println!("work items pending          {}", effects.pending);
        println!("work items unknown          {}", effects.unknown);
        println!("oldest unknown age (s)      {unknown_age:.3}");
        println!("work items failed           {}", effects.failed);
        if relay.is_some() {
            let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x}"));
            println!("relay at {}:", relay_metrics.as_deref().unwrap_or(""));
            println!("  published                 {}", f(total(m::PUBLISHED)));
            println!(
                "  failed attempts           {}",
                f(total(m::PUBLISH_FAILURES))
            );
            println!("  dead-lettered             {}", f(total(m::DEAD_LETTERED)));
            println!(
                "  broker duplicates         {}",
                f(total(m::BROKER_DUPLICATES))
            );
            println!("  leases lost               {}", f(total(m::LEASE_LOST)));
            println!("  publish latency p50 <= s  {}", f(q(0.5)));
            println!("  publish latency p99 <= s  {}", f(q(0.99)));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `outbox dead-letters`.
pub async fn dead_letters(
    pool: PgPool,
    store_config: PgStoreConfig,
    cmd: DeadLetterCmd,
) -> Result<ExitCode> {
    let store = PgStore::new(pool, store_config);
    store.check().await?;
    match cmd {
        DeadLetterCmd::List { limit } => {
            let list = store
                .dead_letter_list(DeadLetterListParams { limit })
                .await?;
            if list.is_empty() {
                println!("no dead letters");
            }
            for d in list {
                println!(
                    "{}  {}/{} v{}  {}  attempts={}  waiting_behind={}  created={}\n    last_error: {}",
                    d.event_id,
                    d.aggregate_type,
                    d.aggregate_id,
                    d.aggregate_version,
                    d.event_type,
                    d.attempts,
                    d.blocked_behind,
                    d.created_at.to_rfc3339(),
                    d.last_error.as_deref().unwrap_or("-")
                );
            }
        }
        DeadLetterCmd::Requeue { event_ids, all } => {
            let params = RequeueParams {
                event_ids: (!all).then_some(event_ids.clone()),
            };
            let n = store.dead_letter_requeue(params).await?;
            println!("requeued {n} dead letter(s)");
            if !all && (n as usize) < event_ids.len() {
                println!(
                    "note: {} of the given ids were not dead letters",
                    event_ids.len() - n as usize
                );
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `outbox conflicts list`.
pub async fn conflicts(pool: PgPool, schema: &Schema, limit: i64) -> Result<ExitCode> {
    outbox_postgres::check_schema(&pool, schema).await?;
    let inbox = outbox_postgres::PgInbox::new(schema.clone());
    let list = inbox.conflicts(&pool, limit).await?;
    if list.is_empty() {
        println!("no conflicts");
    }
    for c in list {
        println!(
            "{}  consumer={}  {}/{} v{}  {}  seen {}x (first {}, last {})\n    stored  sha256 {}\n    received sha256 {}",
            c.event_id,
            c.consumer_name,
            c.aggregate_type,
            c.aggregate_id,
            c.aggregate_version,
            c.event_type,
            c.occurrences,
            c.first_seen.to_rfc3339(),
            c.last_seen.to_rfc3339(),
            c.stored,
            c.received
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `outbox consumer-dead-letters`.
pub async fn consumer_dead_letters(
    pool: PgPool,
    schema: &Schema,
    cmd: ConsumerDeadLetterCmd,
) -> Result<ExitCode> {
    outbox_postgres::check_schema(&pool, schema).await?;
    match cmd {
        ConsumerDeadLetterCmd::List { consumer, limit } => {
            let list = outbox_postgres::consumer_dead_letter_list(
                &pool,
                schema,
                consumer.as_deref(),
                limit,
            )
            .await?;
            if list.is_empty() {
                println!("no consumer dead letters");
            }
            for d in list {
                println!(
                    "#{}  consumer={}  state={}  event={}  {}/{} v{}  {}  attempts={}  since {}\n    error: {}",
                    d.id,
                    d.consumer_name,
                    d.state,
                    d.event_id.map_or("-".to_owned(), |e| e.to_string()),
                    d.aggregate_type.as_deref().unwrap_or("-"),
                    d.aggregate_id.as_deref().unwrap_or("-"),
                    d.aggregate_version
                        .map_or("-".to_owned(), |v| v.to_string()),
                    d.event_type.as_deref().unwrap_or("-"),
                    d.attempts,
                    d.created_at.to_rfc3339(),
                    d.error
                );
            }
        }
        ConsumerDeadLetterCmd::Requeue { ids, all, consumer } => {
            let n = outbox_postgres::consumer_dead_letter_requeue(
                &pool,
                schema,
                consumer.as_deref(),
                (!all).then_some(ids.as_slice()),
            )
            .await
            .map_err(|e| needs_grants(&pool, e, Component::Operator))?;
            println!(
                "requeued {n} consumer dead letter(s); the consumer applies them through its inbox"
            );
            if !all && (n as usize) < ids.len() {
                println!(
                    "note: {} of the given ids were not open dead letters",
                    ids.len() - n as usize
                );
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A refused statement says which component's grants the role needs; other errors pass.
fn needs_grants(pool: &PgPool, e: sqlx::Error, component: Component) -> anyhow::Error {
    match PermissionDenied::from_sqlx(&e, Some(&pool_role(pool)), Some(component)) {
        Some(denied) => anyhow::Error::new(denied),
        None => e.into(),
    }
}

/// `outbox cleanup`: one elected round, or rounds until SIGTERM with `--loop`.
pub async fn cleanup(pool: PgPool, schema: &Schema, a: CleanupArgs) -> Result<ExitCode> {
    check_privileges(&pool, schema, Component::Maintainer)
        .await
        .context("refusing to clean up")?;
    if a.batch_size < 1 {
        anyhow::bail!("invalid option `--batch-size`: must be at least 1");
    }
    let config = MaintenanceConfig {
        inbox: Some(InboxRetention {
            keep: Duration::from_secs(a.inbox_keep_secs),
            horizon: ReplayHorizon {
                broker_retention: Duration::from_secs(a.broker_retention_secs),
                outbox_retention: Duration::from_secs(a.outbox_retention_secs),
                dead_letter_requeue_window: Duration::from_secs(a.dead_letter_requeue_window_secs),
            },
        }),
        work_items_keep: a.work_items_keep_secs.map(Duration::from_secs),
        lease_reap_after: Some(LEASE_REAP_AFTER),
        batch_size: a.batch_size,
        interval: Duration::from_secs(a.interval_secs.max(1)),
    };
    let store = PgStore::with_schema(pool, schema.clone());
    let maintainer = Maintainer::new(store, config).context("refusing to clean up")?;
    if a.run_loop {
        let shutdown = CancellationToken::new();
        tokio::spawn(outbox::cancel_on_signal(shutdown.clone()));
        maintainer.run(shutdown).await;
        return Ok(ExitCode::SUCCESS);
    }
    match maintainer.round_once().await? {
        Some(r) => println!(
            "deleted {} row(s): {} inbox identities, {} work items, {} expired leases",
            r.total(),
            r.inbox,
            r.work_items,
            r.leases
        ),
        None => println!("another instance is the maintainer right now; nothing deleted"),
    }
    Ok(ExitCode::SUCCESS)
}
