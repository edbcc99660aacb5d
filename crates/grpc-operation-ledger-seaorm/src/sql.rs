//! Every statement the adapter sends, written out so that reviewers and tests can read them.
//!
//! Templates use `$N` placeholders and a `{now}` token. [`Sql::for_backend`] turns them into the
//! store's dialect: `?N` placeholders for SQLite, and the database's own clock in milliseconds
//! since the Unix epoch for `{now}` (lease expiry is judged by the store's clock, never the
//! caller's). Every value is bound; nothing from a request is ever spliced into SQL text.

use std::sync::OnceLock;

use sea_orm::DbBackend;

/// The identity condition shared by every statement that names one row.
macro_rules! identity_condition {
    () => {
        "caller_fingerprint = $1 AND full_method_name = $2 AND idempotency_key_hash = $3"
    };
}

/// Claim: one insert that can only insert. `$4` request fingerprint, `$5` lease in ms, `$6` the
/// version's random salt. The fresh version is the store's clock shifted left by 20 bits plus the
/// salt (`Version::fresh`), so it never repeats for an identity; it is returned only when the row
/// was inserted. On PostgreSQL `{wait_bound}` also sets `lock_timeout` to `$7` for the rest of the
/// transaction, before the insert can wait behind another unit's uncommitted claim: the bound
/// travels with the statement, so a connection pooler that drops startup parameters or hands
/// out another server connection cannot lose it. (SQLite needs the `WHERE true` to tell the
/// SELECT's end from the ON CONFLICT clause.)
const CLAIM_INSERT: &str = "INSERT INTO grpc_operation_ledger \
    (caller_fingerprint, full_method_name, idempotency_key_hash, request_fingerprint, \
     state, version, claimed_at, lease_expires_at) \
    SELECT $1, $2, $3, $4, 'IN_PROGRESS', clock.now * 1048576 + $6, clock.now, clock.now + $5 \
    FROM (SELECT {now} AS now{wait_bound}) AS clock WHERE true \
    ON CONFLICT (caller_fingerprint, full_method_name, idempotency_key_hash) DO NOTHING \
    RETURNING version";

/// PostgreSQL: `lock_timeout` for the current transaction, evaluated before the insert (a volatile
/// function in the subquery's output is never optimised away).
const POSTGRES_WAIT_BOUND: &str = ", set_config('lock_timeout', $7, true) AS wait_bound";

/// The row of one identity, with the store's clock.
const SELECT_RECORD: &str = concat!(
    "SELECT request_fingerprint, state, version, claimed_at, lease_expires_at, completed_at, \
     outcome_reference, failure_code, failure_message, failure_details, {now} AS db_now \
     FROM grpc_operation_ledger WHERE ",
    identity_condition!()
);

/// Fenced takeover of an expired lease: only from the version that was read, and only if the
/// lease is still expired by the store's clock. `$4` old version, `$5` lease in ms.
const TAKE_OVER: &str = concat!(
    "UPDATE grpc_operation_ledger SET version = version + 1, claimed_at = {now}, \
     lease_expires_at = {now} + $5 WHERE ",
    identity_condition!(),
    " AND state = 'IN_PROGRESS' AND version = $4 AND lease_expires_at <= {now}"
);

/// Transition to COMMITTED. `$4` owner's version, `$5` outcome reference.
const MARK_COMMITTED: &str = concat!(
    "UPDATE grpc_operation_ledger SET state = 'COMMITTED', version = version + 1, \
     completed_at = {now}, outcome_reference = $5 WHERE ",
    identity_condition!(),
    " AND state = 'IN_PROGRESS' AND version = $4"
);

/// Transition to FAILED_TERMINAL. `$4` owner's version, `$5` status code, `$6` message, `$7` the
/// status's binary details.
const MARK_FAILED: &str = concat!(
    "UPDATE grpc_operation_ledger SET state = 'FAILED_TERMINAL', version = version + 1, \
     completed_at = {now}, failure_code = $5, failure_message = $6, failure_details = $7 WHERE ",
    identity_condition!(),
    " AND state = 'IN_PROGRESS' AND version = $4"
);

/// Deletes at most `$2` finished rows completed more than `$1` ms ago by the store's clock.
/// `claimed_at <= completed_at` always holds, so the condition on `claimed_at` lets its index find
/// the candidates.
const PURGE: &str = "DELETE FROM grpc_operation_ledger \
    WHERE (caller_fingerprint, full_method_name, idempotency_key_hash) IN ( \
    SELECT caller_fingerprint, full_method_name, idempotency_key_hash \
    FROM grpc_operation_ledger, (SELECT {now} - $1 AS cutoff) AS clock \
    WHERE claimed_at < clock.cutoff AND completed_at < clock.cutoff \
    AND state <> 'IN_PROGRESS' LIMIT $2)";

