//! Opening connections configured the way the ledger needs them.

#[cfg(feature = "sqlite")]
use std::path::Path;
use std::time::Duration;

#[cfg(feature = "sqlite")]
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

use crate::LedgerConfig;
use crate::pooler::{Pooler, probe};

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
                if crate::error::sqlite_busy(&error)
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

/// `config` with its pooler found out, when it is [`Pooler::Unknown`] and `url` names a
/// PostgreSQL server (any other setting, and any other store, is returned as it is).
///
/// The probe rests on two things only a pooler that hands server connections over between
/// transactions can do; straight to PostgreSQL, or in session pooling, a client keeps one server
/// process from its connection to its end, and no other client ever gets it. One client
/// connection asks for its server process (`pg_backend_pid()`); a second client connection asks
/// inside a transaction and ends it; the first asks again. The pooler is a transaction pooler
/// when the second client was handed the first one's process (a quiet pooler hands out the one
/// released last, PgBouncer's default, or the one idle longest, its `server_round_robin`), or
/// when the first client's process changed between its statements (a busy pooler buries the
/// first client's process under the ones other clients released since). Either is proof, so a
/// direct connection or a session pooler is never taken for a transaction pooler. Up to eight
/// rounds, ending at the first proof; nothing is held while the other client waits, so a pool of
/// one server connection cannot stall it. Every statement goes over the simple query protocol,
/// which prepares nothing.
///
/// A transaction pooler that handed both clients their own process in every round would go
/// unseen: a deployment that knows it is behind one should say [`Pooler::TransactionPooling`];
/// one that knows it is not may say [`Pooler::None`] and skip the probe. Behind a transaction
/// pooler the probe missed, calls fail as INTERNAL with a message naming
/// [`Pooler::TransactionPooling`], never with a wrong answer.
pub async fn resolve_pooler(url: &str, config: LedgerConfig) -> Result<LedgerConfig, DbErr> {
    if config.pooler != Pooler::Unknown
        || ServerKind::of_url(url).ok() != Some(ServerKind::Postgres)
    {
        return Ok(config);
    }
    let found = probe(url).await?;
    tracing::info!(pooler = ?found, "found what stands between the ledger and PostgreSQL");
    Ok(config.with_pooler(found))
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
