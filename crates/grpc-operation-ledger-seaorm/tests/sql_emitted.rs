//! What the adapter sends: the statements of each path, recorded on a real connection. (Its
//! behaviour is the contract suite's business: see `contract_sqlite.rs` and
//! `contract_postgres.rs`.)

mod common;

use std::sync::Mutex;

use common::{Store, fresh, identity, lease};
use grpc_core_api::*;
use grpc_operation_ledger_seaorm::{SeaOrmOperationLedger, claim_as_sent};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DbBackend, DbErr, ExecResult, QueryResult, Statement,
    TransactionTrait,
};

const CREATE: &str = "/payments.v1.Payments/CreatePayment";

fn fingerprint(body: &str) -> RequestFingerprint {
    RequestFingerprint::of(body.as_bytes())
}

fn outcome(reference: &str) -> OutcomeReference {
    OutcomeReference::parse(reference).unwrap()
}

/// Records every statement sent, on top of a real connection.
struct Recording {
    inner: DatabaseConnection,
    log: Mutex<Vec<String>>,
    values: Mutex<Vec<(String, Vec<sea_orm::Value>)>>,
}

impl Recording {
    fn on(db: &DatabaseConnection) -> Self {
        Self {
            inner: db.clone(),
            log: Mutex::default(),
            values: Mutex::default(),
        }
    }

    fn record(&self, stmt: &Statement) {
        self.log.lock().unwrap().push(stmt.sql.clone());
        let values = stmt
            .values
            .as_ref()
            .map(|v| v.0.clone())
            .unwrap_or_default();
        self.values.lock().unwrap().push((stmt.sql.clone(), values));
    }
}

#[async_trait::async_trait]
impl ConnectionTrait for Recording {
    fn get_database_backend(&self) -> DbBackend {
        self.inner.get_database_backend()
    }
    async fn execute_raw(&self, stmt: Statement) -> Result<ExecResult, DbErr> {
        self.record(&stmt);
        self.inner.execute_raw(stmt).await
    }
    async fn execute_unprepared(&self, sql: &str) -> Result<ExecResult, DbErr> {
        self.log.lock().unwrap().push(sql.to_owned());
        self.inner.execute_unprepared(sql).await
    }
    async fn query_one_raw(&self, stmt: Statement) -> Result<Option<QueryResult>, DbErr> {
        self.record(&stmt);
        self.inner.query_one_raw(stmt).await
    }
    async fn query_all_raw(&self, stmt: Statement) -> Result<Vec<QueryResult>, DbErr> {
        self.record(&stmt);
        self.inner.query_all_raw(stmt).await
    }
}

/// What a write sent, without the wait bound a ledger on a connection it did not begin sends
/// first on PostgreSQL (`set_config('lock_timeout', ..)`, so that even a lock on the whole table
/// is waited for at most the claim wait); asserts it is there, once, first.
fn ledger_statements(store: Store, mut sent: Vec<String>) -> Vec<String> {
    if store == Store::Postgres {
        assert_eq!(
            sent.first().map(String::as_str),
            Some("SELECT set_config('lock_timeout', $1, true)"),
            "the lock wait is bounded before the write: {sent:#?}"
        );
        sent.remove(0);
    }
    sent
}

