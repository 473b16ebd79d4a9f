//! Remote effects: the side of a consumer that cannot be part of its database transaction.
//!
//! A payout over HTTP cannot commit together with the inbox row. The supported path is:
//!
//! 1. the consumer writes a durable *work item* with a stable idempotency key in the same
//!    transaction as its inbox row (so one work item per event, exactly as one effect per event);
//! 2. an executor claims work items under a lease and calls the provider with that key
//!    ([`RemoteEffect::call`]);
//! 3. the answer is recorded. An answer that does not say what happened (timeout, connection
//!    reset after the request left, 5xx, or a crash between the call and the record) puts the
//!    item in the *unknown* state. Unknown items are never retried blindly: reconciliation asks
//!    the provider by key ([`RemoteEffect::lookup`]) and resolves the item from its answer.
//!
//! Exactly-once holds for the local database only (guarantee G10). For the remote side the
//! toolkit gives at-most-one *attempt per known state* plus reconciliation; whether the provider
//! ends with exactly one payout depends on the provider honouring the idempotency key (or
//! answering lookups truthfully). The crash matrix shows both sides of that boundary.
//!
//! This module holds the provider-facing contract ([`RemoteEffect`]), the store-facing one
//! ([`WorkItemStore`]) and the [`Executor`] written once against both; a store's work-item
//! table and the enqueue on the consumer's transaction live in its store crate.

mod executor;
mod store;

use std::future::Future;

pub use executor::{
    Executor, ExecutorConfig, LEASE_EXPIRED_REASON, LEASE_MARGIN, PARKED_REASON, TickReport, metric,
};
pub use store::{
    ClaimPurpose, ClaimedWorkItem, EffectsStats, WorkItemClaimParams, WorkItemRecordParams,
    WorkItemState, WorkItemStore, WorkItemUpdate,
};

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The stable idempotency key of the work of `kind` that `consumer_name` does for `event_id`:
/// `"{kind}:{consumer_name}:{event_id}"`. A redelivered event yields the same key.
pub fn idempotency_key(kind: &str, consumer_name: &str, event_id: Uuid) -> String {
    format!("{kind}:{consumer_name}:{event_id}")
}

/// A work item to enqueue, in the consumer's transaction, with the store crate's API (see
/// [`Executor`], "The path of one effect").
#[derive(Debug, Clone, PartialEq)]
pub struct NewWorkItem {
    /// The kind of effect (`payout`); one executor serves one kind. 1 to 255 bytes.
    pub kind: String,
    /// Sent to the provider with every call and lookup. 1 to 1024 bytes.
    pub idempotency_key: String,
    /// What to do.
    pub payload: serde_json::Value,
    /// The event that caused the work.
    pub event_id: Option<Uuid>,
    /// The consumer that wrote the item.
    pub consumer_name: Option<String>,
}

/// Why a [`NewWorkItem`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid work item `{field}`: {reason}")]
pub struct InvalidWorkItem {
    /// The field.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl NewWorkItem {
    /// The item for the work of `kind` that `consumer_name` does for `event_id`, keyed with
    /// [`idempotency_key`].
    pub fn for_event(
        kind: impl Into<String>,
        consumer_name: impl Into<String>,
        event_id: Uuid,
        payload: serde_json::Value,
    ) -> Self {
        let kind = kind.into();
        let consumer_name = consumer_name.into();
        Self {
            idempotency_key: idempotency_key(&kind, &consumer_name, event_id),
            kind,
            payload,
            event_id: Some(event_id),
            consumer_name: Some(consumer_name),
        }
    }

    /// Checks the sizes every store enforces.
    ///
    /// # Errors
    /// [`InvalidWorkItem`] for an empty or oversized kind (1 to 255 bytes) or key (1 to 1024).
    pub fn validate(&self) -> Result<(), InvalidWorkItem> {
        let bad = |field, reason: &str| {
            Err(InvalidWorkItem {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.kind.is_empty() || self.kind.len() > 255 {
            return bad("kind", "must be 1 to 255 bytes");
        }
        if self.idempotency_key.is_empty() || self.idempotency_key.len() > 1024 {
            return bad("idempotency_key", "must be 1 to 1024 bytes");
        }
        Ok(())
    }
}

/// One unit of remote work, as the executor hands it to a [`RemoteEffect`].
#[derive(Debug, Clone, PartialEq)]
pub struct WorkItem {
    /// Row id in the work-item table.
    pub id: i64,
    /// What kind of effect this is (e.g. `payout`); one executor serves one kind.
    pub kind: String,
    /// Stable key sent to the provider with every call and lookup of this item. Derived from
    /// the consumer and the event, so a redelivered event maps to the same key.
    pub idempotency_key: String,
    /// What to do, as the consumer wrote it.
    pub payload: serde_json::Value,
    /// The event that caused this work, when there is one.
    pub event_id: Option<Uuid>,
    /// Calls made so far for this item, including the current one.
    pub attempts: i32,
    /// When the consumer wrote the item.
    pub created_at: DateTime<Utc>,
}

/// What a provider call ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// The provider performed the effect (or had already performed it for this key).
    Succeeded {
        /// The provider's reference (payout id, transaction id ...), kept with the item.
        reference: String,
    },
    /// The provider definitively refused and did nothing (a 4xx business error). Terminal.
    Failed {
        /// The provider's reason.
        reason: String,
    },
    /// The request provably never reached the provider (connection refused, DNS failure):
    /// safe to call again later with the same key.
    NotSent {
        /// What went wrong.
        reason: String,
    },
    /// Nobody knows whether the effect happened: timeout, reset after sending, 5xx, an answer
    /// that cannot be parsed. The item goes to reconciliation.
    Unknown {
        /// What went wrong.
        reason: String,
    },
}

/// What the provider says about a key during reconciliation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupOutcome {
    /// The effect happened.
    Succeeded {
        /// The provider's reference.
        reference: String,
    },
    /// The provider recorded the request and refused it. Terminal.
    Failed {
        /// The provider's reason.
        reason: String,
    },
    /// The provider has no record of this key. Whether that allows a new call depends on the
    /// provider (see [`ExecutorConfig::resend_when_not_found`]).
    NotFound,
    /// The lookup itself did not give an answer; ask again later.
    Unknown {
        /// What went wrong.
        reason: String,
    },
}

/// A remote provider the executor can call and ask. Implementations must send
/// [`WorkItem::idempotency_key`] with every call (for HTTP, the `Idempotency-Key` header) and
/// must not retry internally: the executor owns retries and reconciliation.
pub trait RemoteEffect: Send + Sync + 'static {
    /// Performs the effect for `item`. The executor applies its own timeout around this call
    /// and treats a timeout as [`CallOutcome::Unknown`].
    fn call(&self, item: &WorkItem) -> impl Future<Output = CallOutcome> + Send;

    /// Asks the provider what happened to `item.idempotency_key`.
    fn lookup(&self, item: &WorkItem) -> impl Future<Output = LookupOutcome> + Send;
}
