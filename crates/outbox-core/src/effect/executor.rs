//! [`Executor`] and its values: the contract is in [`Executor`]'s docs (this module is private).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::store::{
    ClaimPurpose, ClaimedWorkItem, EffectsStats, WorkItemClaimParams, WorkItemRecordParams,
    WorkItemState, WorkItemStore, WorkItemUpdate,
};
use super::{CallOutcome, LookupOutcome, RemoteEffect};
use crate::backoff::Backoff;
use crate::crash;
use crate::error::{ConfigError, StoreError};

/// The minimum slack [`ExecutorConfig::lease`] must leave after the longest wait for a call.
pub const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// The last error of an item whose executor lease expired before the call was recorded.
pub const LEASE_EXPIRED_REASON: &str = "executor lease expired: outcome unknown";
/// The last error of an item the provider has no record of while resend is disabled.
pub const PARKED_REASON: &str = "provider has no record; resend disabled: resolve by hand";

/// Metric names. Every metric carries the label `kind`.
pub mod metric {
    /// Gauge: items in `unknown` (the reconciliation backlog).
    pub const UNKNOWN: &str = "outbox_effects_unknown";
    /// Gauge: age in seconds of the oldest `unknown` item (0 when there is none).
    pub const OLDEST_UNKNOWN_AGE: &str = "outbox_effects_oldest_unknown_age_seconds";
    /// Gauge: items in `pending`.
    pub const PENDING: &str = "outbox_effects_pending";
    /// Gauge: items in `in_progress`.
    pub const IN_PROGRESS: &str = "outbox_effects_in_progress";
    /// Counter: provider calls, label `outcome` = `succeeded` | `failed` | `not_sent` |
    /// `unknown` (a timeout counts as `unknown`).
    pub const CALLS: &str = "outbox_effects_calls_total";
    /// Counter: lookups of unknown items, label `result` = `succeeded` | `failed` | `resent` |
    /// `parked` | `unknown`.
    pub const RECONCILED: &str = "outbox_effects_reconciled_total";
    /// Counter: records refused because the executor's lease was lost.
    pub const LEASE_LOST: &str = "outbox_effects_lease_lost_total";
    /// Counter: enqueues refused because the key exists with a different payload.
    pub const KEY_CONFLICTS: &str = "outbox_effects_key_conflicts_total";
}

/// Settings of an [`Executor`]. Build with [`ExecutorConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// The kind of work items this executor serves.
    pub kind: String,
    /// Items claimed per pass (calls and lookups each). Default 16.
    pub batch_size: usize,
    /// Calls (or lookups) in flight at once within a batch. Default 8.
    pub concurrency: usize,
    /// How long a claim (or a lookup lease) lasts. It must cover the slowest call of a batch:
    /// `ceil(batch_size / concurrency) * call_timeout` plus [`LEASE_MARGIN`]. Default 30 s.
    pub lease: Duration,
    /// Timeout of one provider call or lookup; a timed-out call is `Unknown`. Default 10 s.
    pub call_timeout: Duration,
    /// Sleep between passes that found nothing to do. Default 200 ms.
    pub poll_interval: Duration,
    /// Minimum age of an `unknown` item before its first lookup, so that a request still in
    /// flight at the provider can land. Default 2 s.
    pub reconcile_after: Duration,
    /// Delay between lookups that answered `Unknown`: exponential from 1 s to 60 s (with
    /// jitter). A parked item is looked up again every `lookup_backoff.max`.
    pub lookup_backoff: Backoff,
    /// Delay before calling again after `NotSent`: exponential from 1 s to 60 s (with jitter).
    pub retry_backoff: Backoff,
    /// After this many attempts, a `NotSent` answer makes the item `failed`. Default 20.
    pub max_not_sent_attempts: i32,
    /// What a lookup answering `NotFound` leads to. `true` (default): the item goes back to
    /// `pending` and is called again **with the same key**. Safe only if the provider
    /// deduplicates by idempotency key (or a `NotFound` is authoritative): a provider that
    /// answers `NotFound` for a request it is still processing would otherwise act twice.
    /// `false`: the item stays `unknown` with the last error [`PARKED_REASON`] for an operator.
    pub resend_when_not_found: bool,
    /// How often the gauges are refreshed when nothing changes. Default 5 s.
    pub stats_interval: Duration,
}

