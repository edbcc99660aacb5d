//! How results are printed: text for a person, JSON (one document per command) for a script.
//! Nothing printed here ever holds a key: operations are shown by their key hash's prefix.

use std::time::Duration;

use grpc_core_api::OperationRecord;
use grpc_operation_ledger_seaorm::{LedgerStats, ListedOperation};
use serde_json::{Value, json};

fn seconds(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1000.0).round() / 1000.0
}

pub(crate) fn stats(stats: &LedgerStats, as_json: bool) {
    if as_json {
        print_json(json!({
            "in_progress": stats.in_progress,
            "committed": stats.committed,
            "failed_terminal": stats.failed_terminal,
            "expired_leases": stats.expired_leases,
            "oldest_in_progress_seconds": stats.oldest_in_progress.map(seconds),
            "storage_bytes": stats.storage_bytes,
        }));
        return;
    }
    println!("in progress        {}", stats.in_progress);
    println!("  lease expired    {}", stats.expired_leases);
    println!(
        "  oldest           {}",
        stats
            .oldest_in_progress
            .map_or("-".to_owned(), |age| format!("{:.1} s", age.as_secs_f64()))
    );
    println!("committed          {}", stats.committed);
    println!("failed terminal    {}", stats.failed_terminal);
    println!(
        "storage            {}",
        stats
            .storage_bytes
            .map_or("-".to_owned(), |bytes| format!("{bytes} bytes"))
    );
}

pub(crate) fn listing(operations: &[ListedOperation], as_json: bool) {
    if as_json {
        let rows: Vec<Value> = operations
            .iter()
            .map(|op| {
                json!({
                    "caller_fingerprint": op.caller.as_str(),
                    "method": op.method.as_str(),
                    "key_hash_prefix": op.key_hash_prefix,
                    "state": op.state.as_str(),
                    "version": op.version,
                    "age_seconds": seconds(op.age),
                    "lease_left_seconds": seconds(op.lease_left),
                })
            })
            .collect();
        print_json(Value::Array(rows));
        return;
    }
    println!(
        "{:<14} {:<16} {:<64} {:<40} {:>20} {:>10} {:>10}",
        "key hash", "state", "caller", "method", "version", "age s", "lease s"
    );
    for op in operations {
        println!(
            "{:<14} {:<16} {:<64} {:<40} {:>20} {:>10.1} {:>10.1}",
            op.key_hash_prefix,
            op.state.as_str(),
            op.caller.as_str(),
            op.method.as_str(),
            op.version,
            op.age.as_secs_f64(),
            op.lease_left.as_secs_f64()
        );
    }
}

pub(crate) fn record(record: &OperationRecord, lease_left: Duration, as_json: bool) {
    let key_hash = record.identity.key_hash().to_hex();
    let prefix = &key_hash[..grpc_operation_ledger_seaorm::KEY_HASH_PREFIX_LEN];
    let outcome = record.outcome_reference().map(|o| o.as_str().to_owned());
    let failure = record
        .failure()
        .map(|f| (format!("{:?}", f.code()), f.message().to_owned()));
    if as_json {
        print_json(json!({
            "caller_fingerprint": record.identity.caller().as_str(),
            "method": record.identity.method().as_str(),
            "key_hash_prefix": prefix,
            "state": record.state().as_str(),
            "version": record.version.to_stored(),
            "lease_left_seconds": seconds(lease_left),
            "outcome_reference": outcome,
            "failure_code": failure.as_ref().map(|f| f.0.clone()),
            "failure_message": failure.as_ref().map(|f| f.1.clone()),
        }));
        return;
    }
    println!("caller           {}", record.identity.caller().as_str());
    println!("method           {}", record.identity.method().as_str());
    println!("key hash         {prefix}");
    println!("state            {}", record.state().as_str());
    println!("version          {}", record.version.to_stored());
    println!("lease left       {:.1} s", lease_left.as_secs_f64());
    if let Some(outcome) = outcome {
        println!("outcome          {outcome}");
    }
    if let Some((code, message)) = failure {
        println!("failure          {code}: {message}");
    }
}

pub(crate) fn done(what: &str, count: Option<u64>, as_json: bool) {
    if as_json {
        print_json(json!({ "done": what, "rows": count }));
    } else {
        match count {
            Some(count) => println!("{what}: {count}"),
            None => println!("{what}"),
        }
    }
}

fn print_json(value: Value) {
    println!("{value}");
}
