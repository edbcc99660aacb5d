//! `--chain`: the payments service calling a postings service inside each payment, each with its
//! own guard and store, and faults on both hops: responses lost after commit on each, payment
//! units failed after their posting committed, and each server killed once mid-run. Both stores
//! are reconciled; postings whose payment never committed are counted, and the client's resends
//! under the same keys settle them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use grpc_core_api::LedgerUnitsOfWork;
use grpc_ledger_payments::{
    Downstream, Faults, PostingsService, Store, UnitFailures, open_ledger_store, open_store,
    prepare_postings_database, serve, serve_postings, service, statement,
};
use grpc_operation_ledger_seaorm::{LedgerConfig, SeaOrmUnitsOfWork};
use grpc_tonic::GuardMode;
use grpc_tonic::testing::{AfterCommitFaults, reconcile};
use sea_orm::{ConnectionTrait, DatabaseConnection};

use crate::client::{Workload, resend_until_answered, send_payments};
use crate::{ClientOptions, DemoReport, FaultOptions, INJECTED_DELAY};

/// The faults of the chain's second hop (payments to postings) and inside the payments unit.
#[derive(Debug, Clone, Copy)]
pub struct ChainFaults {
    /// Share of the postings' responses lost after the posting committed.
    pub postings_drop_rate: f64,
    /// Share of the postings' streams reset after the posting committed.
    pub postings_reset_rate: f64,
    /// Share of payment units failed (rolled back) after their posting committed.
    pub fail_after_posting_rate: f64,
    /// Kill each server once mid-run (the payments server at a third of the payments, the
    /// postings server at two thirds) and start it again on its port.
    pub kill_servers: bool,
}

/// Where each service of the chain keeps its ledger and business table.
#[derive(Debug, Clone)]
pub struct ChainStores {
    /// The payments service's store.
    pub payments: Store,
    /// The postings service's store.
    pub postings: Store,
}

/// How long the settling resends an unacknowledged key before giving up on it: longer than the
/// guard's lease (30 s), since under claim-committed-first a claim whose server was killed is
/// taken over only once its lease ran out, and until then a resend is told to come back later.
const SETTLE_WITHIN: Duration = Duration::from_secs(45);

/// The downtime of a killed server before it starts again.
const DOWNTIME: Duration = Duration::from_millis(300);

/// What a chained run did, and what both stores say about it.
#[derive(Debug, Default, Clone)]
pub struct ChainReport {
    /// The first hop and the payments store, as a single-service run reports them.
    pub payments: DemoReport,
    /// Postings' responses lost after commit.
    pub postings_dropped: u64,
    /// Postings' streams reset after commit.
    pub postings_reset: u64,
    /// Payment units failed after their posting committed.
    pub failed_after_posting: u64,
    /// Servers killed mid-run.
    pub servers_killed: Vec<&'static str>,
    /// Posting rows of this run.
    pub posting_rows: u64,
    /// Accounts of this run with more than one posting.
    pub duplicate_postings: u64,
    /// Acknowledged payments without a posting, or whose posting is not the one the client was
    /// told.
    pub lost_postings: u64,
    /// Postings whose payment had not committed when the workload ended.
    pub orphans_before_settling: u64,
    /// Unacknowledged payments the settling resends got acknowledged.
    pub settled: u64,
    /// Of the orphaned postings, those a settled payment took up as its own (same posting id).
    pub orphans_reused: u64,
    /// Postings still without a payment after the settling.
    pub orphans_after_settling: u64,
}

impl ChainReport {
    /// Whether both stores reconciled: no duplicate and no loss in either, and no posting left
    /// without its payment once the client resent every unacknowledged key.
    pub fn reconciled(&self) -> bool {
        self.payments.reconciled()
            && self.duplicate_postings == 0
            && self.lost_postings == 0
            && self.orphans_after_settling == 0
    }
}

