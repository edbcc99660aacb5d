//! The ledger contract suite on PostgreSQL reached through PgBouncer in transaction pooling
//! (`PGBOUNCER_TRANSACTION_URL`, started by `cargo xtask test`): server connections change hands
//! at every transaction's end, and Debian's PgBouncer 1.18 keeps no prepared statement.

mod common;

use common::Store;
use common::contract::SeaOrmFixture;
use grpc_ledger_contract_tests::ledger_contract_tests;

ledger_contract_tests!(SeaOrmFixture::new(Store::PostgresBehindTransactionPooler));
