//! What a service sets on its guard: the key header, the lease, the key hasher, the request
//! schema, and the protocol (claim-first, write-once, or claim-committed-first with its longest
//! handler).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use grpc_core_api::{GrpcMethod, KeyHasher, LeaseDuration, RequestSchema, SchemaError};

use crate::key_header::{IDEMPOTENCY_KEY_HEADER, InvalidKeyHeader, key_header};

/// How the guard reads and protects keyed mutations.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GuardConfig {
    /// The request metadata holding the idempotency key.
    pub key_header: String,
    /// How long a claim protects its owner before another attempt may take it over. With the
    /// claim, the business write and the transition in one transaction, the lease matters only if
    /// that transaction outlives it (it is then cut). Under [`GuardMode::ClaimCommittedFirst`] it
    /// is how long a dead server's claim keeps resends waiting; the guard renews it while the
    /// handler runs.
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
    /// How long a handler may run under [`GuardMode::ClaimCommittedFirst`], its claim's lease
    /// renewed all the while: past it the renewals stop, and the handler is cut when the last
    /// lease runs out. The other modes bound a unit of work by the lease itself.
    pub longest_handler: Duration,
    /// How long a unit's COMMIT may take once sent, apart from the lease that bounds the work
    /// before it: a COMMIT still unanswered after it is dropped and the caller told its outcome is
    /// unknown (UNAVAILABLE, `OUTCOME_UNKNOWN`), never that it was rolled back. 5 s by default.
    pub commit_wait: Duration,
    /// How long a call whose operation another attempt holds (a hedged copy, or a resend that
    /// overtook its first attempt) waits for that attempt to finish before it is told the
    /// operation is in flight (ABORTED, retry after the lease left): within it, the call answers
    /// with the operation's outcome, replayed. Waiting holds no transaction and no lock; the
    /// operation is looked at on a read unit, first after 5 ms, then at doubling pauses up to
    /// 100 ms. 2 s by default (the ledger's own claim wait), and never more than half the lease,
    /// so that the wait ends inside the call's own time bound; zero answers at once.
    pub in_flight_wait: Duration,
    /// The methods that carry their idempotency key in a string field of their request (Google's
    /// APIs' `request_id`, AIP-155), by full method name, with the field's name: the key is read
    /// from there (validated, hashed and isolated as the metadata's), and a request that carries
    /// both must carry the same key in each.
    pub key_fields: Arc<HashMap<String, String>>,
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
    /// Commit the claim in a unit of its own before the handler runs, keep its lease alive while
    /// the handler runs (renewed every third of the lease, fenced on the claim's version, for at
    /// most [`GuardConfig::longest_handler`]), then run the handler's writes and the transition in
    /// a second unit. For handlers that run longer than a lease, or whose effects outside the
    /// transaction must not run twice even when the process dies mid-handler: every other attempt
    /// sees the committed claim at once (ABORTED, retry after the lease left, instead of waiting
    /// on a lock), and a claim whose owner died is taken over only once its lease ran out. The
    /// price: two more commits per call (the claim's and each renewal's). A handler whose claim is
    /// taken over or cannot be renewed before its lease runs out is cut, and its writes rolled
    /// back. On a single-writer store (SQLite) a renewal waits for the write lock the handler's
    /// own unit holds, so there the handler is protected by its first lease alone.
    ClaimCommittedFirst,
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
            longest_handler: Duration::from_secs(10 * 60),
            commit_wait: Duration::from_secs(5),
            in_flight_wait: Duration::from_secs(2),
            key_fields: Arc::default(),
        }
    }

    /// This configuration with `method`'s idempotency key read from its request's string field
    /// `field` as well as from the key header; refused unless the method's input type has such a
    /// field (a singular top-level `string`).
    pub fn with_key_field(mut self, method: &GrpcMethod, field: &str) -> Result<Self, SchemaError> {
        self.request_schema.check_key_field(method, field)?;
        Arc::make_mut(&mut self.key_fields).insert(method.as_str().to_owned(), field.to_owned());
        Ok(self)
    }

    /// This configuration with the key read from `request_id` for every method of the schema
    /// whose request has that string field (AIP-155), found by descriptor; the methods it found.
    pub fn with_aip155_request_ids(mut self) -> (Self, Vec<GrpcMethod>) {
        let found = self.request_schema.methods_with_request_id();
        let fields = Arc::make_mut(&mut self.key_fields);
        for method in &found {
            fields.insert(method.as_str().to_owned(), "request_id".to_owned());
        }
        (self, found)
    }

    /// This configuration with handlers allowed to run `longest` under
    /// [`GuardMode::ClaimCommittedFirst`].
    pub fn with_longest_handler(mut self, longest: Duration) -> Self {
        self.longest_handler = longest;
        self
    }

    /// This configuration with each COMMIT allowed `wait` once sent.
    pub fn with_commit_wait(mut self, wait: Duration) -> Self {
        self.commit_wait = wait;
        self
    }

    /// This configuration with a call whose operation is in flight elsewhere waiting `wait` for
    /// its outcome (see [`GuardConfig::in_flight_wait`]).
    pub fn with_in_flight_wait(mut self, wait: Duration) -> Self {
        self.in_flight_wait = wait;
        self
    }

    /// How long a call waits for its operation in flight elsewhere: the setting, within half the
    /// lease.
    pub(super) fn in_flight_bound(&self) -> Duration {
        self.in_flight_wait.min(self.lease.get() / 2)
    }

    /// How long one guarded call's work may take in all, commits apart, before its unit is
    /// dropped (and so rolled back, its COMMIT never sent): the lease, or under
    /// [`GuardMode::ClaimCommittedFirst`] the longest handler and two leases (the last renewed
    /// one, and the transition's time after it).
    pub(super) fn unit_time_bound(&self) -> Duration {
        match self.mode {
            GuardMode::ClaimCommittedFirst => self.longest_handler + 2 * self.lease.get(),
            _ => self.lease.get(),
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
