//! One mutant of the sqlx example against the contract suite, for `cargo xtask mutants sql` (a
//! `sql-mutants` build; the mutant comes in the environment). With `--list` it prints the
//! statements it sends (`statement\t<name>\t<text>`) and the checks a mutant may ignore
//! (`check\t<name>`); otherwise it runs the suite on `DATABASE_URL`'s server until the first
//! case fails and prints `mutant: killed\t<case>\t<failure>` or `mutant: survived`.

mod fixture;

use std::sync::Arc;

use fixture::SqlxFixture;
use grpc_ledger_adapter_example_sqlx::{CHECKS, SENT};
use grpc_ledger_contract_tests::mutant_verdict;

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        for (name, text) in SENT {
            println!("statement\t{name}\t{text}");
        }
        for check in CHECKS {
            println!("check\t{check}");
        }
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    println!(
        "{}",
        runtime.block_on(mutant_verdict(Arc::new(SqlxFixture::new())))
    );
}
