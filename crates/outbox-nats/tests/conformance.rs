//! The transport and delivery-source conformance suites of `outbox-testkit`, run against the
//! real NATS server with JetStream (see `common` for the harness).

mod common;

mod transport {
    outbox_testkit::transport_suite!(crate::common::Fixture::start);
}

mod source {
    outbox_testkit::source_suite!(crate::common::Fixture::start);
}

/// The same source cases with pull requests kept open ahead of the batches (`prefetch`).
mod source_prefetching {
    outbox_testkit::source_suite!(crate::common::Fixture::start_prefetching);
}
