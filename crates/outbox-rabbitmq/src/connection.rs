//! The link to the broker, shared by [`crate::RabbitTransport`] and [`crate::RabbitSource`]:
//! everything about reaching RabbitMQ and staying connected that does not depend on what a side
//! does on its connection, and what fails at startup ([`RabbitConnectError`]).
//!
//! This module owns:
//!
//! * [`Connector`]: the parsed URL, its `host:port/vhost` endpoint ([`endpoint_of`], never the
//!   credentials), the TLS configuration read once at startup ([`RabbitTls`]), the
//!   connection name and the two timings (`connect_timeout_secs`, `reconnect_min_delay_ms`).
//!   It opens connections, each bounded by the connect timeout, and maps what fails to
//!   [`RabbitConnectError`];
//! * [`Link`]: one connection, the channel a side works on and what the side keeps beside them
//!   ([`Session::Parts`]), with the flags that retire it (`usable`, `mark_broken`,
//!   `mark_channel_failed`);
//! * [`ReconnectState`] and [`Connector::repair`]: how a link that is no longer usable is
//!   replaced;
//! * [`connection_level`]: which lapin errors mean that the connection, not only a channel, is
//!   gone.
//!
//! What a side opens on a connection is its [`Session`]: the transport a channel in
//! publisher-confirm mode and the exchange, the delivery source a channel, its queue and a
//! consumer. Publishing, consuming and acknowledging stay in `transport.rs` and `source.rs`.
//!
//! # Reconnecting
//!
//! lapin's automatic recovery is not used (it would replay publishes behind the relay's back).
//! A link is replaced lazily, by the next call that needs one:
//!
//! * the channel was closed (a channel-level error, a consumer cancelled by the broker) while
//!   the connection is fine: the side's channel is reopened on the same connection at once,
//!   bounded by the connect timeout. A step the broker refuses there (e.g. the queue is gone)
//!   is reported as such, since trying again at once would fail the same way;
//! * otherwise (the connection closed, or marked broken because it can no longer be trusted):
//!   a new connection, no sooner than the minimum delay after the loss was noticed **and**
//!   after the previous attempt. Calls in between fail fast, naming the wait and the last
//!   error, so an outage never becomes a reconnect loop.
//!
//! # Why a fixed minimum delay, not exponential backoff
//!
//! The link never reconnects on its own: an attempt is made only when a caller asks for the
//! link, and every caller already backs off exponentially, with jitter, on the `Unavailable`
//! errors it gets meanwhile (the relay per message, the inbox runner per failed batch; see
//! `outbox_core::backoff`). The minimum delay only has to stop many concurrent callers (up to
//! `max_in_flight` publishes) from turning an outage into a reconnect storm: at most one attempt
//! per delay, however many callers. A second, growing schedule underneath theirs would compound
//! with it, and after a long outage it would keep every publish and every consumer waiting for
//! up to its cap although the broker is back; with a fixed delay a link is back at most one
//! delay after the broker (and the next caller) is. An attempt against a broker that is down is
//! cheap (refused at once, or bounded by the connect timeout), and a process has one connection
//! per side, so one attempt per delay is no load on the broker.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lapin::protocol::AMQPErrorKind;
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Channel, Connection, ConnectionProperties};
use outbox_core::ConfigError;
use serde::Deserialize;
use tracing::{debug, info, warn};

