//! Reaching the server, shared by [`crate::NatsTransport`] and [`crate::NatsSource`]: the
//! TLS and authentication settings ([`NatsSecurity`]), connect options that name the connection
//! and log its events, one connection attempt bounded by the connect timeout with what fails
//! mapped to each side's error ([`ClientConnectError`]), and the stream lookup both sides make.
//! Once connected, the client library reconnects by itself.
//!
//! Credentials never travel inside the address handed to the client library: a
//! `nats://user:password@host` or `nats://TOKEN@host` URL is split into an address without
//! them and the matching [`ConnectOptions`] (`user_and_password` / `token`), because the
//! library prints its server addresses in its own debug logs.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::ConnectOptions;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::rustls;
use outbox_core::ConfigError;
use outbox_core::secrets::{Credentials, redact_url, split_credentials};
use serde::Deserialize;

/// TLS and authentication settings of a NATS connection (`[nats.security]` in a config file).
///
/// TLS is **required**, never merely attempted, when [`NatsSecurity::require_tls`] is set, when
/// the URL's scheme is `tls://`, or when any of the TLS files is given: a server that does not
/// speak TLS is then a connection error, never a plain-text fallback.
///
/// ```
/// let s: outbox_nats::NatsSecurity = toml::from_str(r#"
///     ca_file = "/etc/outbox/nats-ca.pem"
///     cert_file = "/etc/outbox/relay.pem"
///     key_file = "/etc/outbox/relay.key"
///     credentials_file = "/etc/outbox/relay.creds"
/// "#).unwrap();
/// assert!(s.validate().is_ok());
/// assert!(s.tls_required("nats://nats:4222"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsSecurity {
    /// Refuse a connection that is not TLS. Default `false`; implied by a `tls://` URL and by
    /// any TLS file below.
    pub require_tls: bool,
    /// PEM file of the certificate authorities that sign the server's certificate. When set,
    /// only these are trusted; otherwise the system's trust store.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain) for mutual TLS; needs [`NatsSecurity::key_file`].
    pub cert_file: Option<PathBuf>,
    /// PEM private key of [`NatsSecurity::cert_file`].
    pub key_file: Option<PathBuf>,
    /// A `.creds` file (user JWT and NKey seed), for servers in operator (JWT) mode.
    pub credentials_file: Option<PathBuf>,
    /// A file holding a user NKey seed (`SU…`), for servers that list NKey users.
    pub nkey_seed_file: Option<PathBuf>,
}

/// A [`NatsSecurity`] setting that cannot be used (a file that cannot be read or parsed, or
/// settings that contradict each other), naming the key (e.g. `security.ca_file`); never quotes
/// a file's contents.
fn bad(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(key, reason)
}

