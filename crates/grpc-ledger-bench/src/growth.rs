//! The table's shape: heap-only transitions by fillfactor, bytes per column and per row, and the
//! claim's latency as the ledger grows.

use super::*;

/// What the ledger's transitions cost in the table and its indexes, by the table's fillfactor:
/// for 100 (PostgreSQL's default, every page filled by the claims' inserts) and 80 (a fifth of
/// each page left for the transitions' new row versions), keyed writes through the adapter
/// (claim, business insert, transition, commit) at 8 clients, each on a database of its own.
/// The share of transitions that were heap-only (HOT: no new index entry, the old version
/// pruned within its page), the bytes per row the table and its indexes hold afterwards, and the
/// throughput.
pub async fn transitions_cost(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let mut figures = Vec::new();
    let mut baseline: Option<Figure> = None;
    for fillfactor in [100, 80] {
        let bench_db = BenchDatabase::create(url).await?;
        let db = connect_postgres(
            &bench_db.url,
            &LedgerConfig::default()
                .with_max_connections(10)
                .with_pooler(Pooler::None),
        )
        .await?;
        grpc_operation_ledger_seaorm::migrate(&db).await?;
        db.execute_unprepared(BUSINESS_TABLE).await?;
        db.execute_unprepared(&format!(
            "ALTER TABLE grpc_operation_ledger SET (fillfactor = {fillfactor})"
        ))
        .await?;
        const WAL_POSITION: &str = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::BIGINT";
        if fillfactor == 100 {
            // The baseline's WAL: the business insert alone, in a transaction of its own.
            let wal_before = count(&db, WAL_POSITION).await?;
            let run = format!("walb-{}", std::process::id());
            drive(
                8,
                plan.seconds,
                fresh_keys(&db, run, |db, _, key| async move {
                    business_op(&db, &key).await
                }),
            )
            .await?;
            let wal = (count(&db, WAL_POSITION).await? - wal_before) as f64;
            let writes = count(&db, "SELECT COUNT(*) FROM bench_business")
                .await?
                .max(1) as f64;
            figures.push(figure(
                "transitions: WAL bytes per business write @8".into(),
                "B",
                wal / writes,
            ));
        }
        let wal_before = count(&db, WAL_POSITION).await?;
        let business_before = count(&db, "SELECT COUNT(*) FROM bench_business").await?;
        let run = format!("hot{fillfactor}-{}", std::process::id());
        let keyed = drive(
            8,
            plan.seconds,
            fresh_keys(&db, run, |db, task, key| async move {
                keyed_op(&db, task, &key).await
            }),
        )
        .await?;
        let wal = (count(&db, WAL_POSITION).await? - wal_before) as f64;
        let keyed_writes = (count(&db, "SELECT COUNT(*) FROM bench_business").await?
            - business_before)
            .max(1) as f64;
        // Backends report their counts when idle, at most once a second (PostgreSQL 15).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Both counts from one row, so that no flush falls between them.
        let hot_per_mille = count(
            &db,
            "SELECT (1000 * n_tup_hot_upd / GREATEST(n_tup_upd, 1))::BIGINT \
             FROM pg_stat_user_tables WHERE relname = 'grpc_operation_ledger'",
        )
        .await? as f64;
        let rows = count(&db, "SELECT COUNT(*) FROM grpc_operation_ledger")
            .await?
            .max(1) as f64;
        let table = count(&db, "SELECT pg_relation_size('grpc_operation_ledger')").await? as f64;
        let indexes = count(&db, "SELECT pg_indexes_size('grpc_operation_ledger')").await? as f64;
        if fillfactor == 100 {
            figures.extend(column_bytes(&db).await?);
        }
        db.close().await?;
        bench_db.drop_it().await?;
        let at = |what: &str| format!("transitions at fillfactor {fillfactor}: {what}");
        let ops = figure(at("keyed ops/s @8"), "ops/s", keyed.ops_per_second);
        figures.push(match &baseline {
            Some(base) => compared(at("keyed ops/s @8"), "ops/s", keyed.ops_per_second, base),
            None => {
                baseline = Some(ops.clone());
                ops
            }
        });
        figures.push(figure(
            at("HOT share of transitions"),
            "%",
            hot_per_mille / 10.0,
        ));
        figures.push(figure(
            at("WAL bytes per keyed write (business insert included)"),
            "B",
            wal / keyed_writes,
        ));
        figures.push(figure(at("table bytes per row"), "B", table / rows));
        figures.push(figure(at("index bytes per row"), "B", indexes / rows));
        eprintln!("measured the transitions at fillfactor {fillfactor} ({rows} rows)");
    }
    Ok(figures)
}