const POSTGRES_NOW: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";
const SQLITE_NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// The statements in one store's dialect.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) claim_insert: String,
    pub(crate) select_record: String,
    pub(crate) take_over: String,
    pub(crate) mark_committed: String,
    pub(crate) mark_failed: String,
    pub(crate) purge: String,
}

impl Sql {
    /// The statements for `backend`, or `None` for a store the ledger does not support.
    pub(crate) fn for_backend(backend: DbBackend) -> Option<&'static Self> {
        static POSTGRES: OnceLock<Sql> = OnceLock::new();
        static SQLITE: OnceLock<Sql> = OnceLock::new();
        match backend {
            DbBackend::Postgres => {
                Some(POSTGRES.get_or_init(|| Self::build(POSTGRES_NOW, POSTGRES_WAIT_BOUND, false)))
            }
            DbBackend::Sqlite => Some(SQLITE.get_or_init(|| Self::build(SQLITE_NOW, "", true))),
            _ => None,
        }
    }

    fn build(now: &str, wait_bound: &str, question_placeholders: bool) -> Self {
        let render = |template: &str| {
            let text = template
                .replace("{now}", now)
                .replace("{wait_bound}", wait_bound);
            if question_placeholders {
                // `$N` is a named parameter in SQLite; `?N` is its positional form.
                text.replace('$', "?")
            } else {
                text
            }
        };
        Self {
            claim_insert: render(CLAIM_INSERT),
            select_record: render(SELECT_RECORD),
            take_over: render(TAKE_OVER),
            mark_committed: render(MARK_COMMITTED),
            mark_failed: render(MARK_FAILED),
            purge: render(PURGE),
        }
    }
}

/// Every statement the adapter sends on `backend`, by name, for readers and benchmarks that must
/// run exactly the same SQL; `None` for a store the ledger does not support.
pub fn statements(backend: DbBackend) -> Option<[(&'static str, &'static str); 6]> {
    let sql = Sql::for_backend(backend)?;
    Some([
        ("claim", sql.claim_insert.as_str()),
        ("read", sql.select_record.as_str()),
        ("take over", sql.take_over.as_str()),
        ("mark committed", sql.mark_committed.as_str()),
        ("mark failed", sql.mark_failed.as_str()),
        ("purge", sql.purge.as_str()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_only_inserts_and_every_statement_is_parameterised() {
        for backend in [DbBackend::Postgres, DbBackend::Sqlite] {
            let sql = Sql::for_backend(backend).expect("supported");
            assert!(
                sql.claim_insert
                    .starts_with("INSERT INTO grpc_operation_ledger")
            );
            assert!(sql.claim_insert.ends_with("DO NOTHING RETURNING version"));
            assert!(sql.claim_insert.contains(&format!(
                "clock.now * {} + ",
                1u64 << grpc_core_api::Version::CLAIM_TIME_SHIFT
            )));
            assert!(!sql.claim_insert.contains("UPDATE"), "{}", sql.claim_insert);
            assert!(!sql.claim_insert.contains("DO UPDATE"));
            for statement in [
                &sql.claim_insert,
                &sql.select_record,
                &sql.take_over,
                &sql.mark_committed,
                &sql.mark_failed,
                &sql.purge,
            ] {
                assert!(!statement.contains("{now}"), "{statement}");
                assert!(!statement.contains("{wait_bound}"), "{statement}");
                assert!(!statement.contains('\''.to_string().repeat(2).as_str()));
            }
            for transition in [&sql.take_over, &sql.mark_committed, &sql.mark_failed] {
                assert!(transition.contains("AND state = 'IN_PROGRESS' AND version = "));
                assert!(transition.contains("version = version + 1"));
            }
        }
        assert!(
            Sql::for_backend(DbBackend::Sqlite)
                .unwrap()
                .claim_insert
                .contains("?5")
        );
        assert!(
            !Sql::for_backend(DbBackend::Sqlite)
                .unwrap()
                .claim_insert
                .contains('$')
        );
        assert!(
            Sql::for_backend(DbBackend::Postgres)
                .unwrap()
                .claim_insert
                .contains("$5")
        );
        assert!(Sql::for_backend(DbBackend::MySql).is_none());
    }
}