impl NatsSecurity {
    /// Checks the settings without touching the files: a certificate needs its key and the
    /// other way round, and only one of the credentials file and the NKey seed file may be set.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(bad(
                    "security.key_file",
                    "cert_file is set, so the client certificate's key_file is needed too",
                ));
            }
            (None, Some(_)) => {
                return Err(bad(
                    "security.cert_file",
                    "key_file is set, so the client certificate's cert_file is needed too",
                ));
            }
            _ => {}
        }
        if self.credentials_file.is_some() && self.nkey_seed_file.is_some() {
            return Err(bad(
                "security.nkey_seed_file",
                "set either credentials_file or nkey_seed_file, not both",
            ));
        }
        Ok(())
    }

    /// Whether a connection to `url` with these settings must be TLS.
    pub fn tls_required(&self, url: &str) -> bool {
        self.require_tls
            || self.ca_file.is_some()
            || self.cert_file.is_some()
            || url
                .split(',')
                .any(|u| u.trim_start().to_ascii_lowercase().starts_with("tls://"))
    }

    /// Applies the settings to `options` for a connection to `url`: returns the address to
    /// connect to, with any credentials taken out of it and moved into the options, and the
    /// options. Reads the credentials and NKey seed files now, so a bad file fails here.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the key: an invalid combination ([`NatsSecurity::validate`]), credentials
    /// both in the URL and in a file, a file that cannot be read, an NKey seed that does not
    /// parse.
    pub async fn apply(
        &self,
        url: &str,
        mut options: ConnectOptions,
    ) -> Result<(String, ConnectOptions), ConfigError> {
        self.validate()?;
        let (address, credentials) = split_credentials(url);
        let from_file = self.credentials_file.is_some() || self.nkey_seed_file.is_some();
        if credentials.is_some() && from_file {
            return Err(bad(
                "url",
                "the URL carries credentials and a credentials or NKey file is set too; use one",
            ));
        }
        match credentials {
            Some(Credentials::UserPassword { user, password }) => {
                options = options.user_and_password(user, password);
            }
            Some(Credentials::Token(token)) => options = options.token(token),
            // `Credentials` may grow; a form this code does not know must not be ignored.
            Some(_) => return Err(bad("url", "unsupported credentials in the URL")),
            None => {}
        }
        if self.tls_required(url) {
            options = options
                .require_tls(true)
                .tls_client_config(self.client_config()?);
        }
        if let Some(path) = &self.credentials_file {
            options = options.credentials_file(path).await.map_err(|e| {
                bad(
                    "security.credentials_file",
                    format!("cannot use {}: {e}", path.display()),
                )
            })?;
        }
        if let Some(path) = &self.nkey_seed_file {
            let seed = std::fs::read_to_string(path).map_err(|e| {
                bad(
                    "security.nkey_seed_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            let seed = seed.trim().to_owned();
            if !seed.starts_with("SU") {
                return Err(bad(
                    "security.nkey_seed_file",
                    format!(
                        "{} does not hold a user NKey seed (one line starting with SU)",
                        path.display()
                    ),
                ));
            }
            options = options.nkey(seed);
        }
        Ok((address, options))
    }
}

impl NatsSecurity {
    /// The TLS client configuration ([`outbox_core::tls::client_config`]): the CA file's
    /// certificates (or the system's trust store without one), the client certificate when
    /// given.
    fn client_config(&self) -> Result<rustls::ClientConfig, ConfigError> {
        use outbox_core::tls::{TlsFile, TlsFiles, client_config};
        client_config(TlsFiles {
            ca_file: self.ca_file.as_ref(),
            cert_file: self.cert_file.as_ref(),
            key_file: self.key_file.as_ref(),
        })
        .map_err(|e| {
            let key = match e.file {
                TlsFile::Ca => "security.ca_file",
                TlsFile::Cert => "security.cert_file",
                TlsFile::Key => "security.key_file",
                TlsFile::Setup => "security",
            };
            bad(key, e.reason)
        })
    }
}

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

/// A side's startup error, as far as connecting the client goes: a security setting that cannot
/// be used, an unreachable server, no connection in time.
pub(crate) trait ClientConnectError {
    /// A TLS or authentication setting cannot be used (a file that cannot be read, credentials
    /// both in the URL and in a file).
    fn security(error: ConfigError) -> Self;

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
/// [`ClientConnectError::security`] when a TLS or authentication setting cannot be used,
/// [`ClientConnectError::unreachable`] or [`ClientConnectError::timed_out`] when the server
/// cannot be reached.
pub(crate) async fn connect_client<E: ClientConnectError>(
    url: &str,
    options: ConnectOptions,
    security: &NatsSecurity,
    timeout: Duration,
) -> Result<async_nats::Client, E> {
    let (address, options) = security.apply(url, options).await.map_err(E::security)?;
    let options = options.connection_timeout(timeout);
    match tokio::time::timeout(timeout, options.connect(address)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(source)) => Err(E::unreachable(redact_url(url), source)),
        Err(_elapsed) => Err(E::timed_out(redact_url(url), timeout.as_secs())),
    }
}

/// Whether a stream lookup failed because the stream does not exist.
pub(crate) fn is_stream_not_found(kind: &GetStreamErrorKind) -> bool {
    matches!(kind, GetStreamErrorKind::JetStream(js) if js.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, contents: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "outbox-nats-security-{}-{}",
            std::process::id(),
            name
        ));
        std::fs::write(&dir, contents).unwrap();
        dir
    }

    #[test]
    fn contradicting_settings_name_their_key() {
        let s = NatsSecurity {
            cert_file: Some("c.pem".into()),
            ..Default::default()
        };
        assert_eq!(s.validate().unwrap_err().key, "security.key_file");
        let s = NatsSecurity {
            key_file: Some("k.pem".into()),
            ..Default::default()
        };
        assert_eq!(s.validate().unwrap_err().key, "security.cert_file");
        let s = NatsSecurity {
            credentials_file: Some("a.creds".into()),
            nkey_seed_file: Some("a.nk".into()),
            ..Default::default()
        };
        assert_eq!(s.validate().unwrap_err().key, "security.nkey_seed_file");
        assert!(NatsSecurity::default().validate().is_ok());
    }

    #[test]
    fn tls_is_required_by_scheme_flag_or_files() {
        let none = NatsSecurity::default();
        assert!(!none.tls_required("nats://h:4222"));
        assert!(none.tls_required("tls://h:4222"));
        assert!(none.tls_required("nats://a:4222, TLS://b:4222"));
        let flag = NatsSecurity {
            require_tls: true,
            ..Default::default()
        };
        assert!(flag.tls_required("nats://h:4222"));
        let ca = NatsSecurity {
            ca_file: Some("ca.pem".into()),
            ..Default::default()
        };
        assert!(ca.tls_required("nats://h:4222"));
    }

    #[tokio::test]
    async fn credentials_leave_the_url() {
        let none = NatsSecurity::default();
        let (url, _) = none
            .apply("nats://relay:s3cret@h:4222", ConnectOptions::new())
            .await
            .unwrap();
        assert_eq!(url, "nats://h:4222");
        let (url, _) = none
            .apply("tls://t0ken@h:4222", ConnectOptions::new())
            .await
            .unwrap();
        assert_eq!(url, "tls://h:4222");
    }

    #[tokio::test]
    async fn bad_files_are_refused_without_quoting_them() {
        let missing = NatsSecurity {
            ca_file: Some("/nonexistent/outbox/ca.pem".into()),
            ..Default::default()
        };
        let e = missing
            .apply("tls://h:4222", ConnectOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.key, "security.ca_file");
        assert!(e.reason.contains("/nonexistent/outbox/ca.pem"), "{e}");

        let seed = temp("seed", "not-a-seed-SECRETISH\n");
        let s = NatsSecurity {
            nkey_seed_file: Some(seed.clone()),
            ..Default::default()
        };
        let e = s
            .apply("nats://h:4222", ConnectOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.key, "security.nkey_seed_file");
        assert!(!e.to_string().contains("SECRETISH"), "{e}");

        let creds = temp("creds", "no jwt in here SECRETISH");
        let s = NatsSecurity {
            credentials_file: Some(creds.clone()),
            ..Default::default()
        };
        let e = s
            .apply("nats://h:4222", ConnectOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.key, "security.credentials_file");
        assert!(!e.to_string().contains("SECRETISH"), "{e}");

        let both = NatsSecurity {
            credentials_file: Some(creds.clone()),
            ..Default::default()
        };
        let e = both
            .apply("nats://u:p@h:4222", ConnectOptions::new())
            .await
            .unwrap_err();
        assert_eq!(e.key, "url");
        let _ = std::fs::remove_file(seed);
        let _ = std::fs::remove_file(creds);
    }
}
