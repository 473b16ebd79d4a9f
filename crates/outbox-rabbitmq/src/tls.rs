//! [`RabbitTls`]: a custom certificate authority and a client certificate for `amqps://`
//! connections, shared by the transport and the delivery source.

use std::path::{Path, PathBuf};

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};
use serde::Deserialize;

use crate::config::RabbitConfigError;

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

fn bad(key: &'static str, reason: impl Into<String>) -> RabbitConfigError {
    RabbitConfigError {
        key,
        reason: reason.into(),
    }
}

/// Reads a PEM file and checks it holds a block whose label ends in `label_end`. The error
/// names the path, never the contents.
fn read_pem(key: &'static str, path: &Path, label_end: &str) -> Result<Vec<u8>, RabbitConfigError> {
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
    /// A [`RabbitConfigError`] naming `tls.cert_file` or `tls.key_file`.
    pub fn validate(&self) -> Result<(), RabbitConfigError> {
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
    /// A [`RabbitConfigError`]: TLS files with an `amqp://` URL, a file that cannot be read or
    /// holds no PEM certificate / private key.
    pub(crate) fn load(&self, uri: &AMQPUri) -> Result<OwnedTLSConfig, RabbitConfigError> {
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
pub(crate) async fn connect(
    uri: AMQPUri,
    properties: ConnectionProperties,
    tls: &OwnedTLSConfig,
) -> lapin::Result<Connection> {
    let runtime = lapin::runtime::default_runtime()?;
    Connection::connect_uri_with_config(uri, properties, tls.clone(), runtime).await
}

#[cfg(test)]
mod tests {
    use super::*;

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
