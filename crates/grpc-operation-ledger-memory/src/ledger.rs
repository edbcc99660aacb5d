//! The ledger port on the double: an atomic insert-if-absent, versioned conditional
//! transitions, fenced takeovers, and the broken variants the suite's self-tests use.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use grpc_core_api::{
    ClaimOutcome, Completion, GrpcOperationIdentity, GrpcOperationLedger, LeaseDuration,
    LedgerCensus, LedgerDurability, LedgerError, OperationRecord, RequestFingerprint,
    UnavailableKind, Version,
};

use crate::store::{InMemoryStore, Lock, Shared, millis_since_epoch};
use crate::units::UnitState;
use grpc_ledger_contract_tests::Defect;

/// The ledger port on an [`InMemoryStore`], bound to a unit of work or committing each call.
pub struct InMemoryOperationLedger {
    pub(crate) shared: Arc<Shared>,
    pub(crate) unit: Option<Arc<UnitState>>,
}

impl InMemoryOperationLedger {
    /// A ledger on a fresh store of its own, each call committing at once; for unit tests.
    pub fn new() -> Self {
        InMemoryStore::new(Duration::from_secs(1)).ledger()
    }
}

impl Default for InMemoryOperationLedger {
    fn default() -> Self {
        Self::new()
    }
}

impl InMemoryOperationLedger {
    /// The storage key of the row that a read or a transition of `identity` reaches: the
    /// identity's own, unless a broken variant leaves a part out of its WHERE clause, when it is
    /// the first row (in key order) that agrees with `identity` in the parts it still compares.
    fn row_key(&self, unit: &UnitState, identity: &GrpcOperationIdentity) -> String {
        let blind_to: fn(&GrpcOperationIdentity, &GrpcOperationIdentity) -> bool =
            match self.shared.defect {
                Some(Defect::CallerBlindReads) => |row, wanted| {
                    row.method() == wanted.method() && row.key_hash() == wanted.key_hash()
                },
                Some(Defect::MethodBlindReads) => |row, wanted| {
                    row.caller() == wanted.caller() && row.key_hash() == wanted.key_hash()
                },
                _ => return identity.storage_key(),
            };
        unit.visible_keys(&self.shared)
            .into_iter()
            .find(|key| {
                unit.visible(&self.shared, key)
                    .is_some_and(|row| blind_to(&row.identity, identity))
            })
            .unwrap_or_else(|| identity.storage_key())
    }

    /// Runs `op` inside this ledger's unit, or inside a unit of its own that commits at once.
    async fn in_unit<T, F>(&self, op: F) -> Result<T, LedgerError>
    where
        F: AsyncFnOnce(&UnitState) -> Result<T, LedgerError>,
    {
        match &self.unit {
            Some(unit) if unit.killed.load(Ordering::SeqCst) => {
                Err(LedgerError::unavailable(UnavailableKind::ConnectionLost))
            }
            Some(unit) => op(unit).await,
            None => {
                let unit = InMemoryStore {
                    shared: Arc::clone(&self.shared),
                }
                .begin_unit();
                let result = op(&unit.state).await;
                unit.commit_unit();
                result
            }
        }
    }

