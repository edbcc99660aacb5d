//! What was asked.

use sha2::{Digest, Sha256};

use crate::hex::digest_text_forms;

/// The SHA-256 of a request's canonical form: equal for equal requests, different for different
/// ones.
///
/// Stored with a claim: the same identity arriving with a different fingerprint is the caller
/// reusing a key for another request, an error rather than a replay. For a protobuf request,
/// compute it with [`RequestSchema`](crate::RequestSchema), never from the message's own encoding:
/// that encoding is not canonical (map entries come in hash order, so one decoded request
/// re-encoded twice gives different bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestFingerprint([u8; 32]);

impl RequestFingerprint {
    /// The fingerprint of bytes that are already canonical (one encoding per request, as for a
    /// request that is a plain string); for protobuf use [`RequestSchema`](crate::RequestSchema).
    pub fn of(canonical_request: &[u8]) -> Self {
        Self(Sha256::digest(canonical_request).into())
    }

    /// A fingerprint from its SHA-256 digest.
    pub(crate) fn from_digest(digest: [u8; 32]) -> Self {
        Self(digest)
    }
}

digest_text_forms!(RequestFingerprint, "request fingerprint");
