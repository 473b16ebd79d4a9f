//! The consumer engine and the remote-effect executor against the in-memory fake store of
//! `outbox-testkit`: the same engine suites PostgreSQL runs as integration tests.

outbox_testkit::engine_suite!(outbox_testkit::memory::MemoryFixture);