impl ExecutorConfig {
    /// The defaults for `kind`.
    pub fn new(kind: impl Into<String>) -> Self {
        let backoff = Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        };
        Self {
            kind: kind.into(),
            batch_size: 16,
            concurrency: 8,
            lease: Duration::from_secs(30),
            call_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_millis(200),
            reconcile_after: Duration::from_secs(2),
            lookup_backoff: backoff,
            retry_backoff: backoff,
            max_not_sent_attempts: 20,
            resend_when_not_found: true,
            stats_interval: Duration::from_secs(5),
        }
    }

    /// Checks every value.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad field: an empty kind, a zero size, count or
    /// duration, a backoff whose `max` is below its `base`, or a `lease` that does not exceed
    /// `ceil(batch_size / concurrency) * call_timeout + LEASE_MARGIN` (claimed items wait for a
    /// free call slot under their lease).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key, reason: &str| Err(ConfigError::new(key, reason));
        if self.kind.is_empty() || self.kind.len() > 255 {
            return bad("kind", "must be 1 to 255 bytes");
        }
        if self.batch_size == 0 || self.batch_size > 10_000 {
            return bad("batch_size", "must be 1 to 10000");
        }
        if self.concurrency == 0 {
            return bad("concurrency", "must be greater than 0");
        }
        for (key, d) in [
            ("call_timeout", self.call_timeout),
            ("poll_interval", self.poll_interval),
            ("reconcile_after", self.reconcile_after),
            ("stats_interval", self.stats_interval),
        ] {
            if d.is_zero() {
                return bad(key, "must be greater than 0");
            }
        }
        for (key, b) in [
            ("lookup_backoff", &self.lookup_backoff),
            ("retry_backoff", &self.retry_backoff),
        ] {
            if !b.is_valid() {
                return bad(key, "base must be > 0 and max >= base");
            }
        }
        if self.max_not_sent_attempts < 1 {
            return bad("max_not_sent_attempts", "must be at least 1");
        }
        let waves = self.batch_size.div_ceil(self.concurrency) as u32;
        let needed = self
            .call_timeout
            .checked_mul(waves)
            .and_then(|d| d.checked_add(LEASE_MARGIN));
        match needed {
            Some(needed) if self.lease > needed => Ok(()),
            _ => Err(ConfigError::new(
                "lease",
                format!(
                    "{:?} must exceed ceil(batch_size / concurrency) * call_timeout + {:?} = \
                     {waves} * {:?} + {:?}",
                    self.lease, LEASE_MARGIN, self.call_timeout, LEASE_MARGIN
                ),
            )),
        }
    }
}

/// What one [`Executor::run_once`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickReport {
    /// `in_progress` items with an expired lease moved to `unknown`.
    pub expired: usize,
    /// Items claimed and called.
    pub called: usize,
    /// Calls answered `Succeeded`.
    pub succeeded: usize,
    /// Calls answered `Failed` (or `NotSent` past the limit).
    pub failed: usize,
    /// Calls answered `NotSent` and scheduled again.
    pub not_sent: usize,
    /// Calls answered `Unknown` or timed out.
    pub unknown: usize,
    /// Unknown items looked up.
    pub looked_up: usize,
    /// Lookups that found the effect done.
    pub reconciled_succeeded: usize,
    /// Lookups that found the effect refused.
    pub reconciled_failed: usize,
    /// Lookups answered `NotFound` that sent the item back to `pending`.
    pub resent: usize,
    /// Lookups answered `NotFound` that parked the item (resend disabled).
    pub parked: usize,
    /// Lookups without an answer.
    pub still_unknown: usize,
    /// Results not recorded because the lease was lost.
    pub lease_lost: usize,
    /// Results not recorded because of a database error (the lease expiry settles them).
    pub record_errors: usize,
}

impl TickReport {
    /// Whether the pass changed any item.
    pub fn changed(&self) -> bool {
        self.expired + self.called + self.looked_up > 0
    }
}

