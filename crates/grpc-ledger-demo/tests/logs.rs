//! The reference server's logs, read as an operator reads them: the demo binary run at `trace`
//! (every crate, every level) through lost responses and resends prints the refused and replayed
//! calls with their method and caller, and never a key, the client's token or a secret, in its
//! output or in the store's files.

use std::process::Command;

#[test]
fn a_run_at_trace_logs_replays_and_refusals_and_no_key_token_or_secret() {
    let file = std::env::temp_dir().join(format!("demo-logs-{}.sqlite", std::process::id()));
    let mut run_ids = Vec::new();
    for json in [false, true] {
        let run_id = format!("logmark{json}{}", std::process::id());
        run_ids.push(run_id.clone());
        let mut command = Command::new(env!("CARGO_BIN_EXE_grpc-ledger-demo"));
        command
            .args([
                "--payments",
                "150",
                "--concurrency",
                "8",
                "--drop-rate",
                "0.4",
            ])
            .args(["--changed-body-every", "10", "--retries", "channel"])
            .args(["--run-id", &run_id])
            .arg("--sqlite")
            .arg(&file)
            .env("RUST_LOG", "trace");
        if json {
            command.arg("--log-json");
        }
        let out = command.output().expect("the demo runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let logs: Vec<&str> = stderr.lines().collect();
        let replayed = logs
            .iter()
            .filter(|l| l.contains("replaying a finished operation"))
            .count();
        let refused = logs
            .iter()
            .filter(|l| l.contains("refused before the handler"))
            .count();
        assert!(
            replayed > 10,
            "replays logged: {replayed} of {} lines",
            logs.len()
        );
        assert!(
            refused > 0,
            "refusals (changed bodies) logged: {} lines",
            logs.len()
        );
        let event = logs
            .iter()
            .find(|l| l.contains("replaying a finished operation"))
            .unwrap();
        assert!(
            event.contains("CreatePayment") && event.contains("caller"),
            "{event}"
        );
        if json {
            let parsed: serde_json::Value = serde_json::from_str(event).expect("a JSON line");
            assert_eq!(
                parsed["fields"]["message"], "replaying a finished operation",
                "{event}"
            );
        }
        for printed in [&stdout, &stderr] {
            assert!(
                !printed.contains(&format!("{run_id}-order-")),
                "a key was logged"
            );
            assert!(
                !printed.contains("demo-client-token"),
                "the client's token was logged"
            );
            assert!(
                !printed.contains("demo-server-secret"),
                "the key secret was logged"
            );
        }
    }
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", file.display());
        if let Ok(bytes) = std::fs::read(&path) {
            let text = String::from_utf8_lossy(&bytes);
            for run_id in &run_ids {
                assert!(
                    !text.contains(&format!("{run_id}-order-")),
                    "a key is stored in {path}"
                );
            }
            assert!(
                !text.contains("demo-client-token"),
                "the token is stored in {path}"
            );
        }
        let _ = std::fs::remove_file(&path);
    }
}
