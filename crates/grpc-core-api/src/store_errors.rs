//! Store error codes to ledger errors, for adapters on SQL stores whatever their driver: PostgreSQL
//! SQLSTATE codes, MariaDB/MySQL (and Galera) error numbers, and SQLite result codes.
//!
//! The rule these tables keep: a transient state of the store in which the unit of work did not
//! take effect is `Unavailable`; one in which it may have (anything but a stated refusal while
//! committing, and PostgreSQL's 40003 anywhere) is `OutcomeUnknown`; `Internal` is only for what
//! means a bug (syntax, undefined objects, data exceptions, constraint violations); a lock wait
//! that ran out is `InFlight` during a claim (a duplicate behind an uncommitted claim, or behind
//! a lock on the table) and a `Timeout` anywhere else. Messages are built from the codes, never
//! copied from a driver, whose messages may quote row values.
//!
//! ```
//! use std::time::Duration;
//! use grpc_core_api::store_errors::{During, from_sqlstate};
//! use grpc_core_api::{LedgerError, UnavailableKind};
//!
//! let claim = During::Claim { wait: Duration::from_millis(500) };
//! // lock_not_available, when lock_timeout ran out behind another unit's claim
//! assert_eq!(from_sqlstate("55P03", claim), LedgerError::InFlight { retry_after: Duration::from_millis(500) });
//! // serialization_failure
//! assert_eq!(
//!     from_sqlstate("40001", During::Other),
//!     LedgerError::unavailable(UnavailableKind::SerializationFailure)
//! );
//! ```

use std::time::Duration;

use crate::{LedgerError, UnavailableKind};

/// What the failed statement was doing: a lock wait that runs out during a claim means the claim
/// is behind another unit's claim (or a lock on the table), which the contract answers `InFlight`
/// with the claim wait as its retry delay; anywhere else it is a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum During {
    /// A claim (or a write-once record), whose lock waits are bounded by `wait`.
    Claim {
        /// The claim wait, reported as the `InFlight` retry delay.
        wait: Duration,
    },
    /// Any other statement.
    Other,
    /// The unit of work's COMMIT: a failure here leaves the outcome unknown unless the store
    /// stated a refusal (see [`LedgerError::at_commit`]).
    Commit,
}

impl During {
    /// `error`, classified for this phase: at a commit, an unknown outcome where the store did
    /// not state a refusal.
    pub fn judge(self, error: LedgerError) -> LedgerError {
        match self {
            During::Commit => error.at_commit(),
            _ => error,
        }
    }
}

/// PostgreSQL's answer when a connection's prepared statements are not where its driver left
/// them (SQLSTATE 42P05, 26000), which is what a pooler in transaction pooling does by handing
/// each transaction another server connection: INTERNAL (a retry meets it again), with `advice`,
/// the adapter's own way out (the setting that stops the caching). The one wording of that
/// message, for every adapter.
pub fn statements_lost_behind_a_pooler(advice: &str) -> LedgerError {
    LedgerError::internal(format!(
        "prepared statements were lost between transactions: a pooler in transaction pooling \
         stands in front of PostgreSQL and hands each transaction another server connection; \
         {advice}"
    ))
}

/// A PostgreSQL SQLSTATE code (`code`) to a ledger error: first the codes that need a meaning of their own,
/// then whole classes. A transient state of the store (the unit of work did not take effect, or
/// its outcome is unknown and a keyed retry is safe) is `Unavailable`; `Internal` is only for
/// classes that mean a bug (syntax, undefined objects, data exceptions, constraint violations).
pub fn from_sqlstate(code: &str, phase: During) -> LedgerError {
    phase.judge(sqlstate_meaning(code, phase))
}

