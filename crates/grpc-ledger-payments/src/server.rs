//! The payments service: `CreatePayment` through the keyed-mutation guard, `ResolvePayment` from
//! the ledger, and a fault layer that acts after the unit of work committed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_core_api::{GrpcMethod, LedgerUnitsOfWork, OutcomeReference};
use grpc_operation_ledger_seaorm::{SeaOrmUnitsOfWork, store_error};
use grpc_policy::{RandomSource, SplitMix64};
use grpc_tonic::{
    CallerExtractor, Committed, GuardedHandler, HandlerError, KeyedMutationGuard, Operation,
    Resolved, RetentionConfig, RetentionWorker,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbErr};
use tonic::{Request, Response, Status};

use crate::DEMO_TOKEN;
use crate::access::bearer_token;
use crate::dialect::statement;
use crate::pb::payments_server::Payments;
use crate::pb::resolve_payment_response::State;
use crate::pb::{CreatePaymentRequest, Payment, ResolvePaymentRequest, ResolvePaymentResponse};
use crate::postings::Downstream;

/// The method the guard protects.
pub fn create_payment_method() -> GrpcMethod {
    GrpcMethod::parse("/payments.v1.Payments/CreatePayment").expect("a valid method name")
}

/// A new payment id: the payment's own, made when the payment is and stored as its operation's
/// outcome, so that every replay answers with it. Never built from the request's fields: one
/// account makes many payments, and an id made from the account would refuse the second as a
/// duplicate key. Unique per process start (a prefix from the clock and the process id) and per
/// call (a counter).
pub fn new_payment_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    static PROCESS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let process = *PROCESS.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64);
        nanos ^ u64::from(std::process::id()).rotate_left(40)
    });
    format!(
        "pay-{process:016x}-{}",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates the business tables (the ledger's comes from its migrator): the payments, and which
/// posting each payment made when the service runs chained to a postings service.
pub async fn prepare_database(db: &DatabaseConnection) -> Result<(), DbErr> {
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS demo_payments (payment_id VARCHAR(64) PRIMARY KEY, \
         account VARCHAR(128) NOT NULL, amount_minor BIGINT NOT NULL)",
    )
    .await?;
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS demo_payment_postings (payment_id VARCHAR(64) PRIMARY KEY, \
         posting_id VARCHAR(64) NOT NULL)",
    )
    .await
    .map(|_| ())
}

/// Faults injected after the server committed: the client sees an error (or nothing in time)
/// although the payment exists.
pub struct Faults {
    drop_rate: f64,
    delay_rate: f64,
    delay: Duration,
    random: Mutex<SplitMix64>,
    /// Responses dropped.
    pub dropped: AtomicU64,
    /// Responses delayed.
    pub delayed: AtomicU64,
}

impl Faults {
    /// Drops `drop_rate` of responses and delays `delay_rate` of them by `delay`.
    pub fn new(drop_rate: f64, delay_rate: f64, delay: Duration, seed: u64) -> Self {
        Self {
            drop_rate,
            delay_rate,
            delay,
            random: Mutex::new(SplitMix64::from_seed(seed)),
            dropped: AtomicU64::new(0),
            delayed: AtomicU64::new(0),
        }
    }

    async fn after_commit(&self) -> Result<(), Status> {
        let roll = self
            .random
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .next_unit();
        if roll < self.drop_rate {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Err(Status::unavailable(
                "injected fault: response lost after commit",
            ));
        }
        if roll < self.drop_rate + self.delay_rate {
            self.delayed.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(self.delay).await;
        }
        Ok(())
    }
}

/// Verifies the bearer token and records the authenticated principal for the guard. (A real
/// deployment verifies an mTLS peer certificate or a signed token here.)
pub fn authenticate(request: Request<()>) -> Result<Request<()>, Status> {
    bearer_token(request, DEMO_TOKEN)
}

