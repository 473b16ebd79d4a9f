//! Outage behaviour against a PRIVATE nats-server process this test starts, kills and
//! restarts (the shared server is never touched): what the conformance suite's proxy cannot
//! show, that a stream on file storage keeps acknowledged events across a server restart and
//! the transport reconnects to the restarted process. The binary is `OUTBOX_TEST_NATS_SERVER`
//! (default `nats-server` on `PATH`); a missing binary fails the test.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_core::{OutboxMessage, PublishErrorKind, Transport};
use outbox_nats::async_nats::jetstream;
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_testkit::message;
use uuid::Uuid;

struct Server {
    child: Child,
    port: u16,
    store: PathBuf,
}

impl Server {
    fn start(port: u16, store: &Path) -> Self {
        let binary =
            std::env::var("OUTBOX_TEST_NATS_SERVER").unwrap_or_else(|_| "nats-server".to_owned());
        let child = Command::new(&binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(store)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start `{binary}` (set OUTBOX_TEST_NATS_SERVER): {e}")
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            port,
            store: store.to_owned(),
        }
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free port")
}

fn numbered(n: u32) -> OutboxMessage {
    message::event(&format!("pay-{n}"), 1, format!(r#"{{"n":{n}}}"#))
}

#[tokio::test]
async fn publishes_fail_during_an_outage_and_succeed_after_reconnect() {
    let store = std::env::temp_dir().join(format!("outbox-nats-test-{}", Uuid::now_v7().simple()));
    let port = free_port();
    let mut server = Server::start(port, &store);
    let url = format!("nats://127.0.0.1:{port}");
    let config = NatsConfig {
        ack_timeout_secs: 1,
        ..NatsConfig::default()
    };
    let transport = NatsTransport::connect(&url, config)
        .await
        .expect("connect to the private server");

    transport
        .publish(&numbered(1))
        .await
        .expect("publish before the outage");

    server.stop();
    let during = numbered(2);
    let started = Instant::now();
    let err = transport
        .publish(&during)
        .await
        .expect_err("a publish during the outage must not succeed");
    assert!(
        matches!(
            err.kind,
            PublishErrorKind::TimedOut | PublishErrorKind::Unavailable
        ),
        "{err}"
    );
    assert!(err.is_retryable());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    let restarted = Server::start(server.port, &server.store.clone());
    // The relay would retry the same message with backoff; the client reconnects by itself.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match transport.publish(&during).await {
            Ok(_) => break,
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert!(Instant::now() < deadline, "no reconnect within 30s: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    transport
        .publish(&numbered(3))
        .await
        .expect("publish after reconnect");

    // File storage kept message 1; message 2 is stored exactly once, whether the copy the
    // client sent during the outage arrived or not (Nats-Msg-Id dedup).
    let js = jetstream::new(transport.client().clone());
    let mut stream = js.get_stream("OUTBOX").await.expect("stream");
    let info = stream.info().await.expect("info");
    assert_eq!(info.state.messages, 3);

    drop(restarted);
    let _ = std::fs::remove_dir_all(&store);
}