/// Why [`crate::RabbitTransport::connect`] or [`crate::RabbitSource::connect`] failed (the
/// source's name for it is [`crate::RabbitConsumerError`]). Nothing is retried at startup: a
/// relay or consumer that cannot reach its broker should say so and let its supervisor decide.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RabbitConnectError {
    /// The configuration was refused.
    #[error("invalid rabbitmq configuration `{}`: {}", .0.key, .0.reason)]
    Config(#[from] ConfigError),
    /// The URL is not a valid `amqp://` / `amqps://` URL.
    #[error("invalid AMQP URL: {0}")]
    InvalidUrl(String),
    /// The broker could not be reached, or refused the connection or the credentials.
    #[error("cannot connect to RabbitMQ at {endpoint}: {message}")]
    Unreachable {
        /// `host:port/vhost` (never the credentials).
        endpoint: String,
        /// The client library's explanation.
        message: String,
    },
    /// Connecting and setting up the channel (declaring the transport's exchange; declaring,
    /// binding and consuming the source's queue) took longer than `connect_timeout_secs`.
    #[error("connecting to RabbitMQ at {endpoint} timed out after {after:?}")]
    TimedOut {
        /// `host:port/vhost`.
        endpoint: String,
        /// The configured timeout.
        after: Duration,
    },
    /// The connection opened but a setup step was refused: for the transport opening the
    /// channel, enabling publisher confirms or declaring the exchange (e.g. it exists with
    /// another type); for the source a missing exchange or queue, a queue declared with other
    /// arguments, permissions.
    #[error("RabbitMQ at {endpoint} refused {step}: {message}")]
    Setup {
        /// `host:port/vhost`.
        endpoint: String,
        /// `channel.open`, then `confirm.select` or `exchange.declare` (transport), or
        /// `queue.declare`, `queue.bind`, `basic.qos` or `basic.consume` (source).
        step: &'static str,
        /// The broker's or client library's explanation.
        message: String,
    },
}
/// TLS settings of an `amqps://` connection (`[rabbitmq.tls]` in a config file).
///
/// `amqps://` always means TLS: a broker that does not complete the TLS handshake is a
/// connection error, never a plain-text fallback. The server certificate is verified against
/// the system's trust store plus [`RabbitTls::ca_file`], and its name against the URL's host.
/// Setting any of these files with an `amqp://` URL is refused, so a configuration that asks
/// for TLS can never connect in plain text.
///
/// ```
/// let tls = outbox_rabbitmq::RabbitTls {
///     ca_file: Some("/etc/outbox/rabbit-ca.pem".into()),
///     ..Default::default()
/// };
/// assert!(tls.validate().is_ok());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RabbitTls {
    /// PEM file of certificate authorities trusted for the broker's certificate, in addition to
    /// the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) for mutual TLS; needs [`RabbitTls::key_file`].
    pub cert_file: Option<PathBuf>,
    /// PEM (PKCS#8, PKCS#1 or SEC1) private key of [`RabbitTls::cert_file`].
    pub key_file: Option<PathBuf>,
}

fn bad(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(key, reason)
}

/// Reads a PEM file and checks it holds a block whose label ends in `label_end`. The error
/// names the path, never the contents.
fn read_pem(key: &'static str, path: &Path, label_end: &str) -> Result<Vec<u8>, ConfigError> {
    let data = std::fs::read(path)
        .map_err(|e| bad(key, format!("cannot read {}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&data);
    let found = text.lines().any(|l| {
        let l = l.trim();
        l.starts_with("-----BEGIN ") && l.ends_with(&format!("{label_end}-----"))
    });
    if !found {
        return Err(bad(
            key,
            format!("{} holds no PEM `{label_end}` block", path.display()),
        ));
    }
    Ok(data)
}

impl RabbitTls {
    /// True when any file is set.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Checks the settings without touching the files: a certificate needs its key and the
    /// other way round.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `tls.cert_file` or `tls.key_file`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => Err(bad(
                "tls.key_file",
                "cert_file is set, so the client certificate's key_file is needed too",
            )),
            (None, Some(_)) => Err(bad(
                "tls.cert_file",
                "key_file is set, so the client certificate's cert_file is needed too",
            )),
            _ => Ok(()),
        }
    }

    /// Reads the files into the client library's TLS configuration for a connection to `uri`.
    ///
    /// # Errors
    /// A [`ConfigError`]: TLS files with an `amqp://` URL, a file that cannot be read or
    /// holds no PEM certificate / private key.
    pub(crate) fn load(&self, uri: &AMQPUri) -> Result<OwnedTLSConfig, ConfigError> {
        self.validate()?;
        if self.is_set() && uri.scheme != AMQPScheme::AMQPS {
            return Err(bad(
                "tls",
                "TLS files are set but the URL is amqp://; use amqps:// (a connection that \
                 asks for TLS is never made in plain text)",
            ));
        }
        let cert_chain = match &self.ca_file {
            Some(path) => {
                let pem = read_pem("tls.ca_file", path, "CERTIFICATE")?;
                Some(String::from_utf8(pem).map_err(|_| {
                    bad(
                        "tls.ca_file",
                        format!("{} is not UTF-8 PEM", path.display()),
                    )
                })?)
            }
            None => None,
        };
        let identity = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some(OwnedIdentity::PKCS8 {
                pem: read_pem("tls.cert_file", cert, "CERTIFICATE")?,
                key: read_pem("tls.key_file", key, "PRIVATE KEY")?,
            }),
            _ => None,
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }
}

