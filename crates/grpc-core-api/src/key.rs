//! The caller's idempotency key and its hash.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::InvalidInput;
use crate::hex::digest_text_forms;

const MAX_KEY_LEN: usize = 255;
const MIN_SECRET_LEN: usize = 16;

/// The key a caller sends to make a mutation idempotent: 1 to 255 bytes of visible ASCII
/// (0x21..=0x7E), refused otherwise before anything is written.
///
/// The raw key is key material: it is never stored (only its [`IdempotencyKeyHash`]), and its
/// `Debug` form shows only its length, so it cannot leak into a log line by accident. There is no
/// `Display`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Checks and wraps a key. Errors say what is wrong and where, never what the key was.
    pub fn parse(key: &str) -> Result<Self, InvalidInput> {
        Self::parse_bytes(key.as_bytes())
    }

    /// Checks and wraps a key received as raw bytes (gRPC metadata may carry any byte).
    pub fn parse_bytes(key: &[u8]) -> Result<Self, InvalidInput> {
        if key.is_empty() {
            return Err(InvalidInput::KeyEmpty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(InvalidInput::KeyTooLong { len: key.len() });
        }
        if let Some(position) = key.iter().position(|b| !b.is_ascii_graphic()) {
            return Err(InvalidInput::KeyByteNotVisibleAscii { position });
        }
        // Every byte is ASCII, so this cannot fail; the fallback keeps the function total.
        let text = std::str::from_utf8(key)
            .map_err(|_| InvalidInput::KeyByteNotVisibleAscii { position: 0 })?;
        Ok(Self(text.to_owned()))
    }

    /// The raw key, for sending it to a server. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdempotencyKey(<redacted, {} bytes>)", self.0.len())
    }
}

/// How idempotency keys are turned into the hash the ledger stores.
///
/// `Sha256` is the plain digest. `HmacSha256` keys it with a server secret, so that a stolen
/// ledger does not reveal short keys by brute force. Changing the hasher changes every identity:
/// keys claimed under one hasher are unknown under the other.
#[derive(Clone)]
pub enum KeyHasher {
    /// SHA-256 of the key's bytes.
    Sha256,
    /// HMAC-SHA-256 of the key's bytes under a server secret.
    HmacSha256(ServerSecret),
}

impl KeyHasher {
    /// A keyed hasher. The secret must be at least 16 bytes.
    pub fn hmac_sha256(secret: &[u8]) -> Result<Self, InvalidInput> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(InvalidInput::SecretTooShort { len: secret.len() });
        }
        Ok(Self::HmacSha256(ServerSecret(secret.to_vec())))
    }

    /// The hash of `key` under this hasher.
    pub fn hash(&self, key: &IdempotencyKey) -> IdempotencyKeyHash {
        let bytes = key.0.as_bytes();
        let digest: [u8; 32] = match self {
            Self::Sha256 => Sha256::digest(bytes).into(),
            Self::HmacSha256(secret) => {
                let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&secret.0)
                    .expect("HMAC accepts keys of any length");
                mac.update(bytes);
                mac.finalize().into_bytes().into()
            }
        };
        IdempotencyKeyHash(digest)
    }
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sha256 => f.write_str("KeyHasher::Sha256"),
            Self::HmacSha256(_) => f.write_str("KeyHasher::HmacSha256(<secret>)"),
        }
    }
}

/// A server secret for keyed hashing. Its `Debug` form never shows it.
#[derive(Clone)]
pub struct ServerSecret(Vec<u8>);

impl ServerSecret {
    /// The secret's bytes, for the crate's other keyed digests.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The SHA-256 (plain or keyed) of an idempotency key: the third part of an operation's identity,
/// stored as 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKeyHash([u8; 32]);

digest_text_forms!(IdempotencyKeyHash, "idempotency key hash");
