//! The identity of one keyed operation.

use sha2::{Digest, Sha256};

use crate::{CallerFingerprint, GrpcMethod, IdempotencyKeyHash};

/// Who (caller), what (method) and which (key hash): the three parts that name one keyed
/// operation in the ledger. All three are load-bearing: without the caller one tenant's key would
/// suppress another's write; without the method a key reused across operations would replay the
/// wrong one.
///
/// Each part is valid by construction, so an identity is always valid.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GrpcOperationIdentity {
    caller: CallerFingerprint,
    method: GrpcMethod,
    key_hash: IdempotencyKeyHash,
}

impl GrpcOperationIdentity {
    /// Joins the three parts.
    pub fn new(
        caller: CallerFingerprint,
        method: GrpcMethod,
        key_hash: IdempotencyKeyHash,
    ) -> Self {
        Self {
            caller,
            method,
            key_hash,
        }
    }

    /// The caller part.
    pub fn caller(&self) -> &CallerFingerprint {
        &self.caller
    }

    /// The method part.
    pub fn method(&self) -> &GrpcMethod {
        &self.method
    }

    /// The key-hash part.
    pub fn key_hash(&self) -> &IdempotencyKeyHash {
        &self.key_hash
    }

    /// `caller | method | key hash`: the name of the operation's row. No part can contain `|`
    /// (callers refuse it, methods and hex digests cannot hold it), so two identities have the
    /// same storage key exactly when they are equal.
    pub fn storage_key(&self) -> String {
        format!(
            "{}|{}|{}",
            self.caller.as_str(),
            self.method.as_str(),
            self.key_hash.to_hex()
        )
    }

    /// The SHA-256 of [`storage_key`](Self::storage_key): a fixed-width 32-byte name for
    /// adapters whose physical key is a digest of the identity.
    pub fn storage_digest(&self) -> [u8; 32] {
        Sha256::digest(self.storage_key().as_bytes()).into()
    }
}
