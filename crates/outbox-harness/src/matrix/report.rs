//! Reporting: the matrix as a Markdown table, printed with the verdict and spliced into a
//! document between its markers.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};

use super::cell::Row;
use super::cells::{Action, Cell};
use super::env::Env;
use super::{MatrixArgs, RelayMode};

/// Prints the table of `rows` (and writes it into `--markdown-into`) with the verdict: exit
/// status 1 when a cell did not end as expected.
pub(super) fn finish(
    env: &Env,
    args: &MatrixArgs,
    rows: &[(Cell, Row)],
    key: &str,
) -> Result<ExitCode> {
    let mode = args.relay_mode;
    let label = match mode {
        RelayMode::Polling => env.broker.to_owned(),
        RelayMode::Cdc => format!("{}, CDC relay", env.broker),
    };
    let table = render(rows, &label, mode);
    println!();
    println!("{table}");
    let failed = rows.iter().filter(|(_, r)| !r.pass).count();
    if let Some(path) = &args.markdown_into {
        splice_markdown(path, key, &table)?;
        println!("table written into {}", path.display());
    }
    if failed == 0 {
        println!(
            "crash matrix on {label}: all {} cells as expected",
            rows.len()
        );
        Ok(ExitCode::SUCCESS)
    } else {
        println!(
            "crash matrix on {label}: {failed} of {} cells NOT as expected (logs in {})",
            rows.len(),
            env.log_dir.display()
        );
        Ok(ExitCode::from(1))
    }
}

fn render(rows: &[(Cell, Row)], broker: &str, mode: RelayMode) -> String {
    let mut out = format!(
        "| cell ({broker}) | crash at | process | expected | observed | wire dups | result |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    for (c, r) in rows {
        let point = if c.point.is_empty() {
            "provider slower than call timeout".to_owned()
        } else if c.action == Action::Stop {
            format!("`{}` (SIGSTOP past the lease)", c.point)
        } else if c.action == Action::Takeover {
            format!("`{}` (stays down; standby on the slot)", c.point)
        } else {
            format!("`{}`", c.point)
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            c.id,
            point,
            c.target.name(),
            c.expected_in(mode),
            r.observed.replace('|', "/"),
            r.wire_duplicates,
            if r.pass { "PASS" } else { "FAIL" }
        ));
    }
    out
}

/// Fails unless `path` holds the markers of `key`.
pub(super) fn splice_markdown_check(path: &Path, key: &str) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let begin = format!("<!-- {key}:begin -->");
    let end = format!("<!-- {key}:end -->");
    match (text.find(&begin), text.find(&end)) {
        (Some(b), Some(e)) if b < e => Ok(()),
        _ => bail!(
            "invalid option `--markdown-into`: {} has no `{begin}` … `{end}` markers",
            path.display()
        ),
    }
}

/// Replaces what stands between `<!-- {key}:begin -->` and `<!-- {key}:end -->` in `path`.
pub(super) fn splice_markdown(path: &Path, key: &str, table: &str) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let begin = format!("<!-- {key}:begin -->");
    let end = format!("<!-- {key}:end -->");
    let (Some(b), Some(e)) = (text.find(&begin), text.find(&end)) else {
        bail!(
            "{} has no `{begin}` … `{end}` markers to write the table between",
            path.display()
        );
    };
    if e < b {
        bail!("{}: `{end}` comes before `{begin}`", path.display());
    }
    let new = format!("{}{begin}\n{table}{}", &text[..b], &text[e..]);
    std::fs::write(path, new).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
