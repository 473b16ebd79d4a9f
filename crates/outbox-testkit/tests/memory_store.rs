//! The in-memory fake store passes the store conformance suite, so the engine tests that use it
//! test the engines against the same contract the real stores keep.

outbox_testkit::store_suite!(outbox_testkit::memory::MemoryFixture);
