//! The commands: what each reads, what it refuses, and through which door it writes (the port,
//! fenced like every other write, for `fail` and `purge`).

use std::fmt;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use grpc_core_api::{
    CallerFingerprint, Completion, GrpcMethod, GrpcOperationIdentity, IdempotencyKey, KeyHasher,
    LedgerError, LedgerUnitsOfWork, RecordedFailure, Version,
};
use grpc_operation_ledger_seaorm::{
    LedgerConfig, ListFilter, SeaOrmUnitsOfWork, ServerKind, connect_server, find_listed,
    ledger_stats, list_operations, open_sqlite, resolve_pooler, state_named,
};
use sea_orm::{DatabaseConnection, DatabaseTransaction};
use tokio::io::AsyncReadExt;

use crate::output;

/// The operator's command line for an operation ledger.
#[derive(Debug, Parser)]
#[command(name = "grpc-ledger", version)]
pub(crate) struct Cli {
    /// The ledger's store: `postgres://…`, `mysql://…/DATABASE` or `mariadb://…/DATABASE`, or
    /// `sqlite:PATH` (an existing file). Never printed.
    #[arg(long, env = "GRPC_LEDGER_URL", hide_env_values = true, global = true)]
    url: Option<String>,
    /// One JSON document on stdout instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Operations by state, expired leases, the oldest in progress, and the table's size.
    Stats,
    /// Operations oldest first, by key hash prefix (never the key): filter by state, method,
    /// age, or expired lease.
    List {
        /// IN_PROGRESS, COMMITTED or FAILED_TERMINAL.
        #[arg(long)]
        state: Option<String>,
        /// A full method name, `/package.Service/Method`.
        #[arg(long)]
        method: Option<String>,
        /// Only operations claimed more than this many seconds ago.
        #[arg(long, value_name = "SECONDS")]
        older_than: Option<u64>,
        /// Only operations in progress whose lease has run out (their handler died or hangs).
        #[arg(long)]
        expired_lease: bool,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// One operation's record, named as the guard names it: the caller, the method and the key,
    /// the key read from a file or stdin (never the command line, which shells keep) and hashed
    /// with the deployment's key secret exactly as the guard hashes it.
    Show {
        #[command(flatten)]
        caller: CallerArgs,
        /// A full method name, `/package.Service/Method`.
        #[arg(long)]
        method: String,
        /// A file holding the key (default: stdin); one trailing newline is ignored.
        #[arg(long, value_name = "PATH")]
        key_file: Option<PathBuf>,
        /// A file holding the server's key secret (`KeyHasher::hmac_sha256`).
        #[arg(
            long,
            value_name = "PATH",
            env = "GRPC_LEDGER_KEY_SECRET_FILE",
            conflicts_with = "unkeyed_sha256"
        )]
        key_secret_file: Option<PathBuf>,
        /// The deployment hashes keys with plain SHA-256 (`KeyHasher::Sha256`), no secret.
        #[arg(long)]
        unkeyed_sha256: bool,
    },
    /// Ends an operation in progress whose lease has run out as FAILED_TERMINAL, fenced on the
    /// version `list` showed: a resend under its key then gets this failure. A live lease, a
    /// finished operation or a version that moved on is refused.
    Fail {
        /// The caller's fingerprint, as `list` shows it.
        #[arg(long)]
        caller_fingerprint: String,
        /// A full method name, `/package.Service/Method`.
        #[arg(long)]
        method: String,
        /// The key hash prefix `list` showed (12 hex digits or more).
        #[arg(long)]
        key_hash_prefix: String,
        /// The version `list` showed.
        #[arg(long)]
        version: i64,
        /// The gRPC status code a resend gets: a name (ABORTED, FAILED_PRECONDITION, ...) or a
        /// number from 1 to 16.
        #[arg(long)]
        code: String,
        /// The status message a resend gets.
        #[arg(long)]
        message: String,
    },
    /// Deletes finished operations completed more than `--older-than` seconds ago (never one in
    /// progress), in batches, until none is left.
    Purge {
        /// The retention: keep operations that finished more recently than this.
        #[arg(long, value_name = "SECONDS")]
        older_than: u64,
        /// Rows per batch (each a statement of its own).
        #[arg(long, default_value_t = 1000)]
        batch: u32,
    },
}

/// Who the caller is: as the guard derived it, or the principal it derives it from.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
struct CallerArgs {
    /// The caller's fingerprint, as `list` shows it.
    #[arg(long)]
    caller_fingerprint: Option<String>,
    /// The authenticated principal (a SPIFFE id, a subject), fingerprinted as the guard does.
    #[arg(long)]
    principal: Option<String>,
}

/// Why a command did not do what it was asked.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The ledger says no: no such operation, a live lease, a version that moved on.
    Refused(String),
    /// The command's input is wrong.
    BadInput(String),
    /// The store failed or cannot be reached.
    Store(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(why) => write!(f, "refused: {why}"),
            Self::BadInput(why) => write!(f, "bad input: {why}"),
            Self::Store(why) => write!(f, "store: {why}"),
        }
    }
}

