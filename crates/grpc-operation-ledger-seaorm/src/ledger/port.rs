//! The port itself: `GrpcOperationLedger` for `SeaOrmOperationLedger`, on the statements and
//! rounds of the parent module.

use super::*;

#[async_trait]
impl<C> GrpcOperationLedger for SeaOrmOperationLedger<C>
where
    C: LedgerConnection,
{
    async fn claim(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
    ) -> Result<ClaimOutcome, LedgerError> {
        if let Some(pool) = self.postgres_pool() {
            return self
                .bounded_write(pool, async |ledger| {
                    ledger.claim(identity, request, lease).await
                })
                .await;
        }
        self.bound_lock_wait().await?;
        let sql = self.sql()?;
        let phase = Phase::Claim {
            wait: self.claim_wait,
        };
        for _ in 0..CLAIM_ROUNDS {
            let found = match self
                .insert_claim(sql, identity, request, lease, phase)
                .await?
            {
                Inserted::Fresh(version) => {
                    return Ok(ClaimOutcome::Claimed {
                        version,
                        took_over: false,
                    });
                }
                Inserted::Nothing(Some(found)) => Some(*found),
                Inserted::Nothing(None) => self.read_with_clock(identity, phase).await?,
            };
            let Some((record, db_now)) = found else {
                continue; // purged between our insert and our read: insert again
            };
            if record.request_fingerprint != *request {
                return Err(LedgerError::KeyReusedWithDifferentRequest);
            }
            if record.state().is_terminal() {
                return Ok(ClaimOutcome::Completed(record));
            }
            let lease_left = millis_between(db_now, to_millis(record.lease_expires_at));
            if lease_left > 0 {
                return Ok(ClaimOutcome::InProgress {
                    retry_after: Duration::from_millis(lease_left as u64),
                    record,
                });
            }
            let mut values = identity_values(identity);
            values.push(record.version.to_stored().into());
            values.push(lease.as_millis().into());
            let changed = self.execute(&sql.take_over, values, phase).await?;
            if changed == 1 || ignores("takeover changed one row") {
                return Ok(ClaimOutcome::Claimed {
                    version: record.version.next(),
                    took_over: true,
                });
            }
            // Someone else took it over or finished it first: answer from the row as it is now.
        }
        // Other takers keep winning the row between our read and our update (leases shorter
        // than a round trip): the operation is in flight elsewhere. Come back after a lease.
        Err(LedgerError::InFlight {
            retry_after: lease.get(),
        })
    }

    /// One insert of the finished row; when the identity exists, the claim's way
    /// ([`record_by_claim`]), which reads it, takes an expired claim over, or refuses.
    async fn record_finished(
        &self,
        identity: &GrpcOperationIdentity,
        request: &RequestFingerprint,
        lease: LeaseDuration,
        completion: &Completion,
    ) -> Result<RecordOutcome, LedgerError> {
        if let Some(pool) = self.postgres_pool() {
            return self
                .bounded_write(pool, async |ledger| {
                    ledger
                        .record_finished(identity, request, lease, completion)
                        .await
                })
                .await;
        }
        self.bound_lock_wait().await?;
        let sql = self.sql()?;
        let mut values = inserted_identity_values(identity, request);
        let (state, outcome, failure) = match completion {
            Completion::Committed(outcome) => ("COMMITTED", Some(outcome.as_str()), None),
            Completion::Failed(failure) => ("FAILED_TERMINAL", None, Some(failure)),
        };
        values.push(state.into());
        values.push(i32::from(Version::random_salt()).into());
        values.push(format!("{}ms", self.claim_wait.as_millis().max(1)).into());
        values.push(outcome.map(str::to_owned).into());
        values.push(failure.map(|f| f.code() as i32).into());
        values.push(failure.map(|f| f.message().to_owned()).into());
        values.push(failure.map(|f| f.details().to_vec()).into());
        let phase = Phase::Claim {
            wait: self.claim_wait,
        };
        let statement = self.statement(&sql.record_insert, values);
        match self.insert_only(statement, phase).await? {
            Some(row) => row
                .try_get::<i64>("", "version")
                .ok()
                .and_then(|stored| Version::from_stored(stored).ok())
                .map(RecordOutcome::Recorded)
                .ok_or_else(|| LedgerError::internal("a fresh record returned no version")),
            None => record_by_claim(self, identity, request, lease, completion).await,
        }
    }

    async fn mark_finished(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        completion: &Completion,
    ) -> Result<Version, LedgerError> {
        self.transition(identity, version, completion).await
    }

    async fn renew_lease(
        &self,
        identity: &GrpcOperationIdentity,
        version: Version,
        lease: LeaseDuration,
    ) -> Result<(), LedgerError> {
        match self.postgres_pool() {
            Some(pool) => {
                self.bounded_write(pool, async |ledger| {
                    ledger.renew_here(identity, version, lease).await
                })
                .await
            }
            None => self.renew_here(identity, version, lease).await,
        }
    }

    async fn find(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<OperationRecord>, LedgerError> {
        self.read(identity, Phase::Other).await
    }

    /// The record with its lease judged by the store's clock, read in the same statement.
    async fn look_up(
        &self,
        identity: &GrpcOperationIdentity,
    ) -> Result<Option<(OperationRecord, Duration)>, LedgerError> {
        Ok(self
            .read_with_clock(identity, Phase::Other)
            .await?
            .map(|(record, db_now)| {
                let left = match record.finished {
                    Some(_) => 0,
                    None => millis_between(db_now, to_millis(record.lease_expires_at)).max(0),
                };
                (record, Duration::from_millis(left as u64))
            }))
    }

    async fn census(&self, retention: Duration) -> Result<LedgerCensus, LedgerError> {
        Ok(crate::admin::count_operations(self.connection(), retention)
            .await?
            .census)
    }

    async fn purge(&self, retention: Duration, limit: NonZeroU32) -> Result<u64, LedgerError> {
        if let Some(pool) = self.postgres_pool() {
            return self
                .bounded_write(pool, async |ledger| ledger.purge(retention, limit).await)
                .await;
        }
        self.bound_lock_wait().await?;
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let values = vec![retention_ms.into(), i64::from(limit.get()).into()];
        self.execute(&self.sql()?.purge, values, Phase::Other).await
    }

    fn durability(&self) -> LedgerDurability {
        LedgerDurability::Durable
    }
}
