//! The committed mutation report (`docs/mutants/sql.md`) is about the statements this adapter
//! sends today: a changed statement without a fresh `cargo xtask mutants sql` fails here.

use grpc_ledger_adapter_example_sqlx::SENT;
use sha2::{Digest, Sha256};

#[test]
fn the_mutation_report_covers_every_statement_as_it_is_sent() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/mutants/sql.md");
    let report = std::fs::read_to_string(path).expect("docs/mutants/sql.md");
    for (name, text) in SENT {
        let digest: String = Sha256::digest(text.as_bytes())
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        let row = format!("| SqlxExample | {name} | `{digest}` |");
        assert!(
            report.contains(&row),
            "docs/mutants/sql.md is not about the sqlx example's `{name}` as it is sent now (no \
             row {row}): run `cargo xtask mutants sql` and review its survivors"
        );
    }
}
