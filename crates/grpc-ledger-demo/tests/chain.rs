//! The chained demo (`--chain`) on SQLite, PostgreSQL and MariaDB: payments calling postings,
//! each with its own guard and store, responses lost after commit on both hops, streams reset on
//! the second, payment units failed after their posting committed, and each server killed once
//! mid-run. Both stores reconcile: every acknowledged payment has one payment row and one
//! posting, no account has two postings, and every posting left without its payment is taken up
//! by the client's resend under the same key, never posted again.

use std::time::Duration;

use grpc_ledger_demo::{
    ChainFaults, ChainReport, ChainStores, ClientOptions, ClientRetries, FaultOptions, run_chain,
};
use grpc_ledger_payments::Store;
use grpc_operation_ledger_seaorm::Pooler;
use grpc_tonic::GuardMode;
use sea_orm::ConnectionTrait;

/// The runs of this file take turns: each is two loaded servers and a client on two cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const PAYMENTS: u64 = 300;

fn client(run_id: &str, retries: ClientRetries) -> ClientOptions {
    ClientOptions {
        payments: PAYMENTS,
        concurrency: 16,
        deadline: Duration::from_secs(3),
        changed_body_every: 10,
        run_id: run_id.to_owned(),
        progress: false,
        retries,
        tls: None,
    }
}

const FIRST_HOP: FaultOptions = FaultOptions {
    drop_rate: 0.3,
    delay_rate: 0.02,
};

const SECOND_HOP: ChainFaults = ChainFaults {
    postings_drop_rate: 0.2,
    postings_reset_rate: 0.05,
    fail_after_posting_rate: 0.15,
    kill_servers: true,
};

/// The variable's value; without it the test fails (it never skips) and says `how` to get it.
fn required(variable: &str, how: &str) -> String {
    std::env::var(variable)
        .ok()
        .filter(|value| !value.is_empty())
        .unwrap_or_else(|| panic!("{variable} is not set: {how}"))
}

/// Both stores reconciled, every fault really struck, and every payment acknowledged in the end
/// with one posting; each orphaned posting was reused by its payment's resend.
fn assert_exactly_once_across_the_chain(report: &ChainReport) {
    println!("{report}");
    assert!(report.reconciled(), "{report}");
    assert_eq!(report.servers_killed, ["payments", "postings"], "{report}");
    assert!(report.payments.dropped_responses > 30, "{report}");
    assert!(report.postings_dropped > 20, "{report}");
    assert!(report.postings_reset > 0, "{report}");
    assert!(report.failed_after_posting > 10, "{report}");
    assert_eq!(report.payments.acknowledged, PAYMENTS, "{report}");
    assert_eq!(report.payments.payment_rows, PAYMENTS, "{report}");
    assert_eq!(
        report.posting_rows, PAYMENTS,
        "one posting per payment: {report}"
    );
    assert_eq!(
        report.orphans_reused, report.orphans_before_settling,
        "every orphaned posting was taken up, not posted again: {report}"
    );
    assert_eq!(report.payments.changed_body_accepted, 0, "{report}");
}

fn remove_sqlite(file: &std::path::Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_across_two_services_on_sqlite() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let dir = std::env::temp_dir();
    let process = std::process::id();
    let (payments, postings) = (
        dir.join(format!("chain-payments-{process}.sqlite")),
        dir.join(format!("chain-postings-{process}.sqlite")),
    );
    let stores = ChainStores {
        payments: Store::Sqlite(payments.clone()),
        postings: Store::Sqlite(postings.clone()),
    };
    let report = run_chain(
        GuardMode::ClaimFirst,
        &stores,
        FIRST_HOP,
        SECOND_HOP,
        &client("chainsqlite", ClientRetries::Application),
    )
    .await;
    remove_sqlite(&payments);
    remove_sqlite(&postings);
    assert_exactly_once_across_the_chain(&report.unwrap());
}

