//! What an operator reads from a ledger table without writing SQL: how many operations are in
//! each state, how old the oldest in progress is, whose lease has run out, how much room the
//! table takes, and which operations match a filter. Read-only; settling an operation (`fail`)
//! and purging go through the port, fenced as every other write.
//!
//! Nothing here returns key material: a listed operation shows its key hash's first 12 hex
//! digits, enough to tell rows apart and to name one to `fail`, never the key.

use std::time::Duration;

use grpc_core_api::{
    CallerFingerprint, GrpcMethod, GrpcOperationIdentity, IdempotencyKeyHash, LedgerCensus,
    LedgerError, OperationState,
};
use sea_orm::{ConnectionTrait, DbBackend, QueryResult, Statement, Value};

use crate::error::store_error;
use crate::sql::now_expression;

/// How many hex digits of a key hash a listing shows.
pub const KEY_HASH_PREFIX_LEN: usize = 12;

/// A ledger table at a glance.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LedgerStats {
    /// Operations claimed and not finished.
    pub in_progress: u64,
    /// Operations finished with an outcome.
    pub committed: u64,
    /// Operations finished with a recorded failure.
    pub failed_terminal: u64,
    /// Operations in progress whose lease has run out by the store's clock: their handler died or
    /// hangs, and the next resend under their key takes them over.
    pub expired_leases: u64,
    /// The age of the oldest operation in progress, by the store's clock.
    pub oldest_in_progress: Option<Duration>,
    /// Bytes on disk: the table and its indexes (PostgreSQL, MariaDB), or the whole database file
    /// (SQLite, which keeps no per-table figure without an extension).
    pub storage_bytes: Option<u64>,
}

/// Which operations a listing shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListFilter {
    /// Only operations in this state.
    pub state: Option<OperationState>,
    /// Only operations of this method.
    pub method: Option<GrpcMethod>,
    /// Only operations claimed longer ago than this.
    pub older_than: Option<Duration>,
    /// Only operations in progress whose lease has run out.
    pub expired_lease: bool,
    /// At most this many, oldest first (0: 100).
    pub limit: u32,
}

impl ListFilter {
    /// Every operation, the 100 oldest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only operations in `state`.
    pub fn with_state(mut self, state: OperationState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only operations of `method`.
    pub fn with_method(mut self, method: GrpcMethod) -> Self {
        self.method = Some(method);
        self
    }

    /// Only operations claimed more than `age` ago.
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Only operations in progress whose lease has run out.
    pub fn expired_lease(mut self) -> Self {
        self.expired_lease = true;
        self
    }

    /// At most `limit` operations.
    pub fn with_limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }
}

/// One operation of a listing: everything but its key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedOperation {
    /// The caller's fingerprint, as stored.
    pub caller: CallerFingerprint,
    /// The method.
    pub method: GrpcMethod,
    /// The first [`KEY_HASH_PREFIX_LEN`] hex digits of the key's hash.
    pub key_hash_prefix: String,
    /// The state.
    pub state: OperationState,
    /// The version a fenced write must name.
    pub version: i64,
    /// Time since the claim, by the store's clock.
    pub age: Duration,
    /// Time left on the lease (zero once it ran out, or the operation finished).
    pub lease_left: Duration,
}

/// The counts, the oldest operation in progress and the size of the ledger table on `db`.
pub async fn ledger_stats<C: ConnectionTrait>(db: &C) -> Result<LedgerStats, LedgerError> {
    let backend = db.get_database_backend();
    let counted = count_operations(db, Duration::ZERO).await?;
    let storage = match backend {
        DbBackend::Postgres => "SELECT pg_total_relation_size('grpc_operation_ledger')::BIGINT",
        DbBackend::MySql => {
            "SELECT CAST(data_length + index_length AS SIGNED) FROM information_schema.tables \
             WHERE table_schema = DATABASE() AND table_name = 'grpc_operation_ledger'"
        }
        _ => "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
    };
    let size = one_row(db, Statement::from_string(backend, storage)).await?;
    Ok(LedgerStats {
        in_progress: counted.census.in_progress,
        committed: counted.committed,
        failed_terminal: counted.failed_terminal,
        expired_leases: counted.census.expired_leases,
        oldest_in_progress: counted.census.oldest_in_progress,
        storage_bytes: get::<Option<i64>>(&size, 0)?.and_then(|bytes| u64::try_from(bytes).ok()),
    })
}

