//! TLS everywhere, against real servers: the local PostgreSQL (TLS on, a self-signed certificate for localhost),
//! a second nats-server this test starts with certificates it generates (TLS, mutual TLS, NKey
//! users, operator mode with a credentials file), and RabbitMQ reached through a
//! TLS-terminating proxy the test controls (the shared broker has no AMQPS listener). Plain
//! text where TLS was required must always be an error, never a fallback.
#![allow(missing_docs)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use common::{TempFile, TestDb, amqp_url, database_url, event, outbox, run, uid};
use futures::StreamExt;
use outbox_core::Transport;
use outbox_nats::async_nats::ConnectOptions;
use outbox_nats::{NatsConfig, NatsSecurity, NatsTransport};
use outbox_rabbitmq::{RabbitConfig, RabbitTls, RabbitTransport};
use outbox_testkit::tls::{PemPair, TestPki, TlsProxy};
use sqlx::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Time allowed to a command that should finish at once.
const QUICK: Duration = Duration::from_secs(30);

// ------------------------------------------------------------------------------------------
// PostgreSQL
// ------------------------------------------------------------------------------------------

/// `database_url()` with `params` added to its query.
fn pg_url(params: &str) -> String {
    let base = database_url();
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{params}")
}

/// `database_url()` with its host replaced by `host`.
fn pg_url_with_host(host: &str, params: &str) -> String {
    pg_url(params).replacen("127.0.0.1", host, 1)
}

/// Whether a connection made with `url` is encrypted, as the server sees it.
async fn encrypted(url: &str) -> Result<bool, sqlx::Error> {
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    Ok(ssl)
}

/// The server's certificate file (Debian's snakeoil or the one `scripts/services` makes: SAN `localhost`,
/// self-signed); fails loudly when the server has TLS off.
async fn server_certificate() -> PathBuf {
    let mut conn = sqlx::PgConnection::connect(&pg_url("sslmode=disable"))
        .await
        .expect("PostgreSQL is required");
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        ssl, "on",
        "the local PostgreSQL must have TLS on for these tests"
    );
    let file: String = sqlx::query_scalar("SHOW ssl_cert_file")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    PathBuf::from(file)
}

#[tokio::test]
async fn postgres_sslmode_require_connects_encrypted() {
    assert!(encrypted(&pg_url("sslmode=require")).await.unwrap());
    // `prefer` (the default) now negotiates TLS when the server offers it.
    assert!(encrypted(&database_url()).await.unwrap());
    // The check itself can tell plain text apart.
    assert!(!encrypted(&pg_url("sslmode=disable")).await.unwrap());
}

#[tokio::test]
async fn postgres_verify_modes_check_the_ca_and_the_name() {
    let cert = server_certificate().await;
    let root = format!("sslrootcert={}", cert.display());
    // The server's certificate names `localhost` (`scripts/services` sees to it): verify-full
    // passes for that name only.
    assert!(
        encrypted(&pg_url_with_host(
            "localhost",
            &format!("sslmode=verify-full&{root}")
        ))
        .await
        .unwrap()
    );
    let e = encrypted(&pg_url(&format!("sslmode=verify-full&{root}")))
        .await
        .expect_err("127.0.0.1 is not a name in the certificate");
    assert!(e.to_string().contains("certificate"), "{e}");
    // verify-ca checks the chain. (sqlx 0.9 with this rustls still checks the name for an IP
    // address host; see docs/security.md.)
    assert!(
        encrypted(&pg_url_with_host(
            "localhost",
            &format!("sslmode=verify-ca&{root}")
        ))
        .await
        .unwrap()
    );
    // A CA that did not sign the server's certificate is refused, in both verify modes.
    let pki = TestPki::new("pg-unknown-ca");
    for mode in ["verify-ca", "verify-full"] {
        let url = pg_url_with_host(
            "localhost",
            &format!("sslmode={mode}&sslrootcert={}", pki.ca_file().display()),
        );
        let e = encrypted(&url).await.expect_err("unknown CA");
        assert!(e.to_string().contains("certificate"), "{mode}: {e}");
    }
}

