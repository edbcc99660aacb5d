//! What an adapter's test provides to the suite.
//!
//! Three traits every fixture implements ([`LedgerFixture`], [`LedgerStore`], [`UnitOfWork`]), and
//! four optional hooks ([`Migrations`], [`ConnectionKiller`], [`TableLocking`], [`SkewedClock`])
//! for what only some stores can do. A hook is offered by returning it from the fixture (`Some(self)`); a case that
//! needs a hook the fixture does not offer is reported as not applicable, with why. Nothing here
//! panics by default: there is no capability flag that could disagree with a missing hook.

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
    /// The bound a claim waits behind a lock (another unit's uncommitted claim, a lock on the
    /// whole table) before it answers a retryable error. The cases allow it plus a few seconds.
    pub claim_wait: Duration,
    /// Writers run concurrently on separate connections. When false (SQLite has one writer), a
    /// unit that waited past the bound for the write lock may be refused with `Unavailable` or
    /// `InFlight`, which concurrency cases then accept as "not a winner".
    pub concurrent_writers: bool,
    /// How many identities the concurrent-claims case races 32 claims on.
    pub concurrent_claim_identities: usize,
    /// Units of work may run on different primaries of a multi-primary cluster (Galera): a
    /// duplicate claim on another node does not wait behind the first, both units believe they
    /// claimed, and the store lets only the first to commit do so (the other's commit is a
    /// serialisation failure).
    pub multi_primary: bool,
}

impl Capabilities {
    /// A single-primary store with concurrent writers, racing 50 identities; `claim_wait` is the
    /// bound its claims wait.
    pub fn new(claim_wait: Duration) -> Self {
        Self {
            claim_wait,
            concurrent_writers: true,
            concurrent_claim_identities: 50,
            multi_primary: false,
        }
    }

    /// One writer at a time (SQLite).
    pub fn without_concurrent_writers(mut self) -> Self {
        self.concurrent_writers = false;
        self
    }

