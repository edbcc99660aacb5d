//! The caller from a real mTLS handshake: the payments service over tonic's TLS, its guard naming
//! each caller by the URI SAN (a SPIFFE ID) of the client certificate the handshake verified.
//! Certificates are made here with rcgen: a CA, two tenants, an expired one and one from a
//! foreign CA.

use std::sync::Arc;
use std::time::Duration;

use grpc_ledger_payments::pb::payments_client::PaymentsClient;
use grpc_ledger_payments::pb::resolve_payment_response::State;
use grpc_ledger_payments::pb::{CreatePaymentRequest, Payment, ResolvePaymentRequest};
use grpc_ledger_payments::{Faults, Store, open_store, serve_mtls, service};
use grpc_tonic::{GuardMode, IDEMPOTENCY_KEY_HEADER, MtlsCallerExtractor, PeerName};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType, date_time_ymd,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Code, Request};

const TRUST_DOMAIN: &str = "spiffe://payments.test/";

/// A certificate authority: its certificate (PEM) and what signs with it.
struct Authority {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Authority {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let pem = params.self_signed(&key).expect("self-sign the CA").pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf certificate and its key (PEM) for `sans`, valid as `params` says.
    fn sign(&self, mut params: CertificateParams, common_name: &str) -> Identity {
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign a leaf");
        Identity::from_pem(cert.pem(), key.serialize_pem())
    }

    /// A client certificate naming `uri` (a SPIFFE ID), valid from 1975 to 4096.
    fn client(&self, uri: &str) -> Identity {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = vec![SanType::URI(uri.try_into().expect("an IA5 URI"))];
        self.sign(params, "client")
    }
}

/// The server, its CA, and its address.
struct Server {
    ca: Authority,
    addr: std::net::SocketAddr,
    _db_file: DbFile,
}

/// The SQLite file of the test's store, removed when the test ends.
struct DbFile(std::path::PathBuf);

impl Drop for DbFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

/// The payments service over TLS that requires (`optional` false) or accepts (`optional` true)
/// client certificates signed by its CA, each caller named by its SPIFFE ID.
async fn start_server(optional: bool) -> Server {
    let ca = Authority::new("payments test CA");
    let params = CertificateParams::new(vec!["localhost".to_owned()]).expect("server params");
    let server_identity = ca.sign(params, "localhost");
    let file = DbFile(std::env::temp_dir().join(format!(
        "mtls_{}_{}.sqlite",
        std::process::id(),
        optional
    )));
    let (db, config) = open_store(&Store::Sqlite(file.0.clone()))
        .await
        .expect("open the store");
    let faults = Arc::new(Faults::new(0.0, 0.0, Duration::ZERO, 1));
    let payments = service(&db, &config, GuardMode::ClaimFirst, faults, "mtls-")
        .expect("the payments service")
        .with_caller_extractor(MtlsCallerExtractor::new(PeerName::UriSan {
            prefix: TRUST_DOMAIN.to_owned(),
        }));
    let tls = ServerTlsConfig::new()
        .identity(server_identity)
        .client_ca_root(Certificate::from_pem(&ca.pem))
        .client_auth_optional(optional);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        serve_mtls(listener, payments, tls, std::future::pending())
            .await
            .expect("serve");
    });
    Server {
        ca,
        addr,
        _db_file: file,
    }
}

impl Server {
    /// A client that trusts the server's CA and presents `identity` (none: no certificate).
    async fn client(&self, identity: Option<Identity>) -> Result<PaymentsClient<Channel>, String> {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca.pem))
            .domain_name("localhost");
        if let Some(identity) = identity {
            tls = tls.identity(identity);
        }
        let channel = Channel::from_shared(format!("https://{}", self.addr))
            .expect("a URI")
            .tls_config(tls)
            .expect("the client's TLS")
            .connect()
            .await
            .map_err(|error| format!("{error:?}"))?;
        Ok(PaymentsClient::new(channel))
    }

    /// A client presenting a certificate for `tenant` from the server's own CA.
    async fn tenant(&self, tenant: &str) -> PaymentsClient<Channel> {
        let identity = self.ca.client(&format!("{TRUST_DOMAIN}{tenant}"));
        self.client(Some(identity)).await.expect("connect")
    }
}

fn keyed<T>(message: T, key: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(IDEMPOTENCY_KEY_HEADER, key.parse().expect("a header value"));
    request
}

fn payment(account: &str) -> CreatePaymentRequest {
    CreatePaymentRequest {
        account: account.to_owned(),
        amount_minor: 1250,
        ..CreatePaymentRequest::default()
    }
}

