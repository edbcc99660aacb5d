//! The request metadata that carries the idempotency key: named once, and checked the same way
//! on the server (the guard) and on the client (the executor and the RetryLayer).

/// The request metadata that carries the caller's idempotency key, unless configured otherwise:
/// on the server with `GuardConfig::with_key_header`, on the client with
/// `RetrySettings::with_key_header` or `RetryLayerBuilder::key_header` (both sides must agree).
pub const IDEMPOTENCY_KEY_HEADER: &str = "idempotency-key";

/// A name that cannot carry the idempotency key in gRPC metadata.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name:?} cannot name ASCII gRPC metadata: lower-case letters, digits, '-', '_' and '.', not ending in -bin"
)]
pub struct InvalidKeyHeader {
    /// The refused name.
    pub name: String,
}

/// `name` as an ASCII metadata key, the one check both sides' `key_header` settings make.
pub(crate) fn key_header(
    name: &str,
) -> Result<tonic::metadata::AsciiMetadataKey, InvalidKeyHeader> {
    let invalid = || InvalidKeyHeader {
        name: name.to_owned(),
    };
    if name.is_empty() || name.ends_with("-bin") || name.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(invalid());
    }
    tonic::metadata::AsciiMetadataKey::from_bytes(name.as_bytes()).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::key_header;

    #[test]
    fn a_key_header_is_lower_case_ascii_metadata() {
        for good in ["idempotency-key", "x-request-id", "key_1.v2"] {
            assert_eq!(
                key_header(good).map(|key| key.as_str().to_owned()),
                Ok(good.to_owned())
            );
        }
        for bad in ["", "Idempotency-Key", "key-bin", "a key", "ключ", "k:ey"] {
            assert_eq!(
                key_header(bad).map(|key| key.as_str().to_owned()),
                Err(super::InvalidKeyHeader {
                    name: bad.to_owned()
                }),
                "{bad:?}"
            );
        }
    }
}
