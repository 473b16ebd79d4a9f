//! Core of the outbox toolkit: the message model, the traits a store or a broker implements, and
//! the engines written once against them.
//!
//! This crate has no database or broker dependency, and no knowledge of one: a store crate
//! (`outbox-<database>`) implements [`OutboxStore`] (and the inbox, work-item and maintenance
//! store traits); a transport crate (`outbox-<broker>`) implements [`Transport`] and
//! [`consumer::DeliverySource`], and tells the core what it needs to know of its broker through
//! its registry entry ([`broker::BrokerEntry`]: URL schemes, settings, file kinds, reserved
//! header names, how its URLs carry credentials); the engines move events between them:
//!
//! * [`relay::Relay`], the publish engine, fed by a [`relay::Feed`] (polling claims, or a log);
//! * the consumer engine in [`consumer`];
//! * the remote-effect executor in [`effect`];
//! * the maintenance jobs (retention, lease reaping) in [`maintenance`];
//! * what the relay and the consumers say about themselves when they are stuck, in [`health`].
//!
//! The relay moves rows to the broker with the guarantees listed in the guide
//! (docs/guide/src/guarantees.md):
//!
//! * only committed rows leave (the store decides what is claimable);
//! * a row is marked sent only after [`Transport::publish`] returned, which every transport
//!   implements as "the broker durably acknowledged";
//! * a retry republishes the same row, so the same `event_id`, headers and payload;
//! * one aggregate's events are published one after another in `aggregate_version` order, while
//!   different aggregates are published concurrently.
#![forbid(unsafe_code)]

mod backoff;
pub mod broker;
pub mod claim_window;
pub mod consumer;
pub mod crash;
pub mod effect;
mod error;
pub mod health;
pub mod heartbeat;
pub mod limits;
pub mod maintenance;
mod message;
pub mod operator;
pub mod relay;
pub mod secrets;
mod store;
#[cfg(feature = "rustls")]
pub mod tls;
mod transport;
pub mod wire;

pub use backoff::Backoff;

pub use effect::{CallOutcome, LookupOutcome, RemoteEffect, WorkItem};
pub use error::{ConfigError, StoreError, StoreErrorKind};
pub use message::{
    ContentType, EventId, Fingerprint, MAX_HEADER_NAME_LEN, MessageError, NewMessage,
    OutboxMessage, Payload, ReservedHeaders, TRACEPARENT_HEADER, headers_from_json,
};
pub use store::{
    ClaimParams, ClaimScope, ClaimedBatch, FailureParams, LeaseToken, Liveness, MarkParams,
    OutboxStats, OutboxStore, ReleaseParams, Takeover, UndecodableRow,
};
pub use transport::{PublishError, PublishErrorKind, PublishReceipt, Transport};
pub use wire::{DecodeError, EventIdentity, IncomingEvent};
