//! What the statements that survive a transaction pooler cost: the guard's unit of work (begin,
//! claim, business insert, transition, commit, through `SeaOrmUnitsOfWork`) on a pool that caches
//! its statements (`Pooler::None`, what `resolve_pooler` finds straight to PostgreSQL) against
//! one that does not (`Pooler::TransactionPooling`, also what an unresolved `Pooler::Unknown`
//! uses: each statement parsed in a round trip of its own, and `DEALLOCATE ALL` at each unit's
//! start), both straight to PostgreSQL in the same run.

use anyhow::{Result, bail};
use grpc_core_api::{
    ClaimOutcome, Completion, LedgerUnitsOfWork, OutcomeReference, RequestFingerprint,
};
use grpc_operation_ledger_seaorm::{LedgerConfig, Pooler, SeaOrmUnitsOfWork, connect_postgres};
use sea_orm::{ConnectionTrait, DbBackend};
use std::sync::Arc;

use crate::{Figure, Op, Plan, business_statement, compared, figure, identity, interleaved, lease};

/// The two pools' keyed units at each client count of `plan`, [`interleaved`] so that a drift of
/// the machine weighs on both.
pub(crate) async fn pooler_safe_cost(url: &str, plan: &Plan) -> Result<Vec<Figure>> {
    let max_clients = plan.clients.iter().copied().max().unwrap_or(1) as u32;
    let base = LedgerConfig::default().with_max_connections(max_clients + 2);
    let cached_config = base.clone().with_pooler(Pooler::None);
    let config = base.with_pooler(Pooler::TransactionPooling);
    let cached =
        SeaOrmUnitsOfWork::new(connect_postgres(url, &cached_config).await?, &cached_config);
    let default = SeaOrmUnitsOfWork::new(connect_postgres(url, &config).await?, &config);
    let mut figures = Vec::new();
    for &clients in &plan.clients {
        let tag = |cached: &str| format!("pooler-{cached}-{clients}-{}", std::process::id());
        let [cached_unit, default_unit] = interleaved(
            clients,
            plan.seconds,
            [
                &unit_ops(&cached, tag("cached")),
                &unit_ops(&default, tag("default")),
            ],
        )
        .await?;
        let (cached_ops, default_ops) = (cached_unit.ops_per_second, default_unit.ops_per_second);
        let at = |what: &str| format!("pooler c={clients} {what}");
        let baseline = figure(at("keyed unit, statements cached"), "ops/s", cached_ops);
        figures.push(compared(
            at("keyed unit, statements for a transaction pooler"),
            "ops/s",
            default_ops,
            &baseline,
        ));
        figures.push(baseline);
    }
    cached.connection().clone().close().await?;
    default.connection().clone().close().await?;
    Ok(figures)
}

/// The guard's claim-first unit of a fresh key on `units`, as an [`Op`].
fn unit_ops(units: &SeaOrmUnitsOfWork, tag: String) -> Op {
    let units = Arc::new(units.clone());
    Arc::new(move |task, i| {
        let (units, key) = (Arc::clone(&units), format!("{tag}-{task}-{i}"));
        Box::pin(async move { keyed_unit(&units, task, &key).await })
    })
}

async fn keyed_unit(units: &SeaOrmUnitsOfWork, caller: usize, key: &str) -> Result<()> {
    let id = identity(caller, key);
    let txn = units.begin().await?;
    {
        let ledger = units.ledger(&txn);
        let claimed = ledger
            .claim(&id, &RequestFingerprint::of(key.as_bytes()), lease())
            .await?;
        let ClaimOutcome::Claimed { version, .. } = claimed else {
            bail!("a fresh key was not claimed")
        };
        txn.execute_raw(business_statement(DbBackend::Postgres, key, 1))
            .await?;
        ledger
            .mark_finished(
                &id,
                version,
                &Completion::Committed(OutcomeReference::parse(key)?),
            )
            .await?;
    }
    units.commit(txn).await?;
    Ok(())
}
