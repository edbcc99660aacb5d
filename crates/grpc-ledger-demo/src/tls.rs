//! The demo over mutual TLS (`--tls-dir DIR`): the server requires a client certificate signed by
//! the directory's CA, and its guard names each caller by the certificate's SPIFFE ID instead of
//! the demo's bearer token. `--make-tls-dir DIR` writes a directory to try it with.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use grpc_tonic::{MtlsCallerExtractor, PeerName};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// The trust domain of the demo's callers: a client certificate's URI SAN must start with it.
pub const TRUST_DOMAIN: &str = "spiffe://grpc-ledger-demo/";

/// The name the server's certificate carries, which the client checks.
const SERVER_NAME: &str = "localhost";

/// The files of a TLS directory: the CA that signs both sides, the server's pair, the client's.
const FILES: [&str; 5] = [
    "ca.pem",
    "server.pem",
    "server.key",
    "client.pem",
    "client.key",
];

/// A directory of PEM files: `ca.pem` (the CA the server trusts for clients and the client for
/// the server), `server.pem`/`server.key` (for `localhost`), `client.pem`/`client.key` (a
/// URI SAN under [`TRUST_DOMAIN`]).
#[derive(Debug, Clone)]
pub struct TlsDir(PathBuf);

impl TlsDir {
    /// The directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    fn read(&self, file: &str) -> Result<String> {
        let path = self.0.join(file);
        std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {} (a TLS directory holds {}; `grpc-ledger-demo --make-tls-dir {}` \
                 writes one)",
                path.display(),
                FILES.join(", "),
                self.0.display()
            )
        })
    }

    /// The server's TLS: its certificate, and client certificates required, signed by the CA.
    pub fn server(&self) -> Result<ServerTlsConfig> {
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(
                self.read("server.pem")?,
                self.read("server.key")?,
            ))
            .client_ca_root(Certificate::from_pem(self.read("ca.pem")?)))
    }

    /// The client's TLS: the CA it trusts for the server, and its own certificate.
    pub fn client(&self) -> Result<ClientTlsConfig> {
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(self.read("ca.pem")?))
            .identity(Identity::from_pem(
                self.read("client.pem")?,
                self.read("client.key")?,
            ))
            .domain_name(SERVER_NAME))
    }

    /// How the demo's guard names a caller over mTLS: the client certificate's one SPIFFE ID
    /// under [`TRUST_DOMAIN`].
    pub fn callers() -> MtlsCallerExtractor {
        MtlsCallerExtractor::new(PeerName::UriSan {
            prefix: TRUST_DOMAIN.to_owned(),
        })
    }

    /// Writes a fresh CA, a server certificate for `localhost` and a client certificate for
    /// `spiffe://grpc-ledger-demo/client` into `path` (created if missing; existing files are
    /// refused, never overwritten). For trying the demo only: the keys are written unprotected.
    pub fn make(path: &Path) -> Result<Self> {
        std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        for file in FILES {
            let existing = path.join(file);
            anyhow::ensure!(
                !existing.exists(),
                "{} exists already: choose an empty directory",
                existing.display()
            );
        }
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "grpc-ledger-demo CA");
        let ca_pem = ca.self_signed(&ca_key)?.pem();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |params: CertificateParams| -> Result<(String, String)> {
            let key = KeyPair::generate()?;
            let cert = params.signed_by(&key, &issuer)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let server = leaf(CertificateParams::new(vec![SERVER_NAME.to_owned()])?)?;
        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client.subject_alt_names = vec![SanType::URI(
            format!("{TRUST_DOMAIN}client").as_str().try_into()?,
        )];
        let client = leaf(client)?;
        for (file, text) in FILES
            .iter()
            .zip([&ca_pem, &server.0, &server.1, &client.0, &client.1])
        {
            std::fs::write(path.join(file), text)
                .with_context(|| format!("writing {}", path.join(file).display()))?;
        }
        Ok(Self::new(path))
    }
}
