//! The full run's last group, in a test process of its own: it pins this whole process and the
//! server to halves of the cores, which no other test should run under, and its pgbench's CPU
//! time is read as this process's children's.

mod common;

use common::database_url;

/// The full run's last group: the write units with PostgreSQL (local, as `cargo xtask test`
/// starts it) on cores of its own. Its figures are named apart from the shared run's, and the
/// server and this process get their cores back afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_units_on_split_cores_are_named_apart_and_give_the_cores_back() {
    use grpc_ledger_bench::{ON_SPLIT_CORES, cpus_allowed};
    use sea_orm::sqlx;
    let url = database_url();
    let ours_before = cpus_allowed("self").unwrap();
    let figures = grpc_ledger_bench::units_on_split_cores(&url, &grpc_ledger_bench::Plan::smoke())
        .await
        .unwrap();
    let expected = format!("write c=8 keyed vs pgbench keyed{ON_SPLIT_CORES}");
    let keyed = figures
        .iter()
        .find(|f| f.name == expected)
        .unwrap_or_else(|| panic!("{expected} missing from {figures:?}"));
    assert!(keyed.value > 0.0 && keyed.ratio.is_some(), "{keyed:?}");
    for f in &figures {
        assert!(f.name.ends_with(ON_SPLIT_CORES), "{}", f.name);
        if let Some(baseline) = &f.baseline {
            assert!(baseline.ends_with(ON_SPLIT_CORES), "{baseline}");
        }
    }
    assert_eq!(cpus_allowed("self").unwrap(), ours_before);
    // A backend forked now runs where the server ran before: the server was started on every
    // core this process may use.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let (backend,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(cpus_allowed(&backend.to_string()).unwrap(), ours_before);
    pool.close().await;
}
