//! The units the benchmarks time: the business insert, the adapter's keyed and write-once units,
//! and the same statements sent through sqlx.

use super::*;

pub(crate) const METHOD: &str = "/payments.v1.Payments/CreatePayment";
pub(crate) const BUSINESS_INSERT: &str =
    "INSERT INTO bench_business (business_key, amount) VALUES ($1, $2)";
pub(crate) const PLAIN_READ: &str =
    "SELECT business_key, amount FROM bench_business WHERE business_key = $1";

pub(crate) fn identity(caller: usize, key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(format!("caller-{}", caller % 8).as_bytes()),
        GrpcMethod::parse(METHOD).expect("valid method"),
        KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).expect("valid key")),
    )
}

pub(crate) fn lease() -> LeaseDuration {
    LeaseDuration::new(Duration::from_secs(30)).expect("valid lease")
}

pub(crate) fn business_statement(backend: DbBackend, key: &str, amount: i64) -> Statement {
    let sql = in_dialect(backend, BUSINESS_INSERT).expect("a store the ledger supports");
    Statement::from_sql_and_values(backend, sql, [key.into(), amount.into()])
}

/// One business write in its own transaction: the floor.
pub(crate) async fn business_op(db: &DatabaseConnection, key: &str) -> Result<()> {
    let txn = db.begin().await?;
    txn.execute_raw(business_statement(db.get_database_backend(), key, 1))
        .await?;
    txn.commit().await?;
    Ok(())
}

/// The units of work the guard runs on `db`: begun as `KeyedMutationGuard` begins them (on
/// PostgreSQL with the claim wait as the transaction's lock bound, sent once after `BEGIN`; on
/// SQLite `BEGIN IMMEDIATE`; on MariaDB at READ COMMITTED), with the adapter's default claim wait.
pub(crate) fn guard_units(db: &DatabaseConnection) -> SeaOrmUnitsOfWork {
    SeaOrmUnitsOfWork::new(db.clone(), &LedgerConfig::default())
}

/// Claim + business write + mark_committed through the adapter, in one unit of work begun as the
/// guard begins it.
pub(crate) async fn keyed_op(db: &DatabaseConnection, caller: usize, key: &str) -> Result<()> {
    let units = guard_units(db);
    let txn = units.begin().await?;
    keyed_write(&units, &txn, caller, key).await?;
    units.commit(txn).await?;
    Ok(())
}

/// The write-once mode through the adapter: business write, then the finished row recorded in
/// one insert, in one unit of work begun as the guard begins it.
pub(crate) async fn write_once_op(db: &DatabaseConnection, caller: usize, key: &str) -> Result<()> {
    let id = identity(caller, key);
    let units = guard_units(db);
    let txn = units.begin().await?;
    txn.execute_raw(business_statement(db.get_database_backend(), key, 1))
        .await?;
    let recorded = units
        .ledger(&txn)
        .record_finished(
            &id,
            &RequestFingerprint::of(key.as_bytes()),
            lease(),
            &Completion::Committed(OutcomeReference::parse(key)?),
        )
        .await?;
    if !matches!(recorded, RecordOutcome::Recorded(_)) {
        bail!("a fresh key was not recorded");
    }
    units.commit(txn).await?;
    Ok(())
}

/// Claim, business write and mark_committed of a fresh key on `txn`, a unit of `units`.
pub(crate) async fn keyed_write(
    units: &SeaOrmUnitsOfWork,
    txn: &DatabaseTransaction,
    caller: usize,
    key: &str,
) -> Result<()> {
    let id = identity(caller, key);
    let ledger = units.ledger(txn);
    let claimed = ledger
        .claim(&id, &RequestFingerprint::of(key.as_bytes()), lease())
        .await?;
    let ClaimOutcome::Claimed { version, .. } = claimed else {
        bail!("a fresh key was not claimed")
    };
    txn.execute_raw(business_statement(txn.get_database_backend(), key, 1))
        .await?;
    ledger
        .mark_committed(&id, version, &OutcomeReference::parse(key)?)
        .await?;
    Ok(())
}

/// The claim's `lock_timeout` (the adapter's default claim wait), as the claim statement binds it.
pub(crate) const CLAIM_WAIT_SETTING: &str = "2000ms";

/// The adapter's statement named `name` on `backend` (the names of `statements`), found by its
/// name so that a change in the order of the adapter's list cannot hand the bench another one.
pub(crate) fn adapter_statement(backend: DbBackend, name: &str) -> Result<&'static str> {
    statements(backend)
        .with_context(|| format!("{backend:?} is not a store the ledger supports"))?
        .into_iter()
        .find_map(|(named, text)| (named == name).then_some(text))
        .with_context(|| format!("the adapter has no statement named {name:?}"))
}

/// The adapter's statements as a guarded call sends them (the unit's lock bound, the claim, the
/// business insert, the transition), directly through sqlx: the adapter's ideal.
pub(crate) async fn raw_op(pool: &sqlx::PgPool, caller: usize, key: &str) -> Result<()> {
    let commit = adapter_statement(DbBackend::Postgres, "mark committed")?;
    let claim = claim_as_sent(DbBackend::Postgres).context("PostgreSQL")?;
    let id = identity(caller, key);
    let digest = id.storage_digest().to_vec();
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(lock_timeout_statement(
        LedgerConfig::default().claim_wait,
    )))
    .execute(&mut *tx)
    .await?;
    // The claim answers `inserted` (and the fresh `version`), or the row it met.
    let claimed: Option<(bool, Option<i64>)> = sqlx::query_as(claim)
        .bind(&digest)
        .bind(id.caller().as_str())
        .bind(id.method().as_str())
        .bind(id.key_hash().as_bytes().as_slice())
        .bind(RequestFingerprint::of(key.as_bytes()).as_bytes().as_slice())
        .bind(lease().as_millis())
        .bind(i32::from(Version::random_salt()))
        .bind(CLAIM_WAIT_SETTING)
        .fetch_optional(&mut *tx)
        .await?;
    let version = claimed.and_then(|(inserted, version)| version.filter(|_| inserted));
    let Some(version) = version else {
        bail!("a fresh key was not claimed");
    };
    sqlx::query(BUSINESS_INSERT)
        .bind(key)
        .bind(1i64)
        .execute(&mut *tx)
        .await?;
    sqlx::query(commit)
        .bind(&digest)
        .bind(version)
        .bind(key)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}
