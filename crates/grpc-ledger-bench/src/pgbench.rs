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
    let commit = adapter_statement(DbBackend::Postgres, "mark committed")?;
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

/// The table `replay_at_the_store` fills with the number, digest and business key of each row
/// the replay reads, so that both of pgbench's scripts look the row's keys up by number first,
/// alike, and the timed read takes the digest as a parameter, as the adapter sends it (the
/// identities were written by the adapter; hashing them again in the timed statement would add
/// work the adapter's read does not do).
pub(crate) const REPLAY_KEYS_TABLE: &str = "bench_replay_keys";

/// pgbench's two reads of a committed operation, each after the same look-up of the row's keys in
/// [`REPLAY_KEYS_TABLE`]: the ledger's read of a resend as the adapter sends it (its statement
/// named "read", which `find` runs), and the plain primary-key read of the business table (the
/// replay's baseline).
pub(crate) fn pgbench_replay_scripts(rows: usize) -> Result<[String; 2]> {
    let ledger_read = adapter_statement(DbBackend::Postgres, "read")?;
    let look_up = format!(
        "\\set n random(1, {rows})\nSELECT identity_digest AS digest, business_key \
         FROM {REPLAY_KEYS_TABLE} WHERE n = :n \\gset\n"
    );
    Ok([
        format!("{look_up}{};\n", ledger_read.replace("$1", ":digest")),
        format!("{look_up}{};\n", PLAIN_READ.replace("$1", ":business_key")),
    ])
}

/// What one pgbench run measured.
pub(crate) struct PgbenchRun {
    pub(crate) tps: f64,
    /// The mean latency of a transaction of the script, in ms; of its last statement alone for a
    /// run of [`pgbench_last_statement`].
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
    let (report, cpu) = run_pgbench(url, script, clients, seconds, dir, &[])?;
    totals(&report, cpu)
}

/// One client's run of `script` for `seconds`, with the mean latency that of the script's last
/// statement alone (pgbench's per-statement report, `-r`): a statement timed on its own in a
/// script that needs another before it.
pub(crate) fn pgbench_last_statement(
    url: &str,
    script: &str,
    seconds: Duration,
    dir: &Path,
) -> Result<PgbenchRun> {
    let (report, cpu) = run_pgbench(url, script, 1, seconds, dir, &["-r"])?;
    let mean_ms = last_statement_latency(&report)
        .with_context(|| format!("no latency for the script's last statement: {report}"))?;
    Ok(PgbenchRun {
        mean_ms,
        ..totals(&report, cpu)?
    })
}

/// The run's totals as pgbench printed them.
fn totals(report: &str, cpu: Duration) -> Result<PgbenchRun> {
    let number = |prefix: &str| {
        report
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|rest| rest.split(|c: char| c.is_whitespace() || c == '/').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    match (
        number("tps = "),
        number("latency average = "),
        number("number of transactions actually processed: "),
    ) {
        (Some(tps), Some(mean_ms), Some(transactions)) => Ok(PgbenchRun {
            tps,
            mean_ms,
            transactions,
            cpu,
        }),
        _ => bail!("pgbench printed no rate: {report}"),
    }
}

/// From pgbench's per-statement report, the latency of its last statement. Each line of the
/// report is the mean latency in ms, then (since PostgreSQL 15) the failures, then the
/// statement's text, cut short when it is long, so the statement is found by its place.
fn last_statement_latency(report: &str) -> Option<f64> {
    report
        .lines()
        .skip_while(|line| !line.starts_with("statement latencies in milliseconds"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .last()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Runs pgbench with `extra` arguments on `script` and waits for it: what it printed on its
/// standard output (its standard error goes to ours), and its CPU time. Fails unless it exited
/// cleanly, since pgbench still prints a rate when some of its clients aborted on an error, and
/// only a clean exit says every transaction of the script ran as written.
fn run_pgbench(
    url: &str,
    script: &str,
    clients: usize,
    seconds: Duration,
    dir: &Path,
    extra: &[&str],
) -> Result<(String, Duration)> {
    // Named for this process and this run of it: two runs at once must not share a script.
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = dir.join(format!("script-{}-{run}.sql", std::process::id()));
    let cpu_before = CpuTimes::now()?;
    std::fs::write(&file, script)?;
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
        .args(extra)
        .args(["-T", &seconds.as_secs().max(1).to_string(), "-f"])
        .arg(&file)
        .output();
    // Removed before anything else can fail, so that no run leaves its script behind; a script
    // that cannot be removed does not make the run's figures wrong, so it is only reported.
    if let Err(error) = std::fs::remove_file(&file) {
        eprintln!("pgbench: could not remove {}: {error}", file.display());
    }
    let output = output.context("running pgbench")?;
    let cpu = CpuTimes::now()?.since(cpu_before).children;
    let (report, errors) = (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr),
    );
    if !output.status.success() {
        bail!("pgbench failed: {report}{errors}");
    }
    if !errors.trim().is_empty() {
        eprintln!("pgbench: {}", errors.trim());
    }
    Ok((report, cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PostgreSQL 15's report, as `pgbench -r` prints it after the run's totals.
    const REPORT: &str = "\
latency average = 0.171 ms
initial connection time = 3.115 ms
tps = 5842.209377 (without initial connection time)
statement latencies in milliseconds and failures:
         0.001           0  \\set n random(1, 500)
         0.071           0  SELECT identity_digest AS digest, business_key FROM bench_replay_keys WHERE n = :n \\gset
         0.094           0  SELECT business_key, amount FROM bench_business WHERE business_key = :business_key;
";

    #[test]
    fn the_last_statements_latency_is_read_from_the_report() {
        assert_eq!(last_statement_latency(REPORT), Some(0.094));
        assert_eq!(last_statement_latency(&format!("{REPORT}\n")), Some(0.094));
        // Without the per-statement report (a run without `-r`) there is none.
        let totals = REPORT.split("statement latencies").next().unwrap();
        assert_eq!(last_statement_latency(totals), None);
    }

    #[test]
    fn both_replay_scripts_look_the_row_up_alike_and_read_it_by_its_key() {
        let [ledger, business] = pgbench_replay_scripts(500).unwrap();
        let look_up = |script: &str| script.lines().take(2).collect::<Vec<_>>().join("\n");
        assert_eq!(look_up(&ledger), look_up(&business));
        let read = adapter_statement(DbBackend::Postgres, "read").unwrap();
        assert!(read.contains("WHERE identity_digest = $1"), "{read}");
        assert!(
            adapter_statement(DbBackend::Postgres, "no such statement").is_err(),
            "a name the adapter does not have is an error, not another statement"
        );
        assert!(ledger.ends_with(&format!("{};\n", read.replace("$1", ":digest"))));
        assert!(
            !ledger.contains("db_now"),
            "the read without the store's clock, as `find`'s"
        );
        assert!(business.contains("FROM bench_business WHERE business_key = :business_key;"));
        assert!(!ledger.contains('$') && !business.contains('$'));
    }
}
