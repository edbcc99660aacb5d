//! Metrics through the OpenTelemetry metrics API (feature `opentelemetry`): gRFC A96's per-call
//! retry metrics and gRFC A66's per-attempt and per-call instruments on the client, labelled as
//! A66 defines `grpc.method`, `grpc.target` and `grpc.status`, and
//! the ledger's side of the guard and its retention worker on the server. Without the feature these types record nothing
//! and cost nothing.

use std::time::Duration;

use grpc_core_api::GrpcMethod;

/// What one call did, as A96 counts it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CallCounts {
    pub(crate) retries: u32,
    pub(crate) transparent_retries: u32,
    pub(crate) hedges: u32,
    /// Time with no attempt in flight, waiting to send the next.
    pub(crate) retry_delay: Duration,
}

/// What the guard answered without running the handler to completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LedgerAnswer {
    /// The recorded outcome, replayed.
    Replay,
    /// ABORTED: the operation is in flight elsewhere.
    InFlight,
    /// FAILED_PRECONDITION: the key was used for a different request.
    KeyReused,
}

/// How a retention pass ended, as its metric labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PassEnd {
    /// Every row past the window is gone.
    Complete,
    /// The pass stopped at its batch limit with rows left: retention lags.
    Backlogged,
    /// The store refused a batch.
    Failed,
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::KeyValue;
    use opentelemetry::metrics::{Counter, Histogram, Meter};

    use super::*;

    /// A66's `grpc.method`: the full method name without the path's leading slash.
    fn method_label(method: &GrpcMethod) -> KeyValue {
        KeyValue::new(
            "grpc.method",
            method.as_str().trim_start_matches('/').to_owned(),
        )
    }

    /// gRFC A96's recommended bucket boundaries for the counts of retries and of hedges.
    pub(crate) const RETRY_COUNT_BUCKETS: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];
    /// A96's for transparent retries.
    pub(crate) const TRANSPARENT_RETRY_BUCKETS: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0];
    /// gRFC A66's latency buckets (seconds), which A96 recommends for the retry delay and this
    /// crate uses for the guard's claim latency too.
    pub(crate) const LATENCY_BUCKETS: [f64; 41] = [
        0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
        0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13,
        0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
    ];

    /// The client's instruments (A96, and A66's attempt and call instruments), with their
    /// recommended bucket boundaries given to the SDK as the instruments' advice (a view the
    /// application sets still wins).
    #[derive(Debug, Clone)]
    pub(crate) struct ClientMetrics {
        retries: Histogram<u64>,
        transparent_retries: Histogram<u64>,
        hedges: Histogram<u64>,
        retry_delay: Histogram<f64>,
        attempt_started: Counter<u64>,
        attempt_duration: Histogram<f64>,
        call_duration: Histogram<f64>,
    }

    /// One call's `grpc.method` and `grpc.target`, built once for all its records.
    #[derive(Debug, Clone)]
    pub(crate) struct CallLabels([KeyValue; 2]);

    impl CallLabels {
        fn with_status(&self, code: tonic::Code) -> [KeyValue; 3] {
            let [method, target] = self.0.clone();
            [
                method,
                target,
                KeyValue::new("grpc.status", grpc_policy::code_name(code)),
            ]
        }
    }

    impl ClientMetrics {
        pub(crate) fn new(meter: &Meter) -> Self {
            Self {
                attempt_started: meter
                    .u64_counter("grpc.client.attempt.started")
                    .with_unit("{attempt}")
                    .with_description("Number of client call attempts started.")
                    .build(),
                attempt_duration: meter
                    .f64_histogram("grpc.client.attempt.duration")
                    .with_unit("s")
                    .with_description("End-to-end time taken to complete a client call attempt.")
                    .with_boundaries(LATENCY_BUCKETS.to_vec())
                    .build(),
                call_duration: meter
                    .f64_histogram("grpc.client.call.duration")
                    .with_unit("s")
                    .with_description(
                        "Time taken by gRPC to complete an RPC from application's perspective.",
                    )
                    .with_boundaries(LATENCY_BUCKETS.to_vec())
                    .build(),
                retries: meter
                    .u64_histogram("grpc.client.call.retries")
                    .with_unit("{retry}")
                    .with_description("Number of retries during the client call.")
                    .with_boundaries(RETRY_COUNT_BUCKETS.to_vec())
                    .build(),
                transparent_retries: meter
                    .u64_histogram("grpc.client.call.transparent_retries")
                    .with_unit("{transparent_retry}")
                    .with_description("Number of transparent retries during the client call.")
                    .with_boundaries(TRANSPARENT_RETRY_BUCKETS.to_vec())
                    .build(),
                hedges: meter
                    .u64_histogram("grpc.client.call.hedges")
                    .with_unit("{hedge}")
                    .with_description("Number of hedges during the client call.")
                    .with_boundaries(RETRY_COUNT_BUCKETS.to_vec())
                    .build(),
                retry_delay: meter
                    .f64_histogram("grpc.client.call.retry_delay")
                    .with_unit("s")
                    .with_description(
                        "Total time of delay while there is no active attempt during the client call.",
                    )
                    .with_boundaries(LATENCY_BUCKETS.to_vec())
                    .build(),
            }
        }

        /// A call's labels (A66: `grpc.method`, `grpc.target`).
        pub(crate) fn labels(&self, method: &GrpcMethod, target: &str) -> CallLabels {
            CallLabels([
                method_label(method),
                KeyValue::new("grpc.target", target.to_owned()),
            ])
        }

        /// A66: an attempt started (transparent retries and hedges included).
        pub(crate) fn attempt_started(&self, labels: &CallLabels) {
            self.attempt_started.add(1, &labels.0);
        }

        /// A66: an attempt ended with `code` after `elapsed`.
        pub(crate) fn attempt_ended(
            &self,
            labels: &CallLabels,
            code: tonic::Code,
            elapsed: Duration,
        ) {
            self.attempt_duration
                .record(elapsed.as_secs_f64(), &labels.with_status(code));
        }

        /// A66: the call ended, as its caller saw it, with `code` after `elapsed`.
        pub(crate) fn call_ended(&self, labels: &CallLabels, code: tonic::Code, elapsed: Duration) {
            self.call_duration
                .record(elapsed.as_secs_f64(), &labels.with_status(code));
        }

        /// Records one finished call. A96: a count of zero is not reported; the delay is, once
        /// the call had a retry or a hedge to wait for.
        pub(crate) fn record(&self, labels: &CallLabels, counts: CallCounts) {
            let labels = &labels.0;
            let pairs = [
                (&self.retries, counts.retries),
                (&self.transparent_retries, counts.transparent_retries),
                (&self.hedges, counts.hedges),
            ];
            for (histogram, count) in pairs {
                if count > 0 {
                    histogram.record(u64::from(count), labels);
                }
            }
            if counts.retries + counts.transparent_retries + counts.hedges > 0 {
                self.retry_delay
                    .record(counts.retry_delay.as_secs_f64(), labels);
            }
        }
    }

    /// The guard's instruments: the ledger's answers and the claim's latency.
    #[derive(Debug, Clone)]
    pub(crate) struct ServerMetrics {
        answers: Counter<u64>,
        claim_duration: Histogram<f64>,
    }

    impl ServerMetrics {
        pub(crate) fn new(meter: &Meter) -> Self {
            Self {
                answers: meter
                    .u64_counter("grpc.server.ledger.answers")
                    .with_unit("{call}")
                    .with_description(
                        "Keyed calls the operation ledger answered without running the handler, by answer (replay, in_flight, key_reused).",
                    )
                    .build(),
                claim_duration: meter
                    .f64_histogram("grpc.server.ledger.claim_duration")
                    .with_unit("s")
                    .with_description(
                        "Time from the start of a keyed call's unit of work to the ledger's answer on whether the handler runs.",
                    )
                    .with_boundaries(LATENCY_BUCKETS.to_vec())
                    .build(),
            }
        }

        pub(crate) fn answered(&self, method: &GrpcMethod, answer: LedgerAnswer) {
            let name = match answer {
                LedgerAnswer::Replay => "replay",
                LedgerAnswer::InFlight => "in_flight",
                LedgerAnswer::KeyReused => "key_reused",
            };
            self.answers.add(
                1,
                &[
                    method_label(method),
                    KeyValue::new("grpc.ledger.answer", name),
                ],
            );
        }

        pub(crate) fn claimed(&self, method: &GrpcMethod, took: Duration) {
            self.claim_duration
                .record(took.as_secs_f64(), &[method_label(method)]);
        }
    }
}

