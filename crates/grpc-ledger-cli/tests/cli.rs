//! `grpc-ledger` run as an operator runs it, against a ledger on SQLite, PostgreSQL and MariaDB
//! holding finished operations, one stuck (its lease run out) and one live: every command, its
//! exit code, and no key in anything it prints.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_seaorm::{
    LedgerConfig, SeaOrmOperationLedger, connect_server, database_url, migrate, open_sqlite,
};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection};
use serde_json::Value;

const SECRET: &[u8] = b"operator-test-secret-0123456789abcdef";
const PRINCIPAL: &str = "spiffe://bank.example/checkout";
const METHOD: &str = "/payments.v1.Payments/CreatePayment";

fn identity(key: &str) -> GrpcOperationIdentity {
    GrpcOperationIdentity::new(
        CallerFingerprint::from_principal(PRINCIPAL.as_bytes()),
        GrpcMethod::parse(METHOD).unwrap(),
        KeyHasher::hmac_sha256(SECRET)
            .unwrap()
            .hash(&IdempotencyKey::parse(key).unwrap()),
    )
}

/// Three committed operations, one stuck (lease of 1 ms, long run out) and one live (an hour).
async fn populate(db: &DatabaseConnection) {
    let ledger = SeaOrmOperationLedger::new(db);
    let request = RequestFingerprint::of(b"request");
    for n in 0..3 {
        let id = identity(&format!("secret-key-done-{n}"));
        let lease = LeaseDuration::new(Duration::from_secs(30)).unwrap();
        let ClaimOutcome::Claimed { version, .. } =
            ledger.claim(&id, &request, lease).await.unwrap()
        else {
            panic!("a fresh claim");
        };
        let outcome = Completion::Committed(OutcomeReference::parse(&format!("pay-{n}")).unwrap());
        ledger.mark_finished(&id, version, &outcome).await.unwrap();
    }
    for (key, lease) in [
        ("secret-key-stuck", Duration::from_millis(1)),
        ("secret-key-live", Duration::from_secs(3600)),
    ] {
        let lease = LeaseDuration::new(lease).unwrap();
        let claim = ledger.claim(&identity(key), &request, lease).await.unwrap();
        assert!(matches!(claim, ClaimOutcome::Claimed { .. }));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn grpc_ledger(url: &str, args: &[&str], stdin: &str) -> Ran {
    let mut child = Command::new(env!("CARGO_BIN_EXE_grpc-ledger"))
        .args(args)
        .env("GRPC_LEDGER_URL", url)
        // Every event of every crate: still no key and no secret in anything printed.
        .env("RUST_LOG", "trace")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("grpc-ledger starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let ran = Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    for printed in [&ran.stdout, &ran.stderr] {
        assert!(
            !printed.contains("secret-key"),
            "a key was printed: {printed}"
        );
        assert!(
            !printed.contains("operator-test-secret"),
            "the secret was printed: {printed}"
        );
    }
    ran
}

fn json(ran: &Ran) -> Value {
    assert_eq!(ran.code, 0, "{}{}", ran.stdout, ran.stderr);
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{e}: {}", ran.stdout))
}

/// Every command on the ledger at `url` (populated by the caller).
fn operate(store: &str, url: &str) {
    // One file per test: the tests of this file run at once.
    let secret_file =
        std::env::temp_dir().join(format!("grpc-ledger-secret-{store}-{}", std::process::id()));
    std::fs::write(&secret_file, SECRET).unwrap();
    let secret = secret_file.to_str().unwrap();

    let stats = json(&grpc_ledger(url, &["stats", "--json"], ""));
    assert_eq!(stats["in_progress"], 2, "{stats}");
    assert_eq!(stats["committed"], 3, "{stats}");
    assert_eq!(stats["failed_terminal"], 0, "{stats}");
    assert_eq!(stats["expired_leases"], 1, "{stats}");
    assert!(
        stats["oldest_in_progress_seconds"].as_f64().unwrap() > 0.0,
        "{stats}"
    );
    assert!(stats["storage_bytes"].as_u64().unwrap() > 0, "{stats}");
    let text = grpc_ledger(url, &["stats"], "");
    assert!(
        text.stdout.contains("lease expired    1"),
        "{}",
        text.stdout
    );

    let stuck = json(&grpc_ledger(
        url,
        &["list", "--expired-lease", "--json"],
        "",
    ));
    let stuck = stuck.as_array().unwrap();
    assert_eq!(stuck.len(), 1, "{stuck:?}");
    let row = &stuck[0];
    assert_eq!(row["state"], "IN_PROGRESS");
    assert_eq!(row["method"], METHOD);
    let prefix = row["key_hash_prefix"].as_str().unwrap().to_owned();
    assert_eq!(
        prefix,
        identity("secret-key-stuck").key_hash().to_hex()[..12]
    );
    let fingerprint = row["caller_fingerprint"].as_str().unwrap().to_owned();
    let version = row["version"].as_i64().unwrap().to_string();
    let all = json(&grpc_ledger(url, &["list", "--json"], ""));
    assert_eq!(all.as_array().unwrap().len(), 5);
    let committed = json(&grpc_ledger(
        url,
        &["list", "--state", "committed", "--method", METHOD, "--json"],
        "",
    ));
    assert_eq!(committed.as_array().unwrap().len(), 3);

    // show: the key on stdin, hashed with the deployment's secret.
    let show = |key: &str| {
        grpc_ledger(
            url,
            &[
                "show",
                "--principal",
                PRINCIPAL,
                "--method",
                METHOD,
                "--key-secret-file",
                secret,
                "--json",
            ],
            key,
        )
    };
    let shown = json(&show("secret-key-stuck\n"));
    assert_eq!(shown["state"], "IN_PROGRESS");
    assert_eq!(shown["lease_left_seconds"], 0.0);
    let done = json(&show("secret-key-done-1"));
    assert_eq!(done["outcome_reference"], "pay-1");
    let unknown = show("secret-key-never-sent");
    assert_eq!(
        unknown.code, 1,
        "an unknown key is refused: {}",
        unknown.stderr
    );
    let unsalted = grpc_ledger(
        url,
        &[
            "show",
            "--principal",
            PRINCIPAL,
            "--method",
            METHOD,
            "--unkeyed-sha256",
        ],
        "secret-key-stuck",
    );
    assert_eq!(
        unsalted.code, 1,
        "another hasher finds nothing: {}",
        unsalted.stderr
    );

    // fail: fenced on the version, refused while the lease is live or the version moved on.
    let fail = |prefix: &str, version: &str| {
        grpc_ledger(
            url,
            &[
                "fail",
                "--caller-fingerprint",
                &fingerprint,
                "--method",
                METHOD,
                "--key-hash-prefix",
                prefix,
                "--version",
                version,
                "--code",
                "ABORTED",
                "--message",
                "settled by the operator",
            ],
            "",
        )
    };
    let live_prefix = &identity("secret-key-live").key_hash().to_hex()[..12];
    let live = json(&grpc_ledger(
        url,
        &["list", "--state", "IN_PROGRESS", "--json"],
        "",
    ));
    let live_version = live
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["key_hash_prefix"] == *live_prefix)
        .map(|row| row["version"].as_i64().unwrap().to_string())
        .unwrap();
    let refused = fail(live_prefix, &live_version);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("lease is live"),
        "{}",
        refused.stderr
    );
    let moved = fail(&prefix, "12345");
    assert_eq!(moved.code, 1, "{}", moved.stderr);
    assert!(moved.stderr.contains("version is now"), "{}", moved.stderr);
    assert_eq!(
        fail("abc", &version).code,
        2,
        "a prefix too short is bad input"
    );
    let settled = fail(&prefix, &version);
    assert_eq!(settled.code, 0, "{}", settled.stderr);
    let failed = json(&show("secret-key-stuck"));
    assert_eq!(failed["state"], "FAILED_TERMINAL");
    assert_eq!(failed["failure_code"], "Aborted");
    assert_eq!(failed["failure_message"], "settled by the operator");
    assert_eq!(
        fail(&prefix, &version).code,
        1,
        "a finished operation is refused"
    );

    // purge: every finished operation, never the live one.
    let purged = json(&grpc_ledger(
        url,
        &["purge", "--older-than", "0", "--batch", "2", "--json"],
        "",
    ));
    assert_eq!(purged["rows"], 4, "{purged}");
    let after = json(&grpc_ledger(url, &["stats", "--json"], ""));
    assert_eq!(
        (after["in_progress"].as_u64(), after["committed"].as_u64()),
        (Some(1), Some(0))
    );

    assert_eq!(grpc_ledger("ftp://nowhere", &["stats"], "").code, 2);
    std::fs::remove_file(&secret_file).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_on_sqlite() {
    let file = std::env::temp_dir().join(format!("grpc-ledger-cli-{}.sqlite", std::process::id()));
    let db = open_sqlite(&file, &LedgerConfig::default()).await.unwrap();
    populate(&db).await;
    db.close().await.unwrap();
    let url = format!("sqlite:{}", file.display());
    tokio::task::spawn_blocking(move || operate("sqlite", &url))
        .await
        .unwrap();
    let missing = grpc_ledger("sqlite:/nonexistent/ledger.sqlite", &["stats"], "");
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    assert!(!std::path::Path::new("/nonexistent/ledger.sqlite").exists());
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
}

fn required(variable: &str) -> String {
    std::env::var(variable)
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| panic!("{variable} is not set: run `cargo xtask test`"))
}