async fn pay(client: &mut PaymentsClient<Channel>, key: &str) -> Result<Payment, tonic::Status> {
    client
        .create_payment(keyed(payment("acct-1"), key))
        .await
        .map(tonic::Response::into_inner)
}

/// Two tenants with valid certificates, the same key, the same method and the same body: two
/// payments, each resend replays its own tenant's, and each tenant's ResolvePayment sees its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_with_the_same_key_never_see_each_others_operation() {
    let server = start_server(false).await;
    let mut tenant_a = server.tenant("tenant-a").await;
    let mut tenant_b = server.tenant("tenant-b").await;
    let key = "shared-key-1";
    let a = pay(&mut tenant_a, key).await.expect("A's payment");
    let b = pay(&mut tenant_b, key).await.expect("B's payment");
    assert_ne!(a.payment_id, b.payment_id, "B's claim replayed A's payment");
    assert_eq!(pay(&mut tenant_a, key).await.expect("A's resend"), a);
    assert_eq!(pay(&mut tenant_b, key).await.expect("B's resend"), b);
    for (client, own) in [(&mut tenant_a, &a), (&mut tenant_b, &b)] {
        let resolved = client
            .resolve_payment(keyed(ResolvePaymentRequest {}, key))
            .await
            .expect("resolve")
            .into_inner();
        assert_eq!(resolved.state(), State::Committed);
        assert_eq!(resolved.payment.as_ref(), Some(own));
    }
    // A third tenant has no operation under the key.
    let mut tenant_c = server.tenant("tenant-c").await;
    let resolved = tenant_c
        .resolve_payment(keyed(ResolvePaymentRequest {}, key))
        .await
        .expect("resolve")
        .into_inner();
    assert_eq!(resolved.state(), State::NotFound);
}

/// A server that requires client certificates refuses, in the handshake, a client without one,
/// one whose certificate has expired, and one from a CA it does not trust; nothing reaches the
/// service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handshake_refuses_a_missing_expired_or_foreign_certificate() {
    let server = start_server(false).await;
    let mut expired = CertificateParams::new(Vec::<String>::new()).expect("params");
    expired.subject_alt_names = vec![SanType::URI(
        format!("{TRUST_DOMAIN}tenant-expired")
            .try_into()
            .expect("a URI"),
    )];
    expired.not_before = date_time_ymd(2020, 1, 1);
    expired.not_after = date_time_ymd(2021, 1, 1);
    let expired = server.ca.sign(expired, "expired");
    let foreign = Authority::new("another CA").client(&format!("{TRUST_DOMAIN}tenant-a"));
    for (who, identity) in [
        ("no certificate", None),
        ("an expired certificate", Some(expired)),
        ("a foreign CA's certificate", Some(foreign)),
    ] {
        // tonic connects lazily in some versions and eagerly in others: the refusal shows either
        // at connect or at the first call, never as an answer.
        let outcome = match server.client(identity).await {
            Err(refused) => Err(refused),
            Ok(mut client) => pay(&mut client, "refused-key")
                .await
                .map_err(|status| format!("{status:?}")),
        };
        assert!(
            outcome.is_err(),
            "a client with {who} was served: {outcome:?}"
        );
    }
    // The tenant whose identity the foreign CA copied still has no operation under the key.
    let mut tenant_a = server.tenant("tenant-a").await;
    let resolved = tenant_a
        .resolve_payment(keyed(ResolvePaymentRequest {}, "refused-key"))
        .await
        .expect("resolve")
        .into_inner();
    assert_eq!(resolved.state(), State::NotFound);
}

/// Where the server lets clients without a certificate in (client auth optional), the guard
/// refuses their keyed calls as UNAUTHENTICATED before the handler, and a certificate outside the
/// trust domain names nobody either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_without_a_named_peer_is_refused_before_the_handler() {
    let server = start_server(true).await;
    let mut anonymous = server
        .client(None)
        .await
        .expect("connect without a certificate");
    let status = pay(&mut anonymous, "anonymous-key")
        .await
        .expect_err("an anonymous payment");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let outsider = server.ca.client("spiffe://elsewhere.test/tenant-a");
    let mut outsider = server.client(Some(outsider)).await.expect("connect");
    let status = pay(&mut outsider, "anonymous-key")
        .await
        .expect_err("a payment from outside the trust domain");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    // Nothing was claimed under the key: a tenant's first payment with it is a new one.
    let mut tenant_a = server.tenant("tenant-a").await;
    let first = pay(&mut tenant_a, "anonymous-key")
        .await
        .expect("A's payment");
    let resolved = tenant_a
        .resolve_payment(keyed(ResolvePaymentRequest {}, "anonymous-key"))
        .await
        .expect("resolve")
        .into_inner();
    assert_eq!(resolved.payment, Some(first));
}