#[cfg(feature = "opentelemetry")]
mod retention_otel {
    use std::sync::Arc;

    use opentelemetry::KeyValue;
    use opentelemetry::metrics::{Counter, Meter, ObservableGauge};

    use super::PassEnd;
    use crate::RetentionStats;

    /// The retention worker's instruments: counters it adds to after each pass, and gauges read
    /// from its last census when the meter's reader collects.
    #[derive(Debug, Clone)]
    pub(crate) struct RetentionMetrics {
        purged: Counter<u64>,
        passes: Counter<u64>,
        /// Kept so that the gauges' callbacks live as long as the worker.
        _gauges: Arc<CensusGauges>,
    }

    /// The census gauges: in progress, expired leases, the oldest's age, past retention.
    #[derive(Debug)]
    struct CensusGauges {
        _in_progress: ObservableGauge<u64>,
        _expired_leases: ObservableGauge<u64>,
        _oldest_age: ObservableGauge<f64>,
        _past_retention: ObservableGauge<u64>,
    }

    impl RetentionMetrics {
        pub(crate) fn new(meter: &Meter, stats: Arc<RetentionStats>) -> Self {
            let counted = |read: fn(&grpc_core_api::LedgerCensus) -> u64| {
                let stats = Arc::clone(&stats);
                move |observer: &dyn opentelemetry::metrics::AsyncInstrument<u64>| {
                    if let Some(census) = stats.census() {
                        observer.observe(read(&census), &[]);
                    }
                }
            };
            let in_progress = meter
                .u64_observable_gauge("grpc.server.ledger.in_progress")
                .with_unit("{operation}")
                .with_description("Operations claimed and not finished, at the last census.")
                .with_callback(counted(|census| census.in_progress))
                .build();
            let expired = meter
                .u64_observable_gauge("grpc.server.ledger.expired_leases")
                .with_unit("{operation}")
                .with_description(
                    "Operations in progress whose lease has run out (a dead or hung handler), at the last census.",
                )
                .with_callback(counted(|census| census.expired_leases))
                .build();
            let oldest = {
                let stats = Arc::clone(&stats);
                meter
                    .f64_observable_gauge("grpc.server.ledger.oldest_in_progress.age")
                    .with_unit("s")
                    .with_description(
                        "Age of the oldest operation in progress, at the last census.",
                    )
                    .with_callback(move |observer| {
                        if let Some(age) = stats.census().and_then(|c| c.oldest_in_progress) {
                            observer.observe(age.as_secs_f64(), &[]);
                        }
                    })
                    .build()
            };
            let past_retention = meter
                .u64_observable_gauge("grpc.server.ledger.past_retention")
                .with_unit("{operation}")
                .with_description(
                    "Finished operations past the retention window that purge has yet to delete, at the last census.",
                )
                .with_callback(counted(|census| census.past_retention))
                .build();
            Self {
                purged: meter
                    .u64_counter("grpc.server.ledger.purged")
                    .with_unit("{operation}")
                    .with_description(
                        "Finished operations the retention worker deleted past the retention window.",
                    )
                    .build(),
                passes: meter
                    .u64_counter("grpc.server.ledger.retention.passes")
                    .with_unit("{pass}")
                    .with_description(
                        "Retention passes, by how they ended (complete, backlogged: stopped at the batch limit with rows left, failed).",
                    )
                    .build(),
                _gauges: Arc::new(CensusGauges {
                    _in_progress: in_progress,
                    _expired_leases: expired,
                    _oldest_age: oldest,
                    _past_retention: past_retention,
                }),
            }
        }

