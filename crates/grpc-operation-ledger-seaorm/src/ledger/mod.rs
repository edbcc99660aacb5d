//! `SeaOrmOperationLedger`: the port on a caller's SeaORM connection or transaction.

use std::num::NonZeroU32;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use grpc_core_api::{
    ClaimOutcome, Completion, GrpcOperationIdentity, GrpcOperationLedger, LeaseDuration,
    LedgerCensus, LedgerDurability, LedgerError, OperationRecord, OperationState, OutcomeReference,
    RecordOutcome, RecordedFailure, RequestFingerprint, Version, record_by_claim,
    unmatched_transition,
};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, QueryResult, Statement,
    TransactionOptions, Value,
};

use crate::error::{Phase, is_duplicate_key, map_db_err};
use crate::mutants::ignores;
use crate::sql::{Sql, Stmt};

mod port;
mod rows;

use self::rows::*;

/// How long a claim waits behind another unit of work's uncommitted claim of the same identity
/// when the connection sets no bound of its own; reported as the `InFlight` retry delay.
const DEFAULT_CLAIM_WAIT: Duration = Duration::from_secs(2);

/// How many times a claim goes round insert, read and takeover before it answers `InFlight`: a
/// round is repeated when `purge` deleted the row between the insert and the read, or another
/// taker won the row between the read and the takeover.
const CLAIM_ROUNDS: usize = 3;

/// What the claim's insert did.
enum Inserted {
    /// It inserted the claim at this version.
    Fresh(Version),
    /// It inserted nothing: the existing row and the store's clock when the same statement read
    /// them, else `None`.
    Nothing(Option<Box<(OperationRecord, i64)>>),
}

/// The operation ledger on a SeaORM connection `C`: `&DatabaseTransaction` to run inside the
/// caller's unit of work, or `DatabaseConnection` / `&DatabaseConnection` for statements that
/// commit on their own (the claim-first mode).
///
/// It opens no transaction of the caller's own statements. A claim waits for a lock (another
/// unit's uncommitted claim of the same identity, a lock on the whole table) at most the claim
/// wait ([`with_claim_wait`](Self::with_claim_wait), 2 s by default), which is also the retry
/// delay its `InFlight` answer carries:
///
/// - On PostgreSQL, a unit of work begun by [`SeaOrmUnitsOfWork`](crate::SeaOrmUnitsOfWork) sets
///   `lock_timeout` to it right after `BEGIN` (and its ledger, `SeaOrmUnitsOfWork::ledger`, sends
///   nothing more); on a pool (`DatabaseConnection`), where each write would otherwise be a
///   transaction of its own that no setting reaches before its table lock, each write (claim,
///   record, transition, purge) runs in a short transaction of its own that sets it first; on
///   any other connection (a transaction the caller began itself, a wrapper) the ledger sets it
///   (`set_config(.., true)`, for the rest of the transaction) before each write: one more round
///   trip, which a unit from `SeaOrmUnitsOfWork` avoids. The bound travels with the transaction,
///   so it holds behind a session pooler; behind a transaction pooler use units of work only
///   (see [`Pooler::TransactionPooling`](crate::Pooler::TransactionPooling)).
/// - On MariaDB, every claim is prefixed with `SET STATEMENT max_statement_time`, which also
///   ends a wait for a metadata lock.
/// - On SQLite, the wait is the connection's busy timeout, set by
///   [`open_sqlite`](crate::open_sqlite) from the same [`LedgerConfig`](crate::LedgerConfig).
#[derive(Debug, Clone)]
pub struct SeaOrmOperationLedger<C> {
    connection: C,
    claim_wait: Duration,
    /// The transaction's `lock_timeout` was set when it began (PostgreSQL).
    lock_wait_bounded: bool,
}

/// What a [`SeaOrmOperationLedger`] can run on: a borrowed connection or transaction
/// (`&DatabaseTransaction`, `&DatabaseConnection`), or an owned one (`DatabaseConnection`, an
/// `Arc` of either) for a ledger that must be `'static`, as behind an `Arc<dyn GrpcOperationLedger>`.
pub trait LedgerConnection: Send + Sync {
    /// The SeaORM connection type.
    type Connection: ConnectionTrait + Send + Sync + 'static;
    /// The connection statements are sent on.
    fn connection(&self) -> &Self::Connection;
}

impl<T: ConnectionTrait + Send + Sync + 'static> LedgerConnection for &T {
    type Connection = T;
    fn connection(&self) -> &T {
        self
    }
}

impl<T: ConnectionTrait + Send + Sync + 'static> LedgerConnection for std::sync::Arc<T> {
    type Connection = T;
    fn connection(&self) -> &T {
        self
    }
}

impl LedgerConnection for sea_orm::DatabaseConnection {
    type Connection = Self;
    fn connection(&self) -> &Self {
        self
    }
}

