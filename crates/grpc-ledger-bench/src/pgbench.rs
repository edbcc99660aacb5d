//! The adapter's exact statements run by pgbench, PostgreSQL's own load generator: the SQL-level
//! ceiling the adapter is compared with.

use super::*;

/// The pgbench of the PostgreSQL that `cargo xtask bench` started (`PG_BIN_DIR`, the directory
/// of its server binaries), else the one on the `PATH`: the same version as the server, found
/// where xtask found it rather than looked up a second time.
pub(crate) fn pgbench_binary() -> std::path::PathBuf {
    match std::env::var_os("PG_BIN_DIR") {
        Some(dir) => Path::new(&dir).join("pgbench"),
        None => "pgbench".into(),
    }
}

/// The adapter's exact statements as a pgbench script, as a guarded call sends them: `BEGIN`, the
/// unit's lock bound, the claim, the business insert, the transition, `END`. Placeholders become
/// SQL expressions of pgbench variables, nothing else changes.
pub(crate) fn pgbench_keyed_script() -> Result<String> {
    pgbench_claim_first_script(Some(&format!(
        "{};\n",
        lock_timeout_statement(LedgerConfig::default().claim_wait)
    )))
}

/// The same statements without the unit's lock bound: what the one statement of ours that
/// pgbench's shape does not need costs at the store.
pub(crate) fn pgbench_keyed_unbounded_script() -> Result<String> {
    pgbench_claim_first_script(None)
}

fn pgbench_claim_first_script(lock_bound: Option<&str>) -> Result<String> {
    let [_, _, _, (_, commit), ..] = statements(DbBackend::Postgres).context("PostgreSQL")?;
    let claim = claim_as_sent(DbBackend::Postgres)
        .context("PostgreSQL")?
        .replace("$8", &format!("'{CLAIM_WAIT_SETTING}'"))
        .replace("$7", ":s")
        .replace("$6", "30000")
        .replace("$5", REQUEST_BYTES)
        .replace("$4", KEY_HASH_BYTES)
        .replace("$3", &format!("'{METHOD}'"))
        .replace("$2", CALLER)
        .replace("$1", &identity_digest());
    // The claim answers `inserted` and the fresh version, with the columns of the row it would
    // have read left NULL; `\gset` keeps each column in a variable, the version in `:version`
    // for the transition.
    let commit = commit
        .replace("$3", "'p-' || :k")
        .replace("$2", ":version")
        .replace("$1", &identity_digest());
    Ok(format!(
        "\\set k random(1, 9000000000000000000)\n\\set c random(0, 7)\n\\set s random(0, 65535)\nBEGIN;\n{}{claim} \\gset\n{};\n{commit};\nEND;\n",
        lock_bound.unwrap_or_default(),
        pgbench_business_statement()
    ))
}

/// pgbench's caller fingerprint: one of eight, 64 characters.
const CALLER: &str = "md5('c' || :c) || md5(:c || 'c')";
/// pgbench's key hash, 64 hex digits, as the store keeps it: 32 bytes.
const KEY_HASH_HEX: &str = "md5(:k || 'a') || md5(:k || 'b')";
const KEY_HASH_BYTES: &str = "decode(md5(:k || 'a') || md5(:k || 'b'), 'hex')";
/// pgbench's request fingerprint, 32 bytes.
const REQUEST_BYTES: &str = "decode(md5('r' || :k) || md5('s' || :k), 'hex')";

/// The identity's digest as the adapter computes it (`GrpcOperationIdentity::storage_digest`),
/// in SQL: the client computes it in the adapter, pgbench in the server.
fn identity_digest() -> String {
    format!("sha256(convert_to({CALLER} || '|' || '{METHOD}' || '|' || {KEY_HASH_HEX}, 'UTF8'))")
}

