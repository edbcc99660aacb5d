//! Opening connections configured the way the ledger needs them.

#[cfg(feature = "sqlite")]
use std::path::Path;
use std::time::Duration;

#[cfg(feature = "sqlite")]
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

use crate::Pooler;

/// Connection settings that the ledger's behaviour depends on.
///
/// `#[non_exhaustive]`: start from [`LedgerConfig::default`] and change what you need with the
/// `with_` methods, so that a new setting (with its default) breaks no caller.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LedgerConfig {
    /// How long a claim may wait behind another unit of work's uncommitted claim of the same
    /// identity before answering `InFlight`. On PostgreSQL the claim sets `lock_timeout` to it
    /// for the rest of its unit of work; on SQLite it is the busy timeout of every connection.
    pub claim_wait: Duration,
    /// Pool size.
    pub max_connections: u32,
    /// How long to wait for a free pooled connection before answering `Unavailable`.
    pub acquire_timeout: Duration,
    /// What stands between the pool and PostgreSQL: by default [`Pooler::Unknown`], which
    /// [`resolve_pooler`](crate::resolve_pooler) finds out, and which works behind any pooler
    /// when it is not found out.
    pub pooler: Pooler,
}

impl LedgerConfig {
    /// How long a claim may wait behind another unit of work's uncommitted claim.
    pub fn with_claim_wait(mut self, wait: Duration) -> Self {
        self.claim_wait = wait;
        self
    }

    /// The pool size.
    pub fn with_max_connections(mut self, connections: u32) -> Self {
        self.max_connections = connections;
        self
    }

    /// How long to wait for a free pooled connection.
    pub fn with_acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// What stands between the pool and PostgreSQL.
    pub fn with_pooler(mut self, pooler: Pooler) -> Self {
        self.pooler = pooler;
        self
    }
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            claim_wait: Duration::from_secs(2),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            pooler: Pooler::Unknown,
        }
    }
}

/// Opens (creating if missing) a SQLite file in WAL mode with the configured busy timeout, applies
/// the ledger's migrations, and returns a pool. Several processes may open the same new file at
/// once: a start that finds the file busy tries again for up to 30 s.
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub async fn open_sqlite(path: &Path, config: &LedgerConfig) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(format!("sqlite://{}", path.display()));
    pool_options(&mut options, config);
    options.test_before_acquire(false);
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
    // A new file is made a WAL file by the first connection: processes opening it at the same
    // moment can find it locked before their busy timeout applies (seen with short timeouts), so a
    // start that finds it busy tries again, as the migration does.
    let started = std::time::Instant::now();
    let db = loop {
        match Database::connect(options.clone()).await {
            Err(error)
                if crate::migration::sqlite_busy(&error)
                    && started.elapsed() < crate::migration::MIGRATION_PATIENCE =>
            {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            connected => break connected?,
        }
    };
    crate::migrate(&db).await?;
    Ok(db)
}

/// Connects a pool to PostgreSQL. It sets nothing on the connections themselves (no startup
/// `options`): the claim's bounded wait travels with the transaction (set when a unit begins, or
/// before a write; see `SeaOrmOperationLedger`), so the pool works directly and behind a pooler,
/// as `config.pooler` says (see [`Pooler`]): the statement cache is on only for
/// [`Pooler::None`], and what the ledger does on the pool follows from the pool, so one setting
/// decides it, here. Does not apply migrations: a deployment applies them with
/// [`migrate`](crate::migrate) when it chooses. A pooled connection is pinged before it is handed
/// out only when it has been idle for 30 s or more; a busy one that was cut is found by the `BEGIN`
/// of a unit of work (`SeaOrmUnitsOfWork`), which is then sent again on another connection. A
/// statement sent on the pool outside a unit finds a cut connection as UNAVAILABLE.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub async fn connect_postgres(
    url: &str,
    config: &LedgerConfig,
) -> Result<DatabaseConnection, DbErr> {
    let mut options = ConnectOptions::new(url.to_owned());
    pool_options(&mut options, config);
    options.test_before_acquire_if_idle_for(PING_WHEN_IDLE_FOR);
    if !config.pooler.caches_statements() {
        options.map_sqlx_postgres_opts(|postgres| postgres.statement_cache_capacity(0));
    }
    Database::connect(options).await
}

/// Whether `db`'s connections cache the statements they prepare (always, but on a PostgreSQL
/// pool opened for a pooler that hands server connections over: see [`connect_postgres`]).
/// Read from the pool's own options, which sqlx renders with their statement cache's capacity.
#[cfg(not(feature = "postgres"))]
pub(crate) fn caches_statements(_db: &DatabaseConnection) -> bool {
    true
}