/// A server that answers PostgreSQL's SSLRequest with `N` (no TLS) and records whatever the
/// client sends after that answer.
async fn no_tls_server() -> (SocketAddr, tokio::task::JoinHandle<(Vec<u8>, Vec<u8>)>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut request = vec![0u8; 8];
        s.read_exact(&mut request).await.unwrap();
        s.write_all(b"N").await.unwrap();
        let mut after = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut after)).await;
        (request, after)
    });
    (addr, task)
}

#[tokio::test]
async fn postgres_require_against_a_server_without_tls_is_an_error() {
    let (addr, server) = no_tls_server().await;
    let url = format!(
        "postgres://postgres:pg-s3cret@127.0.0.1:{}/test?sslmode=require",
        addr.port()
    );
    let e = sqlx::PgConnection::connect(&url)
        .await
        .expect_err("TLS was required");
    assert!(e.to_string().contains("TLS"), "{e}");
    let (request, after) = server.await.unwrap();
    // SSLRequest: length 8, code 80877103.
    assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47]);
    assert!(
        after.is_empty(),
        "nothing may be sent in plain text after the refusal: {after:?}"
    );
}

#[tokio::test]
async fn cli_honours_sslmode_in_the_database_url() {
    let db = TestDb::new().await;
    let mut cmd = outbox(Some(db.name()), None, None);
    cmd.env("OUTBOX_DATABASE_URL", pg_url("sslmode=require"))
        .arg("migrate");
    let r = run(cmd, QUICK).await;
    assert!(r.status.success(), "{r:?}");

    let pki = TestPki::new("cli-pg");
    let mut cmd = outbox(Some(db.name()), None, None);
    cmd.env(
        "OUTBOX_DATABASE_URL",
        pg_url_with_host(
            "localhost",
            &format!(
                "sslmode=verify-full&sslrootcert={}",
                pki.ca_file().display()
            ),
        ),
    )
    .arg("migrate");
    let r = run(cmd, QUICK).await;
    assert_eq!(r.status.code(), Some(2), "{r:?}");
    assert!(r.stderr.contains("cannot connect to PostgreSQL"), "{r:?}");
    db.drop().await;
}

// ------------------------------------------------------------------------------------------
// NATS: a second nats-server with generated certificates
// ------------------------------------------------------------------------------------------

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A nats-server started for one test from a config file, killed on drop.
struct NatsServer {
    child: Child,
    port: u16,
    _config: TempFile,
    dir: PathBuf,
}

impl NatsServer {
    /// Starts `/usr/sbin/nats-server` with `body` (TLS, auth ...) and JetStream when `js`.
    async fn start(body: &str, js: bool) -> NatsServer {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("outbox-nats-tls-{}", uid()));
        std::fs::create_dir_all(&dir).unwrap();
        let jetstream = if js {
            format!("jetstream {{ store_dir: \"{}\" }}\n", dir.display())
        } else {
            String::new()
        };
        let config = TempFile::new(
            ".conf",
            &format!("listen: \"127.0.0.1:{port}\"\n{jetstream}{body}\n"),
        );
        // On PATH, or where Debian's package puts it (`scripts/services` checks one exists).
        let exe = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join("nats-server"))
            .find(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("/usr/sbin/nats-server"));
        let child = std::process::Command::new(&exe)
            .arg("-c")
            .arg(config.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("nats-server is required ({}): {e}", exe.display()));
        let server = NatsServer {
            child,
            port,
            _config: config,
            dir,
        };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("nats-server did not listen on {port}");
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tls_block(server: &PemPair, client_ca: Option<&Path>) -> String {
    let verify = match client_ca {
        Some(ca) => format!("  ca_file: \"{}\"\n  verify: true\n", ca.display()),
        None => String::new(),
    };
    format!(
        "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n{verify}}}\n",
        server.cert.display(),
        server.key.display()
    )
}