impl From<LedgerError> for Failure {
    fn from(error: LedgerError) -> Self {
        // A ledger error's message carries no key, caller or row value.
        Self::Store(error.to_string())
    }
}

fn bad(why: impl fmt::Display) -> Failure {
    Failure::BadInput(why.to_string())
}

pub(crate) async fn run(cli: Cli) -> Result<(), Failure> {
    let url = cli
        .url
        .as_deref()
        .ok_or_else(|| bad("no store: give --url or set GRPC_LEDGER_URL"))?;
    // An operator's URL may go through a pooler: it is found out (`resolve_pooler`), and every
    // statement runs in a transaction, which a transaction pooler needs.
    let config = resolve_pooler(url, LedgerConfig::default().with_max_connections(2))
        .await
        .map_err(|error| Failure::Store(error.to_string()))?;
    let db = connect(url, &config).await?;
    let units = SeaOrmUnitsOfWork::new(db.clone(), &config);
    let outcome = command(&units, cli.command, cli.json).await;
    let _ = db.close().await;
    outcome
}

/// Runs `read` in a read transaction of `units` (see `SeaOrmUnitsOfWork::begin_read`), then
/// rolls it back: a read changes nothing.
async fn reading<T>(
    units: &SeaOrmUnitsOfWork,
    read: impl AsyncFnOnce(&DatabaseTransaction) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let txn = units.begin_read().await?;
    let read = read(&txn).await;
    let _ = txn.rollback().await;
    read
}

async fn command(units: &SeaOrmUnitsOfWork, command: Command, json: bool) -> Result<(), Failure> {
    match command {
        Command::Stats => {
            let stats = reading(units, async |txn| Ok(ledger_stats(txn).await?)).await?;
            output::stats(&stats, json)
        }
        Command::List {
            state,
            method,
            older_than,
            expired_lease,
            limit,
        } => {
            let mut filter = ListFilter::new().with_limit(limit);
            if let Some(state) = state {
                filter =
                    filter.with_state(state_named(&state).ok_or_else(|| {
                        bad("a state is IN_PROGRESS, COMMITTED or FAILED_TERMINAL")
                    })?);
            }
            if let Some(method) = method {
                filter = filter.with_method(GrpcMethod::parse(&method).map_err(bad)?);
            }
            if let Some(seconds) = older_than {
                filter = filter.older_than(Duration::from_secs(seconds));
            }
            if expired_lease {
                filter = filter.expired_lease();
            }
            let listed =
                reading(units, async |txn| Ok(list_operations(txn, &filter).await?)).await?;
            output::listing(&listed, json);
        }
        Command::Show {
            caller,
            method,
            key_file,
            key_secret_file,
            unkeyed_sha256,
        } => {
            let hasher = match (key_secret_file, unkeyed_sha256) {
                (_, true) => KeyHasher::Sha256,
                (Some(path), false) => {
                    let secret = std::fs::read(&path).map_err(|error| {
                        bad(format!("the key secret file cannot be read: {error}"))
                    })?;
                    KeyHasher::hmac_sha256(trim_newline(&secret)).map_err(bad)?
                }
                (None, false) => {
                    return Err(bad(
                        "give --key-secret-file (the server's key secret), or --unkeyed-sha256 for a deployment without one",
                    ));
                }
            };
            let key = read_key(key_file).await?;
            let identity = GrpcOperationIdentity::new(
                caller_of(&caller)?,
                GrpcMethod::parse(&method).map_err(bad)?,
                hasher.hash(&key),
            );
            let found = reading(units, async |txn| {
                Ok(units.ledger(txn).look_up(&identity).await?)
            })
            .await?;
            let (record, lease_left) = found.ok_or_else(|| {
                Failure::Refused(
                    "no operation with this caller, method and key (or a different key secret)"
                        .to_owned(),
                )
            })?;
            output::record(&record, lease_left, json);
        }
        Command::Fail {
            caller_fingerprint,
            method,
            key_hash_prefix,
            version,
            code,
            message,
        } => {
            let caller = CallerFingerprint::parse(&caller_fingerprint).map_err(bad)?;
            let method = GrpcMethod::parse(&method).map_err(bad)?;
            let failure = RecordedFailure::new(code_named(&code)?, &message).map_err(bad)?;
            let expected = Version::from_stored(version).map_err(bad)?;
            let found = reading(units, async |txn| {
                find_listed(txn, &caller, &method, &key_hash_prefix)
                    .await
                    .map_err(|error| match error {
                        LedgerError::Internal { .. } => bad(error),
                        other => Failure::from(other),
                    })
            })
            .await?;
            let identity = found.ok_or_else(|| Failure::Refused("no such operation".to_owned()))?;
            fail(units, &identity, expected, failure).await?;
            output::done("failed terminally", None, json);
        }
        Command::Purge { older_than, batch } => {
            let batch = NonZeroU32::new(batch).ok_or_else(|| bad("--batch must be at least 1"))?;
            let retention = Duration::from_secs(older_than);
            let mut purged = 0;
            loop {
                // Each batch in a unit of its own: its locks last one batch.
                let txn = units.begin().await?;
                let deleted = units.ledger(&txn).purge(retention, batch).await;
                let deleted = match deleted {
                    Ok(deleted) => {
                        units.commit(txn).await?;
                        deleted
                    }
                    Err(error) => {
                        let _ = units.rollback(txn).await;
                        return Err(error.into());
                    }
                };
                purged += deleted;
                if deleted < u64::from(batch.get()) {
                    break;
                }
            }
            output::done("purged", Some(purged), json);
        }
    }
    Ok(())
}

