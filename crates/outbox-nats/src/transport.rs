//! [`NatsTransport`]: connection, stream setup and the [`Transport`] implementation (the
//! messages themselves are the binding's, [`crate::binding`]).

use std::error::Error as _;
use std::sync::Arc;

use async_nats::ConnectOptions;
use async_nats::connection::State;
use async_nats::jetstream::context::{CreateStreamErrorKind, PublishErrorKind as JsKind};
use async_nats::jetstream::{self, ErrorCode};
use outbox_core::secrets::redact_url;
use outbox_core::{
    ConfigError, OutboxMessage, PublishError, PublishErrorKind, PublishReceipt, Transport,
};
use tokio::sync::Semaphore;

use crate::binding::{build_headers, header_map, header_parts, headers_wire_len, subject_of};
use crate::config::{ClientConfig, NatsConfig};
use crate::connection::{
    ClientConnectError, connect_client, is_stream_not_found, logged_connect_options,
};

/// Why [`NatsTransport`] could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsConnectError {
    /// The configuration is invalid.
    #[error("invalid NATS transport config `{}`: {}", .0.key, .0.reason)]
    Config(#[from] ConfigError),
    /// A TLS or authentication file cannot be used, or the URL's credentials contradict them.
    #[error("invalid NATS security setting `{}`: {}", .0.key, .0.reason)]
    Security(ConfigError),
    /// The server could not be reached or refused the connection (address, DNS, TLS, auth).
    #[error("cannot connect to NATS at `{url}`: {source}")]
    Connect {
        /// The address tried.
        url: String,
        /// The client library's error.
        #[source]
        source: async_nats::ConnectError,
    },
    /// The server did not complete the connection within `connect_timeout_secs`.
    #[error("cannot connect to NATS at `{url}`: no connection within {timeout_secs}s")]
    ConnectTimedOut {
        /// The address tried.
        url: String,
        /// The configured timeout.
        timeout_secs: u64,
    },
    /// The stream could not be looked up or created (JetStream disabled, permissions,
    /// subjects overlapping another stream, timeout).
    #[error("JetStream stream `{stream}`: {message}")]
    Stream {
        /// The stream name.
        stream: String,
        /// What went wrong.
        message: String,
    },
}

impl ClientConnectError for NatsConnectError {
    fn security(error: ConfigError) -> Self {
        Self::Security(error)
    }

    fn unreachable(url: String, source: async_nats::ConnectError) -> Self {
        Self::Connect { url, source }
    }

    fn timed_out(url: String, timeout_secs: u64) -> Self {
        Self::ConnectTimedOut { url, timeout_secs }
    }
}

/// How both sides connect ([`NatsTransport::connect_with_options`],
/// [`NatsSource::connect_with_options`](crate::NatsSource::connect_with_options)): `config`
/// checked, the client connected as its security and connect timeout say
/// ([`connect_client`]), then handed over with `config` to the side's `from_client`.
pub(crate) async fn connect_side<C, S, E, F>(
    url: &str,
    options: ConnectOptions,
    config: C,
    from_client: impl FnOnce(async_nats::Client, C) -> F,
) -> Result<S, E>
where
    C: ClientConfig,
    E: ClientConnectError + From<ConfigError>,
    F: Future<Output = Result<S, E>>,
{
    config.check()?;
    let security = config.client_security();
    let client =
        connect_client::<E>(url, options, security, config.client_connect_timeout()).await?;
    from_client(client, config).await
}

/// The NATS JetStream [`Transport`].
///
/// Cheap to clone: clones share the connection and the in-flight bound.
#[derive(Debug, Clone)]
pub struct NatsTransport {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    config: Arc<NatsConfig>,
    in_flight: Arc<Semaphore>,
}

