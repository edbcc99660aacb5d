//! The contract suite that every [`GrpcOperationLedger`] adapter must pass. The adapter author's
//! guide is `docs/adapters.md`; the in-memory double that passes the suite honestly is the crate
//! `grpc-operation-ledger-memory`.
//!
//! A store is correct exactly when it passes this suite against a real instance. The suite talks
//! to a store through three small traits an adapter's test implements: [`LedgerFixture`] hands out
//! a fresh, empty [`LedgerStore`] per case; the store begins [`UnitOfWork`]s, each on its own
//! connection, with a ledger bound to that unit, a business write, commit and rollback. Stores
//! differ only through [`Capabilities`] and the optional hooks ([`Migrations`],
//! [`ConnectionKiller`], [`TableLocking`], [`SkewedClock`], [`LostCommit`]), never by name. Every failure names
//! the [`Rule`] it saw broken.
//!
//! A third-party adapter runs the whole suite from one test (or, with
//! `ledger_contract_tests!(MyFixture::new())`, one named test per case):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::{sync::Arc, time::Duration};
//! use grpc_ledger_contract_tests::run_all;
//! use grpc_operation_ledger_memory::InMemoryFixture; // the in-memory double's fixture
//!
//! // In your adapter's tests: `#[tokio::test] async fn passes_the_ledger_contract()`, with your
//! // own fixture in place of the in-memory one.
//! run_all(Arc::new(InMemoryFixture::new(Duration::from_millis(200)))).await;
//! # }
//! ```
//!
//! Each case is also a public async function (`cases::claim_after_commit_replays`, ...), so an
//! adapter can run them as separate named tests, and [`run_report`] returns how each case ended
//! (passed, failed with its message, or not applicable to the store, with why) instead of
//! panicking, which is how this crate checks that the suite catches broken adapters. A case a
//! store cannot run is never passed silently: the report lists it, and its named test prints
//! that it was not applicable.
//!
//! # What this crate promises an adapter's authors
//!
//! - The fixture traits ([`LedgerFixture`], [`LedgerStore`], [`UnitOfWork`]) and [`Capabilities`]
//!   change only with the crate's semver: a new capability arrives with a default that keeps an
//!   existing fixture compiling and its cases running as before ([`Capabilities`] is built with
//!   its constructor, never as a literal).
//! - Cases are added in minor versions. A new case is a new requirement of the port's contract,
//!   so it may fail an adapter that passed before: that is what the suite is for, and the release
//!   notes name it. A case is never weakened to let an adapter pass.
//! - Case names are stable identifiers (the named tests of `ledger_contract_tests!`, the run
//!   report's keys): renaming one is a breaking change.
//!
//! [`GrpcOperationLedger`]: grpc_core_api::GrpcOperationLedger

mod broken;
pub mod cases;
pub mod commit_cut;
mod fixture;
#[cfg(feature = "containers")]
pub mod servers;

pub use cases::{
    CASES, CaseOutcome, Rule, SuiteReport, first_failure, mutant_verdict, not_applicable, run_all,
    run_report,
};
pub use fixture::{
    Capabilities, ClockSkew, CommitCut, ConnectionKiller, HeldTableLock, LedgerFixture,
    LedgerStore, LostCommit, Migrations, RawRow, SkewedClock, TableLocking, UnitOfWork,
};

pub use broken::Defect;
