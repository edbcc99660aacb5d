//! Ports and domain values for safe gRPC retries.
//!
//! This crate is the API boundary of the workspace: every public item is a promise. It holds the
//! values that name an operation (`GrpcMethod`, `CallerFingerprint`, `IdempotencyKey`,
//! `IdempotencyKeyHash`, `RequestFingerprint`, `GrpcOperationIdentity`), the values that describe
//! its progress (`OperationState`, `OperationRecord`, `ClaimOutcome`), the
//! [`GrpcOperationLedger`] port that storage adapters implement, and the [`LedgerError`] enum with
//! its mapping to `tonic::Status`.
//!
//! Every value type has a checked constructor: a value that exists is valid, so functions that take
//! one never re-validate it. Nothing here does IO, names a database or needs a tokio runtime.
//!
//! ```
//! use grpc_core_api::{CallerFingerprint, GrpcMethod, IdempotencyKey, KeyHasher, GrpcOperationIdentity};
//!
//! let method = GrpcMethod::parse("/payments.v1.Payments/CreatePayment")?;
//! let caller = CallerFingerprint::from_principal(b"spiffe://bank.example/ns/shop/sa/checkout");
//! let key = IdempotencyKey::parse("order-4711-attempt")?;
//! let identity = GrpcOperationIdentity::new(caller, method, KeyHasher::Sha256.hash(&key));
//! assert!(identity.storage_key().contains("|/payments.v1.Payments/CreatePayment|"));
//! # Ok::<(), grpc_core_api::InvalidInput>(())
//! ```

mod caller;
mod canonical;
mod downstream;
mod error;
mod fingerprint;
mod hex;
mod identity;
mod key;
mod ledger;
mod method;
mod record;
mod status;
pub mod store_errors;
mod unit_per_call;

pub use caller::CallerFingerprint;
pub use canonical::{RequestSchema, SchemaError};
pub use downstream::DownstreamLabel;
pub use error::{InvalidInput, LedgerError, UnavailableKind};
pub use fingerprint::RequestFingerprint;
pub use identity::GrpcOperationIdentity;
pub use key::{IdempotencyKey, IdempotencyKeyHash, KeyHasher};
#[cfg(feature = "mock")]
pub use ledger::MockGrpcOperationLedger;
pub use ledger::{
    GrpcOperationLedger, LedgerCensus, LedgerDurability, LedgerUnitsOfWork, record_by_claim,
    unmatched_transition,
};
pub use method::GrpcMethod;
pub use record::{
    ClaimOutcome, Completion, LeaseDuration, OperationRecord, OperationState, OutcomeReference,
    RecordOutcome, RecordedFailure, Version,
};
pub use status::{
    ERROR_INFO_DOMAIN, ErrorReason, REPLAYED_METADATA_KEY, says_in_flight, says_outcome_unknown,
};
pub use unit_per_call::UnitPerCall;
