//! A commit nobody heard back from. The unit's COMMIT reached the store and took effect, and the
//! answer was lost on the way back ([`LostCommit`](crate::LostCommit)): the unit cannot know what
//! happened, and an adapter that says `Unavailable` ("did not take effect") tells a payment
//! service that money which moved did not.

use super::*;

/// Why the lost-commit case cannot run without the hook.
pub(super) const NO_LOST_COMMIT: &str =
    "the fixture cannot lose a commit's answer (LedgerFixture::lost_commit)";

/// Rule [`Rule::UnknownOutcomeIsSaid`]: a unit claims an operation, writes its business row,
/// marks it committed and sends COMMIT; the store commits and the answer is lost. The unit's
/// commit answers `OutcomeUnknown`, never `Unavailable` or success; and the operation's identity
/// then tells what happened: the row is COMMITTED with its outcome, a resend replays it, and the
/// business row is there once.
pub async fn a_commit_whose_answer_is_lost_is_an_unknown_outcome<F: LedgerFixture>(fixture: &F) {
    let Some(hook) = fixture.lost_commit() else {
        return say_not_applicable(
            "a_commit_whose_answer_is_lost_is_an_unknown_outcome",
            NO_LOST_COMMIT,
        );
    };
    let rule = Rule::UnknownOutcomeIsSaid;
    let (store, cut) = hook.fresh_store_losing_commits().await;
    let id = identity("tenant-a", CREATE, "lost-commit");
    let unit = expect_ok(store.begin().await, at(rule, "begin a unit", &id));
    let version = claim_new(&*unit.ledger(), &id, LONG).await;
    expect_ok(
        unit.business_write("lost-commit").await,
        at(rule, "the unit's business write", &id),
    );
    let marked = unit
        .ledger()
        .mark_committed(&id, version, &outcome("payment-lost"))
        .await;
    expect_ok(
        marked,
        at(Rule::TransitionRecords, "mark the claim committed", &id),
    );
    cut.arm();
    let committed = unit.commit().await;
    match &committed {
        Err(error) if error.is_outcome_unknown() => {}
        Ok(()) => panic!(
            "the fixture's lost-commit hook did not cut the connection: the commit was answered \
             (a fixture problem, not the adapter's)"
        ),
        Err(_) => at(rule, "the COMMIT whose answer was lost", &id).fail(
            "Err(OutcomeUnknown { .. }): the unit may have committed",
            &committed,
        ),
    }
    // The store committed: the identity says so to whoever asks next.
    let row = stored(&store, &id).await;
    at(rule, "read the operation's row after the lost answer", &id).eq(
        row.finished.map(|(_, completion)| completion),
        Some(done("payment-lost")),
    );
    let replay = replayed(&*store.autocommit(), &id, "x").await;
    at(rule, "resend the operation after the lost answer", &id).eq(
        replay.finished.map(|(_, completion)| completion),
        Some(done("payment-lost")),
    );
    at(rule, "count the business rows after the lost answer", &id)
        .eq(store.business_rows("lost-commit").await, 1);
}
