//! PostgreSQL store of the outbox toolkit.
//!
//! * **Producer API** ([`PgOutbox`]): `enqueue` / `enqueue_batch` on *your* open transaction,
//!   [`PgOutbox::next_aggregate_version`] for ordered versions, request idempotency
//!   ([`PgOutbox::idempotency_begin`] / [`PgOutbox::idempotency_complete`]) and coalesced relay
//!   wake-ups ([`RelayWaker`]).
//! * **Relay store** ([`PgStore`]): claim/lease/fence implementation of [`outbox_core::Store`].
//! * **Consumer inbox** ([`PgInbox`]): `(consumer, event_id)` identity with a payload
//!   fingerprint in the consumer's transaction: new, duplicate, conflict, and an optional
//!   per-aggregate ordering guard.
//! * **Remote effects** ([`effects`]): durable work items with idempotency keys, written in the
//!   consumer's transaction ([`PgEffects::enqueue`]), and an [`Executor`] that calls the
//!   provider under a lease and reconciles unknown outcomes by lookup.
//! * **Migrations** ([`migrate()`]): numbered `.sql` files under a configurable schema, applied
//!   under an advisory lock.
//!
//! The table layout is a public contract (see the repository README, "SQL contract"), so
//! services in other languages can write intents with plain SQL in their own transactions.
#![forbid(unsafe_code)]

pub mod consumer;
pub mod effects;
mod error;
mod inbox;
pub mod migrate;
mod producer;
pub mod retention;
mod schema;
mod sql;
mod store;

pub use consumer::{
    ConflictPolicy, ConsumerConfig, ConsumerDeadLetter, ConsumerError, ConsumerReport, Handler,
    HandlerError, PgConsumer, consumer_dead_letter_list, consumer_dead_letter_requeue,
};
pub use effects::{
    EffectsError, EffectsStats, EnqueueOutcome, Executor, ExecutorConfig, NewWorkItem, PgEffects,
    Resolution, TickReport, WorkItemRow,
};
pub use error::{EnqueueError, IdempotencyError, MigrateError};
pub use inbox::{InboxConflict, InboxOutcome, OrderingGuard, PgInbox};
pub use migrate::{MigrateReport, check_schema, migrate};
pub use producer::{IdempotencyBegin, PgOutbox, RelayWaker};
pub use retention::{InboxMaintainer, InboxRetention, ReplayHorizon, RetentionError};
pub use schema::{DEFAULT_SCHEMA, InvalidSchema, Schema};
pub use store::{OnPublish, PgStore, PgStoreConfig};
