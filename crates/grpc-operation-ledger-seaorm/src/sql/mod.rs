//! Every statement the adapter sends, written out so that reviewers and tests can read them.
//!
//! Templates use `$N` placeholders and a `{now}` token. [`Sql::for_backend`] turns them into the
//! store's dialect: `?N` placeholders for SQLite, positional `?` for MariaDB/MySQL (with the
//! order of the template's parameters kept, to bind values in that order), and the database's own
//! clock in milliseconds since the Unix epoch for `{now}` (lease expiry is judged by the store's
//! clock, never the caller's). Every value is bound; nothing from a request is ever spliced into
//! SQL text. MariaDB has no `ON CONFLICT`, so its claim and purge are written for it below.

use std::sync::OnceLock;

use sea_orm::DbBackend;

/// The identity condition shared by every statement that names one row: `$1` is the identity's
/// 32-byte digest (`GrpcOperationIdentity::storage_digest`), the table's primary key.
macro_rules! identity_condition {
    () => {
        "identity_digest = $1"
    };
}

/// The columns an insert writes the identity into: `$1` the digest, `$2` the caller, `$3` the
/// method, `$4` the key hash's bytes, `$5` the request fingerprint's bytes.
macro_rules! identity_columns {
    () => {
        "identity_digest, caller_fingerprint, full_method_name, idempotency_key_hash, \
         request_fingerprint"
    };
}

/// Claim: one insert that can only insert. `$1`-`$5` the identity and request fingerprint
/// (`identity_columns!`), `$6` lease in ms, `$7` the version's random salt. The fresh version is the store's clock shifted left by 20 bits plus the
/// salt (`Version::fresh`), so it never repeats for an identity; it is returned only when the row
/// was inserted. On PostgreSQL `{wait_bound}` also sets `lock_timeout` to `$8` for the rest of the
/// transaction, before the insert can wait behind another unit's uncommitted claim: the bound
/// travels with the statement, so a connection pooler that drops startup parameters or hands
/// out another server connection cannot lose it. (SQLite needs the `WHERE true` to tell the
/// SELECT's end from the ON CONFLICT clause.)
const CLAIM_INSERT: &str = concat!(
    "INSERT INTO grpc_operation_ledger (",
    identity_columns!(),
    ", state, version, claimed_at, lease_expires_at) \
    SELECT $1, $2, $3, $4, $5, 'IN_PROGRESS', clock.now * 1048576 + $7, clock.now, \
    clock.now + $6 FROM (SELECT {now} AS now{wait_bound}) AS clock WHERE true \
    ON CONFLICT (identity_digest) DO NOTHING RETURNING version"
);

/// PostgreSQL: `lock_timeout` for the current transaction, evaluated before the insert (a volatile
/// function in the subquery's output is never optimised away).
const POSTGRES_WAIT_BOUND: &str = ", set_config('lock_timeout', $8, true) AS wait_bound";

/// PostgreSQL's claim in one round trip: the same insert-only claim, and, only when it inserted
/// nothing, the existing row, read in the same statement. `inserted` says which. The read sees the
/// statement's snapshot, so a row committed before the statement began is replayed at once; one
/// committed while the insert waited behind it is not visible there, the statement returns no row,
/// and the adapter reads it separately (that race is the only second round trip).
const POSTGRES_CLAIM_OR_READ: &str = concat!(
    "WITH clock AS MATERIALIZED (SELECT {now} AS now, \
     set_config('lock_timeout', $8, true) AS wait_bound), \
     ins AS (INSERT INTO grpc_operation_ledger (",
    identity_columns!(),
    ", state, version, claimed_at, lease_expires_at) \
     SELECT $1, $2, $3, $4, $5, 'IN_PROGRESS', clock.now * 1048576 + $7, clock.now, \
     clock.now + $6 FROM clock \
     ON CONFLICT (identity_digest) DO NOTHING RETURNING version) \
     SELECT TRUE AS inserted, ins.version, NULL::BYTEA AS request_fingerprint, \
     NULL::VARCHAR AS state, NULL::BIGINT AS claimed_at, NULL::BIGINT AS lease_expires_at, \
     NULL::BIGINT AS completed_at, NULL::VARCHAR AS outcome_reference, \
     NULL::INTEGER AS failure_code, NULL::VARCHAR AS failure_message, \
     NULL::BYTEA AS failure_details, NULL::BIGINT AS db_now FROM ins \
     UNION ALL \
     SELECT FALSE, version, request_fingerprint, state, claimed_at, lease_expires_at, \
     completed_at, outcome_reference, failure_code, failure_message, failure_details, \
     {now} FROM grpc_operation_ledger WHERE ",
    identity_condition!(),
    " AND NOT EXISTS (SELECT 1 FROM ins)"
);

