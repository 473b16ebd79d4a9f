//! The Prometheus endpoint of `outbox relay` and `outbox effects run`.

use std::net::SocketAddr;

use anyhow::{Context, Result};

/// Serves Prometheus metrics on `addr` and describes the relay's metrics.
///
/// The endpoint has no authentication and no TLS, and its numbers (backlog, dead letters,
/// consumer names) describe the business. Loopback is the recommended address, scraped by a
/// local agent; any other address is served, with a warning, for interfaces a firewall guards.
pub fn install(addr: SocketAddr) -> Result<()> {
    use outbox::relay::metric;
    if !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "the metrics endpoint is not on loopback: it has no authentication, so anyone who \
             reaches this interface can read it; prefer 127.0.0.1 with a local scraper"
        );
    }
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
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
        .install()
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
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
    Ok(())
}