    /// How many identities the concurrent-claims case races claims on.
    pub fn with_concurrent_claim_identities(mut self, identities: usize) -> Self {
        self.concurrent_claim_identities = identities;
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
///
/// [`LedgerStore::write_raw_row`] writes it under a new identity of its own choosing (any caller,
/// method and key hash no case uses), with a request fingerprint, a version, a claim time and a
/// lease of its own choosing, and the fields below exactly as given, whatever they hold: the
/// point is to see whether the store refuses them. Store `state` verbatim as the state column's
/// text (an adapter that stored states as numbers would have to turn `"1"` into its number, which
/// is the defect the case looks for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRow<'a> {
    /// The state column, verbatim: legal values are `IN_PROGRESS`, `COMMITTED` and
    /// `FAILED_TERMINAL`, and the store must refuse any other text.
    pub state: &'a str,
    /// Whether the row has a completion time (any time; the store must refuse a `COMMITTED` or
    /// `FAILED_TERMINAL` row without one).
    pub completed: bool,
    /// The outcome reference column: a `COMMITTED` row must have one of 1 to 1024 bytes.
    pub outcome_reference: Option<&'a str>,
    /// The failure's gRPC status code: a `FAILED_TERMINAL` row must have one, 1 to 16 (never 0,
    /// which is OK).
    pub failure_code: Option<i32>,
    /// The failure message: a `FAILED_TERMINAL` row must have one, of at most 1024 bytes (empty
    /// is legal).
    pub failure_message: Option<&'a str>,
}

/// Hands out a fresh, empty store for each case.
///
/// The suite spawns each case on a task of its own and bounds it (two minutes); a fixture and its
/// stores are shared with that task, so they are `Send + Sync + 'static`. Ports take `&self`: a
/// driver whose connection executes on `&mut` (sqlx's `PgConnection`, a `Transaction`) is kept
/// behind an async mutex (`tokio::sync::Mutex`) in the unit, locked for each statement.
#[async_trait]
pub trait LedgerFixture: Send + Sync {
    /// The store type.
    type Store: LedgerStore + 'static;
    /// What the store can do.
    fn capabilities(&self) -> Capabilities;
    /// A fresh store with the ledger's schema and a business table, and nothing in them.
    async fn fresh_store(&self) -> Self::Store;
    /// The migration hook, for stores with a schema to create (`Some(self)` when the fixture
    /// implements [`Migrations`]); `None`, the default, makes the migration case not applicable.
    fn migrations(&self) -> Option<&dyn Migrations<Store = Self::Store>> {
        None
    }
    /// The hook that kills a unit's connection from outside; `None`, the default, makes the
    /// killed-connection case not applicable.
    fn connection_killer(
        &self,
    ) -> Option<&dyn ConnectionKiller<Unit = <Self::Store as LedgerStore>::Unit>> {
        None
    }
    /// The hook that holds a lock on the whole ledger table; `None`, the default, makes the
    /// table-lock case not applicable (say why in your adapter's docs: every store with a table
    /// can express it).
    fn table_locking(&self) -> Option<&dyn TableLocking<Store = Self::Store>> {
        None
    }
    /// The hook that makes stores whose own clock disagrees with the process's; `None`, the
    /// default, makes the clock cases not applicable (say why in your adapter's docs: an
    /// embedded store's clock is the process's own, and some servers cannot shift theirs for one
    /// database).
    fn skewed_clock(&self) -> Option<&dyn SkewedClock<Store = Self::Store>> {
        None
    }
    /// The hook that makes a unit's COMMIT take effect while its answer is lost; `None`, the
    /// default, makes the lost-commit case not applicable (say why in your adapter's docs: an
    /// embedded store has no connection to lose; a networked one can stand behind
    /// [`CommitCutProxy`](crate::commit_cut::CommitCutProxy)).
    fn lost_commit(&self) -> Option<&dyn LostCommit<Store = Self::Store>> {
        None
    }
    /// Called after every case, whatever its outcome (also after a failed or timed-out case),
    /// with the case's name; bounded to 30 seconds. The place to drop databases or files the
    /// case's stores used: an async cleanup here, rather than in a `Drop` that blocks at runtime
    /// shutdown. The default does nothing.
    async fn after_case(&self, case: &'static str) {
        let _ = case;
    }
}

/// One fresh store.
#[async_trait]
pub trait LedgerStore: Send + Sync {
    /// A unit of work on this store.
    type Unit: UnitOfWork + 'static;
    /// Begins a unit of work on a connection of its own, as the adapter's units of work do for
    /// a server-side guard (the same isolation level, the same wait bounds).
    async fn begin(&self) -> Result<Self::Unit, LedgerError>;
    /// A ledger whose every call commits on its own (the claim-first mode), also used to
    /// inspect committed state.
    fn autocommit(&self) -> Box<dyn GrpcOperationLedger + '_>;
    /// How many committed business rows carry `key`.
    async fn business_rows(&self, key: &str) -> u64;
    /// How many committed ledger rows exist.
    async fn ledger_rows(&self) -> u64;
    /// Writes `row` under a new identity straight into the store, bypassing the adapter, and
    /// says whether the store accepted it (see [`RawRow`] for what each field must hold).
    async fn write_raw_row(&self, row: RawRow<'_>) -> bool;
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
}

/// Hook: stores with a schema, created and migrated by the adapter's migrations.
#[async_trait]
pub trait Migrations: Send + Sync {
    /// The fixture's store type.
    type Store: LedgerStore;
    /// A fresh store without the ledger's schema (its migrations not applied).
    async fn fresh_unmigrated_store(&self) -> Self::Store;
    /// Applies the ledger's migrations to `store` on connections of their own, as a process
    /// starting up does; the case runs sixteen at once.
    async fn migrate(&self, store: &Self::Store) -> Result<(), LedgerError>;
}

/// Hook: ends a unit of work's connection from outside, as an operator or a failover would.
#[async_trait]
pub trait ConnectionKiller: Send + Sync {
    /// The fixture's unit type.
    type Unit: UnitOfWork;
    /// Ends `unit`'s connection (its server session) from another connection; returns once it
    /// is gone.
    async fn kill_connection(&self, unit: &Self::Unit);
}

/// Hook: holds a lock on the whole ledger table, in a mode that conflicts with an insert, from a
/// connection of its own, as DDL, `LOCK TABLE`, a non-concurrent index build or `VACUUM FULL`
/// (PostgreSQL), `LOCK TABLES ... WRITE` or an `ALTER TABLE`'s metadata lock (MariaDB), or
/// another connection's write transaction (SQLite) do.
#[async_trait]
pub trait TableLocking: Send + Sync {
    /// The fixture's store type.
    type Store: LedgerStore;
    /// Takes the lock on `store`'s ledger table and returns once it is held.
    async fn lock_ledger_table(&self, store: &Self::Store) -> Box<dyn HeldTableLock>;
}

/// How far a store's clock is from the process's, and which way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSkew {
    /// The store's clock reads this much later than the process's.
    Ahead(Duration),
    /// The store's clock reads this much earlier than the process's.
    Behind(Duration),
}

impl ClockSkew {
    /// The skews the clock cases run with: an hour each way, far more than any lease or
    /// retention a case uses, so that a time read from the wrong clock cannot pass by luck.
    pub const CASES: [ClockSkew; 2] = [
        ClockSkew::Ahead(Duration::from_secs(3600)),
        ClockSkew::Behind(Duration::from_secs(3600)),
    ];