/// Write-once record of a finished operation: one insert that can only insert, of the row as
/// `record_finished` leaves it. `$1`-`$5` the identity and request fingerprint, `$6` state
/// (COMMITTED or FAILED_TERMINAL), `$7` the version's salt, `$8` PostgreSQL's wait bound (as the
/// claim's), `$9` outcome reference, `$10`-`$12` failure code, message and details (NULL where
/// the state has none). Claimed, leased and completed at the same instant of the store's clock.
const RECORD_INSERT: &str = concat!(
    "INSERT INTO grpc_operation_ledger (",
    identity_columns!(),
    ", state, version, claimed_at, lease_expires_at, completed_at, outcome_reference, \
     failure_code, failure_message, failure_details) \
    SELECT $1, $2, $3, $4, $5, $6, clock.now * 1048576 + $7, clock.now, clock.now, clock.now, \
    $9, $10, $11, $12 \
    FROM (SELECT {now} AS now{wait_bound}) AS clock WHERE true \
    {on_conflict}RETURNING version"
);

/// The insert's refusal of an existing identity, where the store has the clause (MariaDB refuses
/// with 1062 instead, read as "not inserted").
const ON_CONFLICT_DO_NOTHING: &str = "ON CONFLICT (identity_digest) DO NOTHING ";

/// The columns a record is read from.
macro_rules! record_columns {
    () => {
        "request_fingerprint, state, version, claimed_at, lease_expires_at, completed_at, \
         outcome_reference, failure_code, failure_message, failure_details"
    };
}

/// The row of one identity, and nothing else: a resend's read first (ADR 0016) is this one
/// primary-key read, with no clock to compute.
const SELECT_RECORD: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM grpc_operation_ledger WHERE ",
    identity_condition!()
);

/// The row of one identity with the store's clock, for a reader that judges its lease.
const SELECT_RECORD_WITH_CLOCK: &str = concat!(
    "SELECT ",
    record_columns!(),
    ", {now} AS db_now FROM grpc_operation_ledger WHERE ",
    identity_condition!()
);

/// Fenced takeover of an expired lease: only from the version that was read, and only if the
/// lease is still expired by the store's clock. `$2` old version, `$3` lease in ms.
const TAKE_OVER: &str = concat!(
    "UPDATE grpc_operation_ledger SET version = version + 1, claimed_at = {now}, \
     lease_expires_at = {now} + $3 WHERE ",
    identity_condition!(),
    " AND state = 'IN_PROGRESS' AND version = $2 AND lease_expires_at <= {now}"
);

/// Transition to COMMITTED. `$2` owner's version, `$3` outcome reference.
const MARK_COMMITTED: &str = concat!(
    "UPDATE grpc_operation_ledger SET state = 'COMMITTED', version = version + 1, \
     completed_at = {now}, outcome_reference = $3 WHERE ",
    identity_condition!(),
    " AND state = 'IN_PROGRESS' AND version = $2"
);

/// Transition to FAILED_TERMINAL. `$2` owner's version, `$3` status code, `$4` message, `$5` the
/// status's binary details.
const MARK_FAILED: &str = concat!(
    "UPDATE grpc_operation_ledger SET state = 'FAILED_TERMINAL', version = version + 1, \
     completed_at = {now}, failure_code = $3, failure_message = $4, failure_details = $5 WHERE ",
    identity_condition!(),
    " AND state = 'IN_PROGRESS' AND version = $2"
);

