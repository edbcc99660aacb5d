//! `InMemoryOperationLedger`: the double that passes the ledger contract suite honestly.
//!
//! It models what the contract relies on in a real database: an atomic insert-if-absent, versioned
//! conditional transitions, units of work whose writes stay invisible to others until commit and
//! vanish on rollback, row locks, so that a duplicate claim behind another unit's uncommitted
//! claim waits at most the configured bound and then answers `InFlight`, and a lock on the whole
//! table that writes wait for at most that bound too. Its durability is `Volatile`: the retry
//! policy will not let keyed mutations retry on it.
//!
//! By job: [`store`] (rows and locks), [`units`] (units of work), [`ledger`] (the port), and
//! [`fixture`] (the contract suite's fixture, with every hook).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::{sync::Arc, time::Duration};
//! use grpc_ledger_contract_tests::run_all;
//! use grpc_operation_ledger_memory::InMemoryFixture;
//!
//! run_all(Arc::new(InMemoryFixture::new(Duration::from_millis(200)))).await;
//! # }
//! ```

pub mod fixture;
pub mod ledger;
pub mod store;
pub mod units;

pub use fixture::InMemoryFixture;
pub use ledger::InMemoryOperationLedger;
pub use store::InMemoryStore;
pub use units::InMemoryUnit;

#[cfg(feature = "broken-doubles")]
mod broken {
    use std::time::Duration;

    use grpc_ledger_contract_tests::Defect;

    use crate::{InMemoryFixture, InMemoryStore};

    impl InMemoryStore {
        /// An empty store with `defect` (feature `broken-doubles`).
        pub fn with_defect(claim_wait: Duration, defect: Defect) -> Self {
            Self::build(claim_wait, Some(defect))
        }
    }

    impl InMemoryFixture {
        /// Fresh stores with `defect` (feature `broken-doubles`).
        pub fn with_defect(claim_wait: Duration, defect: Defect) -> Self {
            Self {
                claim_wait,
                defect: Some(defect),
            }
        }
    }
}
