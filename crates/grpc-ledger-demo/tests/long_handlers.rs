//! Claim-committed-first on PostgreSQL: a handler that runs for several leases commits once while
//! its duplicates are told to wait, and a server killed mid-handler (its runtime dropped with
//! every task and connection it had, as a process kill does) leaves its claim to be taken over by
//! another server only once the lease it last renewed has run out.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use grpc_core_api::{
    CallerFingerprint, GrpcOperationIdentity, GrpcOperationLedger, IdempotencyKey, KeyHasher,
    LeaseDuration, OperationState, OutcomeReference, REPLAYED_METADATA_KEY, RequestSchema,
    UnitPerCall,
};
use grpc_ledger_payments::pb::{CreatePaymentRequest, Payment};
use grpc_ledger_payments::{
    DESCRIPTOR_SET, create_payment_method, insert_payment, prepare_database, statement,
};
use grpc_operation_ledger_seaorm::{
    LedgerConfig, Pooler, SeaOrmUnitsOfWork, connect_postgres, migrate, store_error,
};
use grpc_tonic::{
    AuthenticatedPrincipal, Committed, GuardConfig, GuardMode, GuardedHandler, HandlerError,
    KeyedMutationGuard, Operation,
};
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction};
use tonic::{Code, Request, Response, Status};

const LEASE: Duration = Duration::from_millis(600);

fn url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set: run `cargo xtask test`, or `cargo xtask pg start` and \
             export DATABASE_URL=$(cargo xtask pg url)"
        )
    })
}

fn config() -> LedgerConfig {
    LedgerConfig::default().with_pooler(Pooler::None)
}

async fn database() -> DatabaseConnection {
    let db = connect_postgres(&url(), &config()).await.unwrap();
    migrate(&db).await.unwrap();
    prepare_database(&db).await.unwrap();
    db
}

fn guard(db: DatabaseConnection) -> KeyedMutationGuard<SeaOrmUnitsOfWork> {
    let schema = RequestSchema::from_file_descriptor_set(DESCRIPTOR_SET).unwrap();
    let mut config = GuardConfig::new(KeyHasher::Sha256, schema)
        .with_mode(GuardMode::ClaimCommittedFirst)
        .with_longest_handler(Duration::from_secs(120));
    config.lease = LeaseDuration::new(LEASE).unwrap();
    KeyedMutationGuard::new(SeaOrmUnitsOfWork::new(db, &self::config()), config)
}

fn request(key: &str) -> Request<CreatePaymentRequest> {
    let mut request = Request::new(CreatePaymentRequest {
        account: "acct-long".to_owned(),
        amount_minor: 500,
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("idempotency-key", key.parse().unwrap());
    request
        .extensions_mut()
        .insert(AuthenticatedPrincipal(b"tenant-long".to_vec()));
    request
}

fn identity(key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(b"tenant-long"),
        create_payment_method(),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).unwrap()),
    )
}

/// A payment under `key` whose handler writes the payment row, then takes `runs_for`; `started`
/// counts handlers that began.
async fn pay(
    guard: &KeyedMutationGuard<SeaOrmUnitsOfWork>,
    key: &str,
    runs_for: Duration,
    started: &Arc<AtomicUsize>,
) -> Result<Response<()>, Status> {
    let handler = LongPayment {
        payment_id: key.to_owned(),
        runs_for,
        started: Arc::clone(started),
    };
    guard
        .run(&create_payment_method(), request(key), handler)
        .await
}

/// A handler that writes its payment row, then works for `runs_for`.
struct LongPayment {
    payment_id: String,
    runs_for: Duration,
    started: Arc<AtomicUsize>,
}

impl GuardedHandler<DatabaseTransaction> for LongPayment {
    type Request = CreatePaymentRequest;
    type Response = ();

    async fn handle(
        &self,
        txn: &DatabaseTransaction,
        request: CreatePaymentRequest,
        _operation: &Operation,
    ) -> Result<Committed<()>, HandlerError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let payment = Payment {
            payment_id: self.payment_id.clone(),
            account: request.account,
            amount_minor: request.amount_minor,
            ..Default::default()
        };
        insert_payment(txn, &payment).await.map_err(store_error)?;
        tokio::time::sleep(self.runs_for).await;
        Ok(Committed {
            response: (),
            outcome: OutcomeReference::parse(&self.payment_id).unwrap(),
        })
    }

    async fn replay(
        &self,
        _txn: &DatabaseTransaction,
        _outcome: OutcomeReference,
        _operation: &Operation,
    ) -> Result<(), Status> {
        Ok(())
    }
}

