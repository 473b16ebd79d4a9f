//! The operator commands, one function each, over the library's admin operations.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use outbox::broker::Registry;
use outbox::maintenance::{InboxRetention, Maintainer, MaintenanceConfig, ReplayHorizon};
use outbox_core::operator::prelude::*;
use outbox_postgres::heartbeat::{Heartbeat, InstanceKind};
use outbox_postgres::relay::{
    CdcRelayOptions, LEASE_REAP_AFTER, PgRelay, RelayMode as PgRelayMode,
};
use outbox_postgres::roles::{Component, check_privileges};
use outbox_postgres::{OnPublish, PgStore, PgStoreConfig, Schema};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::CleanupArgs;
use crate::config::{FileConfig, RelayMode, redact};

/// `outbox migrate`; with `cdc`, also the publication of the CDC relay.
pub async fn migrate(
    pool: &PgPool,
    schema: &Schema,
    cdc: Option<&outbox_postgres::cdc::CdcConfig>,
    on_publish: OnPublish,
) -> Result<ExitCode> {
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
    // Migration 12's rules hold for rows written from then on; pending rows written before
    // that break one are said now (the relay dead-letters each when it reaches it).
    let unpublishable = outbox_postgres::unpublishable_pending(pool, schema, 10)
        .await
        .context("cannot look for pending rows the relay cannot publish")?;
    if unpublishable.count > 0 {
        eprintln!(
            "warning: {} pending row(s) of {schema}.events break the table's rules (written \
             before it refused such rows); the relay dead-letters each with its reason. Correct \
             them now (UPDATE ... WHERE event_id = ...) to have them published:",
            unpublishable.count
        );
        for r in &unpublishable.rows {
            eprintln!(
                "  {} {}/{} v{}: {}",
                r.event_id, r.aggregate_type, r.aggregate_id, r.aggregate_version, r.problem
            );
        }
        if unpublishable.count > unpublishable.rows.len() as i64 {
            eprintln!(
                "  ... and {} more",
                unpublishable.count - unpublishable.rows.len() as i64
            );
        }
    }
    if let Some(cdc) = cdc {
        let name = cdc.publication_name(schema);
        let created = outbox_postgres::cdc::ensure_publication(pool, schema, &name)
            .await
            .context("cannot create the CDC relay's publication")?;
        println!(
            "publication `{name}` of {schema}.events inserts {}",
            if created { "created" } else { "exists" }
        );
    }
    if on_publish == OnPublish::Mark {
        let created = outbox_postgres::migrate_mark_mode(pool, schema)
            .await
            .context("cannot create the indexes of relay.on_publish = \"mark\"")?;
        if created.is_empty() {
            println!("mark-mode indexes exist");
        } else {
            println!("mark-mode indexes created: {}", created.join(", "));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What `outbox relay` runs with, besides the store.
pub struct RelayRun<'a> {
    /// The broker registry.
    pub brokers: &'a Registry,
    /// The broker's URL.
    pub broker_url: &'a str,
    /// The brokers' settings.
    pub settings: &'a outbox::broker::BrokerSettings,
    /// The configuration file.
    pub file: &'a FileConfig,
    /// Where to serve metrics.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Polling or CDC.
    pub mode: RelayMode,
    /// The database URL (the CDC relay's replication connection).
    pub database_url: &'a str,
    /// CDC: create the slot when missing.
    pub create_slot: bool,
}

/// `outbox relay`: the library's relay ([`PgRelay`]) with this configuration, until SIGTERM /
/// Ctrl-C. The start-up checks run before the broker is connected, so a missing grant or slot
/// is named before a broker outage is.
pub async fn relay(store: PgStore, run: RelayRun<'_>) -> Result<ExitCode> {
    let RelayRun {
        brokers,
        broker_url,
        settings,
        file,
        metrics_addr,
        mode,
        database_url,
        create_slot,
    } = run;
    let mode = match mode {
        RelayMode::Polling => PgRelayMode::Polling,
        RelayMode::Cdc => PgRelayMode::Cdc(CdcRelayOptions {
            database_url: database_url.to_owned(),
            cdc: file.relay.cdc_config()?,
            create_slot,
            heartbeat_every: file.relay.cdc_heartbeat()?,
        }),
    };
    let relay = PgRelay::new(store, file.relay.to_relay_config()?, mode)
        .with_live_session(file.relay.session_config()?)
        .with_claim_window(file.relay.claim_window);
    let addr = metrics_addr.or(file
        .metrics_addr
        .as_deref()
        .map(|a| a.parse().context("invalid configuration `metrics_addr`"))
        .transpose()?);
    // Served from the start, so that `/readyz` says `starting` (503) during the checks and the
    // broker's connection, rather than a refused connection.
    if let Some(addr) = addr {
        crate::metrics::serve(addr, relay.readiness()).await?;
        info!(%addr, "serving Prometheus metrics, /healthz and /readyz");
    }
    relay.check().await?;
    let transport = brokers.connect_transport(broker_url, settings).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(outbox::cancel_on_signal(shutdown.clone()));
    info!(broker = %redact(broker_url), "connected to the broker");
    relay.run(Arc::new(transport), shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// `outbox ready`: asks `GET /readyz` of the process at `addr` every 0.5 s until it answers
/// 200 or `wait` has passed. Prints the last answer; exit 0 when ready, 1 when not.
pub async fn ready(addr: &str, wait: std::time::Duration) -> Result<ExitCode> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let answer = crate::scrape::get(addr, "/readyz").await;
        if let Ok((200, body)) = &answer {
            println!("{body}");
            return Ok(ExitCode::SUCCESS);
        }
        if tokio::time::Instant::now() >= deadline {
            match answer {
                Ok((status, body)) => println!("not ready ({status}): {body}"),
                Err(e) => println!("not ready: {e:#}"),
            }
            return Ok(ExitCode::from(1));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// The heartbeat of this process (`outbox_postgres::heartbeat`): the console shows it as up,
/// late or gone.
pub(crate) fn heartbeat(store: &PgStore, kind: InstanceKind, name: &str) -> Result<Heartbeat> {
    Ok(Heartbeat::new(store.clone(), kind, name)?)
}

/// `outbox console`: the web console on `listen`, reading and acting through the same
/// operator contract (`outbox_core::operator`) as `status` and `dead-letters`. The token is read from `OUTBOX_CONSOLE_TOKEN` (an
/// empty value counts as none), else from the config file's `[console] token_file`.
pub async fn console(
    pool: PgPool,
    store_config: PgStoreConfig,
    file: &FileConfig,
    listen: std::net::SocketAddr,
    read_only: bool,
) -> Result<ExitCode> {
    // The environment's token, else the config file's `[console] token_file`; never a flag.
    let token = match std::env::var("OUTBOX_CONSOLE_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
    {
        Some(t) => {
            if file
                .console
                .as_ref()
                .is_some_and(|c| c.token_file.is_some())
            {
                warn!(
                    "OUTBOX_CONSOLE_TOKEN is set: the config file's console.token_file is not read"
                );
            }
            Some(t)
        }
        None => match &file.console {
            Some(c) => c.token().context("cannot start the console")?,
            None => None,
        },
    };
    let config = outbox_console::ConsoleConfig {
        token,
        read_only,
        // `serve` sets the host and read guards from the address it listens on.
        ..outbox_console::ConsoleConfig::default()
    };
    // Refused before binding: a weak token, a console open to the network without a token.
    config.validate()?;
    outbox_console::check_bind(listen, &config)?;
    let admin = PgStore::new(pool, store_config);
    admin.ready().await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener.local_addr()?;
    info!(%addr, read_only, actions = config.token.is_some() && !read_only, "serving the console");
    println!("console on http://{addr}/");
    let shutdown = CancellationToken::new();
    tokio::spawn(outbox::cancel_on_signal(shutdown.clone()));
    outbox_console::serve(listener, admin, config, async move {
        shutdown.cancelled().await
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}

/// `outbox status`.
pub async fn status(
    pool: PgPool,
    store_config: PgStoreConfig,
    json: bool,
    relay_metrics: Option<String>,
) -> Result<ExitCode> {
    let admin = PgStore::new(pool, store_config);
    admin.ready().await?;
    let o = admin.overview().await?;
    let routes = admin.routes(outbox_console::ROUTES_COUNT_BOUND).await?;
    let processes = admin.instances().await?;
    let relay = match &relay_metrics {
        Some(addr) => Some(crate::scrape::fetch(addr).await?),
        None => None,
    };
    let total = |name: &str| {
        relay
            .as_ref()
            .map(|r| r.totals.get(name).copied().unwrap_or(0.0))
    };
    let q = |p: f64| relay.as_ref().and_then(|r| r.latency_quantile(p));
    use outbox_core::relay::metric as m;
    if json {
        let mut v = serde_json::to_value(&o)?;
        v["routes"] = serde_json::to_value(&routes)?;
        v["processes"] = serde_json::to_value(&processes)?;
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
        let w = &o.work_items;
        print_fields(
            "",
            &[
                ("schema", o.schema.clone()),
                ("pending", o.pending.to_string()),
                (
                    "oldest pending age (s)",
                    format!("{:.3}", o.oldest_pending_age_seconds),
                ),
                ("in flight (leased)", o.in_flight.to_string()),
                ("retrying (failed >= once)", o.retrying.to_string()),
                ("dead letters", o.dead_letters.to_string()),
                (
                    "published (kept, mark mode)",
                    o.published_retained.to_string(),
                ),
                ("inbox conflicts", o.inbox_conflicts.to_string()),
                ("consumer dead letters", o.consumer_dead_letters.to_string()),
                ("work items pending", w.pending.to_string()),
                ("work items unknown", w.unknown.to_string()),
                (
                    "oldest unknown age (s)",
                    format!("{:.3}", w.oldest_unknown_age_seconds),
                ),
                ("work items failed", w.failed.to_string()),
            ],
        );
        if relay.is_some() {
            let f = |v: Option<f64>| v.map_or("-".to_owned(), |x| format!("{x}"));
            println!("relay at {}:", relay_metrics.as_deref().unwrap_or(""));
            print_fields(
                "  ",
                &[
                    ("published", f(total(m::PUBLISHED))),
                    ("failed attempts", f(total(m::PUBLISH_FAILURES))),
                    ("dead-lettered", f(total(m::DEAD_LETTERED))),
                    ("broker duplicates", f(total(m::BROKER_DUPLICATES))),
                    ("leases lost", f(total(m::LEASE_LOST))),
                    ("publish latency p50 <= s", f(q(0.5))),
                    ("publish latency p99 <= s", f(q(0.99))),
                ],
            );
        }
        print_routes(&routes);
        print_processes(&processes);
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints one `label  value` line per field, `indent` first and the values in one column (28
/// characters from the line's start, as `outbox status` always printed them).
fn print_fields(indent: &str, fields: &[(&str, String)]) {
    let width = 28 - indent.len();
    for (label, value) in fields {
        println!("{indent}{label:<width$}{value}");
    }
}

/// Prints `rows` under `headers`, each column as wide as its widest cell, numbers aligned
/// right.
fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let cells: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| {
                if c.parse::<f64>().is_ok() {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        println!("{}", cells.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// The routes of `outbox status`: pending, oldest, dead letters and publishes of the last 15
/// minutes per route.
fn print_routes(r: &outbox_core::operator::Routes) {
    println!();
    if r.routes.is_empty() {
        println!(
            "routes: none pending or dead (among the oldest {} rows)",
            r.counted_up_to
        );
        return;
    }
    let rows: Vec<Vec<String>> = r
        .routes
        .iter()
        .map(|route| {
            vec![
                match (&route.destination, &route.aggregate_type) {
                    (Some(d), _) => format!("destination:{d}"),
                    (None, Some(t)) => format!("type:{t}"),
                    (None, None) => "-".to_owned(),
                },
                route.pending.to_string(),
                format!("{:.1}", route.oldest_pending_age_seconds),
                route.dead_letters.to_string(),
                route.published_per_minute.iter().sum::<i64>().to_string(),
            ]
        })
        .collect();
    print_table(
        &[
            "ROUTE",
            "PENDING",
            "OLDEST (s)",
            "DEAD",
            "PUBLISHED (15 min)",
        ],
        &rows,
    );
    if !r.complete {
        println!(
            "(counted among the oldest {} rows; there are more)",
            r.counted_up_to
        );
    }
}

/// The processes of `outbox status`: those that run a heartbeat, with what a relay holds,
/// each engine's state, last progress and errors in the last minute, then the last error of
/// each process that reported one (why it is stuck, when it is).
fn print_processes(list: &[outbox_core::operator::Instance]) {
    println!();
    if list.is_empty() {
        println!("processes: none has reported a heartbeat");
        return;
    }
    let ago = |s: f64| format!("{} ago", human_duration(s));
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|i| {
            let held = &i.stats["in_flight"];
            let health = i.health.as_ref();
            vec![
                i.kind.clone(),
                i.name.clone(),
                i.status.to_owned(),
                health.map_or("-".to_owned(), |h| h.state.to_string()),
                format!("{}/{}", i.host, i.pid),
                ago(i.heartbeat_age_seconds),
                match health {
                    Some(h) => h.last_progress_age_seconds.map_or("never".to_owned(), ago),
                    None => "-".to_owned(),
                },
                health.map_or("-".to_owned(), |h| h.errors_per_minute.to_string()),
                match held["aggregates"].as_u64() {
                    // What it held at its last beat means nothing once it stopped or went.
                    Some(n) if i.status == "up" || i.status == "late" => {
                        format!("{n} aggregate(s)")
                    }
                    _ => "-".to_owned(),
                },
            ]
        })
        .collect();
    print_table(
        &[
            "KIND",
            "NAME",
            "STATUS",
            "STATE",
            "HOST/PID",
            "HEARTBEAT",
            "PROGRESS",
            "ERRORS/MIN",
            "IN FLIGHT",
        ],
        &rows,
    );
    for i in list {
        if let Some(e) = i.health.as_ref().and_then(|h| h.last_error.as_ref()) {
            println!(
                "last error of {} {} ({}/{}), {}, {}: {}",
                i.kind,
                i.name,
                i.host,
                i.pid,
                ago(e.age_seconds),
                e.kind,
                e.message
            );
        }
    }
}

/// `seconds` as an operator reads it: `4.2 s`, `3 min 20 s`, `2 h 5 min`, `3 d 4 h`.
fn human_duration(seconds: f64) -> String {
    let s = seconds.max(0.0);
    if s < 60.0 {
        return format!("{s:.1} s");
    }
    let whole = s as u64;
    let (d, h, m, sec) = (
        whole / 86_400,
        whole / 3_600 % 24,
        whole / 60 % 60,
        whole % 60,
    );
    match (d, h) {
        (0, 0) => format!("{m} min {sec} s"),
        (0, _) => format!("{h} h {m} min"),
        _ => format!("{d} d {h} h"),
    }
}

/// `outbox cleanup`: one elected round, or rounds until SIGTERM with `--loop`.
///
/// Published rows kept by mark mode can be replayed as long as they are kept, so
/// `--published-keep-secs` counts in the replay horizon: the horizon's outbox retention is the
/// larger of it and `--outbox-retention-secs`, and the inbox keep must cover it.
pub async fn cleanup(pool: PgPool, schema: &Schema, a: CleanupArgs) -> Result<ExitCode> {
    check_privileges(&pool, schema, Component::Maintainer)
        .await
        .context("refusing to clean up")?;
    if a.batch_size < 1 {
        anyhow::bail!("invalid option `--batch-size`: must be at least 1");
    }
    let published_keep = a.published_keep_secs.map(Duration::from_secs);
    if let (Some(inbox), Some(published)) = (a.inbox_keep_secs, a.published_keep_secs)
        && inbox < published
    {
        anyhow::bail!(
            "refusing to clean up: --inbox-keep-secs {inbox} is shorter than \
             --published-keep-secs {published}: a published event replayed after its inbox \
             identity was deleted would apply twice. Keep inbox identities at least as long as \
             published events"
        );
    }
    let inbox = match (a.inbox_keep_secs, a.broker_retention_secs) {
        (Some(keep), Some(broker)) => Some(InboxRetention {
            keep: Duration::from_secs(keep),
            horizon: ReplayHorizon {
                broker_retention: Duration::from_secs(broker),
                outbox_retention: Duration::from_secs(a.outbox_retention_secs)
                    .max(published_keep.unwrap_or_default()),
                dead_letter_requeue_window: Duration::from_secs(a.dead_letter_requeue_window_secs),
            },
        }),
        (None, None) => None,
        // clap's `requires` pairs them; kept as a refusal for any other caller.
        _ => anyhow::bail!(
            "`--inbox-keep-secs` and `--broker-retention-secs` go together: the inbox keep is \
             checked against the broker's retention"
        ),
    };
    let config = MaintenanceConfig {
        inbox,
        work_items_keep: a.work_items_keep_secs.map(Duration::from_secs),
        published_keep,
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
            "deleted {} row(s): {} inbox identities, {} work items, {} published events, {} \
             expired leases",
            r.total(),
            r.inbox,
            r.work_items,
            r.published,
            r.leases
        ),
        None => println!("another instance is the maintainer right now; nothing deleted"),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::human_duration;

    #[test]
    fn durations_read_as_an_operator_reads_them() {
        assert_eq!(human_duration(-1.0), "0.0 s");
        assert_eq!(human_duration(4.25), "4.2 s");
        assert_eq!(human_duration(200.0), "3 min 20 s");
        assert_eq!(human_duration(7_500.0), "2 h 5 min");
        assert_eq!(human_duration(273_600.0), "3 d 4 h");
    }
}
