//! The rustls client configuration of every TLS client of the toolkit that speaks rustls
//! directly (a transport whose client library takes a rustls configuration, the HTTP payout
//! adapter): trusted authorities from
//! a PEM file or, without one, the system's trust store; an optional client certificate for
//! mutual TLS; the `ring` provider named explicitly, so nothing depends on a process-wide
//! default provider. Feature `rustls`.
//!
//! Errors name which file was wrong ([`TlsFile`]) and never its contents; each caller maps the
//! file to its own option name (`security.ca_file`, `--provider-ca-file`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The files of a TLS client.
#[derive(Debug, Clone, Copy, Default)]
pub struct TlsFiles<'a> {
    /// PEM certificate authorities to trust instead of the system's trust store.
    pub ca_file: Option<&'a PathBuf>,
    /// PEM client certificate chain (mutual TLS); needs `key_file`.
    pub cert_file: Option<&'a PathBuf>,
    /// PEM private key of the client certificate; needs `cert_file`.
    pub key_file: Option<&'a PathBuf>,
}

/// Which input of a [`TlsFiles`] an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    /// `ca_file`.
    Ca,
    /// `cert_file`.
    Cert,
    /// `key_file`.
    Key,
    /// None in particular: the TLS set-up itself.
    Setup,
}

/// Why a client configuration could not be built: which file, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct TlsError {
    /// The file (or the set-up) at fault.
    pub file: TlsFile,
    /// What is wrong, naming the path and never the file's contents.
    pub reason: String,
}

fn fail(file: TlsFile, reason: impl Into<String>) -> TlsError {
    TlsError {
        file,
        reason: reason.into(),
    }
}

/// The certificates of a PEM file; at least one.
///
/// # Errors
/// The file cannot be read or parsed, or holds no certificate.
fn pem_certs(file: TlsFile, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            fail(
                file,
                format!("cannot read a PEM certificate from {}: {e}", path.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(fail(
            file,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}

/// The rustls client configuration of `files`.
///
/// # Errors
/// [`TlsError`] naming the file: unreadable, not PEM, no certificate in it, a certificate
/// without its key (or the reverse), a key that does not go with the certificate.
pub fn client_config(files: TlsFiles<'_>) -> Result<rustls::ClientConfig, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    match files.ca_file {
        Some(ca) => {
            for cert in pem_certs(TlsFile::Ca, ca)? {
                roots
                    .add(cert)
                    .map_err(|e| fail(TlsFile::Ca, format!("{}: {e}", ca.display())))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for e in &native.errors {
                tracing::warn!(error = %e, "cannot load some of the system's certificate authorities");
            }
            roots.add_parsable_certificates(native.certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(TlsFile::Setup, format!("cannot set up TLS: {e}")))?
        .with_root_certificates(roots);
    match (files.cert_file, files.key_file) {
        (Some(cert), Some(key)) => {
            let chain = pem_certs(TlsFile::Cert, cert)?;
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                fail(
                    TlsFile::Key,
                    format!("cannot read a PEM private key from {}: {e}", key.display()),
                )
            })?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                fail(
                    TlsFile::Cert,
                    format!("the certificate and the key do not go together: {e}"),
                )
            })
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(_), None) => Err(fail(
            TlsFile::Key,
            "a client certificate needs its private key file too",
        )),
        (None, Some(_)) => Err(fail(
            TlsFile::Cert,
            "a private key file needs its client certificate too",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, contents: &str) -> PathBuf {
        let p =
            std::env::temp_dir().join(format!("outbox-core-tls-{}-{name}", uuid::Uuid::now_v7()));
        std::fs::write(&p, contents).unwrap();
        p
    }

    #[test]
    fn files_are_named_and_their_contents_are_not() {
        let secret = temp("ca.pem", "not a certificate: s3cr3t");
        let e = client_config(TlsFiles {
            ca_file: Some(&secret),
            ..TlsFiles::default()
        })
        .unwrap_err();
        assert_eq!(e.file, TlsFile::Ca);
        assert!(e.reason.contains("holds no PEM certificate"), "{e}");
        assert!(!e.reason.contains("s3cr3t"), "{e}");
        let missing = PathBuf::from("/nonexistent/client.pem");
        let e = client_config(TlsFiles {
            cert_file: Some(&missing),
            ..TlsFiles::default()
        })
        .unwrap_err();
        assert_eq!(e.file, TlsFile::Key, "a certificate without its key: {e}");
        std::fs::remove_file(secret).unwrap();
    }

    #[test]
    fn no_files_means_the_system_trust_store_and_no_client_certificate() {
        let config = client_config(TlsFiles::default()).unwrap();
        assert!(!config.client_auth_cert_resolver.has_certs());
    }
}
