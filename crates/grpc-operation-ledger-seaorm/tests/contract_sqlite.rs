//! The ledger contract suite on the SeaORM adapter, over a SQLite file per case.

mod common;

use common::Store;
use common::contract::SeaOrmFixture;
use grpc_ledger_contract_tests::ledger_contract_tests;

ledger_contract_tests!(SeaOrmFixture::new(Store::Sqlite));