async fn payments(db: &DatabaseConnection, key: &str) -> i64 {
    let row = db
        .query_one_raw(statement(
            db,
            "SELECT COUNT(*) FROM demo_payments WHERE payment_id = $1",
            vec![key.into()],
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get_by_index::<i64>(0).unwrap()
}

fn replayed(response: &Response<()>) -> bool {
    response.metadata().get(REPLAYED_METADATA_KEY).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_handler_longer_than_several_leases_commits_once_on_postgres() {
    let db = database().await;
    let guard = guard(db.clone());
    let key = format!("long-{}", std::process::id());
    let started = Arc::new(AtomicUsize::new(0));
    let first = {
        let (guard, key, started) = (guard.clone(), key.clone(), Arc::clone(&started));
        tokio::spawn(async move { pay(&guard, &key, 5 * LEASE, &started).await })
    };
    let mut in_flight = 0;
    while !first.is_finished() {
        tokio::time::sleep(LEASE / 2).await;
        match pay(&guard, &key, Duration::ZERO, &started).await {
            Err(status) if status.code() == Code::Aborted => in_flight += 1,
            Ok(response) if replayed(&response) => break,
            other => panic!("a duplicate of a running handler got {other:?}"),
        }
    }
    let answer = first.await.unwrap().expect("the long handler commits");
    assert!(!replayed(&answer));
    // Each duplicate first waits half a lease for the outcome (`GuardConfig::in_flight_wait`,
    // within half the lease), then is told to wait: about one every lease of the five.
    assert!(in_flight >= 3, "{in_flight} duplicates were told to wait");
    assert_eq!(started.load(Ordering::SeqCst), 1);
    assert_eq!(payments(&db, &key).await, 1);
    let ledger = UnitPerCall::new(SeaOrmUnitsOfWork::new(db.clone(), &config()));
    let record = ledger.find(&identity(&key)).await;
    let record = record.unwrap().expect("the operation's row");
    assert_eq!(record.state(), OperationState::Committed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_killed_mid_handler_is_taken_over_only_after_its_lease() {
    let key = format!("killed-{}", std::process::id());
    let started = Arc::new(AtomicUsize::new(0));

    // The first server: its own runtime, pool and guard, killed while its handler runs.
    let doomed = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    {
        let (key, started) = (key.clone(), Arc::clone(&started));
        doomed.spawn(async move {
            let guard = guard(database().await);
            let _ = pay(&guard, &key, Duration::from_secs(3600), &started).await;
        });
    }
    let db = database().await;
    let units = UnitPerCall::new(SeaOrmUnitsOfWork::new(db.clone(), &config()));
    let claimed = loop {
        if started.load(Ordering::SeqCst) == 1
            && let Some(record) = units.find(&identity(&key)).await.unwrap()
        {
            break record;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Several leases into the handler: the first server kept renewing it.
    tokio::time::sleep(3 * LEASE).await;
    doomed.shutdown_background();

    // The second server: every resend is told to wait while the renewed lease lasts, then one
    // takes the claim over and runs the handler.
    let survivor = guard(db.clone());
    let mut told_to_wait = Vec::new();
    let answer = loop {
        let lease_left = units.look_up(&identity(&key)).await.unwrap().unwrap().1;
        match pay(&survivor, &key, Duration::ZERO, &started).await {
            Err(status) if status.code() == Code::Aborted => told_to_wait.push(lease_left),
            other => break other,
        }
        tokio::time::sleep(LEASE / 6).await;
    };
    assert!(!replayed(&answer.expect("the survivor's resend commits")));
    assert!(
        told_to_wait.iter().any(|left| !left.is_zero()),
        "a resend was told to wait while the killed server's lease lasted: {told_to_wait:?}"
    );
    assert_eq!(
        started.load(Ordering::SeqCst),
        2,
        "the handler ran again only after the kill"
    );
    assert_eq!(
        payments(&db, &key).await,
        1,
        "the killed handler's write was rolled back"
    );
    let record = units.find(&identity(&key)).await.unwrap().unwrap();
    assert_eq!(record.state(), OperationState::Committed);
    assert_eq!(
        record.version,
        claimed.version.next().next(),
        "taken over once (version + 1), then committed (+ 1)"
    );
}
