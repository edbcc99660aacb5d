//! `servers::test_server`: a URL given is used as it is; without one, a container when a Docker
//! engine answers, else an error naming both ways. These machines have no engine, so there the
//! error path runs; where an engine answers, the container path does.
#![cfg(feature = "containers")]

use grpc_ledger_contract_tests::servers::{Engine, test_server_from};

#[tokio::test]
async fn a_url_given_is_used_and_nothing_is_started() {
    let server = test_server_from(
        Engine::Postgres,
        Some("postgres://u:p@db.example:5432/ledger".to_owned()),
    )
    .await
    .unwrap();
    assert_eq!(server.url(), "postgres://u:p@db.example:5432/ledger");
    assert!(!server.is_container());
}

#[tokio::test]
async fn without_a_url_a_container_or_an_error_that_names_both_ways() {
    for engine in [Engine::Postgres, Engine::MariaDb] {
        match test_server_from(engine, None).await {
            Ok(server) => {
                assert!(server.is_container());
                let scheme = match engine {
                    Engine::MariaDb => "mysql://",
                    _ => "postgres://",
                };
                assert!(server.url().starts_with(scheme), "{}", server.url());
            }
            Err(error) => {
                let message = error.to_string();
                println!("{message}");
                assert!(message.contains(engine.url_variable()), "{message}");
                assert!(message.contains("Docker engine"), "{message}");
                assert!(message.contains(&engine.to_string()), "{message}");
            }
        }
    }
}
