//! The pools `connect_postgres`, `connect_mysql` and `open_sqlite` open hand a busy connection out
//! without a ping (one round trip less per unit of work). Connections cut behind the pool's back
//! while it is busy (a server restart, killed sessions) are found by the next units' `BEGIN`,
//! which is sent again on another connection: every unit after the cut commits, once.

mod common;

use common::{Store, config_for, fresh, identity, lease};
use grpc_core_api::{
    ClaimOutcome, LedgerError, LedgerUnitsOfWork, OutcomeReference, RequestFingerprint,
};
use grpc_operation_ledger_seaorm::{SeaOrmUnitsOfWork, connect_mysql, connect_postgres};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, Statement};
use std::time::{Duration, Instant};

const CREATE: &str = "/payments.v1.Payments/CreatePayment";

/// The server session of a unit on `txn`.
async fn session_of(txn: &sea_orm::DatabaseTransaction) -> i64 {
    let session = match txn.get_database_backend() {
        DbBackend::MySql => "SELECT CAST(CONNECTION_ID() AS SIGNED)",
        _ => "SELECT pg_backend_pid()::BIGINT",
    };
    txn.query_one_raw(Statement::from_string(txn.get_database_backend(), session))
        .await
        .expect("the session id")
        .expect("one row")
        .try_get_by_index(0)
        .expect("a session id")
}

/// Claims and commits `key` in one unit on `units`; the unit's server session.
async fn committed_unit(units: &SeaOrmUnitsOfWork, key: &str) -> Result<i64, LedgerError> {
    let txn = units.begin().await?;
    let session = session_of(&txn).await;
    claim_and_commit(units, &txn, key).await?;
    units.commit(txn).await?;
    Ok(session)
}

async fn claim_and_commit(
    units: &SeaOrmUnitsOfWork,
    txn: &sea_orm::DatabaseTransaction,
    key: &str,
) -> Result<(), LedgerError> {
    let ledger = units.ledger(txn);
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
    Ok(())
}

fn idle_connections(pool: &DatabaseConnection) -> usize {
    match pool.get_database_backend() {
        DbBackend::MySql => pool.get_mysql_connection_pool().num_idle(),
        _ => pool.get_postgres_connection_pool().num_idle(),
    }
}

fn pings_every_acquire(pool: &DatabaseConnection) -> bool {
    match pool.get_database_backend() {
        DbBackend::MySql => pool
            .get_mysql_connection_pool()
            .options()
            .get_test_before_acquire(),
        DbBackend::Sqlite => pool
            .get_sqlite_connection_pool()
            .options()
            .get_test_before_acquire(),
        _ => pool
            .get_postgres_connection_pool()
            .options()
            .get_test_before_acquire(),
    }
}

/// How many of `sessions` the server still has.
async fn alive(t: &common::TestDb, sessions: &[i64]) -> i64 {
    let list = sessions
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let sql = match t.store {
        Store::MariaDb => {
            format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID IN ({list})")
        }
        _ => format!("SELECT COUNT(*) FROM pg_stat_activity WHERE pid IN ({list})"),
    };
    t.direct
        .query_one_raw(Statement::from_string(t.direct.get_database_backend(), sql))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<i64>(0)
        .unwrap()
}

const CONNECTIONS: usize = 4;

async fn connections_cut_while_busy_are_passed_over_and_every_unit_commits_once(store: Store) {
    let t = fresh(store).await;
    let config = config_for(store).with_max_connections(CONNECTIONS as u32);
    let pool = match store {
        Store::MariaDb => connect_mysql(&t.url, &config).await,
        _ => connect_postgres(&t.url, &config).await,
    }
    .expect("connect the pool under test");
    assert!(
        !pings_every_acquire(&pool),
        "{store:?}: a ping on every acquire"
    );
    let units = std::sync::Arc::new(SeaOrmUnitsOfWork::new(pool, &config));

    // Every connection the pool can hold, busy at once, then idle in the pool.
    let mut open = Vec::new();
    for _ in 0..CONNECTIONS {
        open.push(units.begin().await.unwrap());
    }
    let mut sessions = Vec::new();
    for (n, txn) in open.iter().enumerate() {
        sessions.push(session_of(txn).await);
        claim_and_commit(&units, txn, &format!("before-the-cut-{n}"))
            .await
            .unwrap();
    }
    for txn in open {
        units.commit(txn).await.unwrap();
    }
    // sqlx pings a connection as it goes back to the pool, off the caller's path; cut before
    // that, it would be dropped there. Cut them once all are idle in the pool, as busy ones are
    // between two units.
    let deadline = Instant::now() + Duration::from_secs(10);
    while idle_connections(units.connection()) < CONNECTIONS {
        assert!(Instant::now() < deadline, "the connections never went back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for session in &sessions {
        let kill = match store {
            Store::MariaDb => format!("KILL CONNECTION {session}"),
            _ => format!("SELECT pg_terminate_backend({session})"),
        };
        t.direct.execute_unprepared(&kill).await.unwrap();
    }
    while alive(&t, &sessions).await > 0 {
        assert!(Instant::now() < deadline, "the sessions were not ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The next unit passes over the dead connections and commits on a new one.
    let after = committed_unit(&units, "after-the-cut").await;
    let new_session = after.unwrap_or_else(|error| panic!("{store:?}: {error:?}"));
    assert!(!sessions.contains(&new_session));
    // So does every unit that follows, all at once.
    let mut concurrent = tokio::task::JoinSet::new();
    for n in 0..CONNECTIONS {
        let units = std::sync::Arc::clone(&units);
        concurrent
            .spawn(async move { committed_unit(&units, &format!("after-the-cut-{n}")).await });
    }
    while let Some(unit) = concurrent.join_next().await {
        unit.unwrap()
            .unwrap_or_else(|error| panic!("{store:?}: {error:?}"));
    }
    // Each operation exactly once: the ones before the cut replay, none was written twice.
    let txn = units.begin().await.unwrap();
    for n in 0..CONNECTIONS {
        let key = format!("before-the-cut-{n}");
        let replay = units
            .ledger(&txn)
            .claim(
                &identity("tenant-a", CREATE, &key),
                &RequestFingerprint::of(key.as_bytes()),
                lease(30_000),
            )
            .await
            .unwrap();
        assert!(
            matches!(replay, ClaimOutcome::Completed(_)),
            "{store:?}: {replay:?}"
        );
    }
    units.rollback(txn).await.unwrap();
    let rows = t
        .direct
        .query_one_raw(Statement::from_string(
            t.direct.get_database_backend(),
            "SELECT COUNT(*) FROM grpc_operation_ledger",
        ))
        .await
        .unwrap()
        .unwrap()
        .try_get_by_index::<i64>(0)
        .unwrap();
    assert_eq!(rows, 2 * CONNECTIONS as i64 + 1);
}

#[tokio::test]
async fn postgres_connections_cut_while_busy_are_passed_over() {
    connections_cut_while_busy_are_passed_over_and_every_unit_commits_once(Store::Postgres).await;
}

#[tokio::test]
async fn mariadb_connections_cut_while_busy_are_passed_over() {
    connections_cut_while_busy_are_passed_over_and_every_unit_commits_once(Store::MariaDb).await;
}

#[tokio::test]
async fn a_sqlite_pool_never_pings() {
    let t = fresh(Store::Sqlite).await;
    assert!(!pings_every_acquire(&t.db));
}
