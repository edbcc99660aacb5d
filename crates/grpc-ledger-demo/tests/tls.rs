//! The demo's server and client apart over mutual TLS, as a user tries it: `--make-tls-dir`, then
//! `--serve --tls-dir` and `--connect --tls-dir` on one SQLite file. And the flag combinations
//! that would give a false answer are refused with a clear error instead.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

fn demo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_grpc-ledger-demo"))
}

/// A scratch directory of the test's own, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("demo-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The server, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback port.
fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").to_string()
}

/// Starts `--serve` on `addr` with `tls`, and returns once it says it is listening.
fn serve(addr: &str, sqlite: &Path, tls: &Path) -> Server {
    let mut child = demo()
        .args(["--serve", addr, "--tls-dir"])
        .arg(tls)
        .arg("--sqlite")
        .arg(sqlite)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the server");
    let stdout = child.stdout.take().expect("the server's stdout");
    let mut lines = BufReader::new(stdout).lines();
    let listening = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.contains("listening"));
    assert!(listening, "the server never said it was listening");
    // Keep draining its stdout so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Server(child)
}

fn connect(addr: &str, sqlite: &Path, tls: Option<&Path>, run_id: &str) -> Output {
    let mut command = demo();
    command
        .args(["--connect", addr, "--payments", "60", "--run-id", run_id])
        .args(["--drop-rate", "0.3", "--deadline-ms", "3000"])
        .arg("--sqlite")
        .arg(sqlite);
    if let Some(tls) = tls {
        command.arg("--tls-dir").arg(tls);
    }
    command.output().expect("run the client")
}

#[test]
fn server_and_client_apart_over_mutual_tls_reconcile() {
    let scratch = Scratch::new("apart");
    let tls = scratch.0.join("tls");
    let made = demo()
        .arg("--make-tls-dir")
        .arg(&tls)
        .output()
        .expect("make the TLS directory");
    assert!(made.status.success(), "{made:?}");
    // Never overwritten.
    let again = demo()
        .arg("--make-tls-dir")
        .arg(&tls)
        .output()
        .expect("run");
    assert!(
        !again.status.success(),
        "a second --make-tls-dir overwrote the directory"
    );

    let sqlite = scratch.0.join("payments.sqlite");
    let addr = free_addr();
    let _server = serve(&addr, &sqlite, &tls);
    let out = connect(&addr, &sqlite, Some(&tls), "tlsrun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(figure(&stdout, "calls "), Some("60"), "{stdout}");
    let acknowledged: u64 = figure(&stdout, "acknowledged")
        .and_then(|n| n.parse().ok())
        .expect("an acknowledged count");
    assert!(acknowledged >= 50, "{stdout}");
    assert_eq!(figure(&stdout, "duplicates"), Some("0"), "{stdout}");
    assert_eq!(figure(&stdout, "losses"), Some("0"), "{stdout}");

    // A client without the directory speaks plain HTTP/2 to a TLS server: nothing is served,
    // every call fails, and the report says so (no payment acknowledged, none stored).
    let out = connect(&addr, &sqlite, None, "plainrun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(figure(&stdout, "acknowledged"), Some("0"), "{stdout}");
    assert_eq!(
        figure(&stdout, "failed (client saw an error)"),
        Some("60"),
        "{stdout}"
    );
}

/// The figure of the report line that starts with `label`.
fn figure<'a>(report: &'a str, label: &str) -> Option<&'a str> {
    report
        .lines()
        .find(|line| line.starts_with(label))
        .and_then(|line| line.split_whitespace().last())
}

#[test]
fn flags_that_would_give_a_false_answer_are_refused() {
    let scratch = Scratch::new("refused");
    let addr = free_addr();
    // --connect without the server's store would reconcile against an empty file of its own.
    let out = demo()
        .args(["--connect", &addr, "--payments", "5"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--sqlite FILE"), "{stderr}");
    // --tls-dir on a whole run in one process secures nothing.
    let out = demo()
        .arg("--tls-dir")
        .arg(&scratch.0)
        .args(["--payments", "5"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--tls-dir"), "{stderr}");
    // A TLS directory without its files says which are missing and how to make them.
    let out = demo()
        .args(["--serve", &addr, "--tls-dir"])
        .arg(&scratch.0)
        .arg("--sqlite")
        .arg(scratch.0.join("s.sqlite"))
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--make-tls-dir"), "{stderr}");
}
