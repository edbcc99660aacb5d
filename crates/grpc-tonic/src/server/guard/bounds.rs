//! The time bounds of a guarded call's unit of work: its work (claim, handler, transition) is
//! bounded by the lease, and each COMMIT by a short bound of its own, so that what the caller is
//! told is true. A unit cut before its COMMIT was sent did not take effect: the caller hears
//! "rolled back". A COMMIT that outlives its bound may have taken effect: the caller hears
//! `OUTCOME_UNKNOWN`, and a resend with the same key finds out.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use grpc_core_api::{LedgerError, UnavailableKind};
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::Status;

tokio::task_local! {
    /// The phase of the unit running in this task, for [`commit_phase`]: set by [`to_the_end`]
    /// around the unit, so that the guard's one COMMIT path can announce itself without every
    /// step of every protocol passing it along.
    static PHASE: Arc<UnitPhase>;
}

/// Where a unit of work is, as the bound that watches it must know: working (nothing sent to
/// commit since the last commit that went on to more work), committing (a COMMIT on its way,
/// since when), finished (its last COMMIT answered: only its answer is left to give), or cut (the
/// bound ended it while it worked; it must not commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Working,
    Committing { since: Instant },
    Finished,
    Cut,
}

/// The phase of one unit, shared between the unit's task and the bound that watches it. Every
/// change is one step under the lock, so that the bound cuts a working unit or waits for a
/// committing one, never both.
#[derive(Debug)]
pub(super) struct UnitPhase {
    phase: Mutex<Phase>,
    changed: Notify,
}

impl UnitPhase {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            phase: Mutex::new(Phase::Working),
            changed: Notify::new(),
        })
    }

    fn get(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Working → committing; `false` when the bound has already cut the unit.
    fn begin_commit(&self) -> bool {
        let mut phase = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        if *phase == Phase::Cut {
            return false;
        }
        *phase = Phase::Committing {
            since: Instant::now(),
        };
        self.changed.notify_one();
        true
    }

    /// Committing → `next`: working again (claim-committed-first works on after its claim's
    /// commit), or finished (the unit's last commit, whatever it answered).
    fn end_commit(&self, next: Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*phase, Phase::Committing { .. }) {
            *phase = next;
        }
        self.changed.notify_one();
    }

    /// Working → cut; the phase found otherwise.
    fn try_cut(&self) -> Phase {
        let mut phase = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        if *phase == Phase::Working {
            *phase = Phase::Cut;
        }
        *phase
    }
}

/// What a unit does after a COMMIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterCommit {
    /// Nothing but give its answer: the work's bound no longer applies.
    Answers,
    /// More work, under the work's bound again, if the commit succeeded (claim-committed-first's
    /// handler after its claim's commit).
    WorksOn,
}

/// Runs `commit` as the unit's COMMIT: under the commit's own bound rather than the work's, or not
/// at all when the work's bound has already cut the unit (then `None`, and the caller answers
/// [`cut_while_working`]). Outside a bounded unit it just runs.
pub(super) async fn commit_phase<T, E>(
    after: AfterCommit,
    commit: impl Future<Output = Result<T, E>>,
) -> Option<Result<T, E>> {
    let phase = PHASE.try_with(Arc::clone).ok();
    if let Some(phase) = &phase
        && !phase.begin_commit()
    {
        return None;
    }
    let committed = commit.await;
    if let Some(phase) = phase {
        let works_on = after == AfterCommit::WorksOn && committed.is_ok();
        phase.end_commit(if works_on {
            Phase::Working
        } else {
            Phase::Finished
        });
    }
    Some(committed)
}

/// The answer for a unit cut while it worked: the work since its last commit was never sent to
/// commit, and the operation did not take effect (under claim-committed-first only its claim had
/// committed, and it is handed on).
pub(super) fn cut_while_working() -> Status {
    Status::unavailable(
        "the call's work outlived its time bound and was rolled back before it committed; the \
         operation did not take effect",
    )
}

/// Runs `unit` to its end in a task of its own, whatever becomes of the caller's future. Its work
/// may take `work` in all: past it, a unit that has not begun to commit is dropped and so rolled
/// back (a handler waiting on something that never answers must not hold its connection and its
/// row lock for ever; by then another attempt may take its claim over). A COMMIT, once begun, has
/// `commit_wait` of its own, whatever is left of `work`; a COMMIT that outlives it is dropped,
/// and its outcome is unknown. A unit that panicked is an error of the server; one cut off by the
/// runtime shutting down was rolled back unless it was committing or had committed (then its
/// outcome is unknown to the caller).
pub(super) async fn to_the_end<T: Send + 'static>(
    work: Duration,
    commit_wait: Duration,
    unit: impl Future<Output = Result<T, Status>> + Send + 'static,
) -> Result<T, Status> {
    let phase = UnitPhase::new();
    let mut task = tokio::spawn(PHASE.scope(Arc::clone(&phase), unit));
    let work_ends = Instant::now() + work;
    loop {
        let deadline = match phase.get() {
            Phase::Committing { since } => Some(since + commit_wait),
            Phase::Working => Some(work_ends),
            // Its last commit answered (or it was cut): nothing is left to bound.
            Phase::Finished | Phase::Cut => None,
        };
        tokio::select! {
            joined = &mut task => {
                return match joined {
                    Ok(answer) => answer,
                    Err(error) if error.is_panic() => {
                        Err(Status::internal("the unit of work panicked"))
                    }
                    Err(_) if matches!(phase.get(), Phase::Committing { .. }) => {
                        Err(unknown(UnavailableKind::ConnectionLost))
                    }
                    // Its last commit had answered, but the answer went with the task.
                    Err(_) if phase.get() == Phase::Finished => {
                        Err(unknown(UnavailableKind::CompletionUnknown))
                    }
                    Err(_) => Err(Status::unavailable(
                        "the server is shutting down; the unit of work was rolled back",
                    )),
                };
            }
            () = sleep_until(deadline) => match phase.try_cut() {
                Phase::Cut => {
                    task.abort();
                    return Err(cut_while_working());
                }
                Phase::Committing { since } if Instant::now() >= since + commit_wait => {
                    task.abort();
                    return Err(unknown(UnavailableKind::Timeout));
                }
                // A commit began as the work's bound ran out: it has a bound of its own.
                _ => {}
            },
            () = phase.changed.notified() => {}
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

fn unknown(kind: UnavailableKind) -> Status {
    LedgerError::outcome_unknown(kind).into()
}
