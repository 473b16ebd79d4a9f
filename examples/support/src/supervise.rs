//! The parent side of a one-command run: children of this very binary, killed and restarted.
//!
//! [`Supervisor`] starts each [`Process`] as `current_exe <subcommand> <args>` with its log in a
//! file of the run directory, waits for its readiness line ([`crate::child::READY_LINE`], or the
//! stand-in provider's `listening on …`), SIGKILLs it on demand and restarts it with the same
//! arguments, and notices a child that exited on its own. Children are `kill_on_drop` and hold a
//! pipe on their standard input: they stop when the run ends, panics or is killed itself.
//! [`Supervisor::supervise`] is the frame of a run's story around them: started, stopped, the
//! verification table printed.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::child::{PARENT_WATCH_ENV, READY_LINE};
use crate::table::Check;
use crate::topology::Topology;

/// A process of a story: the subcommand of the example's binary that runs it (also its log
/// file's name) and its name in messages (`Display`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Process {
    /// The subcommand, e.g. `reporting`.
    pub subcommand: &'static str,
    /// The name in messages, e.g. `reporting consumer`.
    pub name: &'static str,
}

impl Process {
    /// The process run by `subcommand`, called `name` in messages.
    pub const fn new(subcommand: &'static str, name: &'static str) -> Self {
        Self { subcommand, name }
    }
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// One running child.
struct Proc {
    child: Child,
    /// Held open: the child exits when it closes (this process ended, or [`Supervisor::stop`]).
    stdin: Option<ChildStdin>,
    log: PathBuf,
}

/// The children of a run.
pub struct Supervisor {
    exe: PathBuf,
    dir: PathBuf,
    procs: HashMap<Process, Proc>,
    starts: HashMap<Process, u32>,
    /// The arguments each process was last started with, for its restarts.
    args: HashMap<Process, Vec<String>>,
    started: Instant,
}

impl Supervisor {
    /// Children of this binary, with their logs in `dir` (created).
    ///
    /// # Errors
    /// The directory cannot be created or this binary cannot be found.
    pub fn new(dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Self {
            exe: std::env::current_exe().context("cannot find this binary")?,
            dir,
            procs: HashMap::new(),
            starts: HashMap::new(),
            args: HashMap::new(),
            started: Instant::now(),
        })
    }

