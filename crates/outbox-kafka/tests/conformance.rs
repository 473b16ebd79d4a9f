//! The transport and delivery-source conformance suites of `outbox-testkit`, run against the
//! real Kafka-protocol broker (see `common` for the harness).

mod common;

mod transport {
    outbox_testkit::transport_suite!(crate::common::Fixture::start);
}

mod source {
    outbox_testkit::source_suite!(crate::common::Fixture::start);
}
