//! Test kit of the outbox toolkit: the conformance suites a new store or transport proves
//! itself with against its real service, the engine suites, and named in-memory fakes.
//!
//! Stores:
//!
//! * [`fixture`]: what a store crate provides ([`fixture::StoreFixture`]) to run the suites.
//! * [`store`]: the store conformance suite ([`store_suite!`]): claims, leases, fencing, late
//!   commits, order, dead letters, inbox, conflicts, consumer dead letters, work items,
//!   maintenance.
//! * [`engines`]: the consumer engine, the remote-effect executor and the maintainer,
//!   unchanged, over any store ([`engine_suite!`]).
//! * [`memory`]: [`memory::MemoryStore`], an in-memory fake of every store trait and of the
//!   operator contract, and its fixture; it passes the same store and operator suites.
//! * [`operator`]: the operator conformance suite ([`operator_suite!`]): the overview, dead
//!   letters, conflicts, work items, pauses, the audit, traces and replays of
//!   [`outbox_core::operator`], for a fixture whose store implements it.
//! * [`support`]: the steps these suites share (claims settled, inbox records, consumer dead
//!   letters, work items).
//!
//! Brokers:
//!
//! * [`transport`]: the [`Transport`](outbox_core::Transport) suite (stored on `Ok`, event id
//!   as the broker's message id, byte-identical republish, per-aggregate order, oversize,
//!   refused destinations, outages, concurrency), run with [`transport_suite!`].
//! * [`source`]: the [`DeliverySource`](outbox_core::consumer::DeliverySource) suite
//!   (decoding, redelivery of what was not acknowledged, nack delay, poison messages, lag,
//!   batches, connection loss), run with [`source_suite!`].
//! * [`harness`]: what both broker suites need from a backend, and the runner that cleans up.
//! * [`net`]: a TCP proxy whose connections a test can cut or stall; [`tls`]: a throw-away
//!   certificate authority and a TLS-terminating proxy; [`tansu`]: a private Kafka-protocol
//!   broker that advertises a proxy, for Kafka's outage cases.
//! * [`amqp`]: raw AMQP 0-9-1 frames written on a socket, to publish what no client library
//!   sends (hostile-input tests).
//! * [`nats_wire`]: the NATS protocol written by hand on a TCP socket, to store in a stream
//!   what no client library sends (hostile header blocks).
//! * [`message`], [`env`](mod@env), [`wait`]: test messages, service addresses, bounded polling.
//! * [`tap`]: a delivery source that shows each fetch and settlement of another to a
//!   [`tap::Tap`] (the benchmarks' timings, tests' delivery logs).
//! * [`fuzz`]: property harnesses for the decoders at the boundaries (generated hostile
//!   messages, and what a decoder must hold for each), with a short run in every `cargo test`
//!   and a long mode (`OUTBOX_FUZZ_CASES`).
//!
//! Fakes for pure-logic tests, named as such: [`fakes`] (a broker, a delivery source, a
//! provider, and [`fakes::FaultyStore`], which injects outages into any store) and the
//! [`memory`] store.
//!
//! By default the kit depends on no database driver or broker client (the `postgres` feature
//! adds the `pg` module, the fresh-schema helper the PostgreSQL store's tests, the
//! binary's and the console's share): each backend implements the
//! fixture or harness traits in its own `tests/` directory and runs a suite in a few lines:
//!
//! ```ignore
//! outbox_testkit::store_suite!(PgFixture);
//! outbox_testkit::engine_suite!(PgFixture);
//! mod transport {
//!     outbox_testkit::transport_suite!(crate::common::Fixture::start);
//! }
//! ```
#![forbid(unsafe_code)]

pub mod amqp;
pub mod engines;
pub mod env;
pub mod fakes;
pub mod feed;
pub mod fixture;
pub mod fuzz;
pub mod harness;
pub mod memory;
pub mod message;
pub mod nats_wire;
pub mod net;
pub mod operator;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod source;
pub mod store;
pub mod support;
pub mod tansu;
pub mod tap;
pub mod tls;
pub mod transport;
pub mod wait;
