//! Test kit of the outbox toolkit: the conformance suites a new store or transport proves
//! itself with, the engine suites, and named in-memory fakes.
//!
//! * [`fixture`]: what a store crate provides ([`fixture::StoreFixture`]) to run the suites.
//! * [`store`]: the store conformance suite ([`store_suite!`]): claims, leases, fencing, late
//!   commits, order, dead letters, inbox, conflicts, consumer dead letters, work items,
//!   maintenance.
//! * [`engines`]: the consumer engine and the remote-effect executor, unchanged, over any
//!   store ([`engine_suite!`]).
//! * [`memory`]: [`memory::MemoryStore`], an in-memory fake of every store trait, and its
//!   fixture; it passes the same suites.
//! * [`fakes`]: a fake broker, delivery source and provider, and [`fakes::FaultyStore`], which
//!   injects outages into any store.
//!
//! Everything named `Fake…` or `Memory…` is a fake for pure-logic tests; the suites run the
//! real stores and brokers against the real services.
#![forbid(unsafe_code)]

pub mod engines;
pub mod fakes;
pub mod fixture;
pub mod memory;
pub mod store;