/// The payments service.
pub struct PaymentsService {
    guard: KeyedMutationGuard<SeaOrmUnitsOfWork>,
    faults: Arc<Faults>,
    next_id: AtomicU64,
    id_prefix: String,
    retention: Option<Duration>,
    downstream: Option<Arc<Downstream>>,
}

impl PaymentsService {
    /// The service over `guard`, with `faults` after each commit.
    pub fn new(
        guard: KeyedMutationGuard<SeaOrmUnitsOfWork>,
        faults: Arc<Faults>,
        id_prefix: &str,
    ) -> Self {
        Self {
            guard,
            faults,
            next_id: AtomicU64::new(1),
            id_prefix: id_prefix.to_owned(),
            retention: None,
            downstream: None,
        }
    }

    /// The service with its guard naming each caller by `callers` (a verified mTLS peer, say)
    /// instead of the principal the demo's token check records.
    pub fn with_caller_extractor(mut self, callers: impl CallerExtractor + 'static) -> Self {
        self.guard = self.guard.with_caller_extractor(callers);
        self
    }

    /// Chains the service to a postings service: each payment posts through `downstream` inside
    /// its unit of work, under the key the guard derives for the call, and records the posting
    /// beside the payment.
    pub fn with_downstream(mut self, downstream: Arc<Downstream>) -> Self {
        self.downstream = Some(downstream);
        self
    }

    /// Tells clients, in every ResolvePayment answer, how long a finished payment's record is
    /// kept (the retention worker's window).
    pub fn with_retention(mut self, window: Duration) -> Self {
        self.retention = Some(window);
        self
    }

    /// A retention worker on the service's store (see [`RetentionWorker`]): spawn it beside the
    /// server.
    pub fn retention_worker(&self, config: RetentionConfig) -> RetentionWorker<SeaOrmUnitsOfWork> {
        self.guard.retention_worker(config)
    }
}

/// The business write: one payment row, on the caller's transaction.
pub async fn insert_payment(txn: &DatabaseTransaction, payment: &Payment) -> Result<(), DbErr> {
    let sql = "INSERT INTO demo_payments (payment_id, account, amount_minor) VALUES ($1, $2, $3)";
    let values = vec![
        payment.payment_id.clone().into(),
        payment.account.clone().into(),
        payment.amount_minor.into(),
    ];
    txn.execute_raw(statement(txn, sql, values))
        .await
        .map(|_| ())
}

/// The chained payment's second write: which posting it made, on the same transaction.
async fn insert_payment_posting(txn: &DatabaseTransaction, payment: &Payment) -> Result<(), DbErr> {
    let sql = "INSERT INTO demo_payment_postings (payment_id, posting_id) VALUES ($1, $2)";
    let values = vec![
        payment.payment_id.clone().into(),
        payment.posting_id.clone().into(),
    ];
    txn.execute_raw(statement(txn, sql, values))
        .await
        .map(|_| ())
}

/// The business read: the payment with `payment_id` (and its posting, if it made one), if there
/// is one.
pub async fn load_payment(
    db: &impl ConnectionTrait,
    payment_id: &str,
) -> Result<Option<Payment>, DbErr> {
    let sql = "SELECT p.payment_id, p.account, p.amount_minor, l.posting_id \
               FROM demo_payments p LEFT JOIN demo_payment_postings l \
               ON l.payment_id = p.payment_id WHERE p.payment_id = $1";
    let row = db
        .query_one_raw(statement(db, sql, vec![payment_id.into()]))
        .await?;
    row.map(|row| {
        Ok(Payment {
            payment_id: row.try_get("", "payment_id")?,
            account: row.try_get("", "account")?,
            amount_minor: row.try_get("", "amount_minor")?,
            posting_id: row
                .try_get::<Option<String>>("", "posting_id")?
                .unwrap_or_default(),
        })
    })
    .transpose()
}

/// CreatePayment's guarded handler: one payment row under a fresh id (and, chained, the posting
/// made through the downstream service under the key derived for this operation).
struct CreatePayment {
    payment_id: String,
    downstream: Option<Arc<Downstream>>,
}

