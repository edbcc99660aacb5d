//! The demo's own SQL in each store's dialect.

use sea_orm::{ConnectionTrait, Statement};

/// Writes `$N` placeholders in the connection's dialect (the demo's statements number them in
/// order, so MariaDB's bare `?` binds them right).
pub fn statement(db: &impl ConnectionTrait, sql: &str, values: Vec<sea_orm::Value>) -> Statement {
    let backend = db.get_database_backend();
    // The demo's stores are the ledger's, which all have a dialect.
    let sql = grpc_operation_ledger_seaorm::in_dialect(backend, sql).unwrap_or_else(|| sql.into());
    Statement::from_sql_and_values(backend, sql, values)
}
