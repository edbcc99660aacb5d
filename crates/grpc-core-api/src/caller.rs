//! Who is asking.

use std::fmt;

use sha2::{Digest, Sha256};

use crate::{InvalidInput, hex};

const MAX_LEN: usize = 128;

/// A stable digest of the authenticated principal that sends a request (an mTLS peer, a verified
/// token subject). It is the first part of an operation's identity: without it, one tenant's key
/// would suppress another tenant's write.
///
/// It must come from an authenticated source, never from a header the client asserts; this type
/// cannot know where its bytes came from, so the transport adapter that builds it is responsible.
///
/// The text form is 1 to 128 bytes of visible ASCII without `|` (the separator of the storage key),
/// so that a fingerprint can never be mistaken for a part of another identity.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallerFingerprint(String);

impl CallerFingerprint {
    /// Accepts an already-computed fingerprint, as stored in the ledger.
    pub fn parse(text: &str) -> Result<Self, InvalidInput> {
        if text.is_empty() {
            return Err(InvalidInput::CallerEmpty);
        }
        if text.len() > MAX_LEN {
            return Err(InvalidInput::CallerTooLong { len: text.len() });
        }
        if let Some(position) = text
            .bytes()
            .position(|b| !b.is_ascii_graphic() || b == b'|')
        {
            return Err(InvalidInput::CallerByteNotAllowed { position });
        }
        Ok(Self(text.to_owned()))
    }

    /// Derives the fingerprint of an authenticated principal: the SHA-256 of its bytes (a peer
    /// certificate in DER, a verified subject), as 64 lower-case hex digits.
    pub fn from_principal(principal: &[u8]) -> Self {
        let digest: [u8; 32] = Sha256::digest(principal).into();
        Self(hex::encode(&digest))
    }

    /// The fingerprint as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for CallerFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallerFingerprint({})", self.0)
    }
}

impl fmt::Display for CallerFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
