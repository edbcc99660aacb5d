//! The third migration: the ledger's rows rebuilt on a 32-byte digest of their identity, with the
//! hashes as bytes (`docs/adr/0018-the-lean-ledger-row.md`).
//!
//! What changes, and why:
//! - **One fixed-size unique key.** The primary key is `identity_digest`, the SHA-256 of
//!   `caller|method|key hash in hex` ([`GrpcOperationIdentity::storage_digest`]), instead of the
//!   three text columns: its index entries are about a quarter the size. The three columns stay, for
//!   reading. PostgreSQL and MariaDB also check, in a CHECK constraint, that every row's digest is
//!   the one of its own columns, so the unique digest is the unique identity there for rows
//!   written by anything; SQLite has no SHA-256 in SQL and cannot.
//! - **Hashes as bytes.** The key hash and the request fingerprint take 32 bytes, not 64 hex
//!   digits.
//! - **Fixed-size columns first** (PostgreSQL), so no padding sits between them.
//! - **No fillfactor below 100.** A transition is heap-only without it (ADR 0017).
//!
//! The migration keeps every row, in both directions. On PostgreSQL and SQLite a step runs in one
//! transaction that holds the table for the copy (a claim waits its own bound behind it, then is
//! answered or refused). MariaDB commits DDL on its own, so there the rows are copied into a table
//! of a third name that is renamed into place, the ledger's name away meanwhile (a claim then
//! fails at once), and a start that died is carried on from where the tables show it stopped. A
//! step finds a table already in its target shape and leaves it alone.
//! A row whose key hash or request fingerprint is not 64 lower-case hex digits (written by hand:
//! the adapter never writes one) stops the migration with its count before anything changes.
//!
//! [`GrpcOperationIdentity::storage_digest`]: grpc_core_api::GrpcOperationIdentity::storage_digest

use sea_orm::{
    ConnectionTrait, DbBackend, SqliteTransactionMode, Statement, TransactionOptions,
    TransactionTrait, Value,
};
use sea_orm_migration::prelude::*;

use crate::migration::{CreateOperationLedger, LEDGER_TABLE, RefuseUnreplayableOutcomes};

/// The migration; see the module's docs.
pub(crate) struct LeanLedgerRow;

impl MigrationName for LeanLedgerRow {
    fn name(&self) -> &str {
        "m20261204_000003_lean_ledger_row"
    }
}

/// Where the previous shape's rows wait while they are copied.
const PREVIOUS_TABLE: &str = "grpc_operation_ledger_previous";

/// Where the lean shape's rows wait while a revert copies them back.
const LEAN_TABLE: &str = "grpc_operation_ledger_lean";

/// The lean table, for PostgreSQL. `{table}` is its name.
const POSTGRES_LEAN_TABLE: &str = "CREATE TABLE {table} (
    version              BIGINT        NOT NULL,
    claimed_at           BIGINT        NOT NULL,
    lease_expires_at     BIGINT        NOT NULL,
    completed_at         BIGINT,
    failure_code         INTEGER,
    identity_digest      BYTEA         NOT NULL,
    caller_fingerprint   VARCHAR(128)  NOT NULL,
    full_method_name     VARCHAR(512)  NOT NULL,
    idempotency_key_hash BYTEA         NOT NULL,
    request_fingerprint  BYTEA         NOT NULL,
    state                VARCHAR(16)   NOT NULL,
    outcome_reference    VARCHAR(1024),
    failure_message      VARCHAR(1024),
    failure_details      BYTEA,
    CONSTRAINT pk_grpc_operation_ledger PRIMARY KEY (identity_digest),
    CONSTRAINT ck_grpc_operation_ledger_identity_digest CHECK (identity_digest = sha256(convert_to(
        caller_fingerprint || '|' || full_method_name || '|' || encode(idempotency_key_hash, 'hex'),
        'UTF8'))),
    {rules},
    {sized_rules})";