/// Every count of the ledger table, in one aggregate read by the store's clock.
pub(crate) struct Counted {
    /// What the port's `census` answers.
    pub(crate) census: LedgerCensus,
    /// Operations committed.
    pub(crate) committed: u64,
    /// Operations failed terminally.
    pub(crate) failed_terminal: u64,
}

/// The counts on `db`: by state, expired leases, the oldest in progress, and finished operations
/// completed more than `retention` ago. One scan of the table: the port's `census` (the retention
/// worker's gauges) and `grpc-ledger stats` both read it.
pub(crate) async fn count_operations<C: ConnectionTrait>(
    db: &C,
    retention: Duration,
) -> Result<Counted, LedgerError> {
    let backend = db.get_database_backend();
    let census = &crate::sql::Sql::for_backend(backend)
        .ok_or_else(|| LedgerError::internal("the ledger runs on PostgreSQL, SQLite and MariaDB"))?
        .census;
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let row = one_row(
        db,
        Statement::from_sql_and_values(
            backend,
            &census.text,
            census.values(vec![retention_ms.into()]),
        ),
    )
    .await?;
    let count =
        |i| -> Result<u64, LedgerError> { Ok(u64::try_from(get::<i64>(&row, i)?).unwrap_or(0)) };
    Ok(Counted {
        census: LedgerCensus::new(
            count(0)?,
            count(3)?,
            get::<Option<i64>>(&row, 4)?.map(millis),
            count(5)?,
        ),
        committed: count(1)?,
        failed_terminal: count(2)?,
    })
}

/// The operations `filter` selects, oldest first.
pub async fn list_operations<C: ConnectionTrait>(
    db: &C,
    filter: &ListFilter,
) -> Result<Vec<ListedOperation>, LedgerError> {
    let backend = db.get_database_backend();
    let now = supported(backend)?;
    let mut conditions = Vec::new();
    let mut values = Vec::new();
    if let Some(state) = filter.state {
        // A fixed word of the port's, never the operator's text.
        conditions.push(format!("state = '{}'", state.as_str()));
    }
    if let Some(method) = &filter.method {
        let placeholder = match backend {
            DbBackend::Postgres => "$1",
            DbBackend::Sqlite => "?1",
            _ => "?",
        };
        conditions.push(format!("full_method_name = {placeholder}"));
        values.push(Value::from(method.as_str().to_owned()));
    }
    if let Some(age) = filter.older_than {
        conditions.push(format!("claimed_at < {now} - {}", age.as_millis()));
    }
    if filter.expired_lease {
        conditions.push(format!(
            "state = 'IN_PROGRESS' AND lease_expires_at <= {now}"
        ));
    }
    let condition = if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conditions.join(" AND "))
    };
    let limit = if filter.limit == 0 { 100 } else { filter.limit };
    let sql = format!(
        "SELECT caller_fingerprint, full_method_name, idempotency_key_hash, state, version, \
         {now} - claimed_at, \
         CASE WHEN state = 'IN_PROGRESS' AND lease_expires_at > {now} \
              THEN lease_expires_at - {now} ELSE 0 END \
         FROM grpc_operation_ledger {condition} ORDER BY claimed_at LIMIT {limit}"
    );
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await
        .map_err(store_error)?;
    rows.iter().map(listed).collect()
}

