//! The feed suite on the polling feed over the in-memory store (a fake: the engine's contract
//! with its feeds, checked without a database; PostgreSQL's feeds run the same suite).

use outbox_testkit::feed::PollingFixture;
use outbox_testkit::memory::MemoryFixture;

outbox_testkit::feed_suite!(PollingFixture<MemoryFixture>);
