//! The HTTP endpoint of `outbox relay` and `outbox effects run` (`--metrics-addr`):
//!
//! | path | answer |
//! |---|---|
//! | `GET /metrics` | the Prometheus metrics |
//! | `GET /healthz` | `200 ok` while the process answers (a liveness probe) |
//! | `GET /readyz` | `200` when the engine runs, has worked and is not `failing`, else `503`; a JSON body with the phase (`starting`, `running`, `stopped`) and the engine's health ([`Readiness`]), without the last error's text |
//!
//! A systemd unit waits for `/readyz` before it counts the relay as started
//! (`ops/systemd/outbox-relay.service`); Kubernetes probes `/healthz` for liveness and `/readyz`
//! for readiness. A relay whose broker or database is down reads not ready, but alive: it
//! recovers by itself, so nothing should restart it for that.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use outbox::health::Readiness;

/// How often the recorder's upkeep runs (histogram buckets drained), as the exporter's own
/// listener does it.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Binds `addr`, then serves the metrics, `/healthz` and `/readyz` of `readiness` on it (see
/// the module docs) until the process exits, and describes the relay's metrics.
///
/// The endpoint has no authentication and no TLS, and its numbers (backlog, dead letters,
/// consumer names) describe the business. Loopback is the recommended address, scraped by a
/// local agent; any other address is served, with a warning, for interfaces a firewall guards.
///
/// # Errors
/// The address cannot be bound (in use, not this machine's), or a metrics recorder is already
/// installed.
pub async fn serve(addr: SocketAddr, readiness: Readiness) -> Result<()> {
    use outbox::relay::metric;
    if !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "the metrics endpoint is not on loopback: it has no authentication, so anyone who \
             reaches this interface can read it; prefer 127.0.0.1 with a local scraper"
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(metric::PUBLISH_LATENCY.to_owned()),
            &[
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ],
        )
        .context("invalid metrics buckets")?
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(metric::TAKEOVER_SECONDS.to_owned()),
            &[
                0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
            ],
        )
        .context("invalid metrics buckets")?
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_EVERY);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router(handle, readiness)).await {
            tracing::error!(error = %e, %addr, "the metrics and health endpoint stopped");
        }
    });
    describe();
    Ok(())
}

/// The endpoint's routes.
fn router(metrics: PrometheusHandle, readiness: Readiness) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let body = metrics.render();
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body) }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let report = readiness.check();
                async move {
                    let status = if report.ready {
                        StatusCode::OK
                    } else {
                        StatusCode::SERVICE_UNAVAILABLE
                    };
                    (status, axum::Json(probe_body(&report))).into_response()
                }
            }),
        )
}

/// `/readyz`'s body: the report without the last error's text. The endpoint has no
/// authentication, and an error's text is the store's or the broker's own words (a host name,
/// a role, a table); its kind and age stay. `outbox status` and the console show the text.
fn probe_body(report: &outbox::health::ReadinessReport) -> serde_json::Value {
    let mut body = serde_json::to_value(report).unwrap_or_default();
    if let Some(error) = body
        .pointer_mut("/health/last_error")
        .and_then(serde_json::Value::as_object_mut)
    {
        error.remove("message");
    }
    body
}

/// Describes the metrics the relay and the executor export.
fn describe() {
    use outbox::relay::metric;
    metrics::describe_counter!(
        metric::PUBLISHED,
        "Messages the broker durably acknowledged"
    );
    metrics::describe_counter!(metric::PUBLISH_FAILURES, "Failed publish attempts");
    metrics::describe_counter!(
        metric::DEAD_LETTERED,
        "Messages moved to the dead-letter state"
    );
    metrics::describe_counter!(
        metric::BROKER_DUPLICATES,
        "Acks in which the broker reported a duplicate event id"
    );
    metrics::describe_counter!(
        metric::LEASE_LOST,
        "Rows whose settle write was refused: lease lost"
    );
    metrics::describe_histogram!(
        metric::PUBLISH_LATENCY,
        metrics::Unit::Seconds,
        "Publish to durable ack"
    );
    metrics::describe_gauge!(metric::PENDING, "Pending outbox rows");
    metrics::describe_gauge!(
        metric::OLDEST_PENDING_AGE,
        metrics::Unit::Seconds,
        "Age of the oldest pending row"
    );
    metrics::describe_gauge!(metric::DEAD_LETTERS, "Dead letters");
    metrics::describe_gauge!(metric::RETRYING, "Pending rows that failed at least once");
    metrics::describe_histogram!(
        metric::TAKEOVER_SECONDS,
        metrics::Unit::Seconds,
        "From a taken-over aggregate's holder gone to its head published again"
    );
    {
        use outbox_postgres::session::metric as session;
        metrics::describe_gauge!(
            session::SESSION_UP,
            "1 while the relay's database session is alive and confirmed"
        );
        metrics::describe_counter!(
            session::SESSIONS_LOST,
            "The relay's database sessions that ended under it"
        );
        metrics::describe_counter!(
            session::LEASES_ORPHANED,
            "Leases this relay's sweeps expired because their owner's session had ended"
        );
    }
}
