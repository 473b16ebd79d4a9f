//! What a settled batch tells the relay's [`Health`]: its dead letters, lost leases and failed
//! publishes (one record per kind and batch, with the count and the first row's error), then
//! its progress.

use super::feed::{SettleReport, Settlement};
use crate::health::{Health, TroubleKind};

/// Records one settled batch. Errors first, progress last: a batch where some rows went out
/// leaves the relay `degraded`, not `failing`.
pub(super) fn record(health: &Health, settlement: &Settlement, report: &SettleReport) {
    health.succeeded(TroubleKind::Settle);
    let first = |dead: bool| {
        settlement
            .failed
            .iter()
            .find(|f| f.retry_after.is_none() == dead)
            .map(|f| f.error.as_str())
    };
    if let Some(error) = first(true) {
        health.failed(TroubleKind::DeadLetter, report.dead_lettered as u64, &error);
    }
    if report.lease_lost > 0 {
        health.failed(
            TroubleKind::LeaseLost,
            report.lease_lost as u64,
            &format_args!(
                "lease lost before settling {} row(s): another relay took them over and \
                 publishes them",
                report.lease_lost
            ),
        );
    }
    // Every failed publish counts, whether or not its failure record was written.
    let retried = settlement
        .failed
        .iter()
        .filter(|f| f.retry_after.is_some())
        .count();
    if let Some(error) = first(false) {
        health.failed(TroubleKind::Publish, retried as u64, &error);
    }
    if report.marked + report.dead_lettered > 0 {
        health.progressed();
    }
}
