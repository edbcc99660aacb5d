//! Opening connections configured the way the ledger needs them.

use std::path::Path;
use std::time::Duration;

use sea_orm::sqlx::postgres::PgConnectOptions;
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

/// Connection settings that the ledger's behaviour depends on.
#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// How long a claim may wait behind another unit of work's uncommitted claim of the same
    /// identity before answering `InFlight` (PostgreSQL `lock_timeout`, SQLite busy timeout).
    /// It bounds every lock wait on these connections, not only the ledger's.
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

/// Connects a pool to PostgreSQL with `lock_timeout` set to the claim wait on every connection.
/// Does not apply migrations: a deployment applies [`LedgerMigrator`] when it chooses.
pub async fn connect_postgres(
    url: &str,
    config: &LedgerConfig,
) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(url.to_owned());
    pool_options(&mut options, config);
    let lock_timeout = format!("{}ms", config.claim_wait.as_millis().max(1));
    options.map_sqlx_postgres_opts(move |pg: PgConnectOptions| {
        pg.options([("lock_timeout", lock_timeout.as_str())])
    });
    Database::connect(options).await
}

fn pool_options(options: &mut ConnectOptions, config: &LedgerConfig) {
    options
        .max_connections(config.max_connections)
        .min_connections(0)
        .acquire_timeout(config.acquire_timeout)
        .sqlx_logging(false);
}
