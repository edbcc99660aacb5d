//! One mutant of the adapter against the contract suite, for `cargo xtask mutants sql` (a
//! `sql-mutants` build; the mutant comes in the environment, see the crate's `mutants` module).
//!
//! `MUTANT_STORE` names the store (`postgres`, `sqlite` or `mariadb`, each from the variable its
//! contract tests read). With `--list` it prints the statements the adapter sends there, one
//! `statement\t<name>\t<template>` line each, and the checks a mutant may ignore, one
//! `check\t<name>` line each. Otherwise it runs the suite until the first case fails and prints
//! `mutant: killed\t<case>\t<first line of the failure>` or `mutant: survived`.

mod common;

use std::sync::Arc;

use common::Store;
use common::contract::SeaOrmFixture;
use grpc_ledger_contract_tests::mutant_verdict;
use grpc_operation_ledger_seaorm::mutants::CHECKS;
use grpc_operation_ledger_seaorm::sent_statements;
use sea_orm::DbBackend;

fn main() {
    let store = std::env::var("MUTANT_STORE").unwrap_or_default();
    let (store, backend) = match store.as_str() {
        "postgres" => (Store::Postgres, DbBackend::Postgres),
        "sqlite" => (Store::Sqlite, DbBackend::Sqlite),
        "mariadb" => (Store::MariaDb, DbBackend::MySql),
        other => panic!("MUTANT_STORE must be postgres, sqlite or mariadb, not {other:?}"),
    };
    if std::env::args().any(|arg| arg == "--list") {
        for (name, template) in sent_statements(backend).expect("a supported store") {
            assert!(
                !template.contains(['\t', '\n']),
                "a template on more than one line: {name}"
            );
            println!("statement\t{name}\t{template}");
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
        runtime.block_on(mutant_verdict(Arc::new(SeaOrmFixture::new(store))))
    );
}
