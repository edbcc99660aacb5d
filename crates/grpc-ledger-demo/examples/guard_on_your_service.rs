//! The server side in a few lines: a tonic service whose `CreatePayment` runs inside the
//! `KeyedMutationGuard`, behind an authentication interceptor that names the caller, on an
//! embedded SQLite ledger. The example calls it twice with one key and once with the same key and
//! another amount: one payment, one replay, one refusal.
//!
//! `cargo run -p grpc-ledger-demo --example guard_on_your_service`

use anyhow::{Result, ensure};
use grpc_core_api::{KeyHasher, OutcomeReference, RequestSchema};
use grpc_ledger_payments::pb::payments_client::PaymentsClient;
use grpc_ledger_payments::pb::payments_server::{Payments, PaymentsServer};
use grpc_ledger_payments::pb::{
    CreatePaymentRequest, Payment, ResolvePaymentRequest, ResolvePaymentResponse,
};
use grpc_operation_ledger_seaorm::{LedgerConfig, SeaOrmUnitsOfWork, migrate, open_sqlite};
use grpc_tonic::{
    AuthenticatedPrincipal, Committed, GuardConfig, HandlerError, KeyedMutationGuard,
    MethodFromPathLayer,
};
use sea_orm::{ConnectionTrait, DatabaseTransaction, DbBackend, Statement};
use tonic::{Code, Request, Response, Status};

/// Your service, with the guard it runs its keyed mutation in.
struct YourPayments {
    guard: KeyedMutationGuard<SeaOrmUnitsOfWork>,
}

#[tonic::async_trait]
impl Payments for YourPayments {
    async fn create_payment(
        &self,
        request: Request<CreatePaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        // The method comes from the path (MethodFromPathLayer), the caller from the
        // interceptor's AuthenticatedPrincipal, the key from the `idempotency-key` header.
        self.guard
            .run_request(
                request,
                // Runs once per key: its writes on `txn` commit with the ledger's record.
                |txn, request: CreatePaymentRequest| async move {
                    let payment = Payment {
                        payment_id: format!("pay-{}", request.account),
                        account: request.account,
                        amount_minor: request.amount_minor,
                        ..Default::default()
                    };
                    insert(&txn, &payment)
                        .await
                        .map_err(|_| HandlerError::Transient(Status::unavailable("store down")))?;
                    let outcome = OutcomeReference::parse(&payment.payment_id)
                        .map_err(|_| HandlerError::Transient(Status::internal("bad id")))?;
                    Ok(Committed {
                        outcome,
                        response: payment,
                    })
                },
                // A duplicate gets the recorded payment back, read by its reference.
                |txn, outcome: OutcomeReference| async move { load(&txn, outcome.as_str()).await },
            )
            .await
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
async fn insert(txn: &DatabaseTransaction, payment: &Payment) -> Result<(), sea_orm::DbErr> {
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

async fn load(txn: &DatabaseTransaction, payment_id: &str) -> Result<Payment, Status> {
    let sql = "SELECT payment_id, account, amount_minor FROM payments WHERE payment_id = ?";
    let statement = Statement::from_sql_and_values(DbBackend::Sqlite, sql, [payment_id.into()]);
    let row = txn
        .query_one_raw(statement)
        .await
        .map_err(|_| Status::unavailable("store down"))?
        .ok_or_else(|| Status::internal("a recorded payment is missing"))?;
    let bad_row = |_| Status::internal("a payments row that does not read back");
    Ok(Payment {
        payment_id: row.try_get("", "payment_id").map_err(bad_row)?,
        account: row.try_get("", "account").map_err(bad_row)?,
        amount_minor: row.try_get("", "amount_minor").map_err(bad_row)?,
        ..Default::default()
    })
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
    let call = |amount: i64| {
        let mut request = Request::new(CreatePaymentRequest {
            account: "alice".into(),
            amount_minor: amount,
            ..Default::default()
        });
        let metadata = request.metadata_mut();
        metadata.insert("authorization", "Bearer example-token".parse().unwrap());
        metadata.insert("idempotency-key", "order-1".parse().unwrap());
        request
    };
    let first = client.create_payment(call(500)).await?;
    let again = client.create_payment(call(500)).await?;
    let replayed = again.metadata().get("idempotent-replayed").is_some();
    let changed = client.create_payment(call(900)).await.unwrap_err();
    println!("first:  {:?}", first.get_ref());
    println!("again:  {:?} (replayed: {replayed})", again.get_ref());
    println!("changed amount, same key: {:?}", changed.code());
    ensure!(first.get_ref() == again.get_ref() && replayed);
    ensure!(changed.code() == Code::FailedPrecondition);
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
        rows == Some(1),
        "one payment, however often it was asked for"
    );

    server.abort();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    Ok(())
}
