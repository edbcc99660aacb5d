//! A database server to run the suite against, for an adapter's tests: the one its URL variable
//! names, else a throwaway container when a Docker engine answers, else an error that says both
//! ways to get one. (This workspace's own tests get theirs from `cargo xtask test`, which starts
//! them from the machine's binaries.)

use std::fmt;

use testcontainers_modules::mariadb::Mariadb;
use testcontainers_modules::postgres::Postgres;
use testcontainers_modules::testcontainers::runners::AsyncRunner;
use testcontainers_modules::testcontainers::{ContainerAsync, ImageExt};

/// The database engines a server can be had for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Engine {
    /// PostgreSQL (the container is `postgres:15-alpine`).
    Postgres,
    /// MariaDB (the container is `mariadb:11.3`).
    MariaDb,
}

impl Engine {
    /// The environment variable that names a running server's URL.
    pub fn url_variable(self) -> &'static str {
        match self {
            Self::Postgres => "DATABASE_URL",
            Self::MariaDb => "MARIADB_URL",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Postgres => "PostgreSQL",
            Self::MariaDb => "MariaDB",
        })
    }
}

/// A server for the tests: its URL, and the container that is removed when this is dropped
/// (none when the URL came from the environment).
pub struct TestServer {
    url: String,
    container: Option<Container>,
}

/// The running container behind a [`TestServer`], kept so that dropping the server removes it.
#[allow(dead_code, reason = "held for its Drop, which removes the container")]
enum Container {
    Postgres(ContainerAsync<Postgres>),
    MariaDb(ContainerAsync<Mariadb>),
}

impl TestServer {
    /// The server's URL: `postgres://user:password@host:port/postgres`, or
    /// `mysql://user@host:port` (no database: create one per test).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether this server is a container started for the tests.
    pub fn is_container(&self) -> bool {
        self.container.is_some()
    }
}

impl fmt::Debug for TestServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestServer")
            .field("container", &self.is_container())
            .finish_non_exhaustive()
    }
}

/// Neither a URL nor a Docker engine: the message says both ways to get a server.
#[derive(Debug, thiserror::Error)]
#[error(
    "no {engine} server for the ledger contract suite: set {variable} to a running server's URL, \
     or start a Docker engine so that testcontainers can run a container (the engine did not \
     answer: {cause})"
)]
pub struct NoTestServer {
    engine: Engine,
    variable: &'static str,
    cause: String,
}

/// A server of `engine`: the URL in its variable ([`Engine::url_variable`]) when set, else a
/// container.
pub async fn test_server(engine: Engine) -> Result<TestServer, NoTestServer> {
    let url = std::env::var(engine.url_variable())
        .ok()
        .filter(|url| !url.is_empty());
    test_server_from(engine, url).await
}

/// [`test_server`] with the URL given rather than read from the environment.
pub async fn test_server_from(
    engine: Engine,
    url: Option<String>,
) -> Result<TestServer, NoTestServer> {
    if let Some(url) = url {
        return Ok(TestServer {
            url,
            container: None,
        });
    }
    let no_server =
        |cause: testcontainers_modules::testcontainers::TestcontainersError| NoTestServer {
            engine,
            variable: engine.url_variable(),
            cause: cause.to_string(),
        };
    let (container, port) = match engine {
        Engine::Postgres => {
            let container = Postgres::default()
                .with_tag("15-alpine")
                .start()
                .await
                .map_err(no_server)?;
            let port = container
                .get_host_port_ipv4(5432)
                .await
                .map_err(no_server)?;
            (Container::Postgres(container), port)
        }
        Engine::MariaDb => {
            let container = Mariadb::default().start().await.map_err(no_server)?;
            let port = container
                .get_host_port_ipv4(3306)
                .await
                .map_err(no_server)?;
            (Container::MariaDb(container), port)
        }
    };
    let url = match container {
        Container::Postgres(_) => format!("postgres://postgres:postgres@127.0.0.1:{port}/postgres"),
        Container::MariaDb(_) => format!("mysql://root@127.0.0.1:{port}"),
    };
    Ok(TestServer {
        url,
        container: Some(container),
    })
}