    /// The children of the one-command run of `app` (`fintech`, `igaming`), with their logs in
    /// `<temp dir>/<app>-<pid>`, which it prints (the run's `logs` line).
    ///
    /// # Errors
    /// As [`Supervisor::new`].
    pub fn for_run(app: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("{app}-{}", std::process::id()));
        let sup = Self::new(dir)?;
        println!("  logs     {}", sup.dir.display());
        Ok(sup)
    }

    /// The frame of the story of the one-command run of `app`: its children
    /// ([`Supervisor::for_run`]) for `story`, which starts them, runs the load and returns the
    /// checks; then the children are stopped ([`Supervisor::stop`]) and the verification table
    /// printed ([`crate::table::conclude`]). Returns the run's exit status.
    ///
    /// # Errors
    /// The run directory cannot be created, or `story` failed (the children are stopped first).
    pub async fn supervise<F>(app: &str, story: F) -> Result<ExitCode>
    where
        F: AsyncFnOnce(&mut Supervisor) -> Result<Vec<Check>>,
    {
        let mut sup = Self::for_run(app)?;
        let result = story(&mut sup).await;
        sup.stop().await;
        Ok(crate::table::conclude(&result?, sup.dir()))
    }

    /// The run directory (the children's logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts `process` (`current_exe <subcommand> <args>`) and waits for its readiness line,
    /// which it returns. [`Supervisor::restart`] starts it again with the same `args`.
    ///
    /// # Errors
    /// The child cannot be started, exited before it was ready, or was not ready within 30 s
    /// (the error holds the end of its log).
    pub async fn start(&mut self, process: Process, args: Vec<String>) -> Result<String> {
        let n = self.starts.entry(process).or_insert(0);
        *n += 1;
        let log = self.dir.join(format!("{}-{}.log", process.subcommand, n));
        let file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let mut child = Command::new(&self.exe)
            .arg(process.subcommand)
            .args(&args)
            .env(PARENT_WATCH_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start the {process}"))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(line) = lines.next_line().await? {
                if line == READY_LINE || line.starts_with("listening on ") {
                    return anyhow::Ok(Some(line));
                }
            }
            Ok(None)
        })
        .await;
        let line = match ready {
            Ok(Ok(Some(line))) => line,
            Ok(Ok(None)) | Ok(Err(_)) => bail!(
                "the {process} exited before it was ready; its log: {}\n{}",
                log.display(),
                tail(&log)
            ),
            Err(_) => bail!(
                "the {process} was not ready within 30 s; its log: {}\n{}",
                log.display(),
                tail(&log)
            ),
        };
        // Keep reading stdout so the child never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let pid = child.id().unwrap_or(0);
        self.say(&format!("started {process} (pid {pid})"));
        self.procs.insert(process, Proc { child, stdin, log });
        self.args.insert(process, args);
        Ok(line)
    }

    /// Starts `process` again with the arguments of its last [`Supervisor::start`] (after a
    /// [`Supervisor::kill`]).
    ///
    /// # Errors
    /// `process` was never started, or as [`Supervisor::start`].
    pub async fn restart(&mut self, process: Process) -> Result<String> {
        let Some(args) = self.args.get(&process).cloned() else {
            bail!("the {process} was never started");
        };
        self.start(process, args).await
    }

    /// SIGKILLs `process` (no chance to finish anything) and waits for it to be gone.
    ///
    /// # Errors
    /// `process` is not running, or had already exited (the error holds the end of its log).
    pub async fn kill(&mut self, process: Process) -> Result<()> {
        let Some(mut p) = self.procs.remove(&process) else {
            bail!("the {process} is not running");
        };
        if let Ok(Some(status)) = p.child.try_wait() {
            bail!(
                "the {process} had already exited ({status}); its log: {}\n{}",
                p.log.display(),
                tail(&p.log)
            );
        }
        let pid = p.child.id().unwrap_or(0);
        p.child.start_kill().context("cannot kill")?; // SIGKILL on Unix
        p.child.wait().await?;
        self.say(&format!("SIGKILLed {process} (pid {pid})"));
        Ok(())
    }

    /// Fails when a child exited on its own.
    ///
    /// # Errors
    /// The first child found exited, with the end of its log.
    pub fn check_alive(&mut self) -> Result<()> {
        for (process, p) in &mut self.procs {
            if let Ok(Some(status)) = p.child.try_wait() {
                bail!(
                    "the {process} exited on its own ({status}); its log: {}\n{}",
                    p.log.display(),
                    tail(&p.log)
                );
            }
        }
        Ok(())
    }

    /// Closes every child's stdin (they stop gracefully), then kills what is left after a few
    /// seconds.
    pub async fn stop(&mut self) {
        for p in self.procs.values_mut() {
            p.stdin = None;
        }
        for (_, mut p) in self.procs.drain() {
            if tokio::time::timeout(Duration::from_secs(5), p.child.wait())
                .await
                .is_err()
            {
                let _ = p.child.start_kill();
                let _ = p.child.wait().await;
            }
        }
    }

    /// Prints `what` with the time since the run started.
    pub fn say(&self, what: &str) {
        println!("[{:>5.1}s] {what}", self.started.elapsed().as_secs_f64());
    }

    /// Waits until `pending` reports nothing (each call: what is still in flight, one phrase
    /// each), printing progress every 2 s after `last_line`, checking the children meanwhile.
    ///
    /// # Errors
    /// Not drained within `timeout`: the error names what is still pending. A child exited, or
    /// `pending` failed.
    pub async fn wait_drained<F, Fut>(
        &mut self,
        timeout: Duration,
        last_line: &mut Instant,
        mut pending: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Vec<String>>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            let pending = pending().await?;
            if pending.is_empty() {
                self.say("drained: nothing pending");
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "not drained within {timeout:?} after the load: {}; the logs are in {}",
                    pending.join("; "),
                    self.dir.display()
                );
            }
            if last_line.elapsed() > Duration::from_secs(2) {
                *last_line = Instant::now();
                self.say(&format!("draining: {}", pending.join("; ")));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// When to kill what: `rounds` rounds of `kinds`, spread evenly over `total` units of load
/// (kill `k` of `n` after `total·(k+1)/(n+2)` units).
#[derive(Debug, Clone)]
pub struct KillSchedule<K> {
    /// Still to come, the next one last.
    pending: Vec<(u64, K)>,
    planned: usize,
}

impl<K: Copy> KillSchedule<K> {
    /// The schedule of `rounds` rounds of `kinds` over `total` units.
    pub fn new(kinds: &[K], rounds: u32, total: u64) -> Self {
        let planned = kinds.len() as u32 * rounds;
        let mut pending: Vec<(u64, K)> = (0..planned)
            .map(|k| {
                let at = total * u64::from(k + 1) / u64::from(planned + 2);
                (at, kinds[(k as usize) % kinds.len()])
            })
            .collect();
        pending.reverse();
        Self {
            pending,
            planned: planned as usize,
        }
    }

    /// Kills planned in all.
    pub fn planned(&self) -> usize {
        self.planned
    }

    /// The next kind to kill once `done` units of load are done, if one is due.
    pub fn due(&mut self, done: u64) -> Option<K> {
        match self.pending.last() {
            Some(&(at, kind)) if done >= at => {
                self.pending.pop();
                Some(kind)
            }
            _ => None,
        }
    }

    /// The next kill not reached, whatever the load (a tiny load ends before them).
    pub fn next_remaining(&mut self) -> Option<K> {
        self.pending.pop().map(|(_, kind)| kind)
    }
}

/// The last lines of a log, for an error message.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(15);
    lines[from..].join("\n")
}

