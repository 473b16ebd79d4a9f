//! Progress bars of the long test tools (`outbox crash-matrix`, `outbox demo`), drawn on
//! stderr only when both stderr and stdout are terminals: indicatif hides a bar whose terminal
//! is not attended, and a tool whose stdout goes to a file or `tee` prints its plain progress
//! lines there instead of a bar. So a pipe, a file or a CI log gets exactly the lines it always
//! got and no escape codes. The bars have no colour (NO_COLOR has nothing to turn off).
//!
//! A replay or a requeue from the operator CLI is one transaction with its count printed when
//! it ends; those get no bar. Lines a tool prints while its bar is shown go through
//! [`Progress::println`], which clears the bar, prints, and draws it again; log lines go
//! through [`suspend`], which the binary's log writer calls around each line. A bar dropped
//! on an error clears itself.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressFinish, ProgressStyle, WeakProgressBar};

/// The bar on the terminal now, if any (weak: an abandoned bar is not kept alive by it).
static SHOWN: Mutex<Option<WeakProgressBar>> = Mutex::new(None);

/// Runs `write` (a write to stderr) with the bar on the terminal, if any, cleared and drawn
/// again after it: the binary's log writer calls this around every log line.
pub fn suspend(write: &mut dyn FnMut()) {
    let shown = SHOWN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(WeakProgressBar::upgrade);
    match shown {
        Some(bar) => bar.suspend(write),
        None => write(),
    }
}

/// A bar of `len` steps, or nothing drawn when stderr is not a terminal.
#[derive(Debug, Clone)]
pub struct Progress(ProgressBar);

impl Progress {
    /// Starts a bar of `len` steps named `what`, ticking by itself so the elapsed time moves.
    pub fn new(len: u64, what: &str) -> Self {
        let bar = if std::io::stdout().is_terminal() {
            ProgressBar::new(len).with_finish(ProgressFinish::AndClear)
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix} [{elapsed_precise}] [{bar:20}] {pos}/{len} {wide_msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(what.to_owned());
        if !bar.is_hidden() {
            bar.enable_steady_tick(Duration::from_millis(200));
            *SHOWN.lock().unwrap_or_else(|p| p.into_inner()) = Some(bar.downgrade());
        }
        Self(bar)
    }

    /// Whether the bar is drawn (stderr and stdout are terminals).
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
