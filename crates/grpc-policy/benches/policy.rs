//! `cargo bench -p grpc-policy`: one eligibility decision, and the retry budget against tower's
//! `TpsBudget` doing the equivalent work (a check that a retry may go, then recording an outcome),
//! single-threaded and with two threads contending on one budget.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use grpc_core_api::LedgerDurability;
use grpc_policy::{
    AttemptFacts, CodeSet, Evidence, GrpcRetryBudget, GrpcRetryEligibility, GrpcRetryOwner,
    MethodClass, RetryThrottling,
};
use tonic::Code;
use tower::retry::budget::{Budget, TpsBudget};

fn eligibility(c: &mut Criterion) {
    let facts = AttemptFacts::new(
        GrpcRetryOwner::Application,
        MethodClass::KeyedMutation,
        Code::Aborted,
    )
    .with_evidence(Evidence::Sent)
    .with_retryable(CodeSet::of(&[
        Code::Unavailable,
        Code::Aborted,
        Code::DeadlineExceeded,
    ]))
    .with_key(true)
    .with_ledger(LedgerDurability::Durable)
    .with_sent_attempts(1)
    .with_max_attempts(3)
    .with_remaining_deadline(Some(Duration::from_secs(1)))
    .with_next_backoff(Duration::from_millis(100))
    .with_budget_allows(true);
    c.bench_function("eligibility/decide", |b| {
        b.iter(|| GrpcRetryEligibility::decide(black_box(&facts)))
    });
}

/// The work both budgets do per call: may a retry go? then record how the attempt ended.
trait BudgetWork: Send + Sync {
    fn step(&self, i: u64) -> bool;
}

impl BudgetWork for GrpcRetryBudget {
    fn step(&self, i: u64) -> bool {
        let allowed = self.allows_retry();
        if i.is_multiple_of(4) {
            self.record_failure()
        } else {
            self.record_success()
        }
        allowed
    }
}

impl BudgetWork for TpsBudget {
    fn step(&self, i: u64) -> bool {
        let allowed = self.withdraw();
        if !i.is_multiple_of(4) {
            self.deposit();
        }
        allowed
    }
}

fn ours() -> GrpcRetryBudget {
    GrpcRetryBudget::new(&RetryThrottling::new(100, 0.1).expect("valid throttling"))
}

fn towers() -> TpsBudget {
    TpsBudget::new(Duration::from_secs(10), 10, 0.2)
}

fn contended<B: BudgetWork + 'static>(budget: Arc<B>, iters: u64) -> Duration {
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let (budget, barrier) = (Arc::clone(&budget), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                let start = Instant::now();
                for i in 0..iters / 2 {
                    black_box(budget.step(i * 2 + t));
                }
                start.elapsed()
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("bench thread"))
        .max()
        .unwrap_or_default()
}

fn budgets(c: &mut Criterion) {
    let mut single = c.benchmark_group("budget/single-thread");
    let budget = ours();
    single.bench_function("grpc-policy GrpcRetryBudget", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            budget.step(black_box(i))
        })
    });
    let baseline = towers();
    single.bench_function("tower TpsBudget (baseline)", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            baseline.step(black_box(i))
        })
    });
    single.finish();

    let mut two = c.benchmark_group("budget/two-threads");
    two.bench_function("grpc-policy GrpcRetryBudget", |b| {
        b.iter_custom(|iters| contended(Arc::new(ours()), iters))
    });
    two.bench_function("tower TpsBudget (baseline)", |b| {
        b.iter_custom(|iters| contended(Arc::new(towers()), iters))
    });
    two.finish();
}

criterion_group!(benches, eligibility, budgets);
criterion_main!(benches);
