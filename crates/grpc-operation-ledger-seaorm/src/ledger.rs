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

#[async_trait]
impl<C> GrpcOperationLedger for SeaOrmOperationLedger<C>
where
    C: LedgerConnection,
{
    async fn claim(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError> {
        if let Some(pool) = self.postgres_pool() {
            return self
                .bounded_write(pool, async |ledger| {
                    ledger.claim(identity, request, lease).await
                })
                .await;
        }
        self.bound_lock_wait().await?;
        let sql = self.sql()?;
        let phase = Phase::Claim {
            wait: self.claim_wait,
        };
        for _ in 0..CLAIM_ROUNDS {
            let found = match self
                .insert_claim(sql, identity, request, lease, phase)
                .await?
            {
                Inserted::Fresh(version) => {
                    return Ok(ClaimOutcome::Claimed {
                        version,
                        took_over: false,
                    });
                }
                Inserted::Nothing(Some(found)) => Some(*found),
                Inserted::Nothing(None) => self.read_with_clock(identity, phase).await?,
            };
            let Some((record, db_now)) = found else {
                continue; // purged between our insert and our read: insert again
            };
            if record.request_fingerprint != *request {
                return Err(LedgerError::KeyReusedWithDifferentRequest);
            }
            if record.state().is_terminal() {
                return Ok(ClaimOutcome::Completed(record));
            }
            let lease_left = millis_between(db_now, to_millis(record.lease_expires_at));
            if lease_left > 0 {
                return Ok(ClaimOutcome::InProgress {
                    retry_after: Duration::from_millis(lease_left as u64),
                    record,
                });
            }
            let mut values = identity_values(identity);
            values.push(record.version.to_stored().into());
            values.push(lease.as_millis().into());
            let changed = self.execute(&sql.take_over, values, phase).await?;
            if changed == 1 || ignores("takeover changed one row") {
                return Ok(ClaimOutcome::Claimed {
                    version: record.version.next(),
                    took_over: true,
                });
            }
            // Someone else took it over or finished it first: answer from the row as it is now.
        }
        // Other takers keep winning the row between our read and our update (leases shorter
        // than a round trip): the operation is in flight elsewhere. Come back after a lease.
        Err(LedgerError::InFlight {
            retry_after: lease.get(),
        })
    }

    /// One insert of the finished row; when the identity exists, the claim's way
    /// ([`record_by_claim`]), which reads it, takes an expired claim over, or refuses.
    async fn record_finished(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
        completion: &Completion,
    ) -> Result<RecordOutcome, LedgerError> {
        if let Some(pool) = self.postgres_pool() {
            return self
                .bounded_write(pool, async |ledger| {
                    ledger
                        .record_finished(identity, request, lease, completion)
                        .await
                })
                .await;
        }
        self.bound_lock_wait().await?;
        let sql = self.sql()?;
        let mut values = inserted_identity_values(identity, request);
        let (state, outcome, failure) = match completion {
            Completion::Committed(outcome) => ("COMMITTED", Some(outcome.as_str()), None),
            Completion::Failed(failure) => ("FAILED_TERMINAL", None, Some(failure)),
        };
        values.push(state.into());
        values.push(i32::from(Version::random_salt()).into());
        values.push(format!("{}ms", self.claim_wait.as_millis().max(1)).into());
        values.push(outcome.map(str::to_owned).into());
        values.push(failure.map(|f| f.code() as i32).into());
        values.push(failure.map(|f| f.message().to_owned()).into());
        values.push(failure.map(|f| f.details().to_vec()).into());
        let phase = Phase::Claim {
            wait: self.claim_wait,
        };
        let statement = self.statement(&sql.record_insert, values);
        match self.insert_only(statement, phase).await? {
            Some(row) => row
                .try_get::<i64>("", "version")
                .ok()
                .and_then(|stored| Version::from_stored(stored).ok())
                .map(RecordOutcome::Recorded)
                .ok_or_else(|| LedgerError::internal("a fresh record returned no version")),
            None => record_by_claim(self, identity, request, lease, completion).await,
        }
    }

    async fn mark_finished(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<Version, LedgerError> {
        self.transition(identity, version, completion).await
    }

    async fn mark_committed(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        outcome: &OutcomeReference,
    ) -> Result<Version, LedgerError> {
        self.transition(identity, version, &Completion::Committed(outcome.clone()))
            .await
    }

    async fn mark_failed(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        failure: &RecordedFailure,
    ) -> Result<Version, LedgerError> {
        self.transition(identity, version, &Completion::Failed(failure.clone()))
            .await
    }

    async fn renew_lease(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        lease: LeaseDuration,
    ) -> Result<(), LedgerError> {
        match self.postgres_pool() {
            Some(pool) => {
                self.bounded_write(pool, async |ledger| {
                    ledger.renew_here(identity, version, lease).await
                })
                .await
            }
            None => self.renew_here(identity, version, lease).await,
        }
    }

    async fn find(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        self.read(identity, Phase::Other).await
    }

    /// The record with its lease judged by the store's clock, read in the same statement.
    async fn look_up(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<(OperationRecord, Duration)>, LedgerError> {
        Ok(self
            .read_with_clock(identity, Phase::Other)
            .await?
            .map(|(record, db_now)| {
                let left = match record.finished {
                    Some(_) => 0,
                    None => millis_between(db_now, to_millis(record.lease_expires_at)).max(0),
                };
                (record, Duration::from_millis(left as u64))
            }))
    }

    async fn census(&self, retention: Duration) -> Result<LedgerCensus, LedgerError> {
        Ok(crate::admin::count_operations(self.connection(), retention)
            .await?
            .census)
    }

    async fn purge(&self, retention: Duration, limit: NonZeroU32) -> Result<u64, LedgerError> {
        if let Some(pool) = self.postgres_pool() {
            return self
                .bounded_write(pool, async |ledger| ledger.purge(retention, limit).await)
                .await;
        }
        self.bound_lock_wait().await?;
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let values = vec![retention_ms.into(), i64::from(limit.get()).into()];
        self.execute(&self.sql()?.purge, values, Phase::Other).await
    }

    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Durable
    }
}

/// The values of `identity_condition!`: the row's key, the identity's digest.
fn identity_values(identity: &GrpcOperationIdentity) -> Vec<Value> {
    vec![identity.storage_digest().to_vec().into()]
}

/// The values of `identity_columns!`: the digest, the three parts and the request fingerprint.
fn inserted_identity_values(
    identity: &GrpcOperationIdentity,
    request: &RequestFingerprint,
) -> Vec<Value> {
    vec![
        identity.storage_digest().to_vec().into(),
        identity.caller().as_str().into(),
        identity.method().as_str().into(),
        identity.key_hash().as_bytes().to_vec().into(),
        request.as_bytes().to_vec().into(),
    ]
}

fn millis_between(from: i64, to: i64) -> i64 {
    to.saturating_sub(from)
}

fn to_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

fn from_millis(millis: i64) -> SystemTime {
    let magnitude = Duration::from_millis(millis.unsigned_abs());
    if millis >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// Reads a row into a record, refusing a row that breaks the record's invariants (which the
/// CHECK constraints should have prevented) as `Internal`.
fn decode_record(
    identity: &GrpcOperationIdentity,
    row: &QueryResult,
) -> Result<OperationRecord, LedgerError> {
    let corrupt = |what: &str| LedgerError::internal(format!("stored ledger row has a bad {what}"));
    let text = |column: &str| {
        row.try_get::<String>("", column)
            .map_err(|_| corrupt(column))
    };
    let optional_text = |column: &str| {
        row.try_get::<Option<String>>("", column)
            .map_err(|_| corrupt(column))
    };
    let number = |column: &str| row.try_get::<i64>("", column).map_err(|_| corrupt(column));
    let optional_number = |column: &str| {
        row.try_get::<Option<i64>>("", column)
            .map_err(|_| corrupt(column))
    };

    let request_fingerprint = row
        .try_get::<Vec<u8>>("", "request_fingerprint")
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .map(RequestFingerprint::from_bytes)
        .ok_or(corrupt("request_fingerprint"))?;
    let state: OperationState = text("state")?.parse().map_err(|_| corrupt("state"))?;
    let version = Version::from_stored(number("version")?).map_err(|_| corrupt("version"))?;
    let completed_at = optional_number("completed_at")?.map(from_millis);
    let finished = match state {
        OperationState::InProgress => None,
        OperationState::Committed => {
            let reference =
                optional_text("outcome_reference")?.ok_or(corrupt("outcome_reference"))?;
            let reference =
                OutcomeReference::parse(&reference).map_err(|_| corrupt("outcome_reference"))?;
            Some((
                completed_at.ok_or(corrupt("completed_at"))?,
                Completion::Committed(reference),
            ))
        }
        OperationState::FailedTerminal => {
            let code = row
                .try_get::<Option<i32>>("", "failure_code")
                .map_err(|_| corrupt("failure_code"))?
                .ok_or(corrupt("failure_code"))?;
            let message = optional_text("failure_message")?.ok_or(corrupt("failure_message"))?;
            let details = row
                .try_get::<Option<Vec<u8>>>("", "failure_details")
                .map_err(|_| corrupt("failure_details"))?
                .unwrap_or_default();
            let failure = RecordedFailure::from_stored(code, &message)
                .and_then(|failure| failure.with_details(&details))
                .map_err(|_| corrupt("failure"))?;
            Some((
                completed_at.ok_or(corrupt("completed_at"))?,
                Completion::Failed(failure),
            ))
        }
    };
    Ok(OperationRecord {
        identity: identity.clone(),
        request_fingerprint,
        version,
        claimed_at: from_millis(number("claimed_at")?),
        lease_expires_at: from_millis(number("lease_expires_at")?),
        finished,
    })
}

/// [`decode_record`] of a row read with the store's clock (its `db_now` column), and that clock.
fn decode_record_with_clock(
    identity: &GrpcOperationIdentity,
    row: &QueryResult,
) -> Result<(OperationRecord, i64), LedgerError> {
    let db_now = row
        .try_get::<i64>("", "db_now")
        .map_err(|_| LedgerError::internal("a ledger read returned no clock"))?;
    Ok((decode_record(identity, row)?, db_now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_trip_on_both_sides_of_the_epoch() {
        for millis in [0, 1, 1_764_700_000_123, -1, -86_400_000] {
            assert_eq!(to_millis(from_millis(millis)), millis);
        }
    }
}
