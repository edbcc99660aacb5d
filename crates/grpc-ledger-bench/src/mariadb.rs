//! The keyed write path on MariaDB and on a Galera cluster.

use super::*;

/// Keyed against business writes on MariaDB: one server (`urls` of one node) or a Galera
/// cluster (every node's URL; client `n` writes through node `n % nodes`), at each client count
/// of `plan`. `label` names the store in the figures. Both variants begin their units as the
/// guard does (through `SeaOrmUnitsOfWork`, READ COMMITTED), so they differ only by the ledger's
/// claim and transition.
pub async fn mariadb_family(label: &str, urls: &[String], plan: &Plan) -> Result<Vec<Figure>> {
    let name = format!("ledger_bench_{}", std::process::id());
    let server = urls.first().context("no server URL")?;
    let admin = Database::connect(server.as_str()).await?;
    admin
        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
        .await?;
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await?;
    let max_clients = plan.clients.iter().copied().max().unwrap_or(1) as u32;
    let config = LedgerConfig::default().with_max_connections(max_clients + 2);
    let mut nodes = Vec::new();
    for url in urls {
        let url = database_url(url, &name)?;
        // Another node applies the CREATE DATABASE a moment after the first returns.
        let mut tries = 0;
        let db = loop {
            match connect_mysql(&url, &config).await {
                Ok(db) => break db,
                Err(_) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(error.into()),
            }
        };
        nodes.push(SeaOrmUnitsOfWork::new(db, &config));
    }
    grpc_operation_ledger_seaorm::migrate(nodes[0].connection()).await?;
    nodes[0]
        .connection()
        .execute_unprepared(
            "CREATE TABLE bench_business (business_key VARCHAR(128) PRIMARY KEY, amount BIGINT NOT NULL)",
        )
        .await?;
    let nodes = Arc::new(nodes);
    let mut figures = Vec::new();
    for &clients in &plan.clients {
        let run = |variant: &'static str| format!("{variant}-{clients}-{}", std::process::id());
        let (units, tag) = (Arc::clone(&nodes), run("mb"));
        let business = drive(
            clients,
            plan.seconds,
            Arc::new(move |task, i| {
                let (units, key) = (Arc::clone(&units), format!("{tag}-{task}-{i}"));
                Box::pin(async move {
                    let units = &units[task % units.len()];
                    let txn = units.begin().await?;
                    txn.execute_raw(business_statement(DbBackend::MySql, &key, 1))
                        .await?;
                    units.commit(txn).await?;
                    Ok(())
                })
            }),
        )
        .await?;
        let (units, tag) = (Arc::clone(&nodes), run("mk"));
        let keyed = drive(
            clients,
            plan.seconds,
            Arc::new(move |task, i| {
                let (units, key) = (Arc::clone(&units), format!("{tag}-{task}-{i}"));
                Box::pin(async move {
                    let units = &units[task % units.len()];
                    let txn = units.begin().await?;
                    keyed_write(units, &txn, task, &key).await?;
                    units.commit(txn).await?;
                    Ok(())
                })
            }),
        )
        .await?;
        let at = |what: &str| format!("{label} {what} @{clients}");
        let business_fig = figure(at("business ops/s"), "ops/s", business.ops_per_second);
        let keyed_fig = compared(
            at("keyed ops/s"),
            "ops/s",
            keyed.ops_per_second,
            &business_fig,
        );
        figures.extend([
            business_fig,
            keyed_fig,
            figure(at("business p50"), "ms", business.p50_ms),
            figure(at("keyed p50"), "ms", keyed.p50_ms),
            figure(at("keyed p99"), "ms", keyed.p99_ms),
        ]);
        eprintln!("measured {label} at {clients} client(s)");
    }
    for units in nodes.iter() {
        units.connection().clone().close().await?;
    }
    admin
        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
        .await?;
    Ok(figures)
}
