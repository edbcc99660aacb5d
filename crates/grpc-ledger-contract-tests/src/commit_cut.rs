//! A TCP proxy between a store's clients and its server that, once armed, lets the next COMMIT
//! through, holds back the server's answer to it and cuts the connection: the commit happened and
//! the client never hears so. What a fixture needs for the [`LostCommit`](crate::LostCommit) hook
//! on a networked store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// The wire protocol the proxy reads, to recognise a COMMIT sent as a simple statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WireProtocol {
    /// PostgreSQL's frontend protocol: a `Query` message (`'Q'`, length, `COMMIT\0`).
    Postgres,
    /// MariaDB/MySQL's client protocol: a `COM_QUERY` packet (length, sequence 0, `0x03`,
    /// `COMMIT`).
    MySql,
}

impl WireProtocol {
    /// The bytes of a COMMIT, as the drivers send it.
    fn commit_message(self) -> &'static [u8] {
        match self {
            Self::Postgres => b"Q\x00\x00\x00\x0bCOMMIT\x00",
            Self::MySql => b"\x07\x00\x00\x00\x03COMMIT",
        }
    }
}

/// A proxy in front of one server. Dropping it stops accepting; open connections end with their
/// clients.
pub struct CommitCutProxy {
    address: SocketAddr,
    armed: Arc<AtomicBool>,
    cut: Arc<Notify>,
    accept: tokio::task::JoinHandle<()>,
}

impl CommitCutProxy {
    /// Listens on 127.0.0.1 (a port of its own) and forwards every connection to `server`.
    pub async fn start(server: SocketAddr, protocol: WireProtocol) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let armed = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(Notify::new());
        let accept = tokio::spawn({
            let (armed, cut) = (Arc::clone(&armed), Arc::clone(&cut));
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(upstream) = TcpStream::connect(server).await else {
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = upstream.set_nodelay(true);
                    tokio::spawn(relay(
                        client,
                        upstream,
                        protocol,
                        Arc::clone(&armed),
                        Arc::clone(&cut),
                    ));
                }
            }
        });
        Ok(Self {
            address,
            armed,
            cut,
            accept,
        })
    }

    /// Where clients connect instead of the server.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Makes the next COMMIT on any connection the one whose answer is lost.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Waits until an armed cut has happened: the COMMIT reached the server, its answer came back
    /// to the proxy and was thrown away, and the connection was cut.
    pub async fn cut_done(&self) {
        self.cut.notified().await;
    }
}

impl crate::CommitCut for CommitCutProxy {
    fn arm(&self) {
        CommitCutProxy::arm(self);
    }
}

impl Drop for CommitCutProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Relays one connection both ways. When armed, the client's COMMIT goes through; the first bytes
/// the server sends after it (its answer) are dropped and both sides are closed.
async fn relay(
    mut client: TcpStream,
    mut upstream: TcpStream,
    protocol: WireProtocol,
    armed: Arc<AtomicBool>,
    cut: Arc<Notify>,
) {
    let pattern = protocol.commit_message();
    let mut commit_sent = false;
    let (mut to_server, mut from_server) = ([0u8; 16 * 1024], [0u8; 16 * 1024]);
    loop {
        tokio::select! {
            read = client.read(&mut to_server) => {
                let Ok(n) = read else { return };
                if n == 0 { return; }
                let chunk = &to_server[..n];
                if !commit_sent
                    && chunk.windows(pattern.len()).any(|w| w == pattern)
                    && armed.swap(false, Ordering::SeqCst)
                {
                    commit_sent = true;
                }
                if upstream.write_all(chunk).await.is_err() { return; }
            }
            read = upstream.read(&mut from_server) => {
                let Ok(n) = read else { return };
                if n == 0 { return; }
                if commit_sent {
                    // The server answered the COMMIT: it is done there. The client never hears.
                    drop(client);
                    drop(upstream);
                    cut.notify_one();
                    return;
                }
                if client.write_all(&from_server[..n]).await.is_err() { return; }
            }
        }
    }
}
