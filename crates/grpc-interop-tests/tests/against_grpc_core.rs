//! The interop table: each row is a service config and a list of scripted calls, run through
//! Python's grpcio (gRPC C-core), through the retry executor and through a generated client over
//! the RetryLayer, against the same probe server. What the server saw must match: attempts per call, their `grpc-previous-rpc-attempts`,
//! the final status, the backoff gaps within A6's jitter bounds, throttling after a burst of
//! failures, and DEADLINE_EXCEEDED at the deadline. A difference is a failure unless the row
//! names it as deliberate.
//!
//! Needs `python3` with `grpcio` (`cargo xtask test` installs it with pip); fails, never skips,
//! without it.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use grpc_core_api::{GrpcMethod, LedgerDurability};
use grpc_interop_tests::raw_h2::{Behaviour, Script, goaway_then, raw_server, refuse_first};
use grpc_interop_tests::{Attempt, DESCRIPTOR_SET, METHOD, ProbeServer, lazy_channel, pb};
use grpc_policy::{
    GrpcRetryBudget, GrpcRetryOwner, GrpcServiceConfigPolicy, MethodCatalog, MethodClass,
    RetryPlan, RetryThrottling, ServiceConfig,
};
use grpc_tonic::{CommitObserver, Resolution, RetryExecutor, RetryLayer, RetrySettings};
use tonic::{Request, Status};

/// What one client saw of one call, and what the server saw of it.
#[derive(Debug)]
struct Observed {
    code: String,
    elapsed: Duration,
    attempts: Vec<Attempt>,
}

impl Observed {
    fn previous_attempts(&self) -> Vec<Option<u32>> {
        self.attempts.iter().map(|a| a.previous_attempts).collect()
    }

    fn gaps(&self) -> Vec<Duration> {
        self.attempts
            .windows(2)
            .map(|w| w[1].at.duration_since(w[0].at))
            .collect()
    }
}

