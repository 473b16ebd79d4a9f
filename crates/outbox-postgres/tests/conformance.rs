//! PostgreSQL passes the store conformance suite and runs the core's engines unchanged (the
//! engine suites of `outbox-testkit`), against the real server, one fresh schema per case.

mod common;
#[path = "support/pg_fixture.rs"]
mod pg_fixture;

use pg_fixture::PgFixture;

outbox_testkit::store_suite!(PgFixture);
outbox_testkit::engine_suite!(PgFixture);
outbox_testkit::operator_suite!(PgFixture);

/// The operator's reads and actions on a store that keeps published rows (mark mode): the
/// replays it allows, and every other case with published rows kept.
mod mark_mode {
    outbox_testkit::operator_suite!(super::PgFixture<true>);
}
