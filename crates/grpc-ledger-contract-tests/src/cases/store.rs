//! The store itself: purging, rows it could not replay, migrations, and bad input.

use super::*;

/// `purge` deletes only finished rows completed more than the retention ago by the store's
/// clock, at most `limit`, never an in-progress one.
pub async fn purge_deletes_only_old_finished_rows<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    for n in 0..5 {
        let id = identity("tenant-a", CREATE, &format!("old-{n}"));
        let version = claim_new(&*ledger, &id, LONG).await;
        if n % 2 == 0 {
            ledger
                .mark_committed(&id, version, &outcome("p"))
                .await
                .expect("commit");
        } else {
            ledger
                .mark_failed(&id, version, &failure("f"))
                .await
                .expect("fail");
        }
    }
    let open = identity("tenant-a", CREATE, "open");
    claim_new(&*ledger, &open, 1).await;
    // The old rows age past the retention by the store's clock; the young one is finished just
    // before the purge, well within it.
    let retention = Duration::from_millis(1_000);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let young = identity("tenant-a", CREATE, "young");
    claim_and_commit(&*ledger, &young, "p").await;

    let limit = |n| NonZeroU32::new(n).expect("non-zero");
    assert_eq!(ledger.purge(retention, limit(3)).await, Ok(3));
    assert_eq!(ledger.purge(retention, limit(100)).await, Ok(2));
    assert_eq!(ledger.purge(retention, limit(100)).await, Ok(0));
    assert!(
        ledger.find(&open).await.expect("find").is_some(),
        "IN_PROGRESS is never purged"
    );
    assert!(
        ledger.find(&young).await.expect("find").is_some(),
        "rows younger than the retention stay"
    );
    assert_eq!(store.ledger_rows().await, 2);
}

/// Rows written around the adapter (a support script, a backfill) that a replay could not use are
/// refused by the store itself; a legal one is accepted, so the refusals are the rules at work.
pub async fn store_refuses_rows_it_could_not_replay<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let committed = |outcome| RawRow {
        state: "COMMITTED",
        completed: true,
        outcome_reference: outcome,
        failure_code: None,
        failure_message: None,
    };
    let failed = |code, message| RawRow {
        state: "FAILED_TERMINAL",
        completed: true,
        outcome_reference: None,
        failure_code: code,
        failure_message: message,
    };
    assert!(
        store.write_raw_row(committed(Some("payment-1"))).await,
        "a legal committed row must be accepted"
    );
    assert!(
        store.write_raw_row(failed(Some(9), Some(""))).await,
        "a failure with an empty message is legal"
    );
    let too_long = "\u{e9}".repeat(600); // 1200 bytes
    let illegal = [
        ("a committed row with an empty outcome", committed(Some(""))),
        ("a committed row without an outcome", committed(None)),
        ("an outcome over 1024 bytes", committed(Some(&too_long))),
        ("a failure with code OK", failed(Some(0), Some("m"))),
        ("a failure without a code", failed(None, Some("m"))),
        (
            "a failure message over 1024 bytes",
            failed(Some(9), Some(&too_long)),
        ),
        (
            "a finished row without a completion time",
            RawRow {
                completed: false,
                ..committed(Some("p"))
            },
        ),
        (
            "an unknown state",
            RawRow {
                state: "DONE",
                ..committed(Some("p"))
            },
        ),
        (
            "a state stored as an ordinal",
            RawRow {
                state: "1",
                ..committed(Some("p"))
            },
        ),
    ];
    for (what, row) in illegal {
        assert!(!store.write_raw_row(row).await, "the store accepted {what}");
    }
    assert_eq!(
        store.ledger_rows().await,
        2,
        "only the legal rows are stored"
    );
}

/// Sixteen processes start together on a store without the ledger's schema and each applies the
/// migrations: every start succeeds, and the ledger then works. Runs on stores with the
/// `migrations` capability.
pub async fn concurrent_starts_migrate_once<F: LedgerFixture>(fixture: &F) {
    if !applies("concurrent_starts_migrate_once", &fixture.capabilities()) {
        return;
    }
    let store = Arc::new(fixture.fresh_unmigrated_store().await);
    let starts: Vec<_> = (0..16)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.migrate().await })
        })
        .collect();
    for start in starts {
        start
            .await
            .expect("task")
            .expect("every concurrent start migrates");
    }
    claim_and_commit(
        &*store.autocommit(),
        &identity("tenant-a", CREATE, "migrated"),
        "p",
    )
    .await;
}

/// Bad input is refused by the checked constructors before any call, so nothing is written.
pub async fn bad_input_never_writes_a_row<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let bad_keys = ["", " ", "k\n", "caf\u{e9}", &"k".repeat(256)];
    let bad_methods = [
        "Svc/M",
        "/Svc",
        "//M",
        "/a.B/",
        "/a B/M",
        "/a.B/M;DROP TABLE x",
    ];
    let bad_callers = ["", "a|b", "tenant a"];
    for key in bad_keys {
        assert!(
            IdempotencyKey::parse(key).is_err(),
            "key {key:?} must be refused"
        );
    }
    for method in bad_methods {
        assert!(
            GrpcMethod::parse(method).is_err(),
            "method {method:?} must be refused"
        );
    }
    for caller in bad_callers {
        assert!(
            CallerFingerprint::parse(caller).is_err(),
            "caller {caller:?} must be refused"
        );
    }
    assert!(OutcomeReference::parse("").is_err());
    // Hostile but valid text is stored verbatim through bound parameters, never executed.
    let hostile = identity("x';DROP_TABLE--", CREATE, "k';DELETE/**/FROM/**/t;--");
    let version = claim_new(&*ledger, &hostile, LONG).await;
    let evil = outcome("'); DROP TABLE grpc_operation_ledger; --");
    ledger
        .mark_committed(&hostile, version, &evil)
        .await
        .expect("commit");
    let record = ledger.find(&hostile).await.expect("find").expect("row");
    assert_eq!(record.outcome_reference(), Some(&evil));
    assert_eq!(
        store.ledger_rows().await,
        1,
        "only the one valid claim was written"
    );
}
