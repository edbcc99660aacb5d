//! The ledger contract suite on a three-node MariaDB Galera cluster, with consecutive units of work
//! on different nodes (`GALERA_URLS`, set by `cargo xtask galera test`; without it every case
//! fails and says how to get one).

mod common;

use common::Store;
use common::contract::SeaOrmFixture;
use grpc_ledger_contract_tests::ledger_contract_tests;

ledger_contract_tests!(SeaOrmFixture::new(Store::Galera));
