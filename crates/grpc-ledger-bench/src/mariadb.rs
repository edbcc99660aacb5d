//! The keyed write path on MariaDB and on a Galera cluster.

use super::*;

/// Keyed against business writes on MariaDB (on one server, next to the same units run by
/// mariadb-slap: `slap_limit`): one server (`urls` of one node) or a Galera
/// cluster (every node's URL; client `n` writes through node `n % nodes`), at each client count
/// of `plan`. `label` names the store in the figures. Both variants begin their units as the
/// guard does (through `SeaOrmUnitsOfWork`, READ COMMITTED), so they differ only by the ledger's
/// claim and transition; they run interleaved.
pub async fn mariadb_family(label: &str, urls: &[String], plan: &Plan) -> Result<Vec<Figure>> {
    let name = format!("ledger_bench_{}", std::process::id());
    let server = urls.first().context("no server URL")?;
    let admin = Database::connect(server.as_str()).await?;
    admin
        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
        .await?;
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await?;
    let max_clients = plan.clients.iter().copied().max().unwrap_or(1) as u32;
    let config = LedgerConfig::default().with_max_connections(max_clients + 2);
    let mut nodes = Vec::new();
    for url in urls {
        let url = database_url(url, &name)?;
        // Another node applies the CREATE DATABASE a moment after the first returns.
        let mut tries = 0;
        let db = loop {
            match connect_mysql(&url, &config).await {
                Ok(db) => break db,
                Err(_) if tries < 50 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(error) => return Err(error.into()),
            }
        };
        nodes.push(SeaOrmUnitsOfWork::new(db, &config));
    }
    grpc_operation_ledger_seaorm::migrate(nodes[0].connection()).await?;
    nodes[0]
        .connection()
        .execute_unprepared(
            "CREATE TABLE bench_business (business_key VARCHAR(128) PRIMARY KEY, amount BIGINT NOT NULL)",
        )
        .await?;
    let nodes = Arc::new(nodes);
    let mut figures = Vec::new();
    for &clients in &plan.clients {
        let run = |variant: &'static str| format!("{variant}-{clients}-{}", std::process::id());
        let (units, tag) = (Arc::clone(&nodes), run("mb"));
        let business: Op = Arc::new(move |task, i| {
            let (units, key) = (Arc::clone(&units), format!("{tag}-{task}-{i}"));
            Box::pin(async move {
                let units = &units[task % units.len()];
                let txn = units.begin().await?;
                txn.execute_raw(business_statement(DbBackend::MySql, &key, 1))
                    .await?;
                units.commit(txn).await?;
                Ok(())
            })
        });
        let (units, tag) = (Arc::clone(&nodes), run("mk"));
        let keyed: Op = Arc::new(move |task, i| {
            let (units, key) = (Arc::clone(&units), format!("{tag}-{task}-{i}"));
            Box::pin(async move {
                let units = &units[task % units.len()];
                let txn = units.begin().await?;
                keyed_write(units, &txn, task, &key).await?;
                units.commit(txn).await?;
                Ok(())
            })
        });
        let [business, keyed] = interleaved(clients, plan.seconds, [&business, &keyed]).await?;
        let at = |what: &str| format!("{label} {what} @{clients}");
        let business_fig = figure(at("business ops/s"), "ops/s", business.ops_per_second);
        let keyed_fig = compared(
            at("keyed ops/s"),
            "ops/s",
            keyed.ops_per_second,
            &business_fig,
        );
        figures.extend([
            business_fig,
            keyed_fig,
            figure(at("business p50"), "ms", business.p50_ms),
            figure(at("keyed p50"), "ms", keyed.p50_ms),
            figure(at("keyed p99"), "ms", keyed.p99_ms),
        ]);
        // The store's own limit, on one server (mariadb-slap drives one host).
        if let [server] = urls {
            let units = ((business.ops_per_second * plan.seconds.as_secs_f64()) as usize / clients)
                .max(100);
            let (slap_business, slap_keyed) =
                slap_limit(&database_url(server, &name)?, clients, units)?;
            // slap does not look at what a statement changed: every claim it made must have
            // been finished by its transition.
            let unfinished = count(
                nodes[0].connection(),
                "SELECT COUNT(*) FROM grpc_operation_ledger WHERE state = 'IN_PROGRESS'",
            )
            .await?;
            if unfinished != 0 {
                bail!("mariadb-slap left {unfinished} claims unfinished");
            }
            let slap_business_fig = figure(at("slap business ops/s"), "ops/s", slap_business);
            let slap_keyed_fig = figure(at("slap keyed ops/s"), "ops/s", slap_keyed);
            figures.extend([
                compared(
                    at("slap keyed vs business"),
                    "ops/s",
                    slap_keyed,
                    &slap_business_fig,
                ),
                compared(
                    at("keyed vs slap keyed"),
                    "ops/s",
                    keyed.ops_per_second,
                    &slap_keyed_fig,
                ),
                compared(
                    at("business vs slap business"),
                    "ops/s",
                    business.ops_per_second,
                    &slap_business_fig,
                ),
                slap_business_fig,
                slap_keyed_fig,
            ]);
        }
        eprintln!("measured {label} at {clients} client(s)");
    }
    for units in nodes.iter() {
        units.connection().clone().close().await?;
    }
    admin
        .execute_unprepared(&format!("DROP DATABASE IF EXISTS {name}"))
        .await?;
    Ok(figures)
}

