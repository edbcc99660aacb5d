//! An operation ledger adapter on PostgreSQL through sqlx, without SeaORM: the example that
//! `docs/adapters.md` walks through, written from that guide and the public API of
//! `grpc-core-api` alone, and run through the whole contract suite by `cargo xtask test`
//! (`tests/contract.rs`, whose fixture is the guide's minimal fixture in full).
//!
//! - [`migrate`] creates the table (one row per operation, CHECK constraints for the row rules).
//! - [`SqlxUnits`] begins units of work, each a sqlx transaction whose lock waits are bounded by
//!   the claim wait from its first statement; [`SqlxLedger`] runs the port inside one, or on the
//!   pool, where each call commits on its own.
//!
//! Each rule it keeps is named by the contract case that checks it (see the guide).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use grpc_core_api::store_errors::{During, from_sqlstate};
use grpc_core_api::{
    ClaimOutcome, Completion, GrpcOperationIdentity, GrpcOperationLedger, LeaseDuration,
    LedgerCensus, LedgerDurability, LedgerError, OperationRecord, OperationState, OutcomeReference,
    RecordedFailure, RequestFingerprint, UnavailableKind, Version, unmatched_transition,
};
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{PgConnection, Postgres, Row, Transaction};
use tokio::sync::Mutex;

mod statements;

use statements::{
    CENSUS, CLAIM, MARK_COMMITTED, MARK_FAILED, PURGE, RENEW_LEASE, SELECT, TAKE_OVER, ignores, sql,
};
pub use statements::{CHECKS, SENT};

/// The ledger table: the identity's three parts as the primary key (uniqueness enforced by the
/// database), states stored by name, and the row rules as CHECK constraints.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS sqlx_ledger (
    caller TEXT NOT NULL,
    method TEXT NOT NULL,
    key_hash TEXT NOT NULL,
    request_fingerprint TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('IN_PROGRESS', 'COMMITTED', 'FAILED_TERMINAL')),
    version BIGINT NOT NULL,
    claimed_at BIGINT NOT NULL,
    lease_expires_at BIGINT NOT NULL,
    completed_at BIGINT,
    outcome_reference TEXT
        CHECK (outcome_reference IS NULL OR octet_length(outcome_reference) BETWEEN 1 AND 1024),
    failure_code INTEGER CHECK (failure_code IS NULL OR failure_code BETWEEN 1 AND 16),
    failure_message TEXT CHECK (failure_message IS NULL OR octet_length(failure_message) <= 1024),
    failure_details BYTEA,
    PRIMARY KEY (caller, method, key_hash),
    CHECK (state <> 'COMMITTED' OR (outcome_reference IS NOT NULL AND completed_at IS NOT NULL)),
    CHECK (state <> 'FAILED_TERMINAL'
        OR (failure_code IS NOT NULL AND failure_message IS NOT NULL AND completed_at IS NOT NULL))
)";

/// How many rounds of insert, read and takeover a claim makes before it answers `InFlight`.
const CLAIM_ROUNDS: usize = 3;

/// Creates the ledger table if it is missing. Processes starting together take turns on a
/// transaction-scoped advisory lock, since `CREATE TABLE IF NOT EXISTS` alone can still fail on a
/// concurrent creation (case `concurrent_starts_migrate_once`).
pub async fn migrate(pool: &PgPool) -> Result<(), LedgerError> {
    let mut txn = pool.begin().await.map_err(store_error(During::Other))?;
    sqlx::query("SELECT pg_advisory_xact_lock(727274)")
        .execute(&mut *txn)
        .await
        .map_err(store_error(During::Other))?;
    sqlx::query(SCHEMA)
        .execute(&mut *txn)
        .await
        .map_err(store_error(During::Other))?;
    txn.commit().await.map_err(store_error(During::Commit))
}

/// Begins units of work on a pool.
#[derive(Debug, Clone)]
pub struct SqlxUnits {
    pool: PgPool,
    claim_wait: Duration,
}