/// The lean table, for MariaDB/MySQL: texts compared byte for byte as before, digests in
/// `VARBINARY(32)` checked to be 32 bytes (`BINARY(32)` would pad a short value silently).
const MYSQL_LEAN_TABLE: &str = "CREATE TABLE {table} (
    version              BIGINT        NOT NULL,
    claimed_at           BIGINT        NOT NULL,
    lease_expires_at     BIGINT        NOT NULL,
    completed_at         BIGINT,
    failure_code         INTEGER,
    identity_digest      VARBINARY(32) NOT NULL,
    caller_fingerprint   VARCHAR(128)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    full_method_name     VARCHAR(512)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    idempotency_key_hash VARBINARY(32) NOT NULL,
    request_fingerprint  VARBINARY(32) NOT NULL,
    state                VARCHAR(16)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    outcome_reference    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    failure_message      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    failure_details      BLOB,
    CONSTRAINT pk_grpc_operation_ledger PRIMARY KEY (identity_digest),
    CONSTRAINT ck_grpc_operation_ledger_identity_digest CHECK (identity_digest = UNHEX(SHA2(
        CONCAT(CAST(caller_fingerprint AS BINARY), '|', CAST(full_method_name AS BINARY), '|',
               CAST(LOWER(HEX(idempotency_key_hash)) AS BINARY)), 256))),
    {rules},
    {sized_rules}
    ) ENGINE=InnoDB";

/// The lean table, for SQLite: one B-tree clustered on the digest (`WITHOUT ROWID`). A new table
/// can carry every rule as a CHECK, where the second migration needed triggers; the types are
/// checked too, since SQLite would store a text where a blob belongs.
const SQLITE_LEAN_TABLE: &str = "CREATE TABLE {table} (
    identity_digest      BLOB          NOT NULL
        CHECK (typeof(identity_digest) = 'blob' AND length(identity_digest) = 32),
    caller_fingerprint   VARCHAR(128)  NOT NULL,
    full_method_name     VARCHAR(512)  NOT NULL,
    idempotency_key_hash BLOB          NOT NULL
        CHECK (typeof(idempotency_key_hash) = 'blob' AND length(idempotency_key_hash) = 32),
    request_fingerprint  BLOB          NOT NULL
        CHECK (typeof(request_fingerprint) = 'blob' AND length(request_fingerprint) = 32),
    state                VARCHAR(16)   NOT NULL,
    version              BIGINT        NOT NULL,
    claimed_at           BIGINT        NOT NULL,
    lease_expires_at     BIGINT        NOT NULL,
    completed_at         BIGINT,
    failure_code         INTEGER,
    outcome_reference    VARCHAR(1024),
    failure_message      VARCHAR(1024),
    failure_details      BLOB,
    CONSTRAINT pk_grpc_operation_ledger PRIMARY KEY (identity_digest),
    {rules},
    CONSTRAINT ck_grpc_operation_ledger_replayable CHECK ((
        (state = 'FAILED_TERMINAL' AND failure_code IS NULL)
        OR outcome_reference = ''
        OR length(CAST(outcome_reference AS BLOB)) > 1024
        OR instr(outcome_reference, char(0)) > 0
        OR length(CAST(failure_message AS BLOB)) > 1024
        OR instr(failure_message, char(0)) > 0
        OR length(failure_details) > 8192) IS NOT TRUE)
    ) WITHOUT ROWID";

/// The rules PostgreSQL and MariaDB state with `octet_length`: the digests' sizes, and what a
/// record must hold to be replayed (SQLite's table states them in its own functions).
const SIZED_RULES: &str = "CONSTRAINT ck_grpc_operation_ledger_digest_sizes
        CHECK (octet_length(idempotency_key_hash) = 32 AND octet_length(request_fingerprint) = 32),
    CONSTRAINT ck_grpc_operation_ledger_failure_details_size
        CHECK (failure_details IS NULL OR octet_length(failure_details) <= 8192),
    CONSTRAINT ck_grpc_operation_ledger_outcome_replayable
        CHECK (outcome_reference IS NULL
               OR (outcome_reference <> '' AND octet_length(outcome_reference) <= 1024)),
    CONSTRAINT ck_grpc_operation_ledger_failure_message_replayable
        CHECK (failure_message IS NULL OR octet_length(failure_message) <= 1024)";

