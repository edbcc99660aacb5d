//! A foreign client that hedges, through the real guard on PostgreSQL: grpc-js (npm's
//! `@grpc/grpc-js`, installed here on first use) sends each keyed payment as three copies at
//! once, with a third of the server's answers lost after commit. In both guard modes that a
//! hedge meets (claim-first: the copies queue on the claim's row; claim-committed-first: they find
//! the claim committed and in flight), every hedged call ends with the payment unless all three of
//! its answers were lost (UNAVAILABLE, which the client resends under the same key): never with
//! the guard's "in flight" ABORTED. Each payment exists exactly once.
//!
//! Needs `DATABASE_URL` (as `cargo xtask test` sets it), `node` and `npm` with the npm registry.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use grpc_ledger_payments::{Faults, Store, open_store, serve, service, statement};
use grpc_operation_ledger_seaorm::Pooler;
use grpc_tonic::GuardMode;
use sea_orm::{ConnectionTrait, DatabaseConnection};

/// The grpc-js release the test is written against, and its proto loader.
const GRPC_JS: &str = "@grpc/grpc-js@1.14.7";
const PROTO_LOADER: &str = "@grpc/proto-loader@0.8.1";

const PAYMENTS: usize = 200;

/// Where grpc-js is installed: `npm install` into the test's own directory under `target/`, once
/// (the two tests share it).
fn grpc_js() -> PathBuf {
    static INSTALLED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(install_grpc_js).clone()
}

fn install_grpc_js() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpc-js");
    if dir.join("node_modules/@grpc/grpc-js/package.json").exists()
        && dir
            .join("node_modules/@grpc/proto-loader/package.json")
            .exists()
    {
        return dir;
    }
    eprintln!(
        "installing {GRPC_JS} and {PROTO_LOADER} from npm into {}",
        dir.display()
    );
    std::fs::create_dir_all(&dir).expect("the grpc-js directory");
    let status = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir)
        .args([GRPC_JS, PROTO_LOADER])
        .status()
        .expect("npm runs (install Node.js and npm)");
    assert!(status.success(), "npm could not install grpc-js: {status}");
    dir
}

fn database_url() -> String {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| {
            panic!("DATABASE_URL is not set: run `cargo xtask test`, or `cargo xtask pg start`")
        })
}

/// How many payment rows the account has.
async fn rows_of(db: &DatabaseConnection, account: &str) -> i64 {
    let row = db
        .query_one_raw(statement(
            db,
            "SELECT COUNT(*) FROM demo_payments WHERE account = $1",
            vec![account.into()],
        ))
        .await
        .expect("count the account's payments")
        .expect("a count");
    row.try_get_by_index(0).expect("a number")
}

async fn hedged_payments(mode: GuardMode, run: &str) {
    let store = Store::Server {
        url: database_url(),
        pooler: Pooler::default(),
    };
    let (db, config) = open_store(&store).await.expect("open the store");
    // A third of the answers lost after their commit, as the reviewer's run had it.
    let faults = Arc::new(Faults::new(0.3, 0.0, Duration::ZERO, 7));
    let payments = service(&db, &config, mode, Arc::clone(&faults), &format!("{run}-"))
        .expect("the payments service");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("an address");
    let server = tokio::spawn(serve(listener, payments, std::future::pending()));

    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let client = manifest.join("tests/grpc_js/hedging_client.js");
    let mut node = Command::new("node");
    node.arg(&client)
        .arg(addr.to_string())
        .arg(manifest.join("proto"))
        .arg(manifest.join("../grpc-policy/proto"))
        .arg(run)
        .arg(PAYMENTS.to_string())
        .arg("8");
    let output = tokio::task::spawn_blocking(move || {
        node.env("NODE_PATH", grpc_js().join("node_modules"))
            .output()
    })
    .await
    .expect("the client's thread")
    .expect("node runs (install Node.js)");
    server.abort();
    assert!(
        output.status.success(),
        "the grpc-js client failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("the client's JSON report");
    eprintln!(
        "grpc-js hedging, {mode:?}: first pass {}",
        report["firstPass"]
    );
    let first_pass = report["firstPass"]
        .as_object()
        .expect("first-pass outcomes");
    for (outcome, calls) in first_pass {
        assert!(
            outcome == "OK" || outcome == "UNAVAILABLE",
            "{mode:?}: {calls} hedged calls ended {outcome} on their first pass (only a call whose \
             three answers were all lost may fail, UNAVAILABLE): {report}"
        );
    }
    let acknowledged = report["paymentIds"].as_object().expect("payment ids");
    assert_eq!(
        acknowledged.len(),
        PAYMENTS,
        "every payment settled: {report}"
    );
    for index in 0..PAYMENTS {
        let account = format!("js-{run}-{index}");
        assert_eq!(rows_of(&db, &account).await, 1, "{account} exists once");
    }
    assert!(
        faults.dropped.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "answers were lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_js_hedged_payments_end_with_the_payment_under_claim_first() {
    let run = format!("cf{}", std::process::id());
    hedged_payments(GuardMode::ClaimFirst, &run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_js_hedged_payments_end_with_the_payment_under_claim_committed_first() {
    let run = format!("ccf{}", std::process::id());
    hedged_payments(GuardMode::ClaimCommittedFirst, &run).await;
}
