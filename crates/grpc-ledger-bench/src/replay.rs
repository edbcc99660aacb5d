//! The duplicate's cost: a claim of a committed identity and a resend's read, against a plain
//! primary-key read and against pgbench on the same rows.

use super::*;

/// The duplicate's cost: a claim of a committed identity and a resend's read first, each against
/// a plain primary-key read, and the store's own price for the resend's read, measured by pgbench
/// on the same rows.
pub(crate) async fn replay(db: &DatabaseConnection, url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let keys: Vec<String> = (0..plan.replay_ops)
        .map(|i| format!("replay-{}-{i}", std::process::id()))
        .collect();
    for key in &keys {
        keyed_op(db, 0, key).await?;
    }
    let ledger = SeaOrmOperationLedger::new(db);
    let (mut claims, mut finds, mut reads) = (Vec::new(), Vec::new(), Vec::new());
    // The three are measured key by key, in an order that turns with each key, so that none of
    // them always finds the pages the one before it brought into the cache.
    for (i, key) in keys.iter().enumerate() {
        for step in 0..3 {
            let started = Instant::now();
            match (i + step) % 3 {
                0 => {
                    let answer = ledger
                        .claim(
                            &identity(0, key),
                            &RequestFingerprint::of(key.as_bytes()),
                            lease(),
                        )
                        .await?;
                    claims.push(started.elapsed());
                    if !matches!(answer, ClaimOutcome::Completed(_)) {
                        bail!("a committed identity was not replayed");
                    }
                }
                // What a resend is answered with under the guard: the record read by its key
                // (the claim follows only when no finished record is found).
                1 => {
                    let found = ledger.find(&identity(0, key)).await?;
                    finds.push(started.elapsed());
                    if !found.is_some_and(|record| record.state().is_terminal()) {
                        bail!("a committed identity was not found finished");
                    }
                }
                _ => {
                    db.query_one_raw(Statement::from_sql_and_values(
                        DbBackend::Postgres,
                        PLAIN_READ,
                        [key.as_str().into()],
                    ))
                    .await?
                    .context("the business row")?;
                    reads.push(started.elapsed());
                }
            }
        }
    }
    let read = figure(
        "replay: primary-key read p50".into(),
        "ms",
        percentile(&mut reads, 0.5),
    );
    let mut figures = vec![
        compared(
            "replay: claim of a committed identity p50".into(),
            "ms",
            percentile(&mut claims, 0.5),
            &read,
        ),
        compared(
            "replay: read first of a committed identity (a resend) p50".into(),
            "ms",
            percentile(&mut finds, 0.5),
            &read,
        ),
        read,
    ];
    figures.extend(replay_at_the_store(db, url, &keys, plan).await?);
    Ok(figures)
}

/// The store's own price for a resend's read: pgbench, one client, reading the same committed
/// rows as the adapter's replay, by their primary keys in the ledger (the adapter's statement)
/// and in the business table. Each script runs half the plan's time twice, in turning order;
/// each read, the script's last statement, is timed on its own (`-r`), after a look-up both
/// scripts share.
pub(crate) async fn replay_at_the_store(
    db: &DatabaseConnection,
    url: &str,
    keys: &[String],
    plan: &Plan,
) -> Result<Vec<Figure>> {
    let measured = read_at_the_store(db, url, keys, plan).await;
    // Dropped whatever happened, so that nothing of it stays in the database the next
    // figures measure; a failed measurement's error is the one reported.
    let dropped = db
        .execute_unprepared(&format!("DROP TABLE IF EXISTS {REPLAY_KEYS_TABLE}"))
        .await;
    let [ledger_read, business_read] = measured?;
    dropped?;
    let read = figure(
        "replay: pgbench, primary-key read mean".into(),
        "ms",
        business_read,
    );
    Ok(vec![
        compared(
            "replay: pgbench, the ledger's read of a committed identity mean".into(),
            "ms",
            ledger_read,
            &read,
        ),
        read,
    ])
}

/// [`replay_at_the_store`]'s two mean latencies in ms, the ledger's read and the business
/// table's, after checking that every key of [`REPLAY_KEYS_TABLE`] finds its row in both tables:
/// a read that finds nothing would be timed as a fast one.
pub(crate) async fn read_at_the_store(
    db: &DatabaseConnection,
    url: &str,
    keys: &[String],
    plan: &Plan,
) -> Result<[f64; 2]> {
    db.execute_unprepared(&format!(
        "CREATE TABLE {REPLAY_KEYS_TABLE} (n INTEGER PRIMARY KEY, identity_digest BYTEA NOT NULL, \
         business_key VARCHAR(128) NOT NULL)"
    ))
    .await?;
    let txn = db.begin().await?;
    for (n, key) in (1i32..).zip(keys) {
        txn.execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            format!("INSERT INTO {REPLAY_KEYS_TABLE} VALUES ($1, $2, $3)"),
            [
                n.into(),
                identity(0, key).storage_digest().to_vec().into(),
                key.as_str().into(),
            ],
        ))
        .await?;
    }
    txn.commit().await?;
    let found = count(
        db,
        &format!(
            "SELECT count(*) FROM {REPLAY_KEYS_TABLE} \
             JOIN grpc_operation_ledger USING (identity_digest) \
             JOIN bench_business USING (business_key)"
        ),
    )
    .await?;
    if found != keys.len() as i64 {
        bail!(
            "{found} of the {} replayed keys have both their rows for pgbench to read",
            keys.len()
        );
    }
    let scripts = pgbench_replay_scripts(keys.len())?;
    let dir = std::env::temp_dir();
    let mut runs: [Vec<PgbenchRun>; 2] = Default::default();
    for i in [0, 1, 1, 0] {
        runs[i].push(pgbench_last_statement(url, &scripts[i], plan.half(), &dir)?);
    }
    Ok(runs.map(|runs| PgbenchRun::together(runs).mean_ms))
}

/// Only the replay's figures, on a database of their own on the PostgreSQL at `url`.
pub async fn replay_cost(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let bench_db = BenchDatabase::create(url).await?;
    let db = connect_postgres(
        &bench_db.url,
        &LedgerConfig::default().with_pooler(Pooler::None),
    )
    .await?;
    grpc_operation_ledger_seaorm::migrate(&db).await?;
    db.execute_unprepared(BUSINESS_TABLE).await?;
    let figures = replay(&db, &bench_db.url, plan).await?;
    db.close().await?;
    bench_db.drop_it().await?;
    Ok(figures)
}
