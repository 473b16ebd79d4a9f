//! Runs the story in its CI mode (`fintech run --short`) against the local services and checks
//! the printed verification table. A missing service fails the test: nothing is skipped.

use support::table::{row, run_short};

#[test]
fn short_run_verifies_every_check() {
    // Asserts the run succeeded and every row is `ok`.
    let rows = run_short(
        env!("CARGO_BIN_EXE_fintech"),
        "PostgreSQL, NATS and the stand-in provider (see examples/fintech/README.md)",
    );
    assert!(rows.len() >= 15, "the table is incomplete: {rows:#?}");
    let observed = |prefix: &str| row(&rows, prefix).observed;
    let payments = observed("payments captured (payments DB)");
    let reporting = observed("reporting rows captured (reporting DB)");
    let provider = observed("provider captures (distinct references)");
    assert!(payments > 0, "nothing was captured: {rows:#?}");
    assert_eq!(
        payments, reporting,
        "payments captured != reporting rows captured"
    );
    assert_eq!(payments, provider, "payments captured != provider captures");
    assert_eq!(observed("references captured twice"), 0);
    assert_eq!(observed("outbox pending"), 0);
    assert_eq!(observed("capture work items unsettled"), 0);
    let kills = row(&rows, "processes SIGKILLed");
    assert_eq!(kills.expected, "4");
    assert_eq!(kills.observed, 4);
}
