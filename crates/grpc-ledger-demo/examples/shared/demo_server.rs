//! The demo's server for the client examples: an embedded SQLite file, a third of all responses
//! lost after commit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use grpc_ledger_payments::{Faults, Store};
use grpc_tonic::GuardMode;

pub(crate) struct DemoServer {
    pub(crate) addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    file: PathBuf,
}

impl DemoServer {
    pub(crate) async fn start(name: &str) -> anyhow::Result<Self> {
        let file = std::env::temp_dir().join(format!("{name}-{}.sqlite", std::process::id()));
        let (db, config) = grpc_ledger_payments::open_store(&Store::Sqlite(file.clone())).await?;
        let faults = Arc::new(Faults::new(0.33, 0.0, Duration::ZERO, 7));
        let service =
            grpc_ledger_payments::service(&db, &config, GuardMode::ClaimFirst, faults, name)?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = grpc_ledger_payments::serve(listener, service, std::future::pending()).await;
        });
        Ok(Self { addr, task, file })
    }

    pub(crate) fn stop(self) {
        self.task.abort();
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.file.display()));
        }
    }
}
