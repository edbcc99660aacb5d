//! The postings service a chained payments service calls inside each payment, and the payments
//! side of that call.
//!
//! Each service has its own guard and store. The payments handler sends its posting under the
//! key its guard derives from the payment's operation and the label [`POSTINGS_LABEL`]: every
//! run of the handler for the same payment (a resend after its unit rolled back, a takeover on
//! another replica) sends the same key and the same request, so the postings guard answers it
//! with the posting it already made instead of making a second one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_core_api::{DownstreamLabel, GrpcMethod, IdempotencyKey, KeyHasher, OutcomeReference};
use grpc_core_api::{LedgerDurability, RequestSchema};
use grpc_operation_ledger_seaorm::{LedgerConfig, SeaOrmUnitsOfWork, store_error};
use grpc_policy::{MethodCatalog, RandomSource, ServiceConfig, SplitMix64};
use grpc_tonic::testing::AfterCommitFaults;
use grpc_tonic::{
    Committed, GuardConfig, GuardMode, GuardedHandler, HandlerError, IDEMPOTENCY_KEY_HEADER,
    KeyedMutationGuard, Operation, RetryLayer, RetryService,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use crate::access::bearer_token;
use crate::dialect::statement;
use crate::pb::postings_client::PostingsClient;
use crate::pb::postings_server::{Postings, PostingsServer};
use crate::pb::{PostEntryRequest, Posting};
use crate::{DESCRIPTOR_SET, POSTINGS_SERVICE_CONFIG};

/// The token the payments service authenticates to the postings service with (its principal
/// there: the postings guard isolates keys per calling service).
pub const PAYMENTS_SERVICE_TOKEN: &str = "payments-service-token";

/// The label of the payments handler's one downstream call.
pub const POSTINGS_LABEL: &str = "postings";

/// The postings service's keyed method.
pub fn post_entry_method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Postings/PostEntry").expect("a valid method name")
}

/// Creates the postings table (the ledger's comes from its migrator). No uniqueness on the
/// account: a second posting for one payment must be possible to store, so that the
/// reconciliation can see it.
pub async fn prepare_postings_database(db: &DatabaseConnection) -> Result<(), DbErr> {
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS demo_postings (posting_id VARCHAR(64) PRIMARY KEY, \
         account VARCHAR(128) NOT NULL, amount_minor BIGINT NOT NULL)",
    )
    .await
    .map(|_| ())
}

async fn insert_posting(txn: &DatabaseTransaction, posting: &Posting) -> Result<(), DbErr> {
    let sql = "INSERT INTO demo_postings (posting_id, account, amount_minor) VALUES ($1, $2, $3)";
    let values = vec![
        posting.posting_id.clone().into(),
        posting.account.clone().into(),
        posting.amount_minor.into(),
    ];
    txn.execute_raw(statement(txn, sql, values))
        .await
        .map(|_| ())
}

async fn load_posting(
    db: &impl ConnectionTrait,
    posting_id: &str,
) -> Result<Option<Posting>, DbErr> {
    let sql = "SELECT posting_id, account, amount_minor FROM demo_postings WHERE posting_id = $1";
    let row = db
        .query_one_raw(statement(db, sql, vec![posting_id.into()]))
        .await?;
    row.map(|row| {
        Ok(Posting {
            posting_id: row.try_get("", "posting_id")?,
            account: row.try_get("", "account")?,
            amount_minor: row.try_get("", "amount_minor")?,
        })
    })
    .transpose()
}

/// Verifies the payments service's token (the postings server's interceptor).
fn authenticate_payments_service(request: Request<()>) -> Result<Request<()>, Status> {
    bearer_token(request, PAYMENTS_SERVICE_TOKEN)
}

/// The postings service: `PostEntry` through its own keyed-mutation guard, on its own store.
pub struct PostingsService {
    guard: KeyedMutationGuard<SeaOrmUnitsOfWork>,
    next_id: AtomicU64,
    id_prefix: String,
}

