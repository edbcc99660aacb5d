//! What a guarded handler knows about the operation it runs: the context the guard already
//! computed (identity, takeover, the request's metadata and extensions), handed over instead of
//! computed twice.

use grpc_core_api::{
    DownstreamLabel, GrpcMethod, GrpcOperationIdentity, IdempotencyKey, KeyHasher,
};
use tonic::Extensions;
use tonic::metadata::MetadataMap;

/// The keyed operation a [`GuardedHandler`](super::GuardedHandler) runs or replays.
///
/// The guard builds it once per call, from the fingerprint and identity it takes anyway: a
/// handler never fingerprints the request a second time to learn its identity or to derive the
/// keys of its downstream calls.
#[derive(Debug)]
pub struct Operation {
    identity: GrpcOperationIdentity,
    took_over: bool,
    metadata: MetadataMap,
    extensions: Extensions,
    hasher: KeyHasher,
}

impl Operation {
    pub(super) fn new(
        identity: GrpcOperationIdentity,
        metadata: MetadataMap,
        extensions: Extensions,
        hasher: KeyHasher,
    ) -> Self {
        Self {
            identity,
            took_over: false,
            metadata,
            extensions,
            hasher,
        }
    }

    pub(super) fn taken_over(&mut self, took_over: bool) {
        self.took_over = took_over;
    }

    /// The method called.
    pub fn method(&self) -> &GrpcMethod {
        self.identity.method()
    }

    /// Who the operation is: caller, method and the hash of its key (never the key itself).
    pub fn identity(&self) -> &GrpcOperationIdentity {
        &self.identity
    }

    /// Whether this run took the claim over from an earlier attempt whose lease ran out (under
    /// claim-committed-first, a server that died mid-handler): that attempt may have made calls
    /// outside the store, so whatever the handler does outside it must be keyed
    /// ([`downstream_key`](Self::downstream_key)) to be safe to do again. Always `false` in a
    /// replay and under write-once, which never take a claim over.
    pub fn took_over(&self) -> bool {
        self.took_over
    }

    /// The request's metadata, as the client sent it (the idempotency key header included).
    pub fn metadata(&self) -> &MetadataMap {
        &self.metadata
    }

    /// The request's extensions: what the server's layers put there (the verified peer, the
    /// method from the path).
    pub fn extensions(&self) -> &Extensions {
        &self.extensions
    }

    /// The idempotency key of this operation's downstream call `label`: the same on every resend,
    /// takeover and replica (see [`KeyHasher::downstream_key`]). Send it as the downstream call's
    /// key (the executor's `call_keyed`, the `idempotency-key` metadata under a RetryLayer, an
    /// HTTP provider's `Idempotency-Key` header).
    pub fn downstream_key(&self, label: &DownstreamLabel) -> IdempotencyKey {
        self.hasher.downstream_key(&self.identity, label)
    }
}