impl<C> SeaOrmOperationLedger<C>
where
    C: LedgerConnection,
{
    /// The ledger on `connection`.
    pub fn new(connection: C) -> Self {
        Self {
            connection,
            claim_wait: DEFAULT_CLAIM_WAIT,
            lock_wait_bounded: false,
        }
    }

    /// Sets the claim wait the connection was configured with (see the type's docs).
    pub fn with_claim_wait(mut self, claim_wait: Duration) -> Self {
        self.claim_wait = claim_wait;
        self
    }

    /// Says that the transaction's lock waits were bounded by the claim wait when it began.
    pub(crate) fn lock_wait_bounded_by_unit(mut self) -> Self {
        self.lock_wait_bounded = true;
        self
    }

    /// The pool, when the ledger runs on a PostgreSQL pool rather than in a transaction: its
    /// writes then need a transaction of their own to carry the lock wait's bound.
    fn postgres_pool(&self) -> Option<&DatabaseConnection> {
        if self.backend() != DbBackend::Postgres {
            return None;
        }
        (self.connection() as &dyn std::any::Any).downcast_ref::<DatabaseConnection>()
    }

    /// Runs `write` on a ledger in a transaction of its own on `pool`, begun with the claim wait
    /// as its lock timeout, and commits it; rolls it back when `write` fails.
    async fn bounded_write<T>(
        &self,
        pool: &DatabaseConnection,
        write: impl AsyncFnOnce(&SeaOrmOperationLedger<&DatabaseTransaction>) -> Result<T, LedgerError>,
    ) -> Result<T, LedgerError> {
        let txn =
            crate::units::begin_unit(pool, TransactionOptions::default(), Some(self.claim_wait))
                .await
                .map_err(|e| map_db_err(e, Phase::Other))?;
        let ledger = SeaOrmOperationLedger::new(&txn)
            .with_claim_wait(self.claim_wait)
            .lock_wait_bounded_by_unit();
        match write(&ledger).await {
            Ok(value) => {
                txn.commit()
                    .await
                    .map_err(|e| map_db_err(e, Phase::Commit))?;
                Ok(value)
            }
            Err(error) => {
                let _ = txn.rollback().await;
                Err(error)
            }
        }
    }

    /// On a connection whose transaction was not begun by
    /// [`SeaOrmUnitsOfWork`](crate::SeaOrmUnitsOfWork), bounds its lock
    /// waits before a write can wait for a table lock (see the type's docs); harmless on a
    /// connection outside any transaction, where it lasts for its own statement only.
    async fn bound_lock_wait(&self) -> Result<(), LedgerError> {
        if self.lock_wait_bounded || self.backend() != DbBackend::Postgres {
            return Ok(());
        }
        let statement = Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT set_config('lock_timeout', $1, true)",
            [format!("{}ms", self.claim_wait.as_millis().max(1)).into()],
        );
        self.connection()
            .execute_raw(statement)
            .await
            .map(|_| ())
            .map_err(|e| map_db_err(e, Phase::Other))
    }

    /// The connection the ledger runs on.
    pub fn connection(&self) -> &C::Connection {
        self.connection.connection()
    }

    fn sql(&self) -> Result<&'static Sql, LedgerError> {
        Sql::for_backend(self.backend()).ok_or_else(|| {
            LedgerError::internal(
                "the operation ledger supports PostgreSQL, SQLite and MariaDB/MySQL",
            )
        })
    }

    fn backend(&self) -> DbBackend {
        self.connection().get_database_backend()
    }

    /// `stmt` with `values` given in its template's parameter order.
    fn statement(&self, stmt: &Stmt, values: Vec<Value>) -> Statement {
        Statement::from_sql_and_values(self.backend(), &stmt.text, stmt.values(values))
    }

    async fn execute(
        &self,
        sql: &Stmt,
        values: Vec<Value>,
        phase: Phase,
    ) -> Result<u64, LedgerError> {
        self.connection()
            .execute_raw(self.statement(sql, values))
            .await
            .map(|result| result.rows_affected())
            .map_err(|e| map_db_err(e, phase))
    }

    /// The stored row of `identity`, if it exists: the row alone, for a reader that does not
    /// judge its lease (`find`, a transition finding out why it changed nothing).
    async fn read(
        &self,
        identity: &GrpcOperationIdentity,
        phase: Phase,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        let row = self
            .connection()
            .query_one_raw(self.statement(&self.sql()?.select_record, identity_values(identity)))
            .await
            .map_err(|e| map_db_err(e, phase))?;
        row.map(|row| decode_record(identity, &row)).transpose()
    }

    /// The stored row of `identity` and the store's clock (ms since the epoch), read in one
    /// statement, if the row exists: for a reader that judges the lease by the store's clock.
    async fn read_with_clock(
        &self,
        identity: &GrpcOperationIdentity,
        phase: Phase,
    ) -> Result<Option<(OperationRecord, i64)>, LedgerError> {
        let sql = &self.sql()?.select_record_with_clock;
        let row = self
            .connection()
            .query_one_raw(self.statement(sql, identity_values(identity)))
            .await
            .map_err(|e| map_db_err(e, phase))?;
        row.map(|row| decode_record_with_clock(identity, &row))
            .transpose()
    }

    /// The claim's insert: `Fresh` with the new version when it inserted, else the existing row
    /// when the statement could read it in the same round trip (PostgreSQL), or `None` when the
    /// caller must read it.
    async fn insert_claim(
        &self,
        sql: &Sql,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
        phase: Phase,
    ) -> Result<Inserted, LedgerError> {
        let mut values = inserted_identity_values(identity, request);
        values.push(lease.as_millis().into());
        values.push(i32::from(Version::random_salt()).into());
        if self.backend() == DbBackend::Postgres {
            values.push(format!("{}ms", self.claim_wait.as_millis().max(1)).into());
        }
        let statement = self.statement(sql.claim_as_sent(), values);
        let Some(row) = self.insert_only(statement, phase).await? else {
            return Ok(Inserted::Nothing(None));
        };
        // The one-statement form says which branch the row came from; the plain insert returns
        // a row only when it inserted.
        let inserted = sql.claim_or_read.is_none()
            || ignores("claim's inserted flag")
            || row
                .try_get::<bool>("", "inserted")
                .map_err(|_| LedgerError::internal("a claim returned a row of unknown origin"))?;
        if !inserted {
            return Ok(Inserted::Nothing(Some(Box::new(decode_record_with_clock(
                identity, &row,
            )?))));
        }
        let version = row
            .try_get::<i64>("", "version")
            .ok()
            .and_then(|stored| Version::from_stored(stored).ok())
            .ok_or_else(|| LedgerError::internal("a fresh claim returned no version"))?;
        Ok(Inserted::Fresh(version))
    }

    /// Runs an insert that can only insert, bounded by the claim wait; its returned row, or
    /// `None` when the identity exists (MariaDB refuses the duplicate with 1062; the others'
    /// `ON CONFLICT DO NOTHING` returns nothing).
    async fn insert_only(
        &self,
        mut statement: Statement,
        phase: Phase,
    ) -> Result<Option<QueryResult>, LedgerError> {
        // On MariaDB the wait's bound prefixes the statement (a number from the configuration,
        // never request data); max_statement_time takes fractions of a second.
        if self.backend() == DbBackend::MySql {
            statement.sql = format!(
                "SET STATEMENT max_statement_time={:.3} FOR {}",
                self.claim_wait.as_secs_f64().max(0.001),
                statement.sql
            );
        }
        match self.connection().query_one_raw(statement).await {
            Ok(row) => Ok(row),
            Err(error) if is_duplicate_key(&error) => Ok(None),
            Err(error) => Err(map_db_err(error, phase)),
        }
    }

    async fn transition(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<Version, LedgerError> {
        match self.postgres_pool() {
            Some(pool) => {
                self.bounded_write(pool, async |ledger| {
                    ledger.transition_here(identity, version, completion).await
                })
                .await
            }
            None => self.transition_here(identity, version, completion).await,
        }
    }

    /// The transition on this ledger's connection.
    async fn transition_here(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<Version, LedgerError> {
        self.bound_lock_wait().await?;
        let sql = self.sql()?;
        let mut values = identity_values(identity);
        values.push(version.to_stored().into());
        let statement = match completion {
            Completion::Committed(outcome) => {
                values.push(outcome.as_str().into());
                &sql.mark_committed
            }
            Completion::Failed(failure) => {
                values.push((failure.code() as i32).into());
                values.push(failure.message().into());
                values.push(failure.details().to_vec().into());
                &sql.mark_failed
            }
        };
        self.update_owned(identity, version, statement, values)
            .await?;
        Ok(version.next())
    }

    /// The lease renewal on this ledger's connection.
    async fn renew_here(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        lease: LeaseDuration,
    ) -> Result<(), LedgerError> {
        self.bound_lock_wait().await?;
        let mut values = identity_values(identity);
        values.push(version.to_stored().into());
        values.push(lease.as_millis().into());
        self.update_owned(identity, version, &self.sql()?.renew_lease, values)
            .await
    }

    /// One conditional UPDATE of the row its owner holds at `version`; when it changed nothing it
    /// is never success: the row as it is now says why.
    async fn update_owned(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        statement: &Stmt,
        values: Vec<Value>,
    ) -> Result<(), LedgerError> {
        let changed = self.execute(statement, values, Phase::Other).await?;
        if changed == 1 || ignores("transition changed one row") {
            return Ok(());
        }
        let current = self.read(identity, Phase::Other).await?;
        Err(unmatched_transition(current.as_ref(), version))
    }
}
