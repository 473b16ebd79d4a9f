//! The in-memory fake store passes the operator conformance suite: the console's and the CLI's
//! tests that use it see the same operator contract the real stores keep.

outbox_testkit::operator_suite!(outbox_testkit::memory::MemoryFixture);