/// Opens a connection to `uri` with `tls` (used only for `amqps://`).
async fn connect_with_tls(
    uri: AMQPUri,
    properties: ConnectionProperties,
    tls: &OwnedTLSConfig,
) -> lapin::Result<Connection> {
    let runtime = lapin::runtime::default_runtime()?;
    Connection::connect_uri_with_config(uri, properties, tls.clone(), runtime).await
}

/// `host:port/vhost` of `uri`: what errors and logs name, never the credentials.
pub(crate) fn endpoint_of(uri: &AMQPUri) -> String {
    format!(
        "{}:{}/{}",
        uri.authority.host, uri.authority.port, uri.vhost
    )
}

/// Whether a lapin error means the connection (not just a channel) is gone or no longer to be
/// trusted: a hard AMQP error (connection close), I/O, missed heartbeats, a broken frame.
pub(crate) fn connection_level(err: &lapin::Error) -> bool {
    use lapin::ErrorKind as K;
    match err.kind() {
        K::ProtocolError(amqp) => matches!(amqp.kind(), AMQPErrorKind::Hard(_)),
        K::IOError(_)
        | K::RuntimeShutdownError(_)
        | K::ParsingError(_)
        | K::SerialisationError(_)
        | K::MissingHeartbeatError
        | K::InvalidConnectionState(_) => true,
        _ => false,
    }
}

