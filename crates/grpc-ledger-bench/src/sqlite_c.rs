//! SQLite's own limit for the ledger's shape: the adapter's statements run through the C library
//! with nothing of ours in between (Python's `sqlite3` module, a thin C wrapper that prepares each
//! statement once and keeps it), on a file with the adapter's settings, next to the business
//! insert alone through the same library. What pgbench is for PostgreSQL.

use super::*;

/// The Python program: `python3 - FILE STATEMENTS.json MODE SECONDS` prints the operations per
/// second of MODE (`business` or `keyed`), one writer, for SECONDS.
///
/// The keyed unit is the guard's: `BEGIN IMMEDIATE`, the claim (its digest computed in the
/// client as the adapter computes it), the business insert, the transition, `COMMIT`. The
/// business unit is `business_op`'s: `BEGIN`, the insert, `COMMIT`.
const PROGRAM: &str = r#"
import hashlib, json, sqlite3, sys, time
path, statements, mode, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sql = json.load(open(statements))
db = sqlite3.connect(path, isolation_level=None, cached_statements=16)
for pragma in ("journal_mode=WAL", "synchronous=FULL", "busy_timeout=2000", "foreign_keys=ON"):
    db.execute("PRAGMA " + pragma)
caller = hashlib.sha256(b"caller-0").hexdigest()
method = sql["method"]
done, started = 0, time.perf_counter()
while time.perf_counter() - started < seconds:
    key = "%s-%d" % (mode, done)
    if mode == "business":
        db.execute("BEGIN")
        db.execute(sql["business"], (key, 1))
        db.execute("COMMIT")
    else:
        key_hash = hashlib.sha256(key.encode()).digest()
        digest = hashlib.sha256(("%s|%s|%s" % (caller, method, key_hash.hex())).encode()).digest()
        request = hashlib.sha256(key.encode()).digest()
        db.execute("BEGIN IMMEDIATE")
        version = db.execute(sql["claim"], (digest, caller, method, key_hash, request, 30000, 7)).fetchone()[0]
        db.execute(sql["business"], (key, 1))
        if db.execute(sql["commit"], (digest, version, key)).rowcount != 1:
            raise SystemExit("the transition changed no row")
        db.execute("COMMIT")
    done += 1
print(done / (time.perf_counter() - started))
"#;

/// SQLite's clock in the adapter's statements needs 3.42 (`unixepoch('subsec')`); the Python on
/// these machines links the system's 3.40, so the C run reads the same milliseconds this way.
const CLOCK_BEFORE_3_42: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// Operations per second of the business insert alone and of the keyed unit, through the C
/// library on a fresh ledger file of the adapter's (migrated by `open_sqlite`), one writer each.
pub(crate) async fn c_library_limit(seconds: Duration) -> Result<(f64, f64)> {
    let dir = std::env::temp_dir();
    let file = dir.join(format!("ledger-bench-c-{}.sqlite", std::process::id()));
    let db = open_sqlite(&file, &LedgerConfig::default()).await?;
    db.execute_unprepared(BUSINESS_TABLE).await?;
    db.close().await?;
    let claim = adapter_statement(DbBackend::Sqlite, "claim")?;
    let commit = adapter_statement(DbBackend::Sqlite, "mark committed")?;
    let adapter_clock = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
    if !claim.contains(adapter_clock) {
        bail!("the adapter's SQLite clock changed; update CLOCK_BEFORE_3_42");
    }
    let statements_file = dir.join(format!("ledger-bench-c-{}.json", std::process::id()));
    std::fs::write(
        &statements_file,
        serde_json::json!({
            "claim": claim.replace(adapter_clock, CLOCK_BEFORE_3_42),
            "commit": commit.replace(adapter_clock, CLOCK_BEFORE_3_42),
            "business": in_dialect(DbBackend::Sqlite, BUSINESS_INSERT).context("SQLite")?,
            "method": METHOD,
        })
        .to_string(),
    )?;
    let run = |mode: &str| -> Result<f64> {
        let mut child = Command::new("python3")
            .arg("-")
            .arg(&file)
            .arg(&statements_file)
            .arg(mode)
            .arg(seconds.as_secs_f64().to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("running python3 (the SQLite C library's limit)")?;
        use std::io::Write as _;
        child
            .stdin
            .take()
            .context("python3's input")?
            .write_all(PROGRAM.as_bytes())?;
        let output = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.trim().parse::<f64>().with_context(|| {
            format!(
                "the SQLite C run ({mode}) failed: {text}{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
    };
    let measured = run("business").and_then(|business| Ok((business, run("keyed")?)));
    remove_sqlite_file(&file);
    let _ = std::fs::remove_file(&statements_file);
    measured
}