/// The one operation a listing's row names: `caller`, `method` and a key hash starting with
/// `key_hash_prefix` (at least [`KEY_HASH_PREFIX_LEN`] hex digits). `None` when no operation
/// matches; an error when the prefix is too short or matches several.
pub async fn find_listed<C: ConnectionTrait>(
    db: &C,
    caller: &CallerFingerprint,
    method: &GrpcMethod,
    key_hash_prefix: &str,
) -> Result<Option<GrpcOperationIdentity>, LedgerError> {
    let prefix = key_hash_prefix.to_ascii_lowercase();
    if prefix.len() < KEY_HASH_PREFIX_LEN || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(LedgerError::internal(
            "a key hash prefix is at least 12 hex digits, as a listing shows it",
        ));
    }
    let backend = db.get_database_backend();
    supported(backend)?;
    let (a, b, hex) = match backend {
        DbBackend::Postgres => ("$1", "$2", "encode(idempotency_key_hash, 'hex')"),
        DbBackend::Sqlite => ("?1", "?2", "lower(hex(idempotency_key_hash))"),
        _ => ("?", "?", "LOWER(HEX(idempotency_key_hash))"),
    };
    // The prefix is hex digits only (checked above), so it can stand in the text of the LIKE.
    // The key is the identity's digest, which a prefix of the key hash cannot name: this reads
    // the table (an operator's command, not a request's path).
    let sql = format!(
        "SELECT idempotency_key_hash FROM grpc_operation_ledger \
         WHERE caller_fingerprint = {a} AND full_method_name = {b} \
         AND {hex} LIKE '{prefix}%' LIMIT 2"
    );
    let values = vec![
        Value::from(caller.as_str().to_owned()),
        Value::from(method.as_str().to_owned()),
    ];
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await
        .map_err(store_error)?;
    match rows.as_slice() {
        [] => Ok(None),
        [row] => {
            let hash = stored_key_hash(row, 0)?;
            Ok(Some(GrpcOperationIdentity::new(
                caller.clone(),
                method.clone(),
                hash,
            )))
        }
        _ => Err(LedgerError::internal(
            "the key hash prefix matches several operations; give more of its digits",
        )),
    }
}

fn listed(row: &QueryResult) -> Result<ListedOperation, LedgerError> {
    let stored = |what: &'static str| move |_| LedgerError::internal(what);
    let key_hash = stored_key_hash(row, 2)?.to_hex();
    Ok(ListedOperation {
        caller: CallerFingerprint::parse(&get::<String>(row, 0)?)
            .map_err(stored("a stored caller is not valid"))?,
        method: GrpcMethod::parse(&get::<String>(row, 1)?)
            .map_err(stored("a stored method is not valid"))?,
        key_hash_prefix: key_hash.chars().take(KEY_HASH_PREFIX_LEN).collect(),
        state: state_named(&get::<String>(row, 3)?)
            .ok_or_else(|| LedgerError::internal("a stored state is not valid"))?,
        version: get(row, 4)?,
        age: millis(get(row, 5)?),
        lease_left: millis(get(row, 6)?),
    })
}

/// The key hash in column `index`, stored as its 32 bytes.
fn stored_key_hash(row: &QueryResult, index: usize) -> Result<IdempotencyKeyHash, LedgerError> {
    <[u8; 32]>::try_from(get::<Vec<u8>>(row, index)?)
        .map(IdempotencyKeyHash::from_bytes)
        .map_err(|_| LedgerError::internal("a stored key hash is not 32 bytes"))
}

/// The state stored (and shown) as `name`: `IN_PROGRESS`, `COMMITTED` or `FAILED_TERMINAL`.
pub fn state_named(name: &str) -> Option<OperationState> {
    OperationState::ALL
        .into_iter()
        .find(|state| state.as_str().eq_ignore_ascii_case(name))
}

fn supported(backend: DbBackend) -> Result<&'static str, LedgerError> {
    now_expression(backend)
        .ok_or_else(|| LedgerError::internal("the ledger runs on PostgreSQL, SQLite and MariaDB"))
}

fn millis(value: i64) -> Duration {
    Duration::from_millis(u64::try_from(value).unwrap_or(0))
}

async fn one_row<C: ConnectionTrait>(
    db: &C,
    statement: Statement,
) -> Result<QueryResult, LedgerError> {
    db.query_one_raw(statement)
        .await
        .map_err(store_error)?
        .ok_or_else(|| LedgerError::internal("an aggregate returned no row"))
}

fn get<T: sea_orm::TryGetable>(row: &QueryResult, index: usize) -> Result<T, LedgerError> {
    row.try_get_by_index(index)
        .map_err(|_| LedgerError::internal("a ledger row has a column of an unexpected type"))
}
