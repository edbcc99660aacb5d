//! The full name of a gRPC method.

use std::fmt;

use crate::InvalidInput;

/// Longest accepted full method name, in bytes. Real names are far shorter; the bound keeps a
/// hostile name from reaching the ledger's index.
const MAX_LEN: usize = 512;

/// A gRPC method in its canonical form `/package.Service/Method`.
///
/// The service part is one or more protobuf identifiers joined by dots (the package may be
/// absent, as protobuf allows); the method part is one identifier. Identifiers are ASCII letters,
/// digits and underscores, not starting with a digit. Anything else is refused, so two spellings
/// of the same method cannot name two ledger operations.
///
/// ```
/// use grpc_core_api::GrpcMethod;
/// let m = GrpcMethod::parse("/payments.v1.Payments/CreatePayment")?;
/// assert_eq!(m.service(), "payments.v1.Payments");
/// assert_eq!(m.package(), Some("payments.v1"));
/// assert_eq!(m.method(), "CreatePayment");
/// assert_eq!(m.as_str(), "/payments.v1.Payments/CreatePayment");
/// # Ok::<(), grpc_core_api::InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GrpcMethod {
    full_name: String,
    /// Byte offset of the `/` between service and method.
    split: usize,
}

impl GrpcMethod {
    /// Parses a full method name, refusing anything that is not exactly `/Service/Method` with
    /// valid protobuf identifiers.
    pub fn parse(full_name: &str) -> Result<Self, InvalidInput> {
        let malformed = |reason: &'static str| InvalidInput::MethodMalformed { reason };
        if full_name.is_empty() {
            return Err(malformed("empty"));
        }
        if full_name.len() > MAX_LEN {
            return Err(malformed("longer than 512 bytes"));
        }
        let rest = full_name
            .strip_prefix('/')
            .ok_or(malformed("does not start with '/'"))?;
        let (service, method) = rest
            .split_once('/')
            .ok_or(malformed("has no '/' between service and method"))?;
        if service.is_empty() {
            return Err(malformed("service is empty"));
        }
        if method.is_empty() {
            return Err(malformed("method is empty"));
        }
        if method.contains('/') {
            return Err(malformed("has more than two '/'-separated parts"));
        }
        if !service.split('.').all(is_identifier) {
            return Err(malformed(
                "service is not dot-separated protobuf identifiers",
            ));
        }
        if !is_identifier(method) {
            return Err(malformed("method is not a protobuf identifier"));
        }
        Ok(Self {
            full_name: full_name.to_owned(),
            split: 1 + service.len(),
        })
    }

    /// Builds the method from a service's full name (`package.Service`) and a method name, as a
    /// protobuf descriptor names them.
    pub fn from_parts(service: &str, method: &str) -> Result<Self, InvalidInput> {
        Self::parse(&format!("/{service}/{method}"))
    }

    /// The canonical form `/package.Service/Method`.
    pub fn as_str(&self) -> &str {
        &self.full_name
    }

    /// The service's full name, `package.Service`.
    pub fn service(&self) -> &str {
        &self.full_name[1..self.split]
    }

    /// The package, when the service has one.
    pub fn package(&self) -> Option<&str> {
        self.service().rsplit_once('.').map(|(package, _)| package)
    }

    /// The method's simple name.
    pub fn method(&self) -> &str {
        &self.full_name[self.split + 1..]
    }
}

fn is_identifier(part: &str) -> bool {
    let mut chars = part.bytes();
    match chars.next() {
        Some(first) if first.is_ascii_alphabetic() || first == b'_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

impl fmt::Display for GrpcMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full_name)
    }
}

impl fmt::Debug for GrpcMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GrpcMethod({})", self.full_name)
    }
}

impl std::str::FromStr for GrpcMethod {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}