impl NatsTransport {
    /// Connects to `url` (one address, or several separated by commas), then looks up or
    /// creates the stream as [`NatsConfig::ensure_stream`] says.
    ///
    /// Startup fails fast: an unreachable server is an error after at most
    /// [`NatsConfig::connect_timeout_secs`], never an endless retry. Once connected, the client
    /// reconnects by itself during outages; publishes made meanwhile fail with `TimedOut` /
    /// `Unavailable` and the relay retries them.
    ///
    /// Credentials may be given in the URL (`nats://user:pass@host:4222`, `nats://TOKEN@host`);
    /// they are moved into the connect options and never logged. TLS (`tls://` URLs, a CA, a
    /// client certificate), a credentials file or an NKey seed come from
    /// [`NatsConfig::security`]; when TLS is required a plain-text server is an error, never a
    /// fallback.
    ///
    /// # Errors
    /// [`NatsConnectError::Config`] for a bad config, [`NatsConnectError::Security`] when a TLS
    /// or authentication file cannot be used, [`NatsConnectError::Connect`] /
    /// [`NatsConnectError::ConnectTimedOut`] when the server cannot be reached (or refuses the
    /// TLS handshake or the credentials), [`NatsConnectError::Stream`] when the stream cannot
    /// be looked up or created.
    #[tracing::instrument(
        level = "info",
        skip_all,
        fields(server = %redact_url(url), stream = %config.stream)
    )]
    pub async fn connect(url: &str, config: NatsConfig) -> Result<Self, NatsConnectError> {
        Self::connect_with_options(url, logged_connect_options("outbox-relay"), config).await
    }

    /// Like [`NatsTransport::connect`] with caller-built [`ConnectOptions`] (event callback,
    /// or TLS and authentication settings beyond [`NatsConfig::security`], which is applied on
    /// top). Credentials in `url` are moved into the options. The connection timeout is set
    /// from [`NatsConfig::connect_timeout_secs`]; do not enable `retry_on_initial_connect`
    /// unless you want startup to wait for the server.
    ///
    /// # Errors
    /// As [`NatsTransport::connect`].
    pub async fn connect_with_options(
        url: &str,
        options: ConnectOptions,
        config: NatsConfig,
    ) -> Result<Self, NatsConnectError> {
        connect_side(url, options, config, Self::from_client).await
    }

    /// Wraps an already connected client (for embedding or tests), then looks up or creates the
    /// stream as [`NatsConfig::ensure_stream`] says.
    ///
    /// # Errors
    /// [`NatsConnectError::Config`] or [`NatsConnectError::Stream`].
    pub async fn from_client(
        client: async_nats::Client,
        config: NatsConfig,
    ) -> Result<Self, NatsConnectError> {
        config.validate()?;
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(config.ack_timeout())
            .ack_timeout(config.ack_timeout())
            // Our own semaphore bounds in-flight publishes; the context's bound only has to
            // be larger, with room for acks abandoned by a caller's timeout.
            .max_ack_inflight(config.max_in_flight.saturating_mul(2))
            .backpressure_on_inflight(true)
            .build(client.clone());
        let transport = Self {
            client,
            jetstream,
            in_flight: Arc::new(Semaphore::new(config.max_in_flight)),
            config: Arc::new(config),
        };
        transport.check_stream().await?;
        Ok(transport)
    }

    /// The configuration in use.
    pub fn config(&self) -> &NatsConfig {
        &self.config
    }

    /// The underlying client (for health checks, or tests reading the stream back).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    /// The JetStream context publishes go through.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// The subject `message` is published to: its destination override, or
    /// [`NatsConfig::subject_template`] expanded with sanitised tokens.
    ///
    /// # Errors
    /// [`PublishErrorKind::Invalid`] when the result is not a valid literal subject.
    pub fn subject_for(&self, message: &OutboxMessage) -> Result<String, PublishError> {
        subject_of(message, &self.config.subject_template)
    }

    /// The headers `message` is published with, in order: `ce-<attribute>` for every
    /// CloudEvents attribute (percent-encoded), `ce-datacontenttype`, `Content-Type`,
    /// `Nats-Msg-Id`, then the user headers unchanged.
    ///
    /// # Errors
    /// [`PublishErrorKind::Invalid`] when a user header cannot be carried: a name the NATS
    /// protocol refuses or that collides with a header set here (`ce-*`, `nats-*`,
    /// `content-type`, any case), or a value with CR/LF; a content type with CR/LF.
    pub fn headers_for(
        &self,
        message: &OutboxMessage,
    ) -> Result<Vec<(String, String)>, PublishError> {
        build_headers(message, &self.config.source)
    }

    async fn check_stream(&self) -> Result<(), NatsConnectError> {
        let name = &self.config.stream;
        let stream_error = |message: String| NatsConnectError::Stream {
            stream: name.clone(),
            message,
        };
        match self.jetstream.get_stream(name).await {
            Ok(stream) => {
                self.check_existing(stream.cached_info());
                Ok(())
            }
            Err(e) if is_stream_not_found(&e.kind()) => {
                if self.config.ensure_stream {
                    self.create_stream().await.map_err(stream_error)
                } else {
                    tracing::warn!(
                        stream = %name,
                        "JetStream stream does not exist and ensure_stream is off: publishes \
                         are rejected (and retried) until it is created"
                    );
                    Ok(())
                }
            }
            Err(e) if self.config.ensure_stream => Err(stream_error(format!(
                "cannot look it up (is JetStream enabled and the account allowed to use it?): {e}"
            ))),
            Err(e) => {
                tracing::warn!(stream = %name, error = %e, "cannot look up the JetStream stream");
                Ok(())
            }
        }
    }

    async fn create_stream(&self) -> Result<(), String> {
        let config = jetstream::stream::Config {
            name: self.config.stream.clone(),
            subjects: self.config.stream_subjects.clone(),
            storage: jetstream::stream::StorageType::File,
            duplicate_window: self.config.duplicate_window(),
            ..Default::default()
        };
        match self.jetstream.create_stream(config).await {
            Ok(stream) => {
                tracing::info!(
                    stream = %self.config.stream,
                    subjects = ?self.config.stream_subjects,
                    duplicate_window_secs = self.config.duplicate_window_secs,
                    "created JetStream stream"
                );
                self.check_existing(stream.cached_info());
                Ok(())
            }
            // Another relay instance created it between our lookup and our create.
            Err(e) if matches!(e.kind(), CreateStreamErrorKind::JetStream(ref js) if js.error_code() == ErrorCode::STREAM_NAME_EXIST) =>
            {
                let stream = self
                    .jetstream
                    .get_stream(&self.config.stream)
                    .await
                    .map_err(|e| format!("created concurrently, but cannot look it up: {e}"))?;
                self.check_existing(stream.cached_info());
                Ok(())
            }
            Err(e) => Err(format!("cannot create it: {e}")),
        }
    }

    fn check_existing(&self, info: &jetstream::stream::Info) {
        let wanted = self.config.duplicate_window();
        if info.config.duplicate_window < wanted {
            tracing::warn!(
                stream = %self.config.stream,
                stream_duplicate_window_secs = info.config.duplicate_window.as_secs_f64(),
                configured_duplicate_window_secs = self.config.duplicate_window_secs,
                "the stream's duplicate window is shorter than configured: republishes after it \
                 are stored twice (the consumer inbox absorbs them); the stream is left as it is"
            );
        }
        if info.config.storage == jetstream::stream::StorageType::Memory {
            tracing::warn!(
                stream = %self.config.stream,
                "the stream uses memory storage: acknowledged events are lost if the server restarts"
            );
        }
    }

    fn max_payload(&self) -> usize {
        self.client
            .try_server_info()
            .map(|info| info.max_payload)
            .filter(|&m| m > 0)
            .unwrap_or_else(|| self.client.max_payload())
    }

    fn map_error(&self, err: &jetstream::context::PublishError, stage: &str) -> PublishError {
        let connected = self.client.connection_state() == State::Connected;
        let kind = classify(err, connected);
        PublishError::new(kind, format!("{stage}: {err}"))
    }
}

