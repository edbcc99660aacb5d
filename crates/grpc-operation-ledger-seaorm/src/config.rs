//! The settings the ledger's behaviour depends on.

use std::time::Duration;

use crate::pooler::Pooler;

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
