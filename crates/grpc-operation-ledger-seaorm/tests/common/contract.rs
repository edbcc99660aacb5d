//! The SeaORM adapter's fixture for the contract suite: a fresh SQLite file or a fresh PostgreSQL
//! database per case (see [`super::fresh`]), migrated by the real migrator, plus a business table.

use async_trait::async_trait;
use grpc_core_api::{GrpcOperationLedger, LedgerError, LedgerUnitsOfWork, UnitPerCall};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use grpc_ledger_contract_tests::commit_cut::{CommitCutProxy, WireProtocol};
use grpc_ledger_contract_tests::{
    Capabilities, ClockSkew, CommitCut, ConnectionKiller, HeldTableLock, LedgerFixture,
    LedgerStore, LostCommit, Migrations, RawRow, SkewedClock, TableLocking, UnitOfWork,
};
use grpc_operation_ledger_seaorm::{
    LedgerMigrator, SeaOrmOperationLedger, SeaOrmUnitsOfWork, connect_mysql, connect_postgres,
    in_dialect, migrate, open_sqlite, store_error,
};
use sea_orm::{
    ConnectionTrait, Database, DatabaseConnection, DatabaseTransaction, DbBackend,
    SqliteTransactionMode, Statement, TransactionOptions, TransactionTrait,
};
use sea_orm_migration::MigratorTrait;

use super::{Store, TestDb, config, config_for, fresh_with_clock};

pub struct SeaOrmFixture {
    store: Store,
}

impl SeaOrmFixture {
    pub fn new(store: Store) -> Self {
        Self { store }
    }
}

#[async_trait]
impl LedgerFixture for SeaOrmFixture {
    type Store = SeaOrmStore;

    fn capabilities(&self) -> Capabilities {
        let server = Capabilities::new(config().claim_wait);
        match self.store {
            Store::Postgres | Store::PostgresBehindTransactionPooler => {
                server.with_concurrent_claim_identities(200)
            }
            Store::MariaDb => server.with_concurrent_claim_identities(100),
            // Units are spread over the three nodes, one after another.
            Store::Galera => server.with_concurrent_claim_identities(30).multi_primary(),
            // One writer at a time.
            Store::Sqlite => Capabilities::new(config().claim_wait)
                .without_concurrent_writers()
                .with_concurrent_claim_identities(20),
        }
    }

    async fn fresh_store(&self) -> SeaOrmStore {
        self.fresh_store_on_clock(None).await
    }

    fn migrations(&self) -> Option<&dyn Migrations<Store = SeaOrmStore>> {
        Some(self)
    }

    /// PostgreSQL and MariaDB; SQLite has no server session to end from outside.
    fn connection_killer(&self) -> Option<&dyn ConnectionKiller<Unit = SeaOrmUnit>> {
        (self.store != Store::Sqlite).then_some(self as _)
    }

    fn table_locking(&self) -> Option<&dyn TableLocking<Store = SeaOrmStore>> {
        Some(self)
    }

    /// PostgreSQL only, by functions that shadow `pg_catalog`'s clock in the case's database.
    /// SQLite is embedded: its clock is the process's own, so there is no second clock to
    /// disagree. MariaDB's clock functions cannot be shadowed per database, and
    /// `SET timestamp` stops the session's clock (no lease would ever run out): a MariaDB server
    /// under another clock (libfaketime) would be needed.
    fn skewed_clock(&self) -> Option<&dyn SkewedClock<Store = SeaOrmStore>> {
        matches!(
            self.store,
            Store::Postgres | Store::PostgresBehindTransactionPooler
        )
        .then_some(self as _)
    }

    /// PostgreSQL and MariaDB, through a proxy that loses the answer to a COMMIT. SQLite is
    /// embedded: a commit cannot lose its answer on the way back. Behind PgBouncer and on
    /// Galera the direct stores' case covers the adapter's code, which is the same.
    fn lost_commit(&self) -> Option<&dyn LostCommit<Store = SeaOrmStore>> {
        matches!(self.store, Store::Postgres | Store::MariaDb).then_some(self as _)
    }
}

#[async_trait]
impl SkewedClock for SeaOrmFixture {
    type Store = SeaOrmStore;