impl SqlxUnits {
    /// Units on `pool` whose claims wait at most `claim_wait` for any lock.
    pub fn new(pool: PgPool, claim_wait: Duration) -> Self {
        Self { pool, claim_wait }
    }

    /// Begins a unit: a transaction whose lock waits are bounded by the claim wait from its first
    /// statement on, so that even a claim behind a lock on the whole table (which PostgreSQL takes
    /// while parsing the statement) gives up in time (case `claims_are_bounded_behind_a_table_lock`).
    pub async fn begin(&self) -> Result<SqlxUnit, LedgerError> {
        let txn = begin_bounded(&self.pool, self.claim_wait).await?;
        Ok(SqlxUnit {
            txn: Arc::new(Mutex::new(Some(txn))),
            claim_wait: self.claim_wait,
        })
    }

    /// The ledger on the pool: each call commits before it returns (the claim-first mode).
    pub fn autocommit(&self) -> SqlxLedger {
        SqlxLedger {
            on: On::Pool(self.pool.clone()),
            claim_wait: self.claim_wait,
        }
    }
}

async fn begin_bounded(
    pool: &PgPool,
    claim_wait: Duration,
) -> Result<Transaction<'static, Postgres>, LedgerError> {
    let mut txn = pool.begin().await.map_err(store_error(During::Other))?;
    sqlx::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(format!("{}ms", claim_wait.as_millis().max(1)))
        .execute(&mut *txn)
        .await
        .map_err(store_error(During::Other))?;
    Ok(txn)
}

/// A unit of work: one sqlx transaction. sqlx executes on `&mut PgConnection` while the port takes
/// `&self`, so the transaction sits behind an async mutex, locked for each statement.
pub struct SqlxUnit {
    txn: Arc<Mutex<Option<Transaction<'static, Postgres>>>>,
    claim_wait: Duration,
}

impl SqlxUnit {
    /// The ledger inside this unit.
    pub fn ledger(&self) -> SqlxLedger {
        SqlxLedger {
            on: On::Unit(Arc::clone(&self.txn)),
            claim_wait: self.claim_wait,
        }
    }

    /// Runs `statement` on the unit's connection (for the application's own writes).
    pub async fn execute(&self, statement: &'static str, text: &str) -> Result<(), LedgerError> {
        let mut guard = self.txn.lock().await;
        let txn = guard.as_mut().ok_or_else(unit_ended)?;
        sqlx::query(statement)
            .bind(text)
            .execute(&mut **txn)
            .await
            .map(|_| ())
            .map_err(store_error(During::Other))
    }

    /// The unit's server process id (for tests that end its session from outside).
    pub async fn backend_pid(&self) -> Result<i32, LedgerError> {
        let mut guard = self.txn.lock().await;
        let txn = guard.as_mut().ok_or_else(unit_ended)?;
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut **txn)
            .await
            .map_err(store_error(During::Other))
    }

    /// Commits the unit.
    pub async fn commit(self) -> Result<(), LedgerError> {
        let txn = self.txn.lock().await.take().ok_or_else(unit_ended)?;
        txn.commit().await.map_err(store_error(During::Commit))
    }

    /// Rolls the unit back.
    pub async fn rollback(self) -> Result<(), LedgerError> {
        let txn = self.txn.lock().await.take().ok_or_else(unit_ended)?;
        txn.rollback().await.map_err(store_error(During::Other))
    }
}

fn unit_ended() -> LedgerError {
    LedgerError::internal("the unit of work has ended")
}

