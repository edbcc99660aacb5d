//! The whole contract suite on the sqlx example adapter, against the PostgreSQL `DATABASE_URL`
//! names (`cargo xtask test` starts one): a database of its own per case, dropped by the
//! fixture's `after_case` hook. Without `DATABASE_URL` every case fails and says how to get one.
//!
//! This is the minimal fixture of `docs/adapters.md`, in full: the three traits, and all four
//! optional hooks.

use std::sync::Mutex as StdMutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use grpc_core_api::store_errors::During;
use grpc_core_api::{GrpcOperationLedger, LedgerError};
use grpc_ledger_adapter_example_sqlx::{SqlxUnit, SqlxUnits, migrate, store_error};
use grpc_ledger_contract_tests::{
    Capabilities, ClockSkew, ConnectionKiller, HeldTableLock, LedgerFixture, LedgerStore,
    Migrations, RawRow, SkewedClock, TableLocking, UnitOfWork, ledger_contract_tests,
};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

const CLAIM_WAIT: Duration = Duration::from_millis(500);

/// The server's URL, with `database` as its database.
fn url_of(database: &str) -> String {
    let server = std::env::var("DATABASE_URL").unwrap_or_else(|_| {
        panic!(
            "DATABASE_URL is not set: run `cargo xtask test`, or `cargo xtask pg start` and \
             export DATABASE_URL=$(cargo xtask pg url)"
        )
    });
    let (base, query) = server
        .split_once('?')
        .map_or((server.as_str(), ""), |(b, q)| (b, q));
    let base = &base[..base.rfind('/').expect("a URL with a path")];
    match query {
        "" => format!("{base}/{database}"),
        query => format!("{base}/{database}?{query}"),
    }
}

async fn admin() -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect(&url_of("postgres"))
        .await
        .expect("connect to DATABASE_URL's server")
}

struct SqlxFixture {
    /// The databases this test made, dropped after each case.
    databases: StdMutex<Vec<String>>,
}

impl SqlxFixture {
    fn new() -> Self {
        Self {
            databases: StdMutex::default(),
        }
    }

    /// A fresh, empty database with the business table, not yet migrated, on the server's clock
    /// or `skew` away from the process's.
    async fn fresh_database(&self, skew: Option<ClockSkew>) -> SqlxStore {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "sqlx_example_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let admin = admin().await;
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .expect("create a database");
        self.databases.lock().unwrap().push(name.clone());
        let url = url_of(&name);
        if let Some(skew) = skew {
            // Before the store's pool connects: a session reads its search path when it starts.
            let [functions, search_path] = skew.postgres_statements(&name);
            let set_up = PgPoolOptions::new()
                .max_connections(1)
                .connect(&url)
                .await
                .expect("connect to the fresh database");
            sqlx::raw_sql(AssertSqlSafe(functions))
                .execute(&set_up)
                .await
                .expect("create the skewed clock's functions");
            set_up.close().await;
            sqlx::raw_sql(AssertSqlSafe(search_path))
                .execute(&admin)
                .await
                .expect("put the skewed clock on the search path");
        }
        admin.close().await;
        let pool = PgPoolOptions::new()
            .max_connections(40)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&url)
            .await
            .expect("connect to the fresh database");
        sqlx::query("CREATE TABLE business (business_key TEXT NOT NULL)")
            .execute(&pool)
            .await
            .expect("create the business table");
        SqlxStore {
            units: SqlxUnits::new(pool.clone(), CLAIM_WAIT),
            pool,
            url,
        }
    }
}

#[async_trait]
impl LedgerFixture for SqlxFixture {
    type Store = SqlxStore;

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(CLAIM_WAIT)
    }

    async fn fresh_store(&self) -> SqlxStore {
        self.fresh_store_on_clock(None).await
    }

    fn migrations(&self) -> Option<&dyn Migrations<Store = SqlxStore>> {
        Some(self)
    }

    fn connection_killer(&self) -> Option<&dyn ConnectionKiller<Unit = Unit>> {
        Some(self)
    }

    fn table_locking(&self) -> Option<&dyn TableLocking<Store = SqlxStore>> {
        Some(self)
    }

    fn skewed_clock(&self) -> Option<&dyn SkewedClock<Store = SqlxStore>> {
        Some(self)
    }

    /// Drops the case's databases (their pools were closed with their stores).
    async fn after_case(&self, _case: &'static str) {
        let names = std::mem::take(&mut *self.databases.lock().unwrap());
        let admin = admin().await;
        for name in names {
            sqlx::query(AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(&admin)
            .await
            .expect("drop the case's database");
        }
        admin.close().await;
    }
}

impl SqlxFixture {
    /// A fresh, migrated store on the server's clock or `skew` away from the process's.
    async fn fresh_store_on_clock(&self, skew: Option<ClockSkew>) -> SqlxStore {
        let store = self.fresh_database(skew).await;
        migrate(&store.pool).await.expect("migrate");
        store
    }
}

