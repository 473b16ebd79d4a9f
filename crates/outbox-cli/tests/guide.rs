//! The guide (`docs/guide`, an mdBook): it builds with the pinned mdBook, every chapter of its
//! SUMMARY.md exists and is compiled as a doctest of the `outbox` crate (its Rust blocks are
//! tested, not pasted: crates/outbox/src/lib.rs), and no relative link of the guide or of the
//! README points to a missing file or to a heading the target does not have.
//! The mdbook binary comes from `scripts/mdbook` (run by `scripts/services`), which installs the version pinned there into
//! /var/cache/outbox (or $OUTBOX_CACHE_DIR); a missing binary fails the test, it never skips.
#![allow(missing_docs)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The mdbook binary `scripts/mdbook` installs (`scripts/services` runs it): its path comes from
/// the script, so the two cannot drift apart.
fn mdbook() -> PathBuf {
    let out = Command::new("bash")
        .arg(root().join("scripts/mdbook"))
        .arg("bin")
        .output()
        .expect("running scripts/mdbook bin");
    assert!(out.status.success(), "scripts/mdbook bin: {out:?}");
    let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(
        bin.is_file(),
        "mdbook is not installed at {}: run `bash scripts/services`, which installs it (cargo \
         install, once, into the cache)",
        bin.display()
    );
    bin
}

/// The chapters SUMMARY.md lists (paths relative to docs/guide/src).
fn chapters() -> Vec<String> {
    let summary = read(&root().join("docs/guide/src/SUMMARY.md"));
    let out: Vec<String> = summary
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("](")?;
            let (target, _) = rest.split_once(')')?;
            Some(target.to_owned())
        })
        .collect();
    assert!(
        out.len() >= 15,
        "SUMMARY.md lists too few chapters: {out:?}"
    );
    out
}

/// Code fences toggle; lines inside them are not Markdown.
fn outside_code(text: &str) -> Vec<&str> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence {
            out.push(line);
        }
    }
    out
}

/// A file's Markdown with mdBook's `{{#include path}}` lines replaced by the included file.
fn expanded(path: &Path) -> String {
    let text = read(path);
    let mut out = String::new();
    for line in text.lines() {
        match line
            .trim()
            .strip_prefix("{{#include ")
            .and_then(|r| r.strip_suffix("}}"))
        {
            Some(inc) => out.push_str(&read(&path.parent().unwrap().join(inc.trim()))),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The anchors mdBook (and GitHub) give the headings of `text`: lower case, letters, digits,
/// `-` and `_` kept, white space as `-`, everything else dropped.
fn anchors(text: &str) -> BTreeSet<String> {
    outside_code(text)
        .into_iter()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .chars()
                .filter_map(|c| {
                    if c.is_alphanumeric() || c == '_' || c == '-' {
                        Some(c.to_ascii_lowercase())
                    } else if c.is_whitespace() {
                        Some('-')
                    } else {
                        None
                    }
                })
                .collect()
        })
        .collect()
}

/// The link targets of `text` (`[x](target)`, `![x](target)`), outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in outside_code(text) {
        // Inline code spans are not links.
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let tail = &rest[at + 2..];
            let Some(end) = tail.find(')') else { break };
            out.push(tail[..end].trim().to_owned());
            rest = &tail[end..];
        }
    }
    out
}

#[test]
fn the_guide_builds_with_mdbook() {
    let bin = mdbook();
    let dest = std::env::temp_dir().join(format!("outbox-guide-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dest);
    let out = Command::new(&bin)
        .arg("build")
        .arg(root().join("docs/guide"))
        .arg("--dest-dir")
        .arg(&dest)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "mdbook build docs/guide failed:\n{log}"
    );
    // mdBook reports a broken {{#include}} or a missing file as an error but may still exit 0.
    assert!(
        !log.contains("ERROR"),
        "mdbook build docs/guide reported errors:\n{log}"
    );
    for chapter in chapters() {
        let html = dest.join(Path::new(&chapter).with_extension("html"));
        assert!(html.is_file(), "the book has no page for {chapter}");
    }
    let security = read(&dest.join("security.html"));
    assert!(
        security.contains("Least privilege"),
        "the security chapter does not include docs/security.md"
    );
    std::fs::remove_dir_all(&dest).unwrap();
}

#[test]
fn every_chapter_exists_and_is_compiled_as_a_doctest() {
    let src = root().join("docs/guide/src");
    let lib = read(&root().join("crates/outbox/src/lib.rs"));
    for chapter in chapters() {
        assert!(
            src.join(&chapter).is_file(),
            "SUMMARY.md lists {chapter}, which does not exist"
        );
        let include = format!("include_str!(\"../../../docs/guide/src/{chapter}\")");
        assert!(
            lib.contains(&include),
            "{chapter} is not compiled as a doctest: add `#[doc = {include}] mod …` to the \
             cfg(doctest) module of crates/outbox/src/lib.rs"
        );
    }
    // Every Markdown file of the guide is a chapter (a file left out of SUMMARY.md is not
    // published).
    let listed: BTreeSet<String> = chapters().into_iter().collect();
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") && name != "SUMMARY.md" {
            assert!(listed.contains(&name), "{name} is not in SUMMARY.md");
        }
    }
}

#[test]
fn no_relative_link_of_the_guide_or_the_readme_is_broken() {
    let root = root();
    let mut files = vec![root.join("README.md")];
    let src = root.join("docs/guide/src");
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = expanded(file);
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !resolved.exists() {
                broken.push(format!("{}: {target} (no such file)", file.display()));
                continue;
            }
            // mdBook publishes only what is under src: a chapter's link out of it is dead in
            // the built book (name such files as code instead).
            if file.starts_with(&src)
                && !resolved
                    .canonicalize()
                    .is_ok_and(|r| r.starts_with(src.canonicalize().unwrap()))
            {
                broken.push(format!(
                    "{}: {target} (outside the book's src: dead in the built guide)",
                    file.display()
                ));
            }
            if let Some(anchor) = anchor
                && resolved.extension().is_some_and(|e| e == "md")
                && !anchors(&expanded(&resolved)).contains(anchor)
            {
                broken.push(format!("{}: {target} (no such heading)", file.display()));
            }
        }
        for line in read(file).lines() {
            if let Some(inc) = line
                .trim()
                .strip_prefix("{{#include ")
                .and_then(|r| r.strip_suffix("}}"))
                && !file.parent().unwrap().join(inc.trim()).is_file()
            {
                broken.push(format!("{}: {{{{#include {inc}}}}}", file.display()));
            }
        }
    }
    assert!(
        checked >= 50,
        "too few links found ({checked}): is the scan broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