async fn claim_emits_one_insert_on_conflict_and_never_an_update_on_the_insert_path(store: Store) {
    let t = fresh(store).await;
    let recording = Recording::on(&t.db);
    let ledger = SeaOrmOperationLedger::new(&recording);
    let id = identity("tenant-a", CREATE, "sql");
    let Ok(ClaimOutcome::Claimed { version, .. }) =
        ledger.claim(&id, &fingerprint("x"), lease(30_000)).await
    else {
        panic!("a fresh identity is claimed");
    };
    let insert_path = ledger_statements(store, std::mem::take(&mut *recording.log.lock().unwrap()));
    assert_eq!(insert_path.len(), 1, "{insert_path:#?}");
    // MariaDB's claim carries its wait bound as a statement prefix; PostgreSQL's reads the
    // existing row in the same statement, only when its insert inserted nothing.
    let insert = insert_path[0]
        .strip_prefix("SET STATEMENT max_statement_time=2.000 FOR ")
        .filter(|_| store == Store::MariaDb)
        .unwrap_or(&insert_path[0]);
    // What the benchmarks send as the adapter's claim is what it sent.
    assert_eq!(
        Some(insert),
        claim_as_sent(t.db.get_database_backend()),
        "the claim as sent"
    );
    if store == Store::Postgres {
        assert!(insert.starts_with("WITH clock AS MATERIALIZED"), "{insert}");
        assert!(insert.contains("ins AS (INSERT INTO grpc_operation_ledger"));
        assert!(
            insert.ends_with("AND NOT EXISTS (SELECT 1 FROM ins)"),
            "{insert}"
        );
    } else {
        assert!(
            insert.starts_with("INSERT INTO grpc_operation_ledger"),
            "{insert}"
        );
    }
    if store == Store::MariaDb {
        // A plain insert: the duplicate is refused (1062), never ignored or updated.
        assert!(!insert.contains("IGNORE") && !insert.contains("DUPLICATE"));
    } else {
        assert!(insert.contains("ON CONFLICT (identity_digest) DO NOTHING"));
    }
    assert!(!insert.contains("UPDATE"));

    ledger
        .claim(&id, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    let duplicate_path =
        ledger_statements(store, std::mem::take(&mut *recording.log.lock().unwrap()));
    assert!(
        duplicate_path[0].contains("INSERT INTO"),
        "insert first, never read-then-insert"
    );
    if store == Store::Postgres {
        assert_eq!(
            duplicate_path.len(),
            1,
            "a replay in one round trip: {duplicate_path:#?}"
        );
    } else {
        assert_eq!(duplicate_path.len(), 2, "{duplicate_path:#?}");
        // The row it met, with the store's clock to judge its lease by.
        assert!(duplicate_path[1].starts_with("SELECT"));
        assert!(duplicate_path[1].contains("AS db_now FROM"));
    }

    ledger
        .mark_committed(&id, version, &outcome("p"))
        .await
        .unwrap();
    let transition = ledger_statements(store, std::mem::take(&mut *recording.log.lock().unwrap()));
    assert_eq!(transition.len(), 1);
    assert!(transition[0].starts_with("UPDATE grpc_operation_ledger SET state = 'COMMITTED'"));
    assert!(transition[0].contains("AND state = 'IN_PROGRESS' AND version = "));
}

/// Every statement that names one row must find it through the whole primary key. (A `CHAR(64)`
/// hash column once made PostgreSQL compare a bound text parameter as text and use only the
/// leading caller column, scanning all of a caller's rows on every claim read and transition.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_statements_use_the_whole_primary_key() {
    let t = fresh(Store::Postgres).await;
    let recording = Recording::on(&t.db);
    let ledger = SeaOrmOperationLedger::new(&recording);
    let id = identity("tenant-a", CREATE, "plans");
    let Ok(ClaimOutcome::Claimed { version, .. }) =
        ledger.claim(&id, &fingerprint("x"), lease(30_000)).await
    else {
        panic!("a fresh identity is claimed");
    };
    ledger
        .claim(&id, &fingerprint("x"), lease(30_000))
        .await
        .unwrap();
    ledger
        .mark_committed(&id, version, &outcome("p"))
        .await
        .unwrap();
    ledger.find(&id).await.unwrap();
    ledger.look_up(&id).await.unwrap();
    let statements = std::mem::take(&mut *recording.values.lock().unwrap());
    let txn = t.db.begin().await.unwrap();
    // An empty table would be scanned whatever the indexes; forbid that to see what is usable.
    txn.execute_unprepared("SET LOCAL enable_seqscan = off")
        .await
        .unwrap();
    let mut checked = 0;
    for (sql, values) in statements {
        if !sql.contains("WHERE identity_digest = $1") {
            continue;
        }
        let plan = txn
            .query_all_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                format!("EXPLAIN {sql}"),
                values,
            ))
            .await
            .unwrap()
            .iter()
            .map(|row| row.try_get_by_index::<String>(0).unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        let hash_in = |prefix: &str| {
            plan.lines().any(|line| {
                line.trim_start().starts_with(prefix) && line.contains("identity_digest")
            })
        };
        assert!(
            hash_in("Index Cond") && !hash_in("Filter"),
            "statement does not use the whole key:\n{sql}\n{plan}"
        );
        checked += 1;
    }
    // Both claims (the second one reads the row it met), the transition, `find` and `look_up`.
    assert_eq!(checked, 5, "checked {checked} statements");
    txn.rollback().await.unwrap();
}

