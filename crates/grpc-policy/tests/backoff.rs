//! gRFC A6's backoff (2024 revision): ±20% jitter around an exponential ceiling, and the
//! server's pushback, which sets the next delay and restarts the sequence.

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
fn jitter_is_uniform_within_twenty_percent_of_the_ceiling_and_deterministic_for_a_seed() {
    assert_eq!(
        backoff().delay(3, &mut Fixed(0.0)),
        Duration::from_millis(320)
    );
    assert_eq!(
        backoff().delay(3, &mut Fixed(0.5)),
        Duration::from_millis(400)
    );
    let mut a = SplitMix64::from_seed(7);
    let mut b = SplitMix64::from_seed(7);
    let mut sum = 0.0;
    for n in 1..=10_000u32 {
        let retry = n % 5 + 1;
        let delay = backoff().delay(retry, &mut a);
        assert_eq!(delay, backoff().delay(retry, &mut b));
        let fraction = delay.as_secs_f64() / backoff().ceiling(retry).as_secs_f64();
        assert!((0.8..1.2).contains(&fraction), "{fraction} of the ceiling");
        sum += fraction;
    }
    let mean = sum / 10_000.0;
    assert!((0.99..1.01).contains(&mean), "mean fraction {mean}");
}

#[test]
fn pushback_is_a_signed_32_bit_decimal_and_bad_values_mean_do_not_retry() {
    let cases = [
        ("250", Pushback::RetryAfter(Duration::from_millis(250))),
        ("0", Pushback::RetryAfter(Duration::ZERO)),
        ("+5", Pushback::RetryAfter(Duration::from_millis(5))),
        (
            "2147483647",
            Pushback::RetryAfter(Duration::from_millis(2_147_483_647)),
        ),
        ("2147483648", Pushback::DoNotRetry),
        ("-1", Pushback::DoNotRetry),
        ("1.5", Pushback::DoNotRetry),
        ("", Pushback::DoNotRetry),
        (" 5", Pushback::DoNotRetry),
        ("soon", Pushback::DoNotRetry),
        ("99999999999999999999999", Pushback::DoNotRetry),
    ];
    for (value, expected) in cases {
        assert_eq!(parse_pushback(value), expected, "{value:?}");
    }
    assert_eq!(Pushback::from_values(std::iter::empty()), None);
    assert_eq!(
        Pushback::from_values(["10"].into_iter()),
        Some(Pushback::RetryAfter(Duration::from_millis(10)))
    );
    assert_eq!(
        Pushback::from_values(["10", "10"].into_iter()),
        Some(Pushback::DoNotRetry),
        "more than one value means do not retry"
    );
}

#[test]
fn a_pushback_sets_the_next_delay_and_restarts_the_sequence() {
    let mut random = Fixed(0.5); // the middle of the jitter: exactly the ceiling
    let mut sequence = backoff().sequence();
    let mut next = |pushback| sequence.next_delay(pushback, &mut random);
    assert_eq!(next(None), Some(Duration::from_millis(100)));
    assert_eq!(next(None), Some(Duration::from_millis(200)));
    assert_eq!(next(None), Some(Duration::from_millis(400)));
    assert_eq!(
        next(Some(Pushback::RetryAfter(Duration::from_millis(7)))),
        Some(Duration::from_millis(7))
    );
    assert_eq!(
        next(None),
        Some(Duration::from_millis(100)),
        "after a pushback the sequence starts again at initialBackoff"
    );
    assert_eq!(next(None), Some(Duration::from_millis(200)));
    assert_eq!(next(Some(Pushback::DoNotRetry)), None);
}

/// A `google.rpc.RetryInfo` delay is the next delay when there is no pushback, kept between
/// initialBackoff and maxBackoff, and restarts the sequence; a pushback beside it keeps A6's
/// precedence.
#[test]
fn a_retry_info_delay_is_the_next_delay_within_max_backoff_unless_a_pushback_says_otherwise() {
    let mut random = Fixed(0.5);
    let mut sequence = backoff().sequence();
    let mut next = |pushback, retry_info: Option<u64>| {
        sequence.next_delay_advised(pushback, retry_info.map(Duration::from_millis), &mut random)
    };
    assert_eq!(next(None, None), Some(Duration::from_millis(100)));
    assert_eq!(next(None, None), Some(Duration::from_millis(200)));
    assert_eq!(next(None, Some(650)), Some(Duration::from_millis(650)));
    assert_eq!(
        next(None, None),
        Some(Duration::from_millis(100)),
        "after the server's delay the sequence starts again at initialBackoff"
    );
    let max = backoff().ceiling(u32::MAX);
    assert_eq!(
        next(None, Some(3_600_000)),
        Some(max),
        "never past maxBackoff"
    );
    assert_eq!(
        next(None, Some(0)),
        Some(Duration::from_millis(100)),
        "never below initialBackoff: a server saying \"now\" each time is no tight loop"
    );
    assert_eq!(
        next(
            Some(Pushback::RetryAfter(Duration::from_millis(7))),
            Some(650)
        ),
        Some(Duration::from_millis(7)),
        "the pushback decides"
    );
    assert_eq!(next(Some(Pushback::DoNotRetry), Some(650)), None);
}

/// `SplitMix64` is Sebastiano Vigna's generator, output for output: the first outputs for seed
/// 1234567 of the reference C code (`splitmix64.c`), as doubles from their top 53 bits. A
/// generator that only looked random (a shift the wrong way, an OR for an XOR) would give clients
/// correlated jitter.
#[test]
fn split_mix_64_is_the_reference_generator() {
    let reference: [u64; 3] = [
        6_457_827_717_110_365_317,
        3_203_168_211_198_807_973,
        9_817_491_932_198_370_423,
    ];
    let mut random = SplitMix64::from_seed(1_234_567);
    for output in reference {
        let expected = (output >> 11) as f64 / (1u64 << 53) as f64;
        assert_eq!(random.next_unit(), expected);
    }
}

/// One retry's delay with the server's word: none, a delay (which replaces the jittered one,
/// whatever the ceiling), or "do not retry".
#[test]
fn one_delay_honours_the_servers_pushback() {
    let backoff = backoff();
    assert_eq!(
        backoff.delay_with_pushback(3, None, &mut Fixed(0.5)),
        Some(Duration::from_millis(400))
    );
    assert_eq!(
        backoff.delay_with_pushback(
            3,
            Some(Pushback::RetryAfter(Duration::from_millis(1_500))),
            &mut Fixed(0.5)
        ),
        Some(Duration::from_millis(1_500))
    );
    assert_eq!(
        backoff.delay_with_pushback(3, Some(Pushback::DoNotRetry), &mut Fixed(0.5)),
        None
    );
}
