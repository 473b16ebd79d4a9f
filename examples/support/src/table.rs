//! The `VERIFICATION` table of a run: one [`Check`] per row, printed as
//! `| check | expected | observed | result |`, the run's exit status from it, and, for the
//! examples' tests, the table parsed back from the run's output.

use std::path::Path;
use std::process::ExitCode;

/// One row of the verification table.
#[derive(Debug, Clone)]
pub struct Check {
    /// What is checked.
    pub name: String,
    /// The expected value, as printed (a number, or `>= 1`).
    pub expected: String,
    /// The observed value.
    pub observed: i64,
    /// Whether it holds.
    pub ok: bool,
}

/// `observed` must be `expected`.
pub fn eq(name: &str, expected: i64, observed: i64) -> Check {
    Check {
        name: name.to_owned(),
        expected: expected.to_string(),
        observed,
        ok: expected == observed,
    }
}

/// `observed` must be at least `min`.
pub fn at_least(name: &str, min: i64, observed: i64) -> Check {
    Check {
        name: name.to_owned(),
        expected: format!(">= {min}"),
        observed,
        ok: observed >= min,
    }
}

/// Prints the table; the header line is `VERIFICATION`, each row `| check | expected |
/// observed | ok |` (or `FAIL`).
pub fn print(checks: &[Check]) {
    let w = checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    println!();
    println!("VERIFICATION");
    println!(
        "| {:<w$} | {:>8} | {:>8} | {:<6} |",
        "check", "expected", "observed", "result"
    );
    println!(
        "|{}|{}|{}|{}|",
        "-".repeat(w + 2),
        "-".repeat(10),
        "-".repeat(10),
        "-".repeat(8)
    );
    for c in checks {
        println!(
            "| {:<w$} | {:>8} | {:>8} | {:<6} |",
            c.name,
            c.expected,
            c.observed,
            if c.ok { "ok" } else { "FAIL" }
        );
    }
}

/// Prints the table and the verdict; the run's exit status: failure when a check failed (the
/// logs in `logs` are named then).
pub fn conclude(checks: &[Check], logs: &Path) -> ExitCode {
    print(checks);
    let failed = checks.iter().filter(|c| !c.ok).count();
    if failed == 0 {
        println!("\nall {} checks ok", checks.len());
        ExitCode::SUCCESS
    } else {
        println!(
            "\n{failed} check(s) FAILED; the logs are kept in {}",
            logs.display()
        );
        ExitCode::FAILURE
    }
}

/// A row of a printed table, read back.
#[derive(Debug, Clone)]
pub struct Row {
    /// What is checked.
    pub check: String,
    /// The expected value as printed.
    pub expected: String,
    /// The observed value.
    pub observed: i64,
    /// `ok` or `FAIL`.
    pub result: String,
}

/// The rows after the `VERIFICATION` line of `stdout`.
///
/// # Panics
/// A row that is not four cells, or whose observed value is not a number (a test helper).
pub fn parse(stdout: &str) -> Vec<Row> {
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

/// The row whose check starts with `prefix`.
///
/// # Panics
/// No such row (a test helper).
pub fn row<'a>(rows: &'a [Row], prefix: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.check.starts_with(prefix))
        .unwrap_or_else(|| panic!("no row `{prefix}` in the table: {rows:#?}"))
}

/// Runs `<exe> run --short` and returns its table, after asserting that the run succeeded and
/// every row is `ok` (the output is printed for the test's log).
///
/// # Panics
/// The run cannot start or failed, or a row is not `ok` (a test helper).
pub fn run_short(exe: &str, what_it_needs: &str) -> Vec<Row> {
    let started = std::time::Instant::now();
    let out = std::process::Command::new(exe)
        .args(["run", "--short"])
        .output()
        .unwrap_or_else(|e| panic!("cannot start {exe}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "`run --short` failed ({}) after {:?}; it needs {what_it_needs}.\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status,
        started.elapsed()
    );
    let rows = parse(&stdout);
    for r in &rows {
        assert_eq!(r.result, "ok", "check failed: {r:?}");
    }
    // The children's logs are files: plain text, no colour codes.
    let logs = stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("logs "))
        .map(str::trim)
        .expect("the run names its log directory");
    let mut read = 0;
    for entry in std::fs::read_dir(logs).unwrap_or_else(|e| panic!("{logs}: {e}")) {
        let path = entry.expect("a log file").path();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            !text.contains('\u{1b}'),
            "escape codes in {}",
            path.display()
        );
        read += 1;
    }
    assert!(read > 0, "no child log in {logs}");
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_printed_table_reads_back() {
        let stdout = "noise\n\nVERIFICATION\n\
            | check | expected | observed | result |\n\
            |-------|----------|----------|--------|\n\
            | a b   |        3 |        3 | ok     |\n\
            | c     |     >= 1 |        0 | FAIL   |\n";
        let rows = parse(stdout);
        assert_eq!(rows.len(), 2);
        assert_eq!(row(&rows, "a").observed, 3);
        assert_eq!(row(&rows, "c").expected, ">= 1");
        assert_eq!(row(&rows, "c").result, "FAIL");
        assert!(eq("x", 1, 1).ok && !at_least("y", 1, 0).ok);
    }
}
