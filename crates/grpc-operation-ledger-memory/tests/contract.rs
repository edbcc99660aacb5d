//! The contract suite on the in-memory double (here, beside the double, so that its own tests
//! judge it: `cargo xtask mutants code --group memory` mutates it against them).

use std::time::Duration;

use grpc_ledger_contract_tests::ledger_contract_tests;
use grpc_operation_ledger_memory::InMemoryFixture;

ledger_contract_tests!(InMemoryFixture::new(Duration::from_millis(500)));