/// The row rules every shape has had: states, what each state must carry, versions from 1.
const ROW_RULES: &str = "CONSTRAINT ck_grpc_operation_ledger_state
        CHECK (state IN ('IN_PROGRESS', 'COMMITTED', 'FAILED_TERMINAL')),
    CONSTRAINT ck_grpc_operation_ledger_committed_has_outcome
        CHECK (state <> 'COMMITTED' OR outcome_reference IS NOT NULL),
    CONSTRAINT ck_grpc_operation_ledger_terminal_has_completion
        CHECK (state = 'IN_PROGRESS' OR completed_at IS NOT NULL),
    CONSTRAINT ck_grpc_operation_ledger_failed_has_failure
        CHECK (state <> 'FAILED_TERMINAL'
               OR (failure_code IS NOT NULL AND failure_code BETWEEN 1 AND 16
                   AND failure_message IS NOT NULL)),
    CONSTRAINT ck_grpc_operation_ledger_version_positive
        CHECK (version >= 1)";

/// The columns both shapes have, copied as they are.
const SHARED_COLUMNS: &str = "caller_fingerprint, full_method_name, state, version, claimed_at, \
     lease_expires_at, completed_at, outcome_reference, failure_code, failure_message, \
     failure_details";

/// The lean table's DDL for `backend`, named `table`.
fn lean_table(backend: DbBackend, table: &str) -> Result<String, DbErr> {
    let template = match backend {
        DbBackend::Postgres => POSTGRES_LEAN_TABLE,
        DbBackend::MySql => MYSQL_LEAN_TABLE,
        DbBackend::Sqlite => SQLITE_LEAN_TABLE,
        other => return Err(unsupported(other)),
    };
    Ok(template
        .replace("{table}", table)
        .replace("{rules}", ROW_RULES)
        .replace("{sized_rules}", SIZED_RULES))
}

fn unsupported(backend: DbBackend) -> DbErr {
    DbErr::Migration(format!(
        "the operation ledger supports PostgreSQL, SQLite and MariaDB/MySQL, not {backend:?}"
    ))
}

/// Runs `sql` on the migration's connection.
async fn run(db: &SchemaManagerConnection<'_>, sql: &str) -> Result<(), DbErr> {
    db.execute_unprepared(sql).await.map(|_| ())
}

/// One number a query answers.
async fn count(db: &SchemaManagerConnection<'_>, sql: &str) -> Result<i64, DbErr> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(Statement::from_string(backend, sql))
        .await?
        .ok_or_else(|| DbErr::Migration(format!("no answer to {sql}")))?;
    row.try_get_by_index::<i64>(0)
        .map_err(|e| DbErr::Migration(e.to_string()))
}

