//! PostgreSQL store of the outbox toolkit.
//!
//! * **Producer API** ([`PgOutbox`]): `enqueue` / `enqueue_batch` on *your* open transaction,
//!   ordered versions from the aggregate's own row ([`AggregateRow`]) or from
//!   [`PgOutbox::next_aggregate_version`], request idempotency
//!   ([`PgOutbox::idempotency_begin`] / [`PgOutbox::idempotency_complete`]) and coalesced relay
//!   wake-ups ([`RelayWaker`]).
//! * **The store** ([`PgStore`]): one value implementing every store trait of the core, so the
//!   core's engines run on PostgreSQL: the relay's claim/lease/fence
//!   ([`outbox_core::OutboxStore`]), the consumer's inbox and dead letters
//!   ([`outbox_core::consumer::InboxStore`], engine alias [`PgConsumer`]), the work items
//!   ([`outbox_core::effect::WorkItemStore`], executor alias [`PgExecutor`]) and the elected
//!   maintenance jobs ([`outbox_core::maintenance::MaintenanceStore`]).
//! * **Consumer inbox** ([`PgInbox`]): `(consumer, event_id)` identity with a payload
//!   fingerprint in the consumer's transaction: new, duplicate, conflict, and an optional
//!   per-aggregate ordering guard, usable directly without the engine.
//! * **Remote effects** ([`effects`]): durable work items with idempotency keys, written in the
//!   consumer's transaction ([`PgEffects::enqueue`]), and the operator functions.
//! * **Migrations** ([`migrate()`]): numbered `.sql` files under a configurable schema, applied
//!   under an advisory lock.
//! * **Debezium bridge** ([`debezium`]): producers built for Debezium's outbox table keep
//!   writing it; a trigger turns each inserted row into an event of this outbox, in their
//!   transaction.
//! * **Change data capture** ([`cdc`]): the outbox table's committed inserts streamed from a
//!   logical replication slot, in commit order, with the confirmed position reported back.
//! * **Least privilege** ([`roles`]): one role per component with exactly the grants its SQL
//!   needs, the scripts that create and grant them, and errors that name a missing grant.
//!
//! The engines themselves (relay, consumer, executor, maintainer) live in `outbox-core`; this
//! crate holds only SQL, migrations and the producer API.
//!
//! The table layout is a public contract (see the guide, docs/guide/src/sql-contract.md), so
//! services in other languages can write intents with plain SQL in their own transactions.
#![forbid(unsafe_code)]

pub mod admin;
pub mod cdc;
mod connect;
pub mod consumer;
pub mod debezium;
pub mod effects;
mod error;
pub mod heartbeat;
mod inbox;
pub mod maintenance;
pub mod migrate;
mod permission;
mod producer;
pub mod relay;
pub mod roles;
mod schema;
pub mod session;
mod sql;
mod store;
mod version;

pub use connect::{ConnectError, URL_RULES, connect};
pub use consumer::PgConsumer;
pub use effects::{
    EffectsError, EnqueueOutcome, NewWorkItem, PgEffects, Resolution, WorkItemRow, idempotency_key,
};
pub use error::{EnqueueError, IdempotencyError, MigrateError};
pub use inbox::{InboxConflict, InboxOutcome, OrderingGuard, PgInbox};
pub use migrate::{
    MigrateReport, UnpublishablePending, UnpublishableRowReport, check_schema, migrate,
    migrate_mark_mode, missing_mark_mode_indexes, unpublishable_pending,
};
pub use outbox_core::claim_window::ClaimWindow;
pub use producer::{IdempotencyBegin, PgOutbox, RESERVED_HEADERS, RelayWaker};
pub use roles::{Component, PermissionDenied, RoleName, RolePlan, RolesError};
pub use schema::{DEFAULT_SCHEMA, InvalidSchema, Schema};
pub use store::{OnPublish, PgStore, PgStoreConfig};
pub use version::{AggregateRow, AggregateRowError, InvalidAggregateRow};

/// The core's remote-effect executor on PostgreSQL.
pub type PgExecutor<P> = outbox_core::effect::Executor<PgStore, P>;