    /// The store's time when the process's is `process`.
    pub fn store_time(self, process: std::time::SystemTime) -> std::time::SystemTime {
        match self {
            ClockSkew::Ahead(by) => process + by,
            ClockSkew::Behind(by) => process - by,
        }
    }

    /// The skew in whole seconds, positive when the store is ahead (for an SQL interval).
    pub fn signed_seconds(self) -> i64 {
        match self {
            ClockSkew::Ahead(by) => by.as_secs() as i64,
            ClockSkew::Behind(by) => -(by.as_secs() as i64),
        }
    }

    /// The statements that give a fresh PostgreSQL database `database` this clock, for a
    /// [`SkewedClock`] hook, in the order to run them: the first (the database's search path) on
    /// a connection to *another* database, then the second (the functions) on a connection to
    /// `database`, both before the store's pools connect. A session takes its search path's
    /// default when it starts, and a pooler in session mode (PgBouncer) may hand the set-up
    /// session to the store later, so no session of `database` may start before the first.
    /// They put `clock_timestamp()`, `now()`, `statement_timestamp()` and
    /// `transaction_timestamp()` of schema `public`, each `pg_catalog`'s shifted by the skew,
    /// before `pg_catalog` on the database's search path. `CURRENT_TIMESTAMP` and `LOCALTIMESTAMP`
    /// are keywords, not functions, and cannot be shadowed: an adapter that reads them cannot
    /// offer the hook this way.
    pub fn postgres_statements(self, database: &str) -> [String; 2] {
        let shift = format!("make_interval(secs => {})", self.signed_seconds());
        let functions = [
            "clock_timestamp",
            "now",
            "statement_timestamp",
            "transaction_timestamp",
        ]
        .map(|function| {
            format!(
                "CREATE FUNCTION public.{function}() RETURNS timestamptz LANGUAGE sql \
                     VOLATILE AS $$ SELECT pg_catalog.{function}() + {shift} $$;"
            )
        })
        .join(" ");
        [
            format!("ALTER DATABASE {database} SET search_path = public, pg_catalog"),
            functions,
        ]
    }
}

/// Hook: a store whose own clock disagrees with the process's, as a database server on another
/// host's clock does. Everything the ledger writes or judges in time (claim time, lease end,
/// completion, takeover, renewal, purge cutoff, census) must come from the store's clock; an
/// adapter that computes any of it from the process's clock fails the clock cases.
///
/// On PostgreSQL, a fresh database whose `search_path` puts a schema with its own
/// `clock_timestamp()` (or `now()`, whichever the adapter reads) before `pg_catalog` does it.
#[async_trait]
pub trait SkewedClock: Send + Sync {
    /// The fixture's store type.
    type Store: LedgerStore;
    /// A fresh store, as [`LedgerFixture::fresh_store`] makes, whose clock reads `skew` away
    /// from the process's and runs at the same rate.
    async fn fresh_store_with_clock(&self, skew: ClockSkew) -> Self::Store;
}

/// Hook: a store whose units' COMMIT can reach the store while the answer to it never comes back,
/// as when the network, a proxy or the client's host fails between the two. The unit cannot know
/// whether it committed, and must not say it did not.
#[async_trait]
pub trait LostCommit: Send + Sync {
    /// The fixture's store type.
    type Store: LedgerStore;
    /// A fresh store, as [`LedgerFixture::fresh_store`] makes, and its switch: once armed, the
    /// next COMMIT of any of the store's units takes effect and its answer is lost (the unit's
    /// connection is cut after the store answered).
    async fn fresh_store_losing_commits(&self) -> (Self::Store, Box<dyn CommitCut>);
}

/// The switch of a [`LostCommit`] store.
pub trait CommitCut: Send + Sync {
    /// Makes the next COMMIT the one whose answer is lost.
    fn arm(&self);
}

/// A lock on the whole ledger table, held until released.
#[async_trait]
pub trait HeldTableLock: Send {
    /// Releases the lock (ends the transaction or session that holds it).
    async fn release(self: Box<Self>);
}
