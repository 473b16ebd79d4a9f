//! What every backend harness provides, and the runner that gives each case a fresh harness and
//! removes its broker resources afterwards, whether the case passed, failed or panicked.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt as _;

/// The part common to every harness: one test's private broker resources (stream, subjects,
/// exchange, queue ...), created when the harness is built.
pub trait Harness: Send + Sync + 'static {
    /// The address of the real broker, e.g. [`env::NATS`](crate::env::NATS)`.url()`.
    fn broker_url(&self) -> String;

    /// `host:port` of [`Harness::broker_url`], the upstream of a
    /// [`Proxy`](crate::net::Proxy).
    ///
    /// # Errors
    /// When the URL names no host and port.
    fn broker_addr(&self) -> anyhow::Result<String> {
        crate::env::host_port(&self.broker_url())
    }

    /// A [`Proxy`](crate::net::Proxy) for the outage cases: once it is cut or stalled, no
    /// client that connected through it reaches the broker. By default one in front of
    /// [`Harness::broker_addr`]. A broker whose clients go on to the addresses it advertises
    /// (Kafka: the bootstrap address only serves the cluster's metadata) overrides it with a
    /// private broker that advertises the proxy, and serves the case from that broker.
    ///
    /// # Errors
    /// When the proxy (or the private broker) cannot be started.
    fn outage_proxy(&self) -> impl Future<Output = anyhow::Result<crate::net::Proxy>> + Send {
        async move { crate::net::Proxy::start(self.broker_addr()?).await }
    }

    /// Deletes this harness's broker resources.
    ///
    /// # Errors
    /// When the broker refused or could not be reached; the test then fails.
    fn cleanup(&self) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Longest one case may run: every wait inside a case is bounded far below this, so reaching
/// it means a call never returned.
pub const CASE_TIMEOUT: Duration = Duration::from_secs(300);

/// Builds a harness with `start`, runs `case` on it (at most for [`CASE_TIMEOUT`]), then [`Harness::cleanup`]s, and fails the
/// test (panics) with the case's error, its panic, or the cleanup's error.
///
/// A harness that cannot be built (the service is down) fails the test too: tests never skip.
pub async fn run<H, C>(start: impl Future<Output = anyhow::Result<H>>, case: C)
where
    H: Harness,
    C: AsyncFnOnce(&H) -> anyhow::Result<()>,
{
    let harness = match start.await {
        Ok(harness) => harness,
        Err(e) => panic!("cannot set up the test harness: {e:#}"),
    };
    let outcome = AssertUnwindSafe(async {
        tokio::time::timeout(CASE_TIMEOUT, case(&harness))
            .await
            .unwrap_or_else(|_| {
                Err(anyhow::anyhow!(
                    "the case did not finish within {CASE_TIMEOUT:?}: a broker call hangs"
                ))
            })
    })
    .catch_unwind()
    .await;
    let cleaned = harness.cleanup().await;
    match outcome {
        Ok(Ok(())) => {
            if let Err(e) = cleaned {
                panic!("the case passed, but cleaning up its broker resources failed: {e:#}");
            }
        }
        Ok(Err(e)) => {
            if let Err(c) = cleaned {
                eprintln!("cleaning up after the failure failed too: {c:#}");
            }
            panic!("{e:#}");
        }
        Err(panic) => {
            if let Err(c) = cleaned {
                eprintln!("cleaning up after the panic failed too: {c:#}");
            }
            std::panic::resume_unwind(panic);
        }
    }
}

/// Expands to one `#[tokio::test]` per case of suite module `$suite`, each running the case on
/// a fresh harness from `$start` with [`run`]. Used by the suite macros.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($suite:ident, $start:expr; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::harness::run($start(), $crate::$suite::$case).await;
            }
        )+
    };
}
