//! The store itself: purging, counting, rows it could not replay, migrations, and bad input.

use super::*;

/// Rule [`Rule::CensusCounts`]: `census` counts what gauges show, by the store's clock: the
/// operations in progress, those whose lease ran out, the oldest one's age, and the finished ones
/// past the retention (in progress never counts there, however old).
pub async fn census_counts_by_the_stores_clock<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    let rule = Rule::CensusCounts;
    let empty = expect_ok(
        ledger.census(Duration::ZERO).await,
        at_store(rule, "count an empty ledger"),
    );
    at_store(rule, "count an empty ledger").eq(empty, LedgerCensus::default());

    // Finished long before the others began, with a lease long run out: never in progress, never
    // an expired lease, never the oldest in progress.
    let early = identity("tenant-a", CREATE, "census-early");
    let early_version = claim_new(&*ledger, &early, 100).await;
    let early_done = ledger
        .mark_committed(&early, early_version, &outcome("e"))
        .await;
    expect_ok(
        early_done,
        at(Rule::TransitionRecords, "commit the early claim", &early),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let live = identity("tenant-a", CREATE, "census-live");
    let lapsing = identity("tenant-a", CREATE, "census-lapsing");
    claim_new(&*ledger, &live, LONG).await;
    claim_new(&*ledger, &lapsing, 100).await;
    claim_and_commit(&*ledger, &identity("tenant-a", CREATE, "census-done"), "p").await;
    let failed = identity("tenant-a", CREATE, "census-failed");
    let version = claim_new(&*ledger, &failed, LONG).await;
    let marked = ledger.mark_failed(&failed, version, &failure("no")).await;
    expect_ok(
        marked,
        at(Rule::TransitionRecords, "fail the claim", &failed),
    );

    let step = "count within an hour's retention";
    let census = expect_ok(
        ledger.census(Duration::from_secs(3600)).await,
        at_store(rule, step),
    );
    at_store(rule, step).eq(census.in_progress, 2);
    at_store(rule, step).eq(census.expired_leases, 0);
    at_store(rule, step).eq(census.past_retention, 0);
    at_store(rule, step).check(
        matches!(census.oldest_in_progress, Some(age) if age < Duration::from_millis(1000)),
        "the oldest in progress, claimed moments ago (not the early operation, finished 1.5 s \
         before)",
        census.oldest_in_progress,
    );

    tokio::time::sleep(Duration::from_millis(400)).await;
    let step = "count 400 ms later with a 100 ms retention";
    let census = expect_ok(
        ledger.census(Duration::from_millis(100)).await,
        at_store(rule, step),
    );
    at_store(rule, step).eq(
        (
            census.in_progress,
            census.expired_leases,
            census.past_retention,
        ),
        (2, 1, 3),
    );
    at_store(rule, step).check(
        matches!(census.oldest_in_progress, Some(age) if age >= Duration::from_millis(300) && age < Duration::from_millis(1500)),
        "the oldest in progress at least 300 ms old, and younger than the early finished one",
        census.oldest_in_progress,
    );
}

/// Rule [`Rule::PurgeOnlyOldFinished`]: `purge` deletes only finished rows completed more than
/// the retention ago by the store's clock, at most `limit`, never an in-progress one.
pub async fn purge_deletes_only_old_finished_rows<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let ledger = store.autocommit();
    for n in 0..5 {
        let id = identity("tenant-a", CREATE, &format!("old-{n}"));
        let version = claim_new(&*ledger, &id, LONG).await;
        let finished = if n % 2 == 0 {
            ledger.mark_committed(&id, version, &outcome("p")).await
        } else {
            ledger.mark_failed(&id, version, &failure("f")).await
        };
        expect_ok(
            finished,
            at(Rule::TransitionRecords, "finish an operation to purge", &id),
        );
    }
    let open = identity("tenant-a", CREATE, "open");
    claim_new(&*ledger, &open, 1).await;
    // Claimed long ago, finished just now: its age is its completion's, not its claim's.
    let late = identity("tenant-a", CREATE, "claimed-old-finished-young");
    let late_version = claim_new(&*ledger, &late, LONG).await;
    // The old rows age past the retention by the store's clock; the young one is finished just
    // before the purge, well within it.
    let retention = Duration::from_millis(1_000);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let young = identity("tenant-a", CREATE, "young");
    claim_and_commit(&*ledger, &young, "p").await;
    let finished = ledger
        .mark_committed(&late, late_version, &outcome("p"))
        .await;
    expect_ok(
        finished,
        at(
            Rule::TransitionRecords,
            "finish the operation claimed long ago",
            &late,
        ),
    );

    let limit = |n| NonZeroU32::new(n).expect("non-zero");
    // IN_PROGRESS survival is checked first, so that a purge that deletes it is named as such
    // rather than as a wrong count.
    let first = ledger.purge(retention, limit(3)).await;
    let step =
        "purge with a 1 s retention and a limit of 3, then look for the expired IN_PROGRESS claim";
    at(Rule::PurgeOnlyOldFinished, step, &open).check(
        matches!(ledger.find(&open).await, Ok(Some(_))),
        "the IN_PROGRESS row (its lease long expired) is still there",
        format_args!("it was purged (purge answered {first:?})"),
    );
    let purging = at_store(
        Rule::PurgeOnlyOldFinished,
        "purge 5 old finished rows, limit 3",
    );
    purging.eq(first, Ok(3));
    let second = ledger.purge(retention, limit(100)).await;
    purging.check(
        matches!(ledger.find(&open).await, Ok(Some(_))),
        "the IN_PROGRESS row is still there after a second purge",
        format_args!("it was purged (purge answered {second:?})"),
    );
    at_store(
        Rule::PurgeOnlyOldFinished,
        "purge the 2 old finished rows left, limit 100",
    )
    .eq(second, Ok(2));
    at_store(
        Rule::PurgeOnlyOldFinished,
        "purge again: nothing old is left",
    )
    .eq(ledger.purge(retention, limit(100)).await, Ok(0));
    at(
        Rule::PurgeOnlyOldFinished,
        "look for the row finished within the retention",
        &young,
    )
    .check(
        matches!(ledger.find(&young).await, Ok(Some(_))),
        "rows younger than the retention stay",
        "it was purged",
    );
    at(
        Rule::PurgeOnlyOldFinished,
        "look for the row claimed before the retention but finished within it",
        &late,
    )
    .check(
        matches!(ledger.find(&late).await, Ok(Some(_))),
        "a row's age is its completion's: it stays",
        "it was purged (by its claim time?)",
    );
    at_store(Rule::PurgeOnlyOldFinished, "count the rows left").eq(store.ledger_rows().await, 3);
}