impl PostingsService {
    /// The service on `db`, its guard in `mode` with a secret of its own, posting ids under
    /// `id_prefix`.
    pub fn new(
        db: &DatabaseConnection,
        config: &LedgerConfig,
        mode: GuardMode,
        id_prefix: &str,
    ) -> anyhow::Result<Self> {
        let hasher = KeyHasher::hmac_sha256(b"demo-postings-secret-change-me-01")?;
        let guard = KeyedMutationGuard::new(
            SeaOrmUnitsOfWork::new(db.clone(), config),
            GuardConfig::new(
                hasher,
                RequestSchema::from_file_descriptor_set(DESCRIPTOR_SET)?,
            )
            .with_mode(mode),
        );
        Ok(Self {
            guard,
            next_id: AtomicU64::new(1),
            id_prefix: id_prefix.to_owned(),
        })
    }
}

#[tonic::async_trait]
impl Postings for PostingsService {
    async fn post_entry(
        &self,
        request: Request<PostEntryRequest>,
    ) -> Result<Response<Posting>, Status> {
        let posting_id = format!(
            "{}-{}",
            self.id_prefix,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        self.guard
            .run_request(request, PostEntry { posting_id })
            .await
    }
}

/// PostEntry's guarded handler: one posting row under a fresh id.
struct PostEntry {
    posting_id: String,
}

impl GuardedHandler<DatabaseTransaction> for PostEntry {
    type Request = PostEntryRequest;
    type Response = Posting;

    async fn handle(
        &self,
        txn: &DatabaseTransaction,
        request: PostEntryRequest,
        _operation: &Operation,
    ) -> Result<Committed<Posting>, HandlerError> {
        let posting = Posting {
            posting_id: self.posting_id.clone(),
            account: request.account,
            amount_minor: request.amount_minor,
        };
        insert_posting(txn, &posting).await.map_err(store_error)?;
        let outcome = OutcomeReference::parse(&self.posting_id)
            .map_err(|_| HandlerError::Transient(Status::internal("bad posting id")))?;
        Ok(Committed {
            response: posting,
            outcome,
        })
    }

    async fn replay(
        &self,
        txn: &DatabaseTransaction,
        outcome: OutcomeReference,
        _operation: &Operation,
    ) -> Result<Posting, Status> {
        load_posting(txn, outcome.as_str())
            .await
            .map_err(|error| Status::from(store_error(error)))?
            .ok_or_else(|| Status::internal("a committed posting is missing"))
    }
}

/// Serves `service` on `listener`, behind the payments service's token check and `faults` (the
/// postings' answers lost or their streams reset after commit), until `shutdown` completes.
pub async fn serve_postings(
    listener: tokio::net::TcpListener,
    service: PostingsService,
    faults: Arc<AfterCommitFaults>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    tonic::transport::Server::builder()
        .layer(grpc_tonic::MethodFromPathLayer)
        .layer(faults.layer())
        .add_service(PostingsServer::with_interceptor(
            service,
            authenticate_payments_service,
        ))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await?;
    Ok(())
}

/// The generated postings client over a channel whose retries a [`RetryLayer`] owns, with the
/// payments service's token.
type PostingsRetryClient = PostingsClient<
    tonic::service::interceptor::InterceptedService<
        RetryService<Channel>,
        fn(Request<()>) -> Result<Request<()>, Status>,
    >,
>;

fn with_payments_service_token(mut request: Request<()>) -> Result<Request<()>, Status> {
    let value: AsciiMetadataValue = format!("Bearer {PAYMENTS_SERVICE_TOKEN}")
        .parse()
        .map_err(|_| Status::internal("token is not valid metadata"))?;
    request.metadata_mut().insert("authorization", value);
    Ok(request)
}

/// Share of payment units failed on purpose after their posting committed, drawn from a seed.
#[derive(Debug)]
pub struct UnitFailures {
    rate: f64,
    random: Mutex<SplitMix64>,
    injected: AtomicU64,
}

impl UnitFailures {
    /// Fails `rate` of the units that reach the point after their posting.
    pub fn new(rate: f64, seed: u64) -> Self {
        Self {
            rate,
            random: Mutex::new(SplitMix64::from_seed(seed)),
            injected: AtomicU64::new(0),
        }
    }