/// The ledger's columns as the adapter wrote them: the mean bytes each one takes in a row
/// (`pg_column_size`: the value with its length header, no alignment padding), and the whole
/// row's data.
pub(crate) async fn column_bytes(db: &DatabaseConnection) -> Result<Vec<Figure>> {
    let columns = db
        .query_all_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT column_name::TEXT AS name FROM information_schema.columns \
             WHERE table_name = 'grpc_operation_ledger' ORDER BY ordinal_position",
        ))
        .await?
        .iter()
        .map(|row| row.try_get::<String>("", "name"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut figures = Vec::new();
    for column in columns.iter().map(String::as_str).chain(["row"]) {
        let value = if column == "row" { "l.*" } else { column };
        // Column names read from the catalog, not from input.
        let mean = db
            .query_one_raw(Statement::from_string(
                DbBackend::Postgres,
                format!(
                    "SELECT COALESCE(AVG(pg_column_size({value})), 0)::FLOAT8 AS mean \
                     FROM grpc_operation_ledger AS l"
                ),
            ))
            .await?
            .context("a mean")?
            .try_get::<f64>("", "mean")?;
        figures.push(figure(
            format!("ledger bytes per row in column {column}"),
            "B",
            mean,
        ));
    }
    Ok(figures)
}

/// Claim latency as the ledger grows, and its size per row.
pub(crate) async fn growth(db: &DatabaseConnection, plan: &Plan) -> Result<Vec<Figure>> {
    let mut figures: Vec<Figure> = Vec::new();
    let ledger = SeaOrmOperationLedger::new(db);
    for &size in &plan.growth {
        let have = count(db, "SELECT COUNT(*) FROM grpc_operation_ledger").await? as u64;
        if have < size {
            db.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "INSERT INTO grpc_operation_ledger (identity_digest, caller_fingerprint, \
                 full_method_name, idempotency_key_hash, request_fingerprint, state, version, \
                 claimed_at, lease_expires_at, completed_at, outcome_reference) \
                 SELECT sha256(convert_to(c || '|' || $3 || '|' || h, 'UTF8')), c, $3, \
                 decode(h, 'hex'), sha256(convert_to('r' || i, 'UTF8')), 'COMMITTED', 2, 1, 2, 3, \
                 'p' FROM (SELECT i, md5('bulk' || (i % 8)) || md5((i % 8) || 'bulk') AS c, \
                 md5('g' || i) || md5('h' || i) AS h \
                 FROM generate_series($1::bigint, $2::bigint) AS i) AS bulk",
                [
                    (have as i64 + 1).into(),
                    (size as i64).into(),
                    METHOD.into(),
                ],
            ))
            .await?;
            db.execute_unprepared("ANALYZE grpc_operation_ledger")
                .await?;
        }
        let mut claims = Vec::new();
        for i in 0..plan.growth_ops {
            let key = format!("growth-{size}-{i}");
            let started = Instant::now();
            ledger
                .claim(
                    &identity(i, &key),
                    &RequestFingerprint::of(key.as_bytes()),
                    lease(),
                )
                .await?;
            claims.push(started.elapsed());
        }
        let rows = count(db, "SELECT COUNT(*) FROM grpc_operation_ledger")
            .await?
            .max(1) as f64;
        let table = count(db, "SELECT pg_relation_size('grpc_operation_ledger')").await? as f64;
        let indexes = count(db, "SELECT pg_indexes_size('grpc_operation_ledger')").await? as f64;
        let p50 = percentile(&mut claims, 0.5);
        let name = format!("growth: claim p50 at {size} rows");
        let fig = match figures.first() {
            Some(smallest) => compared(name, "ms", p50, smallest),
            None => figure(name, "ms", p50),
        };
        figures.push(fig);
        figures.push(figure(
            format!("growth: table bytes per row at {size}"),
            "B",
            table / rows,
        ));
        figures.push(figure(
            format!("growth: index bytes per row at {size}"),
            "B",
            indexes / rows,
        ));
        figures.push(figure(
            format!("growth: ledger bytes per row (table + indexes) at {size}"),
            "B",
            (table + indexes) / rows,
        ));
    }
    Ok(figures)
}