    async fn claim_in(
        &self,
        unit: &UnitState,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError> {
        let key = identity.storage_key();
        let in_flight = || LedgerError::InFlight {
            retry_after: self.shared.claim_wait,
        };
        let fresh_version = || {
            if self.shared.defect == Some(Defect::RepeatingVersions) {
                return Version::from_stored(1).expect("1 is a version");
            }
            Version::fresh(
                millis_since_epoch(self.shared.now()),
                Version::random_salt(),
            )
        };
        let fresh_row = |version: Version| {
            let now = self.shared.now();
            OperationRecord {
                identity: identity.clone(),
                request_fingerprint: *request,
                version,
                claimed_at: now,
                lease_expires_at: now + lease.get(),
                finished: None,
            }
        };
        match self.shared.defect {
            // A lock on the key hash alone (as an advisory lock on it would be), held until the
            // unit ends: a neighbour under another caller or method waits behind it.
            Some(Defect::ClaimLocksTheKeyAlone) => {
                let key_alone = format!("key-lock|{}", identity.key_hash().to_hex());
                if let Lock::TimedOut = self.shared.lock(unit.id, &key_alone).await {
                    return Err(in_flight());
                }
            }
            Some(Defect::InFlightOnUniqueViolation)
                if unit.visible(&self.shared, &key).is_none() =>
            {
                // Read found nothing, so insert; an insert that meets a row once its holder has
                // committed is a unique violation, answered as if the holder were still busy.
                if let Lock::TimedOut = self.shared.lock(unit.id, &key).await {
                    return Err(in_flight());
                }
                if unit.visible(&self.shared, &key).is_some() {
                    return Err(in_flight());
                }
                let version = fresh_version();
                unit.pending().rows.insert(key, fresh_row(version));
                return Ok(ClaimOutcome::Claimed {
                    version,
                    took_over: false,
                });
            }
            Some(Defect::UpsertClaim) => {
                let version = fresh_version();
                unit.pending().rows.insert(key, fresh_row(version));
                return Ok(ClaimOutcome::Claimed {
                    version,
                    took_over: false,
                });
            }
            Some(Defect::ReadThenInsertClaim) if unit.visible(&self.shared, &key).is_none() => {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let version = fresh_version();
                unit.pending().rows.insert(key, fresh_row(version));
                return Ok(ClaimOutcome::Claimed {
                    version,
                    took_over: false,
                });
            }
            _ => {}
        }
        // Insert-if-absent: a row another unit inserted and has not committed blocks us, as a
        // unique index does, until that unit ends or the bound runs out.
        if self.shared.uncommitted_elsewhere(unit.id, &key)
            && let Lock::TimedOut = self.shared.lock(unit.id, &key).await
        {
            return Err(in_flight());
        }
        let existing = match unit.visible(&self.shared, &key) {
            Some(row) => row,
            None => {
                if let Lock::TimedOut = self.shared.lock(unit.id, &key).await {
                    return Err(in_flight());
                }
                // Look again under the lock: a unit may have committed this key in between,
                // and inserting now would overwrite its row.
                match unit.visible(&self.shared, &key) {
                    Some(row) => row,
                    None => {
                        let version = fresh_version();
                        unit.pending().rows.insert(key, fresh_row(version));
                        return Ok(ClaimOutcome::Claimed {
                            version,
                            took_over: false,
                        });
                    }
                }
            }
        };
        // The conflict target holds every part; the read that follows and the takeover's update
        // reach the row `row_key` names (another identity's, in a broken variant).
        let key = self.row_key(unit, identity);
        let existing = unit.visible(&self.shared, &key).unwrap_or(existing);
        if existing.request_fingerprint != *request {
            return Err(LedgerError::KeyReusedWithDifferentRequest);
        }
        if existing.state().is_terminal() {
            return Ok(ClaimOutcome::Completed(existing));
        }
        let now = self.shared.judging_now();
        if let Ok(left) = existing.lease_expires_at.duration_since(now)
            && !left.is_zero()
        {
            return Ok(ClaimOutcome::InProgress {
                record: existing,
                retry_after: left,
            });
        }
        // Fenced takeover: lock the row, then update only if it is still the version we read.
        let fenced = !matches!(
            self.shared.defect,
            Some(Defect::UnfencedTakeover | Defect::TakeoverFencedOnLeaseOnly)
        );
        if !fenced {
            // The round trip between a real store's read and its update, where another taker
            // gets in.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        if let Lock::TimedOut = self.shared.lock(unit.id, &key).await {
            return Err(in_flight());
        }
        // The update's condition, judged under the row's lock: still the version read, and its
        // lease still run out (a renewal keeps the version, so the version alone is not enough).
        let lapsed =
            |current: &OperationRecord| current.lease_expires_at <= self.shared.judging_now();
        let still_ours = |current: &OperationRecord| match self.shared.defect {
            Some(Defect::UnfencedTakeover) => true,
            Some(Defect::TakeoverFencedOnLeaseOnly) => lapsed(current),
            Some(Defect::TakeoverFencedOnVersionOnly) => current.version == existing.version,
            _ => current.version == existing.version && lapsed(current),
        };
        match unit.visible(&self.shared, &key) {
            Some(current) if still_ours(&current) && !current.state().is_terminal() => {
                let version = existing.version.next();
                unit.pending().rows.insert(key, fresh_row(version));
                Ok(ClaimOutcome::Claimed {
                    version,
                    took_over: true,
                })
            }
            Some(current) if current.state().is_terminal() => Ok(ClaimOutcome::Completed(current)),
            Some(current) => Ok(ClaimOutcome::InProgress {
                retry_after: current
                    .lease_expires_at
                    .duration_since(self.shared.judging_now())
                    .unwrap_or_default(),
                record: current,
            }),
            None => Err(LedgerError::internal(
                "a claimed row vanished during a takeover",
            )),
        }
    }

    /// A transition in this ledger's unit, once the table is not locked by anyone else.
    async fn transition(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: Completion,
    ) -> Result<Version, LedgerError> {
        self.shared
            .writing(
                LedgerError::unavailable(UnavailableKind::Timeout),
                self.in_unit(async |unit| {
                    self.transition_in(unit, identity, version, completion)
                        .await
                }),
            )
            .await
    }

    async fn transition_in(
        &self,
        unit: &UnitState,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: Completion,
    ) -> Result<Version, LedgerError> {
        let fenced = self.shared.defect != Some(Defect::UnversionedTransition);
        self.update_owned(unit, identity, version, fenced, |row| {
            row.version = row.version.next();
            row.finished = Some((self.shared.now(), completion));
            row.version
        })
        .await
    }

    async fn renew_in(
        &self,
        unit: &UnitState,
        identity: &GrpcOperationIdentity,
        version: Version,
        lease: LeaseDuration,
    ) -> Result<(), LedgerError> {
        let fenced = self.shared.defect != Some(Defect::UnfencedRenewal);
        let bumps = self.shared.defect == Some(Defect::RenewalBumpsVersion);
        let from_claim = self.shared.defect == Some(Defect::RenewalFromClaimTime);
        self.update_owned(unit, identity, version, fenced, |row| {
            if bumps {
                row.version = row.version.next();
            }
            let start = if from_claim {
                row.claimed_at
            } else {
                self.shared.judging_now()
            };
            row.lease_expires_at = start + lease.get();
        })
        .await
    }

    /// The conditional update of a row its owner holds at `version` (in progress; at that version
    /// unless a broken variant leaves the fence out), under the row's lock: `change` rewrites it,
    /// and an unmatched row says why.
    async fn update_owned<T>(
        &self,
        unit: &UnitState,
        identity: &GrpcOperationIdentity,
        version: Version,
        fenced: bool,
        change: impl FnOnce(&mut OperationRecord) -> T,
    ) -> Result<T, LedgerError> {
        let key = self.row_key(unit, identity);
        if let Lock::TimedOut = self.shared.lock(unit.id, &key).await {
            return Err(LedgerError::unavailable(UnavailableKind::Timeout));
        }
        let Some(mut row) = unit.visible(&self.shared, &key) else {
            return Err(LedgerError::NotClaimed);
        };
        if row.state().is_terminal() {
            return Err(LedgerError::AlreadyCompleted { state: row.state() });
        }
        if fenced && row.version != version {
            return Err(LedgerError::LostOwnership {
                expected: version,
                current: row.version,
            });
        }
        let changed = change(&mut row);
        unit.pending().rows.insert(key, row);
        Ok(changed)
    }
}

#[async_trait]
impl GrpcOperationLedger for InMemoryOperationLedger {
    async fn claim(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError> {
        let busy = LedgerError::InFlight {
            retry_after: self.shared.claim_wait,
        };
        self.shared
            .writing(
                busy,
                self.in_unit(async |unit| self.claim_in(unit, identity, request, lease).await),
            )
            .await
    }

    async fn mark_finished(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<Version, LedgerError> {
        self.transition(identity, version, completion.clone()).await
    }

    async fn renew_lease(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        lease: LeaseDuration,
    ) -> Result<(), LedgerError> {
        self.shared
            .writing(
                LedgerError::unavailable(UnavailableKind::Timeout),
                self.in_unit(async |unit| self.renew_in(unit, identity, version, lease).await),
            )
            .await
    }

    async fn find(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        self.in_unit(async |unit| {
            let key = self.row_key(unit, identity);
            Ok(unit.visible(&self.shared, &key))
        })
        .await
    }

    /// The double's store clock is the process's, shifted when a clock case skews it.
    async fn look_up(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<(OperationRecord, Duration)>, LedgerError> {
        let now = self.shared.judging_now();
        Ok(self.find(identity).await?.map(|record| {
            let left = match record.finished {
                Some(_) => Duration::ZERO,
                None => record
                    .lease_expires_at
                    .duration_since(now)
                    .unwrap_or_default(),
            };
            (record, left)
        }))
    }

    /// Counts the committed rows (a unit's own uncommitted writes are not counted), by the
    /// store's clock.
    async fn census(&self, retention: Duration) -> Result<LedgerCensus, LedgerError> {
        let now = self.shared.judging_now();
        let committed = self.shared.committed();
        let mut census = LedgerCensus::default();
        let broken = self.shared.defect == Some(Defect::CensusCountsInProgressAsPurgeable);
        for row in committed.rows.values() {
            if broken
                && now
                    .duration_since(row.claimed_at)
                    .is_ok_and(|age| age > retention)
            {
                census.past_retention += 1;
            }
            match row.completed_at() {
                None => {
                    census.in_progress += 1;
                    if row.lease_expires_at <= now {
                        census.expired_leases += 1;
                    }
                    let age = now.duration_since(row.claimed_at).unwrap_or_default();
                    census.oldest_in_progress = census.oldest_in_progress.max(Some(age));
                }
                Some(at) if !broken && now.duration_since(at).is_ok_and(|age| age > retention) => {
                    census.past_retention += 1;
                }
                Some(_) => {}
            }
        }
        Ok(census)
    }

    /// Deletes old finished rows in the ledger's unit, as a store's `DELETE` would: each row is
    /// locked by the unit until it ends, gone when it commits, back when it rolls back. Unlike
    /// a store, another unit's claim of a row being deleted answers from the committed row at
    /// once instead of waiting for the delete's outcome; the replay is still a true answer.
    async fn purge(&self, retention: Duration, limit: NonZeroU32) -> Result<u64, LedgerError> {
        let completed_before = self
            .shared
            .judging_now()
            .checked_sub(retention)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let outside = InMemoryOperationLedger {
            shared: Arc::clone(&self.shared),
            unit: None,
        };
        let ledger = if self.shared.defect == Some(Defect::PurgeOutsideTheUnit) {
            &outside
        } else {
            self
        };
        ledger
            .in_unit(async |unit| {
                // A row another unit holds is left for a later purge. Lock order: `committed`,
                // then the unit's `pending`; no path takes them the other way round (`visible`
                // lets go of `pending` before it reads `committed`).
                let mut committed = self.shared.committed();
                let mut pending = unit.pending();
                let doomed: Vec<String> = committed
                    .rows
                    .iter()
                    .filter(|(key, row)| {
                        let old = match row.completed_at() {
                            Some(at) => at < completed_before,
                            None if self.shared.defect == Some(Defect::PurgeInProgress) => {
                                row.lease_expires_at < completed_before
                            }
                            None => false,
                        };
                        old && committed
                            .locks
                            .get(*key)
                            .is_none_or(|holder| *holder == unit.id)
                            && !pending.rows.contains_key(*key)
                            && !pending.deleted.contains(*key)
                    })
                    .map(|(key, _)| key.clone())
                    .take(limit.get() as usize)
                    .collect();
                for key in &doomed {
                    committed.locks.insert(key.clone(), unit.id);
                }
                pending.deleted.extend(doomed.iter().cloned());
                Ok(doomed.len() as u64)
            })
            .await
    }

    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Volatile
    }
}

impl InMemoryStore {
    /// A ledger whose every call is a unit of work of its own that commits at once.
    pub fn ledger(&self) -> InMemoryOperationLedger {
        InMemoryOperationLedger {
            shared: Arc::clone(&self.shared),
            unit: None,
        }
    }
}
