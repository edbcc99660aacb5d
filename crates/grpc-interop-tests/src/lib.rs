//! gRPC C-core as the reference for this workspace's retries.
//!
//! A probe server (tonic) scripts each call's answers from its request and logs every attempt it
//! sees: when it arrived and its `grpc-previous-rpc-attempts`. The same service config and the
//! same scripts are run through Python's grpcio (gRPC C-core) and through
//! [`grpc_tonic::RetryExecutor`]; the tests compare what the server saw.
//!
//! A script is a few words: `ok`; `fail CODE N` (fail with CODE the first N attempts, `always`
//! for every one, then answer OK); `delay MS` (answer OK after MS milliseconds); `pushback VALUE
//! CODE N` (like `fail`, with `grpc-retry-pushback-ms: VALUE`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::{Code, Request, Response, Status};

pub mod raw_h2;

pub mod pb {
    //! The generated protobuf and tonic code of `proto/probe.proto`.
    #![allow(missing_docs, unreachable_pub, clippy::all, rust_2018_idioms)]
    include!(concat!(env!("OUT_DIR"), "/interop.v1.rs"));
}

/// The probe's one method.
pub const METHOD: &str = "/interop.v1.Probe/Call";

/// One attempt the server saw.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    /// When it arrived.
    pub at: Instant,
    /// Its `grpc-previous-rpc-attempts`, if it carried one.
    pub previous_attempts: Option<u32>,
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

#[tonic::async_trait]
impl pb::probe_server::Probe for Scripted {
    async fn call(
        &self,
        request: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeReply>, Status> {
        let previous_attempts = request
            .metadata()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let message = request.into_inner();
        let attempt = {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            let attempts = log.entry(message.call_id.clone()).or_default();
            attempts.push(Attempt {
                at: Instant::now(),
                previous_attempts,
            });
            attempts.len() as u32
        };
        let words: Vec<&str> = message.script.split_whitespace().collect();
        let failures = |n: &str| match n {
            "always" => u32::MAX,
            n => n.parse().unwrap_or(0),
        };
        let reply = || Ok(Response::new(pb::ProbeReply { attempt }));
        match words.as_slice() {
            ["ok"] => reply(),
            ["delay", millis] => {
                tokio::time::sleep(Duration::from_millis(millis.parse().unwrap_or(0))).await;
                reply()
            }
            ["fail", code, n] if attempt <= failures(n) => Err(Status::new(
                code_named(code),
                format!("scripted failure {attempt}"),
            )),
            ["pushback", value, code, n] if attempt <= failures(n) => {
                let mut status =
                    Status::new(code_named(code), format!("scripted pushback {attempt}"));
                status.metadata_mut().insert(
                    "grpc-retry-pushback-ms",
                    value.parse().expect("a metadata value"),
                );
                Err(status)
            }
            ["fail" | "pushback", ..] => reply(),
            _ => Err(Status::invalid_argument("unknown script")),
        }
    }
}

fn code_named(name: &str) -> Code {
    grpc_policy::parse_code(name).unwrap_or(Code::Unknown)
}
