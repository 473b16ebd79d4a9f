//! A test TLS kit: a throw-away certificate authority that issues server and client
//! certificates, and a TLS-terminating proxy that puts TLS in front of a plain-text service
//! (how the TLS tests reach a broker or provider that has no TLS listener of its own).
#![allow(missing_docs)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct PemPair {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A certificate authority made for one test, with its files in a fresh directory (removed on
/// drop).
pub struct TestPki {
    pub dir: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestPki {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "outbox-pki-{name}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("outbox test CA {name}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.join("ca.pem"), issuer.pem()).unwrap();
        Self { dir, issuer }
    }

    /// The CA certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    fn issue(&self, file: &str, names: &[&str], purpose: ExtendedKeyUsagePurpose) -> PemPair {
        let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("outbox test {file}"));
        params.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let pair = PemPair {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
        };
        std::fs::write(&pair.cert, cert.pem()).unwrap();
        std::fs::write(&pair.key, key.serialize_pem()).unwrap();
        pair
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, file: &str, names: &[&str]) -> PemPair {
        self.issue(file, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate.
    pub fn client(&self, file: &str) -> PemPair {
        self.issue(
            file,
            &["outbox-client"],
            ExtendedKeyUsagePurpose::ClientAuth,
        )
    }

    /// A rustls server configuration presenting `server`; with `client_ca`, a client
    /// certificate signed by that CA is required.
    pub fn server_config(server: &PemPair, client_ca: Option<&Path>) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&server.cert)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&server.key).unwrap();
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_file_iter(ca).unwrap() {
                    roots.add(c.unwrap()).unwrap();
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        Arc::new(builder.with_single_cert(chain, key).unwrap())
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Terminates TLS on a free loopback port and forwards the plain bytes to `upstream`; each
/// connection whose handshake fails is dropped (and counted).
pub struct TlsProxy {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
    handshakes_failed: Arc<std::sync::atomic::AtomicUsize>,
    handshakes_ok: Arc<std::sync::atomic::AtomicUsize>,
}

impl TlsProxy {
    pub async fn start(upstream: SocketAddr, config: Arc<rustls::ServerConfig>) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let failed = Arc::new(AtomicUsize::new(0));
        let ok = Arc::new(AtomicUsize::new(0));
        let (failed2, ok2) = (Arc::clone(&failed), Arc::clone(&ok));
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                let (failed, ok) = (Arc::clone(&failed2), Arc::clone(&ok2));
                tokio::spawn(async move {
                    let mut tls = match acceptor.accept(tcp).await {
                        Ok(s) => s,
                        Err(_) => {
                            failed.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                    };
                    ok.fetch_add(1, Ordering::SeqCst);
                    if let Ok(mut up) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                    }
                });
            }
        });
        Self {
            addr,
            task,
            handshakes_failed: failed,
            handshakes_ok: ok,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Completed TLS handshakes.
    pub fn handshakes_ok(&self) -> usize {
        self.handshakes_ok.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Refused or broken TLS handshakes.
    pub fn handshakes_failed(&self) -> usize {
        self.handshakes_failed
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
