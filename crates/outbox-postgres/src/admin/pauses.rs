//! Paused routes and consumers (schema version 10): what an operator stopped on purpose.
//!
//! What each stops is told at [`PauseTarget`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{AdminError, AdminErrorKind};

/// What a pause stops, as the API and the CLI name it.
///
/// * A paused **route** (an outbox destination, or an aggregate type's topic for rows without
///   one) is not claimed by the polling relay: its rows stay pending, and an aggregate whose
///   next row goes there waits, its later rows included, whatever their route (per-aggregate
///   order, G7). The claim statement reads `pauses` itself, so a pause holds from the next
///   claim on; a batch already claimed is finished. A CDC relay does not read `pauses`: a pause
///   is refused while one runs (see [`super::Admin::pause`]), and one started while a route is
///   paused logs a warning. Costs: a claim from the table's start walks past the paused route's
///   pending rows (about 2 µs a row: 2 s for a million); with the claim window on
///   ([`crate::ClaimWindow`], off by default) a slow claim moves the next claims' start past
///   them, so only one claim in a while pays it (BENCHMARKS.md, "A paused route's cost"). A head that was suspected of crashing relays
///   (the poison-row rule's takeover count) starts its count again after the pause.
/// * A paused **consumer** takes no deliveries from its source (`PgConsumer` asks its store at
///   most once a second, `outbox_core::consumer`): a batch in progress is finished, then what
///   the broker holds for the consumer waits there until it is resumed. What the source had
///   already received stays with it unacknowledged: NATS redelivers it after the ack wait,
///   RabbitMQ keeps up to the prefetch count with the paused consumer until its
///   `consumer_timeout` (30 minutes by default) closes the channel and requeues them (each
///   such return counts as a delivery), Kafka has nothing unacknowledged beyond the uncommitted
///   offsets. The source is not polled while paused, so its lag is not refreshed either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseTarget {
    /// A route, by its key: `destination:` and the rows' destination, or `type:` and the
    /// aggregate type of rows without a destination (the keys the overview's routes show).
    Route(String),
    /// A consumer, by its name.
    Consumer(String),
}

impl PauseTarget {
    /// The route of rows sent to `destination`.
    pub fn destination(destination: &str) -> Self {
        Self::Route(format!("destination:{destination}"))
    }

    /// The route of rows of `aggregate_type` that name no destination.
    pub fn aggregate_type(aggregate_type: &str) -> Self {
        Self::Route(format!("type:{aggregate_type}"))
    }

    /// The `kind` column's value.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Route(_) => "route",
            Self::Consumer(_) => "consumer",
        }
    }

    /// The `name` column's value.
    pub fn name(&self) -> &str {
        match self {
            Self::Route(n) | Self::Consumer(n) => n,
        }
    }

    /// Checks the name: a route key starts with `destination:` or `type:` followed by a name;
    /// every name is 1 to 1,024 characters.
    ///
    /// # Errors
    /// [`AdminError`] of kind `InvalidRequest` saying what is wrong.
    pub(super) fn check(&self, operation: &'static str) -> Result<(), AdminError> {
        let invalid = |message: String| AdminError {
            operation,
            kind: AdminErrorKind::InvalidRequest,
            message,
        };
        let name = self.name();
        if name.is_empty() || name.chars().count() > 1024 {
            return Err(invalid(format!(
                "a {} name has 1 to 1,024 characters",
                self.kind()
            )));
        }
        if let Self::Route(key) = self {
            let rest = key
                .strip_prefix("destination:")
                .or_else(|| key.strip_prefix("type:"));
            if rest.is_none_or(str::is_empty) {
                return Err(invalid(format!(
                    "a route is `destination:<destination>` or `type:<aggregate type>`, not {key:?}"
                )));
            }
        }
        Ok(())
    }
}

/// One pause in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pause {
    /// `route` or `consumer`.
    pub kind: String,
    /// The route's key or the consumer's name.
    pub name: String,
    /// Since when.
    pub paused_at: DateTime<Utc>,
    /// The pause's audit record.
    pub audit_id: i64,
    /// Who paused it (from the audit record).
    pub actor: Option<String>,
    /// Why (from the audit record).
    pub reason: Option<String>,
}

/// Every pause in force, with who and why.
pub(super) const LIST: &str = "SELECT p.kind, p.name, p.paused_at, p.audit_id, a.actor, a.reason \
    FROM {s}.pauses p LEFT JOIN {s}.audit a ON a.id = p.audit_id ORDER BY p.kind, p.name";

/// Pauses `$1`/`$2` under the audit record `$3`; no row when it is paused already.
pub(super) const INSERT: &str = "INSERT INTO {s}.pauses (kind, name, audit_id) \
    VALUES ($1, $2, $3) ON CONFLICT (kind, name) DO NOTHING";

/// Resumes `$1`/`$2`.
pub(super) const DELETE: &str = "DELETE FROM {s}.pauses WHERE kind = $1 AND name = $2";

/// Whether the consumer `$1` is paused (what its engine asks, `crate::consumer`).
pub(crate) const CONSUMER_PAUSED: &str =
    "SELECT EXISTS (SELECT 1 FROM {s}.pauses WHERE kind = 'consumer' AND name = $1)";

pub(super) fn pause(r: &PgRow) -> Result<Pause, sqlx::Error> {
    Ok(Pause {
        kind: r.try_get(0)?,
        name: r.try_get(1)?,
        paused_at: r.try_get(2)?,
        audit_id: r.try_get(3)?,
        actor: r.try_get(4)?,
        reason: r.try_get(5)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_names_a_destination_or_an_aggregate_type() {
        assert!(PauseTarget::destination("payments").check("pause").is_ok());
        assert!(PauseTarget::aggregate_type("order").check("pause").is_ok());
        for bad in ["payments", "destination:", "type:", "queue:payments", ""] {
            let e = PauseTarget::Route(bad.into()).check("pause").unwrap_err();
            assert_eq!(e.kind, AdminErrorKind::InvalidRequest, "{bad}");
        }
        assert!(PauseTarget::Consumer(String::new()).check("pause").is_err());
        assert!(
            PauseTarget::Consumer("x".repeat(1025))
                .check("pause")
                .is_err()
        );
        assert_eq!(
            serde_json::to_value(PauseTarget::destination("p")).unwrap(),
            serde_json::json!({"route": "destination:p"})
        );
    }
}
