//! PostgreSQL only: the connection of a unit of work is killed in the middle. Nothing is
//! half-written, the adapter answers `Unavailable`, and a retry on a new connection succeeds.

mod common;

use common::{Store, fresh, identity, lease};
use grpc_core_api::*;
use grpc_operation_ledger_seaorm::SeaOrmOperationLedger;
use sea_orm::{ConnectionTrait, Database, Statement, TransactionTrait};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_connection_is_unavailable_and_a_retry_succeeds() {
    let t = fresh(Store::Postgres).await;
    let id = identity("tenant-a", "/payments.v1.Payments/CreatePayment", "killed");
    let request = RequestFingerprint::of(b"pay 10");

    let txn = t.db.begin().await.unwrap();
    let ledger = SeaOrmOperationLedger::new(&txn);
    assert!(matches!(
        ledger.claim(&id, &request, lease(30_000)).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let pid: i32 = txn
        .query_one_raw(Statement::from_string(
            txn.get_database_backend(),
            "SELECT pg_backend_pid()",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index(0)
        .unwrap();
    let admin = Database::connect(&t.url).await.unwrap();
    admin
        .execute_unprepared(&format!("SELECT pg_terminate_backend({pid})"))
        .await
        .unwrap();

    let outcome = OutcomeReference::parse("payment-1").unwrap();
    let answer = ledger.mark_committed(&id, Version::FIRST, &outcome).await;
    assert!(
        matches!(answer, Err(LedgerError::Unavailable { .. })),
        "a killed connection is Unavailable, got {answer:?}"
    );
    let _ = txn.rollback().await;

    let fresh_ledger = SeaOrmOperationLedger::new(&t.db);
    assert_eq!(
        fresh_ledger.find(&id).await.unwrap(),
        None,
        "nothing half-written"
    );
    let retry = t.db.begin().await.unwrap();
    let ledger = SeaOrmOperationLedger::new(&retry);
    assert_eq!(
        ledger.claim(&id, &request, lease(30_000)).await.unwrap(),
        ClaimOutcome::Claimed {
            version: Version::FIRST,
            took_over: false
        }
    );
    ledger
        .mark_committed(&id, Version::FIRST, &outcome)
        .await
        .unwrap();
    retry.commit().await.unwrap();
    let record = fresh_ledger.find(&id).await.unwrap().unwrap();
    assert_eq!(record.outcome_reference(), Some(&outcome));
}
