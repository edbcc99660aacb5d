//! What was asked.

use sha2::{Digest, Sha256};

use crate::hex::digest_text_forms;

/// The SHA-256 of a request's canonical bytes (for protobuf, the message's encoding by the
/// generated code, which is deterministic for one message value and one schema).
///
/// Stored with a claim: the same identity arriving with a different fingerprint is the caller
/// reusing a key for another request, an error rather than a replay.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestFingerprint([u8; 32]);

impl RequestFingerprint {
    /// The fingerprint of a request's canonical bytes.
    pub fn of(canonical_request: &[u8]) -> Self {
        Self(Sha256::digest(canonical_request).into())
    }
}

digest_text_forms!(RequestFingerprint, "request fingerprint");
