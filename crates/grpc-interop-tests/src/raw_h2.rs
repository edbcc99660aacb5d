//! Raw HTTP/2 servers that do what a tonic server never does on purpose: refuse streams, send
//! GOAWAY below a stream in flight, die in the middle of a call.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::Bytes;
use http::HeaderMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The message of the raw servers' calls: one string (any request decodes as it).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Note {
    /// The text.
    #[prost(string, tag = "1")]
    pub text: String,
}

/// What a raw server does with the n-th stream it is offered (counting from 0).
#[derive(Debug, Clone, Copy)]
pub enum Behaviour {
    /// RST_STREAM(REFUSED_STREAM): the stream never reaches an application.
    Refuse,
    /// A normal gRPC answer, OK, with an empty message (which decodes as any message type).
    Answer,
    /// Reads the request, then drops the whole connection without answering.
    DieMidCall,
    /// UNAVAILABLE in a trailers-only response: the status is in the response headers, and no
    /// part of a response was delivered.
    UnavailableTrailersOnly,
    /// Response headers first, then UNAVAILABLE in the trailers: the application began its
    /// response, so A6 counts the call as committed.
    UnavailableAfterHeaders,
    /// Reads the request, then resets the stream (RST_STREAM INTERNAL_ERROR) without a response
    /// head, as a server that committed and then failed to answer (a proxy's timeout, a
    /// handler's panic) does: the caller gets INTERNAL and cannot know the outcome.
    ResetAfterRequest,
}

/// What a raw server does with each stream, by its number.
pub type Script = fn(u32) -> Behaviour;

/// A raw HTTP/2 server on loopback; `script(n)` decides what happens to stream `n`. Returns its
/// address and the number of streams it was offered.
pub async fn raw_server(script: Script) -> (SocketAddr, Arc<AtomicU32>) {
    let (listener, addr, streams, seen) = bind_loopback().await;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(serve_connection(tcp, script, Arc::clone(&seen)));
        }
    });
    (addr, streams)
}

/// A loopback listener, its address, and a stream counter with the clone its server task keeps.
async fn bind_loopback() -> (TcpListener, SocketAddr, Arc<AtomicU32>, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    let streams = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&streams);
    (listener, addr, streams, seen)
}

/// A script: the first stream is refused, every later one answered.
pub fn refuse_first(n: u32) -> Behaviour {
    if n == 0 {
        Behaviour::Refuse
    } else {
        Behaviour::Answer
    }
}

/// A script: the first stream is reset after its request was read, every later one answered.
pub fn reset_first_after_request(n: u32) -> Behaviour {
    if n == 0 {
        Behaviour::ResetAfterRequest
    } else {
        Behaviour::Answer
    }
}

/// A script: the first stream's connection dies mid-call, every later stream is answered.
pub fn die_mid_first_call(n: u32) -> Behaviour {
    if n == 0 {
        Behaviour::DieMidCall
    } else {
        Behaviour::Answer
    }
}

async fn serve_connection(tcp: TcpStream, script: Script, seen: Arc<AtomicU32>) {
    let Ok(mut connection) = h2::server::handshake(tcp).await else {
        return;
    };
    while let Some(Ok((request, mut respond))) = connection.accept().await {
        let n = seen.fetch_add(1, Ordering::SeqCst);
        match script(n) {
            Behaviour::Refuse => respond.send_reset(h2::Reason::REFUSED_STREAM),
            Behaviour::Answer => {
                let response = http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(())
                    .expect("a response head");
                let Ok(mut body) = respond.send_response(response, false) else {
                    continue;
                };
                // Uncompressed, zero-length: the default value of whatever was asked for.
                let _ = body.send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), false);
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                let _ = body.send_trailers(trailers);
            }
            Behaviour::UnavailableTrailersOnly => {
                let response = http::Response::builder()
                    .header("content-type", "application/grpc")
                    .header("grpc-status", "14")
                    .header("grpc-message", "refused before the application answered")
                    .body(())
                    .expect("a response head");
                let _ = respond.send_response(response, true);
            }
            Behaviour::UnavailableAfterHeaders => {
                let response = http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(())
                    .expect("a response head");
                let Ok(mut body) = respond.send_response(response, false) else {
                    continue;
                };
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
                trailers.insert(
                    "grpc-message",
                    http::HeaderValue::from_static("failed after the response began"),
                );
                let _ = body.send_trailers(trailers);
            }
            Behaviour::ResetAfterRequest => {
                let mut body = request.into_body();
                while let Some(Ok(_)) = body.data().await {}
                respond.send_reset(h2::Reason::INTERNAL_ERROR);
            }
            Behaviour::DieMidCall => {
                let mut body = request.into_body();
                let _ = body.data().await;
                // Returning drops the connection: the socket closes under the call.
                return;
            }
        }
    }
}

/// A server whose first connection gets a GOAWAY with last-stream-id 0 as soon as the client's
/// first HEADERS frame arrives (so that stream is above the last one the server processes);
/// later connections are served by `then`. The first connection speaks HTTP/2 by hand (server
/// SETTINGS at once, SETTINGS acknowledged, GOAWAY), so that any client, whether it waits for the
/// server's SETTINGS (gRPC C-core) or not (hyper), gets there.
pub async fn goaway_then(then: Script) -> (SocketAddr, Arc<AtomicU32>) {
    let (listener, addr, streams, seen) = bind_loopback().await;
    tokio::spawn(async move {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(goaway_below_first_stream(tcp));
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(serve_connection(tcp, then, Arc::clone(&seen)));
        }
    });
    (addr, streams)
}

/// Frame types and the one flag this hand-written side uses (RFC 9113, section 6).
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
/// The client connection preface's length.
const PREFACE: usize = 24;

fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
    out.extend_from_slice(payload);
    out
}

async fn goaway_below_first_stream(mut tcp: TcpStream) {
    if tcp.write_all(&frame(SETTINGS, 0, &[])).await.is_err() {
        return;
    }
    let (mut received, mut parsed) = (Vec::new(), PREFACE);
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = tcp.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        received.extend_from_slice(&chunk[..n]);
        while parsed + 9 <= received.len() {
            let header = &received[parsed..parsed + 9];
            let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let (kind, flags) = (header[3], header[4]);
            if parsed + 9 + len > received.len() {
                break;
            }
            parsed += 9 + len;
            if kind == SETTINGS && flags & ACK == 0 {
                let _ = tcp.write_all(&frame(SETTINGS, ACK, &[])).await;
            }
            if kind == HEADERS {
                // Last stream id 0, NO_ERROR: nothing this connection carried was processed.
                let _ = tcp.write_all(&frame(GOAWAY, 0, &[0; 8])).await;
                // Kept open: closing with unread bytes would reset the connection instead.
                std::future::pending::<()>().await;
            }
        }
    }
}
