//! The whole contract suite on the sqlx example adapter, against the PostgreSQL `DATABASE_URL`
//! names (`cargo xtask test` starts one): a database of its own per case, dropped by the
//! fixture's `after_case` hook. Without `DATABASE_URL` every case fails and says how to get one.
//!
//! The fixture (`fixture/mod.rs`) is the minimal fixture of `docs/adapters.md`, in full: the
//! three traits, and all four optional hooks.

mod fixture;

use fixture::SqlxFixture;
use grpc_ledger_contract_tests::ledger_contract_tests;

ledger_contract_tests!(SqlxFixture::new());
