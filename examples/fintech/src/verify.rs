//! The end state of a run, read from where each part keeps it (the payments database, the
//! reporting database, the provider), and the verification table.

use std::collections::HashMap;

use anyhow::{Context, Result};
use outbox::operator::Overview;
use outbox::operator::prelude::*;
use outbox::postgres::{PgEffects, PgStore};
use sqlx::PgPool;
use support::http_client::HttpClient;
use support::table::Check;
use support::table::{at_least, eq};

use crate::load::LoadReport;
use crate::topology::CAPTURE_KIND;

/// Everything counted at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Payments rows.
    pub payments: i64,
    /// Payments rows with status captured.
    pub payments_captured: i64,
    /// Captured payments: id → amount.
    pub captured_amounts: HashMap<String, i64>,
    /// Report rows.
    pub report_rows: i64,
    /// Report rows with status captured.
    pub report_captured: i64,
    /// Report rows whose event count is not their status's (1 created, 2 captured).
    pub report_wrong_events: i64,
    /// The payments database's outbox, inbox and work items.
    pub payments_db: Overview,
    /// The reporting database's inbox.
    pub reporting_db: Overview,
    /// Capture work items succeeded.
    pub items_succeeded: i64,
    /// Capture work items not settled: pending, in progress, unknown or failed.
    pub items_open: i64,
    /// Of those, unknown (waiting for reconciliation).
    pub items_unknown: i64,
    /// Work items whose outcome was settled by asking the provider (lookups > 0).
    pub items_reconciled: i64,
    /// Payouts at the provider per reference (the payment id); empty in a quick snapshot.
    pub provider: HashMap<String, Vec<i64>>,
    /// Payouts at the provider, all references.
    pub provider_payouts: i64,
}

impl Snapshot {
    /// Reads the databases and the provider. `full`: also every captured payment, every work
    /// item and the provider's payout list (for the table); otherwise counts only (for the
    /// progress of the drain, cheap enough to repeat).
    ///
    /// # Errors
    /// A database or the provider cannot be read.
    pub async fn take(
        payments: &PgPool,
        reporting: &PgPool,
        http: &HttpClient,
        provider_url: &str,
        full: bool,
    ) -> Result<Self> {
        let (total, captured): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE status = 'captured') FROM payments",
        )
        .fetch_one(payments)
        .await?;
        let captured_amounts: HashMap<String, i64> = if full {
            sqlx::query_as("SELECT id, amount FROM payments WHERE status = 'captured'")
                .fetch_all(payments)
                .await?
                .into_iter()
                .collect()
        } else {
            HashMap::new()
        };
        let (report_rows, report_captured, report_wrong_events): (i64, i64, i64) = sqlx::query_as(
            "SELECT count(*), count(*) FILTER (WHERE status = 'captured'), \
             count(*) FILTER (WHERE events <> CASE status WHEN 'captured' THEN 2 ELSE 1 END) \
             FROM payment_report",
        )
        .fetch_one(reporting)
        .await?;
        let schema = crate::db::schema();
        let payments_db = PgStore::with_schema(payments.clone(), schema.clone())
            .overview()
            .await
            .context("cannot read the payments database's overview")?;
        let reporting_db = PgStore::with_schema(reporting.clone(), schema.clone())
            .overview()
            .await
            .context("cannot read the reporting database's overview")?;
        let effects = PgEffects::new(schema);
        let stats = effects.stats(payments, Some(CAPTURE_KIND)).await?;
        let mut items_reconciled = 0;
        let mut provider: HashMap<String, Vec<i64>> = HashMap::new();
        let provider_payouts;
        if full {
            let items = effects.list(payments, None, i64::from(i32::MAX)).await?;
            items_reconciled = items.iter().filter(|w| w.lookups > 0).count() as i64;
            let payouts = http
                .get_json(&format!("{provider_url}/payouts"))
                .await
                .context("cannot list the provider's payouts")?;
            for p in payouts.as_array().into_iter().flatten() {
                let reference = p["reference"].as_str().unwrap_or_default().to_owned();
                provider
                    .entry(reference)
                    .or_default()
                    .push(p["amount"].as_i64().unwrap_or(0));
            }
            provider_payouts = provider.values().map(|v| v.len() as i64).sum();
        } else {
            // The stand-in provider's counter (its admin endpoint).
            let stats = http
                .get_json(&format!("{provider_url}/admin/stats"))
                .await
                .context("cannot read the provider's stats")?;
            provider_payouts = stats["payouts"].as_i64().unwrap_or(0);
        }
        Ok(Self {
            payments: total,
            payments_captured: captured,
            captured_amounts,
            report_rows,
            report_captured,
            report_wrong_events,
            payments_db,
            reporting_db,
            items_succeeded: stats.succeeded,
            items_open: stats.pending + stats.in_progress + stats.unknown + stats.failed,
            items_unknown: stats.unknown,
            items_reconciled,
            provider,
            provider_payouts,
        })
    }

    /// Distinct references captured at the provider.
    pub fn provider_captures(&self) -> i64 {
        self.provider.len() as i64
    }

    /// What is still in flight, one phrase each; empty when everything drained.
    pub fn pending(&self) -> Vec<String> {
        let mut out = Vec::new();
        let o = &self.payments_db;
        if o.pending > 0 {
            out.push(format!("{} outbox rows not yet published", o.pending));
        }
        if self.report_rows < self.payments {
            out.push(format!(
                "reporting has {} of {} payments",
                self.report_rows, self.payments
            ));
        }
        if self.report_captured < self.payments_captured {
            out.push(format!(
                "reporting has {} of {} captures",
                self.report_captured, self.payments_captured
            ));
        }
        let items = self.items_succeeded + self.items_open;
        if items < self.payments_captured {
            out.push(format!(
                "capture worker has written {} of {} work items",
                items, self.payments_captured
            ));
        }
        if self.items_open > 0 {
            out.push(format!(
                "{} capture work items not settled ({} unknown, waiting for reconciliation)",
                self.items_open, self.items_unknown
            ));
        }
        if self.provider_payouts < self.payments_captured {
            out.push(format!(
                "provider has {} of {} captures",
                self.provider_payouts, self.payments_captured
            ));
        }
        out
    }
}

