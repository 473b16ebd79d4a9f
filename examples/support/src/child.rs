//! The child side of a one-command run: each service process is a child of the run's own
//! binary. It prints [`READY_LINE`] once it serves, and, under a run ([`PARENT_WATCH_ENV`]),
//! stops when its standard input closes, so no child outlives its parent, even a parent that
//! was SIGKILLed itself.

use std::future::Future;
use std::process::ExitCode;

use tokio_util::sync::CancellationToken;

/// Set by the run on its children: a child exits when its standard input closes.
pub const PARENT_WATCH_ENV: &str = "OUTBOX_EXAMPLE_PARENT_WATCH";
/// The line a child prints on stdout once it serves (listening, connected to the broker).
pub const READY_LINE: &str = "ready";

/// Prints [`READY_LINE`] on stdout for the parent.
pub fn announce_ready() {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{READY_LINE}");
    let _ = out.flush();
}

/// Under a run ([`PARENT_WATCH_ENV`]): cancels `shutdown` when standard input reaches its end,
/// which happens when the parent exits or dies, and exits the process 3 s later regardless.
pub fn watch_parent(shutdown: CancellationToken) {
    if std::env::var(PARENT_WATCH_ENV).as_deref() != Ok("1") {
        return;
    }
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        tracing::warn!("parent gone (stdin closed): stopping");
        shutdown.cancel();
        // Give the graceful path a moment, then leave regardless.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        std::process::exit(1);
    });
}

/// A service process's shutdown token: cancelled on SIGTERM / Ctrl-C and, under a run, when the
/// parent is gone ([`watch_parent`]). Call inside the runtime.
pub fn service_shutdown() -> CancellationToken {
    let shutdown = CancellationToken::new();
    tokio::spawn(outbox::cancel_on_signal(shutdown.clone()));
    watch_parent(shutdown.clone());
    shutdown
}

/// Logs to stderr; `RUST_LOG` overrides the default level. Colour only when stderr is a
/// terminal and `NO_COLOR` is not set: a child's log goes to a file of the run directory,
/// which must stay plain text.
pub fn init_logging() {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=error,lapin=warn,async_nats=warn"));
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .try_init();
}

/// The body of an example's `main`: logging, a multi-threaded runtime, `work` on it, and the
/// error printed as `<program>: error: …` with a failure status.
pub fn run_main<F>(program: &str, work: F) -> ExitCode
where
    F: Future<Output = anyhow::Result<ExitCode>>,
{
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{program}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(work);
    // Not waiting for blocking tasks: the parent watch's read of stdin never ends on its own.
    runtime.shutdown_background();
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{program}: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a service's engine (`work`, a consumer's or relay's `run`): logs `<what> started`,
/// announces readiness, awaits `work`, logs `<what> stopped`.
pub async fn serve_until_stopped<F: Future<Output = ()>>(what: &str, work: F) {
    tracing::info!("{what} started");
    announce_ready();
    work.await;
    tracing::info!("{what} stopped");
}
