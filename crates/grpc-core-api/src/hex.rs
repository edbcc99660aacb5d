//! Lower-case hexadecimal for 32-byte digests, their one text form outside this crate (a store
//! may keep their bytes).

/// Declares the hex reading, writing and abbreviated `Debug` of a 32-byte digest newtype, so that
/// every digest has exactly one spelling and none is printed in full by accident.
macro_rules! digest_text_forms {
    ($digest:ident, $what:literal) => {
        impl $digest {
            /// Reads a stored digest: exactly 64 lower-case hex digits.
            pub fn from_hex(text: &str) -> Result<Self, crate::InvalidInput> {
                crate::hex::decode(text)
                    .map(Self)
                    .ok_or(crate::InvalidInput::DigestMalformed { what: $what })
            }

            /// The 64 lower-case hex digits.
            pub fn to_hex(&self) -> String {
                crate::hex::encode(&self.0)
            }

            /// The 32 digest bytes.
            pub fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }

            /// Reads a digest stored as its 32 bytes (a store's binary column).
            pub fn from_bytes(bytes: [u8; 32]) -> Self {
                Self(bytes)
            }
        }

        impl std::fmt::Debug for $digest {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // A prefix is enough to correlate log lines and too short to test guesses against.
                write!(
                    f,
                    concat!(stringify!($digest), "({}…)"),
                    &self.to_hex()[..8]
                )
            }
        }
    };
}
pub(crate) use digest_text_forms;

const DIGITS: &[u8; 16] = b"0123456789abcdef";

pub(crate) fn encode(bytes: &[u8; 32]) -> String {
    let mut out = String::with_capacity(64);
    for byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// Decodes exactly 64 lower-case hex digits. Upper case is refused so that one digest has exactly
/// one spelling: stored digests are compared as strings by the database.
pub(crate) fn decode(text: &str) -> Option<[u8; 32]> {
    let raw = text.as_bytes();
    if raw.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(raw.chunks_exact(2)) {
        *slot = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

fn digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_byte_value() {
        let mut bytes = [0u8; 32];
        for start in [0u8, 32, 64, 96, 128, 160, 192, 224] {
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = start.wrapping_add(i as u8);
            }
            assert_eq!(decode(&encode(&bytes)), Some(bytes));
        }
    }

    #[test]
    fn refuses_wrong_length_upper_case_and_non_hex() {
        let good = "00".repeat(32);
        assert!(decode(&good).is_some());
        for bad in [
            "".to_owned(),
            "0".repeat(63),
            "0".repeat(65),
            format!("{}A", "0".repeat(63)),
            format!("{}g", "0".repeat(63)),
            format!("{}é", "0".repeat(62)),
        ] {
            assert_eq!(decode(&bad), None, "{bad:?}");
        }
    }
}
