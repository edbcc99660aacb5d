//! What stands between the ledger's pool and PostgreSQL, and how a deployment that does not say
//! finds out.

#[cfg(feature = "postgres")]
use sea_orm::sqlx::postgres::PgConnection;
#[cfg(feature = "postgres")]
use sea_orm::sqlx::{self, Connection, Executor, Row};
use sea_orm::{DatabaseConnection, DbErr};

/// What stands between the ledger's pool and PostgreSQL, which decides how statements may be
/// prepared.
///
/// The default, [`Pooler::Unknown`], is found out by [`resolve_pooler`](crate::resolve_pooler) before the pool is
/// opened (the demo and the operator CLI do), and works behind any pooler where it is not: the
/// person who sets the URL is often not the person who knows a pooler sits behind it, so no
/// setting must be needed for the calls to work. ADR 0009 gives what each choice costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pooler {
    /// Not known (the default). [`resolve_pooler`](crate::resolve_pooler) replaces it with what it finds; a pool opened
    /// with it unresolved uses the statements of [`Pooler::TransactionPooling`], which work
    /// everywhere, at their price.
    #[default]
    Unknown,
    /// Nothing, or a pooler that gives each client one server connection for its whole session
    /// (PgBouncer's session pooling). Statements are prepared once per connection and cached.
    /// Behind a pooler in transaction pooling this setting fails calls as INTERNAL, with a
    /// message that names it.
    None,
    /// A pooler that hands the server connection to another client at every transaction's end
    /// (PgBouncer's transaction pooling; also with its `max_prepared_statements`, from 1.21,
    /// where [`Pooler::None`] would be faster, but only a deployment can say that it is set).
    ///
    /// The driver names every statement it prepares (`sqlx_s_1`, `sqlx_s_2`, … counted per
    /// client connection), so two clients that meet on one server connection collide, and a
    /// cached statement is missing on the next server connection. In this mode the pool caches
    /// no statement, and every unit of work the adapter begins first drops the statements other
    /// clients left on its server connection (`DEALLOCATE ALL`, which only this unit can see
    /// while it holds the connection; it rides in the message that sets the unit's lock wait, so
    /// it costs no round trip). And nothing may run outside a transaction: the driver prepares in
    /// one round trip and executes in the next, between which the pooler may hand the connection
    /// away. Use the ledger through [`SeaOrmUnitsOfWork`](crate::SeaOrmUnitsOfWork) (the guard
    /// does), or `grpc_core_api::UnitPerCall` for calls that commit on their own; apply
    /// migrations with [`migrate`](crate::migrate) on the pool opened with this configuration.
    TransactionPooling,
}

impl Pooler {
    /// Whether statements may be prepared once per connection and reused: only when nothing
    /// hands the pool's server connections to other clients between its transactions.
    pub fn caches_statements(self) -> bool {
        self == Self::None
    }
}

/// Rounds of the probe at most; each ends the probe once it has proof.
#[cfg(feature = "postgres")]
const PROBE_ROUNDS: usize = 8;

/// What stands in front of the PostgreSQL server `url` names: a build without PostgreSQL cannot
/// reach one.
#[cfg(not(feature = "postgres"))]
pub(crate) async fn probe(_url: &str) -> Result<Pooler, DbErr> {
    Err(DbErr::Custom(
        "this build of grpc-operation-ledger-seaorm has no PostgreSQL driver: enable its feature \
         `postgres`"
            .to_owned(),
    ))
}

/// What stands in front of the PostgreSQL server `url` names (see [`resolve_pooler`](crate::resolve_pooler)).
#[cfg(feature = "postgres")]
pub(crate) async fn probe(url: &str) -> Result<Pooler, DbErr> {
    probe_rounds(url).await.map_err(|error| {
        DbErr::Custom(format!(
            "probing for a pooler in front of PostgreSQL: {error}"
        ))
    })
}

#[cfg(feature = "postgres")]
async fn probe_rounds(url: &str) -> Result<Pooler, sqlx::Error> {
    let mut first = PgConnection::connect(url).await?;
    let mut second = PgConnection::connect(url).await?;
    let mut found = Pooler::None;
    let mut first_process = backend_pid(&mut first).await?;
    for _ in 0..PROBE_ROUNDS {
        second.execute(sqlx::raw_sql("BEGIN")).await?;
        let taken = backend_pid(&mut second).await;
        second.execute(sqlx::raw_sql("ROLLBACK")).await?;
        let first_again = backend_pid(&mut first).await?;
        if taken? == first_process || first_again != first_process {
            found = Pooler::TransactionPooling;
            break;
        }
        first_process = first_again;
    }
    // Closed politely, so that a pooler sees a clean end (a dropped connection works as well).
    let _ = first.close().await;
    let _ = second.close().await;
    Ok(found)
}

/// The server process behind `connection` for this one statement.
#[cfg(feature = "postgres")]
async fn backend_pid(connection: &mut PgConnection) -> Result<String, sqlx::Error> {
    let row = connection
        .fetch_one(sqlx::raw_sql("SELECT pg_backend_pid()::text"))
        .await?;
    row.try_get::<String, _>(0)
}

/// Whether `db`'s connections cache the statements they prepare (always, but on a PostgreSQL
/// pool opened for a pooler that hands server connections over: see [`connect_postgres`](crate::connect_postgres)).
/// Read from the pool's own options, which sqlx renders with their statement cache's capacity.
#[cfg(not(feature = "postgres"))]
pub(crate) fn caches_statements(_db: &DatabaseConnection) -> bool {
    true
}

/// Whether `db`'s connections cache the statements they prepare (always, but on a PostgreSQL
/// pool opened for a pooler that hands server connections over: see [`connect_postgres`](crate::connect_postgres)).
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
