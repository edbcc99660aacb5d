//! Fresh stores for the adapter's own tests: a new SQLite file, or a new database on the
//! PostgreSQL (`DATABASE_URL`) or the MariaDB (`MARIADB_URL`) that `cargo xtask test` started.

#![allow(dead_code, unreachable_pub)]

pub mod contract;
pub mod migrations;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use grpc_core_api::{
    CallerFingerprint, GrpcMethod, GrpcOperationIdentity, IdempotencyKey, KeyHasher, LeaseDuration,
};
use grpc_ledger_contract_tests::ClockSkew;
use grpc_operation_ledger_seaorm::{
    LedgerConfig, Pooler, connect_mysql, connect_postgres, database_url, migrate, open_sqlite,
};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    Sqlite,
    Postgres,
    /// The PostgreSQL of `DATABASE_URL` reached through PgBouncer in transaction pooling
    /// (`PGBOUNCER_TRANSACTION_URL`); the tests' own bookkeeping goes to PostgreSQL directly.
    PostgresBehindTransactionPooler,
    MariaDb,
    /// A three-node MariaDB Galera cluster (`GALERA_URLS`, comma-separated node URLs).
    Galera,
}

/// One test's store; a SQLite file is deleted when it is dropped.
pub struct TestDb {
    /// The pool under test.
    pub db: DatabaseConnection,
    /// A pool straight to the database, for the tests' own statements (`db` itself except behind
    /// a transaction pooler, where a statement outside a transaction is not safe).
    pub direct: DatabaseConnection,
    pub store: Store,
    pub url: String,
    /// On a cluster, every node's pool and URL (the first is `db`'s node); empty otherwise.
    pub nodes: Vec<(DatabaseConnection, String)>,
    sqlite_file: Option<PathBuf>,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(file) = &self.sqlite_file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
        }
    }
}

pub fn config() -> LedgerConfig {
    LedgerConfig::default()
        .with_claim_wait(Duration::from_millis(500))
        .with_max_connections(40)
        .with_acquire_timeout(Duration::from_secs(10))
}

/// The tests' configuration for `store`.
pub fn config_for(store: Store) -> LedgerConfig {
    match store {
        // Straight to PostgreSQL (or through session pooling), the deployment may say so and
        // cache statements; behind a transaction pooler the default, told nothing, must hold.
        Store::Postgres => config().with_pooler(Pooler::None),
        Store::PostgresBehindTransactionPooler => config(),
        _ => config(),
    }
}

/// PgBouncer in transaction pooling in front of `DATABASE_URL`'s server, as `cargo xtask test`
/// starts it; no silent skip either.
pub fn transaction_pooler_url() -> String {
    match std::env::var("PGBOUNCER_TRANSACTION_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "PGBOUNCER_TRANSACTION_URL is not set: these tests need PgBouncer in transaction              pooling in front of DATABASE_URL's PostgreSQL; `cargo xtask test` starts one"
        ),
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "ledger_test_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The PostgreSQL the tests must run against. There is no silent skip: without it the test fails
/// and says how to get one.
pub fn postgres_admin_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "DATABASE_URL is not set: these tests need a real PostgreSQL. Run them with \
             `cargo xtask test`, which starts one, or start one with `cargo xtask pg start` and \
             export DATABASE_URL=$(cargo xtask pg url)"
        ),
    }
}

/// The MariaDB the tests must run against (`mysql://user:password@host:port`, no database). As
/// with PostgreSQL, there is no silent skip.
pub fn mariadb_admin_url() -> String {
    match std::env::var("MARIADB_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "MARIADB_URL is not set: these tests need a real MariaDB. Run them with \
             `cargo xtask test`, which starts one, or start one with `cargo xtask mariadb start` \
             and export MARIADB_URL=$(cargo xtask mariadb url)"
        ),
    }
}

/// `url` with its database name replaced.
pub fn with_database(url: &str, database: &str) -> String {
    database_url(url, database).expect("a database server URL")
}

/// Creates database `name` on the server at `admin_url` (read from the variable `variable`).
async fn create_database(admin_url: &str, variable: &str, name: &str) {
    let admin = Database::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach the server at {variable} ({e}); is it running?"));
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a fresh database");
    admin.close().await.expect("close the admin connection");
}

/// Gives the fresh PostgreSQL database `name` the clock `skew` says, before any pool connects to
/// it (see [`ClockSkew::postgres_statements`]): its search path from the server's admin
/// connection first, so that no session of `name` (which a pooler may keep) starts without it.
async fn skew_postgres_clock(admin_url: &str, name: &str, skew: ClockSkew) {
    let [search_path, functions] = skew.postgres_statements(name);
    let admin = Database::connect(admin_url)
        .await
        .expect("connect to the server");
    admin
        .execute_unprepared(&search_path)
        .await
        .expect("put the skewed clock on the search path");
    admin.close().await.expect("close the admin connection");
    let db = Database::connect(with_database(admin_url, name))
        .await
        .expect("connect to the fresh database");
    db.execute_unprepared(&functions)
        .await
        .expect("create the skewed clock's functions");
    db.close().await.expect("close the set-up connection");
}