/// The options of an example's service processes (its `Common` options) in a run: the
/// `databases` (`("--payments-url", url)`, …), then `--broker-url <broker_url> --name <the
/// deployment's name> --fast`.
pub fn service_args(
    databases: &[(&str, &str)],
    broker_url: &str,
    topology: &Topology,
) -> Vec<String> {
    let mut args = Vec::new();
    for (flag, value) in databases {
        args.extend([flag.to_string(), value.to_string()]);
    }
    args.extend(
        [
            "--broker-url",
            broker_url,
            "--name",
            topology.name(),
            "--fast",
        ]
        .map(String::from),
    );
    args
}

/// A child's arguments: `flags` (`--flag`, `value`, …), then `common`.
pub fn child_args(flags: &[&str], common: &[String]) -> Vec<String> {
    flags
        .iter()
        .map(|f| f.to_string())
        .chain(common.iter().cloned())
        .collect()
}

/// A free local port (bound, then released for a child, which binds it again after each
/// restart).
///
/// # Errors
/// No port can be bound.
pub fn free_addr() -> Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(l.local_addr()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kills_are_spread_over_the_load_in_order() {
        let mut s = KillSchedule::new(&['a', 'b'], 2, 60);
        assert_eq!(s.planned(), 4);
        assert_eq!(s.due(9), None);
        assert_eq!(s.due(10), Some('a'));
        assert_eq!(s.due(10), None);
        assert_eq!(s.due(45), Some('b'));
        assert_eq!(s.due(45), Some('a'));
        assert_eq!(s.next_remaining(), Some('b'));
        assert_eq!(s.next_remaining(), None);
    }
}
