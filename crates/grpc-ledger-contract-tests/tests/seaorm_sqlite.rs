//! The contract suite on the SeaORM adapter over a SQLite file per case.

mod support;

use grpc_ledger_contract_tests::ledger_contract_tests;
use support::{Backend, SeaOrmFixture};

ledger_contract_tests!(SeaOrmFixture::new(Backend::Sqlite));
