//! Mutation testing's hooks (feature `sql-mutants`, for `cargo xtask mutants` only; never in a
//! deployment's build): one statement replaced by a mutant, or one check of a statement's result
//! ignored, as the environment of the test process says. A run of the contract suite against
//! each mutant measures what the suite can see; see `docs/mutants/`.

use sea_orm::DbBackend;

/// The file holding one statement's mutant: a first line `<store>\t<statement name>` (the store
/// as `postgres`, `sqlite` or `mysql`; the name as `sent_statements` gives it), then the
/// mutant's template (`$N` placeholders, the store's clock written out).
pub const STATEMENT_VARIABLE: &str = "GRPC_LEDGER_SQL_MUTANT";

/// The name of one check of a statement's result to ignore (one of [`CHECKS`]).
pub const CHECK_VARIABLE: &str = "GRPC_LEDGER_CHECK_MUTANT";

/// The checks of a statement's result the adapter relies on, which a mutant ignores.
pub const CHECKS: [&str; 3] = [
    "transition changed one row",
    "takeover changed one row",
    "claim's inserted flag",
];

/// The store's name in a mutant file.
fn store_name(backend: DbBackend) -> &'static str {
    match backend {
        DbBackend::Postgres => "postgres",
        DbBackend::MySql => "mysql",
        _ => "sqlite",
    }
}

/// The statement the mutant file names for `backend`'s statements, and its replacement
/// template: `None` when no mutant is asked for, or it is for another store.
pub(crate) fn requested(backend: DbBackend) -> Option<(String, String)> {
    let path = std::env::var(STATEMENT_VARIABLE).ok()?;
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("reading the mutant at {path}: {error}"));
    let (header, template) = text
        .split_once('\n')
        .unwrap_or_else(|| panic!("the mutant at {path} has no header line"));
    let (store, name) = header
        .split_once('\t')
        .unwrap_or_else(|| panic!("the mutant's header is not `<store>\\t<statement>`: {header}"));
    (store == store_name(backend)).then(|| (name.to_owned(), template.to_owned()))
}

/// Whether this process ignores `check` (a mutant of the adapter's use of a statement's result).
pub(crate) fn ignores(check: &str) -> bool {
    debug_assert!(CHECKS.contains(&check), "an unlisted check: {check}");
    std::env::var(CHECK_VARIABLE).is_ok_and(|ignored| ignored == check)
}
