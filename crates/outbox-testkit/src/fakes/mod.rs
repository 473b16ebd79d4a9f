//! Named in-memory **fakes** of the broker and provider sides, for the engines' unit tests and
//! the engine suites: [`FakeTransport`] (a broker that acknowledges, fails as scripted, and
//! records what it accepted), [`FakeSource`] (a queue of deliveries with redelivery on nack or
//! drop), [`FakeProvider`] (a payment provider with switches), and [`FaultyStore`], a wrapper that
//! makes any store fail as an outage would. None of them talks to a real service; the transport
//! and store conformance suites check the real ones.
//!
//! One file per fake: the transport (`transport.rs`), the delivery source (`source.rs`), the
//! provider (`provider.rs`) and the fault injection (`faulty.rs`).

use std::sync::{Mutex, MutexGuard};

mod faulty;
mod provider;
mod source;
mod transport;

pub use faulty::FaultyStore;
pub use provider::{CallMode, FakeProvider, ProviderState};
pub use source::{FakeDelivery, FakeSource, decode_wire, event_message, wire_message};
pub use transport::FakeTransport;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