fn config_with(method_config: &str, throttling: Option<&str>) -> String {
    let mut config = format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "interop.v1.Probe"}}], {method_config}}}]"#
    );
    if let Some(throttling) = throttling {
        config.push_str(&format!(r#", "retryThrottling": {throttling}"#));
    }
    config.push('}');
    config
}

fn retry_policy(max_attempts: u32, initial: &str, codes: &str) -> String {
    format!(
        r#""retryPolicy": {{"maxAttempts": {max_attempts}, "initialBackoff": "{initial}", "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": [{codes}]}}"#
    )
}

/// Runs `calls` (call id, script) through grpcio, one channel, one call after another; returns
/// each call's status name and elapsed time.
fn grpcio_calls(
    addr: std::net::SocketAddr,
    config: &str,
    calls: &[(String, &str)],
    timeout: Option<f64>,
) -> Vec<(String, Duration)> {
    let calls: Vec<serde_json::Value> = calls
        .iter()
        .map(|(call_id, script)| {
            serde_json::json!({"call_id": call_id, "script": script, "timeout_s": timeout})
        })
        .collect();
    let output = Command::new("python3")
        .arg("python/grpcio_client.py")
        .arg(addr.to_string())
        .arg(config)
        .arg(serde_json::Value::Array(calls).to_string())
        .output()
        .expect("python3 must be installed to run the interop table");
    assert!(
        output.status.success(),
        "the grpcio client failed (is grpcio installed? `python3 -m pip install grpcio`, which \
         `cargo xtask test` does): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let results: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).expect("the client prints JSON");
    results
        .iter()
        .map(|result| {
            (
                result["code"].as_str().unwrap().to_owned(),
                Duration::from_secs_f64(result["elapsed_ms"].as_f64().unwrap() / 1000.0),
            )
        })
        .collect()
}

/// Runs `scripts` through grpcio against the probe server.
fn through_grpc_core(
    server: &ProbeServer,
    config: &str,
    case: &str,
    scripts: &[&str],
    timeout: Option<f64>,
) -> Vec<Observed> {
    let calls: Vec<(String, &str)> = scripts
        .iter()
        .enumerate()
        .map(|(n, script)| (format!("py-{case}-{n}"), *script))
        .collect();
    grpcio_calls(server.addr(), config, &calls, timeout)
        .into_iter()
        .zip(&calls)
        .map(|((code, elapsed), (call_id, _))| Observed {
            code,
            elapsed,
            attempts: server.attempts(call_id),
        })
        .collect()
}

/// Runs `scripts` through the retry executor, one budget for the target, one call after another.
async fn through_executor(
    server: &ProbeServer,
    config: &str,
    case: &str,
    scripts: &[&str],
    timeout: Option<f64>,
) -> Vec<Observed> {
    let plan = channel_plan(config);
    let settings = RetrySettings::from_plan(&plan, &GrpcMethod::parse(METHOD).unwrap())
        .expect("a retry policy for the method");
    let budget = Arc::new(
        plan.budget()
            .unwrap_or_else(|| GrpcRetryBudget::new(&RetryThrottling::new(1000, 1000.0).unwrap())),
    );
    let executor = RetryExecutor::new(settings, budget);
    let channel = lazy_channel(server.addr());
    let client = pb::probe_client::ProbeClient::new(channel);
    let mut observed = Vec::new();
    for (n, script) in scripts.iter().enumerate() {
        let call_id = format!("rs-{case}-{n}");
        let message = pb::ProbeRequest {
            call_id: call_id.clone(),
            script: (*script).to_owned(),
            request_id: String::new(),
        };
        let started = Instant::now();
        let answer = executor
            .call(
                MethodClass::Idempotent,
                message,
                None,
                timeout.map(Duration::from_secs_f64),
                |request: Request<pb::ProbeRequest>| {
                    let mut client = client.clone();
                    async move { client.call(request).await }
                },
                || async {
                    Err::<Resolution<pb::ProbeReply>, Status>(Status::internal(
                        "an idempotent call is never resolved",
                    ))
                },
            )
            .await;
        observed.push(Observed {
            code: outcome(&answer),
            elapsed: started.elapsed(),
            attempts: server.attempts(&call_id),
        });
    }
    observed
}

/// `config` checked for the channel owner, the probe's methods and a durable ledger: what the
/// executor reads its settings from.
fn channel_plan(config: &str) -> RetryPlan {
    let parsed = ServiceConfig::parse(config).expect("a valid config");
    let catalog = MethodCatalog::from_descriptor_set_bytes(DESCRIPTOR_SET).unwrap();
    RetryPlan::new(
        GrpcRetryOwner::Channel,
        parsed,
        catalog,
        LedgerDurability::Durable,
    )
    .expect("the plan accepts the row's config")
}

/// The RetryLayer under test: the channel owner for the probe's methods, built from `config`.
fn retry_layer(config: &str) -> RetryLayer {
    let parsed = GrpcServiceConfigPolicy::new(GrpcRetryOwner::Channel)
        .parse(config)
        .expect("a valid config");
    let catalog = MethodCatalog::from_descriptor_set_bytes(DESCRIPTOR_SET).unwrap();
    RetryLayer::builder(parsed, catalog)
        .build()
        .expect("the layer accepts the row's config")
}

/// A generated client whose channel retries through [`retry_layer`].
fn layered_client(
    addr: std::net::SocketAddr,
    config: &str,
) -> pb::probe_client::ProbeClient<grpc_tonic::RetryService<tonic::transport::Channel>> {
    let channel = lazy_channel(addr);
    pb::probe_client::ProbeClient::new(tower_layer::Layer::layer(&retry_layer(config), channel))
}

/// Runs `scripts` through a generated client over the RetryLayer, one call after another.
async fn through_layer(
    server: &ProbeServer,
    config: &str,
    case: &str,
    scripts: &[&str],
    timeout: Option<f64>,
) -> Vec<Observed> {
    let mut client = layered_client(server.addr(), config);
    let mut observed = Vec::new();
    for (n, script) in scripts.iter().enumerate() {
        let call_id = format!("layer-{case}-{n}");
        let mut request = Request::new(pb::ProbeRequest {
            call_id: call_id.clone(),
            script: (*script).to_owned(),
            request_id: String::new(),
        });
        if let Some(timeout) = timeout {
            request.set_timeout(Duration::from_secs_f64(timeout));
        }
        let started = Instant::now();
        let answer = client.call(request).await;
        observed.push(Observed {
            code: outcome(&answer),
            elapsed: started.elapsed(),
            attempts: server.attempts(&call_id),
        });
    }
    observed
}

/// A call's final status name: OK, or its code's.
fn outcome<T>(answer: &Result<T, Status>) -> String {
    match answer {
        Ok(_) => "OK".to_owned(),
        Err(status) => code_name(status.code()),
    }
}

fn code_name(code: tonic::Code) -> String {
    grpc_policy::code_name(code).to_owned()
}

/// The clients, one row: returns (grpcio, executor) observations, and holds the RetryLayer's to
/// the executor's.
async fn both(
    case: &str,
    config: &str,
    scripts: &[&str],
    timeout: Option<f64>,
) -> (Vec<Observed>, Vec<Observed>) {
    ServiceConfig::parse(config).expect("the row's config is valid");
    let server = ProbeServer::start().await;
    let reference = {
        let (config, case, scripts) = (config.to_owned(), case.to_owned(), scripts.to_vec());
        let server_addr = &server;
        // grpcio blocks; the probe server runs on this runtime's other worker.
        tokio::task::block_in_place(|| {
            through_grpc_core(server_addr, &config, &case, &scripts, timeout)
        })
    };
    let ours = through_executor(&server, config, case, scripts, timeout).await;
    // The layer is held to the executor: the same decisions, where the executor matches C-core
    // and where it deviates on purpose.
    let layer = through_layer(&server, config, case, scripts, timeout).await;
    for (n, (executor, layer)) in ours.iter().zip(&layer).enumerate() {
        assert_eq!(
            (layer.code.as_str(), layer.previous_attempts()),
            (executor.code.as_str(), executor.previous_attempts()),
            "{case} call {n}: the RetryLayer (left) and the executor (right) differ\n\
             layer: {layer:?}\nexecutor: {executor:?}"
        );
    }
    (reference, ours)
}

/// The two clients agree call by call on the status, the number of attempts and their
/// `grpc-previous-rpc-attempts`.
fn assert_same(case: &str, reference: &[Observed], ours: &[Observed]) {
    assert_eq!(reference.len(), ours.len());
    for (n, (c_core, executor)) in reference.iter().zip(ours).enumerate() {
        assert_eq!(
            (executor.code.as_str(), executor.attempts.len()),
            (c_core.code.as_str(), c_core.attempts.len()),
            "{case} call {n}: the executor (left) and gRPC C-core (right) differ\n\
             executor: {executor:?}\nC-core: {c_core:?}"
        );
        assert_eq!(
            executor.previous_attempts(),
            c_core.previous_attempts(),
            "{case} call {n}: grpc-previous-rpc-attempts differ"
        );
    }
}

fn attempts_per_call(observed: &[Observed]) -> Vec<usize> {
    observed.iter().map(|o| o.attempts.len()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_retried_until_it_succeeds_with_backoff_within_a6_bounds() {
    let config = config_with(&retry_policy(4, "0.05s", r#""UNAVAILABLE""#), None);
    let (c_core, ours) = both("until-ok", &config, &["fail UNAVAILABLE 2"], None).await;
    assert_same("until-ok", &c_core, &ours);
    assert_eq!(ours[0].code, "OK");
    assert_eq!(ours[0].previous_attempts(), vec![None, Some(1), Some(2)]);
    for observed in [&c_core[0], &ours[0]] {
        // A6: the first retry waits 0.05 s * U[0.8, 1.2), the second 0.1 s * U[0.8, 1.2).
        let gaps = observed.gaps();
        assert!(gaps[0] >= Duration::from_millis(40), "{gaps:?}");
        assert!(gaps[1] >= Duration::from_millis(80), "{gaps:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_run_out_at_max_attempts_capped_at_five() {
    for (case, max_attempts, expected) in [("three", 3, 3), ("capped", 7, 5)] {
        let config = config_with(
            &retry_policy(max_attempts, "0.01s", r#""UNAVAILABLE""#),
            None,
        );
        let (c_core, ours) = both(case, &config, &["fail UNAVAILABLE always"], None).await;
        assert_same(case, &c_core, &ours);
        assert_eq!(ours[0].code, "UNAVAILABLE");
        assert_eq!(ours[0].attempts.len(), expected, "{case}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_the_policy_does_not_list_is_not_retried() {
    let config = config_with(&retry_policy(4, "0.01s", r#""UNAVAILABLE""#), None);
    let (c_core, ours) = both("internal", &config, &["fail INTERNAL always"], None).await;
    assert_same("internal", &c_core, &ours);
    assert_eq!(attempts_per_call(&ours), vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_pushback_stops_retries_or_sets_the_next_delay() {
    let config = config_with(&retry_policy(4, "0.01s", r#""UNAVAILABLE""#), None);
    let scripts = [
        "pushback -1 UNAVAILABLE always",
        "pushback 300 UNAVAILABLE 1",
    ];
    let (c_core, ours) = both("pushback", &config, &scripts, None).await;
    assert_same("pushback", &c_core, &ours);
    assert_eq!(attempts_per_call(&ours), vec![1, 2]);
    for observed in [&c_core[1], &ours[1]] {
        assert!(
            observed.gaps()[0] >= Duration::from_millis(300),
            "the pushback sets the delay: {:?}",
            observed.gaps()
        );
    }
}

/// A6 throttling: 6 tokens, ratio 0.5; every attempt fails. The first call retries while more
/// than 3 tokens remain, and after that no call retries: both clients stop at the same point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_stops_retries_after_a_burst_of_failures() {
    let config = config_with(
        &retry_policy(3, "0.01s", r#""UNAVAILABLE""#),
        Some(r#"{"maxTokens": 6, "tokenRatio": 0.5}"#),
    );
    let scripts = ["fail UNAVAILABLE always"; 6];
    let (c_core, ours) = both("throttled", &config, &scripts, None).await;
    assert_same("throttled", &c_core, &ours);
    assert_eq!(attempts_per_call(&ours), vec![3, 1, 1, 1, 1, 1]);
}

/// The config's `timeout` is the deadline of the whole call: one attempt against a server that
/// takes 5 s, then DEADLINE_EXCEEDED, from both clients.
///
/// Named deviation of the reference: grpcio 1.85 (C-core) starts the service config's timeout
/// about 1.8 s early, so its call ends well before the configured 3 s (measured here: 2 s, 3 s
/// and 5 s timeouts expired after 0.2, 1.2 and 3.2 s, and 0.3 s expired before any attempt was
/// sent; an explicit per-call timeout is exact). The executor keeps the configured deadline, so
/// only the attempts are compared, and the executor's deadline is checked alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_timeout_is_the_whole_calls_deadline() {
    let config = config_with(
        &format!(
            r#""timeout": "3s", {}"#,
            retry_policy(4, "0.01s", r#""UNAVAILABLE", "DEADLINE_EXCEEDED""#)
        ),
        None,
    );
    let (c_core, ours) = both("deadline", &config, &["delay 5000"], None).await;
    // The same race as in the next row can make C-core say CANCELLED.
    assert!(
        ["DEADLINE_EXCEEDED", "CANCELLED"].contains(&c_core[0].code.as_str()),
        "{:?}",
        c_core[0]
    );
    assert_eq!(attempts_per_call(&ours), attempts_per_call(&c_core));
    assert_eq!(ours[0].code, "DEADLINE_EXCEEDED");
    assert!(
        ours[0].elapsed >= Duration::from_millis(2900),
        "the executor ended before its deadline: {:?}",
        ours[0].elapsed
    );
    for observed in [&c_core[0], &ours[0]] {
        assert!(
            observed.elapsed < Duration::from_millis(4500),
            "the deadline was not kept: {:?}",
            observed.elapsed
        );
    }
}

/// The caller's own deadline, shorter than the config's timeout, wins in both: one attempt, and
/// the call ends at the deadline.
///
/// Named race, not a semantic difference: the probe server (tonic) enforces the `grpc-timeout` it
/// receives and answers CANCELLED when it runs out, at the same instant as the client's own
/// timer; C-core reports whichever comes first, so it says CANCELLED now and then. The executor
/// knows its own deadline passed and always says DEADLINE_EXCEEDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_shorter_deadline_wins() {
    let config = config_with(
        &format!(
            r#""timeout": "5s", {}"#,
            retry_policy(4, "0.01s", r#""UNAVAILABLE""#)
        ),
        None,
    );
    let (c_core, ours) = both("caller-deadline", &config, &["delay 2000"], Some(0.2)).await;
    assert_eq!(ours[0].code, "DEADLINE_EXCEEDED");
    assert!(
        ["DEADLINE_EXCEEDED", "CANCELLED"].contains(&c_core[0].code.as_str()),
        "{:?}",
        c_core[0]
    );
    assert_eq!(attempts_per_call(&ours), attempts_per_call(&c_core));
    assert_eq!(attempts_per_call(&ours), vec![1]);
    for observed in [&c_core[0], &ours[0]] {
        assert!(
            observed.elapsed < Duration::from_millis(1500),
            "{observed:?}"
        );
    }
}

/// A stream refused by the server (RST_STREAM REFUSED_STREAM) never reached the application: the
/// executor resends it once transparently, though the policy lists no code that would retry it,
/// as grpc-go and grpc-java do.
///
/// Named deviation of the reference: gRPC C-core 1.85 (grpcio) reports the refused stream as
/// UNAVAILABLE and does not resend it (its retry filter logs `stream_network_state=N/A` for it:
/// the transport does not say the stream was unseen), so it retries it only when the policy
/// lists UNAVAILABLE, as an ordinary retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_is_resent_transparently() {
    let config = config_with(&retry_policy(2, "0.01s", r#""ABORTED""#), None);
    for (client, expected_code, expected_streams) in [
        ("executor", "OK", 2),
        ("layer", "OK", 2),
        ("grpcio", "UNAVAILABLE", 1),
    ] {
        let (addr, streams) = raw_server(refuse_first).await;
        let code = one_call(client, addr, &config).await;
        assert_eq!(code, expected_code, "{client}");
        assert_eq!(streams.load(Ordering::SeqCst), expected_streams, "{client}");
    }
}

/// A stream above a GOAWAY's last stream id is resent on a new connection by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_above_a_goaway_is_resent_transparently_by_both() {
    let config = config_with(&retry_policy(2, "0.01s", r#""ABORTED""#), None);
    for client in ["grpcio", "executor", "layer"] {
        let (addr, streams) = goaway_then(|_| Behaviour::Answer).await;
        let code = one_call(client, addr, &config).await;
        assert_eq!(code, "OK", "{client}");
        assert_eq!(
            streams.load(Ordering::SeqCst),
            1,
            "{client}: answered on the new connection"
        );
    }
}

/// A6's commit point, in both: UNAVAILABLE after response headers is the call's answer (one
/// attempt), the same status in a trailers-only response is retried up to maxAttempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_after_response_headers_is_not_retried_by_either() {
    let config = config_with(&retry_policy(3, "0.01s", r#""UNAVAILABLE""#), None);
    let cases: [(&str, Script, u32); 2] = [
        ("after headers", |_| Behaviour::UnavailableAfterHeaders, 1),
        ("trailers-only", |_| Behaviour::UnavailableTrailersOnly, 3),
    ];
    for (case, script, expected_streams) in cases {
        for client in ["grpcio", "executor", "layer"] {
            let (addr, streams) = raw_server(script).await;
            let code = one_call(client, addr, &config).await;
            assert_eq!(code, "UNAVAILABLE", "{client}, {case}");
            assert_eq!(
                streams.load(Ordering::SeqCst),
                expected_streams,
                "{client}, {case}"
            );
        }
    }
}

/// One call by `client` ("grpcio", "executor" or "layer") to a raw server; its final status name.
async fn one_call(client: &str, addr: std::net::SocketAddr, config: &str) -> String {
    if client == "grpcio" {
        let calls = [("raw".to_owned(), "ok")];
        return tokio::task::block_in_place(|| grpcio_calls(addr, config, &calls, Some(5.0)))
            .remove(0)
            .0;
    }
    if client == "layer" {
        let mut request = Request::new(pb::ProbeRequest::default());
        request.set_timeout(Duration::from_secs(5));
        return outcome(&layered_client(addr, config).call(request).await);
    }
    let settings =
        RetrySettings::from_plan(&channel_plan(config), &GrpcMethod::parse(METHOD).unwrap())
            .expect("a retry policy for the method");
    let executor = RetryExecutor::new(
        settings,
        Arc::new(GrpcRetryBudget::new(
            &RetryThrottling::new(10, 0.1).unwrap(),
        )),
    );
    let channel = lazy_channel(addr);
    let client = pb::probe_client::ProbeClient::new(CommitObserver::new(channel));
    let answer = executor
        .call(
            MethodClass::Idempotent,
            pb::ProbeRequest::default(),
            None,
            Some(Duration::from_secs(5)),
            |request: Request<pb::ProbeRequest>| {
                let mut client = client.clone();
                async move { client.call(request).await }
            },
            || async { Err::<Resolution<pb::ProbeReply>, Status>(Status::internal("unused")) },
        )
        .await;
    outcome(&answer)
}
