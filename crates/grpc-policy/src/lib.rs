//! Pure retry policy for gRPC: which layer owns retries on a channel ([`GrpcRetryOwner`]), the
//! gRFC A6 service config ([`ServiceConfig`], [`GrpcServiceConfigPolicy`]), the method catalog and
//! the ownership validator ([`MethodCatalog`], [`GrpcRetryOwnershipValidator`]), a config checked
//! once for the layer that applies its retries ([`RetryPlan`]), retry
//! eligibility ([`GrpcRetryEligibility`]), the retry budget ([`GrpcRetryBudget`]) and backoff
//! ([`Backoff`]).
//!
//! Every rule here is a function of its inputs: no IO, no async, no clock and no random source of
//! its own (both are passed in). The ledger is seen only through
//! `grpc_core_api::LedgerDurability`, so a keyed-mutation retry can demand a durable ledger
//! without this crate depending on a database.
//!
//! The retry budget, as a failing dependency sees it: retries stop once half the tokens are spent,
//! and come back only as successes refill the bucket.
//!
//! ```
//! use grpc_policy::{GrpcRetryBudget, RetryThrottling};
//!
//! // gRFC A6 throttling: 10 tokens, a tenth of one back per success.
//! let budget = GrpcRetryBudget::new(&RetryThrottling::new(10, 0.1).unwrap());
//! assert!(budget.allows_retry());
//! for _ in 0..5 {
//!     budget.record_failure(); // a failed attempt costs a token
//! }
//! assert!(!budget.allows_retry(), "5 of 10 left: no more retries");
//! for _ in 0..10 {
//!     budget.record_success();
//! }
//! assert!(budget.allows_retry(), "6 of 10: the dependency recovered, retries resume");
//! ```

mod backoff;
mod budget;
mod catalog;
mod codes;
mod eligibility;
mod owner;
mod plan;
mod service_config;
mod validator;

pub use backoff::{Backoff, BackoffSequence, Pushback, RandomSource, SplitMix64, parse_pushback};
pub use budget::GrpcRetryBudget;
pub use catalog::{
    CatalogError, KEYED_MUTATION_OPTION_FIELD, KEYED_MUTATION_OPTION_PROTO, MethodCatalog,
    MethodClass, MethodInfo,
};
pub use codes::{ALL_CODES, CodeSet, code_name, parse_code};
pub use eligibility::{AttemptFacts, Evidence, GrpcRetryEligibility, RefusalReason, Verdict};
pub use owner::{GrpcRetryOwner, UnknownOwner};
pub use plan::{MethodRetry, RetryPlan, UnsafeRetryConfig};
pub use service_config::{
    ConfigError, GrpcServiceConfigPolicy, HedgingPolicy, MAX_ATTEMPTS_CAP, MethodConfig,
    MethodName, PortabilityNote, RetryPolicy, RetryThrottling, ServiceConfig,
};
pub use validator::{Finding, GrpcRetryOwnershipValidator, LedgerKnowledge, Severity};
