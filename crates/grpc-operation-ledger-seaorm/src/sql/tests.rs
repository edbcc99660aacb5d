//! The statements as text: what each dialect gets, and how MariaDB binds.

use super::*;

#[test]
fn an_applications_statement_in_each_dialect() {
    let template = "INSERT INTO t (a, b) VALUES ($1, $2) RETURNING a";
    assert_eq!(in_dialect(DbBackend::Postgres, template).unwrap(), template);
    assert_eq!(
        in_dialect(DbBackend::Sqlite, template).unwrap(),
        "INSERT INTO t (a, b) VALUES (?1, ?2) RETURNING a"
    );
    assert_eq!(
        in_dialect(DbBackend::MySql, template).unwrap(),
        "INSERT INTO t (a, b) VALUES (?, ?) RETURNING a"
    );
}

/// The statement texts of a dialect, for assertions.
struct Texts {
    claim_insert: String,
    select_record: String,
    select_record_with_clock: String,
    take_over: String,
    mark_committed: String,
    mark_failed: String,
    renew_lease: String,
    purge: String,
}

impl Texts {
    fn of(sql: &Sql) -> Self {
        Self {
            claim_insert: sql.claim_insert.text.clone(),
            select_record: sql.select_record.text.clone(),
            select_record_with_clock: sql.select_record_with_clock.text.clone(),
            take_over: sql.take_over.text.clone(),
            mark_committed: sql.mark_committed.text.clone(),
            mark_failed: sql.mark_failed.text.clone(),
            renew_lease: sql.renew_lease.text.clone(),
            purge: sql.purge.text.clone(),
        }
    }
}

#[test]
fn claim_only_inserts_and_every_statement_is_parameterised() {
    for backend in [DbBackend::Postgres, DbBackend::Sqlite] {
        let sql = Sql::for_backend(backend).expect("supported");
        let sql = Texts::of(sql);
        assert!(
            sql.claim_insert
                .starts_with("INSERT INTO grpc_operation_ledger")
        );
        assert!(sql.claim_insert.ends_with("DO NOTHING RETURNING version"));
        assert!(sql.claim_insert.contains(&format!(
            "clock.now * {} + ",
            1u64 << grpc_core_api::Version::CLAIM_TIME_SHIFT
        )));
        assert!(!sql.claim_insert.contains("UPDATE"), "{}", sql.claim_insert);
        assert!(!sql.claim_insert.contains("DO UPDATE"));
        for statement in [
            &sql.claim_insert,
            &sql.select_record,
            &sql.select_record_with_clock,
            &sql.take_over,
            &sql.mark_committed,
            &sql.mark_failed,
            &sql.renew_lease,
            &sql.purge,
        ] {
            assert!(!statement.contains("{now}"), "{statement}");
            assert!(!statement.contains("{wait_bound}"), "{statement}");
            assert!(!statement.contains('\''.to_string().repeat(2).as_str()));
        }
        for transition in [&sql.take_over, &sql.mark_committed, &sql.mark_failed] {
            assert!(transition.contains("AND state = 'IN_PROGRESS' AND version = "));
            assert!(transition.contains("version = version + 1"));
        }
        assert!(
            sql.renew_lease
                .contains("AND state = 'IN_PROGRESS' AND version = ")
        );
        assert!(
            !sql.renew_lease.contains("SET version") && !sql.renew_lease.contains("claimed_at ="),
            "a renewal changes the lease alone: {}",
            sql.renew_lease
        );
    }
    let claim = |backend| &Sql::for_backend(backend).unwrap().claim_insert.text;
    assert!(claim(DbBackend::Sqlite).contains("?5"));
    assert!(!claim(DbBackend::Sqlite).contains('$'));
    assert!(claim(DbBackend::Postgres).contains("$5"));
}

/// MariaDB binds positionally: every placeholder is a bare `?`, and the values follow the
/// template's parameter order, repeats included.
#[test]
fn mariadb_statements_bind_in_placeholder_order() {
    let sql = Sql::for_backend(DbBackend::MySql).expect("supported");
    assert!(
        sql.claim_insert
            .text
            .starts_with("INSERT INTO grpc_operation_ledger")
    );
    assert!(!sql.claim_insert.text.contains("IGNORE"));
    assert!(!sql.claim_insert.text.contains("UPDATE"));
    for stmt in [
        &sql.claim_insert,
        &sql.select_record,
        &sql.select_record_with_clock,
        &sql.take_over,
        &sql.purge,
    ] {
        assert!(
            !stmt.text.contains('$') && !stmt.text.contains("?1"),
            "{}",
            stmt.text
        );
    }
    let values = |n: i64| (1..=n).map(sea_orm::Value::from).collect::<Vec<_>>();
    assert_eq!(
        sql.claim_insert.values(values(7)),
        [1i64, 2, 3, 4, 5, 7, 6].map(sea_orm::Value::from).to_vec()
    );
    assert_eq!(
        sql.purge.values(values(2)),
        [1i64, 1, 2].map(sea_orm::Value::from).to_vec()
    );
    assert!(Sql::for_backend(DbBackend::Postgres).is_some());
}
