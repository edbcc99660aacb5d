//! Units of work on a SeaORM connection pool, for a server-side guard.

use std::time::Duration;

use async_trait::async_trait;
use grpc_core_api::{GrpcOperationLedger, LedgerDurability, LedgerError, LedgerUnitsOfWork};
use sea_orm::{
    DatabaseConnection, DatabaseTransaction, DbBackend, IsolationLevel, SqliteTransactionMode,
    TransactionOptions, TransactionTrait,
};

use crate::error::{Phase, map_db_err};
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
        self.db
            .begin_with_options(options)
            .await
            .map_err(|e| map_db_err(e, Phase::Other))
    }

    fn ledger<'t>(
        &self,
        transaction: &'t DatabaseTransaction,
    ) -> Box<dyn GrpcOperationLedger + 't> {
        Box::new(SeaOrmOperationLedger::new(transaction).with_claim_wait(self.claim_wait))
    }

    async fn commit(&self, transaction: DatabaseTransaction) -> Result<(), LedgerError> {
        transaction
            .commit()
            .await
            .map_err(|e| map_db_err(e, Phase::Other))
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
