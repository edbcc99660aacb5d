//! The 17 gRPC status codes by their canonical names, and small sets of them.

use tonic::Code;

/// Every status code, in numeric order.
pub const ALL_CODES: [Code; 17] = [
    Code::Ok,
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
    Code::Unauthenticated,
];

/// The canonical name (`UNAVAILABLE`) of a code, as service configs spell it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Reads a code by canonical name (case-insensitive, as gRPC implementations accept it).
pub fn parse_code(name: &str) -> Option<Code> {
    ALL_CODES
        .into_iter()
        .find(|code| code_name(*code).eq_ignore_ascii_case(name))
}

/// A set of status codes, as one 17-bit mask: cheap to copy and to test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct CodeSet(u32);

impl CodeSet {
    /// The empty set.
    pub const EMPTY: Self = Self(0);

    /// The set of the given codes.
    pub fn of(codes: &[Code]) -> Self {
        codes.iter().fold(Self::EMPTY, |set, code| set.with(*code))
    }

    /// The set with `code` added.
    pub fn with(self, code: Code) -> Self {
        Self(self.0 | (1 << code as u32))
    }

    /// Whether `code` is in the set.
    pub fn contains(self, code: Code) -> bool {
        self.0 & (1 << code as u32) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The codes in numeric order.
    pub fn codes(self) -> impl Iterator<Item = Code> {
        ALL_CODES
            .into_iter()
            .filter(move |code| self.contains(*code))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sets_hold_what_was_put_in() {
        for (number, code) in ALL_CODES.into_iter().enumerate() {
            assert_eq!(code as usize, number);
            assert_eq!(parse_code(code_name(code)), Some(code));
            assert_eq!(
                parse_code(&code_name(code).to_ascii_lowercase()),
                Some(code)
            );
        }
        assert_eq!(parse_code("UNAVAILABLE "), None);
        let set = CodeSet::of(&[Code::Unavailable, Code::Aborted]);
        assert!(set.contains(Code::Unavailable) && set.contains(Code::Aborted));
        assert!(!set.contains(Code::Ok));
        assert_eq!(
            set.codes().collect::<Vec<_>>(),
            vec![Code::Aborted, Code::Unavailable]
        );
    }
}
