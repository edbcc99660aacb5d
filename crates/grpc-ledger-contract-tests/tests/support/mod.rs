//! The SeaORM adapter's fixture: a fresh SQLite file or a fresh PostgreSQL database per case,
//! migrated by the real migrator.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use grpc_core_api::{GrpcOperationLedger, LedgerError, UnavailableKind};
use grpc_ledger_contract_tests::{Capabilities, LedgerFixture, LedgerStore, UnitOfWork};
use grpc_operation_ledger_seaorm::{
    LedgerConfig, LedgerMigrator, SeaOrmOperationLedger, connect_postgres, open_sqlite,
};
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend, Statement,
    TransactionTrait,
};
use sea_orm_migration::MigratorTrait;

const CLAIM_WAIT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub struct SeaOrmFixture {
    backend: Backend,
}

impl SeaOrmFixture {
    pub fn new(backend: Backend) -> Self {
        Self { backend }
    }
}

fn config() -> LedgerConfig {
    LedgerConfig {
        claim_wait: CLAIM_WAIT,
        max_connections: 40,
        acquire_timeout: Duration::from_secs(10),
    }
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn unique_name() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch")
        .subsec_nanos();
    format!(
        "contract_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

fn postgres_admin_url() -> String {
    match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "DATABASE_URL is not set: the PostgreSQL run of the contract suite needs a real \
             PostgreSQL. Run `cargo xtask test`, which starts one, or `cargo xtask pg start` and \
             export DATABASE_URL=$(cargo xtask pg url)"
        ),
    }
}

fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let (server, _) = base.rsplit_once('/').expect("a database URL has a path");
    match query {
        Some(query) => format!("{server}/{database}?{query}"),
        None => format!("{server}/{database}"),
    }
}

#[async_trait]
impl LedgerFixture for SeaOrmFixture {
    type Store = SeaOrmStore;

    fn capabilities(&self) -> Capabilities {
        match self.backend {
            Backend::Postgres => Capabilities {
                claim_wait: CLAIM_WAIT,
                concurrent_writers: true,
                kill_connection: true,
                concurrent_claim_identities: 200,
            },
            Backend::Sqlite => Capabilities {
                claim_wait: CLAIM_WAIT,
                concurrent_writers: false,
                kill_connection: false,
                concurrent_claim_identities: 20,
            },
        }
    }

    async fn fresh_store(&self) -> SeaOrmStore {
        let name = unique_name();
        let (db, url, file) = match self.backend {
            Backend::Sqlite => {
                let file = std::env::temp_dir().join(format!("{name}.sqlite"));
                let db = open_sqlite(&file, &config()).await.expect("open SQLite");
                (db, None, Some(file))
            }
            Backend::Postgres => {
                let admin_url = postgres_admin_url();
                let admin = Database::connect(&admin_url)
                    .await
                    .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at DATABASE_URL: {e}"));
                admin
                    .execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .expect("create database");
                admin.close().await.expect("close admin connection");
                let url = with_database(&admin_url, &name);
                let db = connect_postgres(&url, &config()).await.expect("connect");
                LedgerMigrator::up(&db, None).await.expect("migrate");
                (db, Some(url), None)
            }
        };
        db.execute_unprepared(
            "CREATE TABLE contract_business (business_key VARCHAR(255) NOT NULL)",
        )
        .await
        .expect("create the business table");
        SeaOrmStore {
            db,
            url,
            sqlite_file: file,
        }
    }
}

pub struct SeaOrmStore {
    db: DatabaseConnection,
    url: Option<String>,
    sqlite_file: Option<std::path::PathBuf>,
}

impl Drop for SeaOrmStore {
    fn drop(&mut self) {
        if let Some(file) = &self.sqlite_file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
        }
    }
}

fn lost(_: sea_orm::DbErr) -> LedgerError {
    LedgerError::unavailable(UnavailableKind::ConnectionLost)
}

async fn count(db: &impl ConnectionTrait, sql: &str, value: Option<&str>) -> u64 {
    let values = value.map(|v| vec![v.into()]).unwrap_or_default();
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            db.get_database_backend(),
            sql,
            values,
        ))
        .await
        .expect("count query")
        .expect("one row");
    row.try_get_by_index::<i64>(0).expect("a count") as u64
}

fn placeholder(db: &impl ConnectionTrait) -> &'static str {
    match db.get_database_backend() {
        DbBackend::Postgres => "$1",
        _ => "?1",
    }
}

#[async_trait]
impl LedgerStore for SeaOrmStore {
    type Unit = SeaOrmUnit;

    async fn begin(&self) -> Result<SeaOrmUnit, LedgerError> {
        let txn = self.db.begin().await.map_err(lost)?;
        Ok(SeaOrmUnit {
            txn,
            url: self.url.clone(),
        })
    }

    fn autocommit(&self) -> Box<dyn GrpcOperationLedger + '_> {
        Box::new(SeaOrmOperationLedger::new(&self.db).with_claim_wait(CLAIM_WAIT))
    }

    async fn business_rows(&self, key: &str) -> u64 {
        let sql = format!(
            "SELECT COUNT(*) FROM contract_business WHERE business_key = {}",
            placeholder(&self.db)
        );
        count(&self.db, &sql, Some(key)).await
    }

    async fn ledger_rows(&self) -> u64 {
        count(&self.db, "SELECT COUNT(*) FROM grpc_operation_ledger", None).await
    }
}

pub struct SeaOrmUnit {
    txn: DatabaseTransaction,
    url: Option<String>,
}

#[async_trait]
impl UnitOfWork for SeaOrmUnit {
    fn ledger(&self) -> Box<dyn GrpcOperationLedger + '_> {
        Box::new(SeaOrmOperationLedger::new(&self.txn).with_claim_wait(CLAIM_WAIT))
    }

    async fn business_write(&self, key: &str) -> Result<(), LedgerError> {
        let sql = format!(
            "INSERT INTO contract_business (business_key) VALUES ({})",
            placeholder(&self.txn)
        );
        self.txn
            .execute_raw(Statement::from_sql_and_values(
                self.txn.get_database_backend(),
                sql,
                [key.into()],
            ))
            .await
            .map(|_| ())
            .map_err(lost)
    }

    async fn commit(self) -> Result<(), LedgerError> {
        self.txn.commit().await.map_err(lost)
    }

    async fn rollback(self) -> Result<(), LedgerError> {
        self.txn.rollback().await.map_err(lost)
    }

    async fn kill_connection(&self) {
        let pid: i32 = self
            .txn
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                "SELECT pg_backend_pid()",
            ))
            .await
            .expect("backend pid")
            .expect("one row")
            .try_get_by_index(0)
            .expect("an int");
        let url = self
            .url
            .as_deref()
            .expect("kill_connection is a PostgreSQL capability");
        let admin = Database::connect(url).await.expect("admin connection");
        admin
            .execute_unprepared(&format!("SELECT pg_terminate_backend({pid})"))
            .await
            .expect("terminate the unit's backend");
        admin.close().await.expect("close admin connection");
    }
}
