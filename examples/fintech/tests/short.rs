//! Runs the story in its CI mode (`fintech run --short`) against the local services and checks
//! the printed verification table. A missing service fails the test: nothing is skipped.

use std::process::Command;
use std::time::Instant;

/// One row of the table: check, expected, observed, result.
#[derive(Debug)]
struct Row {
    check: String,
    expected: String,
    observed: i64,
    result: String,
}

/// The rows after the `VERIFICATION` line.
fn table(stdout: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut inside = false;
    for line in stdout.lines() {
        if line == "VERIFICATION" {
            inside = true;
            continue;
        }
        if !inside || !line.starts_with("| ") {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 4, "a table row has four cells: {line}");
        if cells[0] == "check" {
            continue;
        }
        rows.push(Row {
            check: cells[0].to_owned(),
            expected: cells[1].to_owned(),
            observed: cells[2]
                .parse()
                .unwrap_or_else(|_| panic!("observed is not a number: {line}")),
            result: cells[3].to_owned(),
        });
    }
    rows
}

fn observed(rows: &[Row], prefix: &str) -> i64 {
    rows.iter()
        .find(|r| r.check.starts_with(prefix))
        .unwrap_or_else(|| panic!("no row `{prefix}` in the table: {rows:#?}"))
        .observed
}

#[test]
fn short_run_verifies_every_check() {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_fintech"))
        .args(["run", "--short"])
        .output()
        .expect("cannot start the fintech binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "`fintech run --short` failed ({}) after {:?}; it needs PostgreSQL, NATS and the \
         stand-in provider (see examples/fintech/README.md).\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status,
        started.elapsed()
    );

    let rows = table(&stdout);
    assert!(rows.len() >= 15, "the table is incomplete: {rows:#?}");
    for r in &rows {
        assert_eq!(r.result, "ok", "check failed: {r:?}");
    }
    let payments = observed(&rows, "payments captured (payments DB)");
    let reporting = observed(&rows, "reporting rows captured (reporting DB)");
    let provider = observed(&rows, "provider captures (distinct references)");
    assert!(payments > 0, "nothing was captured: {rows:#?}");
    assert_eq!(
        payments, reporting,
        "payments captured != reporting rows captured"
    );
    assert_eq!(payments, provider, "payments captured != provider captures");
    assert_eq!(observed(&rows, "references captured twice"), 0);
    assert_eq!(observed(&rows, "outbox pending"), 0);
    assert_eq!(observed(&rows, "capture work items unsettled"), 0);
    let kills = rows
        .iter()
        .find(|r| r.check.starts_with("processes SIGKILLed"))
        .expect("the kill row");
    assert_eq!(kills.expected, "4");
    assert_eq!(kills.observed, 4);
}
