//! The embedded default: the adapter on SQLite next to the same unit through SQLite's C library.

use super::*;

/// Removes a SQLite file of the bench's with its WAL and shared-memory files.
pub(crate) fn remove_sqlite_file(file: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

/// Only SQLite's figures (`grpc-ledger-bench --only sqlite`): no server needed.
pub async fn sqlite_cost(plan: &Plan) -> Result<Vec<Figure>> {
    sqlite(plan).await
}

/// The embedded default: keyed against business, one writer, each next to the same unit run
/// through SQLite's C library (`sqlite_c`), the store's own limit for the shape.
pub(crate) async fn sqlite(plan: &Plan) -> Result<Vec<Figure>> {
    let file = std::env::temp_dir().join(format!("ledger-bench-{}.sqlite", std::process::id()));
    let db = open_sqlite(&file, &LedgerConfig::default()).await?;
    db.execute_unprepared(BUSINESS_TABLE).await?;
    let business = fresh_keys(&db, "sb".into(), |db, _, key| async move {
        business_op(&db, &key).await
    });
    let keyed = fresh_keys(&db, "sk".into(), |db, _, key| async move {
        keyed_op(&db, 0, &key).await
    });
    let [business, keyed] = interleaved(1, plan.seconds, [&business, &keyed]).await?;
    let mut end_to_end = Vec::new();
    for &clients in &plan.clients {
        let config = LedgerConfig::default();
        end_to_end.extend(e2e::end_to_end("sqlite", &db, &config, clients, plan).await?);
    }
    db.close().await?;
    let (c_business, c_keyed) = sqlite_c::c_library_limit(plan.seconds).await?;
    remove_sqlite_file(&file);
    let base = figure(
        "sqlite: business, one writer".into(),
        "ops/s",
        business.ops_per_second,
    );
    let c_base = figure(
        "sqlite: C library business, one writer".into(),
        "ops/s",
        c_business,
    );
    let c_keyed_fig = figure(
        "sqlite: C library keyed, one writer".into(),
        "ops/s",
        c_keyed,
    );
    let mut figures = vec![
        compared(
            "sqlite: keyed, one writer".into(),
            "ops/s",
            keyed.ops_per_second,
            &base,
        ),
        compared(
            "sqlite: C library keyed vs business, one writer".into(),
            "ops/s",
            c_keyed,
            &c_base,
        ),
        compared(
            "sqlite: keyed vs C library keyed, one writer".into(),
            "ops/s",
            keyed.ops_per_second,
            &c_keyed_fig,
        ),
        compared(
            "sqlite: business vs C library business, one writer".into(),
            "ops/s",
            business.ops_per_second,
            &c_base,
        ),
        base,
        c_base,
        c_keyed_fig,
    ];
    figures.extend(end_to_end);
    Ok(figures)
}