/// Whether `table` exists, and whether it has the lean shape's `identity_digest`.
async fn shape_of(db: &SchemaManagerConnection<'_>, table: &str) -> Result<Shape, DbErr> {
    let (tables, digest) = match db.get_database_backend() {
        DbBackend::Postgres => (
            format!(
                "SELECT COUNT(*)::BIGINT FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = '{table}'"
            ),
            format!(
                "SELECT COUNT(*)::BIGINT FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = '{table}' \
                 AND column_name = 'identity_digest'"
            ),
        ),
        DbBackend::MySql => (
            format!(
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = DATABASE() AND table_name = '{table}'"
            ),
            format!(
                "SELECT COUNT(*) FROM information_schema.columns \
                 WHERE table_schema = DATABASE() AND table_name = '{table}' \
                 AND column_name = 'identity_digest'"
            ),
        ),
        _ => (
            format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{table}'"),
            format!(
                "SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = 'identity_digest'"
            ),
        ),
    };
    Ok(
        match (count(db, &tables).await?, count(db, &digest).await?) {
            (0, _) => Shape::Absent,
            (_, 0) => Shape::Previous,
            _ => Shape::Lean,
        },
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Absent,
    Previous,
    Lean,
}

/// Stops the migration, changing nothing, when a row of `table` (the previous shape) has a key
/// hash or request fingerprint that is not 64 lower-case hex digits: it has no byte form, and its
/// identity digest would not be the adapter's.
async fn refuse_unconvertible_rows(
    db: &SchemaManagerConnection<'_>,
    table: &str,
) -> Result<(), DbErr> {
    let not_hex = |column: &str| match db.get_database_backend() {
        DbBackend::Postgres => format!("{column} !~ '^[0-9a-f]{{64}}$'"),
        DbBackend::MySql => format!("NOT ({column} REGEXP '^[0-9a-f]{{64}}$')"),
        // 64 characters none of which is outside the lower-case hex digits.
        _ => format!("(length({column}) <> 64 OR {column} GLOB '*[^0-9a-f]*')"),
    };
    let bad = count(
        db,
        &format!(
            "SELECT COUNT(*) FROM {table} WHERE {} OR {}",
            not_hex("idempotency_key_hash"),
            not_hex("request_fingerprint")
        ),
    )
    .await?;
    if bad > 0 {
        return Err(DbErr::Migration(format!(
            "{bad} ledger rows have a key hash or request fingerprint that is not 64 lower-case \
             hex digits (not written by the adapter); correct or delete them, then migrate again: \
             nothing was changed"
        )));
    }
    Ok(())
}

// The trait's signatures elide `SchemaManager`'s lifetime; matching them needs the same elision.
#[allow(elided_lifetimes_in_paths)]
#[async_trait::async_trait]
impl MigrationTrait for LeanLedgerRow {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_one_sqlite_connection(manager, |manager| Box::pin(upgrade(manager))).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_one_sqlite_connection(manager, |manager| Box::pin(revert(manager))).await
    }
}

