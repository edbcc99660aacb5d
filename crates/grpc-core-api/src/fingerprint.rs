//! What was asked.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::{InvalidInput, hex};

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

    /// Reads a stored fingerprint: exactly 64 lower-case hex digits.
    pub fn from_hex(text: &str) -> Result<Self, InvalidInput> {
        hex::decode(text)
            .map(Self)
            .ok_or(InvalidInput::DigestMalformed {
                what: "request fingerprint",
            })
    }

    /// The 64 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }

    /// The 32 digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for RequestFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestFingerprint({}…)", &self.to_hex()[..8])
    }
}