fn sqlstate_meaning(code: &str, phase: During) -> LedgerError {
    use UnavailableKind::*;
    let unavailable = LedgerError::unavailable;
    match code {
        // lock_not_available: lock_timeout ran out behind another unit's lock
        "55P03" => lock_wait_exceeded(phase),
        // query_canceled: statement_timeout or a cancel request
        "57014" => unavailable(Timeout),
        // statement_completion_unknown: the store itself cannot say whether it took effect
        "40003" => LedgerError::outcome_unknown(CompletionUnknown),
        // admin_shutdown, crash_shutdown, idle_session_timeout: the session is gone
        "57P01" | "57P02" | "57P05" => unavailable(ConnectionLost),
        // idle_in_transaction_session_timeout: the server ended the session mid-unit
        "25P03" => unavailable(ConnectionLost),
        // read_only_sql_transaction: a standby (during a failover) or a read-only database
        "25006" => unavailable(StoreNotReady),
        // in_failed_sql_transaction: an earlier statement of the caller's unit of work failed
        "25P02" => LedgerError::internal(
            "the unit of work is aborted by an earlier error; roll it back and retry",
        ),
        // duplicate_prepared_statement, invalid_sql_statement_name: the connection's named
        // statements are not where the driver left them, which is what a pooler that hands each
        // transaction another server connection does to them
        "42P05" | "26000" => statements_lost_behind_a_pooler(
            "prepare no statement outside a transaction and cache none across transactions",
        ),
        "23514" => LedgerError::internal("a ledger row violated a CHECK constraint"),
        // unique_violation cannot happen on a claim (ON CONFLICT DO NOTHING); anywhere else it
        // is a bug
        "23505" => LedgerError::internal("a ledger row violated uniqueness"),
        _ => match code.get(..2) {
            // transaction_rollback: serialization failure, deadlock (rolled back)
            Some("40") => unavailable(SerializationFailure),
            // connection_exception
            Some("08") => unavailable(ConnectionLost),
            // insufficient_resources (disk full, out of memory, too many connections) and
            // operator_intervention (cannot_connect_now, shutting down)
            Some("53" | "57") => unavailable(StoreNotReady),
            // system_error: an I/O error on the server
            Some("58") => unavailable(StoreNotReady),
            _ => LedgerError::internal(format!("unexpected database error (code {code})")),
        },
    }
}

/// A SQLite result code (primary, or extended with the primary in the low byte, in decimal as
/// drivers report it) to a ledger error.
pub fn from_sqlite_code(code: &str, phase: During) -> LedgerError {
    phase.judge(sqlite_meaning(code))
}

fn sqlite_meaning(code: &str) -> LedgerError {
    use UnavailableKind::*;
    let unavailable = LedgerError::unavailable;
    let Ok(extended) = code.parse::<u32>() else {
        return LedgerError::internal(format!("unexpected database error (code {code})"));
    };
    match extended & 0xff {
        // SQLITE_BUSY, SQLITE_LOCKED: the busy timeout ran out waiting for the single write lock.
        // Units of work begin as writers, so inside one this cannot be a duplicate claim behind
        // an uncommitted one: the store is busy, whatever the phase.
        5 | 6 => unavailable(StoreBusy),
        // SQLITE_IOERR*, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_PROTOCOL: the file or the disk
        10 | 13 | 14 | 15 => unavailable(StoreNotReady),
        // SQLITE_CONSTRAINT (CHECK 275, PRIMARY KEY 1555, UNIQUE 2067, ...)
        19 => LedgerError::internal("a ledger row violated a constraint"),
        _ => LedgerError::internal(format!("unexpected database error (code {code})")),
    }
}

/// A MariaDB/MySQL error number (and Galera's) to a ledger error, like the SQLSTATE table: transient
/// states of the store are `Unavailable`, INTERNAL only for what means a bug.
pub fn from_mysql_error(number: u16, phase: During) -> LedgerError {
    phase.judge(mysql_meaning(number, phase))
}

fn mysql_meaning(number: u16, phase: During) -> LedgerError {
    use UnavailableKind::*;
    let unavailable = LedgerError::unavailable;
    match number {
        // ER_LOCK_DEADLOCK: a deadlock, or a Galera certification failure at commit
        1213 => unavailable(SerializationFailure),
        // ER_ERROR_DURING_COMMIT: Galera reports some certification failures so
        1180 => unavailable(SerializationFailure),
        // ER_LOCK_WAIT_TIMEOUT; ER_STATEMENT_TIMEOUT (max_statement_time ran out, as the claim's
        // bound does behind another unit's uncommitted claim)
        1205 | 1969 => lock_wait_exceeded(phase),
        // ER_QUERY_INTERRUPTED, ER_CONNECTION_KILLED, ER_SERVER_SHUTDOWN, CR_SERVER_GONE_ERROR,
        // CR_SERVER_LOST
        1317 | 1927 | 1053 | 2006 | 2013 => unavailable(ConnectionLost),
        // ER_UNKNOWN_COM_ERROR is what Galera answers while the node is not ready (WSREP has not
        // yet prepared node for application use); too many connections; read-only server or
        // transaction (a replica during failover); out of resources
        1047 | 1040 | 1203 | 1290 | 1792 | 1836 | 1041 | 1037 | 1038 | 1021 => {
            unavailable(StoreNotReady)
        }
        // ER_DUP_ENTRY outside a claim, ER_CONSTRAINT_FAILED (CHECK), and everything else
        1062 => LedgerError::internal("a ledger row violated uniqueness"),
        4025 | 3819 => LedgerError::internal("a ledger row violated a CHECK constraint"),
        other => LedgerError::internal(format!("unexpected database error (MySQL error {other})")),
    }
}

