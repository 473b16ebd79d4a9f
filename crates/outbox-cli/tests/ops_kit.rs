//! The operations kit (`ops/prometheus`, `ops/grafana`): its rules are valid Prometheus
//! (`promtool check rules`), its alerts fire on the series they watch (`promtool test rules`),
//! every metric they, the dashboard's queries and the guide's metrics table
//! (docs/guide/src/operations.md, "Metrics") name is one the code exports, and the guide
//! documents every one the code exports.
//! `promtool` comes from Debian's prometheus package, which `scripts/services` installs; a missing
//! promtool fails the test.
#![allow(missing_docs)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `pub const NAME: &str = "outbox_…";` in the crates' sources: the metric names the
/// code registers (through the `metrics` facade, always by such a constant).
fn exported() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for line in text.lines() {
                    let line = line.trim();
                    if let Some(rest) = line.strip_prefix("pub const ")
                        && let Some((_, value)) = rest.split_once(": &str = \"outbox_")
                        && let Some((name, _)) = value.split_once('"')
                    {
                        out.insert(format!("outbox_{name}"));
                    }
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    for krate in std::fs::read_dir(root().join("crates")).unwrap() {
        let src = krate.unwrap().path().join("src");
        if src.is_dir() {
            walk(&src, &mut out);
        }
    }
    out
}

/// The `outbox_…` metric names in `text` (a histogram's `_bucket`, `_sum`, `_count` series as
/// the histogram's name).
fn named_in(text: &str, exported: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("outbox_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let mut name = tail[..end].to_owned();
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix)
                && exported.contains(base)
            {
                name = base.to_owned();
            }
        }
        out.insert(name);
        rest = &tail[end..];
    }
    out
}

fn promtool(args: &[&str]) {
    let dir = root().join("ops/prometheus");
    let out = Command::new("promtool")
        .args(args)
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "promtool is required (Debian's prometheus package; scripts/services installs it): {e}"
            )
        });
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_rules_are_valid_and_their_alerts_fire() {
    promtool(&["check", "rules", "outbox-rules.yml"]);
    promtool(&["test", "rules", "outbox-rules.test.yml"]);
}

#[test]
fn the_rules_and_the_guide_name_exactly_the_metrics_the_code_exports() {
    let exported = exported();
    assert!(
        exported.len() >= 30 && exported.contains("outbox_pending"),
        "the source scan found too little: {exported:?}"
    );
    let rules = std::fs::read_to_string(root().join("ops/prometheus/outbox-rules.yml")).unwrap();
    let exprs: String = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect::<Vec<_>>()
        .join("\n");
    let in_rules = named_in(&exprs, &exported);
    let unknown: Vec<_> = in_rules.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the rules name metrics the code does not export: {unknown:?}"
    );

    let chapter = std::fs::read_to_string(root().join("docs/guide/src/operations.md")).unwrap();
    let section = chapter
        .split_once("\n## Metrics")
        .and_then(|(_, rest)| rest.split_once("\n## "))
        .map(|(section, _)| section)
        .expect("docs/guide/src/operations.md has a Metrics section followed by another one");
    let table: String = section
        .lines()
        .filter(|l| l.starts_with("| `outbox_"))
        .collect::<Vec<_>>()
        .join("\n");
    let documented = named_in(&table, &exported);
    let undocumented: Vec<_> = exported.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&exported).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "the guide's metrics table (docs/guide/src/operations.md): missing {undocumented:?}, \
         not exported {stale:?}"
    );
    // The dashboard: valid JSON, every query on exported metrics, each panel with a query.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("ops/grafana/outbox-dashboard.json")).unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "a panel without a query: {panel}");
        queries.extend(
            targets
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_owned()),
        );
    }
    let in_dashboard = named_in(&queries.join("\n"), &exported);
    let unknown: Vec<_> = in_dashboard.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics the code does not export: {unknown:?}"
    );
    for shown in [
        "outbox_pending",
        "outbox_consumer_lag",
        "outbox_effects_unknown",
    ] {
        assert!(
            in_dashboard.contains(shown),
            "the dashboard does not show {shown}"
        );
    }

    // The failure modes the rules must cover each have an alert on their metric.
    for watched in [
        "outbox_oldest_pending_age_seconds",
        "outbox_dead_letters",
        "outbox_consumer_conflicts_total",
        "outbox_effects_oldest_unknown_age_seconds",
        "outbox_consumer_lag",
        "outbox_cdc_slot_lag_seconds",
    ] {
        assert!(in_rules.contains(watched), "no rule watches {watched}");
    }
}

/// The guide's alert table (docs/guide/src/operations.md, "Alerts") lists exactly the alerts of
/// the rules file, so that each one an operator is paged for has its meaning and its action.
#[test]
fn the_guide_explains_every_alert_of_the_rules() {
    let rules = std::fs::read_to_string(root().join("ops/prometheus/outbox-rules.yml")).unwrap();
    let in_rules: BTreeSet<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|a| a.trim().to_owned())
        .collect();
    assert!(in_rules.len() >= 10, "too few alerts read: {in_rules:?}");
    let guide = std::fs::read_to_string(root().join("docs/guide/src/operations.md")).unwrap();
    let table = guide
        .split_once("### Alerts")
        .map(|(_, rest)| rest)
        .expect("the guide's Alerts section");
    let in_guide: BTreeSet<String> = table
        .lines()
        .take_while(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_owned())
        .collect();
    assert_eq!(
        in_guide, in_rules,
        "the guide's alert table and the rules differ"
    );
}
