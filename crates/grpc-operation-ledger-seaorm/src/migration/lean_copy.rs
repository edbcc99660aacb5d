//! The third migration's copy: every row of the previous shape into the lean table, with its
//! identity digest computed by the store where it has SHA-256 in SQL and here where it has not
//! (SQLite).

use sea_orm::{ConnectionTrait, DbBackend, Statement, Value};
use sea_orm_migration::prelude::*;

use super::lean_schema::{SHARED_COLUMNS, lean_table, run};

/// Creates the lean table `into` and its `claimed_at` index, and copies every row of `previous`
/// into it.
pub(super) async fn copy_into_lean(
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
