//! Connecting the client, shared by [`crate::NatsTransport`] and [`crate::NatsSource`]: connect
//! options that name the connection and log its events, the [`NatsSecurity`] settings applied on
//! top (credentials moved out of the URL, TLS, credential files), one attempt bounded by the
//! connect timeout, and what fails mapped to each side's error ([`ClientConnectError`]).

use std::time::Duration;

use async_nats::ConnectOptions;
use outbox_core::secrets::redact_url;

use crate::security::{NatsSecurity, NatsSecurityError};

/// Connect options that name the connection `name` and log connection events.
pub(crate) fn logged_connect_options(name: &str) -> ConnectOptions {
    ConnectOptions::new()
        .name(name)
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => tracing::info!("NATS connection (re)established"),
                async_nats::Event::Disconnected => {
                    tracing::warn!("NATS connection lost; reconnecting")
                }
                // A close is this side's own doing (shutdown, a replaced client); whatever
                // fails afterwards reports its own error.
                async_nats::Event::Closed => tracing::info!("NATS connection closed"),
                other => tracing::warn!(event = %other, "NATS client event"),
            }
        })
}

/// A side's startup error, as far as connecting the client goes: a [`NatsSecurityError`] (via
/// `From`), an unreachable server, no connection in time.
pub(crate) trait ClientConnectError: From<NatsSecurityError> {
    /// The server at `url` (credentials redacted) could not be reached or refused the
    /// connection (address, DNS, TLS, auth).
    fn unreachable(url: String, source: async_nats::ConnectError) -> Self;

    /// The server at `url` (credentials redacted) did not complete the connection within
    /// `timeout_secs`.
    fn timed_out(url: String, timeout_secs: u64) -> Self;
}

/// Connects to `url` (one address, or several separated by commas) with `security` applied on
/// top of `options`. Tried once: the attempt (and the client's own connection timeout) is
/// bounded by `timeout`, so an unreachable server is an error, never an endless retry; once
/// connected, the client reconnects by itself.
///
/// # Errors
/// `E::from` a [`NatsSecurityError`] when a TLS or authentication setting cannot be used,
/// [`ClientConnectError::unreachable`] or [`ClientConnectError::timed_out`] when the server
/// cannot be reached.
pub(crate) async fn connect_client<E: ClientConnectError>(
    url: &str,
    options: ConnectOptions,
    security: &NatsSecurity,
    timeout: Duration,
) -> Result<async_nats::Client, E> {
    let (address, options) = security.apply(url, options).await?;
    let options = options.connection_timeout(timeout);
    match tokio::time::timeout(timeout, options.connect(address)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(source)) => Err(E::unreachable(redact_url(url), source)),
        Err(_elapsed) => Err(E::timed_out(redact_url(url), timeout.as_secs())),
    }
}