impl Transport for NatsTransport {
    fn name(&self) -> &'static str {
        "nats"
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<PublishReceipt, PublishError> {
        let subject = self.subject_for(message)?;
        let parts = header_parts(message, &self.config.source)?;

        let size = headers_wire_len(&parts) + message.payload.bytes.len();
        let max = self.max_payload();
        if size > max {
            return Err(PublishError::new(
                PublishErrorKind::TooLarge,
                format!(
                    "event {}: message is {size} bytes (payload {} + headers), more than the \
                     server's max_payload of {max}",
                    message.event_id,
                    message.payload.bytes.len()
                ),
            ));
        }

        let headers = header_map(message, parts)?;

        let _permit = self.in_flight.acquire().await.map_err(|_| {
            PublishError::new(PublishErrorKind::Unavailable, "the transport was closed")
        })?;

        // First await: the message is handed to the connection (or the send times out).
        let ack = self
            .jetstream
            .publish_with_headers(subject.clone(), headers, message.payload.bytes.clone())
            .await
            .map_err(|e| self.map_error(&e, "send"))?;
        // Second await: JetStream stored it and said so (PublishAck), or not.
        let ack = ack.await.map_err(|e| self.map_error(&e, "ack"))?;

        if ack.stream != self.config.stream {
            tracing::debug!(
                event_id = %message.event_id,
                %subject,
                stream = %ack.stream,
                "event stored in a stream other than the configured one"
            );
        }
        tracing::trace!(
            event_id = %message.event_id,
            %subject,
            seq = ack.sequence,
            duplicate = ack.duplicate,
            "published"
        );
        Ok(PublishReceipt {
            duplicate: ack.duplicate,
        })
    }
}