/// Lease renewal by the owner: the lease ends `$3` ms from now by the store's clock, only at the
/// owner's version `$2` and only in progress; the version stays, so the owner's transition still
/// names it. (No indexed column changes, so PostgreSQL can keep the update on the row's page.)
const RENEW_LEASE: &str = concat!(
    "UPDATE grpc_operation_ledger SET lease_expires_at = {now} + $3 WHERE ",
    identity_condition!(),
    " AND state = 'IN_PROGRESS' AND version = $2"
);

/// Deletes at most `$2` finished rows completed more than `$1` ms ago by the store's clock.
/// `claimed_at <= completed_at` always holds, so the condition on `claimed_at` lets its index find
/// the candidates.
const PURGE: &str = "DELETE FROM grpc_operation_ledger \
    WHERE identity_digest IN (SELECT identity_digest \
    FROM grpc_operation_ledger, (SELECT {now} - $1 AS cutoff) AS clock \
    WHERE claimed_at < clock.cutoff AND completed_at < clock.cutoff \
    AND state <> 'IN_PROGRESS' LIMIT $2)";

/// MariaDB/MySQL claim: an insert that can only insert. A duplicate is refused with error 1062,
/// which the adapter reads as "not inserted" (`INSERT IGNORE` would also turn truncation and
/// CHECK failures into warnings, and a no-op `ON DUPLICATE KEY UPDATE` would lock and count the
/// other row); MariaDB keeps the transaction after a refused statement. The bound on the wait
/// behind another unit's uncommitted claim is a `SET STATEMENT max_statement_time` prefix the
/// adapter adds (`innodb_lock_wait_timeout` has whole seconds only).
const MYSQL_CLAIM_INSERT: &str = concat!(
    "INSERT INTO grpc_operation_ledger (",
    identity_columns!(),
    ", state, version, claimed_at, lease_expires_at) \
    SELECT $1, $2, $3, $4, $5, 'IN_PROGRESS', clock.now * 1048576 + $7, clock.now, \
    clock.now + $6 FROM (SELECT {now} AS now) AS clock RETURNING version"
);

/// MariaDB/MySQL purge: a DELETE may not select from its own table or limit an `IN` subquery, but
/// it may limit itself.
const MYSQL_PURGE: &str = "DELETE FROM grpc_operation_ledger \
    WHERE claimed_at < {now} - $1 AND completed_at < {now} - $1 \
    AND state <> 'IN_PROGRESS' LIMIT $2";

/// The census: every count the port's `census` and `grpc-ledger stats` read, in one aggregate
/// scan by the store's clock. `$1` the retention in ms.
const CENSUS: &str = "SELECT \
    COUNT(CASE WHEN state = 'IN_PROGRESS' THEN 1 END), \
    COUNT(CASE WHEN state = 'COMMITTED' THEN 1 END), \
    COUNT(CASE WHEN state = 'FAILED_TERMINAL' THEN 1 END), \
    COUNT(CASE WHEN state = 'IN_PROGRESS' AND lease_expires_at <= {now} THEN 1 END), \
    {now} - MIN(CASE WHEN state = 'IN_PROGRESS' THEN claimed_at END), \
    COUNT(CASE WHEN state <> 'IN_PROGRESS' AND completed_at < {now} - $1 THEN 1 END) \
    FROM grpc_operation_ledger";

const POSTGRES_NOW: &str = "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT";
const SQLITE_NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";
/// MariaDB's clock in UTC milliseconds, by arithmetic on UTC_TIMESTAMP: `UNIX_TIMESTAMP(NOW())`
/// would go through the session's time zone, where the hour repeated at the end of daylight
/// saving time makes the clock jump back.
const MYSQL_NOW: &str =
    "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)";

/// The store's clock in UTC milliseconds, as an SQL expression of `backend`'s dialect (`None`
/// for a store the ledger does not support).
pub(crate) fn now_expression(backend: DbBackend) -> Option<&'static str> {
    match backend {
        DbBackend::Postgres => Some(POSTGRES_NOW),
        DbBackend::Sqlite => Some(SQLITE_NOW),
        DbBackend::MySql => Some(MYSQL_NOW),
        _ => None,
    }
}