        pub(crate) fn record(&self, purged: u64, end: PassEnd) {
            self.purged.add(purged, &[]);
            let end = match end {
                PassEnd::Complete => "complete",
                PassEnd::Backlogged => "backlogged",
                PassEnd::Failed => "failed",
            };
            self.passes
                .add(1, &[KeyValue::new("grpc.ledger.retention.outcome", end)]);
        }
    }
}

#[cfg(feature = "opentelemetry")]
pub(crate) use otel::{CallLabels, ClientMetrics, ServerMetrics};
#[cfg(feature = "opentelemetry")]
pub(crate) use retention_otel::RetentionMetrics;

#[cfg(not(feature = "opentelemetry"))]
mod off {
    use super::*;

    /// Records nothing: the `opentelemetry` feature is off.
    #[derive(Debug, Clone)]
    pub(crate) struct ClientMetrics;

    /// No labels: the `opentelemetry` feature is off.
    #[derive(Debug, Clone)]
    pub(crate) struct CallLabels;

    impl ClientMetrics {
        pub(crate) fn labels(&self, _: &GrpcMethod, _: &str) -> CallLabels {
            CallLabels
        }
        pub(crate) fn attempt_started(&self, _: &CallLabels) {}
        pub(crate) fn attempt_ended(&self, _: &CallLabels, _: tonic::Code, _: Duration) {}
        pub(crate) fn call_ended(&self, _: &CallLabels, _: tonic::Code, _: Duration) {}
        pub(crate) fn record(&self, _: &CallLabels, _: CallCounts) {}
    }

    /// Records nothing: the `opentelemetry` feature is off.
    #[derive(Debug, Clone)]
    pub(crate) struct ServerMetrics;

    impl ServerMetrics {
        pub(crate) fn answered(&self, _: &GrpcMethod, _: LedgerAnswer) {}
        pub(crate) fn claimed(&self, _: &GrpcMethod, _: Duration) {}
    }

    /// Records nothing: the `opentelemetry` feature is off.
    #[derive(Debug, Clone)]
    pub(crate) struct RetentionMetrics;

    impl RetentionMetrics {
        pub(crate) fn record(&self, _: u64, _: PassEnd) {}
    }
}

#[cfg(not(feature = "opentelemetry"))]
pub(crate) use off::{CallLabels, ClientMetrics, RetentionMetrics, ServerMetrics};