/// A setup step the broker or the client library refused, with its AMQP name
/// (`channel.open`, `queue.declare` ...).
pub(crate) type StepError = (&'static str, lapin::Error);

/// What one side (the transport, the delivery source) opens on a connection.
pub(crate) trait Session {
    /// What the side keeps beside the connection and its channel.
    type Parts;

    /// Names the side in logs, e.g. "consumer of queue `ledger`".
    fn describe(&self) -> String;

    /// Opens the side's channel on `connection` and sets it up.
    async fn open(&self, connection: &Connection) -> Result<(Channel, Self::Parts), StepError>;
}

/// One connection, the channel a side works on, and what the side keeps beside them.
pub(crate) struct Link<P> {
    /// Numbers the links of one side, for logs.
    pub(crate) id: u64,
    pub(crate) connection: Arc<Connection>,
    pub(crate) channel: Channel,
    pub(crate) parts: P,
    /// The channel is not used again (an error on it, a consumer cancelled); the connection may
    /// still be.
    channel_failed: AtomicBool,
    /// The connection itself can no longer be trusted: replace it, not only the channel.
    broken: AtomicBool,
}

impl<P> Link<P> {
    /// True while neither flag is set and the connection and the channel are open.
    pub(crate) fn usable(&self) -> bool {
        !self.channel_failed.load(Ordering::Acquire)
            && self.connection_reusable()
            && self.channel.status().connected()
    }

    /// The connection can no longer be trusted: the next repair opens a new one.
    pub(crate) fn mark_broken(&self) {
        self.broken.store(true, Ordering::Release);
    }

    /// The channel is not used again: the next repair reopens it on the same connection (when
    /// that is still open).
    pub(crate) fn mark_channel_failed(&self) {
        self.channel_failed.store(true, Ordering::Release);
    }

    fn connection_reusable(&self) -> bool {
        !self.broken.load(Ordering::Acquire) && self.connection.status().connected()
    }

    /// Closes the connection gracefully, if it is still open.
    pub(crate) async fn close(&self) {
        if self.connection.status().connected()
            && let Err(e) = self.connection.close(200, "OK".into()).await
        {
            debug!(error = %e, "closing the RabbitMQ connection");
        }
    }
}

/// When the last connection attempt was made and the last link was lost, and why the last
/// attempt failed: what the minimum delay between attempts is counted from.
#[derive(Debug, Default)]
pub(crate) struct ReconnectState {
    last_attempt: Option<Instant>,
    lost_at: Option<Instant>,
    last_error: Option<String>,
    next_id: u64,
}

impl ReconnectState {
    /// The link was given up (closed): the next one is made as after a loss.
    pub(crate) fn lost(&mut self) {
        self.lost_at = Some(Instant::now());
    }

    /// How long a connection attempt at `now` must still wait: until `min_delay` after both
    /// the previous attempt and the loss.
    fn wait(&self, now: Instant, min_delay: Duration) -> Duration {
        [self.last_attempt, self.lost_at]
            .into_iter()
            .flatten()
            .max()
            .map_or(Duration::ZERO, |since| {
                (since + min_delay).saturating_duration_since(now)
            })
    }

    fn failed(&mut self, error: String) {
        self.last_error = Some(error);
    }

    fn link<P>(&mut self, connection: Arc<Connection>, channel: Channel, parts: P) -> Link<P> {
        self.next_id += 1;
        self.lost_at = None;
        self.last_error = None;
        Link {
            id: self.next_id,
            connection,
            channel,
            parts,
            channel_failed: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        }
    }
}

/// Why there is no usable link now.
#[derive(Debug)]
pub(crate) struct NoLink {
    /// What went wrong, naming the endpoint (never the credentials).
    pub(crate) message: String,
    /// The broker refused a setup step on a working connection (e.g. the queue is gone):
    /// trying again at once would fail the same way. Otherwise the broker could not be reached,
    /// the link broke, or the reconnect delay has not passed.
    pub(crate) refused: bool,
}

/// A failed connect or setup, before it is reported.
struct Failure {
    error: RabbitConnectError,
    refused: bool,
}

impl From<Failure> for NoLink {
    fn from(f: Failure) -> Self {
        Self {
            message: f.error.to_string(),
            refused: f.refused,
        }
    }
}

/// Where and how to connect: see the [module documentation](self).
pub(crate) struct Connector {
    uri: AMQPUri,
    /// Custom CA and client certificate, read once at startup (used for `amqps://`).
    tls: OwnedTLSConfig,
    endpoint: String,
    /// Shown by the broker (`rabbitmqctl list_connections client_properties`).
    name: String,
    connect_timeout: Duration,
    reconnect_min_delay: Duration,
}

impl Connector {
    /// Parses `url` and reads the TLS files; touches no network.
    ///
    /// # Errors
    /// [`RabbitConnectError::InvalidUrl`] for a malformed `url`, [`RabbitConnectError::Config`]
    /// for TLS files that cannot be read or are given with an `amqp://` URL.
    pub(crate) fn new(
        url: &str,
        tls: &RabbitTls,
        name: String,
        connect_timeout: Duration,
        reconnect_min_delay: Duration,
    ) -> Result<Self, RabbitConnectError> {
        let uri: AMQPUri = url.parse().map_err(RabbitConnectError::InvalidUrl)?;
        let tls = tls.load(&uri)?;
        Ok(Self {
            endpoint: endpoint_of(&uri),
            uri,
            tls,
            name,
            connect_timeout,
            reconnect_min_delay,
        })
    }

    /// `host:port/vhost`, without credentials.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The first link, at startup: tried once, bounded by the connect timeout.
    ///
    /// # Errors
    /// [`RabbitConnectError::Unreachable`], [`RabbitConnectError::TimedOut`] or
    /// [`RabbitConnectError::Setup`].
    pub(crate) async fn connect<S: Session>(
        &self,
        session: &S,
        state: &mut ReconnectState,
    ) -> Result<Link<S::Parts>, RabbitConnectError> {
        state.last_attempt = Some(Instant::now());
        self.establish(session, state).await.map_err(|f| f.error)
    }

    /// A usable link in place of `old`, the side's last link (`None` when there is none, or it
    /// was closed). `old` is no longer usable: its channel is reopened on the same connection
    /// when that is still open, else a new connection is made once the minimum delay allows;
    /// see the [module documentation](self).
    pub(crate) async fn repair<S: Session>(
        &self,
        session: &S,
        state: &mut ReconnectState,
        old: Option<&Link<S::Parts>>,
    ) -> Result<Link<S::Parts>, NoLink> {
        let now = Instant::now();
        if let Some(old) = old {
            state.lost_at = Some(now);
            let connection_ok = old.connection_reusable();
            warn!(
                endpoint = %self.endpoint,
                session = %session.describe(),
                link = old.id,
                connection_ok,
                "RabbitMQ channel lost"
            );
            if connection_ok {
                match self.reopen(session, state, old).await {
                    Ok(link) => return Ok(self.ready(session, link, "RabbitMQ channel reopened")),
                    Err(e) => {
                        warn!(error = %e.message, "reopening the RabbitMQ channel failed");
                        state.failed(e.message.clone());
                        if e.refused {
                            return Err(e);
                        }
                    }
                }
            } else {
                state.failed("the connection was closed".into());
            }
        }

        let wait = state.wait(now, self.reconnect_min_delay);
        if !wait.is_zero() {
            return Err(NoLink {
                message: format!(
                    "not connected to RabbitMQ at {}; next reconnect attempt in {wait:?} (last error: {})",
                    self.endpoint,
                    state.last_error.as_deref().unwrap_or("none")
                ),
                refused: false,
            });
        }
        state.last_attempt = Some(now);
        match self.establish(session, state).await {
            Ok(link) => Ok(self.ready(session, link, "reconnected to RabbitMQ")),
            Err(f) => {
                warn!(error = %f.error, "reconnecting to RabbitMQ failed");
                state.failed(f.error.to_string());
                Err(f.into())
            }
        }
    }

    /// Logs that `link` replaced a lost one, and hands it on.
    fn ready<S: Session>(&self, session: &S, link: Link<S::Parts>, what: &str) -> Link<S::Parts> {
        info!(
            endpoint = %self.endpoint,
            session = %session.describe(),
            link = link.id,
            "{what}"
        );
        link
    }

    /// Reopens the side's channel on `old`'s connection, bounded by the connect timeout.
    async fn reopen<S: Session>(
        &self,
        session: &S,
        state: &mut ReconnectState,
        old: &Link<S::Parts>,
    ) -> Result<Link<S::Parts>, NoLink> {
        let reopened = tokio::time::timeout(self.connect_timeout, async {
            // A channel still open (its consumer cancelled by the broker) is closed first, so
            // the broker requeues what it held.
            if old.channel.status().connected()
                && let Err(e) = old.channel.close(200, "OK".into()).await
            {
                debug!(error = %e, "closing the failed channel");
            }
            session.open(&old.connection).await
        })
        .await;
        match reopened {
            Ok(Ok((channel, parts))) => Ok(state.link(Arc::clone(&old.connection), channel, parts)),
            Ok(Err(step)) => Err(self.refused(step).into()),
            Err(_) => Err(NoLink {
                message: "reopening the channel timed out".into(),
                refused: false,
            }),
        }
    }

    /// Connects and opens the side's channel, bounded by the connect timeout.
    async fn establish<S: Session>(
        &self,
        session: &S,
        state: &mut ReconnectState,
    ) -> Result<Link<S::Parts>, Failure> {
        let after = self.connect_timeout;
        let opened = tokio::time::timeout(after, async {
            let properties =
                ConnectionProperties::default().with_connection_name(self.name.clone().into());
            let connection = connect_with_tls(self.uri.clone(), properties, &self.tls)
                .await
                .map_err(|e| Failure {
                    error: RabbitConnectError::Unreachable {
                        endpoint: self.endpoint.clone(),
                        message: e.to_string(),
                    },
                    refused: false,
                })?;
            let (channel, parts) = session
                .open(&connection)
                .await
                .map_err(|step| self.refused(step))?;
            Ok((connection, channel, parts))
        })
        .await
        .map_err(|_| Failure {
            error: RabbitConnectError::TimedOut {
                endpoint: self.endpoint.clone(),
                after,
            },
            refused: false,
        })?;
        let (connection, channel, parts) = opened?;
        Ok(state.link(Arc::new(connection), channel, parts))
    }

    /// A refused setup step; `refused` unless the error took the connection with it.
    fn refused(&self, (step, e): StepError) -> Failure {
        Failure {
            refused: !connection_level(&e),
            error: RabbitConnectError::Setup {
                endpoint: self.endpoint.clone(),
                step,
                message: e.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use lapin::protocol::{AMQPError, AMQPHardError, AMQPSoftError};

    use super::*;

    #[test]
    fn endpoint_hides_credentials() {
        let uri: AMQPUri = "amqp://user:s3cret@broker.example:5673/payments"
            .parse()
            .unwrap();
        let e = endpoint_of(&uri);
        assert_eq!(e, "broker.example:5673/payments");
        assert!(!e.contains("s3cret"));
    }

    #[test]
    fn connection_level_errors() {
        let protocol = |kind, text: &str| -> lapin::Error {
            lapin::ErrorKind::ProtocolError(AMQPError::new(kind, text.into())).into()
        };
        let forced = protocol(
            AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED),
            "CONNECTION_FORCED - closed via management plugin",
        );
        assert!(connection_level(&forced));
        let io: lapin::Error = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
        assert!(connection_level(&io));
        let not_found = protocol(
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND),
            "NOT_FOUND - no queue 'q' in vhost '/'",
        );
        assert!(!connection_level(&not_found));
    }

    #[test]
    fn attempts_wait_the_minimum_delay_after_the_attempt_and_the_loss() {
        let min = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut state = ReconnectState::default();
        assert_eq!(state.wait(t0, min), Duration::ZERO, "never tried: at once");
        state.last_attempt = Some(t0);
        assert_eq!(
            state.wait(t0 + Duration::from_millis(400), min),
            min * 3 / 5
        );
        assert_eq!(state.wait(t0 + min, min), Duration::ZERO);
        // A loss noticed later than the attempt counts from the loss: fixed, not growing.
        state.lost_at = Some(t0 + Duration::from_secs(5));
        assert_eq!(state.wait(t0 + Duration::from_secs(5), min), min);
        assert_eq!(state.wait(t0 + Duration::from_secs(6), min), Duration::ZERO);
    }

    fn temp(name: &str, contents: &str) -> PathBuf {
        let p =
            std::env::temp_dir().join(format!("outbox-rabbit-tls-{}-{name}", std::process::id()));
        std::fs::write(&p, contents).unwrap();
        p
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let t = RabbitTls {
            cert_file: Some("c.pem".into()),
            ..Default::default()
        };
        assert_eq!(t.validate().unwrap_err().key, "tls.key_file");
        let t = RabbitTls {
            key_file: Some("k.pem".into()),
            ..Default::default()
        };
        assert_eq!(t.validate().unwrap_err().key, "tls.cert_file");
        assert!(RabbitTls::default().validate().is_ok());
    }

    #[test]
    fn tls_files_with_a_plain_url_are_refused() {
        let ca = temp(
            "ca.pem",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        );
        let t = RabbitTls {
            ca_file: Some(ca.clone()),
            ..Default::default()
        };
        let plain: AMQPUri = "amqp://guest:guest@127.0.0.1:5672/%2f".parse().unwrap();
        let e = t.load(&plain).unwrap_err();
        assert_eq!(e.key, "tls");
        assert!(e.reason.contains("amqps://"), "{e}");
        let tls: AMQPUri = "amqps://guest:guest@localhost:5671/%2f".parse().unwrap();
        let c = t.load(&tls).unwrap();
        assert!(c.cert_chain.unwrap().contains("BEGIN CERTIFICATE"));
        assert!(c.identity.is_none());
        // No TLS files: nothing to refuse, whatever the scheme.
        assert!(RabbitTls::default().load(&plain).is_ok());
        let _ = std::fs::remove_file(ca);
    }

    #[test]
    fn unreadable_or_wrong_files_name_the_key_and_not_the_contents() {
        let tls: AMQPUri = "amqps://localhost/%2f".parse().unwrap();
        let missing = RabbitTls {
            ca_file: Some("/nonexistent/outbox/ca.pem".into()),
            ..Default::default()
        };
        assert_eq!(missing.load(&tls).unwrap_err().key, "tls.ca_file");
        let cert = temp(
            "c.pem",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        );
        let not_a_key = temp("k.pem", "SECRETISH but no PEM\n");
        let t = RabbitTls {
            cert_file: Some(cert.clone()),
            key_file: Some(not_a_key.clone()),
            ..Default::default()
        };
        let e = t.load(&tls).unwrap_err();
        assert_eq!(e.key, "tls.key_file");
        assert!(!e.to_string().contains("SECRETISH"), "{e}");
        let _ = std::fs::remove_file(cert);
        let _ = std::fs::remove_file(not_a_key);
    }
}