/// One statement in a store's dialect.
#[derive(Debug)]
pub(crate) struct Stmt {
    /// The template it was rendered from, with the store's clock in place of `{now}` and `$N`
    /// placeholders (what a mutation of the statement changes, whatever the dialect binds).
    pub(crate) template: String,
    /// The SQL text.
    pub(crate) text: String,
    /// For positional `?` placeholders: the template parameter (1-based) each one stands for.
    order: Option<Vec<usize>>,
}

impl Stmt {
    /// The values to bind, in the order the placeholders want them, from values given in the
    /// template's parameter order (`$1`, `$2`, ...).
    pub(crate) fn values(&self, values: Vec<sea_orm::Value>) -> Vec<sea_orm::Value> {
        match &self.order {
            None => values,
            Some(order) => order.iter().map(|n| values[n - 1].clone()).collect(),
        }
    }
}

/// The statements in one store's dialect.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) claim_insert: Stmt,
    /// The claim and, when it inserted nothing, the existing row, in one statement (PostgreSQL).
    pub(crate) claim_or_read: Option<Stmt>,
    /// The row of one identity.
    pub(crate) select_record: Stmt,
    /// The row of one identity and the store's clock.
    pub(crate) select_record_with_clock: Stmt,
    pub(crate) take_over: Stmt,
    pub(crate) mark_committed: Stmt,
    pub(crate) mark_failed: Stmt,
    pub(crate) renew_lease: Stmt,
    pub(crate) purge: Stmt,
    /// The write-once record of a finished operation.
    pub(crate) record_insert: Stmt,
    /// The census's one aggregate read.
    pub(crate) census: Stmt,
    /// How the dialect writes placeholders.
    placeholders: Placeholders,
}

/// How a dialect writes placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placeholders {
    /// `$N` (PostgreSQL).
    Dollar,
    /// `?N` (SQLite's positional form; `$N` would be a named parameter there).
    QuestionNumbered,
    /// `?`, in order (MariaDB/MySQL).
    Question,
}

impl Sql {
    /// The claim the adapter sends: the one-round-trip form where the dialect has one.
    pub(crate) fn claim_as_sent(&self) -> &Stmt {
        self.claim_or_read.as_ref().unwrap_or(&self.claim_insert)
    }

