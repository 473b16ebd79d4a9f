//! Core of the outbox toolkit: the message model, the [`Store`] and [`Transport`] traits, the
//! polling [`relay`] engine and the errors they share.
//!
//! This crate has no database or broker dependency. A store crate (`outbox-postgres`) implements
//! [`Store`]; a transport crate (`outbox-nats`, `outbox-rabbitmq`) implements [`Transport`]; the
//! [`relay::Relay`] moves claimed rows from one to the other with the guarantees listed in the
//! project README:
//!
//! * only committed rows leave (the store decides what is claimable);
//! * a row is marked sent only after [`Transport::publish`] returned, which every transport
//!   implements as "the broker durably acknowledged";
//! * a retry republishes the same row, so the same `event_id`, headers and payload;
//! * one aggregate's events are published one after another in `aggregate_version` order, while
//!   different aggregates are published concurrently.
#![forbid(unsafe_code)]

pub mod consumer;
pub mod crash;
pub mod effect;
mod error;
pub mod limits;
mod message;
pub mod relay;
pub mod secrets;
mod store;
mod transport;
pub mod wire;

pub use effect::{CallOutcome, LookupOutcome, RemoteEffect, WorkItem};
pub use error::{StoreError, StoreErrorKind};
pub use message::{
    ContentType, EventId, Fingerprint, MAX_HEADER_NAME_LEN, MessageError, NewMessage,
    OutboxMessage, Payload, TRACEPARENT_HEADER,
};
pub use store::{
    ClaimParams, ClaimedBatch, DeadLetter, DeadLetterListParams, FailureParams, LeaseToken,
    MarkParams, OutboxStats, ReleaseParams, RequeueParams, Store,
};
pub use transport::{PublishError, PublishErrorKind, PublishReceipt, Transport};
pub use wire::{DecodeError, IncomingEvent};
