//! What a service sets on its guard: the key header, the lease, the key hasher, the request
//! schema, and the protocol (claim-first or write-once).

use std::sync::Arc;
use std::time::Duration;

use grpc_core_api::{KeyHasher, LeaseDuration, RequestSchema};

use crate::key_header::{IDEMPOTENCY_KEY_HEADER, InvalidKeyHeader, key_header};

/// How the guard reads and protects keyed mutations.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GuardConfig {
    /// The request metadata holding the idempotency key.
    pub key_header: String,
    /// How long a claim protects its owner before another attempt may take it over. With the
    /// claim, the business write and the transition in one transaction, the lease matters only if
    /// that transaction outlives it.
    pub lease: LeaseDuration,
    /// How keys are hashed before they are stored; keyed hashing with a server secret keeps a
    /// stolen ledger from revealing short keys.
    pub hasher: KeyHasher,
    /// The service's request types, read from its descriptor set: the request fingerprint is
    /// computed over their canonical form, so that a retry whose maps arrive in another order
    /// (or from another client library) is recognised as the same request.
    pub request_schema: Arc<RequestSchema>,
    /// When the ledger row is written: before the handler (the default), or once, finished, after
    /// it (only for handlers whose every effect is in the unit's transaction).
    pub mode: GuardMode,
}

/// When the guard writes an operation's ledger row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum GuardMode {
    /// Claim before the handler runs, finish the claim after: a duplicate arriving while the
    /// handler runs waits (or is told it is in flight) and never runs the handler. Safe for any
    /// handler, including one with effects outside the transaction (a call to another service).
    #[default]
    ClaimFirst,
    /// Run the handler first, then write the ledger row once, already finished, in the same
    /// transaction just before the commit: one row write instead of two. The price: duplicates
    /// that arrive together each run the handler until one commits; the others then find the
    /// committed row, roll their transaction back (their effects with it) and replay. So this mode
    /// is only for handlers whose **every** effect is in the unit's transaction; an effect
    /// anywhere else (a message sent, another service called) would happen once per duplicate.
    /// A finished operation is looked up before the handler runs, so a retry of one that already
    /// committed replays without running it.
    WriteOnceInTransactionOnly,
}

impl GuardConfig {
    /// The default header and a 30 s lease, with `hasher` and the service's `request_schema`.
    pub fn new(hasher: KeyHasher, request_schema: RequestSchema) -> Self {
        Self {
            key_header: IDEMPOTENCY_KEY_HEADER.to_owned(),
            lease: LeaseDuration::new(Duration::from_secs(30)).expect("30 s is a valid lease"),
            hasher,
            request_schema: Arc::new(request_schema),
            mode: GuardMode::ClaimFirst,
        }
    }

    /// This configuration in `mode`.
    pub fn with_mode(mut self, mode: GuardMode) -> Self {
        self.mode = mode;
        self
    }

    /// The request metadata that holds the key ([`IDEMPOTENCY_KEY_HEADER`] by default), or why
    /// `name` cannot be one; the clients' `RetrySettings::with_key_header` or
    /// `RetryLayerBuilder::key_header` must name the same.
    pub fn with_key_header(mut self, name: &str) -> Result<Self, InvalidKeyHeader> {
        self.key_header = key_header(name)?.as_str().to_owned();
        Ok(self)
    }
}