    /// Units failed so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    fn strikes(&self) -> bool {
        let roll = self
            .random
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .next_unit();
        let strikes = roll < self.rate;
        if strikes {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        strikes
    }
}

/// The payments handler's side of the chain: a postings client whose retries a RetryLayer owns
/// (the postings service's config, its ledger durable), and the injected unit failures.
pub struct Downstream {
    client: PostingsRetryClient,
    layer: RetryLayer,
    unit_failures: Arc<UnitFailures>,
    label: DownstreamLabel,
}

impl Downstream {
    /// A client of the postings service at `addr` (connected lazily, so that a postings server
    /// that is down, or restarting, fails calls rather than the payments server's start).
    pub fn new(
        addr: std::net::SocketAddr,
        unit_failures: Arc<UnitFailures>,
    ) -> anyhow::Result<Self> {
        let channel = Channel::from_shared(format!("http://{addr}"))?.connect_lazy();
        let config = ServiceConfig::parse(POSTINGS_SERVICE_CONFIG)?;
        let catalog = MethodCatalog::from_descriptor_set_bytes(DESCRIPTOR_SET)?;
        let layer = RetryLayer::builder(config, catalog)
            .server_ledger(LedgerDurability::Durable)
            .target(addr.to_string())
            .build()?;
        let client = PostingsClient::with_interceptor(
            tower_layer::Layer::layer(&layer, channel),
            with_payments_service_token as fn(_) -> _,
        );
        Ok(Self {
            client,
            layer,
            unit_failures,
            label: DownstreamLabel::parse(POSTINGS_LABEL).expect("a valid label"),
        })
    }

    /// The label the payments guard derives the posting's key with.
    pub fn label(&self) -> &DownstreamLabel {
        &self.label
    }

    /// The postings client's retry layer (for its counters).
    pub fn layer(&self) -> &RetryLayer {
        &self.layer
    }

    /// Posts `amount_minor` to `account` under `key`, retried by the layer; a failure the
    /// payments unit should roll back on (and its caller resend after) is transient, one a
    /// resend cannot change is terminal.
    pub(crate) async fn post(
        &self,
        key: &IdempotencyKey,
        account: &str,
        amount_minor: i64,
    ) -> Result<Posting, HandlerError> {
        let key: AsciiMetadataValue = key.expose().parse().map_err(|_| {
            HandlerError::Terminal(Status::internal("a derived key is not valid metadata"))
        })?;
        let mut request = Request::new(PostEntryRequest {
            account: account.to_owned(),
            amount_minor,
        });
        request.metadata_mut().insert(IDEMPOTENCY_KEY_HEADER, key);
        request.set_timeout(Duration::from_millis(1500));
        match self.client.clone().post_entry(request).await {
            Ok(posting) => Ok(posting.into_inner()),
            Err(status) => Err(match status.code() {
                Code::InvalidArgument
                | Code::FailedPrecondition
                | Code::PermissionDenied
                | Code::Unauthenticated => {
                    HandlerError::Terminal(Status::failed_precondition(format!(
                        "the postings service refused the posting: {:?}",
                        status.code()
                    )))
                }
                code => HandlerError::Transient(Status::unavailable(format!(
                    "the postings service did not post: {code:?}"
                ))),
            }),
        }
    }

    /// Whether this unit fails on purpose now that its posting committed.
    pub(crate) fn fails_after_posting(&self) -> bool {
        self.unit_failures.strikes()
    }
}