fn nats_config(security: NatsSecurity) -> NatsConfig {
    let prefix = format!("tls_{}", uid());
    NatsConfig {
        stream: format!("TLS_{}", uid().to_uppercase()),
        stream_subjects: vec![format!("{prefix}.>")],
        subject_template: format!("{prefix}.{{aggregate_type}}.{{event_type}}"),
        connect_timeout_secs: 3,
        security,
        ..NatsConfig::default()
    }
}

fn outbox_message(agg: &str) -> outbox_core::OutboxMessage {
    let m = event(agg, 1);
    outbox_core::OutboxMessage {
        id: 1,
        event_id: m.event_id,
        aggregate_type: m.aggregate_type,
        aggregate_id: m.aggregate_id,
        aggregate_version: m.aggregate_version,
        event_type: m.event_type,
        schema_version: m.schema_version,
        fingerprint: m.payload.fingerprint(),
        payload: m.payload,
        headers: m.headers,
        destination: None,
        partition_key: None,
        created_at: chrono::Utc::now(),
        attempts: 0,
    }
}

#[tokio::test]
async fn nats_tls_with_a_generated_ca_publishes_and_unverified_or_plain_is_refused() {
    let pki = TestPki::new("nats-tls");
    let server_cert = pki.server("nats", &["localhost"]);
    let nats = NatsServer::start(&tls_block(&server_cert, None), true).await;
    let url = format!("tls://localhost:{}", nats.port);

    // Verified TLS: connects, creates the stream, gets the PublishAck.
    let config = nats_config(NatsSecurity {
        ca_file: Some(pki.ca_file()),
        ..NatsSecurity::default()
    });
    let transport = NatsTransport::connect(&url, config.clone())
        .await
        .expect("TLS with the test CA");
    let receipt = transport.publish(&outbox_message("tls-1")).await.unwrap();
    assert!(!receipt.duplicate);

    // Without the CA the server's certificate is unknown: refused.
    let e = NatsTransport::connect(&url, nats_config(NatsSecurity::default()))
        .await
        .expect_err("unknown CA");
    assert!(
        matches!(e, outbox_nats::NatsConnectError::Connect { .. }),
        "{e}"
    );

    // TLS required against the shared plain-text server: an error, never plain text.
    for (plain, security) in [
        ("tls://127.0.0.1:4222", NatsSecurity::default()),
        (
            "nats://127.0.0.1:4222",
            NatsSecurity {
                require_tls: true,
                ..NatsSecurity::default()
            },
        ),
        (
            "nats://127.0.0.1:4222",
            NatsSecurity {
                ca_file: Some(pki.ca_file()),
                ..NatsSecurity::default()
            },
        ),
    ] {
        let r = NatsTransport::connect(plain, nats_config(security)).await;
        assert!(
            r.is_err(),
            "{plain}: plain text must be refused when TLS is required"
        );
    }
}

#[tokio::test]
async fn nats_mutual_tls_and_nkey_user() {
    let pki = TestPki::new("nats-mtls");
    let server_cert = pki.server("nats", &["localhost"]);
    let user = outbox_nats_nkey_user();
    let body = format!(
        "{}authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
        tls_block(&server_cert, Some(&pki.ca_file())),
        user.public_key()
    );
    let nats = NatsServer::start(&body, true).await;
    let url = format!("tls://localhost:{}", nats.port);
    let client = pki.client("relay");
    let seed = TempFile::new(".nk", &format!("{}\n", user.seed().unwrap()));
    let full = NatsSecurity {
        ca_file: Some(pki.ca_file()),
        cert_file: Some(client.cert.clone()),
        key_file: Some(client.key.clone()),
        nkey_seed_file: Some(seed.path().to_owned()),
        ..NatsSecurity::default()
    };
    let transport = NatsTransport::connect(&url, nats_config(full.clone()))
        .await
        .expect("mutual TLS with an NKey user");
    transport.publish(&outbox_message("mtls-1")).await.unwrap();

    // Without the client certificate the server refuses the handshake.
    let no_cert = NatsSecurity {
        cert_file: None,
        key_file: None,
        ..full.clone()
    };
    assert!(
        NatsTransport::connect(&url, nats_config(no_cert))
            .await
            .is_err()
    );
    // Without the NKey the server refuses the user.
    let no_nkey = NatsSecurity {
        nkey_seed_file: None,
        ..full.clone()
    };
    assert!(
        NatsTransport::connect(&url, nats_config(no_nkey))
            .await
            .is_err()
    );
    // Another NKey is not a known user.
    let stranger = TempFile::new(
        ".nk",
        &format!("{}\n", outbox_nats_nkey_user().seed().unwrap()),
    );
    let wrong = NatsSecurity {
        nkey_seed_file: Some(stranger.path().to_owned()),
        ..full
    };
    assert!(
        NatsTransport::connect(&url, nats_config(wrong))
            .await
            .is_err()
    );
}

