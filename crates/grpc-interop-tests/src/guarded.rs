//! The probe service behind a keyed-mutation guard (on the in-memory ledger), for clients that
//! are not this workspace's: `Call` is a keyed mutation whose handler runs `delay MS` of its
//! script and counts its runs. A fault can lose the first response of every call after its unit
//! committed, as a dropped connection or a proxy's timeout would.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_core_api::{
    GrpcMethod, KeyHasher, LeaseDuration, OutcomeReference, RequestSchema, SchemaError,
};
use grpc_operation_ledger_memory::{InMemoryStore, InMemoryUnit};
use grpc_tonic::testing::AfterCommitFaults;
use grpc_tonic::{
    AuthenticatedPrincipal, Committed, GuardConfig, GuardMode, GuardedHandler, HandlerError,
    KeyedMutationGuard, Operation,
};
use tonic::{Request, Response, Status};

use crate::{DESCRIPTOR_SET, METHOD, pb};

/// How the guarded probe runs.
#[derive(Debug, Clone)]
pub struct GuardedOptions {
    /// The guard's protocol.
    pub mode: GuardMode,
    /// Its claims' lease.
    pub lease: Duration,
    /// The request field `Call` takes its idempotency key from (besides the key header).
    pub key_field: Option<&'static str>,
    /// Whether the first response of every call (by `call_id`) is lost after its unit committed.
    pub lose_first_responses: bool,
    /// Faults in front of the service, after commit (grpc-tonic's public test helper).
    pub after_commit_faults: Option<Arc<AfterCommitFaults>>,
}

impl Default for GuardedOptions {
    fn default() -> Self {
        Self {
            mode: GuardMode::ClaimFirst,
            lease: Duration::from_secs(30),
            key_field: None,
            lose_first_responses: false,
            after_commit_faults: None,
        }
    }
}

/// A running guarded probe on a loopback port.
pub struct GuardedProbe {
    /// Its address.
    pub addr: SocketAddr,
    /// Handlers that ran (each is one effect).
    pub handlers: Arc<AtomicU32>,
    /// Attempts the service saw.
    pub attempts: Arc<AtomicU32>,
    /// Responses the fault lost after commit.
    pub lost: Arc<AtomicU32>,
    /// The `call_id` of every handler that ran, one entry per run (each is one effect).
    pub effects: Arc<Mutex<Vec<String>>>,
}

struct Service {
    guard: KeyedMutationGuard<InMemoryStore>,
    handlers: Arc<AtomicU32>,
    effects: Arc<Mutex<Vec<String>>>,
    attempts: Arc<AtomicU32>,
    lost: Arc<AtomicU32>,
    lose_first_responses: bool,
    answered: Mutex<HashSet<String>>,
}

impl GuardedProbe {
    /// Starts the guarded probe; it runs until the runtime ends.
    pub async fn start(options: GuardedOptions) -> Result<Self, SchemaError> {
        let schema = RequestSchema::from_file_descriptor_set(DESCRIPTOR_SET)?;
        let mut config = GuardConfig::new(KeyHasher::Sha256, schema).with_mode(options.mode);
        config.lease = LeaseDuration::new(options.lease).expect("a valid lease");
        if let Some(field) = options.key_field {
            config = config.with_key_field(&GrpcMethod::parse(METHOD).expect("a method"), field)?;
        }
        let (handlers, attempts, lost) = (Arc::default(), Arc::default(), Arc::default());
        let effects = Arc::<Mutex<Vec<String>>>::default();
        let service = Service {
            effects: Arc::clone(&effects),
            guard: KeyedMutationGuard::new(InMemoryStore::new(Duration::from_millis(200)), config),
            handlers: Arc::clone(&handlers),
            attempts: Arc::clone(&attempts),
            lost: Arc::clone(&lost),
            lose_first_responses: options.lose_first_responses,
            answered: Mutex::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        // No faults asked for: the layer with none (it then passes every response through).
        let faults = options
            .after_commit_faults
            .unwrap_or_else(|| Arc::new(AfterCommitFaults::new(0.0, 0.0, 0)))
            .layer();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .layer(faults)
                .add_service(pb::probe_server::ProbeServer::new(service))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .expect("the guarded probe runs");
        });
        Ok(Self {
            addr,
            handlers,
            attempts,
            lost,
            effects,
        })
    }
}