/// The case's database with `clock_timestamp()` of its own, ahead of `pg_catalog` on its search
/// path (the adapter reads no other clock).
#[async_trait]
impl SkewedClock for SqlxFixture {
    type Store = SqlxStore;

    async fn fresh_store_with_clock(&self, skew: ClockSkew) -> SqlxStore {
        self.fresh_store_on_clock(Some(skew)).await
    }
}

#[async_trait]
impl Migrations for SqlxFixture {
    type Store = SqlxStore;

    async fn fresh_unmigrated_store(&self) -> SqlxStore {
        self.fresh_database(None).await
    }

    /// A pool of its own, as a starting process has.
    async fn migrate(&self, store: &SqlxStore) -> Result<(), LedgerError> {
        let pool = PgPool::connect(&store.url)
            .await
            .map_err(store_error(During::Other))?;
        let migrated = migrate(&pool).await;
        pool.close().await;
        migrated
    }
}

#[async_trait]
impl ConnectionKiller for SqlxFixture {
    type Unit = Unit;

    async fn kill_connection(&self, unit: &Unit) {
        let pid = unit.0.backend_pid().await.expect("the unit's pid");
        let admin = admin().await;
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&admin)
            .await
            .expect("end the unit's session");
        admin.close().await;
    }
}

#[async_trait]
impl TableLocking for SqlxFixture {
    type Store = SqlxStore;

    async fn lock_ledger_table(&self, store: &SqlxStore) -> Box<dyn HeldTableLock> {
        let mut txn = store.pool.begin().await.expect("begin");
        sqlx::query("LOCK TABLE sqlx_ledger IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *txn)
            .await
            .expect("lock the ledger table");
        Box::new(HeldLock(txn))
    }
}

struct HeldLock(Transaction<'static, Postgres>);

#[async_trait]
impl HeldTableLock for HeldLock {
    async fn release(self: Box<Self>) {
        self.0.rollback().await.expect("release the table lock");
    }
}

struct SqlxStore {
    pool: PgPool,
    units: SqlxUnits,
    url: String,
}

async fn count(pool: &PgPool, sql: &'static str, key: Option<&str>) -> u64 {
    let query = sqlx::query_scalar::<_, i64>(sql);
    let query = match key {
        Some(key) => query.bind(key.to_owned()),
        None => query,
    };
    query.fetch_one(pool).await.expect("count") as u64
}

#[async_trait]
impl LedgerStore for SqlxStore {
    type Unit = Unit;

    async fn begin(&self) -> Result<Unit, LedgerError> {
        self.units.begin().await.map(Unit)
    }

    fn autocommit(&self) -> Box<dyn GrpcOperationLedger + '_> {
        Box::new(self.units.autocommit())
    }

    async fn business_rows(&self, key: &str) -> u64 {
        count(
            &self.pool,
            "SELECT COUNT(*) FROM business WHERE business_key = $1",
            Some(key),
        )
        .await
    }

    async fn ledger_rows(&self) -> u64 {
        count(&self.pool, "SELECT COUNT(*) FROM sqlx_ledger", None).await
    }

    async fn write_raw_row(&self, row: RawRow<'_>) -> bool {
        static ROWS: AtomicU32 = AtomicU32::new(0);
        let n = ROWS.fetch_add(1, Ordering::Relaxed);
        sqlx::query(
            "INSERT INTO sqlx_ledger (caller, method, key_hash, request_fingerprint, state, \
             version, claimed_at, lease_expires_at, completed_at, outcome_reference, \
             failure_code, failure_message) \
             VALUES ('raw', '/raw.v1.Rows/Write', $1, $2, $3, 1, 1, 2, $4, $5, $6, $7)",
        )
        .bind(format!("{n:064x}"))
        .bind("a".repeat(64))
        .bind(row.state.to_owned())
        .bind(row.completed.then_some(3_i64))
        .bind(row.outcome_reference.map(str::to_owned))
        .bind(row.failure_code)
        .bind(row.failure_message.map(str::to_owned))
        .execute(&self.pool)
        .await
        .is_ok()
    }
}

/// The adapter's unit, wrapped: the suite's traits and the adapter's types both come from other
/// crates, so the fixture implements the trait on a type of its own.
struct Unit(SqlxUnit);

#[async_trait]
impl UnitOfWork for Unit {
    fn ledger(&self) -> Box<dyn GrpcOperationLedger + '_> {
        Box::new(self.0.ledger())
    }

    async fn business_write(&self, key: &str) -> Result<(), LedgerError> {
        self.0
            .execute("INSERT INTO business (business_key) VALUES ($1)", key)
            .await
    }

    async fn commit(self) -> Result<(), LedgerError> {
        self.0.commit().await
    }

    async fn rollback(self) -> Result<(), LedgerError> {
        self.0.rollback().await
    }
}

ledger_contract_tests!(SqlxFixture::new());