/// Runs `step` on `manager`, on SQLite in a transaction of its own that holds the write lock
/// from its start (`BEGIN IMMEDIATE`, a savepoint inside [`migrate`](crate::migrate)'s). Given a
/// pool rather than a transaction (`LedgerMigrator::up` or `down` on a pool), sea-orm-migration
/// runs a SQLite migration a statement at a time on whichever pooled connection is free: one
/// connection could then still read the schema from before another's rename and recreate
/// nothing where it should, and another writer could come between the steps.
async fn on_one_sqlite_connection<F>(manager: &SchemaManager<'_>, step: F) -> Result<(), DbErr>
where
    F: for<'a> FnOnce(
        &'a SchemaManager<'a>,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<(), DbErr>> + Send + 'a>,
    >,
{
    if manager.get_database_backend() != DbBackend::Sqlite {
        return step(manager).await;
    }
    let options = TransactionOptions {
        sqlite_transaction_mode: Some(SqliteTransactionMode::Immediate),
        ..TransactionOptions::default()
    };
    let unit = manager.get_connection().begin_with_options(options).await?;
    step(&SchemaManager::new(&unit)).await?;
    unit.commit().await
}

/// PostgreSQL: takes the ledger's table for the rest of the migration's transaction (waiting at
/// most the migration's lock wait, after which `migrate` steps aside and asks again) and, unless
/// it already has the shape `done`, moves it aside as `aside`, its primary key's index renamed
/// with it and its `claimed_at` index dropped, so that a new table can take the names. Answers
/// whether it moved it.
async fn set_aside_on_postgres(
    db: &SchemaManagerConnection<'_>,
    done: Shape,
    aside: &str,
) -> Result<bool, DbErr> {
    run(
        db,
        &format!("LOCK TABLE {LEDGER_TABLE} IN ACCESS EXCLUSIVE MODE"),
    )
    .await?;
    if shape_of(db, LEDGER_TABLE).await? == done {
        return Ok(false);
    }
    run(db, &format!("ALTER TABLE {LEDGER_TABLE} RENAME TO {aside}")).await?;
    run(
        db,
        &format!("ALTER INDEX pk_grpc_operation_ledger RENAME TO pk_{aside}"),
    )
    .await?;
    run(
        db,
        "DROP INDEX IF EXISTS ix_grpc_operation_ledger_claimed_at",
    )
    .await?;
    Ok(true)
}

async fn upgrade(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    match manager.get_database_backend() {
        DbBackend::Postgres => {
            if !set_aside_on_postgres(db, Shape::Lean, PREVIOUS_TABLE).await? {
                return Ok(());
            }
            // A refusal rolls the whole transaction back, the renames with it.
            refuse_unconvertible_rows(db, PREVIOUS_TABLE).await?;
            copy_into_lean(db, PREVIOUS_TABLE, LEDGER_TABLE).await?;
        }
        DbBackend::Sqlite => {
            // The step's `BEGIN IMMEDIATE` already holds the database's write lock.
            if shape_of(db, LEDGER_TABLE).await? == Shape::Lean {
                return Ok(());
            }
            refuse_unconvertible_rows(db, LEDGER_TABLE).await?;
            for event in ["insert", "update"] {
                run(
                    db,
                    &format!(
                        "DROP TRIGGER IF EXISTS ck_grpc_operation_ledger_replayable_on_{event}"
                    ),
                )
                .await?;
            }
            run(
                db,
                "DROP INDEX IF EXISTS ix_grpc_operation_ledger_claimed_at",
            )
            .await?;
            run(
                db,
                &format!("ALTER TABLE {LEDGER_TABLE} RENAME TO {PREVIOUS_TABLE}"),
            )
            .await?;
            copy_into_lean(db, PREVIOUS_TABLE, LEDGER_TABLE).await?;
        }
        // Each step commits on its own, so no claim may find a ledger table while rows are in
        // flight (a resend would be claimed afresh beside its committed row): the ledger's name
        // is away from the first rename to the last, and a claim meanwhile fails at once. A
        // start that died is carried on from where the tables show it stopped.
        DbBackend::MySql => {
            if shape_of(db, LEDGER_TABLE).await? == Shape::Previous
                && shape_of(db, PREVIOUS_TABLE).await? == Shape::Absent
            {
                refuse_unconvertible_rows(db, LEDGER_TABLE).await?;
                run(
                    db,
                    &format!("RENAME TABLE {LEDGER_TABLE} TO {PREVIOUS_TABLE}"),
                )
                .await?;
            }
            match (
                shape_of(db, LEDGER_TABLE).await?,
                shape_of(db, PREVIOUS_TABLE).await?,
            ) {
                (Shape::Absent, Shape::Previous) => {
                    // A copy that died part-way is started again from the rows set aside.
                    run(db, &format!("DROP TABLE IF EXISTS {LEAN_TABLE}")).await?;
                    copy_into_lean(db, PREVIOUS_TABLE, LEAN_TABLE).await?;
                    run(db, &format!("RENAME TABLE {LEAN_TABLE} TO {LEDGER_TABLE}")).await?;
                }
                (Shape::Lean, _) => {}
                (ledger, previous) => {
                    return Err(DbErr::Migration(format!(
                        "the ledger's tables are in no state this migration leaves them in \
                         ({LEDGER_TABLE}: {ledger:?}, {PREVIOUS_TABLE}: {previous:?})"
                    )));
                }
            }
            run(db, &format!("DROP TABLE IF EXISTS {PREVIOUS_TABLE}")).await?;
            return Ok(());
        }
        other => return Err(unsupported(other)),
    }
    run(db, &format!("DROP TABLE {PREVIOUS_TABLE}")).await
}

/// Copies the rows back into the previous shape (hashes as hex again); no digest is needed, so
/// every store does it in SQL. A ledger already in the previous shape is left as it is (a revert
/// that committed but was not recorded as reverted). On PostgreSQL and SQLite it runs in one
/// transaction that holds the table, as the upgrade does. MariaDB commits each step on its own,
/// so there the rows are copied into a table of a third name and renamed into place, the
/// ledger's name away meanwhile, and a start that died is carried on from where it stopped.
async fn revert(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    let backend = manager.get_database_backend();
    let hex = |column: &str| match backend {
        DbBackend::Postgres => format!("encode({column}, 'hex')"),
        DbBackend::MySql => format!("LOWER(HEX({column}))"),
        _ => format!("lower(hex({column}))"),
    };
    let copy_back = |into: &str| {
        format!(
            "INSERT INTO {into} (idempotency_key_hash, request_fingerprint, {SHARED_COLUMNS}) \
             SELECT {}, {}, {SHARED_COLUMNS} FROM {LEAN_TABLE}",
            hex("idempotency_key_hash"),
            hex("request_fingerprint")
        )
    };
    match backend {
        DbBackend::Postgres => {
            if !set_aside_on_postgres(db, Shape::Previous, LEAN_TABLE).await? {
                return Ok(());
            }
        }
        DbBackend::MySql => {
            if shape_of(db, LEDGER_TABLE).await? == Shape::Lean
                && shape_of(db, LEAN_TABLE).await? == Shape::Absent
            {
                run(db, &format!("RENAME TABLE {LEDGER_TABLE} TO {LEAN_TABLE}")).await?;
            }
            match (
                shape_of(db, LEDGER_TABLE).await?,
                shape_of(db, LEAN_TABLE).await?,
            ) {
                (Shape::Absent, Shape::Lean) => {
                    // A copy that died part-way is started again from the rows set aside.
                    run(db, &format!("DROP TABLE IF EXISTS {PREVIOUS_TABLE}")).await?;
                    for statement in crate::migration::mysql_previous_shape(PREVIOUS_TABLE) {
                        run(db, &statement).await?;
                    }
                    run(db, &copy_back(PREVIOUS_TABLE)).await?;
                    run(
                        db,
                        &format!("RENAME TABLE {PREVIOUS_TABLE} TO {LEDGER_TABLE}"),
                    )
                    .await?;
                }
                (Shape::Previous, _) => {}
                (ledger, lean) => {
                    return Err(DbErr::Migration(format!(
                        "the ledger's tables are in no state this migration's revert leaves \
                         them in ({LEDGER_TABLE}: {ledger:?}, {LEAN_TABLE}: {lean:?})"
                    )));
                }
            }
            return run(db, &format!("DROP TABLE IF EXISTS {LEAN_TABLE}")).await;
        }
        _ => {
            if shape_of(db, LEDGER_TABLE).await? == Shape::Previous {
                return Ok(());
            }
            run(
                db,
                "DROP INDEX IF EXISTS ix_grpc_operation_ledger_claimed_at",
            )
            .await?;
            run(
                db,
                &format!("ALTER TABLE {LEDGER_TABLE} RENAME TO {LEAN_TABLE}"),
            )
            .await?;
        }
    }
    CreateOperationLedger.up(manager).await?;
    RefuseUnreplayableOutcomes.up(manager).await?;
    run(db, &copy_back(LEDGER_TABLE)).await?;
    run(db, &format!("DROP TABLE {LEAN_TABLE}")).await
}

/// Creates the lean table `into` and its `claimed_at` index, and copies every row of `previous`
/// into it.
async fn copy_into_lean(
    db: &SchemaManagerConnection<'_>,
    previous: &str,
    into: &str,
) -> Result<(), DbErr> {
    let backend = db.get_database_backend();
    run(db, &lean_table(backend, into)?).await?;
    run(
        db,
        &format!("CREATE INDEX ix_grpc_operation_ledger_claimed_at ON {into} (claimed_at)"),
    )
    .await?;
    let columns =
        format!("identity_digest, idempotency_key_hash, request_fingerprint, {SHARED_COLUMNS}");
    match backend {
        DbBackend::Postgres => {
            run(
                db,
                &format!(
                    "INSERT INTO {into} ({columns}) SELECT sha256(convert_to(\
                     caller_fingerprint || '|' || full_method_name || '|' || idempotency_key_hash, \
                     'UTF8')), decode(idempotency_key_hash, 'hex'), \
                     decode(request_fingerprint, 'hex'), {SHARED_COLUMNS} FROM {previous}"
                ),
            )
            .await
        }
        DbBackend::MySql => {
            run(
                db,
                &format!(
                    "INSERT INTO {into} ({columns}) SELECT UNHEX(SHA2(CONCAT(\
                     CAST(caller_fingerprint AS BINARY), '|', CAST(full_method_name AS BINARY), \
                     '|', CAST(idempotency_key_hash AS BINARY)), 256)), \
                     UNHEX(idempotency_key_hash), UNHEX(request_fingerprint), {SHARED_COLUMNS} \
                     FROM {previous}"
                ),
            )
            .await
        }
        // No SHA-256 in SQLite's SQL: the digests are computed here, a batch at a time, in
        // the migration's transaction.
        _ => copy_computing_digests(db, previous, into, &columns).await,
    }
}

/// Rows read and written per round of SQLite's copy.
const SQLITE_COPY_BATCH: i64 = 500;

async fn copy_computing_digests(
    db: &SchemaManagerConnection<'_>,
    previous: &str,
    into: &str,
    columns: &str,
) -> Result<(), DbErr> {
    use grpc_core_api::{CallerFingerprint, GrpcMethod, GrpcOperationIdentity, IdempotencyKeyHash};

    let backend = db.get_database_backend();
    let placeholders = (1..=14)
        .map(|n| format!("?{n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let insert = format!("INSERT INTO {into} ({columns}) VALUES ({placeholders})");
    let bad = |what: &str| DbErr::Migration(format!("a ledger row has a bad {what}"));
    let mut after: Option<(String, String, String)> = None;
    loop {
        let (condition, values): (&str, Vec<Value>) = match &after {
            None => ("", Vec::new()),
            Some((caller, method, key)) => (
                "WHERE (caller_fingerprint, full_method_name, idempotency_key_hash) > (?1, ?2, ?3)",
                vec![
                    caller.clone().into(),
                    method.clone().into(),
                    key.clone().into(),
                ],
            ),
        };
        let rows = db
            .query_all_raw(Statement::from_sql_and_values(
                backend,
                format!(
                    "SELECT idempotency_key_hash, request_fingerprint, {SHARED_COLUMNS} \
                     FROM {previous} {condition} \
                     ORDER BY caller_fingerprint, full_method_name, idempotency_key_hash \
                     LIMIT {SQLITE_COPY_BATCH}"
                ),
                values,
            ))
            .await?;
        for row in &rows {
            let text = |column: &str| row.try_get::<String>("", column).map_err(|_| bad(column));
            let (caller, method, key) = (
                text("caller_fingerprint")?,
                text("full_method_name")?,
                text("idempotency_key_hash")?,
            );
            let key_hash = IdempotencyKeyHash::from_hex(&key).map_err(|_| bad("key hash"))?;
            let request =
                grpc_core_api::RequestFingerprint::from_hex(&text("request_fingerprint")?)
                    .map_err(|_| bad("request fingerprint"))?;
            let identity = GrpcOperationIdentity::new(
                CallerFingerprint::parse(&caller).map_err(|_| bad("caller"))?,
                GrpcMethod::parse(&method).map_err(|_| bad("method"))?,
                key_hash,
            );
            let number = |column: &str| {
                row.try_get::<Option<i64>>("", column)
                    .map_err(|_| bad(column))
            };
            let optional_text = |column: &str| {
                row.try_get::<Option<String>>("", column)
                    .map_err(|_| bad(column))
            };
            let values: Vec<Value> = vec![
                identity.storage_digest().to_vec().into(),
                key_hash.as_bytes().to_vec().into(),
                request.as_bytes().to_vec().into(),
                caller.clone().into(),
                method.clone().into(),
                text("state")?.into(),
                number("version")?.into(),
                number("claimed_at")?.into(),
                number("lease_expires_at")?.into(),
                number("completed_at")?.into(),
                optional_text("outcome_reference")?.into(),
                number("failure_code")?.into(),
                optional_text("failure_message")?.into(),
                row.try_get::<Option<Vec<u8>>>("", "failure_details")
                    .map_err(|_| bad("failure_details"))?
                    .into(),
            ];
            db.execute_raw(Statement::from_sql_and_values(backend, &insert, values))
                .await?;
            after = Some((caller, method, key));
        }
        if (rows.len() as i64) < SQLITE_COPY_BATCH {
            return Ok(());
        }
    }
}
