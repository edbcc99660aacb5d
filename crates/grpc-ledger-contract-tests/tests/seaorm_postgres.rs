//! The contract suite on the SeaORM adapter over a fresh PostgreSQL database per case. Without
//! DATABASE_URL every case fails with a message saying how to get a PostgreSQL.

mod support;

use grpc_ledger_contract_tests::ledger_contract_tests;
use support::{Backend, SeaOrmFixture};

ledger_contract_tests!(SeaOrmFixture::new(Backend::Postgres));
