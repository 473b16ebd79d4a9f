//! Test kit of the outbox toolkit: conformance suites every backend runs against its real
//! service, and the helpers they share.
//!
//! * [`transport`]: the [`Transport`](outbox_core::Transport) suite (stored on `Ok`, event id
//!   as the broker's message id, byte-identical republish, per-aggregate order, oversize,
//!   refused destinations, outages, concurrency), run with [`transport_suite!`].
//! * [`source`]: the [`DeliverySource`](outbox_core::consumer::DeliverySource) suite
//!   (decoding, redelivery of what was not acknowledged, nack delay, poison messages, lag,
//!   batches, connection loss), run with [`source_suite!`].
//! * [`harness`]: what both suites need from a backend, and the runner that cleans up.
//! * [`net`]: a TCP proxy whose connections a test can cut or stall.
//! * [`message`], [`env`], [`wait`]: test messages, service addresses, bounded polling.
//!
//! The kit depends on no broker client: each backend implements the harness traits in its own
//! `tests/` directory, with its own client, and runs a suite in a few lines:
//!
//! ```ignore
//! mod transport {
//!     outbox_testkit::transport_suite!(crate::common::Fixture::start);
//! }
//! ```
#![forbid(unsafe_code)]

pub mod env;
pub mod harness;
pub mod message;
pub mod net;
pub mod source;
pub mod transport;
pub mod wait;
