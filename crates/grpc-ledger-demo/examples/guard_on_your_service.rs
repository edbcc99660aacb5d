//! The server side in a few lines: a tonic service whose `CreatePayment` runs inside the
//! `KeyedMutationGuard`, behind an authentication interceptor that names the caller, on an
//! embedded SQLite ledger. The example calls it twice with one key and once with the same key and
//! another amount (one payment, one replay, one refusal), pays again from the same account under
//! a new key (a second payment), and sends a payment the handler refuses twice (the refusal
//! replayed).
//!
//! `cargo run -p grpc-ledger-demo --example guard_on_your_service`

use anyhow::{Result, ensure};
use grpc_core_api::{KeyHasher, OutcomeReference, RequestSchema};
use grpc_ledger_payments::new_payment_id;
use grpc_ledger_payments::pb::payments_client::PaymentsClient;
use grpc_ledger_payments::pb::payments_server::{Payments, PaymentsServer};
use grpc_ledger_payments::pb::{
    CreatePaymentRequest, Payment, ResolvePaymentRequest, ResolvePaymentResponse,
};
use grpc_operation_ledger_seaorm::{
    LedgerConfig, SeaOrmUnitsOfWork, migrate, open_sqlite, store_error,
};
use grpc_tonic::{
    AuthenticatedPrincipal, Committed, GuardConfig, GuardedHandler, HandlerError,
    KeyedMutationGuard, MethodFromPathLayer, Operation,
};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, DbErr, Statement};
use tonic::{Code, Request, Response, Status};

/// Your service, with the guard it runs its keyed mutation in.
struct YourPayments {
    guard: KeyedMutationGuard<SeaOrmUnitsOfWork>,
}

/// Your keyed mutation's handler: what runs once per key, and how a duplicate is answered.
struct CreatePayment;

impl GuardedHandler<DatabaseTransaction> for CreatePayment {
    type Request = CreatePaymentRequest;
    type Response = Payment;

    // Runs once per key: its writes on `txn` commit with the ledger's record.
    async fn handle(
        &self,
        txn: &DatabaseTransaction,
        request: CreatePaymentRequest,
        _operation: &Operation,
    ) -> Result<Committed<Payment>, HandlerError> {
        if request.amount_minor <= 0 {
            // A business refusal: recorded, and replayed to every resend.
            return Err(HandlerError::Terminal(Status::invalid_argument(
                "amount must be positive",
            )));
        }
        let payment = Payment {
            // A fresh id, stored as the outcome: never one built from the account.
            payment_id: new_payment_id(),
            account: request.account,
            amount_minor: request.amount_minor,
            ..Default::default()
        };
        // A store error classified as the ledger's own are: a bug is INTERNAL, not "retry".
        insert_payment(txn, &payment).await.map_err(store_error)?;
        let outcome = OutcomeReference::parse(&payment.payment_id)
            .map_err(|_| HandlerError::Transient(Status::internal("bad id")))?;
        Ok(Committed {
            outcome,
            response: payment,
        })
    }

    // A duplicate gets the recorded payment back, read by its reference.
    async fn replay(
        &self,
        txn: &DatabaseTransaction,
        outcome: OutcomeReference,
        _operation: &Operation,
    ) -> Result<Payment, Status> {
        load_payment(txn, outcome.as_str())
            .await
            .map_err(|error| Status::from(store_error(error)))?
            .ok_or_else(|| Status::internal("a recorded payment is missing"))
    }
}

#[tonic::async_trait]
impl Payments for YourPayments {
    async fn create_payment(
        &self,
        request: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        // The method comes from the path (MethodFromPathLayer), the caller from the
        // interceptor's AuthenticatedPrincipal, the key from the `idempotency-key` header.
        self.guard.run_request(request, CreatePayment).await
    }

    async fn resolve_payment(
        &self,
        _request: Request<ResolvePaymentRequest>,
    ) -> Result<Response<ResolvePaymentResponse>, Status> {
        Err(Status::unimplemented(
            "see the demo's server for a resolve RPC",
        ))
    }
}

// Plain SQL on the unit's transaction (SQLite's `?` placeholders); your ORM works the same way.
async fn insert_payment(txn: &DatabaseTransaction, payment: &Payment) -> Result<(), DbErr> {
    let sql = "INSERT INTO payments (payment_id, account, amount_minor) VALUES (?, ?, ?)";
    let values = [
        payment.payment_id.clone().into(),
        payment.account.clone().into(),
        payment.amount_minor.into(),
    ];
    txn.execute_raw(Statement::from_sql_and_values(
        DbBackend::Sqlite,
        sql,
        values,
    ))
    .await
    .map(|_| ())
}

