//! The demo server's retention worker on real stores: after a run with lost responses, a pass
//! past the retention window shrinks the ledger to its operations still in progress, and the
//! payments (the business rows) stay.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use grpc_ledger_demo::{ClientOptions, ClientRetries, FaultOptions, run_demo};
use grpc_ledger_payments::{Faults, Store, open_store, service};
use grpc_operation_ledger_seaorm::{Pooler, database_url};
use grpc_tonic::{GuardMode, RetentionConfig};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};

fn client(run_id: &str) -> ClientOptions {
    ClientOptions {
        payments: 200,
        concurrency: 8,
        deadline: Duration::from_secs(3),
        changed_body_every: 0,
        run_id: run_id.to_owned(),
        progress: false,
        retries: ClientRetries::Application,
        tls: None,
    }
}

async fn count(db: &DatabaseConnection, sql: &str) -> i64 {
    let row = db
        .query_one_raw(sea_orm::Statement::from_string(
            db.get_database_backend(),
            sql,
        ))
        .await
        .unwrap()
        .expect("a count");
    row.try_get_by_index::<i64>(0).unwrap()
}

/// Runs the demo on `store`, then a retention pass with a 1 ms window on three workers at once.
async fn run_then_purge(store: &Store, run_id: &str) {
    let report = run_demo(
        store,
        FaultOptions {
            drop_rate: 0.3,
            delay_rate: 0.0,
        },
        &client(run_id),
    )
    .await
    .unwrap();
    assert!(report.reconciled(), "{report}");
    let (db, config) = open_store(store).await.unwrap();
    let ledger_rows = "SELECT COUNT(*) FROM grpc_operation_ledger";
    let in_progress = "SELECT COUNT(*) FROM grpc_operation_ledger WHERE state = 'IN_PROGRESS'";
    let payments = "SELECT COUNT(*) FROM demo_payments";
    let (before, stuck, paid) = (
        count(&db, ledger_rows).await,
        count(&db, in_progress).await,
        count(&db, payments).await,
    );
    assert!(
        before >= report.acknowledged as i64,
        "{before} rows for {report}"
    );
    let faults = Arc::new(Faults::new(0.0, 0.0, Duration::ZERO, 1));
    let service = service(&db, &config, GuardMode::ClaimFirst, faults, "purge").unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Three replicas' workers at once: each finished operation deleted once, by one of them.
    let config =
        RetentionConfig::new(Duration::from_millis(1)).with_batch(NonZeroU32::new(16).unwrap());
    let replicas: Vec<_> = (0..3)
        .map(|_| {
            let worker = service.retention_worker(config);
            tokio::spawn(async move { (worker.run_once().await.unwrap(), worker.stats()) })
        })
        .collect();
    let mut purged = 0;
    let mut censuses = Vec::new();
    for replica in replicas {
        let (pass, stats) = replica.await.unwrap();
        assert!(!pass.backlogged);
        purged += pass.purged as i64;
        censuses.push(stats.census().expect("each pass ends with a census"));
    }
    // The census of the last pass to end saw every finished operation gone; each one counted the
    // operations still in progress.
    for census in &censuses {
        assert_eq!(census.in_progress as i64, stuck, "{census:?}");
    }
    let after = service.retention_worker(config.with_max_batches(1));
    after.run_once().await.unwrap();
    let census = after.stats().census().unwrap();
    assert_eq!(
        census.past_retention, 0,
        "nothing left for purge: {census:?}"
    );
    assert_eq!(census.oldest_in_progress.is_some(), stuck > 0, "{census:?}");
    assert_eq!(
        purged,
        before - stuck,
        "every finished operation, once, in batches of 16"
    );
    assert_eq!(
        count(&db, ledger_rows).await,
        stuck,
        "only operations in progress are left"
    );
    assert_eq!(
        count(&db, payments).await,
        paid,
        "retention never touches the business rows"
    );
    db.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pass_past_the_window_shrinks_the_sqlite_ledger_to_what_is_in_progress() {
    let file = std::env::temp_dir().join(format!("demo-retention-{}.sqlite", std::process::id()));
    run_then_purge(&Store::Sqlite(file.clone()), "retention-sqlite").await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// A database of its own on the server at `variable` (the pass purges every finished operation
/// in it): runs the demo there, then the pass, then drops it.
async fn on_a_fresh_database(variable: &str, drop_suffix: &str, run_id: &str) {
    let url = std::env::var(variable)
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| panic!("{variable} is not set: run `cargo xtask test`"));
    let name = format!("demo_retention_{}", std::process::id());
    let admin = Database::connect(&url).await.unwrap();
    admin
        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
        .await
        .unwrap();
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let store = Store::Server {
        url: database_url(&url, &name).unwrap(),
        pooler: Pooler::None,
    };
    run_then_purge(&store, run_id).await;
    admin
        .execute_unprepared(&format!("DROP DATABASE {name}{drop_suffix}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pass_past_the_window_shrinks_the_postgres_ledger_to_what_is_in_progress() {
    on_a_fresh_database("DATABASE_URL", " WITH (FORCE)", "retention-pg").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pass_past_the_window_shrinks_the_mariadb_ledger_to_what_is_in_progress() {
    on_a_fresh_database("MARIADB_URL", "", "retention-mariadb").await;
}

/// A client can learn the window: every ResolvePayment answer states it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resolve_rpc_states_the_retention_window() {
    use grpc_ledger_payments::pb::ResolvePaymentRequest;
    use grpc_ledger_payments::pb::payments_client::PaymentsClient;
    use grpc_ledger_payments::{serve, with_token};
    use grpc_tonic::IDEMPOTENCY_KEY_HEADER;

    let file = std::env::temp_dir().join(format!("demo-window-{}.sqlite", std::process::id()));
    let store = Store::Sqlite(file.clone());
    let (db, config) = open_store(&store).await.unwrap();
    let faults = Arc::new(Faults::new(0.0, 0.0, Duration::ZERO, 1));
    let service = service(&db, &config, GuardMode::ClaimFirst, faults, "window")
        .unwrap()
        .with_retention(Duration::from_secs(3600));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(serve(listener, service, std::future::pending()));
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = PaymentsClient::with_interceptor(channel, with_token);
    let mut request = tonic::Request::new(ResolvePaymentRequest {});
    request
        .metadata_mut()
        .insert(IDEMPOTENCY_KEY_HEADER, "never-sent".parse().unwrap());
    let answer = client.resolve_payment(request).await.unwrap().into_inner();
    assert_eq!(answer.retention_seconds, 3600, "{answer:?}");
    server.abort();
    db.close().await.unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}
