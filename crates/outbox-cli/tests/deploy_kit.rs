//! The deployment kit (`ops/systemd`, `ops/container`): the systemd unit passes
//! `systemd-analyze verify` with this build of the binary at the unit's path, and every
//! command line the unit, the container file and the settings example hand to the binary is
//! one it accepts (each run with `--help` appended: clap refuses an unknown command or flag
//! before it prints help). `systemd-analyze` comes from Debian's systemd package, which
//! `scripts/services` installs when missing; a missing one fails the test.
#![allow(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The installed binary's path in the unit and the container file.
const INSTALLED: &str = "/usr/local/bin/outbox";

/// Runs the binary with `args` and `--help`; fails the test, naming `what`, if it refuses them.
fn accepts(what: &str, args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(args)
        .arg("--help")
        .env_remove("OUTBOX_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{what}: `outbox {}` is refused: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A directory of its own under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let path = std::env::temp_dir().join(format!("outbox-deploy-kit-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `Key=` values of `unit` (systemd's `Key=value` lines, in order).
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
fn the_systemd_unit_verifies_with_this_binary_installed() {
    let unit = "outbox-relay.service";
    let tree = TempDir::new();
    let at = |p: &str| tree.path().join(p.trim_start_matches('/'));
    // A root holding the system's units (what the unit's dependencies name), the unit and the
    // binary where the unit says it is.
    for dir in ["etc/systemd/system", "usr/local/bin", "usr/lib/systemd"] {
        std::fs::create_dir_all(at(dir)).unwrap();
    }
    let copied = Command::new("cp")
        .args(["-a", "/usr/lib/systemd/system"])
        .arg(at("usr/lib/systemd"))
        .status()
        .unwrap();
    assert!(copied.success(), "copying /usr/lib/systemd/system");
    std::fs::copy(
        root().join("ops/systemd").join(unit),
        at("etc/systemd/system").join(unit),
    )
    .unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_outbox"), at(INSTALLED)).unwrap();

    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", tree.path().display()))
        .arg(unit)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "systemd-analyze is required (Debian's systemd package; scripts/services installs it): {e}"
            )
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // It exits 0 on what it ignores (an unknown key, a bad value): nothing may be said.
    assert!(out.status.success() && said.trim().is_empty(), "{said}");

    // The check can fail: without the binary the unit is refused.
    std::fs::remove_file(at(INSTALLED)).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", tree.path().display()))
        .arg(unit)
        .output()
        .unwrap();
    assert!(!out.status.success(), "a missing binary must be refused");
}

#[test]
fn the_units_commands_are_the_binarys() {
    let unit = read("ops/systemd/outbox-relay.service");
    let lines: Vec<&str> = ["ExecStart", "ExecStartPost"]
        .iter()
        .flat_map(|k| unit_values(&unit, k))
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in lines {
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some(INSTALLED), "{line}");
        let args: Vec<&str> = words.collect();
        accepts("ops/systemd/outbox-relay.service", &args);
    }
    // The start waits for readiness, asked where the relay serves it: the same settings (the
    // environment file, and the same config file, which may hold `metrics_addr`).
    let config_of = |key: &str| {
        let line = unit_values(&unit, key)[0];
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "--config");
        (words[1], at.map(|i| words[i + 1]))
    };
    let (command, config) = config_of("ExecStartPost");
    assert_eq!(command, "ready");
    assert!(config.is_some(), "ExecStartPost names no --config");
    assert_eq!(config_of("ExecStart"), ("relay", config));

    // Every setting of the example environment file is one the relay reads.
    let help = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["relay", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    let example = read("ops/systemd/relay.env.example");
    let names: Vec<&str> = example
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_once('=').map_or(l, |(name, _)| name))
        .collect();
    assert!(names.len() >= 4, "{names:?}");
    for name in names {
        assert!(
            help.contains(&format!("[env: {name}")),
            "ops/systemd/relay.env.example sets {name}, which `outbox relay` does not read:\n{help}"
        );
    }
}

#[test]
fn the_container_files_commands_are_the_binarys() {
    let file = read("ops/container/Containerfile");
    // The exec forms: ["/usr/local/bin/outbox", "a", ...].
    let exec_form = |instruction: &str| -> Vec<String> {
        let at = file
            .find(instruction)
            .unwrap_or_else(|| panic!("no {instruction} in the container file"));
        let rest = &file[at + instruction.len()..];
        let open = rest.find('[').unwrap();
        let close = open + rest[open..].find(']').unwrap();
        serde_json::from_str(&rest[open..=close])
            .unwrap_or_else(|e| panic!("{instruction}: not an exec form: {e}"))
    };
    let entrypoint = exec_form("\nENTRYPOINT ");
    assert_eq!(entrypoint, [INSTALLED]);
    let cmd = exec_form("\nCMD ");
    let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
    accepts("ENTRYPOINT + CMD", &args);
    let check = exec_form("\nHEALTHCHECK ");
    assert_eq!(check, [INSTALLED, "ready"]);
    accepts("HEALTHCHECK", &["ready"]);
    // The image's settings are the binary's.
    for line in file.lines().filter(|l| l.contains("OUTBOX_")) {
        let name = line
            .split(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .find(|w| w.starts_with("OUTBOX_"))
            .unwrap();
        let help = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["relay", "--help"])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&help.stdout).contains(&format!("[env: {name}")),
            "the container file names {name}, which `outbox relay` does not read"
        );
    }
}
