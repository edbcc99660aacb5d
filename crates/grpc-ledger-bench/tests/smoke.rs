//! The benchmark harness runs end to end with tiny counts against the PostgreSQL of
//! `cargo xtask test`. It checks the harness, not the figures: no timing is asserted.

mod common;

use common::database_url;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_harness_runs_every_group_and_reports_ratios() {
    let url = database_url();
    let figures = grpc_ledger_bench::run_all(&url, &grpc_ledger_bench::Plan::smoke())
        .await
        .unwrap();
    let names: Vec<&str> = figures.iter().map(|f| f.name.as_str()).collect();
    for expected in [
        "write c=2 keyed",
        "write c=2 keyed vs raw-sql",
        "write c=2 keyed vs pgbench keyed",
        "write c=2 raw-sql vs pgbench keyed",
        "write c=2 business vs pgbench business",
        "write c=2 keyed vs pgbench keyed, the adapter first",
        "write c=2 keyed vs pgbench keyed, pgbench first",
        "write c=2 business vs pgbench business, pgbench first",
        "pooler c=2 keyed unit, statements for a transaction pooler",
        "replay: claim of a committed identity p50",
        "replay: pgbench, the ledger's read of a committed identity mean",
        "growth: claim p50 at 200 rows",
        "sqlite: keyed, one writer",
        "sqlite: C library keyed vs business, one writer",
        "write c=2 pgbench keyed without the unit's lock bound vs business",
        "e2e postgres guarded ops/s @2",
        "e2e postgres unguarded in a task ops/s @2",
        "e2e postgres guarded vs unguarded in a task ops/s @2",
        "e2e postgres ledger without the guard ops/s @2",
        "e2e postgres guarded vs ledger without the guard ops/s @2",
        "e2e postgres guarded write-once ops/s @2",
        "write c=2 keyed write-once vs claim-first",
        "e2e postgres guarded via executor ops/s @2",
        "e2e sqlite guarded ops/s @2",
        "fingerprint: canonical, schema-aware",
    ] {
        let found = figures
            .iter()
            .find(|f| f.name == expected)
            .unwrap_or_else(|| panic!("{expected} missing from {names:?}"));
        assert!(found.value > 0.0, "{expected} measured nothing");
    }
    assert!(figures.iter().filter(|f| f.ratio.is_some()).count() >= 12);
    // PostgreSQL has no single writer to refuse a call as busy: a refusal there is a failed call
    // (a duplicate payment id, a broken variant) that would inflate its variant's rate.
    for refused in figures.iter().filter(|f| {
        f.name.starts_with("e2e postgres")
            && (f.name.contains("refused") || f.name.contains("given up"))
    }) {
        assert_eq!(refused.value, 0.0, "{}", refused.name);
    }
    let json = grpc_ledger_bench::json(&figures);
    assert_eq!(json.as_array().unwrap().len(), figures.len());
}

/// The MariaDB group, on the MariaDB and the Galera cluster of `cargo xtask test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_mariadb_group_runs_on_one_server_and_on_the_cluster() {
    let variable = |name: &str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| panic!("{name} is not set: run `cargo xtask test`"))
    };
    let galera: Vec<String> = variable("GALERA_URLS")
        .split(',')
        .map(str::to_owned)
        .collect();
    for (label, urls) in [
        ("mariadb", vec![variable("MARIADB_URL")]),
        ("galera", galera),
    ] {
        let figures =
            grpc_ledger_bench::mariadb_family(label, &urls, &grpc_ledger_bench::Plan::smoke())
                .await
                .unwrap();
        let keyed = figures
            .iter()
            .find(|f| f.name == format!("{label} keyed ops/s @2"))
            .unwrap_or_else(|| panic!("no keyed figure for {label}: {figures:?}"));
        assert!(keyed.value > 0.0, "{label} measured nothing");
        assert!(
            keyed.ratio.is_some(),
            "{label}: keyed is compared with business"
        );
        // mariadb-slap's limit, on the single server.
        if label == "mariadb" {
            let slap = figures
                .iter()
                .find(|f| f.name == "mariadb slap keyed vs business @2")
                .unwrap_or_else(|| panic!("no mariadb-slap figure: {figures:?}"));
            assert!(slap.value > 0.0 && slap.ratio.is_some(), "{slap:?}");
        }
    }
}
