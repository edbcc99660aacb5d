//! Units that only read (`begin_read`: a resolve RPC's look-up): on SQLite they take no write
//! lock, so a look-up is answered while another unit holds the single writer's lock, where an
//! ordinary unit would wait for it and give up busy; on PostgreSQL and MariaDB they are
//! `READ ONLY`, and a write in one is refused.

mod common;

use common::{Store, config_for, fresh, identity, lease};
use grpc_core_api::{LedgerError, LedgerUnitsOfWork, RequestFingerprint, UnavailableKind};
use grpc_operation_ledger_seaorm::SeaOrmUnitsOfWork;

const CREATE: &str = "/payments.v1.Payments/CreatePayment";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_a_look_up_is_answered_while_a_claim_holds_the_write_lock() {
    let db = fresh(Store::Sqlite).await;
    let units = SeaOrmUnitsOfWork::new(db.db.clone(), &config_for(Store::Sqlite));
    let id = identity("tenant-a", CREATE, "held");
    let holder = units.begin().await.unwrap();
    units
        .ledger(&holder)
        .claim(&id, &RequestFingerprint::of(b"x"), lease(60_000))
        .await
        .unwrap();
    // An ordinary unit waits for the write lock and gives up busy.
    assert_eq!(
        units.begin().await.err(),
        Some(LedgerError::unavailable(UnavailableKind::StoreBusy))
    );
    // A read unit reads what is committed (nothing yet) without the lock.
    let reader = units.begin_read().await.unwrap();
    let found = units.ledger(&reader).look_up(&id).await.unwrap();
    assert_eq!(found, None);
    units.rollback(reader).await.unwrap();
    units.rollback(holder).await.unwrap();
}

async fn a_read_unit_refuses_writes(store: Store) {
    let db = fresh(store).await;
    let units = SeaOrmUnitsOfWork::new(db.db.clone(), &config_for(store));
    let id = identity("tenant-a", CREATE, "read-only");
    let reader = units.begin_read().await.unwrap();
    let ledger = units.ledger(&reader);
    assert_eq!(ledger.look_up(&id).await.unwrap(), None);
    let claimed = ledger
        .claim(&id, &RequestFingerprint::of(b"x"), lease(60_000))
        .await;
    assert!(
        matches!(
            claimed,
            Err(LedgerError::Unavailable {
                kind: UnavailableKind::StoreNotReady
            })
        ),
        "{store:?}: a write in a read unit is refused: {claimed:?}"
    );
    drop(ledger);
    let _ = units.rollback(reader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_read_unit_is_read_only() {
    a_read_unit_refuses_writes(Store::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mariadb_a_read_unit_is_read_only() {
    a_read_unit_refuses_writes(Store::MariaDb).await;
}

/// Through PgBouncer in transaction pooling: `READ ONLY` goes with the unit's set-up message in
/// the simple query protocol (the driver's own `SET TRANSACTION` is a prepared statement, which
/// the pooler loses between transactions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_transaction_pooler_a_read_unit_is_read_only() {
    for _ in 0..3 {
        a_read_unit_refuses_writes(Store::PostgresBehindTransactionPooler).await;
    }
}