    async fn fresh_store_with_clock(&self, skew: ClockSkew) -> SeaOrmStore {
        self.fresh_store_on_clock(Some(skew)).await
    }
}

impl SeaOrmFixture {
    /// A fresh store with the business table, on the process's clock or `skew` away from it.
    async fn fresh_store_on_clock(&self, skew: Option<ClockSkew>) -> SeaOrmStore {
        let test_db = fresh_with_clock(self.store, skew).await;
        test_db
            .direct
            .execute_unprepared(
                "CREATE TABLE contract_business (business_key VARCHAR(255) NOT NULL)",
            )
            .await
            .expect("create the business table");
        SeaOrmStore {
            test_db,
            next_node: AtomicUsize::new(0),
            units_through_cut: None,
        }
    }
}

#[async_trait]
impl LostCommit for SeaOrmFixture {
    type Store = SeaOrmStore;

    /// A fresh store whose units of work connect through a [`CommitCutProxy`] in front of the
    /// server.
    async fn fresh_store_losing_commits(&self) -> (SeaOrmStore, Box<dyn CommitCut>) {
        let mut store = self.fresh_store().await;
        let mut url = url::Url::parse(&store.test_db.url).expect("the store's URL");
        let server = tokio::net::lookup_host((
            url.host_str().expect("a server host").to_owned(),
            url.port().expect("a server port"),
        ))
        .await
        .expect("resolve the server")
        .next()
        .expect("an address for the server");
        let protocol = match self.store {
            Store::MariaDb => WireProtocol::MySql,
            _ => WireProtocol::Postgres,
        };
        let proxy = CommitCutProxy::start(server, protocol)
            .await
            .expect("start the commit-cutting proxy");
        url.set_port(Some(proxy.address().port())).expect("a port");
        url.set_host(Some("127.0.0.1")).expect("a host");
        let through = match self.store {
            Store::MariaDb => connect_mysql(url.as_str(), &config()).await,
            _ => connect_postgres(url.as_str(), &config_for(self.store)).await,
        }
        .expect("connect through the proxy");
        store.units_through_cut = Some(through);
        (store, Box::new(proxy))
    }
}

#[async_trait]
impl Migrations for SeaOrmFixture {
    type Store = SeaOrmStore;

    /// A fresh store whose ledger migrations were reverted by the real migrator.
    async fn fresh_unmigrated_store(&self) -> SeaOrmStore {
        let store = self.fresh_store().await;
        LedgerMigrator::down(&store.test_db.direct, None)
            .await
            .expect("revert the ledger migrations");
        store
    }

    /// Opens a pool of its own and migrates through it, as a starting process does.
    async fn migrate(&self, store: &SeaOrmStore) -> Result<(), LedgerError> {
        let url = &store.test_db.url;
        let migrated = match store.test_db.store {
            Store::Sqlite => {
                let path = url.trim_start_matches("sqlite://");
                open_sqlite(path.as_ref(), &config()).await.map(|_| ())
            }
            Store::Postgres | Store::PostgresBehindTransactionPooler => {
                let config = config_for(store.test_db.store);
                match connect_postgres(url, &config).await {
                    Ok(db) => migrate(&db).await,
                    Err(error) => Err(error),
                }
            }
            Store::MariaDb | Store::Galera => match connect_mysql(url, &config()).await {
                Ok(db) => migrate(&db).await,
                Err(error) => Err(error),
            },
        };
        migrated.map_err(|error| LedgerError::internal(format!("migrating failed: {error}")))
    }
}

#[async_trait]
impl TableLocking for SeaOrmFixture {
    type Store = SeaOrmStore;

