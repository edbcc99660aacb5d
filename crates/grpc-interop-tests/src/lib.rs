//! gRPC C-core as the reference for this workspace's retries.
//!
//! A probe server (tonic) scripts each call's answers from its request and logs every attempt it
//! sees: when it arrived and its `grpc-previous-rpc-attempts`. The same service config and the
//! same scripts are run through Python's grpcio (gRPC C-core) and through
//! [`grpc_tonic::RetryExecutor`]; the tests compare what the server saw.
//!
//! A script is a few words: `ok`; `fail CODE N` (fail with CODE the first N attempts, `always`
//! for every one, then answer OK); `delay MS` (answer OK after MS milliseconds); `pushback VALUE
//! CODE N` (like `fail`, with `grpc-retry-pushback-ms: VALUE`). `Upload` (client streaming)
//! follows the script of its first message; `Watch` (server streaming) reads `stream N CODE`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::{Code, Request, Response, Status};

pub mod guarded;
pub mod raw_h2;

pub mod pb {
    //! The generated protobuf and tonic code of `proto/probe.proto`.
    #![allow(missing_docs, unreachable_pub, clippy::all, rust_2018_idioms)]
    include!(concat!(env!("OUT_DIR"), "/interop.v1.rs"));
}

/// The probe's unary method.
pub const METHOD: &str = "/interop.v1.Probe/Call";

/// The descriptor set of `proto/probe.proto`, compiled by protox at build time.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe.pb"));

/// A channel to the server at `addr` on loopback, connecting on its first call (so that a test's
/// first attempt meets whatever the server does to new connections).
pub fn lazy_channel(addr: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a loopback address is a valid URI")
        .connect_lazy()
}

/// One attempt the server saw.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// When it arrived.
    pub at: Instant,
    /// Its `grpc-previous-rpc-attempts`, if it carried one.
    pub previous_attempts: Option<u32>,
    /// Its `idempotency-key`, if it carried one.
    pub key: Option<String>,
}

type Log = Arc<Mutex<HashMap<String, Vec<Attempt>>>>;

/// A running probe server on a loopback port.
pub struct ProbeServer {
    addr: SocketAddr,
    log: Log,
}

impl ProbeServer {
    /// Starts the server on a free loopback port; it runs until the runtime ends.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        let log = Log::default();
        let service = Scripted {
            log: Arc::clone(&log),
        };
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(pb::probe_server::ProbeServer::new(service))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .expect("the probe server runs");
        });
        Self { addr, log }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The attempts of call `call_id`, in arrival order.
    pub fn attempts(&self, call_id: &str) -> Vec<Attempt> {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(call_id)
            .cloned()
            .unwrap_or_default()
    }
}

struct Scripted {
    log: Log,
}

impl Scripted {
    /// Logs an attempt of `call_id` and returns its number (from 1).
    fn log_attempt(&self, call_id: &str, metadata: &tonic::metadata::MetadataMap) -> u32 {
        let header = |name: &str| metadata.get(name).and_then(|v| v.to_str().ok());
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let attempts = log.entry(call_id.to_owned()).or_default();
        attempts.push(Attempt {
            at: Instant::now(),
            previous_attempts: header("grpc-previous-rpc-attempts").and_then(|v| v.parse().ok()),
            key: header("idempotency-key").map(str::to_owned),
        });
        attempts.len() as u32
    }
}

/// Runs `script` for attempt number `attempt`: the answer is OK (`Ok(())`) or a status.
async fn run_script(script: &str, attempt: u32) -> Result<(), Status> {
    let words: Vec<&str> = script.split_whitespace().collect();
    let failures = |n: &str| match n {
        "always" => u32::MAX,
        n => n.parse().unwrap_or(0),
    };
    match words.as_slice() {
        ["ok"] => Ok(()),
        ["delay", millis] => {
            tokio::time::sleep(Duration::from_millis(millis.parse().unwrap_or(0))).await;
            Ok(())
        }
        ["fail", code, n] if attempt <= failures(n) => Err(Status::new(
            code_named(code),
            format!("scripted failure {attempt}"),
        )),
        ["pushback", value, code, n] if attempt <= failures(n) => {
            let mut status = Status::new(code_named(code), format!("scripted pushback {attempt}"));
            status.metadata_mut().insert(
                "grpc-retry-pushback-ms",
                value.parse().expect("a metadata value"),
            );
            Err(status)
        }
        ["fail" | "pushback", ..] => Ok(()),
        _ => Err(Status::invalid_argument("unknown script")),
    }
}

type ReplyStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ProbeReply, Status>> + Send>>;

#[tonic::async_trait]
impl pb::probe_server::Probe for Scripted {
    async fn call(
        &self,
        request: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeReply>, Status> {
        let attempt = self.log_attempt(&request.get_ref().call_id, request.metadata());
        run_script(&request.get_ref().script, attempt).await?;
        Ok(Response::new(pb::ProbeReply {
            attempt,
            messages: 1,
        }))
    }

    async fn upload(
        &self,
        request: Request<tonic::Streaming<pb::ProbeRequest>>,
    ) -> Result<Response<pb::ProbeReply>, Status> {
        let metadata = request.metadata().clone();
        let mut messages = request.into_inner();
        let first = messages
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("an upload needs a first message"))?;
        let attempt = self.log_attempt(&first.call_id, &metadata);
        let mut count = 1;
        while messages.message().await?.is_some() {
            count += 1;
        }
        run_script(&first.script, attempt).await?;
        Ok(Response::new(pb::ProbeReply {
            attempt,
            messages: count,
        }))
    }

    type WatchStream = ReplyStream;

    async fn watch(
        &self,
        request: Request<pb::ProbeRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        let attempt = self.log_attempt(&request.get_ref().call_id, request.metadata());
        let script = request.into_inner().script;
        let (count, code) = match script.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["stream", n, code] => (n.parse().unwrap_or(0), code_named(code)),
            _ => return Err(Status::invalid_argument("unknown script")),
        };
        let mut items: Vec<Result<pb::ProbeReply, Status>> = (0..count)
            .map(|_| {
                Ok(pb::ProbeReply {
                    attempt,
                    messages: 0,
                })
            })
            .collect();
        if code != Code::Ok {
            items.push(Err(Status::new(code, "scripted end of stream")));
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }
}

fn code_named(name: &str) -> Code {
    grpc_policy::parse_code(name).unwrap_or(Code::Unknown)
}