/// A database of its own on the server at `variable`, populated; every command; dropped.
async fn on_a_fresh_database(variable: &str, drop_suffix: &str) {
    on_a_fresh_database_through(variable, None, drop_suffix).await;
}

/// [`on_a_fresh_database`], with the commands reaching that database through the server (a
/// pooler in front of it) at `through`, when given.
async fn on_a_fresh_database_through(variable: &str, through: Option<&str>, drop_suffix: &str) {
    let server = required(variable);
    let name = format!(
        "grpc_ledger_cli_{}_{}",
        std::process::id(),
        through.map_or("direct", |_| "pooled")
    );
    let admin = Database::connect(&server).await.unwrap();
    admin
        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
        .await
        .unwrap();
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let url = database_url(&server, &name).unwrap();
    let (db, _) = connect_server(&url, &LedgerConfig::default())
        .await
        .unwrap();
    migrate(&db).await.unwrap();
    populate(&db).await;
    db.close().await.unwrap();
    let operated = match through {
        Some(pooler) => database_url(&required(pooler), &name).unwrap(),
        None => url.clone(),
    };
    let store = through.unwrap_or(variable).to_owned();
    tokio::task::spawn_blocking(move || operate(&store, &operated))
        .await
        .unwrap();
    admin
        .execute_unprepared(&format!("DROP DATABASE {name}{drop_suffix}"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_on_postgres() {
    on_a_fresh_database("DATABASE_URL", " WITH (FORCE)").await;
}

/// Through PgBouncer in transaction pooling, with no flag saying so: the CLI's statements work
/// behind any pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_on_postgres_behind_a_transaction_pooler() {
    on_a_fresh_database_through(
        "DATABASE_URL",
        Some("PGBOUNCER_TRANSACTION_URL"),
        " WITH (FORCE)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_on_mariadb() {
    on_a_fresh_database("MARIADB_URL", "").await;
}