    /// PostgreSQL: `LOCK TABLE ... IN ACCESS EXCLUSIVE MODE`, what `ALTER TABLE`, `VACUUM FULL`
    /// or a plain `CREATE INDEX` (SHARE) take, in a transaction on a direct connection. MariaDB:
    /// `LOCK TABLES ... WRITE`, on every node of a cluster. SQLite: a write transaction
    /// (`BEGIN IMMEDIATE`) on another connection, which is as much as SQLite locks.
    async fn lock_ledger_table(&self, store: &SeaOrmStore) -> Box<dyn HeldTableLock> {
        let test_db = &store.test_db;
        let pools: Vec<_> = if test_db.nodes.is_empty() {
            vec![test_db.direct.clone()]
        } else {
            test_db.nodes.iter().map(|(db, _)| db.clone()).collect()
        };
        let mut held = Vec::new();
        for pool in pools {
            let backend = pool.get_database_backend();
            let options = TransactionOptions {
                sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
                ..TransactionOptions::default()
            };
            let txn = pool
                .begin_with_options(options)
                .await
                .expect("begin the lock holder's transaction");
            let lock = match backend {
                DbBackend::Postgres => {
                    Some("LOCK TABLE grpc_operation_ledger IN ACCESS EXCLUSIVE MODE")
                }
                DbBackend::MySql => Some("LOCK TABLES grpc_operation_ledger WRITE"),
                _ => None,
            };
            if let Some(lock) = lock {
                txn.execute_unprepared(lock)
                    .await
                    .expect("lock the ledger table");
            }
            held.push(txn);
        }
        Box::new(HeldLedgerTable(held))
    }
}

/// The transactions (one per node) that hold the ledger table.
struct HeldLedgerTable(Vec<DatabaseTransaction>);

#[async_trait]
impl HeldTableLock for HeldLedgerTable {
    async fn release(self: Box<Self>) {
        for txn in self.0 {
            if txn.get_database_backend() == DbBackend::MySql {
                txn.execute_unprepared("UNLOCK TABLES")
                    .await
                    .expect("unlock the ledger table");
            }
            txn.rollback()
                .await
                .expect("end the lock holder's transaction");
        }
    }
}

#[async_trait]
impl ConnectionKiller for SeaOrmFixture {
    type Unit = SeaOrmUnit;

    /// Ends the unit's server session from a second connection, as an operator or a failover
    /// would.
    async fn kill_connection(&self, unit: &SeaOrmUnit) {
        let backend = unit.txn.get_database_backend();
        let (who, kill) = match backend {
            DbBackend::MySql => ("SELECT CAST(CONNECTION_ID() AS SIGNED)", "KILL CONNECTION "),
            _ => (
                "SELECT pg_backend_pid()::BIGINT",
                "SELECT pg_terminate_backend",
            ),
        };
        let id: i64 = unit
            .txn
            .query_one_raw(Statement::from_string(backend, who))
            .await
            .expect("the session id")
            .expect("one row")
            .try_get_by_index(0)
            .expect("an id");
        let admin = Database::connect(&unit.url)
            .await
            .expect("admin connection");
        let statement = match backend {
            DbBackend::MySql => format!("{kill}{id}"),
            _ => format!("{kill}({id})"),
        };
        admin
            .execute_unprepared(&statement)
            .await
            .expect("end the unit's session");
        admin.close().await.expect("close admin connection");
    }
}

pub struct SeaOrmStore {
    test_db: TestDb,
    /// On a cluster, the node the next unit of work begins on.
    next_node: AtomicUsize,
    /// Where units of work begin instead, when the store loses commits' answers: a pool through
    /// a [`CommitCutProxy`]. Everything else stays on the direct pools.
    units_through_cut: Option<DatabaseConnection>,
}

fn placeholder(db: &impl ConnectionTrait) -> &'static str {
    match db.get_database_backend() {
        DbBackend::Postgres => "$1",
        DbBackend::MySql => "?",
        _ => "?1",
    }
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

#[async_trait]
impl LedgerStore for SeaOrmStore {
    type Unit = SeaOrmUnit;

    /// Begins the unit as the guard does, through [`SeaOrmUnitsOfWork`].
    /// Begins the unit as the guard does, through [`SeaOrmUnitsOfWork`]; on a cluster, on the
    /// next node in turn.
    async fn begin(&self) -> Result<SeaOrmUnit, LedgerError> {
        let (db, url) = if let Some(through) = &self.units_through_cut {
            (through, &self.test_db.url)
        } else if self.test_db.nodes.is_empty() {
            (&self.test_db.db, &self.test_db.url)
        } else {
            let n = self.next_node.fetch_add(1, Ordering::Relaxed) % self.test_db.nodes.len();
            let (db, url) = &self.test_db.nodes[n];
            (db, url)
        };
        let units = SeaOrmUnitsOfWork::new(db.clone(), &config_for(self.test_db.store));
        let txn = units.begin().await?;
        Ok(SeaOrmUnit {
            txn,
            url: url.clone(),
            units,
        })
    }

