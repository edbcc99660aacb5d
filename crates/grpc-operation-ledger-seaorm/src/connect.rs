//! Opening connections configured the way the ledger needs them.

use std::path::Path;
use std::time::Duration;

use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

/// Connection settings that the ledger's behaviour depends on.
#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// How long a claim may wait behind another unit of work's uncommitted claim of the same
    /// identity before answering `InFlight`. On PostgreSQL the claim sets `lock_timeout` to it
    /// for the rest of its unit of work; on SQLite it is the busy timeout of every connection.
    pub claim_wait: Duration,
    /// Pool size.
    pub max_connections: u32,
    /// How long to wait for a free pooled connection before answering `Unavailable`.
    pub acquire_timeout: Duration,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            claim_wait: Duration::from_secs(2),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
        }
    }
}

/// Opens (creating if missing) a SQLite file in WAL mode with the configured busy timeout, applies
/// the ledger's migrations, and returns a pool ready for one process.
pub async fn open_sqlite(path: &Path, config: &LedgerConfig) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(format!("sqlite://{}", path.display()));
    pool_options(&mut options, config);
    let busy_timeout = config.claim_wait;
    options.map_sqlx_sqlite_opts(move |sqlite: SqliteConnectOptions| {
        sqlite
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: an acknowledged commit survives an operating-system crash or power loss too,
            // which is the ledger's whole promise (NORMAL in WAL mode could lose the last ones).
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(busy_timeout)
            .foreign_keys(true)
    });
    let db = Database::connect(options).await?;
    crate::migrate(&db).await?;
    Ok(db)
}

/// Connects a pool to PostgreSQL. It sets nothing on the connections themselves (no startup
/// `options`): the claim's bounded wait travels with the claim statement, so the pool works
/// directly and through a connection pooler (PgBouncer in session pooling; in transaction pooling
/// only a pooler that keeps prepared statements, PgBouncer 1.21+ with `max_prepared_statements`,
/// since sqlx prepares every statement it sends with arguments under a name). Does not apply
/// migrations: a deployment applies them with [`migrate`](crate::migrate) when it chooses.
pub async fn connect_postgres(
    url: &str,
    config: &LedgerConfig,
) -> Result<DatabaseConnection, DbErr> {
    connect_pool(url, config).await
}

/// Connects a pool to MariaDB (10.5 or later, for `INSERT ... RETURNING`; MySQL lacks that and
/// `SET STATEMENT`, so the ledger does not run on MySQL yet, and a claim there fails). Sets nothing
/// on the connections: the claim's bounded wait travels with the claim statement
/// (`SET STATEMENT max_statement_time`). Does not apply migrations.
pub async fn connect_mysql(url: &str, config: &LedgerConfig) -> Result<DatabaseConnection, DbErr> {
    connect_pool(url, config).await
}

/// A pool with the ledger's pool settings and nothing else.
async fn connect_pool(url: &str, config: &LedgerConfig) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(url.to_owned());
    pool_options(&mut options, config);
    Database::connect(options).await
}

fn pool_options(options: &mut ConnectOptions, config: &LedgerConfig) {
    options
        .max_connections(config.max_connections)
        .min_connections(0)
        .acquire_timeout(config.acquire_timeout)
        .sqlx_logging(false);
}
