//! Who is calling: from an authenticated source only, unless the user opts in to less.

use grpc_core_api::CallerFingerprint;
use tonic::Extensions;
use tonic::metadata::MetadataMap;

/// A principal that an earlier layer has verified (an mTLS peer certificate, a validated token's
/// subject) and put into the request's extensions. This crate trusts it because only server code
/// can insert extensions: a client cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedPrincipal(pub Vec<u8>);

/// Derives the caller fingerprint of a request.
pub trait CallerExtractor: Send + Sync {
    /// The caller, or `None` when the request carries no acceptable identity.
    fn caller(&self, metadata: &MetadataMap, extensions: &Extensions) -> Option<CallerFingerprint>;
}

/// The default: the [`AuthenticatedPrincipal`] an authentication layer inserted. Headers are never
/// read, so a client cannot claim to be another caller.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuthenticatedPrincipalExtractor;

impl CallerExtractor for AuthenticatedPrincipalExtractor {
    fn caller(&self, _: &MetadataMap, extensions: &Extensions) -> Option<CallerFingerprint> {
        extensions
            .get::<AuthenticatedPrincipal>()
            .map(|principal| CallerFingerprint::from_principal(&principal.0))
    }
}

/// Opt-in and unsafe on an open network: the caller is whatever a request header says. Only for
/// deployments where a trusted proxy sets the header and strips it from client traffic.
#[derive(Debug, Clone)]
pub struct ClientAssertedHeaderExtractor {
    header: String,
}

impl ClientAssertedHeaderExtractor {
    /// Reads the caller from `header`.
    pub fn new(header: &str) -> Self {
        Self {
            header: header.to_owned(),
        }
    }
}

impl CallerExtractor for ClientAssertedHeaderExtractor {
    fn caller(&self, metadata: &MetadataMap, _: &Extensions) -> Option<CallerFingerprint> {
        let value = metadata.get(self.header.as_str())?;
        Some(CallerFingerprint::from_principal(value.as_bytes()))
    }
}
