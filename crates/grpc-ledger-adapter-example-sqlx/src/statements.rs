//! Every statement the adapter sends, by name, written out for reviewers (and, in a
//! `sql-mutants` build for `cargo xtask mutants sql` only, one of them replaced by a mutant).

/// The store's clock in milliseconds since the epoch: leases are judged by it, never the caller's.
macro_rules! now {
    () => {
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    };
}

/// Claim: an insert that can only insert. The fresh version is the store's clock shifted by
/// `Version::CLAIM_TIME_SHIFT` plus a random salt, so it never repeats for an identity, even after
/// a purge (case `stale_owner_cannot_complete_a_claim_made_after_purge`).
pub(crate) const CLAIM: &str = concat!(
    "INSERT INTO sqlx_ledger (caller, method, key_hash, request_fingerprint, state, version, \
     claimed_at, lease_expires_at) \
     SELECT $1, $2, $3, $4, 'IN_PROGRESS', clock.now * $6 + $7, clock.now, clock.now + $5 \
     FROM (SELECT ",
    now!(),
    " AS now) AS clock \
     ON CONFLICT (caller, method, key_hash) DO NOTHING RETURNING version"
);

pub(crate) const SELECT: &str = concat!(
    "SELECT request_fingerprint, state, version, claimed_at, lease_expires_at, completed_at, \
     outcome_reference, failure_code, failure_message, failure_details, ",
    now!(),
    " AS db_now FROM sqlx_ledger WHERE caller = $1 AND method = $2 AND key_hash = $3"
);

/// A takeover, conditional on the version read and on the lease having run out by the store's
/// clock (cases `contended_claims_never_hand_a_version_twice` and `..._in_units_...`).
pub(crate) const TAKE_OVER: &str = concat!(
    "UPDATE sqlx_ledger SET version = version + 1, claimed_at = ",
    now!(),
    ", lease_expires_at = ",
    now!(),
    " + $5 WHERE caller = $1 AND method = $2 AND key_hash = $3 \
     AND state = 'IN_PROGRESS' AND version = $4 AND lease_expires_at <= ",
    now!()
);

pub(crate) const MARK_COMMITTED: &str = concat!(
    "UPDATE sqlx_ledger SET state = 'COMMITTED', version = version + 1, completed_at = ",
    now!(),
    ", outcome_reference = $5 WHERE caller = $1 AND method = $2 AND key_hash = $3 \
     AND state = 'IN_PROGRESS' AND version = $4"
);

pub(crate) const MARK_FAILED: &str = concat!(
    "UPDATE sqlx_ledger SET state = 'FAILED_TERMINAL', version = version + 1, completed_at = ",
    now!(),
    ", failure_code = $5, failure_message = $6, failure_details = $7 \
     WHERE caller = $1 AND method = $2 AND key_hash = $3 AND state = 'IN_PROGRESS' AND version = $4"
);

/// The owner keeps its lease alive: only at its version, only in progress, and the version stays
/// (cases `renewed_lease_keeps_its_owner_and_version`, `renewal_of_a_lost_claim_is_refused`).
pub(crate) const RENEW_LEASE: &str = concat!(
    "UPDATE sqlx_ledger SET lease_expires_at = ",
    now!(),
    " + $5 WHERE caller = $1 AND method = $2 AND key_hash = $3 \
     AND state = 'IN_PROGRESS' AND version = $4"
);

/// The counts a census answers, in one read by the store's clock (case
/// `census_counts_by_the_stores_clock`).
pub(crate) const CENSUS: &str = concat!(
    "SELECT COUNT(*) FILTER (WHERE state = 'IN_PROGRESS'), \
     COUNT(*) FILTER (WHERE state = 'IN_PROGRESS' AND lease_expires_at <= ",
    now!(),
    "), ",
    now!(),
    " - MIN(claimed_at) FILTER (WHERE state = 'IN_PROGRESS'), \
     COUNT(*) FILTER (WHERE state <> 'IN_PROGRESS' AND completed_at < ",
    now!(),
    " - $1) FROM sqlx_ledger"
);

pub(crate) const PURGE: &str = concat!(
    "DELETE FROM sqlx_ledger WHERE (caller, method, key_hash) IN (\
     SELECT caller, method, key_hash FROM sqlx_ledger WHERE state <> 'IN_PROGRESS' \
     AND completed_at < ",
    now!(),
    " - $1 LIMIT $2)"
);

/// Every statement the ledger sends, by a stable name (the mutation report's).
pub const SENT: [(&str, &str); 8] = [
    ("claim", CLAIM),
    ("read with the store's clock", SELECT),
    ("take over", TAKE_OVER),
    ("mark committed", MARK_COMMITTED),
    ("mark failed", MARK_FAILED),
    ("renew lease", RENEW_LEASE),
    ("census", CENSUS),
    ("purge", PURGE),
];

/// The statement `text` (one of [`SENT`]) as this process sends it: itself, or in a
/// `sql-mutants` build the mutant the environment names for it.
pub(crate) fn sql(text: &'static str) -> &'static str {
    #[cfg(feature = "sql-mutants")]
    if let Some((name, mutant)) = mutant()
        && SENT.iter().any(|(n, t)| *n == name && *t == text)
    {
        return mutant;
    }
    text
}

/// The mutant `GRPC_LEDGER_SQL_MUTANT` names: a file whose first line is
/// `postgres\t<statement name>` and whose rest is the statement's replacement.
#[cfg(feature = "sql-mutants")]
fn mutant() -> Option<(&'static str, &'static str)> {
    static MUTANT: std::sync::OnceLock<Option<(&'static str, &'static str)>> =
        std::sync::OnceLock::new();
    *MUTANT.get_or_init(|| {
        let path = std::env::var("GRPC_LEDGER_SQL_MUTANT").ok()?;
        let text = std::fs::read_to_string(&path).expect("the mutant's file");
        let (header, template) = text.split_once('\n').expect("a header line");
        let name = header
            .strip_prefix("postgres\t")
            .expect("a PostgreSQL mutant");
        assert!(SENT.iter().any(|(n, _)| *n == name), "no statement {name}");
        Some((
            Box::leak(name.to_owned().into_boxed_str()),
            Box::leak(template.to_owned().into_boxed_str()),
        ))
    })
}

/// The checks of a statement's result the adapter relies on, which a mutant may ignore.
pub const CHECKS: [&str; 2] = ["transition changed one row", "takeover changed one row"];

/// Whether this process ignores `check` (in a `sql-mutants` build told so by
/// `GRPC_LEDGER_CHECK_MUTANT`; never otherwise).
pub(crate) fn ignores(check: &str) -> bool {
    debug_assert!(CHECKS.contains(&check));
    cfg!(feature = "sql-mutants")
        && std::env::var("GRPC_LEDGER_CHECK_MUTANT").is_ok_and(|ignored| ignored == check)
}
