//! The committed mutation report (`docs/mutants/sql.md`, written by `cargo xtask mutants sql`)
//! is about the statements the adapter sends today: each statement's digest there must be the
//! digest of its template now. A changed statement without a fresh report fails here.

use grpc_operation_ledger_seaorm::sent_statements;
use sea_orm::DbBackend;
use sha2::{Digest, Sha256};

fn report() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/mutants/sql.md");
    std::fs::read_to_string(path).expect("docs/mutants/sql.md (run `cargo xtask mutants sql`)")
}

#[test]
fn the_mutation_report_covers_every_statement_as_it_is_sent() {
    let report = report();
    for (store, backend) in [
        ("Postgres", DbBackend::Postgres),
        ("Sqlite", DbBackend::Sqlite),
        ("Mariadb", DbBackend::MySql),
    ] {
        for (name, template) in sent_statements(backend).expect("a supported store") {
            let digest: String = Sha256::digest(template.as_bytes())
                .iter()
                .map(|byte| format!("{byte:02x}"))
                .collect();
            let row = format!("| {store} | {name} | `{digest}` |");
            assert!(
                report.contains(&row),
                "docs/mutants/sql.md is not about {store}'s `{name}` as the adapter sends it \
                 now (no row {row}): run `cargo xtask mutants sql` and review its survivors"
            );
        }
    }
}
