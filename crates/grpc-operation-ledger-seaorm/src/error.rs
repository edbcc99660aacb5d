//! Driver errors to port errors, at the adapter's boundary.
//!
//! Messages are built here from error codes, never copied from the driver: a driver's message
//! or detail can quote the values of a row (its key hash, its caller), and none of that belongs in
//! an error a client may see.

use std::time::Duration;

use grpc_core_api::{LedgerError, UnavailableKind};
use sea_orm::{DbErr, RuntimeErr, error::ConnAcquireErr, sqlx};

/// What a statement was doing when it failed: a lock wait during a claim means a duplicate is
/// blocked behind another unit of work's uncommitted claim, which the contract answers with
/// `InFlight`; anywhere else it is a timeout.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    Claim { wait: Duration },
    Other,
}

pub(crate) fn map_db_err(error: DbErr, phase: Phase) -> LedgerError {
    let unavailable = LedgerError::unavailable;
    match error {
        DbErr::ConnectionAcquire(ConnAcquireErr::Timeout) => {
            unavailable(UnavailableKind::PoolTimeout)
        }
        DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => {
            unavailable(UnavailableKind::ConnectionLost)
        }
        DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e)) => {
            map_sqlx(&e, phase)
        }
        other => LedgerError::internal(format!("unexpected database error: {}", kind_of(&other))),
    }
}

fn kind_of(error: &DbErr) -> &'static str {
    match error {
        DbErr::TryIntoErr { .. } | DbErr::Type(_) => "type conversion",
        DbErr::RecordNotFound(_) => "record not found",
        DbErr::Custom(_) => "custom",
        _ => "other",
    }
}

fn map_sqlx(error: &sqlx::Error, phase: Phase) -> LedgerError {
    let unavailable = LedgerError::unavailable;
    match error {
        sqlx::Error::PoolTimedOut => unavailable(UnavailableKind::PoolTimeout),
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => unavailable(UnavailableKind::ConnectionLost),
        sqlx::Error::Database(db) => {
            let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
            map_database_code(&code, phase)
        }
        _ => LedgerError::internal("unexpected driver error"),
    }
}

/// SQLSTATE codes (PostgreSQL) and primary result codes (SQLite) to port errors.
fn map_database_code(code: &str, phase: Phase) -> LedgerError {
    let unavailable = LedgerError::unavailable;
    let lock_wait_exceeded = || match phase {
        Phase::Claim { wait } => LedgerError::InFlight { retry_after: wait },
        Phase::Other => unavailable(UnavailableKind::Timeout),
    };
    match code {
        // serialization_failure, deadlock_detected
        "40001" | "40P01" => unavailable(UnavailableKind::SerializationFailure),
        // lock_not_available: lock_timeout ran out
        "55P03" => lock_wait_exceeded(),
        // SQLITE_BUSY, SQLITE_LOCKED (and their extended codes): the busy timeout ran out
        c if c == "5"
            || c == "6"
            || sqlite_primary(c) == Some(5)
            || sqlite_primary(c) == Some(6) =>
        {
            lock_wait_exceeded()
        }
        // query_canceled (statement_timeout)
        "57014" => unavailable(UnavailableKind::Timeout),
        // admin_shutdown, crash_shutdown, cannot_connect_now, too_many_connections
        "57P01" | "57P02" => unavailable(UnavailableKind::ConnectionLost),
        "57P03" | "53300" => unavailable(UnavailableKind::StoreNotReady),
        // connection_exception class
        c if c.starts_with("08") => unavailable(UnavailableKind::ConnectionLost),
        // in_failed_sql_transaction: an earlier statement of the caller's unit of work failed
        "25P02" => LedgerError::internal(
            "the unit of work is aborted by an earlier error; roll it back and retry",
        ),
        // check_violation (PostgreSQL 23514, SQLite constraint 19/275)
        "23514" | "275" => LedgerError::internal("a ledger row violated a CHECK constraint"),
        // unique_violation cannot happen on a claim (ON CONFLICT DO NOTHING); anywhere else it
        // is a bug
        "23505" | "1555" | "2067" => LedgerError::internal("a ledger row violated uniqueness"),
        other => LedgerError::internal(format!("unexpected database error (code {other})")),
    }
}

/// SQLite extended result codes carry the primary code in their low byte.
fn sqlite_primary(code: &str) -> Option<u32> {
    code.parse::<u32>()
        .ok()
        .filter(|c| *c > 255)
        .map(|c| c & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_the_right_port_errors() {
        let claim = Phase::Claim {
            wait: Duration::from_millis(250),
        };
        let in_flight = LedgerError::InFlight {
            retry_after: Duration::from_millis(250),
        };
        let timeout = LedgerError::unavailable(UnavailableKind::Timeout);
        let cases = [
            ("55P03", claim, in_flight.clone()),
            ("55P03", Phase::Other, timeout.clone()),
            ("5", claim, in_flight.clone()),
            ("517", claim, in_flight.clone()), // SQLITE_BUSY_SNAPSHOT
            ("6", Phase::Other, timeout.clone()),
            (
                "40001",
                claim,
                LedgerError::unavailable(UnavailableKind::SerializationFailure),
            ),
            (
                "40P01",
                Phase::Other,
                LedgerError::unavailable(UnavailableKind::SerializationFailure),
            ),
            ("57014", Phase::Other, timeout),
            (
                "57P01",
                Phase::Other,
                LedgerError::unavailable(UnavailableKind::ConnectionLost),
            ),
            (
                "08006",
                Phase::Other,
                LedgerError::unavailable(UnavailableKind::ConnectionLost),
            ),
            (
                "57P03",
                Phase::Other,
                LedgerError::unavailable(UnavailableKind::StoreNotReady),
            ),
            (
                "53300",
                Phase::Other,
                LedgerError::unavailable(UnavailableKind::StoreNotReady),
            ),
        ];
        for (code, phase, expected) in cases {
            assert_eq!(map_database_code(code, phase), expected, "code {code}");
        }
        for code in ["23514", "275", "23505", "42P01"] {
            assert!(matches!(
                map_database_code(code, Phase::Other),
                LedgerError::Internal { .. }
            ));
        }
    }

    #[test]
    fn pool_and_connection_errors_are_unavailable_never_internal() {
        assert_eq!(
            map_db_err(
                DbErr::ConnectionAcquire(ConnAcquireErr::Timeout),
                Phase::Other
            ),
            LedgerError::unavailable(UnavailableKind::PoolTimeout)
        );
        assert_eq!(
            map_db_err(
                DbErr::ConnectionAcquire(ConnAcquireErr::ConnectionClosed),
                Phase::Other
            ),
            LedgerError::unavailable(UnavailableKind::ConnectionLost)
        );
        assert_eq!(
            map_db_err(
                DbErr::Exec(RuntimeErr::SqlxError(std::sync::Arc::new(
                    sqlx::Error::PoolTimedOut
                ))),
                Phase::Other
            ),
            LedgerError::unavailable(UnavailableKind::PoolTimeout)
        );
        assert_eq!(
            map_db_err(
                DbErr::Query(RuntimeErr::SqlxError(std::sync::Arc::new(sqlx::Error::Io(
                    std::io::Error::from(std::io::ErrorKind::ConnectionReset)
                )))),
                Phase::Other
            ),
            LedgerError::unavailable(UnavailableKind::ConnectionLost)
        );
    }
}