    /// Every statement the port sends in this dialect, by a stable name.
    fn sent(&self) -> [(&'static str, &Stmt); 10] {
        [
            ("claim", self.claim_as_sent()),
            ("read", &self.select_record),
            (
                "read with the store's clock",
                &self.select_record_with_clock,
            ),
            ("take over", &self.take_over),
            ("mark committed", &self.mark_committed),
            ("mark failed", &self.mark_failed),
            ("renew lease", &self.renew_lease),
            ("purge", &self.purge),
            ("record finished (write-once)", &self.record_insert),
            ("census", &self.census),
        ]
    }

    /// The statement sent under `name` (see [`sent_statements`]), to replace.
    #[cfg_attr(not(feature = "sql-mutants"), allow(dead_code))]
    fn sent_mut(&mut self, name: &str) -> Option<&mut Stmt> {
        Some(match name {
            "claim" => match &mut self.claim_or_read {
                Some(one_round_trip) => one_round_trip,
                None => &mut self.claim_insert,
            },
            "read" => &mut self.select_record,
            "read with the store's clock" => &mut self.select_record_with_clock,
            "take over" => &mut self.take_over,
            "mark committed" => &mut self.mark_committed,
            "mark failed" => &mut self.mark_failed,
            "renew lease" => &mut self.renew_lease,
            "purge" => &mut self.purge,
            "record finished (write-once)" => &mut self.record_insert,
            "census" => &mut self.census,
            _ => return None,
        })
    }

    /// Replaces the statement sent under `name` with `template` (`$N` placeholders, the store's
    /// clock written out), rendered in this dialect; false for an unknown name.
    #[cfg_attr(not(feature = "sql-mutants"), allow(dead_code))]
    pub(crate) fn replace(&mut self, name: &str, template: &str) -> bool {
        let placeholders = self.placeholders;
        match self.sent_mut(name) {
            Some(stmt) => {
                *stmt = render(template, placeholders);
                true
            }
            None => false,
        }
    }

    /// The statements, with a mutant's replacement when a `sql-mutants` build is told of one.
    #[cfg_attr(not(feature = "sql-mutants"), allow(unused_variables, unused_mut))]
    fn finished(mut self, backend: DbBackend) -> Self {
        #[cfg(feature = "sql-mutants")]
        if let Some((name, template)) = crate::mutants::requested(backend) {
            assert!(
                self.replace(&name, &template),
                "the mutant names no statement the adapter sends: {name}"
            );
        }
        self
    }

    /// The statements for `backend`, or `None` for a store the ledger does not support.
    pub(crate) fn for_backend(backend: DbBackend) -> Option<&'static Self> {
        static POSTGRES: OnceLock<Sql> = OnceLock::new();
        static SQLITE: OnceLock<Sql> = OnceLock::new();
        static MYSQL: OnceLock<Sql> = OnceLock::new();
        match backend {
            DbBackend::Postgres => Some(POSTGRES.get_or_init(|| {
                let mut sql = Self::build(
                    POSTGRES_NOW,
                    Placeholders::Dollar,
                    [
                        CLAIM_INSERT
                            .replace("{wait_bound}", POSTGRES_WAIT_BOUND)
                            .as_str(),
                        PURGE,
                        RECORD_INSERT
                            .replace("{wait_bound}", POSTGRES_WAIT_BOUND)
                            .replace("{on_conflict}", ON_CONFLICT_DO_NOTHING)
                            .as_str(),
                    ],
                );
                sql.claim_or_read = Some(render(
                    &POSTGRES_CLAIM_OR_READ.replace("{now}", POSTGRES_NOW),
                    Placeholders::Dollar,
                ));
                sql.finished(backend)
            })),
            DbBackend::Sqlite => Some(SQLITE.get_or_init(|| {
                Self::build(
                    SQLITE_NOW,
                    Placeholders::QuestionNumbered,
                    [
                        CLAIM_INSERT.replace("{wait_bound}", "").as_str(),
                        PURGE,
                        RECORD_INSERT
                            .replace("{wait_bound}", "")
                            .replace("{on_conflict}", ON_CONFLICT_DO_NOTHING)
                            .as_str(),
                    ],
                )
                .finished(backend)
            })),
            DbBackend::MySql => Some(MYSQL.get_or_init(|| {
                Self::build(
                    MYSQL_NOW,
                    Placeholders::Question,
                    [
                        MYSQL_CLAIM_INSERT,
                        MYSQL_PURGE,
                        RECORD_INSERT
                            .replace("{wait_bound}", "")
                            .replace(" WHERE true", "")
                            .replace("{on_conflict}", "")
                            .as_str(),
                    ],
                )
                .finished(backend)
            })),
            _ => None,
        }
    }

    /// The dialect's statements; `[claim, purge, record]` are the templates that differ by
    /// dialect, the reads and the transitions are shared.
    fn build(now: &str, placeholders: Placeholders, [claim, purge, record]: [&str; 3]) -> Self {
        let render = |template: &str| render(&template.replace("{now}", now), placeholders);
        Self {
            claim_insert: render(claim),
            claim_or_read: None,
            select_record: render(SELECT_RECORD),
            select_record_with_clock: render(SELECT_RECORD_WITH_CLOCK),
            take_over: render(TAKE_OVER),
            mark_committed: render(MARK_COMMITTED),
            mark_failed: render(MARK_FAILED),
            renew_lease: render(RENEW_LEASE),
            purge: render(purge),
            record_insert: render(record),
            census: render(CENSUS),
            placeholders,
        }
    }
}

