//! What an adapter's test provides to the suite.

use std::time::Duration;

use async_trait::async_trait;
use grpc_core_api::{GrpcOperationLedger, LedgerError};

/// How a store differs from others, as far as the contract's cases can tell.
///
/// Built with [`Capabilities::new`] and the `with_`/`without_` methods, never as a literal: a
/// capability added in a later version arrives with a default that keeps every existing fixture
/// compiling and its cases running as before.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Capabilities {
    /// The bound a claim waits behind another unit's uncommitted claim before `InFlight`.
    pub claim_wait: Duration,
    /// Writers run concurrently on separate connections. When false (SQLite has one writer), a
    /// unit that waited past the bound for the write lock may be refused with `Unavailable` or
    /// `InFlight`, which concurrency cases then accept as "not a winner".
    pub concurrent_writers: bool,
    /// The fixture can kill a unit of work's connection in the middle of the unit.
    pub kill_connection: bool,
    /// How many identities the concurrent-claims case races 32 claims on.
    pub concurrent_claim_identities: usize,
    /// The store has a schema its fixture can create from nothing, and [`LedgerStore::migrate`]
    /// applies the ledger's migrations on connections of their own, as a starting process does.
    pub migrations: bool,
    /// Units of work may run on different primaries of a multi-primary cluster (Galera): a
    /// duplicate claim on another node does not wait behind the first, both units believe they
    /// claimed, and the store lets only the first to commit do so (the other's commit is a
    /// serialisation failure).
    pub multi_primary: bool,
}

impl Capabilities {
    /// A single-primary store with concurrent writers and migrations, whose fixture cannot kill a
    /// connection, racing 50 identities; `claim_wait` is the bound its claims wait.
    pub fn new(claim_wait: Duration) -> Self {
        Self {
            claim_wait,
            concurrent_writers: true,
            kill_connection: false,
            concurrent_claim_identities: 50,
            migrations: true,
            multi_primary: false,
        }
    }

    /// One writer at a time (SQLite).
    pub fn without_concurrent_writers(mut self) -> Self {
        self.concurrent_writers = false;
        self
    }

    /// The fixture can kill a unit's connection from outside.
    pub fn with_kill_connection(mut self) -> Self {
        self.kill_connection = true;
        self
    }

    /// How many identities the concurrent-claims case races claims on.
    pub fn with_concurrent_claim_identities(mut self, identities: usize) -> Self {
        self.concurrent_claim_identities = identities;
        self
    }

    /// No schema to create or migrate (an in-memory store).
    pub fn without_migrations(mut self) -> Self {
        self.migrations = false;
        self
    }

    /// Units may run on different primaries of a multi-primary cluster.
    pub fn multi_primary(mut self) -> Self {
        self.multi_primary = true;
        self
    }
}

/// A ledger row as a support script, a backfill or a hand-written migration would write it,
/// bypassing the adapter: what the store itself must refuse when it breaks the contract's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRow<'a> {
    /// The stored state name.
    pub state: &'a str,
    /// Whether the row has a completion time.
    pub completed: bool,
    /// The outcome reference column.
    pub outcome_reference: Option<&'a str>,
    /// The failure code column.
    pub failure_code: Option<i32>,
    /// The failure message column.
    pub failure_message: Option<&'a str>,
}

/// Hands out a fresh, empty store for each case.
#[async_trait]
pub trait LedgerFixture: Send + Sync {
    /// The store type.
    type Store: LedgerStore + 'static;
    /// What the store can do.
    fn capabilities(&self) -> Capabilities;
    /// A fresh store with the ledger's schema and a business table, and nothing in them.
    async fn fresh_store(&self) -> Self::Store;
    /// A fresh store without the ledger's schema (its migrations not applied). Called only when
    /// the fixture declares [`Capabilities::migrations`]; the default panics.
    async fn fresh_unmigrated_store(&self) -> Self::Store {
        panic!("a fixture that declares `migrations` must implement `fresh_unmigrated_store`")
    }
}

/// One fresh store.
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// A unit of work on this store.
    type Unit: UnitOfWork + 'static;
    /// Begins a unit of work on a connection of its own.
    async fn begin(&self) -> Result<Self::Unit, LedgerError>;
    /// A ledger whose every call commits on its own (the claim-first mode), also used to
    /// inspect committed state.
    fn autocommit(&self) -> Box<dyn GrpcOperationLedger + '_>;
    /// How many committed business rows carry `key`.
    async fn business_rows(&self, key: &str) -> u64;
    /// How many committed ledger rows exist.
    async fn ledger_rows(&self) -> u64;
    /// Writes `row` under a new identity straight into the store, bypassing the adapter, and
    /// says whether the store accepted it.
    async fn write_raw_row(&self, row: RawRow<'_>) -> bool;
    /// Applies the ledger's migrations on a connection of its own, as a process starting up
    /// does. Called only when the fixture declares [`Capabilities::migrations`]; the default
    /// panics.
    async fn migrate(&self) -> Result<(), LedgerError> {
        panic!("a store whose fixture declares `migrations` must implement `migrate`")
    }
}

/// A unit of work: the caller's transaction, with the ledger bound to it.
#[async_trait]
pub trait UnitOfWork: Send + Sync + Sized {
    /// The ledger running inside this unit.
    fn ledger(&self) -> Box<dyn GrpcOperationLedger + '_>;
    /// The business write (one row carrying `key`) inside this unit.
    async fn business_write(&self, key: &str) -> Result<(), LedgerError>;
    /// Commits the unit.
    async fn commit(self) -> Result<(), LedgerError>;
    /// Rolls the unit back.
    async fn rollback(self) -> Result<(), LedgerError>;
    /// Kills the unit's connection from outside (only called when the store has the
    /// `kill_connection` capability).
    async fn kill_connection(&self);
}