    /// Statements that commit on their own; behind a transaction pooler, each call in a unit of
    /// work of its own (a statement outside a transaction is not safe there).
    fn autocommit(&self) -> Box<dyn GrpcOperationLedger + '_> {
        let store = self.test_db.store;
        if store == Store::PostgresBehindTransactionPooler {
            return Box::new(UnitPerCall::new(SeaOrmUnitsOfWork::new(
                self.test_db.db.clone(),
                &config_for(store),
            )));
        }
        Box::new(SeaOrmOperationLedger::new(&self.test_db.db).with_claim_wait(config().claim_wait))
    }

    async fn business_rows(&self, key: &str) -> u64 {
        let db = &self.test_db.direct;
        let sql = format!(
            "SELECT COUNT(*) FROM contract_business WHERE business_key = {}",
            placeholder(db)
        );
        count(db, &sql, Some(key)).await
    }

    async fn ledger_rows(&self) -> u64 {
        count(
            &self.test_db.direct,
            "SELECT COUNT(*) FROM grpc_operation_ledger",
            None,
        )
        .await
    }

    async fn write_raw_row(&self, row: RawRow<'_>) -> bool {
        static ROWS: AtomicU64 = AtomicU64::new(0);
        let n = ROWS.fetch_add(1, Ordering::Relaxed);
        let db = &self.test_db.direct;
        let sql = "INSERT INTO grpc_operation_ledger (identity_digest, caller_fingerprint, \
             full_method_name, idempotency_key_hash, request_fingerprint, state, version, \
             claimed_at, lease_expires_at, completed_at, outcome_reference, failure_code, \
             failure_message) \
             VALUES ($1, 'raw', '/raw.v1.Rows/Write', $2, $3, $4, 1, 1, 2, $5, $6, $7, $8)";
        let sql = in_dialect(db.get_database_backend(), sql).expect("a supported store");
        let key_hash = grpc_core_api::IdempotencyKeyHash::from_hex(&format!("{n:064x}")).unwrap();
        let identity = grpc_core_api::GrpcOperationIdentity::new(
            grpc_core_api::CallerFingerprint::parse("raw").unwrap(),
            grpc_core_api::GrpcMethod::parse("/raw.v1.Rows/Write").unwrap(),
            key_hash,
        );
        let values: Vec<sea_orm::Value> = vec![
            identity.storage_digest().to_vec().into(),
            key_hash.as_bytes().to_vec().into(),
            vec![0xaa_u8; 32].into(),
            row.state.into(),
            row.completed.then_some(3i64).into(),
            row.outcome_reference.map(str::to_owned).into(),
            row.failure_code.into(),
            row.failure_message.map(str::to_owned).into(),
        ];
        db.execute_raw(Statement::from_sql_and_values(
            db.get_database_backend(),
            sql,
            values,
        ))
        .await
        .is_ok()
    }
}

pub struct SeaOrmUnit {
    txn: DatabaseTransaction,
    url: String,
    /// The units of work it began from, whose commit and rollback map errors as the guard sees
    /// them.
    units: SeaOrmUnitsOfWork,
}

#[async_trait]
impl UnitOfWork for SeaOrmUnit {
    /// The ledger the guard uses in its units.
    fn ledger(&self) -> Box<dyn GrpcOperationLedger + '_> {
        self.units.ledger(&self.txn)
    }

    async fn business_write(&self, key: &str) -> Result<(), LedgerError> {
        let sql = format!(
            "INSERT INTO contract_business (business_key) VALUES ({})",
            placeholder(&self.txn)
        );
        let backend = self.txn.get_database_backend();
        self.txn
            .execute_raw(Statement::from_sql_and_values(backend, sql, [key.into()]))
            .await
            .map(|_| ())
            .map_err(store_error)
    }

    async fn commit(self) -> Result<(), LedgerError> {
        self.units.commit(self.txn).await
    }

    async fn rollback(self) -> Result<(), LedgerError> {
        self.units.rollback(self.txn).await
    }
}
