//! Test helpers for adopters (feature `testing`): the faults that make retries matter, injected
//! where they hurt, after the server's unit of work committed, and the reconciliation that proves
//! exactly-once afterwards. The demo proves its own exactly-once with the same two pieces.
//!
//! ```
//! use std::sync::Arc;
//! use grpc_tonic::testing::{AfterCommitFaults, reconcile};
//!
//! // On the server: Server::builder().layer(faults.layer()).add_service(your_service)
//! let faults = Arc::new(AfterCommitFaults::new(0.3, 0.1, 7));
//! let _layer = faults.layer();
//! // After the run: what the clients were told against what the store holds.
//! let report = reconcile(["pay-1", "pay-2"], ["pay-1", "pay-2", "pay-3"]);
//! assert!(report.exactly_once());
//! assert_eq!(report.unacknowledged, ["pay-3"]);
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use grpc_policy::{RandomSource, SplitMix64};
use tonic::Status;

/// The boxed error a faulty response fails with.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Faults injected into responses whose handler succeeded (a response with a message, so its
/// unit of work committed): some are lost (the caller gets UNAVAILABLE, as when a connection or a
/// proxy drops them), some have their stream reset before the response head (RST_STREAM
/// INTERNAL_ERROR, what a server that fails after committing does; the caller gets INTERNAL).
/// Failed responses pass through. Seeded: a run whose calls are made one after another fails the
/// same way again (concurrent calls draw in the order their responses complete).
#[derive(Debug)]
pub struct AfterCommitFaults {
    drop_rate: f64,
    reset_rate: f64,
    random: Mutex<SplitMix64>,
    dropped: AtomicU64,
    reset: AtomicU64,
}

impl AfterCommitFaults {
    /// Loses `drop_rate` of successful responses and resets the stream of `reset_rate` of them
    /// (shares of all successful responses, drawn from `seed`).
    ///
    /// # Panics
    ///
    /// If either rate is outside 0..=1, or they add up to more than 1.
    pub fn new(drop_rate: f64, reset_rate: f64, seed: u64) -> Self {
        let share = 0.0..=1.0;
        assert!(
            share.contains(&drop_rate)
                && share.contains(&reset_rate)
                && share.contains(&(drop_rate + reset_rate)),
            "fault rates are shares of the responses: {drop_rate} and {reset_rate}"
        );
        Self {
            drop_rate,
            reset_rate,
            random: Mutex::new(SplitMix64::from_seed(seed)),
            dropped: AtomicU64::new(0),
            reset: AtomicU64::new(0),
        }
    }

    /// The tower layer that injects these faults, for `tonic::transport::Server::builder().layer`.
    pub fn layer(self: &Arc<Self>) -> AfterCommitFaultLayer {
        AfterCommitFaultLayer(Arc::clone(self))
    }

    /// Responses lost so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Streams reset so far.
    pub fn reset(&self) -> u64 {
        self.reset.load(Ordering::Relaxed)
    }

    fn roll(&self) -> Fault {
        let roll = self
            .random
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .next_unit();
        if roll < self.drop_rate {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            Fault::Drop
        } else if roll < self.drop_rate + self.reset_rate {
            self.reset.fetch_add(1, Ordering::Relaxed);
            Fault::Reset
        } else {
            Fault::None
        }
    }
}

enum Fault {
    None,
    Drop,
    Reset,
}

/// The layer of [`AfterCommitFaults`].
#[derive(Debug, Clone)]
pub struct AfterCommitFaultLayer(Arc<AfterCommitFaults>);

impl<S> tower_layer::Layer<S> for AfterCommitFaultLayer {
    type Service = AfterCommitFaultService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AfterCommitFaultService {
            inner,
            faults: Arc::clone(&self.0),
        }
    }
}

/// The service of [`AfterCommitFaultLayer`].
#[derive(Debug, Clone)]
pub struct AfterCommitFaultService<S> {
    inner: S,
    faults: Arc<AfterCommitFaults>,
}

impl<S, B> tower_service::Service<http::Request<B>> for AfterCommitFaultService<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answer = self.inner.call(request);
        let faults = Arc::clone(&self.faults);
        Box::pin(async move {
            let response = answer.await.map_err(Into::into)?;
            // A status in the head is a failure (trailers-only): nothing committed to lose.
            if response.headers().contains_key("grpc-status") {
                return Ok(response);
            }
            match faults.roll() {
                Fault::None => Ok(response),
                Fault::Drop => Ok(Status::unavailable(
                    "injected fault: response lost after commit",
                )
                .into_http()),
                // Not a Status, so tonic cannot turn it into one: hyper resets the stream.
                Fault::Reset => Err(Box::new(std::io::Error::other(
                    "injected fault: stream reset after commit",
                )) as BoxError),
            }
        })
    }
}

/// What a run's clients were told against what its store holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciliation<K> {
    /// Keys with more than one effect, and how many: a duplicate.
    pub duplicates: Vec<(K, usize)>,
    /// Keys the clients were told succeeded that have no effect: a loss.
    pub losses: Vec<K>,
    /// Keys with an effect the clients were never told of (an unknown outcome that did commit):
    /// neither a duplicate nor a loss; a resend under the key would be answered with it.
    pub unacknowledged: Vec<K>,
}

impl<K> Reconciliation<K> {
    /// No duplicate and no loss.
    pub fn exactly_once(&self) -> bool {
        self.duplicates.is_empty() && self.losses.is_empty()
    }
}

/// Reconciles the keys the clients were told succeeded with the keys of the effects the store
/// holds (one entry per effect: a payment row, a posting).
pub fn reconcile<K: Ord + Clone>(
    acknowledged: impl IntoIterator<Item = K>,
    effects: impl IntoIterator<Item = K>,
) -> Reconciliation<K> {
    let mut counts: BTreeMap<K, usize> = BTreeMap::new();
    for effect in effects {
        *counts.entry(effect).or_default() += 1;
    }
    let acknowledged: std::collections::BTreeSet<K> = acknowledged.into_iter().collect();
    Reconciliation {
        duplicates: counts
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(k, n)| (k.clone(), *n))
            .collect(),
        losses: acknowledged
            .iter()
            .filter(|k| !counts.contains_key(*k))
            .cloned()
            .collect(),
        unacknowledged: counts
            .keys()
            .filter(|k| !acknowledged.contains(*k))
            .cloned()
            .collect(),
    }
}
