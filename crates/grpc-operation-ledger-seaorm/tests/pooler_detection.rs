//! `resolve_pooler` on the real thing: PostgreSQL straight, and through PgBouncer in session and
//! in transaction pooling, as `cargo xtask test` starts them (each variable is required: no
//! silent skip). A setting the deployment gave is never probed over.

use grpc_operation_ledger_seaorm::{LedgerConfig, Pooler, resolve_pooler};

fn required(variable: &str) -> String {
    std::env::var(variable)
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| {
            panic!("{variable} is not set: run `cargo xtask test`, which starts PostgreSQL and PgBouncer in both modes")
        })
}

async fn found(url: &str) -> Pooler {
    resolve_pooler(url, LedgerConfig::default())
        .await
        .unwrap_or_else(|error| panic!("probing {url}: {error}"))
        .pooler
}

#[tokio::test]
async fn a_transaction_pooler_is_found_and_nothing_else_is_taken_for_one() {
    assert_eq!(found(&required("DATABASE_URL")).await, Pooler::None);
    assert_eq!(
        found(&required("PGBOUNCER_SESSION_URL")).await,
        Pooler::None
    );
    // Every time, not once by luck.
    for _ in 0..5 {
        assert_eq!(
            found(&required("PGBOUNCER_TRANSACTION_URL")).await,
            Pooler::TransactionPooling
        );
    }
}

#[tokio::test]
async fn a_transaction_pooler_is_found_while_other_clients_use_it() {
    let url = required("PGBOUNCER_TRANSACTION_URL");
    // Other clients of the same pooler run short transactions all along.
    let busy = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut others = Vec::new();
    for _ in 0..8 {
        let (url, busy) = (url.clone(), std::sync::Arc::clone(&busy));
        others.push(tokio::spawn(async move {
            use sea_orm::sqlx::{Connection, Executor};
            let mut connection = sea_orm::sqlx::postgres::PgConnection::connect(&url)
                .await
                .unwrap();
            while busy.load(std::sync::atomic::Ordering::Relaxed) {
                connection
                    .execute(sea_orm::sqlx::raw_sql("SELECT 1"))
                    .await
                    .unwrap();
            }
        }));
    }
    for _ in 0..20 {
        assert_eq!(found(&url).await, Pooler::TransactionPooling);
    }
    busy.store(false, std::sync::atomic::Ordering::Relaxed);
    for other in others {
        other.await.unwrap();
    }
}

#[tokio::test]
async fn what_a_deployment_said_and_other_stores_are_left_as_they_are() {
    // A port nothing listens on: a probe would fail, so none may run.
    let unreachable = "postgres://u@127.0.0.1:9/ledger";
    for said in [Pooler::None, Pooler::TransactionPooling] {
        let config = resolve_pooler(unreachable, LedgerConfig::default().with_pooler(said))
            .await
            .unwrap();
        assert_eq!(config.pooler, said);
    }
    for url in ["mysql://u:p@127.0.0.1:9/ledger", "sqlite://ledger.db"] {
        let config = resolve_pooler(url, LedgerConfig::default()).await.unwrap();
        assert_eq!(config.pooler, Pooler::Unknown, "{url}");
    }
    let refused = resolve_pooler(unreachable, LedgerConfig::default())
        .await
        .expect_err("nothing listens there");
    assert!(
        refused.to_string().contains("probing for a pooler"),
        "{refused}"
    );
}