fn outbox_nats_nkey_user() -> nats_jwt::KeyPair {
    nats_jwt::KeyPair::new_user()
}

/// A `.creds` file as `nsc` writes it.
fn creds_file(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )
}

#[tokio::test]
async fn nats_credentials_file_in_operator_mode_over_tls() {
    let pki = TestPki::new("nats-creds");
    let server_cert = pki.server("nats", &["localhost"]);
    let operator = nats_jwt::KeyPair::new_operator();
    let account = nats_jwt::KeyPair::new_account();
    let account_jwt = nats_jwt::Token::new_account(account.public_key())
        .name("outbox-test")
        .sign(&operator);
    let user = nats_jwt::KeyPair::new_user();
    let user_jwt = nats_jwt::Token::new_user(account.public_key(), user.public_key())
        .name("relay")
        .sign(&account);
    let body = format!(
        "{}trusted_keys: [\"{}\"]\nresolver: MEMORY\nresolver_preload: {{ {}: \"{}\" }}\n",
        tls_block(&server_cert, None),
        operator.public_key(),
        account.public_key(),
        account_jwt
    );
    let nats = NatsServer::start(&body, false).await;
    let url = format!("tls://localhost:{}", nats.port);
    let creds = TempFile::new(".creds", &creds_file(&user_jwt, &user.seed().unwrap()));
    let security = NatsSecurity {
        ca_file: Some(pki.ca_file()),
        credentials_file: Some(creds.path().to_owned()),
        ..NatsSecurity::default()
    };
    let (address, options) = security
        .apply(&url, ConnectOptions::new())
        .await
        .expect("the credentials file is read");
    let client = options
        .connect(address)
        .await
        .expect("the user JWT is accepted over TLS");
    let mut sub = client.subscribe("creds.check").await.unwrap();
    client.publish("creds.check", "ok".into()).await.unwrap();
    client.flush().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), sub.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&got.payload[..], b"ok");

    // Without the credentials the server refuses the connection.
    let anonymous = NatsSecurity {
        ca_file: Some(pki.ca_file()),
        ..NatsSecurity::default()
    };
    let (address, options) = anonymous.apply(&url, ConnectOptions::new()).await.unwrap();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        options
            .connection_timeout(Duration::from_secs(3))
            .connect(address),
    )
    .await;
    assert!(
        !matches!(r, Ok(Ok(_))),
        "a connection without credentials must be refused"
    );
}