/// Rule [`Rule::NoTransactionOfItsOwn`]: a purge runs in the caller's unit of work like every
/// other call: rolled back, the rows it deleted are there again; committed, they are gone. (The
/// retention worker sends a batch again when the store aborts its unit; a purge that had deleted
/// outside the unit would have taken effect anyway.)
pub async fn purge_in_a_unit_rolls_back_with_it<F: LedgerFixture>(fixture: &F) {
    let store = fixture.fresh_store().await;
    let rule = Rule::NoTransactionOfItsOwn;
    let id = identity("tenant-a", CREATE, "purged-in-a-unit");
    claim_and_commit(&*store.autocommit(), &id, "p").await;
    // Older than a 1 ms retention by the store's clock, whose resolution is a millisecond.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let retention = Duration::from_millis(1);
    let limit = NonZeroU32::new(10).expect("non-zero");
    for commit in [false, true] {
        let (ends, purged) = if commit {
            ("commit", "purge the old row in a unit, then commit")
        } else {
            ("roll back", "purge the old row in a unit, then roll back")
        };
        let unit = expect_ok(store.begin().await, at(rule, "begin", &id));
        let deleted = unit.ledger().purge(retention, limit).await;
        at(rule, purged, &id).eq(deleted, Ok(1));
        let ended = if commit {
            unit.commit().await
        } else {
            unit.rollback().await
        };
        expect_ok(ended, at(rule, ends, &id));
        let found = store.autocommit().find(&id).await;
        if commit {
            at(rule, purged, &id).eq(found, Ok(None));
        } else {
            at(rule, purged, &id).check(
                matches!(&found, Ok(Some(record)) if record.state() == OperationState::Committed),
                "the committed row is there again",
                format_args!("found {found:?}"),
            );
        }
    }
}

/// Rule [`Rule::StoreRefusesIllegalRows`]: rows written around the adapter (a support script, a backfill) that a replay could not use are
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
    let legal = at_store(
        Rule::StoreRefusesIllegalRows,
        "write legal rows around the adapter",
    );
    legal.check(
        store.write_raw_row(committed(Some("payment-1"))).await,
        "a legal committed row is accepted",
        "refused",
    );
    legal.check(
        store.write_raw_row(failed(Some(9), Some(""))).await,
        "a failure with an empty message is accepted (it is legal)",
        "refused",
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
        at_store(
            Rule::StoreRefusesIllegalRows,
            "write an illegal row around the adapter",
        )
        .check(
            !store.write_raw_row(row).await,
            format_args!("the store refuses {what}"),
            row,
        );
    }
    at_store(
        Rule::StoreRefusesIllegalRows,
        "count the rows: only the legal ones",
    )
    .eq(store.ledger_rows().await, 2);
}

/// Rule [`Rule::ConcurrentMigrations`]: sixteen starts at once (each on connections of its own,
/// as a process's would be) on a store without the ledger's schema, each applying the
/// migrations: every start succeeds, and the ledger then works. Needs the fixture's
/// [`Migrations`](crate::Migrations) hook. (Real processes opening one new SQLite file are the
/// SeaORM adapter's `tests/sqlite_first_opens.rs`.)
pub async fn concurrent_starts_migrate_once<F: LedgerFixture>(fixture: &F) {
    let Some(migrations) = fixture.migrations() else {
        return;
    };
    let store = migrations.fresh_unmigrated_store().await;
    let starts = (0..16).map(|_| migrations.migrate(&store));
    for migrated in join_all(starts).await {
        expect_ok(
            migrated,
            at_store(
                Rule::ConcurrentMigrations,
                "16 starts migrate the same store at once",
            ),
        );
    }
    claim_and_commit(
        &*store.autocommit(),
        &identity("tenant-a", CREATE, "migrated"),
        "p",
    )
    .await;
}

/// Rule [`Rule::BoundParameters`]: bad input is refused by the checked constructors before any call, so nothing is written.
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
    let committed = ledger.mark_committed(&hostile, version, &evil).await;
    let step = "claim and commit an identity and outcome full of SQL";
    expect_ok(committed, at(Rule::BoundParameters, step, &hostile));
    let record = stored(&store, &hostile).await;
    at(Rule::BoundParameters, step, &hostile).eq(record.outcome_reference(), Some(&evil));
    at(
        Rule::BoundParameters,
        "count the rows: only the one valid claim",
        &hostile,
    )
    .eq(store.ledger_rows().await, 1);
}
