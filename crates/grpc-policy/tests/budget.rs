//! The retry budget's properties over random outcome sequences, and under real contention.

use std::sync::Arc;

use grpc_policy::{GrpcRetryBudget, RetryThrottling};
use proptest::prelude::*;

fn budget(max_tokens: u32, ratio: f64) -> GrpcRetryBudget {
    GrpcRetryBudget::new(&RetryThrottling::new(max_tokens, ratio).unwrap())
}

/// One call: a first attempt, then retries while it fails and the budget allows. Returns the
/// number of retries taken.
fn call(
    budget: &GrpcRetryBudget,
    mut attempt_fails: impl FnMut() -> bool,
    max_attempts: u32,
) -> u32 {
    let mut retries = 0;
    for attempt in 1..=max_attempts {
        if !attempt_fails() {
            budget.record_success();
            return retries;
        }
        budget.record_failure();
        if attempt == max_attempts || !budget.allows_retry() {
            return retries;
        }
        retries += 1;
    }
    retries
}

/// A deterministic Bernoulli source from a seed.
fn coin(seed: u64, p: f64) -> impl FnMut() -> bool {
    let mut random = grpc_policy::SplitMix64::from_seed(seed);
    move || grpc_policy::RandomSource::next_unit(&mut random) < p
}

proptest! {
    #[test]
    fn total_failure_allows_at_most_half_the_tokens_in_retries(max_tokens in 2u32..=1000, ratio_milli in 1u32..=2000, calls in 1usize..400) {
        let budget = budget(max_tokens, f64::from(ratio_milli) / 1000.0);
        let mut retries = 0;
        for _ in 0..calls {
            retries += call(&budget, || true, 5);
        }
        prop_assert!(retries <= max_tokens / 2, "{} retries with {} tokens", retries, max_tokens);
        // Unthrottled, every one of the `calls * 5` attempts failed and took a token; a retry is
        // allowed while more than half the tokens remain, i.e. while twice the failures are fewer
        // than `max_tokens` (exactly, for odd `max_tokens` too). Once throttled, it stays so.
        prop_assert_eq!(budget.allows_retry(), 2 * calls * 5 < max_tokens as usize);
    }

    #[test]
    fn without_failures_nothing_is_ever_throttled(max_tokens in 1u32..=1000, ratio_milli in 1u32..=2000, successes in 0usize..2000) {
        let budget = budget(max_tokens, f64::from(ratio_milli) / 1000.0);
        for _ in 0..successes {
            budget.record_success();
            prop_assert!(max_tokens == 1 || budget.allows_retry());
        }
        prop_assert_eq!(budget.milli_tokens(), max_tokens * 1000);
    }

    /// Failures at rate p drain the bucket when p > r / (1 + r): retries fall to near zero.
    #[test]
    fn failure_rate_above_the_threshold_drains_retries(seed in any::<u64>()) {
        let (ratio, p) = (0.1, 0.3); // threshold 0.0909
        let budget = budget(100, ratio);
        let mut fails = coin(seed, p);
        for _ in 0..5_000 { call(&budget, &mut fails, 3); }
        let (mut retries, mut failed_firsts) = (0, 0);
        let mut fails = coin(seed ^ 0xfeed, p);
        for _ in 0..20_000 {
            let mut first = true;
            retries += call(&budget, || { let f = fails(); if first && f { failed_firsts += 1; } first = false; f }, 3);
        }
        prop_assert!(f64::from(retries) < 0.2 * f64::from(failed_firsts), "{} retries for {} failed calls", retries, failed_firsts);
    }

    /// Failures clearly below the threshold never throttle once the bucket is full.
    #[test]
    fn failure_rate_below_the_threshold_is_not_throttled(seed in any::<u64>()) {
        let (ratio, p) = (0.5, 0.1); // threshold 0.333
        let budget = budget(100, ratio);
        let mut fails = coin(seed, p);
        let mut refused = 0;
        for _ in 0..20_000 {
            let mut failed_once = false;
            let retries = call(&budget, || { let f = fails(); failed_once |= f; f }, 3);
            if failed_once && retries == 0 && !budget.allows_retry() { refused += 1; }
        }
        prop_assert_eq!(refused, 0);
        prop_assert!(budget.allows_retry());
    }
}

#[test]
fn two_threads_hammering_one_budget_keep_it_within_bounds() {
    let budget = Arc::new(budget(10, 0.1));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let budget = Arc::clone(&budget);
            std::thread::spawn(move || {
                for i in 0..200_000u32 {
                    if (i + t) % 3 == 0 {
                        budget.record_success()
                    } else {
                        budget.record_failure()
                    }
                    let tokens = budget.milli_tokens();
                    assert!(tokens <= 10_000);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // Two failures per success at ratio 0.1 drains the bucket: it must end empty, not wrapped.
    assert_eq!(budget.milli_tokens(), 0);
    assert!(!budget.allows_retry());
    for _ in 0..60 {
        budget.record_success();
    }
    assert_eq!(budget.milli_tokens(), 6_000);
    assert!(budget.allows_retry(), "successes bring retries back");
}

/// The input that once made the total-failure property fail at random (an odd `maxTokens`: after
/// 130 failures 131 of 261 tokens remain, which is more than half, so retries are still allowed).
#[test]
fn odd_max_tokens_after_just_under_half_failures_still_allow_retries() {
    let budget = budget(261, 0.001);
    for _ in 0..26 {
        call(&budget, || true, 5);
    }
    assert_eq!(budget.milli_tokens(), 131_000);
    assert!(budget.allows_retry());
    budget.record_failure();
    assert!(
        !budget.allows_retry(),
        "130 of 261 tokens is not more than half"
    );
}

/// gRFC A6: a retry needs *more* than half the bucket. With ten tokens, five failures leave
/// exactly half: no retry; one success (ratio 0.5) lifts it above half again.
#[test]
fn exactly_half_the_tokens_is_not_enough_for_a_retry() {
    let budget = budget(10, 0.5);
    for _ in 0..4 {
        budget.record_failure();
    }
    assert!(budget.allows_retry(), "6 of 10 tokens is more than half");
    budget.record_failure();
    assert_eq!(budget.milli_tokens(), 5_000);
    assert!(
        !budget.allows_retry(),
        "5 of 10 tokens is not more than half"
    );
    budget.record_success();
    assert!(budget.allows_retry(), "5.5 of 10 tokens is more than half");
}