/// The guarded handler of `Call`: counts its runs, records its effect, and takes the delay its
/// script names (`delay MS`).
struct Probe {
    handlers: Arc<AtomicU32>,
    effects: Arc<Mutex<Vec<String>>>,
}

impl GuardedHandler<InMemoryUnit> for Probe {
    type Request = pb::ProbeRequest;
    type Response = pb::ProbeReply;

    async fn handle(
        &self,
        _unit: &InMemoryUnit,
        message: pb::ProbeRequest,
        _operation: &Operation,
    ) -> Result<Committed<pb::ProbeReply>, HandlerError> {
        let attempt = self.handlers.fetch_add(1, Ordering::SeqCst) + 1;
        self.effects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(message.call_id.clone());
        let millis = message
            .script
            .strip_prefix("delay ")
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(millis)).await;
        let outcome = OutcomeReference::parse(&message.call_id)
            .map_err(|_| HandlerError::Transient(Status::internal("id")))?;
        Ok(Committed {
            response: pb::ProbeReply {
                attempt,
                messages: 1,
            },
            outcome,
        })
    }

    async fn replay(
        &self,
        _unit: &InMemoryUnit,
        _outcome: OutcomeReference,
        _operation: &Operation,
    ) -> Result<pb::ProbeReply, Status> {
        Ok(pb::ProbeReply {
            attempt: 0,
            messages: 1,
        })
    }
}

#[tonic::async_trait]
impl pb::probe_server::Probe for Service {
    async fn call(
        &self,
        mut request: Request<pb::ProbeRequest>,
    ) -> Result<Response<pb::ProbeReply>, Status> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        request
            .extensions_mut()
            .insert(AuthenticatedPrincipal(b"tenant-a".to_vec()));
        let call_id = request.get_ref().call_id.clone();
        let handler = Probe {
            handlers: Arc::clone(&self.handlers),
            effects: Arc::clone(&self.effects),
        };
        let method = GrpcMethod::parse(METHOD).expect("a method");
        let answer = self.guard.run(&method, request, handler).await?;
        let first = self
            .answered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(call_id);
        if self.lose_first_responses && first {
            self.lost.fetch_add(1, Ordering::SeqCst);
            return Err(Status::unavailable(
                "injected fault: response lost after commit",
            ));
        }
        Ok(answer)
    }

    async fn upload(
        &self,
        _request: Request<tonic::Streaming<pb::ProbeRequest>>,
    ) -> Result<Response<pb::ProbeReply>, Status> {
        Err(Status::unimplemented("only Call is guarded"))
    }

    type WatchStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ProbeReply, Status>> + Send>>;

    async fn watch(
        &self,
        _request: Request<pb::ProbeRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("only Call is guarded"))
    }
}

/// A client of the probe over a channel whose retries a RetryLayer owns, configured by the
/// service config `config` (JSON, for the channel owner), with `Call` a keyed mutation against
/// the probe's durable ledger: what an adopter's generated client over the layer is.
pub fn keyed_layer_client(
    config: &str,
    addr: SocketAddr,
) -> pb::probe_client::ProbeClient<grpc_tonic::RetryService<tonic::transport::Channel>> {
    let config = grpc_policy::GrpcServiceConfigPolicy::new(grpc_policy::GrpcRetryOwner::Channel)
        .parse(config)
        .expect("a valid service config");
    let mut catalog = grpc_policy::MethodCatalog::from_descriptor_set_bytes(DESCRIPTOR_SET)
        .expect("the probe's descriptor set");
    catalog
        .mark_keyed_mutation(&GrpcMethod::parse(METHOD).expect("the probe's method"))
        .expect("the probe's method is in its catalog");
    let layer = grpc_tonic::RetryLayer::builder(config, catalog)
        .server_ledger(grpc_core_api::LedgerDurability::Durable)
        .build()
        .expect("a layer for a valid config");
    pb::probe_client::ProbeClient::new(tower_layer::Layer::layer(&layer, crate::lazy_channel(addr)))
}