/// What happened to one claimed item.
enum Settled {
    Recorded(&'static str),
    LeaseLost,
    Error,
}

/// Claims work items of one kind, calls the provider, records the answers, and reconciles
/// unknown outcomes. Several executors (in one or many processes) may serve the same kind;
/// they coordinate through the store's claims and leases.
///
/// The remote-effect executor: claims work items under a lease, calls the provider, records the
/// answers fenced by the lease, and reconciles unknown outcomes by lookup. Written once against
/// [`WorkItemStore`] and [`RemoteEffect`].
///
/// # The path of one effect
///
/// 1. **Enqueue** (store crate, e.g. `outbox_postgres::PgEffects::enqueue`) in the consumer's own
///    inbox transaction: one work item with a stable idempotency key, so a rolled-back consumer
///    leaves no item and a redelivered event maps to the same key.
/// 2. **Claim**: the executor takes due `pending` items of its kind, sets them `in_progress`
///    with `attempts + 1`, a fresh lease token and `lease_until = now() + lease`.
/// 3. **Call** the provider under `call_timeout`; a timeout is [`CallOutcome::Unknown`]. Calls of
///    one batch run concurrently (up to `concurrency`); each item is recorded as soon as its own
///    call returns.
/// 4. **Record**, fenced by the lease token and the claimed state: `Succeeded` → `succeeded`
///    with the provider's reference; `Failed` → `failed`; `NotSent` → back to `pending` with
///    `retry_backoff` (or `failed` once `attempts` reaches `max_not_sent_attempts`); `Unknown` →
///    `unknown`, to be looked up after `reconcile_after`. A record that changes nothing means the
///    lease was lost: it is logged, counted ([`metric::LEASE_LOST`]) and changes nothing.
/// 5. **Expired leases**: an item still `in_progress` after its lease belongs to an executor
///    that died (or stalled) between claim and record, possibly *after* the provider acted. It
///    goes to `unknown`, never back to `pending`: a blind retry could pay twice.
/// 6. **Reconciliation**: due `unknown` items are leased (state stays `unknown`) and looked up by
///    key: `Succeeded` / `Failed` settle the item; `NotFound` sends it back to `pending` for a new
///    call **with the same key** when [`ExecutorConfig::resend_when_not_found`] is set, or parks
///    it in `unknown` for an operator otherwise; `Unknown` asks again later (`lookup_backoff`).
///
/// # Guarantees and their limits
///
/// * An item whose outcome is not known is never called again without a lookup first. A second
///   call happens only after the provider said it has no record of the key (and resend is on),
///   after a provable `NotSent`, or by an operator's resend; every call carries the same key.
/// * Exactly one remote effect is **not** promised (G10): it holds when the provider honours the
///   idempotency key or answers lookups truthfully.
/// * A database outage loses nothing: errors are logged, the executor backs off and carries on.
///   A call whose result could not be recorded leaves the item `in_progress` until its lease
///   expires, and then it is `unknown`.
///
/// Crash points: [`crash::EFFECTS_AFTER_CALL`] and [`crash::EFFECTS_AFTER_RECORD`].
pub struct Executor<S, P> {
    store: Arc<S>,
    provider: P,
    config: ExecutorConfig,
}

impl<S, P> std::fmt::Debug for Executor<S, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<S: WorkItemStore, P: RemoteEffect> Executor<S, P> {
    /// An executor for `config.kind` over `store`.
    ///
    /// # Errors
    /// [`ConfigError`] from [`ExecutorConfig::validate`].
    pub fn new(
        store: impl Into<Arc<S>>,
        provider: P,
        config: ExecutorConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            store: store.into(),
            provider,
            config,
        })
    }

    /// The settings.
    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    /// The provider.
    pub fn provider(&self) -> &P {
        &self.provider
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// One pass: expired leases to `unknown`, then one batch of calls (claimed, called
    /// concurrently, each recorded as soon as it returns), then one batch of lookups. Used by
    /// [`Executor::run`], and by tests.
    ///
    /// # Errors
    /// [`StoreError`] when the expiry sweep or a claim fails. A failed *record* is not an error
    /// of the pass: it is logged and counted in [`TickReport::record_errors`], and the item's
    /// lease expiry makes it `unknown`.
    pub async fn run_once(&self) -> Result<TickReport, StoreError> {
        let expired = self
            .store
            .work_item_expire(
                &self.config.kind,
                self.config.reconcile_after,
                LEASE_EXPIRED_REASON,
            )
            .await?;
        for id in &expired {
            warn!(kind = %self.config.kind, id, "work item lease expired before its result was recorded; outcome unknown");
        }
        let mut report = TickReport {
            expired: expired.len(),
            ..TickReport::default()
        };
        self.call_pass(&mut report).await?;
        self.reconcile_pass(&mut report).await?;
        Ok(report)
    }

    /// Reads the open backlog of this kind and sets the gauges of [`metric`].
    ///
    /// # Errors
    /// [`StoreError`].
    pub async fn publish_stats(&self) -> Result<EffectsStats, StoreError> {
        let stats = self
            .store
            .work_item_backlog(Some(&self.config.kind))
            .await?;
        let kind = self.config.kind.clone();
        metrics::gauge!(metric::UNKNOWN, "kind" => kind.clone()).set(stats.unknown as f64);
        metrics::gauge!(metric::OLDEST_UNKNOWN_AGE, "kind" => kind.clone())
            .set(stats.oldest_unknown_age.map_or(0.0, |d| d.as_secs_f64()));
        metrics::gauge!(metric::PENDING, "kind" => kind.clone()).set(stats.pending as f64);
        metrics::gauge!(metric::IN_PROGRESS, "kind" => kind).set(stats.in_progress as f64);
        Ok(stats)
    }

    /// Runs passes until `shutdown` is cancelled. A pass in progress is finished first (its
    /// calls are answered or time out, and are recorded), so no item is left `in_progress` by
    /// a clean shutdown. Database errors are logged and waited out with a growing delay (from
    /// `poll_interval` up to 30 s); nothing is lost meanwhile. Gauges are refreshed every
    /// `stats_interval`, and after a pass that changed something (at most once per
    /// `poll_interval`).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let outage = Backoff {
            base: self.config.poll_interval,
            max: Duration::from_secs(30).max(self.config.poll_interval),
        };
        let mut last_stats: Option<Instant> = None;
        let mut failures = 0;
        while !shutdown.is_cancelled() {
            let wait = match self.run_once().await {
                Ok(report) => {
                    failures = 0;
                    let since = last_stats.map(|t| t.elapsed());
                    let due = since.is_none_or(|s| {
                        s >= self.config.stats_interval
                            || (report.changed() && s >= self.config.poll_interval)
                    });
                    if due {
                        match self.publish_stats().await {
                            Ok(_) => last_stats = Some(Instant::now()),
                            Err(e) => warn!(kind = %self.config.kind, error = %e,
                                "could not refresh work-item gauges"),
                        }
                    }
                    let full = report.called >= self.config.batch_size
                        || report.looked_up >= self.config.batch_size;
                    if full {
                        Duration::ZERO
                    } else {
                        self.config.poll_interval
                    }
                }
                Err(e) => {
                    failures += 1;
                    let wait = outage.delay(failures);
                    warn!(kind = %self.config.kind, error = %e, ?wait,
                        "effects executor error; retrying");
                    wait
                }
            };
            if wait.is_zero() {
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => break,
            }
        }
    }

    async fn claim(&self, purpose: ClaimPurpose) -> Result<Vec<ClaimedWorkItem>, StoreError> {
        self.store
            .work_item_claim(WorkItemClaimParams {
                kind: &self.config.kind,
                purpose,
                limit: self.config.batch_size,
                lease: self.config.lease,
            })
            .await
    }

    /// The fenced write of a result; `Settled::LeaseLost` when it changed nothing.
    async fn write(
        &self,
        c: &ClaimedWorkItem,
        claimed_in: WorkItemState,
        update: WorkItemUpdate,
        lookups_add: i32,
    ) -> Settled {
        let res = self
            .store
            .work_item_record(WorkItemRecordParams {
                id: c.item.id,
                token: c.token,
                claimed_in,
                update: &update,
                lookups_add,
            })
            .await;
        match res {
            Ok(true) => Settled::Recorded(""),
            Ok(false) => {
                metrics::counter!(metric::LEASE_LOST, "kind" => self.config.kind.clone())
                    .increment(1);
                warn!(kind = %self.config.kind, id = c.item.id, token = c.token.0,
                    "work-item lease lost before the result was recorded; result dropped");
                Settled::LeaseLost
            }
            Err(e) => {
                warn!(kind = %self.config.kind, id = c.item.id, error = %e,
                    "could not record a work-item result; the lease expiry will make it unknown");
                Settled::Error
            }
        }
    }

    async fn call_pass(&self, report: &mut TickReport) -> Result<(), StoreError> {
        let claimed = self.claim(ClaimPurpose::Call).await?;
        report.called = claimed.len();
        let settled: Vec<Settled> = futures::stream::iter(claimed)
            .map(|c| self.call_one(c))
            .buffer_unordered(self.config.concurrency)
            .collect()
            .await;
        for s in settled {
            match s {
                Settled::Recorded("succeeded") => report.succeeded += 1,
                Settled::Recorded("failed") => report.failed += 1,
                Settled::Recorded("not_sent") => report.not_sent += 1,
                Settled::Recorded(_) => report.unknown += 1,
                Settled::LeaseLost => report.lease_lost += 1,
                Settled::Error => report.record_errors += 1,
            }
        }
        Ok(())
    }

    async fn call_one(&self, c: ClaimedWorkItem) -> Settled {
        let timeout = self.config.call_timeout;
        let outcome = match tokio::time::timeout(timeout, self.provider.call(&c.item)).await {
            Ok(outcome) => outcome,
            Err(_) => CallOutcome::Unknown {
                reason: format!("call timed out after {timeout:?}"),
            },
        };
        crash::hit(crash::EFFECTS_AFTER_CALL);
        let (outcome_label, label, update) = match outcome {
            CallOutcome::Succeeded { reference } => (
                "succeeded",
                "succeeded",
                WorkItemUpdate::Succeeded { reference },
            ),
            CallOutcome::Failed { reason } => {
                ("failed", "failed", WorkItemUpdate::Failed { reason })
            }
            CallOutcome::NotSent { reason }
                if c.item.attempts >= self.config.max_not_sent_attempts =>
            {
                (
                    "not_sent",
                    "failed",
                    WorkItemUpdate::Failed {
                        reason: format!(
                            "not sent after {} attempts, giving up: {reason}",
                            c.item.attempts
                        ),
                    },
                )
            }
            CallOutcome::NotSent { reason } => (
                "not_sent",
                "not_sent",
                WorkItemUpdate::Pending {
                    reason: format!("not sent: {reason}"),
                    delay: self.config.retry_backoff.delay(c.item.attempts),
                },
            ),
            CallOutcome::Unknown { reason } => (
                "unknown",
                "unknown",
                WorkItemUpdate::Unknown {
                    reason,
                    delay: self.config.reconcile_after,
                },
            ),
        };
        metrics::counter!(metric::CALLS, "kind" => self.config.kind.clone(), "outcome" => outcome_label)
            .increment(1);
        debug!(kind = %self.config.kind, id = c.item.id, outcome = label, "work item called");
        let settled = match self.write(&c, WorkItemState::InProgress, update, 0).await {
            Settled::Recorded(_) => Settled::Recorded(label),
            other => other,
        };
        crash::hit(crash::EFFECTS_AFTER_RECORD);
        settled
    }

    async fn reconcile_pass(&self, report: &mut TickReport) -> Result<(), StoreError> {
        let claimed = self.claim(ClaimPurpose::Lookup).await?;
        report.looked_up = claimed.len();
        let settled: Vec<Settled> = futures::stream::iter(claimed)
            .map(|c| self.lookup_one(c))
            .buffer_unordered(self.config.concurrency)
            .collect()
            .await;
        for s in settled {
            match s {
                Settled::Recorded("succeeded") => report.reconciled_succeeded += 1,
                Settled::Recorded("failed") => report.reconciled_failed += 1,
                Settled::Recorded("resent") => report.resent += 1,
                Settled::Recorded("parked") => report.parked += 1,
                Settled::Recorded(_) => report.still_unknown += 1,
                Settled::LeaseLost => report.lease_lost += 1,
                Settled::Error => report.record_errors += 1,
            }
        }
        Ok(())
    }

    async fn lookup_one(&self, c: ClaimedWorkItem) -> Settled {
        let timeout = self.config.call_timeout;
        let outcome = match tokio::time::timeout(timeout, self.provider.lookup(&c.item)).await {
            Ok(outcome) => outcome,
            Err(_) => LookupOutcome::Unknown {
                reason: format!("lookup timed out after {timeout:?}"),
            },
        };
        let (label, update) = match outcome {
            LookupOutcome::Succeeded { reference } => {
                ("succeeded", WorkItemUpdate::Succeeded { reference })
            }
            LookupOutcome::Failed { reason } => ("failed", WorkItemUpdate::Failed { reason }),
            LookupOutcome::NotFound if self.config.resend_when_not_found => (
                "resent",
                WorkItemUpdate::Pending {
                    reason: "provider has no record; calling again with the same key".to_owned(),
                    delay: Duration::ZERO,
                },
            ),
            LookupOutcome::NotFound => (
                "parked",
                WorkItemUpdate::Unknown {
                    reason: PARKED_REASON.to_owned(),
                    delay: self.config.lookup_backoff.max,
                },
            ),
            LookupOutcome::Unknown { reason } => (
                "unknown",
                WorkItemUpdate::Unknown {
                    reason: format!("lookup: {reason}"),
                    delay: self.config.lookup_backoff.delay(c.lookups + 1),
                },
            ),
        };
        metrics::counter!(metric::RECONCILED, "kind" => self.config.kind.clone(), "result" => label)
            .increment(1);
        if label == "parked" {
            warn!(kind = %self.config.kind, id = c.item.id, key = %c.item.idempotency_key,
                "work item parked: {PARKED_REASON}");
        }
        match self.write(&c, WorkItemState::Unknown, update, 1).await {
            Settled::Recorded(_) => Settled::Recorded(label),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fast() -> ExecutorConfig {
        ExecutorConfig {
            call_timeout: Duration::from_secs(1),
            ..ExecutorConfig::new("payout")
        }
    }

    #[test]
    fn config_errors_name_the_key() {
        assert!(
            ExecutorConfig::new("payout").validate().is_ok(),
            "defaults are valid"
        );
        let cases: Vec<(&str, ExecutorConfig)> = vec![
            ("kind", ExecutorConfig::new("")),
            (
                "batch_size",
                ExecutorConfig {
                    batch_size: 0,
                    ..fast()
                },
            ),
            (
                "concurrency",
                ExecutorConfig {
                    concurrency: 0,
                    ..fast()
                },
            ),
            (
                "call_timeout",
                ExecutorConfig {
                    call_timeout: Duration::ZERO,
                    ..fast()
                },
            ),
            (
                "lease",
                ExecutorConfig {
                    lease: Duration::from_secs(10),
                    call_timeout: Duration::from_secs(10),
                    ..ExecutorConfig::new("payout")
                },
            ),
            (
                // 16 items, 1 at a time: the last one waits 15 calls under its lease.
                "lease",
                ExecutorConfig {
                    concurrency: 1,
                    ..ExecutorConfig::new("payout")
                },
            ),
            (
                "retry_backoff",
                ExecutorConfig {
                    retry_backoff: Backoff {
                        base: Duration::from_secs(2),
                        max: Duration::from_secs(1),
                    },
                    ..fast()
                },
            ),
            (
                "max_not_sent_attempts",
                ExecutorConfig {
                    max_not_sent_attempts: 0,
                    ..fast()
                },
            ),
        ];
        for (expected, cfg) in cases {
            let e = cfg.validate().expect_err(expected);
            assert_eq!(e.key, expected, "{e}");
            assert!(e.to_string().contains(expected), "{e}");
        }
    }
}