/// Write-once: a new identity is recorded finished by one insert of the finished row, never a
/// claim and a transition; only a duplicate goes the claim's way (insert, then read).
async fn record_finished_is_one_insert_of_the_finished_row(store: Store) {
    let t = fresh(store).await;
    let recording = Recording::on(&t.db);
    let ledger = SeaOrmOperationLedger::new(&recording);
    let id = identity("tenant-a", CREATE, "once");
    let completion = Completion::Committed(outcome("p"));
    let recorded = ledger
        .record_finished(&id, &fingerprint("x"), lease(30_000), &completion)
        .await
        .unwrap();
    assert!(
        matches!(recorded, RecordOutcome::Recorded(_)),
        "{recorded:?}"
    );
    let insert_path = ledger_statements(store, std::mem::take(&mut *recording.log.lock().unwrap()));
    assert_eq!(insert_path.len(), 1, "{insert_path:#?}");
    assert!(insert_path[0].contains("INSERT INTO grpc_operation_ledger"));
    assert!(!insert_path[0].contains("UPDATE") && !insert_path[0].contains("IGNORE"));
    assert!(insert_path[0].contains("completed_at, outcome_reference"));
    let duplicate = ledger
        .record_finished(&id, &fingerprint("x"), lease(30_000), &completion)
        .await
        .unwrap();
    assert!(
        matches!(duplicate, RecordOutcome::Completed(_)),
        "{duplicate:?}"
    );
}

/// A resend's read first (`find`, ADR 0016) is one read of the row and nothing else: no wait
/// bound (it writes nothing) and no clock (it judges no lease). `look_up`, which says how long
/// the lease has left, reads the store's clock in the same statement.
async fn find_is_one_read_of_the_row_and_look_up_reads_the_clock_with_it(store: Store) {
    let t = fresh(store).await;
    let recording = Recording::on(&t.db);
    let ledger = SeaOrmOperationLedger::new(&recording);
    let id = identity("tenant-a", CREATE, "found");
    let Ok(ClaimOutcome::Claimed { version, .. }) =
        ledger.claim(&id, &fingerprint("x"), lease(30_000)).await
    else {
        panic!("a fresh identity is claimed");
    };
    // In progress, the lease left is judged by the clock read with the row.
    let (_, left) = ledger.look_up(&id).await.unwrap().expect("the row");
    assert!(
        left > std::time::Duration::ZERO && left <= std::time::Duration::from_secs(30),
        "{left:?}"
    );
    ledger
        .mark_committed(&id, version, &outcome("p"))
        .await
        .unwrap();
    recording.log.lock().unwrap().clear();
    let found = ledger.find(&id).await.unwrap().expect("the row");
    assert!(found.state().is_terminal());
    let read = std::mem::take(&mut *recording.log.lock().unwrap());
    assert_eq!(read.len(), 1, "{read:#?}");
    assert!(
        read[0].starts_with("SELECT request_fingerprint"),
        "{read:#?}"
    );
    assert!(!read[0].contains("db_now"), "{}", read[0]);
    let (looked_up, left) = ledger.look_up(&id).await.unwrap().expect("the row");
    assert_eq!(looked_up, found);
    assert_eq!(
        left,
        std::time::Duration::ZERO,
        "a finished lease has no time left"
    );
    let read = std::mem::take(&mut *recording.log.lock().unwrap());
    assert_eq!(read.len(), 1, "{read:#?}");
    assert!(read[0].contains("AS db_now FROM"), "{}", read[0]);
}

on_both_stores!(
    claim_emits_one_insert_on_conflict_and_never_an_update_on_the_insert_path,
    record_finished_is_one_insert_of_the_finished_row,
    find_is_one_read_of_the_row_and_look_up_reads_the_clock_with_it
);