/// Maps an async-nats JetStream publish error to the outbox error kind.
fn classify(err: &jetstream::context::PublishError, connected: bool) -> PublishErrorKind {
    match err.kind() {
        JsKind::MaxPayloadExceeded => PublishErrorKind::TooLarge,
        JsKind::TimedOut => PublishErrorKind::TimedOut,
        JsKind::StreamNotFound => PublishErrorKind::Rejected,
        JsKind::BrokenPipe => PublishErrorKind::Unavailable,
        // Only with backpressure off, which this transport never sets; treat as overload.
        JsKind::MaxAckPending => PublishErrorKind::Unavailable,
        JsKind::WrongLastMessageId | JsKind::WrongLastSequence => PublishErrorKind::Rejected,
        JsKind::Other => classify_other(err, connected),
    }
}

fn classify_other(err: &jetstream::context::PublishError, connected: bool) -> PublishErrorKind {
    if let Some(js) = err
        .source()
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
    {
        let code = js.error_code();
        if code == ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM
            || code == ErrorCode::STREAM_HEADER_EXCEEDS_MAXIMUM
        {
            return PublishErrorKind::TooLarge;
        }
        return PublishErrorKind::Rejected;
    }
    let text = err.to_string().to_ascii_lowercase();
    if text.contains("maximum payload") || text.contains("max payload") {
        return PublishErrorKind::TooLarge;
    }
    if !connected
        || text.contains("broken pipe")
        || text.contains("disconnected")
        || text.contains("connection closed")
        || text.contains("channel closed")
    {
        return PublishErrorKind::Unavailable;
    }
    PublishErrorKind::Rejected
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_maps_async_nats_kinds() {
        use jetstream::context::PublishError as E;
        let k = |e: E| classify(&e, true);
        assert_eq!(
            k(E::new(JsKind::MaxPayloadExceeded)),
            PublishErrorKind::TooLarge
        );
        assert_eq!(k(E::new(JsKind::TimedOut)), PublishErrorKind::TimedOut);
        assert_eq!(
            k(E::new(JsKind::StreamNotFound)),
            PublishErrorKind::Rejected
        );
        assert_eq!(k(E::new(JsKind::BrokenPipe)), PublishErrorKind::Unavailable);
        assert_eq!(k(E::new(JsKind::Other)), PublishErrorKind::Rejected);
        assert_eq!(
            classify(&E::new(JsKind::Other), false),
            PublishErrorKind::Unavailable
        );
        let js: jetstream::Error = serde_json_error(10054, "message size exceeds maximum allowed");
        assert_eq!(
            k(E::with_source(JsKind::Other, js)),
            PublishErrorKind::TooLarge
        );
        let js: jetstream::Error = serde_json_error(10077, "maximum messages exceeded");
        assert_eq!(
            classify(&E::with_source(JsKind::Other, js), false),
            PublishErrorKind::Rejected
        );
        assert_eq!(
            k(E::with_source(
                JsKind::Other,
                "Maximum Payload Violation".to_owned()
            )),
            PublishErrorKind::TooLarge
        );
    }

    /// Builds a JetStream API error the way the client parses it from a response.
    fn serde_json_error(err_code: u64, description: &str) -> jetstream::Error {
        let text = format!(r#"{{"code":400,"err_code":{err_code},"description":"{description}"}}"#);
        serde_json::from_str(&text).unwrap()
    }
}