/// Whether `db`'s connections cache the statements they prepare (always, but on a PostgreSQL
/// pool opened for a pooler that hands server connections over: see [`connect_postgres`]).
/// Read from the pool's own options, which sqlx renders with their statement cache's capacity.
#[cfg(feature = "postgres")]
pub(crate) fn caches_statements(db: &DatabaseConnection) -> bool {
    use sea_orm::sqlx::ConnectOptions as _;
    if db.get_database_backend() != sea_orm::DbBackend::Postgres {
        return true;
    }
    let options = db.get_postgres_connection_pool().connect_options();
    options
        .to_url_lossy()
        .query_pairs()
        .find(|(name, _)| name == "statement-cache-capacity")
        .is_none_or(|(_, capacity)| capacity != "0")
}

/// Connects a pool to MariaDB (10.5 or later, for `INSERT ... RETURNING`; MySQL lacks that and
/// `SET STATEMENT`, so the ledger does not run on MySQL yet, and a claim there fails). Sets nothing
/// on the connections: the claim's bounded wait travels with the claim statement
/// (`SET STATEMENT max_statement_time`). Does not apply migrations. Pooled connections are
/// pinged as [`connect_postgres`]'s are.
/// `mariadb://` is taken for `mysql://` (the driver knows only the latter).
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub async fn connect_mysql(url: &str, config: &LedgerConfig) -> Result<DatabaseConnection, DbErr> {
    let url = match url.strip_prefix("mariadb://") {
        Some(rest) => format!("mysql://{rest}"),
        None => url.to_owned(),
    };
    if names_no_database(&url) {
        // Said before connecting: the server's own answer, once a statement runs, is the bare
        // "1046 (3D000): No database selected".
        return Err(DbErr::Custom(
            "the MariaDB URL names no database: add one after the port, as in \
             mysql://user:password@host:3306/ledger (the database must exist; \
             `cargo xtask mariadb url` prints one that does)"
                .to_owned(),
        ));
    }
    let mut options = ConnectOptions::new(url);
    pool_options(&mut options, config);
    options.test_before_acquire_if_idle_for(PING_WHEN_IDLE_FOR);
    Database::connect(options).await
}

/// Which database server a URL names, by its scheme: the one place a URL's kind is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServerKind {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `mysql://` or `mariadb://` (MariaDB 10.5 or later, see [`connect_mysql`]).
    MariaDb,
}

impl ServerKind {
    /// The server `url` names, or why the ledger runs on none by that name. The URL itself is not
    /// repeated in the error: it may carry a password.
    pub fn of_url(url: &str) -> Result<Self, DbErr> {
        let scheme = url
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase());
        match scheme.as_deref() {
            Some("postgres" | "postgresql") => Ok(Self::Postgres),
            Some("mysql" | "mariadb") => Ok(Self::MariaDb),
            _ => Err(DbErr::Custom(
                "a database server URL starts with postgres://, postgresql://, mysql:// or \
                 mariadb:// (for SQLite, give a file)"
                    .to_owned(),
            )),
        }
    }
}

impl std::fmt::Display for ServerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Postgres => "PostgreSQL",
            Self::MariaDb => "MariaDB",
        })
    }
}

/// Connects a pool to the server `url` names, PostgreSQL ([`connect_postgres`]) or MariaDB
/// ([`connect_mysql`]), by its scheme. Does not apply migrations.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unused_variables)
)]
pub async fn connect_server(
    url: &str,
    config: &LedgerConfig,
) -> Result<(DatabaseConnection, ServerKind), DbErr> {
    let kind = ServerKind::of_url(url)?;
    let connected = match kind {
        #[cfg(feature = "postgres")]
        ServerKind::Postgres => connect_postgres(url, config).await,
        #[cfg(feature = "mysql")]
        ServerKind::MariaDb => connect_mysql(url, config).await,
        #[allow(unreachable_patterns)]
        _ => Err(not_built_for(kind)),
    };
    connected.map(|db| (db, kind))
}

/// The refusal of a server this build has no driver for: the feature to enable.
#[allow(dead_code)]
fn not_built_for(kind: ServerKind) -> DbErr {
    let feature = match kind {
        ServerKind::Postgres => "postgres",
        ServerKind::MariaDb => "mysql",
    };
    DbErr::Custom(format!(
        "this build of grpc-operation-ledger-seaorm has no {kind} driver: enable its feature \
         `{feature}`"
    ))
}

