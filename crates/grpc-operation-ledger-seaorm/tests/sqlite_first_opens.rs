//! Several *processes* opening one new SQLite file at once all start, migrate and work: each
//! child is this test binary run again with `--child <path>`, so every open is a real process
//! with its own connections, as replicas of a service starting together are.

use std::process::{Command, ExitCode};
use std::time::Duration;

use grpc_core_api::{
    CallerFingerprint, ClaimOutcome, GrpcMethod, GrpcOperationIdentity, GrpcOperationLedger,
    IdempotencyKey, KeyHasher, LeaseDuration, OutcomeReference, RequestFingerprint,
};
use grpc_operation_ledger_seaorm::{LedgerConfig, SeaOrmOperationLedger, open_sqlite};
use sea_orm::{ConnectionTrait, Statement};

const PROCESSES: usize = 40;
const ROUNDS: usize = 3;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|arg| arg == "--child") {
        return child(&args[at + 1], &args[at + 2]);
    }
    // `cargo test --list` and filters that leave this test out: say so and stop.
    if args.iter().any(|arg| arg == "--list") {
        println!("concurrent_first_opens_from_processes: test");
        return ExitCode::SUCCESS;
    }
    parent()
}

/// Opens `path`, claims and commits the identity `key`, and exits 0; on any error prints it and
/// exits 1.
fn child(path: &str, key: &str) -> ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let outcome = runtime.block_on(async {
        // A short busy timeout, so that processes meet the file locked before it applies.
        let config = LedgerConfig::default().with_claim_wait(Duration::from_millis(5));
        let db = open_sqlite(path.as_ref(), &config)
            .await
            .map_err(|error| format!("open: {error}"))?;
        let ledger = SeaOrmOperationLedger::new(&db).with_claim_wait(config.claim_wait);
        let id = GrpcOperationIdentity::new(
            CallerFingerprint::parse("tenant-a").expect("caller"),
            GrpcMethod::parse("/payments.v1.Payments/CreatePayment").expect("method"),
            KeyHasher::Sha256.hash(&IdempotencyKey::parse(key).expect("key")),
        );
        let lease = LeaseDuration::new(Duration::from_secs(30)).expect("lease");
        // The store is busy while the other processes migrate: a claim may be refused as busy
        // and is tried again, as a caller would.
        for _ in 0..200 {
            match ledger
                .claim(&id, &RequestFingerprint::of(b"x"), lease)
                .await
            {
                Ok(ClaimOutcome::Claimed { version, .. }) => {
                    let outcome = OutcomeReference::parse(key).expect("outcome");
                    for _ in 0..200 {
                        match ledger.mark_committed(&id, version, &outcome).await {
                            Ok(_) => {
                                db.close()
                                    .await
                                    .map_err(|error| format!("close: {error}"))?;
                                return Ok(());
                            }
                            Err(error) if error.is_transient() => {
                                tokio::time::sleep(Duration::from_millis(25)).await;
                            }
                            Err(error) => return Err(format!("commit: {error}")),
                        }
                    }
                    return Err("commit: still busy after 200 tries".to_owned());
                }
                Err(error) if error.is_transient() => {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                other => return Err(format!("claim: {other:?}")),
            }
        }
        Err("claim: still busy after 200 tries".to_owned())
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("child {key}: {error}");
            ExitCode::FAILURE
        }
    }
}

fn parent() -> ExitCode {
    let exe = std::env::current_exe().expect("the test binary");
    let mut failures = Vec::new();
    for round in 0..ROUNDS {
        let path = std::env::temp_dir().join(format!(
            "ledger_first_opens_{}_{round}.sqlite",
            std::process::id()
        ));
        let children: Vec<_> = (0..PROCESSES)
            .map(|n| {
                Command::new(&exe)
                    .arg("--child")
                    .arg(&path)
                    .arg(format!("process-{n}"))
                    .spawn()
                    .expect("start a child process")
            })
            .collect();
        for (n, child) in children.into_iter().enumerate() {
            let status = child.wait_with_output().expect("a child's exit").status;
            if !status.success() {
                failures.push(format!("round {round}: process {n} exited with {status}"));
            }
        }
        let rows = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(async {
                let db = open_sqlite(&path, &LedgerConfig::default())
                    .await
                    .expect("open the file the children made");
                let row = db
                    .query_one_raw(Statement::from_string(
                        db.get_database_backend(),
                        "SELECT COUNT(*) FROM grpc_operation_ledger WHERE state = 'COMMITTED'",
                    ))
                    .await
                    .expect("count")
                    .expect("a row");
                db.close().await.expect("close");
                row.try_get_by_index::<i64>(0).expect("a count")
            });
        if rows != PROCESSES as i64 {
            failures.push(format!(
                "round {round}: {rows} committed operations, expected {PROCESSES}"
            ));
        }
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
    }
    if failures.is_empty() {
        println!(
            "test concurrent_first_opens_from_processes ... ok ({ROUNDS} rounds of {PROCESSES} processes)"
        );
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "test concurrent_first_opens_from_processes ... FAILED\n{}",
            failures.join("\n")
        );
        ExitCode::FAILURE
    }
}
