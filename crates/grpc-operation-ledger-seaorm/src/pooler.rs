//! What stands between the ledger's pool and PostgreSQL, and how a deployment that does not say
//! finds out.

use sea_orm::DbErr;
#[cfg(feature = "postgres")]
use sea_orm::sqlx::postgres::PgConnection;
#[cfg(feature = "postgres")]
use sea_orm::sqlx::{self, Connection, Executor, Row};

use crate::{LedgerConfig, ServerKind};

/// What stands between the ledger's pool and PostgreSQL, which decides how statements may be
/// prepared.
///
/// The default, [`Pooler::Unknown`], is found out by [`resolve_pooler`] before the pool is
/// opened (the demo and the operator CLI do), and works behind any pooler where it is not: the
/// person who sets the URL is often not the person who knows a pooler sits behind it, so no
/// setting must be needed for the calls to work. ADR 0009 gives what each choice costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pooler {
    /// Not known (the default). [`resolve_pooler`] replaces it with what it finds; a pool opened
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

/// Rounds of the probe at most; each ends the probe once it has proof.
#[cfg(feature = "postgres")]
const PROBE_ROUNDS: usize = 8;

/// What stands in front of the PostgreSQL server `url` names: a build without PostgreSQL cannot
/// reach one.
#[cfg(not(feature = "postgres"))]
async fn probe(_url: &str) -> Result<Pooler, DbErr> {
    Err(DbErr::Custom(
        "this build of grpc-operation-ledger-seaorm has no PostgreSQL driver: enable its feature \
         `postgres`"
            .to_owned(),
    ))
}

/// What stands in front of the PostgreSQL server `url` names (see [`resolve_pooler`]).
#[cfg(feature = "postgres")]
async fn probe(url: &str) -> Result<Pooler, DbErr> {
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