/// `template`, written with PostgreSQL's `$1`, `$2`, ... placeholders numbered in the order they
/// appear, in `backend`'s dialect (`?1` for SQLite, `?` for MariaDB/MySQL), for statements of
/// the application's own next to the ledger's (its business writes, its tests); `None` for a store
/// the ledger does not support.
pub fn in_dialect(backend: DbBackend, template: &str) -> Option<String> {
    let style = match backend {
        DbBackend::Postgres => Placeholders::Dollar,
        DbBackend::Sqlite => Placeholders::QuestionNumbered,
        DbBackend::MySql => Placeholders::Question,
        _ => return None,
    };
    Some(render(template, style).text)
}

/// A template's `$N` placeholders in `style`.
fn render(template: &str, style: Placeholders) -> Stmt {
    match style {
        Placeholders::Dollar => Stmt {
            template: template.to_owned(),
            text: template.to_owned(),
            order: None,
        },
        Placeholders::QuestionNumbered => Stmt {
            template: template.to_owned(),
            text: template.replace('$', "?"),
            order: None,
        },
        Placeholders::Question => {
            let (mut text, mut order) = (String::new(), Vec::new());
            let mut rest = template;
            while let Some(at) = rest.find('$') {
                text.push_str(&rest[..at]);
                let digits = rest[at + 1..]
                    .find(|c: char| !c.is_ascii_digit())
                    .map_or(rest.len() - at - 1, |n| n);
                order.push(
                    rest[at + 1..at + 1 + digits]
                        .parse()
                        .expect("a parameter number"),
                );
                text.push('?');
                rest = &rest[at + 1 + digits..];
            }
            text.push_str(rest);
            Stmt {
                template: template.to_owned(),
                text,
                order: Some(order),
            }
        }
    }
}

/// The claim as the adapter sends it on `backend`, for a benchmark that must send what a guarded
/// call sends: on PostgreSQL the one-round-trip form (the insert claim of [`statements`], with the
/// row it met read in the same statement; its columns `inserted` and `version` say which), and
/// elsewhere the insert claim itself (MariaDB's wait bound, a prefix, is not part of it). `None`
/// for a store the ledger does not support.
pub fn claim_as_sent(backend: DbBackend) -> Option<&'static str> {
    Some(Sql::for_backend(backend)?.claim_as_sent().text.as_str())
}

/// The adapter's statements on `backend`, by name, for readers and benchmarks; `None` for a store
/// the ledger does not support. On PostgreSQL the adapter claims with the one-round-trip form of
/// `claim` (which reads the existing row in the same statement: [`claim_as_sent`]), and on MariaDB it prefixes the
/// claim with its wait bound (`SET STATEMENT max_statement_time=...`).
pub fn statements(backend: DbBackend) -> Option<[(&'static str, &'static str); 9]> {
    let sql = Sql::for_backend(backend)?;
    Some([
        ("claim", sql.claim_insert.text.as_str()),
        ("read", sql.select_record.text.as_str()),
        ("take over", sql.take_over.text.as_str()),
        ("mark committed", sql.mark_committed.text.as_str()),
        ("mark failed", sql.mark_failed.text.as_str()),
        ("purge", sql.purge.text.as_str()),
        (
            "record finished (write-once)",
            sql.record_insert.text.as_str(),
        ),
        ("renew lease", sql.renew_lease.text.as_str()),
        (
            "read with the store's clock",
            sql.select_record_with_clock.text.as_str(),
        ),
    ])
}

/// Every statement the ledger port sends on `backend`, by a stable name, as its template: `$N`
/// placeholders (SQLite's `?N` and MariaDB's positional `?` are rendered from them) with the
/// store's clock written out. What a reviewer reads, what the mutation report's digests cover
/// (`docs/mutants/`), and the names a `sql-mutants` build replaces. `None` for a store the ledger
/// does not support.
pub fn sent_statements(backend: DbBackend) -> Option<Vec<(&'static str, &'static str)>> {
    let sql = Sql::for_backend(backend)?;
    Some(
        sql.sent()
            .into_iter()
            .map(|(name, stmt)| (name, stmt.template.as_str()))
            .collect(),
    )
}

#[cfg(test)]
mod tests;
