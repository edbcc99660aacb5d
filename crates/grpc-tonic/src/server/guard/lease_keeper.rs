//! The lease of a committed claim, kept alive while its handler runs (claim-committed-first).
//!
//! The keeper renews the claim in a unit of work of its own every third of the lease, on a task
//! of its own, so that a renewal under way when the handler finishes is never dropped in the
//! middle of a statement (it ends, then the keeper stops). It tells the guard to cut the handler
//! when the claim is no longer safely its owner's: another attempt took it over, the store could
//! not renew it before the lease it last renewed ran out, or the handler ran past the guard's
//! longest handler time and the last lease ran out.

use std::sync::Arc;
use std::time::Duration;

use grpc_core_api::{
    GrpcOperationIdentity, GrpcOperationLedger, LeaseDuration, LedgerError, LedgerUnitsOfWork,
    UnitPerCall, Version,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::Status;

/// A running keeper of one claim's lease. Dropping it stops the renewals after the one under way:
/// its `stop` sender goes with it, and the keeper's task ends when it sees the channel closed (a
/// closed channel wakes `changed()` as a sent value does).
pub(super) struct LeaseKeeper {
    stop: watch::Sender<bool>,
    cut: oneshot::Receiver<Status>,
    task: JoinHandle<()>,
}

/// What the keeper renews, and for how long.
pub(super) struct KeptClaim {
    /// The claimed operation.
    pub(super) identity: GrpcOperationIdentity,
    /// The owner's version.
    pub(super) version: Version,
    /// Each renewal's lease.
    pub(super) lease: LeaseDuration,
    /// When the claim's statement was sent: its lease ends no earlier than this plus the lease,
    /// by any clock that does not run slower than ours.
    pub(super) claim_sent: Instant,
    /// How long the handler may run in all; the keeper renews no lease past it.
    pub(super) longest_handler: Duration,
}

impl LeaseKeeper {
    /// Starts keeping `claim` alive on `units`.
    pub(super) fn start<U: LedgerUnitsOfWork + 'static>(units: Arc<U>, claim: KeptClaim) -> Self {
        let (stop, stopped) = watch::channel(false);
        let (cut_sender, cut) = oneshot::channel();
        let task = tokio::spawn(async move {
            if let Some(status) = keep(UnitPerCall::new(units), claim, stopped).await {
                let _ = cut_sender.send(status);
            }
        });
        Self { stop, cut, task }
    }

    /// Resolves when the handler must be cut, with the status its caller gets.
    pub(super) async fn cut(&mut self) -> Status {
        (&mut self.cut)
            .await
            .unwrap_or_else(|_| Status::internal("the lease keeper ended without a word"))
    }

    /// Stops renewing once the renewal under way (if any) has ended.
    pub(super) async fn stop(mut self) {
        let _ = self.stop.send(true);
        let _ = (&mut self.task).await;
    }
}

/// The renewals, until `stopped` says the handler finished; `Some` with the status to cut the
/// handler with when the claim can no longer be kept.
///
/// Each renewal runs on a task of its own, waited for no longer than the lease it would extend:
/// a renewal stuck behind a slow store, a dead connection or a lock must not let the handler run
/// on past its lease (it is cut when the lease it holds runs out), nor hold up the handler's own
/// transition when the handler finishes (on SQLite a renewal waits for the write lock the
/// handler's unit holds). A renewal left behind that way ends on its own: it is never dropped in
/// the middle of a statement, and it is fenced on the version like every other write.
async fn keep<L: GrpcOperationLedger + 'static>(
    ledger: L,
    claim: KeptClaim,
    mut stopped: watch::Receiver<bool>,
) -> Option<Status> {
    let ledger = Arc::new(ledger);
    let every = (claim.lease.get() / 3).max(Duration::from_millis(1));
    let give_up_renewing = claim.claim_sent + claim.longest_handler;
    let mut protected_until = claim.claim_sent + claim.lease.get();
    loop {
        let renewing = Instant::now() < give_up_renewing;
        let wake = if renewing {
            (Instant::now() + every).min(protected_until)
        } else {
            protected_until
        };
        tokio::select! {
            _ = stopped.changed() => return None,
            () = tokio::time::sleep_until(wake) => {}
        }
        if !renewing {
            return Some(Status::unavailable(
                "the handler ran past the guard's longest handler time; it was cut and its work \
                 rolled back",
            ));
        }
        if Instant::now() >= protected_until {
            return Some(Status::unavailable(
                "the claim's lease could not be renewed before it ran out; the handler was cut \
                 and its work rolled back",
            ));
        }
        let sent = Instant::now();
        let mut renewal = {
            let (ledger, identity, version, lease) = (
                Arc::clone(&ledger),
                claim.identity.clone(),
                claim.version,
                claim.lease,
            );
            tokio::spawn(async move { ledger.renew_lease(&identity, version, lease).await })
        };
        let renewed = tokio::select! {
            _ = stopped.changed() => return None,
            renewed = tokio::time::timeout_at(protected_until, &mut renewal) => renewed,
        };
        let renewed = match renewed {
            Ok(Ok(renewed)) => renewed,
            Ok(Err(_)) => {
                return Some(Status::internal(
                    "a lease renewal panicked; the handler was cut and its work rolled back",
                ));
            }
            Err(_) => {
                return Some(Status::unavailable(
                    "the claim's lease could not be renewed before it ran out; the handler was \
                     cut and its work rolled back",
                ));
            }
        };
        match renewed {
            Ok(()) => protected_until = sent + claim.lease.get(),
            // The store is away for now; the next round tries again while the lease lasts.
            Err(LedgerError::Unavailable { kind }) => {
                tracing::warn!(
                    ?kind,
                    "renewing a running handler's lease failed; trying again"
                );
            }
            Err(error) => {
                tracing::warn!(%error, "a running handler's claim is no longer its own");
                return Some(Status::aborted(
                    "another attempt took the operation over while its handler ran; this \
                     attempt's work is rolled back",
                ));
            }
        }
    }
}
