//! A keyed payment flow on the embedded SQLite ledger, with lost responses and retries:
//! `cargo run -p grpc-operation-ledger-seaorm --example walkthrough [-- PAYMENTS]`.
//!
//! Each payment runs claim + business insert + mark_committed in one transaction. Every third
//! response is "lost", so the client retries with the same key and must get the recorded outcome
//! back without a second insert; every tenth payment is resent with a changed body under the same
//! key and must be refused. At the end the payments table is reconciled against the ledger.

use std::time::Duration;

use grpc_core_api::*;
use grpc_operation_ledger_seaorm::{LedgerConfig, SeaOrmOperationLedger, open_sqlite};
use sea_orm::{ConnectionTrait, DatabaseConnection, Statement, TransactionTrait};

#[derive(Default, Debug)]
struct Tally {
    executed: u64,
    replayed: u64,
    refused_reused_key: u64,
}

/// The server side of one call: claim, write, commit; or replay; or refuse.
async fn handle(
    db: &DatabaseConnection,
    identity: &GrpcOperationIdentity,
    body: &str,
    tally: &mut Tally,
) -> Result<String, LedgerError> {
    let txn = db
        .begin()
        .await
        .map_err(|_| LedgerError::unavailable(UnavailableKind::ConnectionLost))?;
    let ledger = SeaOrmOperationLedger::new(&txn);
    let lease = LeaseDuration::new(Duration::from_secs(30))?;
    match ledger
        .claim(identity, &RequestFingerprint::of(body.as_bytes()), lease)
        .await?
    {
        ClaimOutcome::Claimed { version, .. } => {
            let payment_id = format!("pay-{}", &identity.key_hash().to_hex()[..12]);
            txn.execute_raw(Statement::from_sql_and_values(
                txn.get_database_backend(),
                "INSERT INTO payments (payment_id, body) VALUES (?1, ?2)",
                [payment_id.clone().into(), body.into()],
            ))
            .await
            .map_err(|_| LedgerError::internal("business write failed"))?;
            ledger
                .mark_committed(identity, version, &OutcomeReference::parse(&payment_id)?)
                .await?;
            txn.commit()
                .await
                .map_err(|_| LedgerError::unavailable(UnavailableKind::ConnectionLost))?;
            tally.executed += 1;
            Ok(payment_id)
        }
        ClaimOutcome::Completed(record) => {
            tally.replayed += 1;
            // This walkthrough records no failures, so a finished payment always has an outcome.
            record
                .outcome_reference()
                .map(|r| r.as_str().to_owned())
                .ok_or_else(|| LedgerError::internal("a replayed payment has no outcome"))
        }
        ClaimOutcome::InProgress { retry_after, .. } => Err(LedgerError::InFlight { retry_after }),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let payments: u64 = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(1000);
    let dir = std::env::temp_dir().join(format!("ledger-walkthrough-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("ledger.sqlite");
    let db = open_sqlite(&file, &LedgerConfig::default()).await?;
    db.execute_unprepared(
        "CREATE TABLE payments (payment_id TEXT PRIMARY KEY, body TEXT NOT NULL)",
    )
    .await?;

    let caller = CallerFingerprint::from_principal(b"spiffe://demo/checkout");
    let method = GrpcMethod::parse("/payments.v1.Payments/CreatePayment")?;
    let hasher = KeyHasher::hmac_sha256(b"walkthrough-server-secret-32-bytes")?;
    let mut tally = Tally::default();
    let mut acknowledged = 0u64;
    for n in 0..payments {
        let key = IdempotencyKey::parse(&format!("order-{n}"))?;
        let identity =
            GrpcOperationIdentity::new(caller.clone(), method.clone(), hasher.hash(&key));
        let body = format!("amount={}", 100 + n);
        let first = handle(&db, &identity, &body, &mut tally).await?;
        if n % 3 == 0 {
            // The response was lost on the way back; the client retries with the same key.
            let retried = handle(&db, &identity, &body, &mut tally).await?;
            assert_eq!(retried, first, "a retry replays the recorded outcome");
        }
        if n % 10 == 0 {
            let changed = handle(&db, &identity, "amount=999999", &mut tally).await;
            if changed == Err(LedgerError::KeyReusedWithDifferentRequest) {
                tally.refused_reused_key += 1;
            }
        }
        acknowledged += 1;
    }

    let one = |sql: &'static str| {
        let db = &db;
        async move {
            db.query_one_raw(Statement::from_string(db.get_database_backend(), sql))
                .await
                .map(|row| {
                    row.and_then(|r| r.try_get_by_index::<i64>(0).ok())
                        .unwrap_or(-1)
                })
        }
    };
    let rows = one("SELECT COUNT(*) FROM payments").await?;
    let committed =
        one("SELECT COUNT(*) FROM grpc_operation_ledger WHERE state = 'COMMITTED'").await?;
    let duplicates = rows - i64::try_from(tally.executed)?;
    let losses = i64::try_from(acknowledged)? - committed;
    println!("payments acknowledged   {acknowledged}");
    println!("executed once           {}", tally.executed);
    println!("replayed after loss     {}", tally.replayed);
    println!("refused (key reused)    {}", tally.refused_reused_key);
    println!("payments rows           {rows}");
    println!("duplicates              {duplicates}");
    println!("losses                  {losses}");
    println!("ledger file             {}", file.display());
    db.close().await?;
    std::fs::remove_dir_all(&dir)?;
    if duplicates != 0 || losses != 0 {
        return Err("reconciliation failed".into());
    }
    Ok(())
}
