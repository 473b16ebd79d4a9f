//! Progress bars of the long test tools (`outbox crash-matrix`, `outbox demo`), drawn on
//! stderr only when stderr is a terminal: indicatif hides a bar whose terminal is not attended,
//! so a pipe, a file or a CI log gets exactly the lines it always got and no escape codes. The
//! bars have no colour (NO_COLOR has nothing to turn off).
//!
//! A replay or a requeue from the operator CLI is one transaction with its count printed when
//! it ends; those get no bar. Lines a tool prints while its bar is shown go through
//! [`Progress::println`], which clears the bar, prints, and draws it again.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `len` steps, or nothing drawn when stderr is not a terminal.
#[derive(Debug, Clone)]
pub struct Progress(ProgressBar);

impl Progress {
    /// Starts a bar of `len` steps named `what`, ticking by itself so the elapsed time moves.
    pub fn new(len: u64, what: &str) -> Self {
        let bar = ProgressBar::new(len);
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] [{bar:32}] {pos}/{len} {wide_msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(what.to_owned());
        bar.enable_steady_tick(Duration::from_millis(200));
        Self(bar)
    }

    /// Whether the bar is drawn (stderr is a terminal).
    pub fn is_shown(&self) -> bool {
        !self.0.is_hidden()
    }

    /// Prints `line` on stdout, above the bar when it is drawn.
    pub fn println(&self, line: &str) {
        self.0.suspend(|| println!("{line}"));
    }

    /// The number of steps (it may grow while the work does).
    pub fn set_length(&self, len: u64) {
        self.0.set_length(len);
    }

    /// One step done.
    pub fn inc(&self) {
        self.0.inc(1);
    }

    /// Steps done so far, and what is going on.
    pub fn set(&self, done: u64, message: String) {
        self.0.set_position(done);
        self.0.set_message(message);
    }

    /// What is going on now.
    pub fn message(&self, message: String) {
        self.0.set_message(message);
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}
