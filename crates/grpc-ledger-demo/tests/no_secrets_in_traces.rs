//! A full demo run with every tracing event recorded, at every level and from every crate: no
//! idempotency key appears anywhere, and no request body appears in this workspace's events or in
//! any event at INFO or above.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_ledger_demo::{ClientOptions, ClientRetries, FaultOptions, run_demo};
use grpc_ledger_payments::Store;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_demo_run_traces_no_key_and_no_request_body() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_target(true)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .expect("the only subscriber of this test binary");

    // Both retry owners: the RetryLayer's decisions and the executor's.
    let runs = [
        ("tracechannel", ClientRetries::Channel),
        ("traceapplication", ClientRetries::Application),
    ];
    for (run_id, retries) in runs {
        let client = ClientOptions {
            payments: 150,
            concurrency: 8,
            deadline: Duration::from_secs(3),
            changed_body_every: 10,
            run_id: run_id.to_owned(),
            progress: false,
            retries,
            tls: None,
        };
        let file =
            std::env::temp_dir().join(format!("demo-{run_id}-{}.sqlite", std::process::id()));
        let report = run_demo(
            &Store::Sqlite(file.clone()),
            FaultOptions {
                drop_rate: 0.4,
                delay_rate: 0.05,
            },
            &client,
        )
        .await
        .unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
        assert!(report.reconciled(), "{report}");
    }

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains("retry decision")),
        "the retry decisions were traced ({} lines captured)",
        lines.len()
    );
    for (run_id, _) in runs {
        eprintln!(
            "captured {} trace lines; {} mention a request body",
            lines.len(),
            lines
                .iter()
                .filter(|l| l.contains(&format!("acct-{run_id}-")))
                .count()
        );
        let key_marker = format!("{run_id}-order-");
        let leaked_keys: Vec<&&str> = lines.iter().filter(|l| l.contains(&key_marker)).collect();
        assert!(
            leaked_keys.is_empty(),
            "idempotency keys in traces:\n{}",
            leaked_keys
                .iter()
                .take(5)
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
        let body_marker = format!("acct-{run_id}-");
        let ours_or_loud = |line: &&&str| {
            line.contains(" grpc_")
                || [" INFO ", " WARN ", " ERROR "]
                    .iter()
                    .any(|level| line.contains(level))
        };
        let leaked_bodies: Vec<&&str> = lines
            .iter()
            .filter(|l| l.contains(&body_marker))
            .filter(ours_or_loud)
            .collect();
        assert!(
            leaked_bodies.is_empty(),
            "request bodies in traces:\n{}",
            leaked_bodies
                .iter()
                .take(5)
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
