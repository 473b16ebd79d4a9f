//! A private Kafka-protocol broker for outage tests: the tansu binary that
//! `scripts/kafka-broker` installs, started in memory on a local port and advertising another
//! address (a proxy's).
//!
//! A Kafka client reaches brokers at the addresses the cluster advertises, not at the address
//! it bootstrapped from, so a proxy in front of the shared broker would only carry the first
//! metadata request. A private broker that advertises the proxy sends every connection of every
//! client through it; cutting the proxy is then a real outage, and the shared broker is never
//! touched.

use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use tokio::process::Child;
use uuid::Uuid;

/// The tansu binary: `OUTBOX_TEST_TANSU`, else the one `scripts/kafka-broker bin` names.
///
/// # Errors
/// When the script fails (tansu is not installed: `bash scripts/kafka-broker install`).
pub fn binary() -> anyhow::Result<String> {
    if let Ok(path) = std::env::var("OUTBOX_TEST_TANSU") {
        return Ok(path);
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/kafka-broker");
    let out = std::process::Command::new("bash")
        .args([script, "bin"])
        .output()
        .context("running scripts/kafka-broker bin")?;
    anyhow::ensure!(
        out.status.success(),
        "scripts/kafka-broker bin: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// A private in-memory broker listening on a local port and advertising another address (a
/// proxy's). Killed when dropped.
pub struct PrivateBroker {
    _child: Child,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl PrivateBroker {
    /// Starts tansu on `listen` (`127.0.0.1:port`) advertising `advertised` (`host:port`), and
    /// waits until it accepts connections.
    ///
    /// # Errors
    /// When the binary cannot be found or started, or does not listen within 10 s.
    pub async fn start(listen: &str, advertised: &str) -> anyhow::Result<Self> {
        let binary = binary()?;
        let dir = std::env::temp_dir().join(format!("outbox-tansu-{}", Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir)?;
        // Removed again if the start fails below.
        let dir = TempDir(dir);
        let child = tokio::process::Command::new(&binary)
            .current_dir(&dir.0)
            .env_remove("SCHEMA_REGISTRY")
            .env_remove("DATA_LAKE")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("ICEBERG_CATALOG")
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://{listen}"),
                "--advertised-listener-url",
                &format!("tcp://{advertised}"),
                "--storage-engine",
                "memory://tansu/",
                "--cluster-id",
                "outbox-private",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {binary}"))?;
        let broker = Self {
            _child: child,
            _dir: dir,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(listen).await.is_err() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the private broker does not listen on {listen} after 10 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(broker)
    }
}

/// A local port nobody listens on (bound, then released).
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
