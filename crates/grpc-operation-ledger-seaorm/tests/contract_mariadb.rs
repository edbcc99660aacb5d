//! The ledger contract suite on the SeaORM adapter over a fresh MariaDB database per case (from
//! MARIADB_URL; without it every case fails and says how to get one).

mod common;

use common::Store;
use common::contract::SeaOrmFixture;
use grpc_ledger_contract_tests::ledger_contract_tests;

ledger_contract_tests!(SeaOrmFixture::new(Store::MariaDb));