/// A database of its own on the PostgreSQL at `server_url`, created if missing; its URL.
async fn postgres_database(server_url: &str, database: &str) -> String {
    let admin = sea_orm::Database::connect(server_url).await.unwrap();
    let exists = admin
        .query_one_raw(sea_orm::Statement::from_string(
            sea_orm::DbBackend::Postgres,
            format!("SELECT 1 AS found FROM pg_database WHERE datname = '{database}'"),
        ))
        .await
        .unwrap();
    if exists.is_none() {
        admin
            .execute_unprepared(&format!("CREATE DATABASE {database}"))
            .await
            .unwrap();
    }
    admin.close().await.unwrap();
    grpc_operation_ledger_seaorm::database_url(server_url, database).unwrap()
}

/// On PostgreSQL, each service with a database of its own, the channel owning the client's
/// retries; the payments guard claims first and commits the claim before the handler calls
/// postings, as a handler that calls another service may choose.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_across_two_services_on_postgres() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let url = required(
        "DATABASE_URL",
        "run `cargo xtask test`, or `cargo xtask pg start` and export DATABASE_URL=$(cargo xtask pg url)",
    );
    let postings = postgres_database(&url, "chain_postings").await;
    let stores = ChainStores {
        payments: Store::Server {
            url,
            pooler: Pooler::default(),
        },
        postings: Store::Server {
            url: postings,
            pooler: Pooler::default(),
        },
    };
    for (mode, tag) in [
        (GuardMode::ClaimFirst, "chainpg"),
        (GuardMode::ClaimCommittedFirst, "chainpgccf"),
    ] {
        let run_id = format!("{tag}{}", std::process::id());
        let report = run_chain(
            mode,
            &stores,
            FIRST_HOP,
            SECOND_HOP,
            &client(&run_id, ClientRetries::Channel),
        )
        .await
        .unwrap();
        assert_exactly_once_across_the_chain(&report);
    }
}

/// On MariaDB, each service with a database of its own on the server, the executor owning the
/// client's retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_across_two_services_on_mariadb() {
    let _one_at_a_time = ONE_AT_A_TIME.lock().await;
    let server_url = required(
        "MARIADB_URL",
        "run `cargo xtask test`, or `cargo xtask mariadb start` and export MARIADB_URL=$(cargo xtask mariadb url)",
    );
    let admin = sea_orm::Database::connect(&server_url).await.unwrap();
    let process = std::process::id();
    let mut stores = Vec::new();
    for service in ["payments", "postings"] {
        let database = format!("chain_{service}_{process}");
        admin
            .execute_unprepared(&format!("CREATE DATABASE IF NOT EXISTS {database}"))
            .await
            .unwrap();
        stores.push(Store::Server {
            url: grpc_operation_ledger_seaorm::database_url(&server_url, &database).unwrap(),
            pooler: Pooler::default(),
        });
    }
    admin.close().await.unwrap();
    let (payments, postings) = (stores.remove(0), stores.remove(0));
    let report = run_chain(
        GuardMode::ClaimFirst,
        &ChainStores { payments, postings },
        FIRST_HOP,
        SECOND_HOP,
        &client(&format!("chainmaria{process}"), ClientRetries::Application),
    )
    .await
    .unwrap();
    assert_exactly_once_across_the_chain(&report);
}

/// A chain refuses the write-once mode: its handler's posting is an effect outside the unit.
#[tokio::test]
async fn a_chain_refuses_the_write_once_mode() {
    let stores = ChainStores {
        payments: Store::Sqlite("unused-payments.sqlite".into()),
        postings: Store::Sqlite("unused-postings.sqlite".into()),
    };
    let refused = run_chain(
        GuardMode::WriteOnceInTransactionOnly,
        &stores,
        FIRST_HOP,
        SECOND_HOP,
        &client("chainwriteonce", ClientRetries::Application),
    )
    .await
    .unwrap_err();
    assert!(refused.to_string().contains("write-once"), "{refused}");
    assert!(!std::path::Path::new("unused-payments.sqlite").exists());
}
