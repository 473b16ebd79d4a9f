//! A supervised child process of the system under test: started with its crash point armed
//! (first start only), stopped, signalled, and its log read.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::cells::{Action, Role};
use super::env::Env;

/// A supervised child process.
pub(super) struct Proc {
    pub(super) role: Role,
    pub(super) label: String,
    pub(super) args: Vec<String>,
    pub(super) crash: Option<(String, u64, Action)>,
    pub(super) child: Option<Child>,
    pub(super) starts: u32,
    pub(super) lines: Arc<Mutex<Vec<String>>>,
    pub(super) log_dir: PathBuf,
}

impl Proc {
    pub(super) fn new(logs: &Path, role: Role, label: &str, args: Vec<String>) -> Self {
        Self {
            role,
            label: label.to_owned(),
            args,
            crash: None,
            child: None,
            starts: 0,
            lines: Arc::default(),
            log_dir: logs.to_owned(),
        }
    }

    /// Waits until the process's log has a line containing `needle`.
    pub(super) async fn wait_for_log(&self, needle: &str, limit: Duration) -> Result<()> {
        let log = self.log_dir.join(format!("{}.log", self.label));
        let deadline = Instant::now() + limit;
        while count_in_log(&log, needle) == 0 {
            if Instant::now() > deadline {
                bail!(
                    "{} did not log `{needle}` within {limit:?}; the end of its log: {}",
                    self.label,
                    log_tail(&log, 5)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    pub(super) async fn start(&mut self, env: &Env) -> Result<()> {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_dir.join(format!("{}.log", self.label)))?;
        let mut cmd = Command::new(&env.exe);
        cmd.args(&self.args)
            .env("OUTBOX_DATABASE_URL", &env.db_url)
            .env("OUTBOX_BROKER_URL", &env.broker_url)
            .env("OUTBOX_SCHEMA", env.schema.as_str())
            .env("OUTBOX_CONFIG", env.log_dir.join("outbox.toml"))
            // The relay engine's batch lines too: what a relay did when a cell fails.
            .env(
                "RUST_LOG",
                "info,sqlx=warn,pgwire_replication=off,outbox_core::relay=debug",
            )
            .env_remove("DATABASE_URL")
            .env_remove(outbox_core::crash::CRASH_POINT_ENV)
            .env_remove(outbox_core::crash::CRASH_SKIP_ENV)
            .env_remove(outbox_core::crash::CRASH_ACTION_ENV)
            .env_remove(crate::demo::ACK_BEFORE_COMMIT_ENV)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        if self.role == Role::Consumer && env.break_ack {
            cmd.env(crate::demo::ACK_BEFORE_COMMIT_ENV, "1");
        }
        // Armed only on the first start: the restarted process runs clean.
        if self.starts == 1
            && let Some((point, skip, action)) = &self.crash
        {
            cmd.env(outbox_core::crash::CRASH_POINT_ENV, point)
                .env(outbox_core::crash::CRASH_SKIP_ENV, skip.to_string());
            if *action == Action::Stop {
                cmd.env(outbox_core::crash::CRASH_ACTION_ENV, "stop");
            }
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", self.label))?;
        let stdout = child.stdout.take().expect("piped");
        let lines = Arc::clone(&self.lines);
        tokio::spawn(async move {
            let mut r = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = r.next_line().await {
                lines.lock().unwrap().push(l);
            }
        });
        self.child = Some(child);
        Ok(())
    }

    /// `Some(status)` once the process ended.
    pub(super) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut()?;
        match c.try_wait() {
            Ok(Some(s)) => {
                self.child = None;
                Some(s)
            }
            _ => None,
        }
    }

    pub(super) fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = std::process::Command::new("kill")
                .args([sig, &pid.to_string()])
                .status();
        }
    }

    /// Whether the process is frozen by SIGSTOP.
    pub(super) fn is_stopped(&self) -> bool {
        let Some(pid) = self.pid() else { return false };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    }

    pub(super) async fn stop(&mut self) {
        if self.child.is_none() {
            return;
        }
        self.signal("-CONT");
        self.signal("-TERM");
        if let Some(c) = self.child.as_mut()
            && tokio::time::timeout(Duration::from_secs(5), c.wait())
                .await
                .is_err()
        {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
        self.child = None;
    }
}

pub(super) fn aborted(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(6)
}

pub(super) fn is_kill(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(9)
}

/// The last `n` lines of a log that are not debug output, joined by ` | `.
pub(super) fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("DEBUG") && !l.contains("TRACE"))
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

pub(super) fn count_in_log(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().filter(|l| l.contains(needle)).count())
        .unwrap_or(0)
}