impl GuardedHandler<DatabaseTransaction> for CreatePayment {
    type Request = CreatePaymentRequest;
    type Response = Payment;

    async fn handle(
        &self,
        txn: &DatabaseTransaction,
        request: CreatePaymentRequest,
        operation: &Operation,
    ) -> Result<Committed<Payment>, HandlerError> {
        if request.amount_minor <= 0 {
            return Err(HandlerError::Terminal(Status::invalid_argument(
                "amount must be positive",
            )));
        }
        let mut payment = Payment {
            payment_id: self.payment_id.clone(),
            account: request.account,
            amount_minor: request.amount_minor,
            posting_id: String::new(),
        };
        if let Some(downstream) = &self.downstream {
            // The same key on every resend and takeover of this operation.
            let key = operation.downstream_key(downstream.label());
            let posting = downstream
                .post(&key, &payment.account, payment.amount_minor)
                .await?;
            if downstream.fails_after_posting() {
                return Err(HandlerError::Transient(Status::unavailable(
                    "injected fault: the payment failed after its posting committed",
                )));
            }
            payment.posting_id = posting.posting_id;
        }
        insert_payment(txn, &payment).await.map_err(store_error)?;
        if self.downstream.is_some() {
            insert_payment_posting(txn, &payment)
                .await
                .map_err(store_error)?;
        }
        let outcome = OutcomeReference::parse(&self.payment_id)
            .map_err(|_| HandlerError::Transient(Status::internal("bad payment id")))?;
        Ok(Committed {
            response: payment,
            outcome,
        })
    }

    async fn replay(
        &self,
        txn: &DatabaseTransaction,
        outcome: OutcomeReference,
        _operation: &Operation,
    ) -> Result<Payment, Status> {
        load_payment(txn, outcome.as_str())
            .await
            .map_err(|error| Status::from(store_error(error)))?
            .ok_or_else(|| Status::internal("a committed payment is missing"))
    }
}

#[tonic::async_trait]
impl Payments for PaymentsService {
    async fn create_payment(
        &self,
        request: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        let payment_id = format!(
            "{}-{}",
            self.id_prefix,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        );
        let handler = CreatePayment {
            payment_id,
            downstream: self.downstream.clone(),
        };
        let response = self.guard.run_request(request, handler).await?;
        self.faults.after_commit().await?;
        Ok(response)
    }

    async fn resolve_payment(
        &self,
        request: Request<ResolvePaymentRequest>,
    ) -> Result<Response<ResolvePaymentResponse>, Status> {
        let resolved = self
            .guard
            .resolve(
                &create_payment_method(),
                request.metadata(),
                request.extensions(),
            )
            .await?;
        let mut answer = ResolvePaymentResponse {
            retention_seconds: self.retention.map_or(0, |window| {
                i64::try_from(window.as_secs()).unwrap_or(i64::MAX)
            }),
            ..ResolvePaymentResponse::default()
        };
        match resolved {
            Resolved::NotFound => answer.set_state(State::NotFound),
            Resolved::InProgress { retry_after } => {
                answer.set_state(State::InProgress);
                answer.retry_after_ms = (retry_after.as_millis() as i64).max(10);
            }
            Resolved::Committed(outcome) => {
                answer.set_state(State::Committed);
                // In a unit of work, as every statement must be behind a transaction pooler.
                let units = self.guard.units();
                let txn = units.begin().await.map_err(Status::from)?;
                answer.payment = load_payment(&txn, outcome.as_str())
                    .await
                    .map_err(|error| Status::from(store_error(error)))?;
                units.commit(txn).await.map_err(Status::from)?;
            }
            Resolved::Failed(failure) => {
                answer.set_state(State::Failed);
                answer.failure_code = failure.code() as i32;
                answer.failure_message = failure.message().to_owned();
            }
        }
        Ok(Response::new(answer))
    }
}
