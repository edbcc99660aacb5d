//! The payments service the demo runs and the benchmarks measure, in one place: its API
//! (`proto/payments.proto`, generated code in [`pb`]), the service (`CreatePayment` through the
//! keyed-mutation guard, `ResolvePayment` from the ledger, an optional fault layer after commit),
//! its store (the ledger's migrations and the business table), the server, and the client's side
//! of the wire (the token, the service config, a retry owner from either layer).
//!
//! An application of the library, not part of it: the demo (`grpc-ledger-demo`) drives it with a
//! workload and reconciles; the benchmarks (`grpc-ledger-bench`) put a baseline beside it.

pub mod pb {
    //! The generated protobuf and tonic code of `proto/payments.proto`.
    #![allow(missing_docs, unreachable_pub, clippy::all, rust_2018_idioms)]
    include!(concat!(env!("OUT_DIR"), "/payments.v1.rs"));
}

mod access;
mod client;
mod dialect;
mod postings;
mod server;
mod store;

pub use client::{
    Client, LayeredClient, channel_config, layered_client, resolve, retry_settings, with_token,
};
pub use dialect::statement;
pub use postings::{
    Downstream, PAYMENTS_SERVICE_TOKEN, POSTINGS_LABEL, PostingsService, UnitFailures,
    post_entry_method, prepare_postings_database, serve_postings,
};
pub use server::{
    Faults, PaymentsService, authenticate, create_payment_method, insert_payment, load_payment,
    new_payment_id, prepare_database,
};
pub use store::{Store, key_hasher, open_ledger_store, open_store, serve, serve_mtls, service};

/// The descriptor set of the service's .proto, compiled by protox at build time.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/payments.pb"));

/// The service config (gRFC A6) the client's channel runs with.
pub const SERVICE_CONFIG: &str = include_str!("../service_config.json");

/// The service config (gRFC A6) of the payments service's channel to the postings service.
pub const POSTINGS_SERVICE_CONFIG: &str = include_str!("../postings_service_config.json");

/// The bearer token the service's single client authenticates with.
pub const DEMO_TOKEN: &str = "demo-client-token";
