//! The caller from a verified mTLS peer: the client certificate that tonic's TLS server verified
//! during the handshake (feature `mtls`).
//!
//! The server's TLS configuration does the verifying: `ServerTlsConfig::client_ca_root` makes
//! rustls refuse, before any request reaches a service, a client without a certificate, one
//! signed by another CA, and one that has expired or is not yet valid. What reaches the guard is
//! the chain rustls accepted, in the request's extensions ([`TlsConnectInfo`]); this extractor
//! names the caller from its leaf certificate. A client cannot forge it: it is not a header.

use grpc_core_api::CallerFingerprint;
use tonic::Extensions;
use tonic::metadata::MetadataMap;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::caller::CallerExtractor;

/// Which part of the client's certificate names the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerName {
    /// The certificate's one URI subject alternative name (a SPIFFE ID such as
    /// `spiffe://example.org/ns/payments/sa/checkout`), which must start with the prefix given
    /// (empty: any URI). A certificate with no URI SAN, or with more than one that matches, names
    /// nobody: two names would make the caller depend on which one was read.
    UriSan {
        /// The prefix the URI must start with (`spiffe://example.org/`, say).
        prefix: String,
    },
    /// The certificate's subject distinguished name, as RFC 4514 writes it
    /// (`CN=checkout,O=Example`).
    Subject,
}

/// A [`CallerExtractor`] that takes the caller from the client certificate the server's TLS
/// handshake verified. Requests that arrived without TLS, or without a client certificate (a
/// server with `client_auth_optional(true)`), or whose certificate names nobody as
/// [`PeerName`] asks, have no caller, and the guard refuses them as UNAUTHENTICATED before
/// the handler runs.
///
/// ```
/// use grpc_tonic::{MtlsCallerExtractor, PeerName};
///
/// let by_spiffe_id = MtlsCallerExtractor::new(PeerName::UriSan {
///     prefix: "spiffe://example.org/".to_owned(),
/// });
/// let by_subject = MtlsCallerExtractor::new(PeerName::Subject);
/// # let _ = (by_spiffe_id, by_subject);
/// // guard.with_caller_extractor(by_spiffe_id), with the server's TLS requiring client certificates:
/// // Server::builder().tls_config(ServerTlsConfig::new().identity(..).client_ca_root(ca))
/// ```
#[derive(Debug, Clone)]
pub struct MtlsCallerExtractor {
    name: PeerName,
}

impl MtlsCallerExtractor {
    /// Names callers by `name`.
    pub fn new(name: PeerName) -> Self {
        Self { name }
    }

    /// The caller a verified leaf certificate (DER) names, as the principal's bytes: the URI
    /// prefixed `uri:` or the subject prefixed `subject:`, so that the two ways never name the
    /// same caller by accident.
    pub fn principal(&self, leaf_der: &[u8]) -> Option<Vec<u8>> {
        let (_, certificate) = X509Certificate::from_der(leaf_der).ok()?;
        match &self.name {
            PeerName::Subject => Some(format!("subject:{}", certificate.subject()).into_bytes()),
            PeerName::UriSan { prefix } => {
                let names = certificate.subject_alternative_name().ok()??;
                let mut uris = names
                    .value
                    .general_names
                    .iter()
                    .filter_map(|name| match name {
                        GeneralName::URI(uri) if uri.starts_with(prefix.as_str()) => Some(*uri),
                        _ => None,
                    });
                let uri = uris.next()?;
                if uris.next().is_some() {
                    return None;
                }
                Some(format!("uri:{uri}").into_bytes())
            }
        }
    }
}

impl CallerExtractor for MtlsCallerExtractor {
    fn caller(&self, _: &MetadataMap, extensions: &Extensions) -> Option<CallerFingerprint> {
        let chain = extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()?
            .peer_certs()?;
        let principal = self.principal(chain.first()?.as_ref())?;
        Some(CallerFingerprint::from_principal(&principal))
    }
}
