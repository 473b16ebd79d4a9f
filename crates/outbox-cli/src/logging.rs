//! Log output that cannot carry the process's secrets.
//!
//! The toolkit's own code logs only redacted URLs ([`outbox::secrets::redact_url`], with the
//! URL rules each backend declares), and
//! the NATS crates hand credentials to the client through options, not inside addresses. This
//! module is the safety net for text the toolkit does not format: a client library's debug line
//! that prints its connection address, an error message that quotes its input. Every secret
//! the process was given (passwords, tokens and sensitive query values of the database, broker
//! and provider URLs, from flags, environment or the config file, and `PGPASSWORD`) is masked
//! in every log line and in the final error message, at every level.

use std::io::{self, Write};
use std::sync::{Arc, OnceLock};

use outbox_core::secrets::Scrubber;
use tracing_subscriber::fmt::MakeWriter;

/// The default log filter: the toolkit's own targets at info (`outbox` is the binary's and
/// the audit log's), every other crate at warn, pgwire-replication off (see `main`).
pub const DEFAULT_FILTER: &str = "warn,outbox=info,outbox_core=info,outbox_postgres=info,\
    outbox_nats=info,outbox_rabbitmq=info,outbox_kafka=info,outbox_http=info,\
    outbox_console=info,outbox_harness=info,pgwire_replication=off";

/// What every log line's write to stderr runs inside, when set: the test tools' progress bar
/// clears itself around it (`outbox_harness::suspend_progress`), so a log line never lands in
/// the middle of a bar. Unset in a production build.
static AROUND_WRITES: OnceLock<fn(&mut dyn FnMut())> = OnceLock::new();

/// Makes every later log line's write run inside `around` (once; a later call is ignored).
#[cfg_attr(not(feature = "harness"), allow(dead_code))]
pub fn around_writes(around: fn(&mut dyn FnMut())) {
    let _ = AROUND_WRITES.set(around);
}

/// Whether log lines may carry colour codes: only when stderr is a terminal and `NO_COLOR`
/// (<https://no-color.org>) is not set, so that a pipe or a log file never gets escape codes.
pub fn colour() -> bool {
    use std::io::IsTerminal as _;
    io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The environment variables whose URLs may reach a client library without passing the CLI's
/// flags (clap reads the `OUTBOX_*` ones into flags; these are read elsewhere).
const URL_VARIABLES: &[&str] = &[
    "DATABASE_URL",
    "OUTBOX_DATABASE_URL",
    "OUTBOX_BROKER_URL",
    "OUTBOX_PROVIDER_URL",
];

/// Builds the scrubber from every URL the process may use, plus `PGPASSWORD`. The secrets of a
/// URL are what the rules of its backend say they are ([`outbox::secrets::redactor`]): a user
/// name its protocol shows is not masked wherever it occurs.
pub fn scrubber<'a>(urls: impl IntoIterator<Item = &'a str>) -> Scrubber {
    let mut s = Scrubber::new(outbox::secrets::redactor());
    for url in urls {
        s.add_url(url);
    }
    for var in URL_VARIABLES {
        if let Ok(url) = std::env::var(var) {
            s.add_url(&url);
        }
    }
    if let Ok(pw) = std::env::var("PGPASSWORD") {
        s.add_secret(&pw);
    }
    s
}

/// A [`MakeWriter`] for stderr that masks the scrubber's secrets in each event before it is
/// written. One event is buffered whole (the formatter writes it in one go) and written when
/// the writer is dropped, so a secret can never straddle two writes.
#[derive(Clone)]
pub struct ScrubbingStderr {
    scrubber: Arc<Scrubber>,
}

impl ScrubbingStderr {
    /// Writes to stderr through `scrubber`.
    pub fn new(scrubber: Arc<Scrubber>) -> Self {
        Self { scrubber }
    }
}

/// One event's buffer; see [`ScrubbingStderr`].
pub struct EventBuffer {
    scrubber: Arc<Scrubber>,
    buf: Vec<u8>,
}

impl Write for EventBuffer {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for EventBuffer {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.buf);
        let clean = self.scrubber.scrub(&text);
        let mut write = || {
            let mut err = io::stderr().lock();
            let _ = err.write_all(clean.as_bytes());
            let _ = err.flush();
        };
        match AROUND_WRITES.get() {
            Some(around) => around(&mut write),
            None => write(),
        }
    }
}

impl<'a> MakeWriter<'a> for ScrubbingStderr {
    type Writer = EventBuffer;

    fn make_writer(&'a self) -> Self::Writer {
        EventBuffer {
            scrubber: Arc::clone(&self.scrubber),
            buf: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_their_secrets_are_collected() {
        let s = scrubber([
            "postgres://app:pg-s3cret@db/pay?password=q-s3cret",
            "nats://t0ken@n",
        ]);
        assert_eq!(s.scrub("pg-s3cret q-s3cret t0ken db"), "*** *** *** db");
    }
}
