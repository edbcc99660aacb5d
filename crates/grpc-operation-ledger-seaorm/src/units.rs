//! Units of work on a SeaORM connection pool, for a server-side guard.

use std::time::Duration;

use async_trait::async_trait;
use grpc_core_api::{GrpcOperationLedger, LedgerDurability, LedgerError, LedgerUnitsOfWork};
use sea_orm::{
    AccessMode, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr,
    IsolationLevel, SqliteTransactionMode, TransactionOptions, TransactionTrait,
};

use crate::error::{Phase, found_dead_connection, map_db_err};
use crate::{LedgerConfig, SeaOrmOperationLedger};

/// Begins SeaORM transactions on a pool and binds the ledger to each, so that a guard runs the
/// claim, the handler's business writes (on the same `DatabaseTransaction`) and the transition
/// in one unit of work.
#[derive(Debug, Clone)]
pub struct SeaOrmUnitsOfWork {
    db: DatabaseConnection,
    claim_wait: Duration,
}

impl SeaOrmUnitsOfWork {
    /// Units of work on `db`, whose connections were opened with `config`
    /// ([`open_sqlite`](crate::open_sqlite) or [`connect_postgres`](crate::connect_postgres)).
    pub fn new(db: DatabaseConnection, config: &LedgerConfig) -> Self {
        Self {
            db,
            claim_wait: config.claim_wait,
        }
    }

    /// The pool.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }

    /// A transaction for reading (a resolve RPC's look-up, an operator's listing, statistics),
    /// prepared for the pooler as a unit of work is and with its lock waits bounded by the claim
    /// wait: `READ ONLY` on PostgreSQL and MariaDB/MySQL, and deferred on SQLite, where a read
    /// takes no write lock, so it never stalls the server's claims. Roll it back when done.
    pub async fn begin_read(&self) -> Result<DatabaseTransaction, LedgerError> {
        // SQLite has no read-only transactions (a deferred one that only reads is one).
        let access_mode =
            (self.db.get_database_backend() != DbBackend::Sqlite).then_some(AccessMode::ReadOnly);
        let options = TransactionOptions {
            access_mode,
            ..TransactionOptions::default()
        };
        begin_unit(&self.db, options, Some(self.claim_wait))
            .await
            .map_err(|e| map_db_err(e, Phase::Other))
    }
}

#[async_trait]
impl LedgerUnitsOfWork for SeaOrmUnitsOfWork {
    type Transaction = DatabaseTransaction;

    /// Begins the unit as a writer on SQLite (`BEGIN IMMEDIATE`): a deferred transaction that
    /// read first could not be upgraded to a writer later and would be refused at its first
    /// write, and waiting for the single write lock here, before the claim, keeps a busy store
    /// from looking like a duplicate in flight. PostgreSQL ignores the mode.
    ///
    /// On MariaDB/MySQL the unit runs at READ COMMITTED (PostgreSQL's default): a claim that finds
    /// the identity's row (a duplicate refused) must read that row as committed now, which a
    /// REPEATABLE READ snapshot taken earlier in the unit would not show, and a locking read
    /// instead would deadlock racing takeovers.
    async fn begin(&self) -> Result<DatabaseTransaction, LedgerError> {
        let options = TransactionOptions {
            sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
            isolation_level: (self.db.get_database_backend() == DbBackend::MySql)
                .then_some(IsolationLevel::ReadCommitted),
            ..TransactionOptions::default()
        };
        begin_unit(&self.db, options, Some(self.claim_wait))
            .await
            .map_err(|e| map_db_err(e, Phase::Other))
    }

    async fn begin_read(&self) -> Result<DatabaseTransaction, LedgerError> {
        SeaOrmUnitsOfWork::begin_read(self).await
    }

    fn ledger<'t>(
        &self,
        transaction: &'t DatabaseTransaction,
    ) -> Box<dyn GrpcOperationLedger + 't> {
        Box::new(
            SeaOrmOperationLedger::new(transaction)
                .with_claim_wait(self.claim_wait)
                .lock_wait_bounded_by_unit(),
        )
    }

    async fn commit(&self, transaction: DatabaseTransaction) -> Result<(), LedgerError> {
        transaction
            .commit()
            .await
            .map_err(|e| map_db_err(e, Phase::Commit))
    }

    async fn rollback(&self, transaction: DatabaseTransaction) -> Result<(), LedgerError> {
        transaction
            .rollback()
            .await
            .map_err(|e| map_db_err(e, Phase::Other))
    }

    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Durable
    }
}