fn lock_wait_exceeded(phase: During) -> LedgerError {
    match phase {
        During::Claim { wait } => LedgerError::InFlight { retry_after: wait },
        During::Other | During::Commit => LedgerError::unavailable(UnavailableKind::Timeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLAIM: During = During::Claim {
        wait: Duration::from_millis(250),
    };

    /// `Some(kind)`: the code is that transient state; `None`: it is INTERNAL.
    fn assert_maps_to(got: LedgerError, expected: Option<UnavailableKind>, what: &str, code: &str) {
        match expected {
            Some(kind) => assert_eq!(got, LedgerError::unavailable(kind), "{what} {code}"),
            None => assert!(
                matches!(got, LedgerError::Internal { .. }),
                "{what} {code}: {got:?}"
            ),
        }
    }

    /// What each code means, row by row: `None` is INTERNAL (a bug), `Some(kind)` a transient
    /// state, and the lock wait during a claim is `InFlight`.
    #[test]
    fn sqlstates_map_by_code_then_by_class() {
        use UnavailableKind::*;
        let table: &[(&str, Option<UnavailableKind>)] = &[
            ("40001", Some(SerializationFailure)), // serialization_failure
            ("40P01", Some(SerializationFailure)), // deadlock_detected
            ("55P03", Some(Timeout)),              // lock_not_available (outside a claim)
            ("57014", Some(Timeout)),              // query_canceled
            ("57P01", Some(ConnectionLost)),       // admin_shutdown
            ("57P02", Some(ConnectionLost)),       // crash_shutdown
            ("57P05", Some(ConnectionLost)),       // idle_session_timeout
            ("25P03", Some(ConnectionLost)),       // idle_in_transaction_session_timeout
            ("08006", Some(ConnectionLost)),       // connection_failure
            ("08P01", Some(ConnectionLost)),       // protocol_violation
            ("25006", Some(StoreNotReady)),        // read_only_sql_transaction (a standby)
            ("57P03", Some(StoreNotReady)),        // cannot_connect_now
            ("53100", Some(StoreNotReady)),        // disk_full
            ("53200", Some(StoreNotReady)),        // out_of_memory
            ("53300", Some(StoreNotReady)),        // too_many_connections
            ("58030", Some(StoreNotReady)),        // io_error
            ("25P02", None),                       // in_failed_sql_transaction
            ("23514", None),                       // check_violation
            ("23505", None),                       // unique_violation
            ("23502", None),                       // not_null_violation
            ("22001", None),                       // string_data_right_truncation
            ("22P02", None),                       // invalid_text_representation
            ("42601", None),                       // syntax_error
            ("42P01", None),                       // undefined_table
            ("42703", None),                       // undefined_column
            ("XX000", None),                       // internal_error
            ("42P05", None),                       // duplicate_prepared_statement (a pooler)
            ("26000", None),                       // invalid_sql_statement_name (a pooler)
        ];
        for (code, expected) in table {
            assert_maps_to(
                from_sqlstate(code, During::Other),
                *expected,
                "SQLSTATE",
                code,
            );
        }
        let LedgerError::Internal { message } = from_sqlstate("42P05", During::Other) else {
            unreachable!("checked above");
        };
        assert!(message.contains("transaction pooling"), "{message}");
        assert_eq!(
            from_sqlstate("40003", During::Other),
            LedgerError::outcome_unknown(CompletionUnknown),
            "statement_completion_unknown"
        );
        assert_eq!(
            from_sqlstate("55P03", CLAIM),
            LedgerError::InFlight {
                retry_after: Duration::from_millis(250)
            },
            "a claim behind another unit's uncommitted claim is in flight"
        );
    }

    #[test]
    fn mysql_numbers_map_row_by_row() {
        use UnavailableKind::*;
        let table: &[(u16, Option<UnavailableKind>)] = &[
            (1213, Some(SerializationFailure)), // deadlock, Galera certification failure
            (1180, Some(SerializationFailure)), // error during commit (Galera)
            (1205, Some(Timeout)),              // lock wait timeout (outside a claim)
            (1969, Some(Timeout)),              // max_statement_time (outside a claim)
            (2006, Some(ConnectionLost)),       // server has gone away
            (2013, Some(ConnectionLost)),       // lost connection during query
            (1927, Some(ConnectionLost)),       // connection killed
            (1053, Some(ConnectionLost)),       // server shutdown in progress
            (1047, Some(StoreNotReady)),        // WSREP has not yet prepared node
            (1040, Some(StoreNotReady)),        // too many connections
            (1290, Some(StoreNotReady)),        // --read-only
            (1792, Some(StoreNotReady)),        // read-only transaction
            (1062, None),                       // duplicate outside a claim
            (4025, None),                       // CHECK constraint failed
            (1064, None),                       // syntax error
            (1146, None),                       // table does not exist
        ];
        for (number, expected) in table {
            assert_maps_to(
                from_mysql_error(*number, During::Other),
                *expected,
                "MySQL error",
                &number.to_string(),
            );
        }
        for number in [1205, 1969] {
            assert_eq!(
                from_mysql_error(number, CLAIM),
                LedgerError::InFlight {
                    retry_after: Duration::from_millis(250)
                }
            );
        }
    }

    #[test]
    fn sqlite_codes_map_by_primary_code() {
        use UnavailableKind::*;
        let table: &[(&str, Option<UnavailableKind>)] = &[
            ("5", Some(StoreBusy)),       // SQLITE_BUSY
            ("517", Some(StoreBusy)),     // SQLITE_BUSY_SNAPSHOT
            ("6", Some(StoreBusy)),       // SQLITE_LOCKED
            ("10", Some(StoreNotReady)),  // SQLITE_IOERR
            ("266", Some(StoreNotReady)), // SQLITE_IOERR_READ
            ("778", Some(StoreNotReady)), // SQLITE_IOERR_WRITE
            ("13", Some(StoreNotReady)),  // SQLITE_FULL
            ("14", Some(StoreNotReady)),  // SQLITE_CANTOPEN
            ("19", None),                 // SQLITE_CONSTRAINT
            ("275", None),                // SQLITE_CONSTRAINT_CHECK
            ("1555", None),               // SQLITE_CONSTRAINT_PRIMARYKEY
            ("2067", None),               // SQLITE_CONSTRAINT_UNIQUE
            ("1", None),                  // SQLITE_ERROR (syntax, missing table)
            ("11", None),                 // SQLITE_CORRUPT
        ];
        for (code, expected) in table {
            for phase in [During::Other, CLAIM] {
                assert_maps_to(
                    from_sqlite_code(code, phase),
                    *expected,
                    "SQLite code",
                    code,
                );
            }
        }
    }

    /// While committing, only a refusal the store states keeps "did not take effect"; a lost
    /// connection, a timeout or a store going away leave the outcome unknown, on every store.
    #[test]
    fn a_commit_that_got_no_verdict_has_an_unknown_outcome() {
        use UnavailableKind::*;
        let unknown = LedgerError::outcome_unknown;
        for (code, expected) in [
            ("08006", unknown(ConnectionLost)),
            ("57P01", unknown(ConnectionLost)),
            ("57014", unknown(Timeout)),
            ("53100", unknown(StoreNotReady)),
            ("40003", unknown(CompletionUnknown)),
            ("40001", LedgerError::unavailable(SerializationFailure)),
            ("40P01", LedgerError::unavailable(SerializationFailure)),
        ] {
            assert_eq!(
                from_sqlstate(code, During::Commit),
                expected,
                "SQLSTATE {code}"
            );
        }
        for (number, expected) in [
            (2013, unknown(ConnectionLost)),
            (2006, unknown(ConnectionLost)),
            (1213, LedgerError::unavailable(SerializationFailure)),
            (1180, LedgerError::unavailable(SerializationFailure)),
        ] {
            assert_eq!(
                from_mysql_error(number, During::Commit),
                expected,
                "MySQL {number}"
            );
        }
        assert_eq!(
            from_sqlite_code("5", During::Commit),
            LedgerError::unavailable(StoreBusy),
            "SQLite's busy COMMIT leaves the transaction open, uncommitted"
        );
        assert_eq!(
            from_sqlite_code("10", During::Commit),
            unknown(StoreNotReady)
        );
        assert!(matches!(
            from_sqlstate("23505", During::Commit),
            LedgerError::Internal { .. }
        ));
    }
}
