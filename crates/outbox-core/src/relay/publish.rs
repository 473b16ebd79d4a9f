//! Publishing one batch: each aggregate's run strictly in version order, different aggregates
//! concurrently, no publish started once the batch's ownership could end, and the failure policy
//! (retry with backoff, or dead letter) decided per failed row.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use tracing::info;

use super::feed::{FailedRow, Settlement};
use super::{RelayConfig, metric};
use crate::crash;
use crate::message::OutboxMessage;
use crate::store::Liveness;
use crate::transport::{PublishError, PublishErrorKind, PublishReceipt, Transport};

enum Outcome {
    Published,
    Failed(PublishError),
    NotAttempted,
}

/// When a publish of a batch may still start: before the last moment its ownership leaves
/// room for a whole publish, and while the session the ownership is tied to allows it.
#[derive(Debug, Clone, Default)]
pub(super) struct StartGate {
    /// The last moment a publish may begin (`None`: no limit).
    pub last_start: Option<Instant>,
    /// The owner's session ([`Liveness`]; `None`: not tied to one).
    pub liveness: Option<Arc<Liveness>>,
}

impl StartGate {
    /// Whether a publish may start now.
    fn open(&self) -> bool {
        let now = Instant::now();
        self.last_start.is_none_or(|t| now < t)
            && self.liveness.as_ref().is_none_or(|l| l.may_start(now))
    }
}

/// Publishes `messages` (sorted by aggregate, then version) and says what happened to each row.
/// A publish starts only while `gate` is open.
pub(super) async fn publish_batch<T: Transport>(
    transport: &T,
    config: &RelayConfig,
    messages: &[OutboxMessage],
    gate: &StartGate,
) -> Settlement {
    let results: Vec<Vec<(i64, Outcome)>> = futures::stream::iter(split_runs(messages))
        .map(|run| publish_run(transport, config, &messages[run], gate))
        .buffer_unordered(config.max_in_flight)
        .collect()
        .await;
    let attempts: HashMap<i64, i32> = messages.iter().map(|m| (m.id, m.attempts)).collect();
    let mut settlement = Settlement::default();
    for (id, outcome) in results.into_iter().flatten() {
        match outcome {
            Outcome::Published => settlement.published.push(id),
            Outcome::NotAttempted => settlement.not_attempted.push(id),
            Outcome::Failed(err) => {
                let attempts = attempts.get(&id).copied().unwrap_or(0) + 1;
                let dead = !err.is_retryable() || attempts >= config.max_attempts;
                settlement.failed.push(FailedRow {
                    id,
                    error: format!("attempt {attempts}: {err}"),
                    retry_after: (!dead).then(|| config.backoff.delay(attempts)),
                });
            }
        }
    }
    settlement
}

/// Publishes one aggregate's run in order; stops at the first failure or when the ownership
/// leaves no time for another publish. On a transport with ordered pipelining the whole run is
/// handed over at once ([`Transport::publish_run`]) and every message of it is cut at one
/// `publish_timeout` from that moment; otherwise each message waits for the previous one's
/// acknowledgement and is cut at its own `publish_timeout`. Either way every publish starts
/// while `gate` is open, so it ends before the ownership's clock can.
async fn publish_run<T: Transport>(
    transport: &T,
    config: &RelayConfig,
    run: &[OutboxMessage],
    gate: &StartGate,
) -> Vec<(i64, Outcome)> {
    if transport.ordered_pipelining() {
        return publish_run_pipelined(transport, config, run, gate).await;
    }
    let mut out = Vec::with_capacity(run.len());
    let mut stopped = false;
    for msg in run {
        if stopped || !gate.open() {
            stopped = true;
            out.push((msg.id, Outcome::NotAttempted));
            continue;
        }
        crash::hit_keyed(crash::RELAY_BEFORE_PUBLISH, &msg.event_id);
        let sent = Instant::now();
        let result =
            match tokio::time::timeout(config.publish_timeout, transport.publish(msg)).await {
                Ok(r) => r,
                Err(_) => Err(timed_out(config)),
            };
        let outcome = account(transport.name(), msg, sent, result);
        stopped = matches!(outcome, Outcome::Failed(_));
        out.push((msg.id, outcome));
    }
    out
}

/// [`publish_run`] on a transport with ordered pipelining.
async fn publish_run_pipelined<T: Transport>(
    transport: &T,
    config: &RelayConfig,
    run: &[OutboxMessage],
    gate: &StartGate,
) -> Vec<(i64, Outcome)> {
    if !gate.open() {
        return run.iter().map(|m| (m.id, Outcome::NotAttempted)).collect();
    }
    for msg in run {
        crash::hit_keyed(crash::RELAY_BEFORE_PUBLISH, &msg.event_id);
    }
    let sent = Instant::now();
    let deadline = tokio::time::Instant::from_std(sent + config.publish_timeout);
    let mut results = std::pin::pin!(transport.publish_run(run));
    let mut out = Vec::with_capacity(run.len());
    let mut stopped = false;
    for msg in run {
        if stopped {
            out.push((msg.id, Outcome::NotAttempted));
            continue;
        }
        let result = match tokio::time::timeout_at(deadline, results.next()).await {
            Ok(Some(r)) => r,
            // The transport took only part of the run: the rest was not published.
            Ok(None) => {
                stopped = true;
                out.push((msg.id, Outcome::NotAttempted));
                continue;
            }
            Err(_) => Err(timed_out(config)),
        };
        let outcome = account(transport.name(), msg, sent, result);
        stopped = matches!(outcome, Outcome::Failed(_));
        out.push((msg.id, outcome));
    }
    out
}

fn timed_out(config: &RelayConfig) -> PublishError {
    PublishError::new(
        PublishErrorKind::TimedOut,
        format!("no acknowledgement within {:?}", config.publish_timeout),
    )
}

/// Metrics, the crash point and the outcome of one message's publish result.
fn account(
    name: &'static str,
    msg: &OutboxMessage,
    sent: Instant,
    result: Result<PublishReceipt, PublishError>,
) -> Outcome {
    match result {
        Ok(receipt) => {
            metrics::histogram!(metric::PUBLISH_LATENCY, "transport" => name)
                .record(sent.elapsed().as_secs_f64());
            metrics::counter!(metric::PUBLISHED, "transport" => name).increment(1);
            if receipt.duplicate {
                metrics::counter!(metric::BROKER_DUPLICATES, "transport" => name).increment(1);
                info!(event_id = %msg.event_id, "broker reported a duplicate of an earlier publish");
            }
            crash::hit(crash::RELAY_AFTER_PUBLISH);
            Outcome::Published
        }
        Err(e) => {
            metrics::counter!(
                metric::PUBLISH_FAILURES,
                "transport" => name,
                "kind" => format!("{:?}", e.kind)
            )
            .increment(1);
            Outcome::Failed(e)
        }
    }
}

/// Splits a batch (sorted by aggregate, then version) into per-aggregate runs, as index ranges.
pub(super) fn split_runs(messages: &[OutboxMessage]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=messages.len() {
        let boundary = i == messages.len()
            || messages[i].aggregate_type != messages[start].aggregate_type
            || messages[i].aggregate_id != messages[start].aggregate_id;
        if boundary {
            runs.push(start..i);
            start = i;
        }
    }
    runs
}
