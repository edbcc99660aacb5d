//! Claim-committed-first (for handlers with effects outside the unit's transaction, and handlers
//! that run long): the claim commits in a unit of its own before the handler runs, so every other
//! attempt sees it at once, and its lease is renewed while the handler runs; the handler's writes
//! and the transition, fenced on the claim's version, commit together in a second unit.
//!
//! A process that dies mid-handler leaves its claim committed: no other attempt runs the handler
//! until the last renewed lease has run out, and then exactly one takes it over (version + 1), the
//! dead owner's transition fenced off should it ever come back.

use std::sync::Arc;

use grpc_core_api::{
    GrpcOperationIdentity, GrpcOperationLedger, LeaseDuration, LedgerUnitsOfWork,
    RequestFingerprint, UnitPerCall, Version,
};
use tokio::time::Instant;
use tonic::{Response, Status};

use super::bounds::AfterCommit;
use super::lease_keeper::{KeptClaim, LeaseKeeper};
use super::unit::{Before, recorded};
use super::{GuardedHandler, KeyedMutationGuard, Operation};

impl<U> KeyedMutationGuard<U>
where
    U: LedgerUnitsOfWork + 'static,
{
    /// The units of claim-committed-first: the claim, committed (or a replay, or a refusal); then
    /// the handler in a unit of its own while the claim's lease is kept alive; then the transition
    /// and the commit. A handler that fails transiently, or whose transition fails, releases the
    /// claim so that a resend takes it over without waiting out the lease.
    pub(super) async fn run_with_committed_claim<H: GuardedHandler<U::Transaction>>(
        &self,
        mut operation: Operation,
        fingerprint: RequestFingerprint,
        message: H::Request,
        handler: &H,
    ) -> Result<Response<H::Response>, Status> {
        let method = operation.method().clone();
        let identity = operation.identity().clone();
        let claim_sent = Instant::now();
        let transaction = self.units.begin().await.map_err(Status::from)?;
        let before = self
            .claim_first(&transaction, &identity, &fingerprint)
            .await;
        if let Some(metrics) = &self.metrics {
            metrics.claimed(&method, claim_sent.elapsed());
        }
        let claim = match before {
            Ok(Before::RunHandler {
                claimed: Some(claim),
            }) => claim,
            Ok(Before::RunHandler { claimed: None }) => {
                self.roll_back(transaction).await;
                return Err(Status::internal(
                    "a claim ran the handler without a version",
                ));
            }
            Ok(Before::Replay(record)) => {
                return self
                    .replay_and_roll_back(transaction, *record, handler, &operation)
                    .await;
            }
            Ok(Before::InFlight { retry_after }) => {
                self.roll_back(transaction).await;
                return self
                    .wait_for_twin(&operation, &fingerprint, handler, retry_after)
                    .await;
            }
            Err(status) => {
                return self
                    .refused(&method, identity.caller(), transaction, status)
                    .await;
            }
        };
        let version = claim.version;
        operation.taken_over(claim.took_over);
        if let Err(status) = self.commit_then(transaction, AfterCommit::WorksOn).await {
            // The claim may have committed all the same (an unknown outcome): hand it on.
            self.release(&identity, version).await;
            return Err(status);
        }
        // From here until the claim is finished or released, a unit that ends any other way (a
        // handler that panics, the unit dropped at its time bound) hands the claim on as it goes,
        // instead of leaving it to the rest of its lease.
        let mut held = HeldClaim {
            units: Arc::clone(&self.units),
            identity: identity.clone(),
            version,
            held: true,
        };

        let mut keeper = LeaseKeeper::start(
            Arc::clone(&self.units),
            KeptClaim {
                identity: identity.clone(),
                version,
                lease: self.config.lease,
                claim_sent,
                longest_handler: self.config.longest_handler,
            },
        );
        let transaction = match self.units.begin().await {
            Ok(transaction) => transaction,
            Err(error) => {
                keeper.stop().await;
                held.held = false;
                self.release(&identity, version).await;
                return Err(error.into());
            }
        };
        tracing::debug!(method = %method, "running the handler under a committed claim");
        let handled = tokio::select! {
            cut = keeper.cut() => Err(cut),
            handled = handler.handle(&transaction, message, &operation) => Ok(handled),
        };
        keeper.stop().await;
        let (completion, answer) = match handled.and_then(recorded) {
            Ok(recorded) => recorded,
            Err(status) => {
                tracing::info!(
                    method = %method,
                    caller = %identity.caller(),
                    code = ?status.code(),
                    "the handler's work was rolled back under a committed claim"
                );
                self.roll_back(transaction).await;
                held.held = false;
                self.release(&identity, version).await;
                return Err(status);
            }
        };
        let completed = self
            .complete(transaction, &identity, version, &completion)
            .await;
        held.held = false;
        match completed {
            Ok(()) => answer,
            Err(status) => {
                self.release(&identity, version).await;
                Err(status)
            }
        }
    }

    /// Hands a claim this guard gave up on to the next attempt at once (a renewal to the shortest
    /// lease, fenced on the version, so it never touches a claim another attempt took over or a
    /// finished operation). It runs on a task of its own and is waited for a third of the lease at
    /// most: a store that holds the release up (the reason the handler was cut, often) must not
    /// hold up the caller's answer, and a release left behind ends on its own. If it fails, the
    /// claim's lease runs out by itself.
    async fn release(&self, identity: &GrpcOperationIdentity, version: Version) {
        let release = tokio::spawn(release_claim(
            Arc::clone(&self.units),
            identity.clone(),
            version,
        ));
        let _ = tokio::time::timeout(self.config.lease.get() / 3, release).await;
    }
}

/// Releases a claim: a renewal to the shortest lease, fenced on `version`.
async fn release_claim<U: LedgerUnitsOfWork + 'static>(
    units: Arc<U>,
    identity: GrpcOperationIdentity,
    version: Version,
) {
    let released = UnitPerCall::new(units)
        .renew_lease(&identity, version, LeaseDuration::SHORTEST)
        .await;
    if let Err(error) = released {
        tracing::debug!(%error, "a claim given up was not released; its lease will run out");
    }
}

/// A committed claim the unit still holds. Dropped while held (the unit unwinding from a
/// panicking handler, or dropped at its time bound), it releases the claim on a task of its own:
/// the handler's writes rolled back with its transaction, so the next attempt may take over at
/// once.
struct HeldClaim<U: LedgerUnitsOfWork + 'static> {
    units: Arc<U>,
    identity: GrpcOperationIdentity,
    version: Version,
    held: bool,
}

impl<U: LedgerUnitsOfWork + 'static> Drop for HeldClaim<U> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(release_claim(
                Arc::clone(&self.units),
                self.identity.clone(),
                self.version,
            ));
        }
    }
}