/// A fresh database `name` on the server at `admin_url` (PostgreSQL or MariaDB, as `store`
/// says), with its clock `skew` away from the process's on PostgreSQL, migrated, reached
/// directly.
async fn on_server(
    store: Store,
    admin_url: &str,
    variable: &str,
    name: &str,
    skew: Option<ClockSkew>,
) -> TestDb {
    create_database(admin_url, variable, name).await;
    if let Some(skew) = skew {
        skew_postgres_clock(admin_url, name, skew).await;
    }
    let url = with_database(admin_url, name);
    let db = match store {
        Store::MariaDb => connect_mysql(&url, &config()).await,
        _ => connect_postgres(&url, &config_for(store)).await,
    }
    .unwrap_or_else(|e| panic!("cannot connect to the test database at {variable}: {e}"));
    migrate(&db).await.expect("apply the ledger migrations");
    TestDb {
        direct: db.clone(),
        db,
        store,
        url,
        sqlite_file: None,
        nodes: Vec::new(),
    }
}

/// A fresh, migrated store.
pub async fn fresh(store: Store) -> TestDb {
    fresh_with_clock(store, None).await
}

/// A fresh, migrated store whose clock reads `skew` away from the process's (PostgreSQL only: a
/// skew on another store is a bug of the caller's).
pub async fn fresh_with_clock(store: Store, skew: Option<ClockSkew>) -> TestDb {
    assert!(
        skew.is_none()
            || matches!(
                store,
                Store::Postgres | Store::PostgresBehindTransactionPooler
            ),
        "only PostgreSQL's clock can be skewed per database"
    );
    let name = unique_name();
    match store {
        Store::Sqlite => {
            let file = std::env::temp_dir().join(format!("{name}.sqlite"));
            let db = open_sqlite(&file, &config()).await.expect("open SQLite");
            TestDb {
                direct: db.clone(),
                db,
                store,
                url: format!("sqlite://{}", file.display()),
                sqlite_file: Some(file),
                nodes: Vec::new(),
            }
        }
        Store::Postgres => {
            on_server(store, &postgres_admin_url(), "DATABASE_URL", &name, skew).await
        }
        Store::PostgresBehindTransactionPooler => {
            let admin_url = postgres_admin_url();
            create_database(&admin_url, "DATABASE_URL", &name).await;
            if let Some(skew) = skew {
                skew_postgres_clock(&admin_url, &name, skew).await;
            }
            let direct = connect_postgres(&with_database(&admin_url, &name), &config())
                .await
                .expect("connect PostgreSQL");
            migrate(&direct).await.expect("apply the ledger migrations");
            let url = with_database(&transaction_pooler_url(), &name);
            let db = connect_postgres(&url, &config_for(store))
                .await
                .expect("connect PostgreSQL through PgBouncer");
            TestDb {
                db,
                direct,
                store,
                url,
                sqlite_file: None,
                nodes: Vec::new(),
            }
        }
        Store::MariaDb => on_server(store, &mariadb_admin_url(), "MARIADB_URL", &name, None).await,
        Store::Galera => {
            let urls: Vec<String> = std::env::var("GALERA_URLS")
                .ok()
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| {
                    panic!(
                        "GALERA_URLS is not set: run `cargo xtask galera test`, which starts a \
                         three-node cluster"
                    )
                })
                .split(',')
                .map(str::to_owned)
                .collect();
            // Created on node 1 and replicated to every node.
            create_database(&urls[0], "GALERA_URLS", &name).await;
            let mut nodes = Vec::new();
            for url in &urls {
                let url = with_database(url, &name);
                // The other nodes apply the CREATE DATABASE a moment after node 1 returns.
                let mut tries = 0;
                let db = loop {
                    match connect_mysql(&url, &config()).await {
                        Ok(db) => break db,
                        Err(_) if tries < 50 => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(error) => panic!("connect a node: {error}"),
                    }
                };
                nodes.push((db, url));
            }
            migrate(&nodes[0].0)
                .await
                .expect("apply the ledger migrations");
            TestDb {
                db: nodes[0].0.clone(),
                direct: nodes[0].0.clone(),
                store,
                url: nodes[0].1.clone(),
                sqlite_file: None,
                nodes,
            }
        }
    }
}

pub fn identity(caller: &str, method: &str, key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::parse(caller).unwrap(),
        GrpcMethod::parse(method).unwrap(),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).unwrap()),
    )
}

pub fn lease(millis: u64) -> LeaseDuration {
    LeaseDuration::new(Duration::from_millis(millis)).unwrap()
}

/// Runs a test body once against each store, as two named tests.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::common::Store::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::common::Store::Postgres).await
                }
            )*
        }
        mod mariadb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::common::Store::MariaDb).await
                }
            )*
        }
    };
}
