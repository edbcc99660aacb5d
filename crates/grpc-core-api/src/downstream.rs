//! Idempotency keys for the calls an operation makes to other services.
//!
//! An operation's handler that calls another service (a ledger of postings, a payment provider)
//! must send that service the same key on every run of the operation — the first attempt, a
//! resend after a lost response, a takeover by another replica after a crash — or a resend
//! repeats the downstream effect. A key the handler invents (a random one, a timestamp) differs
//! per run; the caller's own key must not travel further (it is key material, and one caller's key
//! names one operation, not each of its downstream calls). A downstream key is derived from the
//! operation's identity and a label the handler names for the call, keyed with the server's
//! secret: the same wherever and whenever the operation runs, different per label and per
//! operation, and it reveals nothing of the caller's key (it is computed from the key's hash).

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::{GrpcOperationIdentity, IdempotencyKey, InvalidInput, KeyHasher};

/// What separates downstream keys from every other digest made with the same secret.
const DOMAIN: &[u8] = b"grpc-safe-retries/downstream-key/v1\n";

/// The prefix of every downstream key, so that a downstream service's operator can tell one from
/// a key a client chose.
const PREFIX: &str = "dk1-";

const MAX_LABEL_LEN: usize = 64;

/// The name a handler gives one of its downstream calls ("postings", "provider.charge"): 1 to 64
/// bytes of ASCII letters, digits, `.`, `_` and `-`. Stable across releases: renaming a label
/// changes the key, so a resend after a deploy would repeat the call.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DownstreamLabel(String);

impl DownstreamLabel {
    /// Checks a label.
    pub fn parse(label: &str) -> Result<Self, InvalidInput> {
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
        if label.is_empty() || label.len() > MAX_LABEL_LEN || !label.bytes().all(allowed) {
            return Err(InvalidInput::DownstreamLabelMalformed);
        }
        Ok(Self(label.to_owned()))
    }

    /// The label.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for DownstreamLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DownstreamLabel({:?})", self.0)
    }
}

impl KeyHasher {
    /// The idempotency key of the downstream call `label` of the operation `identity`:
    /// `dk1-` and 64 hex digits of a digest of the operation's identity (its caller, its method
    /// and its key's hash) and the label, under this hasher (HMAC-SHA-256 with the server's
    /// secret, or SHA-256). Every replica with the same hasher derives the same key for the same
    /// operation and label; see the module's documentation for why. Under `Sha256` (no secret)
    /// anyone who knows the caller's fingerprint, the method, the caller's key and the label can
    /// compute the derived key; only a guard with a secret makes it unguessable downstream.
    pub fn downstream_key(
        &self,
        identity: &GrpcOperationIdentity,
        label: &DownstreamLabel,
    ) -> IdempotencyKey {
        // The storage key is unambiguous ("|" separates parts none can contain) and a label
        // cannot hold the newline that ends it.
        let operation = identity.storage_key();
        let input = [DOMAIN, operation.as_bytes(), b"\n", label.0.as_bytes()];
        let digest: [u8; 32] = match self {
            Self::Sha256 => {
                let mut hasher = Sha256::new();
                input.iter().for_each(|part| hasher.update(part));
                hasher.finalize().into()
            }
            Self::HmacSha256(secret) => {
                let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.bytes())
                    .expect("HMAC accepts keys of any length");
                input.iter().for_each(|part| mac.update(part));
                mac.finalize().into_bytes().into()
            }
        };
        IdempotencyKey::parse(&format!("{PREFIX}{}", crate::hex::encode(&digest)))
            .expect("a prefix and hex digits are a valid key")
    }
}