/// Ends `identity` as failed if it is in progress at `expected`, its lease run out: the look-up
/// and the fenced transition in one unit of work.
async fn fail(
    units: &SeaOrmUnitsOfWork,
    identity: &GrpcOperationIdentity,
    expected: Version,
    failure: RecordedFailure,
) -> Result<(), Failure> {
    let txn = units.begin().await?;
    let failed = fail_in(units, &txn, identity, expected, failure).await;
    match failed {
        Ok(()) => Ok(units.commit(txn).await?),
        Err(refused) => {
            let _ = units.rollback(txn).await;
            Err(refused)
        }
    }
}

async fn fail_in(
    units: &SeaOrmUnitsOfWork,
    txn: &DatabaseTransaction,
    identity: &GrpcOperationIdentity,
    expected: Version,
    failure: RecordedFailure,
) -> Result<(), Failure> {
    let ledger = units.ledger(txn);
    let (record, lease_left) = ledger
        .look_up(identity)
        .await?
        .ok_or_else(|| Failure::Refused("no such operation".to_owned()))?;
    if record.state().is_terminal() {
        return Err(Failure::Refused(format!(
            "the operation already finished ({})",
            record.state()
        )));
    }
    if record.version != expected {
        return Err(Failure::Refused(format!(
            "the operation's version is now {} (list again)",
            record.version.to_stored()
        )));
    }
    if !lease_left.is_zero() {
        return Err(Failure::Refused(format!(
            "its lease is live for {:.1} s more: its handler may still commit",
            lease_left.as_secs_f64()
        )));
    }
    // Fenced on the version: a resend that took the operation over since the look-up wins.
    ledger
        .mark_finished(identity, expected, &Completion::Failed(failure))
        .await
        .map_err(|error| match error {
            LedgerError::LostOwnership { .. } | LedgerError::AlreadyCompleted { .. } => {
                Failure::Refused(format!("the operation moved on meanwhile: {error}"))
            }
            other => Failure::from(other),
        })?;
    Ok(())
}

async fn connect(url: &str, config: &LedgerConfig) -> Result<DatabaseConnection, Failure> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        let path = std::path::Path::new(path.trim_start_matches("//"));
        // An operator's typo must not create an empty ledger.
        if !path.is_file() {
            return Err(bad(format!("no SQLite file at {}", path.display())));
        }
        return open_sqlite(path, config).await.map_err(|error| {
            Failure::Store(grpc_operation_ledger_seaorm::store_error(error).to_string())
        });
    }
    ServerKind::of_url(url)
        .map_err(|error| bad(error.to_string().replace("Custom Error: ", "")))?;
    let (db, _) = connect_server(url, config)
        .await
        .map_err(|error| match error {
            sea_orm::DbErr::Custom(why) => bad(why),
            other => Failure::Store(grpc_operation_ledger_seaorm::store_error(other).to_string()),
        })?;
    Ok(db)
}

fn caller_of(args: &CallerArgs) -> Result<CallerFingerprint, Failure> {
    match (&args.caller_fingerprint, &args.principal) {
        (Some(fingerprint), _) => CallerFingerprint::parse(fingerprint).map_err(bad),
        (None, Some(principal)) => Ok(CallerFingerprint::from_principal(principal.as_bytes())),
        (None, None) => Err(bad("give --caller-fingerprint or --principal")),
    }
}

async fn read_key(file: Option<PathBuf>) -> Result<IdempotencyKey, Failure> {
    let bytes = match file {
        Some(path) => std::fs::read(&path)
            .map_err(|error| bad(format!("the key file cannot be read: {error}")))?,
        None => {
            let mut bytes = Vec::new();
            tokio::io::stdin()
                .read_to_end(&mut bytes)
                .await
                .map_err(|error| bad(format!("stdin cannot be read: {error}")))?;
            bytes
        }
    };
    IdempotencyKey::parse_bytes(trim_newline(&bytes)).map_err(bad)
}

fn trim_newline(bytes: &[u8]) -> &[u8] {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    bytes.strip_suffix(b"\r").unwrap_or(bytes)
}

/// A status code by name (`ABORTED`, `failed_precondition`) or number (1 to 16).
fn code_named(name: &str) -> Result<tonic::Code, Failure> {
    let wanted = name.replace('_', "").to_ascii_lowercase();
    (1..=16)
        .map(tonic::Code::from_i32)
        .find(|code| {
            format!("{code:?}").to_ascii_lowercase() == wanted
                || (*code as i32).to_string() == wanted
        })
        .ok_or_else(|| bad(format!("{name} is not a gRPC status code from 1 to 16")))
}