impl fmt::Display for ChainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The first hop's table, without its verdict: the chain's comes last.
        let payments = self.payments.to_string();
        for line in payments
            .lines()
            .filter(|line| !line.starts_with("reconciliation"))
        {
            // The statuses the workload's calls ended with, before the settling resent them.
            match line.strip_prefix("failed with ") {
                Some(failure) => writeln!(f, "before settling, failed with {failure}")?,
                None => writeln!(f, "{line}")?,
            }
        }
        let killed = if self.servers_killed.is_empty() {
            "none".to_owned()
        } else {
            self.servers_killed.join(", ")
        };
        let rows: [(&str, String); 10] = [
            ("servers killed", killed),
            (
                "postings lost after commit",
                self.postings_dropped.to_string(),
            ),
            (
                "postings reset after commit",
                self.postings_reset.to_string(),
            ),
            (
                "payments failed after posting",
                self.failed_after_posting.to_string(),
            ),
            ("posting rows", self.posting_rows.to_string()),
            ("duplicate postings", self.duplicate_postings.to_string()),
            ("lost postings", self.lost_postings.to_string()),
            (
                "orphan postings before settling",
                self.orphans_before_settling.to_string(),
            ),
            (
                "settled (resent, acknowledged)",
                format!("{} ({} orphans reused)", self.settled, self.orphans_reused),
            ),
            (
                "orphan postings after settling",
                self.orphans_after_settling.to_string(),
            ),
        ];
        for (name, value) in rows {
            writeln!(f, "{name:<44} {value:>10}")?;
        }
        let verdict = if self.reconciled() {
            "OK: every acknowledged payment exactly once, with exactly one posting"
        } else {
            "FAILED"
        };
        write!(f, "{:<44} {verdict:>10}", "reconciliation")
    }
}

/// A future a server runs until it is killed or fails.
type ServerFuture = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// A server on a runtime of its own, so that killing it drops its connections, its pool and its
/// in-flight units at once, as a crashed process's would be (nothing of it runs on): its
/// uncommitted transactions die with their connections.
struct KillableServer {
    name: &'static str,
    addr: SocketAddr,
    /// The server on a listener, given the number of its start (from 0): a restarted server
    /// must not reuse an id the one it replaces handed out.
    start: Box<dyn Fn(tokio::net::TcpListener, u64) -> ServerFuture + Send + Sync>,
    starts: u64,
    runtime: Option<tokio::runtime::Runtime>,
}

impl KillableServer {
    /// Starts `start` on `addr` (port 0: any free loopback port, kept across restarts).
    async fn start(
        name: &'static str,
        addr: SocketAddr,
        start: impl Fn(tokio::net::TcpListener, u64) -> ServerFuture + Send + Sync + 'static,
    ) -> Result<Self> {
        let mut server = Self {
            name,
            addr,
            start: Box::new(start),
            starts: 0,
            runtime: None,
        };
        server.run().await?;
        Ok(server)
    }

