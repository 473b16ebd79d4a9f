//! The `outbox relay` process that W6, W7 and `cdc-memory` run: its binary, spawning it,
//! signals, memory.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::process::Child;

/// Fails unless the `outbox` binary `bin` exists.
pub fn check_bin(bin: &Path) -> Result<()> {
    if !bin.exists() {
        bail!(
            "{} does not exist: build it with `cargo build --release -p outbox-cli`, or pass \
             --outbox-bin",
            bin.display()
        );
    }
    Ok(())
}

/// What a relay process runs with.
pub struct RelayCommand<'a> {
    /// The `outbox` binary.
    pub bin: &'a Path,
    /// Its configuration file.
    pub config: &'a Path,
    /// `--database-url`.
    pub database_url: &'a str,
    /// `--broker-url`.
    pub broker_url: &'a str,
    /// The outbox's schema.
    pub schema: &'a str,
    /// Its `RUST_LOG` (its log goes to this process's stderr).
    pub log: &'a str,
}

impl RelayCommand<'_> {
    /// Spawns `outbox relay`, its stdout discarded; killed when the child is dropped.
    pub fn spawn(&self) -> Result<Child> {
        tokio::process::Command::new(self.bin)
            .arg("--config")
            .arg(self.config)
            .args([
                "--database-url",
                self.database_url,
                "--broker-url",
                self.broker_url,
                "--schema",
                self.schema,
                "relay",
            ])
            .env("RUST_LOG", self.log)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", self.bin.display()))
    }
}

/// Sends `signal` (`KILL`, `TERM`) to the relay and waits for it to end.
pub async fn stop(relay: &mut Child, signal: &str) -> Result<()> {
    let pid = relay.id().context("the relay already ended")?;
    let status = tokio::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .await?;
    if !status.success() {
        bail!("kill -{signal} {pid} failed");
    }
    tokio::time::timeout(Duration::from_secs(60), relay.wait())
        .await
        .context("the relay did not end within 60 s")??;
    Ok(())
}

/// Resident memory of process `pid`, MB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_mb(pid: Option<u32>) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}
