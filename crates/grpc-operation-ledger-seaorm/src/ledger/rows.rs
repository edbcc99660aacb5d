//! Ledger rows to records and back: the values bound for an identity, millisecond times, and
//! the decoding of a read row.

use super::*;

/// The values of `identity_condition!`: the row's key, the identity's digest.
pub(super) fn identity_values(identity: &GrpcOperationIdentity) -> Vec<Value> {
    vec![identity.storage_digest().to_vec().into()]
}

/// The values of `identity_columns!`: the digest, the three parts and the request fingerprint.
pub(super) fn inserted_identity_values(
    identity: &GrpcOperationIdentity,
    request: &RequestFingerprint,
) -> Vec<Value> {
    vec![
        identity.storage_digest().to_vec().into(),
        identity.caller().as_str().into(),
        identity.method().as_str().into(),
        identity.key_hash().as_bytes().to_vec().into(),
        request.as_bytes().to_vec().into(),
    ]
}

pub(super) fn millis_between(from: i64, to: i64) -> i64 {
    to.saturating_sub(from)
}

pub(super) fn to_millis(time: SystemTime) -> i64 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

pub(super) fn from_millis(millis: i64) -> SystemTime {
    let magnitude = Duration::from_millis(millis.unsigned_abs());
    if millis >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// Reads a row into a record, refusing a row that breaks the record's invariants (which the
/// CHECK constraints should have prevented) as `Internal`.
pub(super) fn decode_record(
    identity: &GrpcOperationIdentity,
    row: &QueryResult,
) -> Result<OperationRecord, LedgerError> {
    let corrupt = |what: &str| LedgerError::internal(format!("stored ledger row has a bad {what}"));
    let text = |column: &str| {
        row.try_get::<String>("", column)
            .map_err(|_| corrupt(column))
    };
    let optional_text = |column: &str| {
        row.try_get::<Option<String>>("", column)
            .map_err(|_| corrupt(column))
    };
    let number = |column: &str| row.try_get::<i64>("", column).map_err(|_| corrupt(column));
    let optional_number = |column: &str| {
        row.try_get::<Option<i64>>("", column)
            .map_err(|_| corrupt(column))
    };

    let request_fingerprint = row
        .try_get::<Vec<u8>>("", "request_fingerprint")
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .map(RequestFingerprint::from_bytes)
        .ok_or(corrupt("request_fingerprint"))?;
    let state: OperationState = text("state")?.parse().map_err(|_| corrupt("state"))?;
    let version = Version::from_stored(number("version")?).map_err(|_| corrupt("version"))?;
    let completed_at = optional_number("completed_at")?.map(from_millis);
    let finished = match state {
        OperationState::InProgress => None,
        OperationState::Committed => {
            let reference =
                optional_text("outcome_reference")?.ok_or(corrupt("outcome_reference"))?;
            let reference =
                OutcomeReference::parse(&reference).map_err(|_| corrupt("outcome_reference"))?;
            Some((
                completed_at.ok_or(corrupt("completed_at"))?,
                Completion::Committed(reference),
            ))
        }
        OperationState::FailedTerminal => {
            let code = row
                .try_get::<Option<i32>>("", "failure_code")
                .map_err(|_| corrupt("failure_code"))?
                .ok_or(corrupt("failure_code"))?;
            let message = optional_text("failure_message")?.ok_or(corrupt("failure_message"))?;
            let details = row
                .try_get::<Option<Vec<u8>>>("", "failure_details")
                .map_err(|_| corrupt("failure_details"))?
                .unwrap_or_default();
            let failure = RecordedFailure::from_stored(code, &message)
                .and_then(|failure| failure.with_details(&details))
                .map_err(|_| corrupt("failure"))?;
            Some((
                completed_at.ok_or(corrupt("completed_at"))?,
                Completion::Failed(failure),
            ))
        }
    };
    Ok(OperationRecord {
        identity: identity.clone(),
        request_fingerprint,
        version,
        claimed_at: from_millis(number("claimed_at")?),
        lease_expires_at: from_millis(number("lease_expires_at")?),
        finished,
    })
}

/// [`decode_record`] of a row read with the store's clock (its `db_now` column), and that clock.
pub(super) fn decode_record_with_clock(
    identity: &GrpcOperationIdentity,
    row: &QueryResult,
) -> Result<(OperationRecord, i64), LedgerError> {
    let db_now = row
        .try_get::<i64>("", "db_now")
        .map_err(|_| LedgerError::internal("a ledger read returned no clock"))?;
    Ok((decode_record(identity, row)?, db_now))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_trip_on_both_sides_of_the_epoch() {
        for millis in [0, 1, 1_764_700_000_123, -1, -86_400_000] {
            assert_eq!(to_millis(from_millis(millis)), millis);
        }
    }
}