    async fn run(&mut self) -> Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(self.name)
            .enable_all()
            .build()?;
        let addr = self.addr;
        // The killed server's listener may still be closing: the port is retried for a while.
        let bound = runtime
            .spawn(async move {
                let mut tries = 0;
                loop {
                    match tokio::net::TcpListener::bind(addr).await {
                        Ok(listener) => return Ok(listener),
                        Err(error) if tries == 20 => return Err(error),
                        Err(_) => tries += 1,
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
            .await;
        let listener = match bound.map_err(anyhow::Error::from).and_then(|bound| {
            let listener = bound?;
            listener.local_addr()?;
            Ok(listener)
        }) {
            Ok(listener) => listener,
            Err(error) => {
                // A runtime may not be dropped in an async context: shut it down instead.
                runtime.shutdown_background();
                return Err(error.context(format!("binding the {} server to {addr}", self.name)));
            }
        };
        self.addr = listener.local_addr()?;
        let name = self.name;
        let served = (self.start)(listener, self.starts);
        self.starts += 1;
        runtime.spawn(async move {
            if let Err(error) = served.await {
                eprintln!("grpc-ledger-demo: the {name} server stopped: {error:#}");
            }
        });
        self.runtime = Some(runtime);
        Ok(())
    }

    /// Kills the server (its runtime shut down without waiting for anything on it), waits
    /// `downtime` and starts it again on the same port.
    async fn kill_and_restart(&mut self, downtime: Duration) -> Result<()> {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
        tokio::time::sleep(downtime).await;
        self.run().await
    }
}

impl Drop for KillableServer {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The postings server's future on `listener`: its store opened, its service on it, served
/// behind `faults` until killed.
pub async fn postings_server(
    store: Store,
    mode: GuardMode,
    faults: Arc<AfterCommitFaults>,
    id_prefix: String,
    listener: tokio::net::TcpListener,
) -> Result<()> {
    let (db, config) = open_postings_store(&store).await?;
    let service = PostingsService::new(&db, &config, mode, &id_prefix)?;
    serve_postings(listener, service, faults, std::future::pending()).await
}

/// The chained payments server's future on `listener`: its store opened, its service posting to
/// the postings server at `postings`, served behind the first hop's `faults` until killed.
pub async fn payments_server(
    store: Store,
    mode: GuardMode,
    faults: Arc<Faults>,
    unit_failures: Arc<UnitFailures>,
    postings: SocketAddr,
    id_prefix: String,
    listener: tokio::net::TcpListener,
) -> Result<()> {
    let (db, config) = open_store(&store).await?;
    let downstream = Arc::new(Downstream::new(postings, unit_failures)?);
    let service = service(&db, &config, mode, faults, &id_prefix)?.with_downstream(downstream);
    serve(listener, service, std::future::pending()).await
}

/// Opens the postings service's store: the ledger's tables and the postings table.
pub async fn open_postings_store(store: &Store) -> Result<(DatabaseConnection, LedgerConfig)> {
    let (db, config) = open_ledger_store(store).await?;
    prepare_postings_database(&db).await?;
    Ok((db, config))
}

/// Refuses a mode whose handler may not make a call outside its unit of work.
pub fn check_chain_mode(mode: GuardMode) -> Result<()> {
    if mode == GuardMode::WriteOnceInTransactionOnly {
        bail!(
            "--chain needs claim-first or claim-committed-first: write-once is for handlers \
             whose every effect is in the unit's transaction, and a chained payment's posting is not"
        );
    }
    Ok(())
}

/// Runs the chain in this process: the postings server, the payments server posting to it, the
/// client's workload through the faults (each server killed once mid-run when asked), then
/// the settling resends, and the reconciliation of both stores.
pub async fn run_chain(
    mode: GuardMode,
    stores: &ChainStores,
    faults: FaultOptions,
    chain_faults: ChainFaults,
    client: &ClientOptions,
) -> Result<ChainReport> {
    check_chain_mode(mode)?;
    let seed = 0xc4a1_u64 ^ client.run_id.len() as u64;
    let postings_faults = Arc::new(AfterCommitFaults::new(
        chain_faults.postings_drop_rate,
        chain_faults.postings_reset_rate,
        seed,
    ));
    let payments_faults = Arc::new(Faults::new(
        faults.drop_rate,
        faults.delay_rate,
        INJECTED_DELAY,
        seed.rotate_left(17),
    ));
    let unit_failures = Arc::new(UnitFailures::new(
        chain_faults.fail_after_posting_rate,
        seed.rotate_left(31),
    ));
    let loopback: SocketAddr = "127.0.0.1:0".parse()?;
    let mut postings = {
        let (store, faults) = (stores.postings.clone(), Arc::clone(&postings_faults));
        let run_id = client.run_id.clone();
        KillableServer::start("postings", loopback, move |listener, start| {
            let prefix = format!("post-{run_id}-{start}");
            let faults = Arc::clone(&faults);
            Box::pin(postings_server(
                store.clone(),
                mode,
                faults,
                prefix,
                listener,
            ))
        })
        .await?
    };
    let postings_addr = postings.addr;
    let mut payments = {
        let (store, faults) = (stores.payments.clone(), Arc::clone(&payments_faults));
        let unit_failures = Arc::clone(&unit_failures);
        let run_id = client.run_id.clone();
        KillableServer::start("payments", loopback, move |listener, start| {
            let prefix = format!("pay-{run_id}-{start}");
            let (faults, failures) = (Arc::clone(&faults), Arc::clone(&unit_failures));
            let server = payments_server(
                store.clone(),
                mode,
                faults,
                failures,
                postings_addr,
                prefix,
                listener,
            );
            Box::pin(server)
        })
        .await?
    };
    let payments_addr = payments.addr;

    let finished = Arc::new(AtomicU64::new(0));
    let workload = send_payments(payments_addr, client, &finished);
    let mut killed = Vec::new();
    let workload = if chain_faults.kill_servers && client.payments >= 3 {
        let kills = async {
            let total = client.payments;
            for (server, at) in [(&mut payments, total / 3), (&mut postings, 2 * total / 3)] {
                while finished.load(Ordering::Relaxed) < at {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                server.kill_and_restart(DOWNTIME).await?;
                killed.push(server.name);
            }
            anyhow::Ok(())
        };
        tokio::pin!(workload);
        // The kills wait on the workload's progress: a workload that ends first (done, or
        // failed) ends them too.
        tokio::select! {
            workload = &mut workload => workload?,
            kills = kills => {
                kills.context("killing and restarting a server")?;
                workload.await?
            }
        }
    } else {
        workload.await?
    };

    let settled = settle_and_reconcile(payments_addr, stores, client, workload).await;
    drop(payments);
    drop(postings);
    let mut report = settled?;
    report.servers_killed = killed;
    report.payments.dropped_responses = payments_faults.dropped.load(Ordering::Relaxed);
    report.payments.delayed_responses = payments_faults.delayed.load(Ordering::Relaxed);
    report.postings_dropped = postings_faults.dropped();
    report.postings_reset = postings_faults.reset();
    report.failed_after_posting = unit_failures.injected();
    Ok(report)
}

/// The client of a chain whose servers run elsewhere: the workload against the payments server
/// at `addr`, the settling, and the reconciliation of both stores.
pub async fn connect_chain(
    addr: SocketAddr,
    stores: &ChainStores,
    client: &ClientOptions,
) -> Result<ChainReport> {
    let workload = send_payments(addr, client, &Arc::default()).await?;
    settle_and_reconcile(addr, stores, client, workload).await
}

/// Counts the orphaned postings, resends every payment the workload left unacknowledged until
/// answered, and reconciles both stores against everything the client was told.
async fn settle_and_reconcile(
    addr: SocketAddr,
    stores: &ChainStores,
    client: &ClientOptions,
    workload: Workload,
) -> Result<ChainReport> {
    let (payments_db, payments_config) = open_store(&stores.payments).await?;
    let (postings_db, postings_config) = open_postings_store(&stores.postings).await?;
    let payments_units = SeaOrmUnitsOfWork::new(payments_db.clone(), &payments_config);
    let postings_units = SeaOrmUnitsOfWork::new(postings_db.clone(), &postings_config);
    let mut report = ChainReport {
        payments: workload.report,
        ..ChainReport::default()
    };
    let mut acknowledged = workload.acknowledged;

    let before = ChainState::read(&payments_units, &postings_units, &client.run_id).await?;
    let orphans_before = before.orphans();
    report.orphans_before_settling = orphans_before.len() as u64;

    let settled =
        resend_until_answered(addr, client, &workload.unacknowledged, SETTLE_WITHIN).await?;
    report.settled = settled.len() as u64;
    acknowledged.extend(settled);

    let after = ChainState::read(&payments_units, &postings_units, &client.run_id).await?;
    report.orphans_after_settling = after.orphans().len() as u64;
    report.orphans_reused = orphans_before
        .iter()
        .filter(|(account, posting_id)| {
            after.payments.get(account).map(|(_, posted)| posted) == Some(posting_id)
        })
        .count() as u64;

    // No account with two postings; every acknowledged payment's posting is the one posting of
    // its account, under the id the client was told.
    let postings = reconcile(
        acknowledged.iter().map(|ack| ack.account.clone()),
        after.postings.iter().map(|(_, account)| account.clone()),
    );
    report.duplicate_postings = postings.duplicates.len() as u64;
    report.posting_rows = after.postings.len() as u64;
    let posting_of: BTreeMap<&str, &str> = after
        .postings
        .iter()
        .map(|(id, account)| (account.as_str(), id.as_str()))
        .collect();
    report.lost_postings = acknowledged
        .iter()
        .filter(|ack| posting_of.get(ack.account.as_str()) != Some(&ack.posting_id.as_str()))
        .count() as u64;

    // No account with two payments; every acknowledged payment's row, under the id the client
    // was told.
    let payments = reconcile(
        acknowledged
            .iter()
            .map(|ack| (ack.account.clone(), ack.payment_id.clone())),
        after.payment_rows.iter().cloned(),
    );
    let accounts = reconcile(
        std::iter::empty(),
        after
            .payment_rows
            .iter()
            .map(|(account, _)| account.as_str()),
    );
    report.payments.duplicates = accounts.duplicates.len() as u64;
    report.payments.losses = payments.losses.len() as u64;
    report.payments.payment_rows = after.payment_rows.len() as u64;
    report.payments.acknowledged = acknowledged.len() as u64;
    report.payments.failed = report.payments.calls - report.payments.acknowledged;
    payments_db.close().await?;
    postings_db.close().await?;
    Ok(report)
}

/// What both stores hold for a run.
struct ChainState {
    /// Every payment row: (account, payment id).
    payment_rows: Vec<(String, String)>,
    /// The payments by account: (payment id, posting id).
    payments: BTreeMap<String, (String, String)>,
    /// Every posting row: (posting id, account).
    postings: Vec<(String, String)>,
}

impl ChainState {
    /// Reads both stores, each in a unit of work of its ledger's units (as every statement must
    /// behind a transaction pooler).
    async fn read(
        payments: &SeaOrmUnitsOfWork,
        postings: &SeaOrmUnitsOfWork,
        run_id: &str,
    ) -> Result<Self> {
        let pattern = format!("acct-{run_id}-%");
        let txn = payments.begin().await?;
        let rows = txn
            .query_all_raw(statement(
                &txn,
                "SELECT p.payment_id, p.account, l.posting_id FROM demo_payments p \
                 LEFT JOIN demo_payment_postings l ON l.payment_id = p.payment_id \
                 WHERE p.account LIKE $1",
                vec![pattern.clone().into()],
            ))
            .await?;
        payments.commit(txn).await?;
        let mut state = Self {
            payment_rows: Vec::new(),
            payments: BTreeMap::new(),
            postings: Vec::new(),
        };
        for row in &rows {
            let payment_id: String = row.try_get("", "payment_id")?;
            let account: String = row.try_get("", "account")?;
            let posting_id: Option<String> = row.try_get("", "posting_id")?;
            state
                .payment_rows
                .push((account.clone(), payment_id.clone()));
            state
                .payments
                .insert(account, (payment_id, posting_id.unwrap_or_default()));
        }
        let txn = postings.begin().await?;
        let rows = txn
            .query_all_raw(statement(
                &txn,
                "SELECT posting_id, account FROM demo_postings WHERE account LIKE $1",
                vec![pattern.into()],
            ))
            .await?;
        postings.commit(txn).await?;
        for row in &rows {
            state
                .postings
                .push((row.try_get("", "posting_id")?, row.try_get("", "account")?));
        }
        Ok(state)
    }

    /// Postings whose account has no payment: (account, posting id).
    fn orphans(&self) -> BTreeSet<(String, String)> {
        self.postings
            .iter()
            .filter(|(_, account)| !self.payments.contains_key(account))
            .map(|(id, account)| (account.clone(), id.clone()))
            .collect()
    }
}