/// The checks of the table of the story's end state, in order (the run adds those of the
/// load's requests and of the kills).
pub fn checks(s: &Snapshot, load: &LoadReport) -> Vec<Check> {
    let captured = s.payments_captured;
    let twice = s.provider.values().filter(|v| v.len() > 1).count() as i64;
    let matching = s
        .provider
        .iter()
        .filter(|(reference, amounts)| {
            amounts.len() == 1 && s.captured_amounts.get(*reference) == Some(&amounts[0])
        })
        .count() as i64;
    vec![
        eq(
            "payments created (payments DB) = created answers",
            load.created.len() as i64,
            s.payments,
        ),
        eq(
            "payments captured (payments DB) = capture answers",
            load.captured.len() as i64,
            captured,
        ),
        eq("reporting rows (reporting DB)", s.payments, s.report_rows),
        eq(
            "reporting rows captured (reporting DB)",
            captured,
            s.report_captured,
        ),
        eq(
            "reporting rows with an event applied twice or missing",
            0,
            s.report_wrong_events,
        ),
        eq(
            "provider captures (distinct references)",
            captured,
            s.provider_captures(),
        ),
        eq("references captured twice at the provider", 0, twice),
        eq(
            "provider captures of a captured payment, same amount",
            captured,
            matching,
        ),
        eq("outbox pending (payments DB)", 0, s.payments_db.pending),
        eq(
            "outbox dead letters (payments DB)",
            0,
            s.payments_db.dead_letters,
        ),
        eq(
            "inbox conflicts (payments + reporting DB)",
            0,
            s.payments_db.inbox_conflicts + s.reporting_db.inbox_conflicts,
        ),
        eq(
            "consumer dead letters (payments + reporting DB)",
            0,
            s.payments_db.consumer_dead_letters + s.reporting_db.consumer_dead_letters,
        ),
        eq("capture work items succeeded", captured, s.items_succeeded),
        eq("capture work items unsettled", 0, s.items_open),
        at_least(
            "unknown outcomes reconciled by key at the provider",
            1,
            s.items_reconciled,
        ),
    ]
}
