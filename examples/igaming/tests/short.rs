//! Runs the story in its CI mode (`igaming run --short`) against the local services and checks
//! the printed verification table. A missing service fails the test: nothing is skipped.

use support::table::{row, run_short};

#[test]
fn short_run_verifies_every_check() {
    // Asserts the run succeeded and every row is `ok`.
    let rows = run_short(
        env!("CARGO_BIN_EXE_igaming"),
        "PostgreSQL (with CREATE DATABASE) and NATS (see examples/igaming/README.md)",
    );
    assert!(rows.len() >= 25, "the table is incomplete: {rows:#?}");
    let observed = |prefix: &str| row(&rows, prefix).observed;

    let accepted = observed("bets accepted (bets DB)");
    assert!(accepted > 0, "no bet was accepted: {rows:#?}");
    assert_eq!(accepted, observed("history rows (history DB)"));
    let won = observed("bets settled won (bets DB)");
    assert!(won > 0, "no bet was won: {rows:#?}");
    assert_eq!(won, observed("ledger payouts (distinct bet ids)"));
    assert_eq!(won, observed("payouts equal to stake * odds"));
    assert_eq!(observed("bets paid more than once"), 0);
    assert_eq!(observed("ledger: sum of debits - sum of credits"), 0);
    assert_eq!(observed("ledger: house balance + player balances"), 0);

    // The re-sent event: one loud conflict at the payout consumer, the first payout kept.
    assert_eq!(observed("re-sent event: conflict recorded at payouts"), 1);
    let kept = row(&rows, "re-sent bet's payout in the ledger");
    assert_eq!(kept.expected, kept.observed.to_string());
    assert!(kept.observed > 0);

    assert_eq!(observed("outbox pending"), 0);
    assert_eq!(observed("consumer dead letters"), 0);
    let kills = row(&rows, "processes SIGKILLed");
    assert_eq!(kills.expected, "4");
    assert_eq!(kills.observed, 4);
}
