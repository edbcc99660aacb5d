//! Driver errors to port errors, at the adapter's boundary.
//!
//! Messages are built here from error codes, never copied from the driver: a driver's message
//! or detail can quote the values of a row (its key hash, its caller), and none of that belongs in
//! an error a client may see.

use grpc_core_api::store_errors::{During, from_sqlstate, statements_lost_behind_a_pooler};
use grpc_core_api::{LedgerError, UnavailableKind};
use sea_orm::{DbErr, RuntimeErr, error::ConnAcquireErr, sqlx};

/// What a statement was doing when it failed (see [`During`]).
pub(crate) type Phase = During;

/// What a store error means, as the ledger reports it: a transient state of the store (a lost
/// connection, a serialisation failure, a store not ready) is `Unavailable`, a bug is `Internal`,
/// and no message from the driver (which may quote row values) is kept. For the business writes
/// of a guarded handler, so that they fail the way the ledger's own statements do.
pub fn store_error(error: DbErr) -> LedgerError {
    map_db_err(error, Phase::Other)
}

/// `phase` judges the result: a failure of the store while committing is an unknown outcome
/// unless the store stated a refusal.
pub(crate) fn map_db_err(error: DbErr, phase: Phase) -> LedgerError {
    let unavailable = LedgerError::unavailable;
    phase.judge(match error {
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
    })
}

/// Whether `error`, from sending a statement on a pooled connection, says that the connection was
/// dead (cut by a server restart, a killed session or a pooler): the store reports the connection
/// lost, and the failure came from the statement, not from acquiring or opening a connection (the
/// store itself out of reach, where another try would only wait again).
pub(crate) fn found_dead_connection(error: &DbErr) -> bool {
    matches!(error, DbErr::Exec(_) | DbErr::Query(_))
        && matches!(
            map_db_err(error.clone(), Phase::Other),
            LedgerError::Unavailable {
                kind: UnavailableKind::ConnectionLost
            }
        )
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
            #[cfg(feature = "sqlite")]
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                return grpc_core_api::store_errors::from_sqlite_code(&code, phase);
            }
            #[cfg(feature = "mysql")]
            if let Some(mysql) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return grpc_core_api::store_errors::from_mysql_error(mysql.number(), phase);
            }
            map_sqlstate(&code, phase)
        }
        _ => LedgerError::internal("unexpected driver error"),
    }
}

/// PostgreSQL SQLSTATE codes, as [`from_sqlstate`] reads them, with this adapter's own advice for
/// statements lost behind a transaction pooler.
fn map_sqlstate(code: &str, phase: Phase) -> LedgerError {
    match code {
        // The pooler went unseen, or was configured as absent.
        "42P05" | "26000" => statements_lost_behind_a_pooler(
            "connect with LedgerConfig::default().with_pooler(Pooler::TransactionPooling) (not \
             Pooler::None), so that the pool caches no statement, and run every statement in a \
             unit of work",
        ),
        _ => from_sqlstate(code, phase),
    }
}

/// Whether `error` is MariaDB/MySQL's refusal of a duplicate key (1062): the claim's insert found
/// the identity's row. (Never, in a build without MariaDB.)
#[cfg(not(feature = "mysql"))]
pub(crate) fn is_duplicate_key(_error: &DbErr) -> bool {
    false
}

/// Whether `error` is MariaDB/MySQL's refusal of a duplicate key (1062): the claim's insert found
/// the identity's row.
#[cfg(feature = "mysql")]
pub(crate) fn is_duplicate_key(error: &DbErr) -> bool {
    let (DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e))) = error
    else {
        return false;
    };
    matches!(e.as_ref(), sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>().is_some_and(|m| m.number() == 1062))
}

/// Whether `error` is PostgreSQL's lock timeout (SQLSTATE 55P03): never, in a build without
/// PostgreSQL.
#[cfg(not(feature = "postgres"))]
pub(crate) fn lock_timed_out(_error: &DbErr) -> bool {
    false
}

/// Whether `error` is PostgreSQL's lock timeout (SQLSTATE 55P03).
#[cfg(feature = "postgres")]
pub(crate) fn lock_timed_out(error: &DbErr) -> bool {
    use sea_orm::{RuntimeErr, sqlx};
    let (DbErr::Exec(RuntimeErr::SqlxError(e)) | DbErr::Query(RuntimeErr::SqlxError(e))) = error
    else {
        return false;
    };
    let sqlx::Error::Database(db) = e.as_ref() else {
        return false;
    };
    db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .is_some_and(|pg| pg.code() == "55P03")
}

/// Whether `error` is SQLite's busy or locked file: never, in a build without SQLite.
#[cfg(not(feature = "sqlite"))]
pub(crate) fn sqlite_busy(_error: &DbErr) -> bool {
    false
}

/// Whether `error` is SQLite's busy or locked file (codes 5 and 6, extended codes included).
#[cfg(feature = "sqlite")]
pub(crate) fn sqlite_busy(error: &DbErr) -> bool {
    use sea_orm::{RuntimeErr, sqlx};
    let (DbErr::Conn(RuntimeErr::SqlxError(e))
    | DbErr::Exec(RuntimeErr::SqlxError(e))
    | DbErr::Query(RuntimeErr::SqlxError(e))) = error
    else {
        return false;
    };
    let sqlx::Error::Database(db) = e.as_ref() else {
        return false;
    };
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
        && db
            .code()
            .and_then(|code| code.parse::<u32>().ok())
            .is_some_and(|code| matches!(code & 0xff, 5 | 6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_lost_behind_a_pooler_name_the_setting() {
        let LedgerError::Internal { message } = map_sqlstate("42P05", Phase::Other) else {
            panic!("42P05 must be INTERNAL");
        };
        assert!(message.contains("Pooler::TransactionPooling"), "{message}");
        assert_eq!(
            map_sqlstate("40001", Phase::Other),
            LedgerError::unavailable(UnavailableKind::SerializationFailure)
        );
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