/// Whether a server URL has no database in its path (`mysql://h:3306` or `mysql://h:3306/`).
#[cfg(feature = "mysql")]
fn names_no_database(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|url| url.path().trim_matches('/').is_empty())
}

fn pool_options(options: &mut ConnectOptions, config: &LedgerConfig) {
    options
        .max_connections(config.max_connections)
        .min_connections(0)
        .acquire_timeout(config.acquire_timeout)
        .sqlx_logging(false);
}

/// How long a pooled server connection may have sat idle and still be handed out without a ping
/// first. sqlx pings on every acquire by default, which is one round trip more for every unit of
/// work (one of a keyed call's seven, one of a plain write's four), and on a busy pool it only
/// ever finds connections alive. One idle this long may have been cut by the server, a pooler or
/// a firewall while no one looked, so it is pinged and replaced if dead. A busy connection cut
/// (a server restart, a killed session) is found by its unit's `BEGIN` instead, which took no
/// effect and is sent again on another connection (`begin_unit`, `tests/pool.rs`). A SQLite
/// connection is a file handle that nothing can cut, and is never pinged.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const PING_WHEN_IDLE_FOR: Duration = Duration::from_secs(30);

/// The URL of database `database` on the server `server_url` names: its path replaced, its
/// credentials, host, port and query kept (`postgres://u@h:5432/postgres?sslmode=disable` with
/// `ledger` gives `postgres://u@h:5432/ledger?sslmode=disable`; a MariaDB URL without a path gains
/// one). For deployments and tests that create a database per tenant or per case.
pub fn database_url(server_url: &str, database: &str) -> Result<String, DbErr> {
    let mut url = url::Url::parse(server_url)
        .map_err(|error| DbErr::Custom(format!("not a database URL: {error}")))?;
    if url.cannot_be_a_base() {
        return Err(DbErr::Custom("not a database server URL".to_owned()));
    }
    url.set_path(&format!("/{database}"));
    Ok(url.into())
}

#[cfg(test)]
mod tests {
    use super::{ServerKind, database_url};

    #[cfg(feature = "mysql")]
    #[tokio::test]
    async fn a_mariadb_url_without_a_database_is_refused_with_what_to_add() {
        for url in [
            "mysql://u:secret@127.0.0.1:9",
            "mariadb://u:secret@127.0.0.1:9/",
        ] {
            let refused = super::connect_mysql(url, &super::LedgerConfig::default())
                .await
                .expect_err(url)
                .to_string();
            assert!(refused.contains("names no database"), "{refused}");
            assert!(
                refused.contains("mysql://user:password@host:3306/ledger"),
                "{refused}"
            );
            assert!(!refused.contains("secret"), "{refused}");
        }
        assert!(!super::names_no_database("mysql://u:p@127.0.0.1:9/ledger"));
    }

    #[test]
    fn a_urls_scheme_names_its_server_and_nothing_else_is_guessed() {
        for (url, kind) in [
            ("postgres://u@h/db", ServerKind::Postgres),
            ("postgresql://u@h/db", ServerKind::Postgres),
            ("POSTGRES://u@h/db", ServerKind::Postgres),
            ("mysql://u:p@h:3306/db", ServerKind::MariaDb),
            ("mariadb://u:p@h:3306/db", ServerKind::MariaDb),
        ] {
            assert_eq!(ServerKind::of_url(url).unwrap(), kind, "{url}");
        }
        for url in [
            "sqlite://x.db",
            "/var/lib/ledger.sqlite",
            "http://h",
            "pg://u:secret@h",
        ] {
            let refused = ServerKind::of_url(url).expect_err(url).to_string();
            assert!(!refused.contains("secret"), "{refused}");
        }
    }

    #[test]
    fn the_database_is_replaced_and_everything_else_kept() {
        let cases = [
            (
                "postgres://u:p@127.0.0.1:5432/postgres?sslmode=disable",
                "postgres://u:p@127.0.0.1:5432/ledger?sslmode=disable",
            ),
            (
                "mysql://ledger:ledger@127.0.0.1:3306",
                "mysql://ledger:ledger@127.0.0.1:3306/ledger",
            ),
            (
                "mysql://ledger:ledger@127.0.0.1:3306/",
                "mysql://ledger:ledger@127.0.0.1:3306/ledger",
            ),
        ];
        for (server, expected) in cases {
            assert_eq!(
                database_url(server, "ledger").unwrap(),
                expected,
                "{server}"
            );
        }
        assert!(database_url("not a url", "ledger").is_err());
    }
}
