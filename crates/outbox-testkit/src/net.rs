//! [`Proxy`]: a TCP proxy in front of a real broker whose connections a test can cut (closed,
//! as when the broker or the network dies) or stall (open, but nothing gets through, as when a
//! packet-dropping firewall sits in between), then restore. The shared broker is never touched.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Bytes flow both ways.
    Forwarding,
    /// Every connection was closed; new ones are closed at once.
    Cut,
    /// Connections stay open and new ones are accepted, but no byte goes through.
    Stalled,
}

#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    /// Incremented by every [`Proxy::cut`]: a connection older than the latest cut closes even
    /// when the proxy was restored before the connection saw the cut.
    cuts: u64,
}

/// A TCP proxy on `127.0.0.1` (random port) forwarding to one upstream address.
///
/// Dropping it closes the listener and every connection.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    state: watch::Sender<State>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free local port and forwards every connection to `upstream` (`host:port`).
    ///
    /// # Errors
    /// When no local port can be bound.
    pub async fn start(upstream: impl Into<String>) -> anyhow::Result<Self> {
        let upstream = upstream.into();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, watcher) = watch::channel(State {
            mode: Mode::Forwarding,
            cuts: 0,
        });
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let now = *watcher.borrow();
                if now.mode == Mode::Cut {
                    drop(client);
                    continue;
                }
                tokio::spawn(connection(
                    client,
                    upstream.clone(),
                    watcher.clone(),
                    now.cuts,
                ));
            }
        });
        Ok(Self {
            addr,
            state,
            accept,
        })
    }

    /// The local address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` with its `host:port` replaced by this proxy's address.
    ///
    /// # Errors
    /// When `url` names no host and port.
    pub fn url(&self, url: &str) -> anyhow::Result<String> {
        crate::env::with_host_port(url, &self.addr.to_string())
    }

    /// Closes every connection; new connections are closed as soon as they are accepted.
    pub fn cut(&self) {
        self.state.send_modify(|s| {
            s.mode = Mode::Cut;
            s.cuts += 1;
        });
    }

    /// Keeps every connection open but forwards nothing (bytes already read are held); new
    /// connections are accepted and held too.
    pub fn stall(&self) {
        self.state.send_modify(|s| s.mode = Mode::Stalled);
    }

    /// Forwards again: held bytes and held connections go through; after a cut, clients
    /// reconnect.
    pub fn restore(&self) {
        self.state.send_modify(|s| s.mode = Mode::Forwarding);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Waits until traffic may flow; `false` when this connection must close instead.
async fn may_forward(state: &mut watch::Receiver<State>, born_after: u64) -> bool {
    loop {
        let now = *state.borrow_and_update();
        if now.cuts > born_after || now.mode == Mode::Cut {
            return false;
        }
        if now.mode == Mode::Forwarding {
            return true;
        }
        if state.changed().await.is_err() {
            return false;
        }
    }
}

async fn connection(
    client: TcpStream,
    upstream: String,
    mut state: watch::Receiver<State>,
    born_after: u64,
) {
    if !may_forward(&mut state, born_after).await {
        return;
    }
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // When either direction ends (EOF, error, cut), both sockets are dropped and closed.
    tokio::select! {
        () = pump(client_read, server_write, state.clone(), born_after) => {}
        () = pump(server_read, client_write, state, born_after) => {}
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    born_after: u64,
) {
    let mut buf = vec![0_u8; 16 * 1024];
    loop {
        if !may_forward(&mut state, born_after).await {
            return;
        }
        // Reading is cancel-safe: a state change while waiting loses no byte.
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        // Stalled meanwhile: hold the bytes until restored (or drop them with the connection).
        if !may_forward(&mut state, born_after).await {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        stream.write_all(b"ping").await.ok()?;
        let mut buf = [0_u8; 4];
        match tokio::time::timeout(within, stream.read_exact(&mut buf)).await {
            Ok(Ok(_)) => Some(buf.to_vec()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn forwards_cuts_stalls_and_restores() {
        let proxy = Proxy::start(echo_server().await.to_string()).await.unwrap();
        let long = Duration::from_secs(10);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s, long).await.as_deref(), Some(&b"ping"[..]));

        // Stalled: nothing comes back, the connection stays open; restored, the held bytes
        // arrive.
        proxy.stall();
        assert_eq!(roundtrip(&mut s, Duration::from_millis(300)).await, None);
        proxy.restore();
        let mut buf = [0_u8; 4];
        tokio::time::timeout(long, s.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"ping");

        // Cut: the live connection is closed, a new one too; restored, new ones work.
        proxy.cut();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(long, s.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 0, "a cut connection ends");
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            roundtrip(&mut fresh, Duration::from_millis(500)).await,
            None
        );
        proxy.restore();
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            roundtrip(&mut fresh, long).await.as_deref(),
            Some(&b"ping"[..])
        );
    }

    #[tokio::test]
    async fn a_cut_undone_at_once_still_closes_older_connections() {
        let proxy = Proxy::start(echo_server().await.to_string()).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(roundtrip(&mut s, Duration::from_secs(10)).await.is_some());
        proxy.cut();
        proxy.restore();
        let mut rest = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 0);
    }
}
