//! Full jitter within its ceiling, and the server's pushback.

use std::time::Duration;

use grpc_policy::{
    Backoff, CodeSet, Pushback, RandomSource, RetryPolicy, SplitMix64, parse_pushback,
};
use tonic::Code;

struct Fixed(f64);
impl RandomSource for Fixed {
    fn next_unit(&mut self) -> f64 {
        self.0
    }
}

fn backoff() -> Backoff {
    let policy = RetryPolicy::new(
        5,
        Duration::from_millis(100),
        Duration::from_secs(1),
        2.0,
        CodeSet::of(&[Code::Unavailable]),
    )
    .unwrap();
    Backoff::of(&policy)
}

#[test]
fn ceilings_grow_by_the_multiplier_up_to_the_maximum() {
    let ceilings: Vec<_> = (1..=6).map(|n| backoff().ceiling(n)).collect();
    assert_eq!(
        ceilings,
        [100, 200, 400, 800, 1000, 1000]
            .map(Duration::from_millis)
            .to_vec()
    );
    assert_eq!(backoff().ceiling(u32::MAX), Duration::from_secs(1));
}

#[test]
fn jitter_is_uniform_below_the_ceiling_and_deterministic_for_a_seed() {
    assert_eq!(backoff().delay(3, &mut Fixed(0.0)), Duration::ZERO);
    assert_eq!(
        backoff().delay(3, &mut Fixed(0.5)),
        Duration::from_millis(200)
    );
    let mut a = SplitMix64::from_seed(7);
    let mut b = SplitMix64::from_seed(7);
    let mut sum = 0.0;
    for n in 1..=10_000u32 {
        let retry = n % 5 + 1;
        let delay = backoff().delay(retry, &mut a);
        assert_eq!(delay, backoff().delay(retry, &mut b));
        assert!(delay < backoff().ceiling(retry));
        sum += delay.as_secs_f64() / backoff().ceiling(retry).as_secs_f64();
    }
    let mean = sum / 10_000.0;
    assert!((0.47..0.53).contains(&mean), "mean fraction {mean}");
}

#[test]
fn pushback_overrides_jitter_and_bad_values_mean_do_not_retry() {
    let cases = [
        ("250", Pushback::RetryAfter(Duration::from_millis(250))),
        ("0", Pushback::RetryAfter(Duration::ZERO)),
        ("-1", Pushback::DoNotRetry),
        ("+5", Pushback::DoNotRetry),
        ("1.5", Pushback::DoNotRetry),
        ("", Pushback::DoNotRetry),
        ("soon", Pushback::DoNotRetry),
        ("99999999999999999999999", Pushback::DoNotRetry),
    ];
    for (value, expected) in cases {
        assert_eq!(parse_pushback(value), expected, "{value:?}");
    }
    let mut random = Fixed(0.5);
    assert_eq!(
        backoff().delay_with_pushback(1, Some(parse_pushback("250")), &mut random),
        Some(Duration::from_millis(250))
    );
    assert_eq!(
        backoff().delay_with_pushback(1, Some(Pushback::DoNotRetry), &mut random),
        None
    );
    assert_eq!(
        backoff().delay_with_pushback(1, None, &mut random),
        Some(Duration::from_millis(50))
    );
}
