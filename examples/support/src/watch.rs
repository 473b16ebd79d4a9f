//! The watch over a run's load while it runs ([`LoadWatch`]): on every beat the children are
//! checked and the kill that is due is done (SIGKILL, then a restart with the same arguments),
//! every 2 s a progress line; after the load, the kills it did not reach, the drain, and the
//! verification table's row of the kills.
//!
//! What a run does besides (a slow provider, a re-sent event) stays in each example's loop
//! around [`LoadWatch::beat`].

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::run::Plan;
use crate::supervise::{KillSchedule, Process, Supervisor};
use crate::table::{Check, eq};

/// How long a killed process stays down before its restart, unless it is the API.
const DOWN_FOR: Duration = Duration::from_millis(500);

/// The kills of a run and its progress lines, while the load runs and until it drained.
pub struct LoadWatch {
    schedule: KillSchedule<Process>,
    planned: i64,
    done: i64,
    api: Process,
    last_line: Instant,
}

impl LoadWatch {
    /// The watch over `plan`'s load: `plan.kill_rounds` rounds of `killed`, spread over its
    /// commands ([`KillSchedule`]). `api` is the API the load's clients talk to: it comes back
    /// at once after its kill (its clients are retrying), any other process after a moment down
    /// (500 ms).
    pub fn new(plan: &Plan, killed: &[Process], api: Process) -> Self {
        let schedule = KillSchedule::new(killed, plan.kill_rounds, plan.commands);
        Self {
            planned: schedule.planned() as i64,
            schedule,
            done: 0,
            api,
            last_line: Instant::now(),
        }
    }

    /// One beat of the watch, to repeat until the load ends: 50 ms, the children checked, then
    /// the kill that is due once `done` units of the load are done, if any, with its restart.
    /// Returns the units done.
    ///
    /// # Errors
    /// A child exited on its own, or a kill or a restart failed.
    pub async fn beat(&mut self, sup: &mut Supervisor, done: &AtomicU64) -> Result<u64> {
        tokio::time::sleep(Duration::from_millis(50)).await;
        sup.check_alive()?;
        let done = done.load(Ordering::Relaxed);
        if let Some(process) = self.schedule.due(done) {
            self.kill_and_restart(sup, process).await?;
        }
        Ok(done)
    }

    /// Prints the progress line `line()` when the last one is more than 2 s old.
    pub fn progress(&mut self, sup: &Supervisor, line: impl FnOnce() -> String) {
        if self.last_line.elapsed() > Duration::from_secs(2) {
            self.last_line = Instant::now();
            sup.say(&line());
        }
    }

    /// The kills the load did not reach (a tiny load ends before them), now: the drain still
    /// has to survive them.
    ///
    /// # Errors
    /// A kill or a restart failed.
    pub async fn kill_the_rest(&mut self, sup: &mut Supervisor) -> Result<()> {
        while let Some(process) = self.schedule.next_remaining() {
            self.kill_and_restart(sup, process).await?;
        }
        Ok(())
    }

    /// Waits until everything drained ([`Supervisor::wait_drained`] with `pending`), its
    /// progress lines on this watch's clock.
    ///
    /// # Errors
    /// As [`Supervisor::wait_drained`].
    pub async fn drain<F, Fut>(
        &mut self,
        sup: &mut Supervisor,
        timeout: Duration,
        pending: F,
    ) -> Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Vec<String>>>,
    {
        sup.wait_drained(timeout, &mut self.last_line, pending)
            .await
    }

    /// The verification table's row of the kills: every planned kill done, each process
    /// restarted.
    pub fn check(&self) -> Check {
        eq("processes SIGKILLed and restarted", self.planned, self.done)
    }

    async fn kill_and_restart(&mut self, sup: &mut Supervisor, process: Process) -> Result<()> {
        sup.kill(process).await?;
        self.done += 1;
        if process != self.api {
            tokio::time::sleep(DOWN_FOR).await;
        }
        sup.restart(process).await?;
        Ok(())
    }
}
