//! [`NatsSecurity`]: TLS and authentication of the connection, shared by the transport and the
//! delivery source.
//!
//! Credentials never travel inside the address handed to the client library: a
//! `nats://user:password@host` or `nats://TOKEN@host` URL is split into an address without
//! them and the matching [`ConnectOptions`] (`user_and_password` / `token`), because the
//! library prints its server addresses in its own debug logs.

use std::path::PathBuf;

use async_nats::ConnectOptions;
use async_nats::rustls;
use outbox_core::secrets::{Credentials, split_credentials};
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

/// A [`NatsSecurity`] setting that cannot be used: a file that cannot be read or parsed, or
/// settings that contradict each other. Names the key; never quotes a file's contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid NATS security setting `{key}`: {message}")]
pub struct NatsSecurityError {
    /// The key, e.g. `security.ca_file`.
    pub key: &'static str,
    /// What is wrong.
    pub message: String,
}

fn bad(key: &'static str, message: impl Into<String>) -> NatsSecurityError {
    NatsSecurityError {
        key,
        message: message.into(),
    }
}

impl NatsSecurity {
    /// Checks the settings without touching the files: a certificate needs its key and the
    /// other way round, and only one of the credentials file and the NKey seed file may be set.
    ///
    /// # Errors
    /// A [`NatsSecurityError`] naming the key.
    pub fn validate(&self) -> Result<(), NatsSecurityError> {
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
    /// A [`NatsSecurityError`]: an invalid combination ([`NatsSecurity::validate`]), credentials
    /// both in the URL and in a file, a file that cannot be read, an NKey seed that does not
    /// parse.
    pub async fn apply(
        &self,
        url: &str,
        mut options: ConnectOptions,
    ) -> Result<(String, ConnectOptions), NatsSecurityError> {
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
    fn client_config(&self) -> Result<rustls::ClientConfig, NatsSecurityError> {
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
        assert!(e.message.contains("/nonexistent/outbox/ca.pem"), "{e}");

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
