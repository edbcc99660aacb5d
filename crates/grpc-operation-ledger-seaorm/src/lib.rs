//! The SeaORM adapter of [`grpc_core_api::GrpcOperationLedger`].
//!
//! - [`LedgerMigrator`] creates the ledger table. It keeps its own migrations table
//!   (`grpc_operation_ledger_migrations`), so a deployment can apply it on its own or add
//!   [`ledger_migrations`] to its own migrator.
//! - [`SeaOrmOperationLedger`] implements the port on whatever SeaORM connection its caller gives
//!   it: a `DatabaseConnection` (each statement commits on its own) or the caller's
//!   `DatabaseTransaction` (the claim, the business write and the transition commit together). It
//!   never opens a transaction of its own.
//! - [`open_sqlite`] and [`connect_postgres`] open connections configured the way the ledger needs
//!   them (a bounded wait for a duplicate claim, WAL and a busy timeout on SQLite).
//!
//! # Which store
//!
//! SQLite is the embedded default: one process, one file, no server to run, durable across
//! restarts of that process. Use PostgreSQL as soon as more than one process serves the same
//! operations, or when the ledger must survive the loss of the machine.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use grpc_core_api::*;
//! use grpc_operation_ledger_seaorm::{LedgerConfig, SeaOrmOperationLedger, open_sqlite};
//! use sea_orm::TransactionTrait;
//!
//! # let dir = std::env::temp_dir().join(format!("ledger-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! let db = open_sqlite(&dir.join("ledger.sqlite"), &LedgerConfig::default()).await?;
//! let identity = GrpcOperationIdentity::new(
//!     CallerFingerprint::from_principal(b"spiffe://bank.example/checkout"),
//!     GrpcMethod::parse("/payments.v1.Payments/CreatePayment")?,
//!     KeyHasher::Sha256.hash(&IdempotencyKey::parse("order-4711")?),
//! );
//! let lease = LeaseDuration::new(std::time::Duration::from_secs(30))?;
//!
//! let txn = db.begin().await?;
//! let ledger = SeaOrmOperationLedger::new(&txn);
//! if let ClaimOutcome::Claimed { version, .. } =
//!     ledger.claim(&identity, &RequestFingerprint::of(b"request"), lease).await?
//! {
//!     // ... the business write, on `txn` ...
//!     ledger.mark_committed(&identity, version, &OutcomeReference::parse("payment-1")?).await?;
//! }
//! txn.commit().await?;
//!
//! // The same request again replays the recorded outcome.
//! let again = SeaOrmOperationLedger::new(&db)
//!     .claim(&identity, &RequestFingerprint::of(b"request"), lease)
//!     .await?;
//! assert!(matches!(again, ClaimOutcome::Completed(record)
//!     if record.outcome_reference().map(OutcomeReference::as_str) == Some("payment-1")));
//! # db.close().await?;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(not(any(feature = "postgres", feature = "mysql", feature = "sqlite")))]
compile_error!(
    "grpc-operation-ledger-seaorm needs at least one store: enable its feature `postgres`, \
     `mysql` or `sqlite`"
);

mod admin;
mod config;
mod connect;
mod error;
mod ledger;
mod migration;
#[cfg(feature = "sql-mutants")]
pub mod mutants;
#[cfg(not(feature = "sql-mutants"))]
mod mutants {
    /// Without `sql-mutants`, every check of a statement's result holds.
    pub(crate) fn ignores(_check: &str) -> bool {
        false
    }
}
mod pooler;
mod sql;
mod units;

pub use admin::{
    KEY_HASH_PREFIX_LEN, LedgerStats, ListFilter, ListedOperation, find_listed, ledger_stats,
    list_operations, state_named,
};
pub use config::LedgerConfig;
#[cfg(feature = "mysql")]
pub use connect::connect_mysql;
#[cfg(feature = "postgres")]
pub use connect::connect_postgres;
#[cfg(feature = "sqlite")]
pub use connect::open_sqlite;
pub use connect::{ServerKind, connect_server, database_url, resolve_pooler};
pub use error::store_error;
pub use ledger::{LedgerConnection, SeaOrmOperationLedger};
pub use migration::{LEDGER_TABLE, LedgerMigrator, MIGRATIONS_TABLE, ledger_migrations, migrate};
pub use pooler::Pooler;
pub use sql::{claim_as_sent, in_dialect, sent_statements, statements};
pub use units::{SeaOrmUnitsOfWork, lock_timeout_statement};
