//! What the guard's tests share: a guarded handler scripted by two closures, on the in-memory
//! double.
//!
//! A service writes a handler type (see `GuardedHandler`'s documentation); the tests script one
//! per case, so they build it from closures. A closure's future cannot borrow the unit (a closure
//! cannot say that its future borrows its argument), so the handler closure gets [`Writes`]: each
//! business row it writes is put into the unit as soon as the closure's future yields, before the
//! guard can cut or roll the unit back, so a test of a rollback sees the rows it must not find.

#![allow(dead_code)] // each test file uses what it needs

pub(crate) mod counting;
pub(crate) mod payments;

use std::future::Future;
use std::marker::PhantomData;
use std::sync::Mutex;

use grpc_core_api::{GrpcMethod, OutcomeReference, RequestSchema};
use grpc_operation_ledger_memory::InMemoryUnit;
use grpc_tonic::{AuthenticatedPrincipal, Committed, GuardedHandler, HandlerError, Operation};
use prost::Message;
use tokio::sync::mpsc;
use tonic::{Request, Status};

/// The business rows a scripted handler writes in its unit.
#[derive(Debug, Clone)]
pub(crate) struct Writes(mpsc::UnboundedSender<String>);

impl Writes {
    /// Writes the business row `key` in the handler's unit.
    pub(crate) fn write_business(&self, key: &str) {
        self.0
            .send(key.to_owned())
            .expect("the handler's unit is there while it runs");
    }
}

/// A handler of `M` answering `R`: `handle` runs the operation, `replay` answers a duplicate from
/// its outcome. Each runs at most once per guarded call, as the guard calls them.
pub(crate) struct Scripted<M, R, H, P> {
    handle: Mutex<Option<H>>,
    replay: Mutex<Option<P>>,
    types: PhantomData<fn(M) -> R>,
}

/// A handler scripted by `handle` and `replay`.
pub(crate) fn scripted<M, R, H, HF, P, PF>(handle: H, replay: P) -> Scripted<M, R, H, P>
where
    H: FnOnce(Writes, M) -> HF + Send + 'static,
    HF: Future<Output = Result<Committed<R>, HandlerError>> + Send,
    P: FnOnce(OutcomeReference) -> PF + Send + 'static,
    PF: Future<Output = Result<R, Status>> + Send,
{
    Scripted {
        handle: Mutex::new(Some(handle)),
        replay: Mutex::new(Some(replay)),
        types: PhantomData,
    }
}

/// A unit of work a scripted handler's business rows go to.
pub(crate) trait BusinessUnit: Send + Sync {
    fn write_business(&self, key: &str);
}

impl BusinessUnit for InMemoryUnit {
    fn write_business(&self, key: &str) {
        InMemoryUnit::write_business(self, key);
    }
}

/// The mocked store's unit (`grpc_core_api::MockLedgerUnitsOfWork`), which keeps no rows.
impl BusinessUnit for () {
    fn write_business(&self, _key: &str) {
        panic!("a mocked unit of work keeps no business rows");
    }
}

impl<Tx, M, R, H, HF, P, PF> GuardedHandler<Tx> for Scripted<M, R, H, P>
where
    Tx: BusinessUnit,
    M: Message + Send + 'static,
    R: Send + 'static,
    H: FnOnce(Writes, M) -> HF + Send + 'static,
    HF: Future<Output = Result<Committed<R>, HandlerError>> + Send,
    P: FnOnce(OutcomeReference) -> PF + Send + 'static,
    PF: Future<Output = Result<R, Status>> + Send,
{
    type Request = M;
    type Response = R;

    async fn handle(
        &self,
        unit: &Tx,
        request: M,
        _operation: &Operation,
    ) -> Result<Committed<R>, HandlerError> {
        let handle = self.handle.lock().unwrap().take();
        let handle = handle.expect("the guard runs a handler once per call");
        let (writes, mut written) = mpsc::unbounded_channel();
        let handled = handle(Writes(writes), request);
        tokio::pin!(handled);
        loop {
            tokio::select! {
                biased;
                Some(key) = written.recv() => unit.write_business(&key),
                handled = &mut handled => {
                    while let Ok(key) = written.try_recv() {
                        unit.write_business(&key);
                    }
                    return handled;
                }
            }
        }
    }

    async fn replay(
        &self,
        _unit: &Tx,
        outcome: OutcomeReference,
        _operation: &Operation,
    ) -> Result<R, Status> {
        let replay = self.replay.lock().unwrap().take();
        replay.expect("the guard replays once per call")(outcome).await
    }
}

/// The schema of `tests/proto/guarded.proto`, the guard's tests' service.
pub(crate) fn guarded_schema() -> RequestSchema {
    let descriptors = protox::compile(["guarded.proto"], ["tests/proto"]).unwrap();
    RequestSchema::from_file_descriptor_set(&prost::Message::encode_to_vec(&descriptors)).unwrap()
}

/// The payments method of `guarded.proto`.
pub(crate) fn create_payment() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap()
}

/// `message` under the idempotency key `key`, from the authenticated caller `principal`.
pub(crate) fn keyed<M>(message: M, key: &str, principal: &[u8]) -> Request<M> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
        .extensions_mut()
        .insert(AuthenticatedPrincipal(principal.to_vec()));
    request
}