/// Where the ledger's statements go.
enum On {
    /// Each call in a short transaction of its own, committed before it returns.
    Pool(PgPool),
    /// The caller's unit of work.
    Unit(Arc<Mutex<Option<Transaction<'static, Postgres>>>>),
}

/// The port on PostgreSQL through sqlx.
pub struct SqlxLedger {
    on: On,
    claim_wait: Duration,
}

/// Runs `$body` with `$conn: &mut PgConnection` on the ledger's unit, or in a bounded transaction
/// of its own on the pool that commits when `$body` succeeds.
macro_rules! on_connection {
    ($ledger:expr, |$conn:ident| $body:expr) => {
        match &$ledger.on {
            On::Unit(unit) => {
                let mut guard = unit.lock().await;
                let txn = guard.as_mut().ok_or_else(unit_ended)?;
                let $conn: &mut PgConnection = &mut **txn;
                $body
            }
            On::Pool(pool) => {
                let mut txn = begin_bounded(pool, $ledger.claim_wait).await?;
                let result = {
                    let $conn: &mut PgConnection = &mut *txn;
                    $body
                };
                match result {
                    Ok(value) => {
                        txn.commit().await.map_err(store_error(During::Commit))?;
                        Ok(value)
                    }
                    Err(error) => {
                        let _ = txn.rollback().await;
                        Err(error)
                    }
                }
            }
        }
    };
}

#[async_trait]
impl GrpcOperationLedger for SqlxLedger {
    async fn claim(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError> {
        let during = During::Claim {
            wait: self.claim_wait,
        };
        on_connection!(self, |conn| claim_on(
            conn, identity, request, lease, during
        )
        .await)
    }

    async fn mark_finished(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<Version, LedgerError> {
        on_connection!(self, |conn| transition_on(
            conn, identity, version, completion
        )
        .await)
    }

    async fn renew_lease(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        lease: LeaseDuration,
    ) -> Result<(), LedgerError> {
        let query = bind_identity(sqlx::query(sql(RENEW_LEASE)), identity)
            .bind(version.to_stored())
            .bind(lease.as_millis());
        on_connection!(self, |conn| update_owned(conn, identity, version, query)
            .await)
    }

    async fn find(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        let found = on_connection!(self, |conn| read(conn, identity, During::Other).await)?;
        Ok(found.map(|(record, _)| record))
    }

    async fn look_up(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<(OperationRecord, Duration)>, LedgerError> {
        let found = on_connection!(self, |conn| read(conn, identity, During::Other).await)?;
        Ok(found.map(|(record, db_now)| {
            let left = match record.finished {
                Some(_) => 0,
                None => (millis(record.lease_expires_at) - db_now).max(0),
            };
            (record, Duration::from_millis(left as u64))
        }))
    }

    async fn census(&self, retention: Duration) -> Result<LedgerCensus, LedgerError> {
        let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let (in_progress, expired, oldest, past_retention): (i64, i64, Option<i64>, i64) =
            on_connection!(self, |conn| {
                sqlx::query_as(sql(CENSUS))
                    .bind(retention)
                    .fetch_one(conn)
                    .await
                    .map_err(store_error(During::Other))
            })?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(LedgerCensus::new(
            count(in_progress),
            count(expired),
            oldest.map(|age| Duration::from_millis(count(age))),
            count(past_retention),
        ))
    }

    async fn purge(&self, retention: Duration, limit: NonZeroU32) -> Result<u64, LedgerError> {
        let retention = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        on_connection!(self, |conn| {
            sqlx::query(sql(PURGE))
                .bind(retention)
                .bind(i64::from(limit.get()))
                .execute(conn)
                .await
                .map(|done| done.rows_affected())
                .map_err(store_error(During::Other))
        })
    }

    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Durable
    }
}

/// Insert first; only when nothing was inserted, read the row and answer from it (case
/// `concurrent_claims_have_exactly_one_owner`: never read-then-insert, never an upsert).
async fn claim_on(
    conn: &mut PgConnection,
    identity: &GrpcOperationIdentity,
    request: &RequestFingerprint,
    lease: LeaseDuration,
    during: During,
) -> Result<ClaimOutcome, LedgerError> {
    let lease_ms = i64::try_from(lease.get().as_millis()).unwrap_or(i64::MAX);
    for _ in 0..CLAIM_ROUNDS {
        let inserted: Option<i64> = bind_identity(sqlx::query_scalar(sql(CLAIM)), identity)
            .bind(request.to_hex())
            .bind(lease_ms)
            .bind(1_i64 << Version::CLAIM_TIME_SHIFT)
            .bind(i64::from(Version::random_salt()))
            .fetch_optional(&mut *conn)
            .await
            .map_err(store_error(during))?;
        if let Some(stored) = inserted {
            return Ok(ClaimOutcome::Claimed {
                version: version(stored)?,
                took_over: false,
            });
        }
        // Nothing inserted: the row exists (or existed: a purge may have removed it since, and
        // then the next round inserts again).
        let Some((record, db_now)) = read(conn, identity, during).await? else {
            continue;
        };
        if record.request_fingerprint != *request {
            return Err(LedgerError::KeyReusedWithDifferentRequest);
        }
        if record.state().is_terminal() {
            return Ok(ClaimOutcome::Completed(record));
        }
        let left = millis(record.lease_expires_at) - db_now;
        if left > 0 {
            return Ok(ClaimOutcome::InProgress {
                retry_after: Duration::from_millis(left as u64),
                record,
            });
        }
        let taken = bind_identity(sqlx::query(sql(TAKE_OVER)), identity)
            .bind(record.version.to_stored())
            .bind(lease_ms)
            .execute(&mut *conn)
            .await
            .map_err(store_error(during))?;
        if taken.rows_affected() == 1 || ignores("takeover changed one row") {
            return Ok(ClaimOutcome::Claimed {
                version: record.version.next(),
                took_over: true,
            });
        }
        // Another taker won between our read and our update: answer from the row as it is now.
    }
    Err(LedgerError::InFlight {
        retry_after: lease.get(),
    })
}

/// One conditional UPDATE; zero rows is never success: read the row to say why
/// (`unmatched_transition`; cases `transitions_*`).
async fn transition_on(
    conn: &mut PgConnection,
    identity: &GrpcOperationIdentity,
    version: Version,
    completion: &Completion,
) -> Result<Version, LedgerError> {
    let query = match completion {
        Completion::Committed(outcome) => bind_identity(sqlx::query(sql(MARK_COMMITTED)), identity)
            .bind(version.to_stored())
            .bind(outcome.as_str().to_owned()),
        Completion::Failed(failure) => bind_identity(sqlx::query(sql(MARK_FAILED)), identity)
            .bind(version.to_stored())
            .bind(failure.code() as i32)
            .bind(failure.message().to_owned())
            .bind(failure.details().to_vec()),
    };
    update_owned(conn, identity, version, query).await?;
    Ok(version.next())
}

/// One conditional UPDATE of the row its owner holds at `version` (a transition, a renewal);
/// zero rows is never success: read the row to say why.
async fn update_owned(
    conn: &mut PgConnection,
    identity: &GrpcOperationIdentity,
    version: Version,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Result<(), LedgerError> {
    let done = query
        .execute(&mut *conn)
        .await
        .map_err(store_error(During::Other))?;
    if done.rows_affected() == 1 || ignores("transition changed one row") {
        return Ok(());
    }
    let current = read(conn, identity, During::Other).await?;
    Err(unmatched_transition(
        current.as_ref().map(|(record, _)| record),
        version,
    ))
}

fn bind_identity<'q, Q: Bindable<'q>>(query: Q, identity: &GrpcOperationIdentity) -> Q {
    query
        .bind_text(identity.caller().as_str().to_owned())
        .bind_text(identity.method().as_str().to_owned())
        .bind_text(identity.key_hash().to_hex())
}

/// The two sqlx query types the identity is bound to.
trait Bindable<'q>: Sized {
    fn bind_text(self, text: String) -> Self;
}

impl<'q> Bindable<'q> for sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    fn bind_text(self, text: String) -> Self {
        self.bind(text)
    }
}

impl<'q, O> Bindable<'q>
    for sqlx::query::QueryScalar<'q, Postgres, O, sqlx::postgres::PgArguments>
{
    fn bind_text(self, text: String) -> Self {
        self.bind(text)
    }
}

/// The row of `identity` and the store's clock, read in one statement.
async fn read(
    conn: &mut PgConnection,
    identity: &GrpcOperationIdentity,
    during: During,
) -> Result<Option<(OperationRecord, i64)>, LedgerError> {
    let row = bind_identity(sqlx::query(sql(SELECT)), identity)
        .fetch_optional(&mut *conn)
        .await
        .map_err(store_error(during))?;
    row.map(|row| decode(identity, &row)).transpose()
}

/// A row as a record; a row that breaks the record's rules is `Internal` (the CHECK constraints
/// should have refused it).
fn decode(
    identity: &GrpcOperationIdentity,
    row: &PgRow,
) -> Result<(OperationRecord, i64), LedgerError> {
    let corrupt = |what: &str| LedgerError::internal(format!("stored ledger row has a bad {what}"));
    let get = |column: &str| -> Result<Option<i64>, LedgerError> {
        row.try_get(column).map_err(|_| corrupt(column))
    };
    let text = |column: &str| -> Result<Option<String>, LedgerError> {
        row.try_get(column).map_err(|_| corrupt(column))
    };
    let required = |value: Option<i64>, column: &str| value.ok_or_else(|| corrupt(column));
    let state: OperationState = text("state")?
        .ok_or_else(|| corrupt("state"))?
        .parse()
        .map_err(|_| corrupt("state"))?;
    let completed_at = get("completed_at")?.map(time);
    let finished = match state {
        OperationState::InProgress => None,
        OperationState::Committed => {
            let reference = text("outcome_reference")?.ok_or_else(|| corrupt("outcome"))?;
            let outcome = OutcomeReference::parse(&reference).map_err(|_| corrupt("outcome"))?;
            Some((
                completed_at.ok_or_else(|| corrupt("completed_at"))?,
                Completion::Committed(outcome),
            ))
        }
        OperationState::FailedTerminal => {
            let code: Option<i32> = row.try_get("failure_code").map_err(|_| corrupt("code"))?;
            let message = text("failure_message")?.ok_or_else(|| corrupt("message"))?;
            let details: Option<Vec<u8>> = row
                .try_get("failure_details")
                .map_err(|_| corrupt("details"))?;
            let failure =
                RecordedFailure::from_stored(code.ok_or_else(|| corrupt("code"))?, &message)
                    .and_then(|failure| failure.with_details(&details.unwrap_or_default()))
                    .map_err(|_| corrupt("failure"))?;
            Some((
                completed_at.ok_or_else(|| corrupt("completed_at"))?,
                Completion::Failed(failure),
            ))
        }
    };
    let fingerprint = text("request_fingerprint")?.ok_or_else(|| corrupt("fingerprint"))?;
    let record = OperationRecord {
        identity: identity.clone(),
        request_fingerprint: RequestFingerprint::from_hex(&fingerprint)
            .map_err(|_| corrupt("fingerprint"))?,
        version: version(required(get("version")?, "version")?)?,
        claimed_at: time(required(get("claimed_at")?, "claimed_at")?),
        lease_expires_at: time(required(get("lease_expires_at")?, "lease_expires_at")?),
        finished,
    };
    Ok((record, required(get("db_now")?, "db_now")?))
}

fn version(stored: i64) -> Result<Version, LedgerError> {
    Version::from_stored(stored)
        .map_err(|_| LedgerError::internal("stored ledger row has a bad version"))
}

fn time(millis: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(millis.max(0) as u64)
}

fn millis(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
    })
}

/// A sqlx error as a ledger error, by the public classification of `grpc_core_api::store_errors`;
/// the driver's message (which may quote row values) is never kept.
pub fn store_error(during: During) -> impl Fn(sqlx::Error) -> LedgerError {
    move |error| {
        during.judge(match error {
            sqlx::Error::Database(db) => {
                from_sqlstate(db.code().as_deref().unwrap_or_default(), during)
            }
            sqlx::Error::PoolTimedOut => LedgerError::unavailable(UnavailableKind::PoolTimeout),
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => {
                LedgerError::unavailable(UnavailableKind::ConnectionLost)
            }
            _ => LedgerError::internal("unexpected driver error"),
        })
    }
}