/// MariaDB's own limit for the ledger's shape, as pgbench gives PostgreSQL's: the adapter's claim
/// and transition run by `mariadb-slap` (MariaDB's load generator, from `mariadb-client`) next to
/// the business insert alone, `clients` connections each running `units` units of work.
/// Operations per second of the business unit, then of the keyed unit.
///
/// Each unit begins with one `SET` of its session variables (the key, the caller, the identity's
/// digest), in the place of the `SET TRANSACTION ISOLATION LEVEL` round trip that sea-orm sends
/// before each of the adapter's units; every connection runs at READ COMMITTED (`--init-command`),
/// as the guard's units do. The keyed unit is then the guard's: `BEGIN`, the claim with its wait
/// bound, the business insert, the transition, `COMMIT`. mariadb-slap cannot carry the version the
/// claim returned into the transition, so the transition names it by a subquery on the digest
/// (one more primary-key lookup inside the statement, no round trip).
pub(crate) fn slap_limit(url: &str, clients: usize, units: usize) -> Result<(f64, f64)> {
    let claim = adapter_statement(DbBackend::MySql, "claim")?;
    let commit = adapter_statement(DbBackend::MySql, "mark committed")?;
    let claim_order = adapter_statement(DbBackend::Postgres, "claim")?;
    let commit_order = adapter_statement(DbBackend::Postgres, "mark committed")?;
    let claim = bind_in_order(
        claim,
        claim_order,
        &[
            "@d",
            "@c",
            &format!("'{METHOD}'"),
            "UNHEX(@h)",
            "UNHEX(SHA2(CONCAT('r', @k), 256))",
            "30000",
            "7",
        ],
    )?;
    let commit = bind_in_order(
        commit,
        commit_order,
        &[
            "@d",
            "(SELECT v FROM (SELECT version AS v FROM grpc_operation_ledger \
             WHERE identity_digest = @d) AS claimed)",
            "@k",
        ],
    )?;
    let business = in_dialect(DbBackend::MySql, BUSINESS_INSERT)
        .context("MariaDB")?
        .replacen('?', "@k", 1)
        .replacen('?', "1", 1);
    let keys = "SET @k = UUID(), @c = SHA2(CONCAT('c', FLOOR(RAND() * 8)), 256), \
                @h = SHA2(@k, 256), \
                @d = UNHEX(SHA2(CONCAT(@c, '|', '{METHOD}', '|', @h), 256))"
        .replace("{METHOD}", METHOD);
    let keyed_unit = [
        keys.as_str(),
        "BEGIN",
        &format!(
            "SET STATEMENT max_statement_time={:.3} FOR {claim}",
            LedgerConfig::default().claim_wait.as_secs_f64()
        ),
        &business,
        &commit,
        "COMMIT",
    ];
    let business_unit = ["SET @k = UUID()", "BEGIN", &business, "COMMIT"];
    if keyed_unit.iter().any(|statement| statement.contains(';')) {
        bail!("a statement holds mariadb-slap's delimiter");
    }
    let url = url::Url::parse(url).context("the MariaDB URL")?;
    let slap = |unit: &[&str]| -> Result<f64> {
        let output = Command::new("mariadb-slap")
            .arg("--no-defaults")
            .arg(format!("--host={}", url.host_str().unwrap_or("127.0.0.1")))
            .arg(format!("--port={}", url.port().unwrap_or(3306)))
            .arg(format!("--user={}", url.username()))
            .arg(format!("--password={}", url.password().unwrap_or_default()))
            .arg(format!("--create-schema={}", url.path().trim_matches('/')))
            .arg("--no-drop")
            .arg("--init-command=SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .arg(format!("--concurrency={clients}"))
            .arg("--iterations=1")
            // The total of all clients', counted in statements.
            .arg(format!(
                "--number-of-queries={}",
                clients * units * unit.len()
            ))
            .arg("--delimiter=;")
            .arg(format!("--query={}", unit.join(";")))
            .output()
            .context("running mariadb-slap (Debian's mariadb-client)")?;
        let text = String::from_utf8_lossy(&output.stdout);
        let seconds = text
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("Average number of seconds to run all queries:")
            })
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|seconds| *seconds > 0.0 && output.status.success());
        match seconds {
            Some(seconds) => Ok((clients * units) as f64 / seconds),
            None => bail!(
                "mariadb-slap failed: {text}{}",
                String::from_utf8_lossy(&output.stderr)
            ),
        }
    };
    Ok((slap(&business_unit)?, slap(&keyed_unit)?))
}

/// `text` (placeholders `?`, in order) with each `?` replaced by the expression of the parameter
/// it stands for: `template` is the same statement with numbered placeholders (`$n`, PostgreSQL's
/// rendering), whose order of appearance says which parameter each `?` is; `values[n - 1]` is
/// parameter `n`. Numbers past `values` (PostgreSQL's wait bound) have no `?`.
fn bind_in_order(text: &str, template: &str, values: &[&str]) -> Result<String> {
    let mut order = Vec::new();
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        let digits: String = rest[at + 1..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        rest = &rest[at + 1 + digits.len()..];
        if let Ok(n) = digits.parse::<usize>()
            && (1..=values.len()).contains(&n)
        {
            order.push(n);
        }
    }
    let pieces: Vec<&str> = text.split('?').collect();
    if pieces.len() != order.len() + 1 {
        bail!("the MariaDB statement's placeholders do not match its template's: {text}");
    }
    let mut bound = pieces[0].to_owned();
    for (n, piece) in order.iter().zip(&pieces[1..]) {
        bound.push_str(values[n - 1]);
        bound.push_str(piece);
    }
    Ok(bound)
}
