//! The benchmarks' own database on the PostgreSQL under measure, and the business table the
//! variants write.

use super::*;

pub(crate) const BUSINESS_TABLE: &str =
    "CREATE TABLE bench_business (business_key VARCHAR(128) PRIMARY KEY, amount BIGINT NOT NULL)";

/// A database of the benchmarks' own on a PostgreSQL server, dropped at the end of the run.
pub(crate) struct BenchDatabase {
    pub(crate) admin: DatabaseConnection,
    pub(crate) name: String,
    pub(crate) url: String,
}

impl BenchDatabase {
    /// A database named for this process and for this one of its runs, so that two runs of one
    /// process (two tests at once) never drop each other's.
    pub(crate) async fn create(server_url: &str) -> Result<Self> {
        static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("ledger_bench_{}_{run}", std::process::id());
        let admin = Database::connect(server_url).await?;
        admin
            .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
            .await?;
        admin
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await?;
        let url = database_url(server_url, &name)?;
        Ok(Self { admin, name, url })
    }

    pub(crate) async fn drop_it(self) -> Result<()> {
        self.admin
            .execute_unprepared(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await?;
        Ok(())
    }
}