#[tokio::test]
async fn relay_command_publishes_over_nats_tls_from_cli_flags() {
    let pki = TestPki::new("nats-cli");
    let server_cert = pki.server("nats", &["localhost"]);
    let nats = NatsServer::start(&tls_block(&server_cert, Some(&pki.ca_file())), true).await;
    let client = pki.client("relay");
    let db = TestDb::new().await;
    let config = nats_config(NatsSecurity::default());
    let toml = format!(
        "[nats]\nstream = \"{}\"\nstream_subjects = [\"{}\"]\nsubject_template = \"{}\"\n",
        config.stream, config.stream_subjects[0], config.subject_template
    );
    let file = common::config_file("", &toml);
    let url = format!("tls://localhost:{}", nats.port);
    let e = event("cli-tls", 1);
    db.enqueue(std::slice::from_ref(&e)).await;
    let mut cmd = outbox(Some(db.name()), Some(&url), Some(file.path()));
    cmd.arg("relay")
        .arg("--broker-ca-file")
        .arg(pki.ca_file())
        .arg("--broker-cert-file")
        .arg(&client.cert)
        .arg("--broker-key-file")
        .arg(&client.key);
    let mut relay = common::ChildGuard::spawn(cmd, "relay-tls");
    common::wait_until(Duration::from_secs(20), "the event is published", || {
        let db = &db;
        async move { db.count("true").await == 0 }
    })
    .await;
    relay.assert_running();
    relay.terminate().await;

    // The same relay without the client certificate cannot start.
    let mut cmd = outbox(Some(db.name()), Some(&url), Some(file.path()));
    cmd.arg("relay").arg("--broker-ca-file").arg(pki.ca_file());
    let r = run(cmd, QUICK).await;
    assert_eq!(r.status.code(), Some(2), "{r:?}");
    assert!(r.stderr.contains("NATS"), "{r:?}");
    db.drop().await;
}

// ------------------------------------------------------------------------------------------
// RabbitMQ: AMQPS through a TLS terminator in front of the shared broker
// ------------------------------------------------------------------------------------------

fn amqp_upstream() -> SocketAddr {
    let url = amqp_url();
    let hostport = common::host_port(&url);
    hostport
        .parse()
        .expect("the AMQP test URL names an IP:port")
}

fn amqps_url(port: u16) -> String {
    format!("amqps://guest:guest@localhost:{port}/%2f")
}

fn rabbit_config(tls: RabbitTls) -> RabbitConfig {
    RabbitConfig {
        exchange: format!("tls-{}", uid()),
        tls,
        ..RabbitConfig::default()
    }
}

#[tokio::test]
async fn amqps_with_a_custom_ca_and_client_certificate() {
    let pki = TestPki::new("amqps");
    let server_cert = pki.server("rabbit", &["localhost"]);
    let open = TlsProxy::start(amqp_upstream(), TestPki::server_config(&server_cert, None)).await;

    let with_ca = RabbitTls {
        ca_file: Some(pki.ca_file()),
        ..RabbitTls::default()
    };
    let t = RabbitTransport::connect(&amqps_url(open.port()), rabbit_config(with_ca.clone()))
        .await
        .expect("AMQPS with the test CA");
    assert!(t.is_connected());
    assert!(open.handshakes_ok() >= 1);
    t.close().await;

    // The system's trust store alone does not know the test CA.
    let e = RabbitTransport::connect(&amqps_url(open.port()), rabbit_config(RabbitTls::default()))
        .await
        .expect_err("unknown CA");
    assert!(
        matches!(e, outbox_rabbitmq::RabbitConnectError::Unreachable { .. }),
        "{e}"
    );

    // The broker's terminator requires a client certificate from the CA.
    let mutual = TlsProxy::start(
        amqp_upstream(),
        TestPki::server_config(&server_cert, Some(&pki.ca_file())),
    )
    .await;
    assert!(
        RabbitTransport::connect(&amqps_url(mutual.port()), rabbit_config(with_ca.clone()))
            .await
            .is_err(),
        "no client certificate"
    );
    let client = pki.client("relay");
    let full = RabbitTls {
        cert_file: Some(client.cert),
        key_file: Some(client.key),
        ..with_ca.clone()
    };
    let t = RabbitTransport::connect(&amqps_url(mutual.port()), rabbit_config(full))
        .await
        .expect("mutual TLS");
    assert!(t.is_connected());
    t.close().await;

    // amqps:// against the plain-text port: an error, never plain text.
    let plain_port = amqp_upstream().port();
    assert!(
        RabbitTransport::connect(
            &format!("amqps://guest:guest@localhost:{plain_port}/%2f"),
            rabbit_config(with_ca.clone())
        )
        .await
        .is_err()
    );
    // TLS files with an amqp:// URL are refused before connecting.
    let e = RabbitTransport::connect(&amqp_url(), rabbit_config(with_ca))
        .await
        .expect_err("TLS files with amqp://");
    assert!(e.to_string().contains("amqps://"), "{e}");
}
