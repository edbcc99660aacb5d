//! Where the service keeps its ledger and payments, the service on it, and the server.

use std::fmt;
use std::sync::Arc;

use grpc_core_api::{KeyHasher, RequestSchema};
use grpc_operation_ledger_seaorm::{
    LedgerConfig, Pooler, SeaOrmUnitsOfWork, ServerKind, connect_server, migrate, open_sqlite,
    resolve_pooler,
};
use grpc_tonic::{GuardConfig, GuardMode, KeyedMutationGuard};
use sea_orm::DatabaseConnection;

use crate::DESCRIPTOR_SET;
use crate::pb;
use crate::server::{Faults, PaymentsService, authenticate, prepare_database};

/// Where the service keeps its ledger and payments.
#[derive(Debug, Clone)]
pub enum Store {
    /// An embedded SQLite file (created if missing).
    Sqlite(std::path::PathBuf),
    /// A database server: PostgreSQL (`postgres://`), or MariaDB/MySQL (`mysql://`).
    Server {
        /// Its URL.
        url: String,
        /// What stands between the service and PostgreSQL ([`Pooler::Unknown`] unless the
        /// deployment knows there is no transaction pooler).
        pooler: Pooler,
    },
}

/// Opens the store (creating the SQLite file, or applying the ledger's migrations on PostgreSQL)
/// and the demo's business tables.
pub async fn open_store(store: &Store) -> anyhow::Result<(DatabaseConnection, LedgerConfig)> {
    let (db, config) = open_ledger_store(store).await?;
    prepare_database(&db).await?;
    Ok((db, config))
}

/// Opens the store with the ledger's tables only (a service's business tables are its own).
pub async fn open_ledger_store(
    store: &Store,
) -> anyhow::Result<(DatabaseConnection, LedgerConfig)> {
    let mut config = LedgerConfig::default().with_max_connections(32);
    let db = match store {
        Store::Sqlite(path) => open_sqlite(path, &config).await?,
        Store::Server { url, pooler } => {
            // Unless the deployment said, find out whether a pooler hands connections over
            // between transactions, before the pool decides how it prepares statements.
            config = resolve_pooler(url, config.with_pooler(*pooler)).await?;
            let (db, _) = connect_server(url, &config).await?;
            migrate(&db).await?;
            db
        }
    };
    Ok((db, config))
}

impl fmt::Display for Store {
    /// The kind of store, never its URL (which may carry a password).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "SQLite {}", path.display()),
            Self::Server { url, pooler } => match ServerKind::of_url(url) {
                Ok(ServerKind::Postgres) if pooler.caches_statements() => {
                    f.write_str("PostgreSQL (direct, statements cached)")
                }
                Ok(kind) => write!(f, "{kind}"),
                Err(_) => f.write_str("an unknown database server"),
            },
        }
    }
}

/// How the demo's service hashes idempotency keys: HMAC-SHA-256 with a server secret, as a
/// production deployment should (a demo's secret, published here: never reuse it).
pub fn key_hasher() -> anyhow::Result<KeyHasher> {
    Ok(KeyHasher::hmac_sha256(
        b"demo-server-secret-change-me-0123",
    )?)
}

/// The payments service on `db`, its guard in `mode`, with the fault layer `faults` after each
/// commit.
pub fn service(
    db: &DatabaseConnection,
    config: &LedgerConfig,
    mode: GuardMode,
    faults: Arc<Faults>,
    id_prefix: &str,
) -> anyhow::Result<PaymentsService> {
    let hasher = key_hasher()?;
    // Clients that cannot set the key header send it as the request's `request_id` (AIP-155).
    let (guard_config, _) = GuardConfig::new(
        hasher,
        RequestSchema::from_file_descriptor_set(DESCRIPTOR_SET)?,
    )
    // Write-once fits the demo's handler: its one effect is the payment row, in the unit.
    .with_mode(mode)
    .with_aip155_request_ids();
    let guard = KeyedMutationGuard::new(SeaOrmUnitsOfWork::new(db.clone(), config), guard_config);
    Ok(PaymentsService::new(guard, faults, id_prefix))
}

/// Serves `service` (the demo's, or another implementation of its API, as the benchmarks' baseline)
/// on `listener`, behind the demo's token check, until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: impl pb::payments_server::Payments,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    serve_with(listener, service, None, authenticate, shutdown).await
}

/// Serves `service` on `listener` over TLS as `tls` configures it, until `shutdown` completes:
/// with `tls` requiring client certificates (`client_ca_root`), the handshake refuses a client
/// without a certificate the CA signed and in its validity, and the service's guard names each
/// caller from the certificate (`PaymentsService::with_caller_extractor` with a
/// `grpc_tonic::MtlsCallerExtractor`). No token is asked for.
pub async fn serve_mtls(
    listener: tokio::net::TcpListener,
    service: impl pb::payments_server::Payments,
    tls: tonic::transport::ServerTlsConfig,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    serve_with(listener, service, Some(tls), Ok, shutdown).await
}

/// Serves `service` on `listener`, over `tls` when given, each call admitted by `admit`.
async fn serve_with(
    listener: tokio::net::TcpListener,
    service: impl pb::payments_server::Payments,
    tls: Option<tonic::transport::ServerTlsConfig>,
    admit: fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls)?;
    }
    server
        // The guard reads each call's method from its path, checked once here.
        .layer(grpc_tonic::MethodFromPathLayer)
        .add_service(pb::payments_server::PaymentsServer::with_interceptor(
            service, admit,
        ))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await?;
    Ok(())
}