/// The "faster co-commit" candidate, at SQL level: the business insert, then the ledger row
/// written once, already COMMITTED, at the end of the transaction (a conflict would mean a
/// duplicate: roll back and replay). This is the shape of the adapter's write-once record.
pub(crate) fn pgbench_commit_once_script() -> String {
    format!(
        "\\set k random(1, 9000000000000000000)\n\\set c random(0, 7)\nBEGIN;\n{};\n\
         INSERT INTO grpc_operation_ledger (identity_digest, caller_fingerprint, full_method_name, \
         idempotency_key_hash, request_fingerprint, state, version, claimed_at, lease_expires_at, \
         completed_at, outcome_reference) \
         SELECT {}, {CALLER}, '{METHOD}', {KEY_HASH_BYTES}, {REQUEST_BYTES}, 'COMMITTED', 1, \
         clock.now, clock.now, clock.now, 'p-' || :k \
         FROM (SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT AS now) AS clock WHERE true \
         ON CONFLICT (identity_digest) DO NOTHING;\nEND;\n",
        pgbench_business_statement(),
        identity_digest()
    )
}

pub(crate) fn pgbench_business_statement() -> String {
    BUSINESS_INSERT
        .replace("$1", "'pg-' || :client_id || '-' || :k")
        .replace("$2", "1")
}

pub(crate) fn pgbench_business_script() -> String {
    format!(
        "\\set k random(1, 9000000000000000000)\nBEGIN;\n{};\nEND;\n",
        pgbench_business_statement()
    )
}

/// What one pgbench run measured.
pub(crate) struct PgbenchRun {
    pub(crate) tps: f64,
    pub(crate) mean_ms: f64,
    transactions: f64,
    /// pgbench's own CPU time, all its threads, for the whole run.
    cpu: Duration,
}

impl PgbenchRun {
    /// Several runs of one script taken together: the mean rate, the mean latency weighted by
    /// transactions, and the CPU time of them all.
    pub(crate) fn together(runs: Vec<PgbenchRun>) -> PgbenchRun {
        let n = runs.len().max(1) as f64;
        let transactions: f64 = runs.iter().map(|r| r.transactions).sum();
        let weighted: f64 = runs.iter().map(|r| r.mean_ms * r.transactions).sum();
        PgbenchRun {
            tps: runs.iter().map(|r| r.tps).sum::<f64>() / n,
            mean_ms: weighted / transactions.max(1.0),
            transactions,
            cpu: runs.iter().map(|r| r.cpu).sum(),
        }
    }

    /// pgbench's CPU time for each transaction, in µs.
    pub(crate) fn cpu_us_per_transaction(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.transactions.max(1.0)
    }
}

/// Runs a pgbench script and waits for it.
pub(crate) fn pgbench(
    url: &str,
    script: &str,
    clients: usize,
    seconds: Duration,
    dir: &Path,
) -> Result<PgbenchRun> {
    // Named for this process and this run of it: two runs at once must not share a script.
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = dir.join(format!("script-{}-{run}.sql", std::process::id()));
    std::fs::write(&file, script)?;
    let cpu_before = CpuTimes::now()?;
    let output = Command::new(pgbench_binary())
        .arg(url)
        .args([
            "-n",
            "-M",
            "prepared",
            "-c",
            &clients.to_string(),
            "-j",
            &clients.min(2).to_string(),
        ])
        .args(["-T", &seconds.as_secs().max(1).to_string(), "-f"])
        .arg(&file)
        .output()
        .context("running pgbench")?;
    let cpu = CpuTimes::now()?.since(cpu_before).children;
    let text = String::from_utf8_lossy(&output.stdout);
    let number = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '/').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    // pgbench still prints a rate when some of its clients aborted on an error: only a clean
    // exit says every transaction of the script ran as written.
    let figures = (
        number("tps = "),
        number("latency average = "),
        number("number of transactions actually processed: "),
    );
    match figures {
        (Some(tps), Some(mean_ms), Some(transactions)) if output.status.success() => {
            Ok(PgbenchRun {
                tps,
                mean_ms,
                transactions,
                cpu,
            })
        }
        _ => bail!(
            "pgbench failed: {}{}",
            text,
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}