async fn load_payment(
    txn: &DatabaseTransaction,
    payment_id: &str,
) -> Result<Option<Payment>, DbErr> {
    let sql = "SELECT payment_id, account, amount_minor FROM payments WHERE payment_id = ?";
    let statement = Statement::from_sql_and_values(DbBackend::Sqlite, sql, [payment_id.into()]);
    let Some(row) = txn.query_one_raw(statement).await? else {
        return Ok(None);
    };
    Ok(Some(Payment {
        payment_id: row.try_get("", "payment_id")?,
        account: row.try_get("", "account")?,
        amount_minor: row.try_get("", "amount_minor")?,
        ..Default::default()
    }))
}

/// Your authentication: here a bearer token; in production an mTLS peer or a verified token.
/// The guard derives the caller from what this inserts, never from a header the client sets.
fn authenticate(mut request: Request<()>) -> Result<Request<()>, Status> {
    let principal = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|token| *token == "example-token")
        .map(|token| AuthenticatedPrincipal(token.as_bytes().to_vec()))
        .ok_or_else(|| Status::unauthenticated("unknown caller"))?;
    request.extensions_mut().insert(principal);
    Ok(request)
}

#[tokio::main]
async fn main() -> Result<()> {
    let file = std::env::temp_dir().join(format!("guard-example-{}.sqlite", std::process::id()));
    let config = LedgerConfig::default();
    let db = open_sqlite(&file, &config).await?;
    migrate(&db).await?;
    db.execute_unprepared(
        "CREATE TABLE IF NOT EXISTS payments (payment_id TEXT PRIMARY KEY, account TEXT NOT NULL, amount_minor BIGINT NOT NULL)",
    )
    .await?;
    let guard = KeyedMutationGuard::new(
        SeaOrmUnitsOfWork::new(db.clone(), &config),
        GuardConfig::new(
            // Keys are stored as HMACs under a server secret.
            KeyHasher::hmac_sha256(b"a-server-secret-of-32-bytes-or-more")?,
            RequestSchema::from_file_descriptor_set(grpc_ledger_payments::DESCRIPTOR_SET)?,
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let service = PaymentsServer::with_interceptor(YourPayments { guard }, authenticate);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(MethodFromPathLayer)
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let mut client = PaymentsClient::connect(format!("http://{addr}")).await?;
    let call = |amount: i64, key: &str| {
        let mut request = Request::new(CreatePaymentRequest {
            account: "alice".into(),
            amount_minor: amount,
            ..Default::default()
        });
        let metadata = request.metadata_mut();
        metadata.insert("authorization", "Bearer example-token".parse().unwrap());
        metadata.insert("idempotency-key", key.parse().unwrap());
        request
    };
    let first = client.create_payment(call(500, "order-1")).await?;
    let again = client.create_payment(call(500, "order-1")).await?;
    let replayed = again.metadata().get("idempotent-replayed").is_some();
    let changed = client
        .create_payment(call(900, "order-1"))
        .await
        .unwrap_err();
    // The same account pays again, under a key of its own: a second payment, not a refusal.
    let second = client.create_payment(call(700, "order-2")).await?;
    // A business refusal is recorded: its resend gets the same refusal, replayed.
    let refused = client.create_payment(call(0, "order-3")).await.unwrap_err();
    let refused_again = client.create_payment(call(0, "order-3")).await.unwrap_err();
    println!("first:  {:?}", first.get_ref());
    println!("again:  {:?} (replayed: {replayed})", again.get_ref());
    println!("changed amount, same key: {:?}", changed.code());
    println!("same account, new key: {:?}", second.get_ref());
    println!(
        "refused, twice: {:?}, {:?}",
        refused.code(),
        refused_again.code()
    );
    ensure!(first.get_ref() == again.get_ref() && replayed);
    ensure!(changed.code() == Code::FailedPrecondition);
    ensure!(second.get_ref().payment_id != first.get_ref().payment_id);
    ensure!(refused.code() == Code::InvalidArgument);
    ensure!(refused_again.code() == Code::InvalidArgument);
    ensure!(
        refused_again
            .metadata()
            .get("idempotent-replayed")
            .is_some()
    );
    let rows = db
        .query_one_raw(Statement::from_string(
            DbBackend::Sqlite,
            "SELECT COUNT(*) AS n FROM payments",
        ))
        .await?
        .map(|row| row.try_get::<i64>("", "n"))
        .transpose()?;
    println!("payments rows: {rows:?}");
    ensure!(
        rows == Some(2),
        "two payments (one per key), however often each was asked for"
    );

    server.abort();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}
