//! The pools `connect_postgres` and `connect_mysql` open hand a busy connection out without a
//! ping (one round trip less per unit of work). A busy connection cut behind the pool's back fails
//! its next unit as UNAVAILABLE with nothing written, and the unit after it runs on a new
//! connection; the operation the cut unit was for is then claimed afresh, never lost and never
//! doubled.

mod common;

use common::{Store, config_for, fresh, identity, lease};
use grpc_core_api::{
    ClaimOutcome, LedgerError, LedgerUnitsOfWork, OutcomeReference, RequestFingerprint,
    UnavailableKind,
};
use grpc_operation_ledger_seaorm::{SeaOrmUnitsOfWork, connect_mysql, connect_postgres};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use std::time::{Duration, Instant};

const CREATE: &str = "/payments.v1.Payments/CreatePayment";

/// Claims and commits `key` in one unit on `units`; the unit's server session id.
async fn committed_unit(units: &SeaOrmUnitsOfWork, key: &str) -> Result<i64, LedgerError> {
    let txn = units.begin().await?;
    let session = match txn.get_database_backend() {
        DbBackend::MySql => "SELECT CAST(CONNECTION_ID() AS SIGNED)",
        _ => "SELECT pg_backend_pid()::BIGINT",
    };
    let id: i64 = txn
        .query_one_raw(Statement::from_string(txn.get_database_backend(), session))
        .await
        .map_err(|e| LedgerError::internal(e.to_string()))?
        .expect("one row")
        .try_get_by_index(0)
        .expect("a session id");
    let ledger = units.ledger(&txn);
    let identity = identity("tenant-a", CREATE, key);
    let ClaimOutcome::Claimed { version, .. } = ledger
        .claim(
            &identity,
            &RequestFingerprint::of(key.as_bytes()),
            lease(30_000),
        )
        .await?
    else {
        panic!("{key} is new and must be claimed");
    };
    ledger
        .mark_committed(&identity, version, &OutcomeReference::parse(key).unwrap())
        .await?;
    drop(ledger);
    units.commit(txn).await?;
    Ok(id)
}

fn idle_connections(pool: &DatabaseConnection) -> usize {
    match pool.get_database_backend() {
        DbBackend::MySql => pool.get_mysql_connection_pool().num_idle(),
        _ => pool.get_postgres_connection_pool().num_idle(),
    }
}

async fn a_cut_busy_connection_fails_one_unit_as_unavailable_and_the_next_gets_a_new_one(
    store: Store,
) {
    let t = fresh(store).await;
    // One connection, so that the unit after the cut can only get the cut one or a new one.
    let config = config_for(store).with_max_connections(1);
    let pool = match store {
        Store::MariaDb => connect_mysql(&t.url, &config).await,
        _ => connect_postgres(&t.url, &config).await,
    }
    .expect("connect the pool under test");
    let units = SeaOrmUnitsOfWork::new(pool, &config);
    let session = committed_unit(&units, "before-the-cut").await.unwrap();

    let (kill, alive) = match store {
        Store::MariaDb => (
            format!("KILL CONNECTION {session}"),
            format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {session}"),
        ),
        _ => (
            format!("SELECT pg_terminate_backend({session})"),
            format!("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = {session}"),
        ),
    };
    // sqlx pings a connection as it goes back to the pool, off the caller's path; cut before
    // that, it would be dropped there. Cut once it is idle in the pool, as a busy one is between
    // two units.
    let idle_by = Instant::now() + Duration::from_secs(10);
    while idle_connections(units.connection()) == 0 {
        assert!(
            Instant::now() < idle_by,
            "the connection never went back to the pool"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let backend = t.direct.get_database_backend();
    t.direct.execute_unprepared(&kill).await.unwrap();
    let gone_by = Instant::now() + Duration::from_secs(10);
    loop {
        let row = t
            .direct
            .query_one_raw(Statement::from_string(backend, alive.clone()))
            .await
            .unwrap()
            .unwrap();
        if row.try_get_by_index::<i64>(0).unwrap() == 0 {
            break;
        }
        assert!(Instant::now() < gone_by, "the session was not ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Handed out without a ping (it was busy a moment ago), the cut connection fails the unit.
    let cut = committed_unit(&units, "at-the-cut").await;
    assert!(
        matches!(
            cut,
            Err(LedgerError::Unavailable {
                kind: UnavailableKind::ConnectionLost
            })
        ),
        "{store:?}: the unit on the cut connection: {cut:?}"
    );
    // The next unit gets a new connection; the operation of the failed one was never written,
    // so its retry claims it afresh.
    let new_session = committed_unit(&units, "at-the-cut").await.unwrap();
    assert_ne!(new_session, session);
    let txn = units.begin().await.unwrap();
    let replay = units
        .ledger(&txn)
        .claim(
            &identity("tenant-a", CREATE, "before-the-cut"),
            &RequestFingerprint::of(b"before-the-cut"),
            lease(30_000),
        )
        .await
        .unwrap();
    assert!(
        matches!(replay, ClaimOutcome::Completed(_)),
        "{store:?}: {replay:?}"
    );
    units.rollback(txn).await.unwrap();
}

#[tokio::test]
async fn postgres_a_cut_busy_connection_fails_one_unit_and_the_next_gets_a_new_one() {
    a_cut_busy_connection_fails_one_unit_as_unavailable_and_the_next_gets_a_new_one(
        Store::Postgres,
    )
    .await;
}

#[tokio::test]
async fn mariadb_a_cut_busy_connection_fails_one_unit_and_the_next_gets_a_new_one() {
    a_cut_busy_connection_fails_one_unit_as_unavailable_and_the_next_gets_a_new_one(Store::MariaDb)
        .await;
}