/// Begins a transaction on `db` that statements may be prepared in whatever stands in front of
/// PostgreSQL. On a pool that caches no statement (opened for [`Pooler::TransactionPooling`]
/// or an unresolved [`Pooler::Unknown`]), whose server connection other clients may have used
/// before, it first drops the statements they left there, so that a name this client's driver
/// gives a statement cannot meet one of theirs; nothing of this client's is lost, since it
/// keeps none. The pool itself says which it is, never a setting passed beside it: dropping the
/// statements of a pool that caches them would fail its next call.
///
/// [`Pooler::TransactionPooling`]: crate::Pooler::TransactionPooling
/// [`Pooler::Unknown`]: crate::Pooler::Unknown
///
/// On PostgreSQL, `lock_wait` bounds every lock wait of the transaction (`SET LOCAL
/// lock_timeout`), sent right after `BEGIN`: a statement takes its lock on the table while it is
/// parsed, before anything in it runs, so a bound set inside the claim statement itself cannot
/// cut a wait for a lock on the whole table (DDL, `LOCK TABLE`, `VACUUM FULL`).
///
/// A pooled connection is handed out without a ping while it is busy (see `connect_postgres`),
/// so one cut behind the pool's back (a server restart, a killed session, a pooler restart) is
/// found by the unit's `BEGIN`. That `BEGIN` took no effect anywhere, so it is sent again on
/// another connection: at most once for each connection the pool can hold, since the pool drops
/// each dead one as its `BEGIN` fails. A connection that cannot be opened at all ends the unit at
/// once, as UNAVAILABLE.
pub(crate) async fn begin_unit(
    db: &DatabaseConnection,
    mut options: TransactionOptions,
    lock_wait: Option<Duration>,
) -> Result<DatabaseTransaction, DbErr> {
    // On PostgreSQL the access mode goes with the unit's set-up message below, in the simple
    // query protocol: the driver would send its own `SET TRANSACTION` as a prepared statement,
    // which a transaction pooler cannot carry.
    let read_only = db.get_database_backend() == DbBackend::Postgres
        && options.access_mode.take() == Some(AccessMode::ReadOnly);
    // Begun in a task of its own, so that a caller dropped mid-way (a cancelled request) cannot
    // leave the server in a transaction the driver does not know it began: the next user of
    // that pooled connection would run inside it (PostgreSQL) or fail to set its isolation level
    // (MariaDB's error 1568). A begun transaction whose caller is gone is rolled back on drop.
    let drops_others_statements = !crate::pooler::caches_statements(db);
    let dead_connections_to_pass_over = pooled_connections(db);
    let db = db.clone();
    let transaction = tokio::spawn(async move {
        let mut passed_over = 0;
        loop {
            match db.begin_with_options(options).await {
                Err(error)
                    if found_dead_connection(&error)
                        && passed_over < dead_connections_to_pass_over =>
                {
                    passed_over += 1;
                }
                begun => return begun,
            }
        }
    })
    .await
    .map_err(|error| DbErr::Custom(format!("beginning a unit of work: {error}")))??;
    if transaction.get_database_backend() != DbBackend::Postgres {
        return Ok(transaction);
    }
    let mut setup = Vec::new();
    if read_only {
        // First: `SET TRANSACTION` must come before the transaction's first query.
        setup.push("SET TRANSACTION READ ONLY".to_owned());
    }
    if drops_others_statements {
        setup.push("DEALLOCATE ALL".to_owned());
    }
    if let Some(wait) = lock_wait {
        // A number of milliseconds from the configuration, never request data.
        setup.push(lock_timeout_statement(wait));
    }
    if !setup.is_empty() {
        // The simple query protocol: one message, answered inside the transaction.
        if let Err(error) = transaction.execute_unprepared(&setup.join("; ")).await {
            let _ = transaction.rollback().await;
            return Err(error);
        }
    }
    Ok(transaction)
}

/// How many connections `db`'s pool can hold (none for SQLite, whose connections nothing cuts).
fn pooled_connections(db: &DatabaseConnection) -> u32 {
    match db.get_database_backend() {
        #[cfg(feature = "postgres")]
        DbBackend::Postgres => db
            .get_postgres_connection_pool()
            .options()
            .get_max_connections(),
        #[cfg(feature = "mysql")]
        DbBackend::MySql => db
            .get_mysql_connection_pool()
            .options()
            .get_max_connections(),
        _ => 0,
    }
}

/// The statement a unit of work sends right after `BEGIN` on PostgreSQL: `SET LOCAL
/// lock_timeout` to `wait` (at least 1 ms: 0 would mean no bound). Public so that a benchmark or
/// a reader of the statement log can send or recognise the same text.
pub fn lock_timeout_statement(wait: Duration) -> String {
    format!("SET LOCAL lock_timeout = '{}ms'", wait.as_millis().max(1))
}
