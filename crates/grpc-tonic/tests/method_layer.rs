//! `MethodFromPathLayer` reads the gRPC method from the request path once, and only a well-formed
//! method name reaches the extensions.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};

use grpc_core_api::GrpcMethod;
use grpc_tonic::MethodFromPathLayer;
use tower_layer::Layer;
use tower_service::Service;

/// An inner service that answers with the method it found in the extensions.
struct Echo;

impl Service<http::Request<()>> for Echo {
    type Response = Option<GrpcMethod>;
    type Error = Infallible;
    type Future = Ready<Result<Option<GrpcMethod>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<()>) -> Self::Future {
        ready(Ok(request.extensions().get::<GrpcMethod>().cloned()))
    }
}

async fn method_seen(path: &str) -> Option<GrpcMethod> {
    let request = http::Request::builder().uri(path).body(()).unwrap();
    MethodFromPathLayer.layer(Echo).call(request).await.unwrap()
}

#[tokio::test]
async fn a_grpc_path_becomes_a_checked_method() {
    assert_eq!(
        method_seen("/payments.v1.Payments/CreatePayment").await,
        Some(GrpcMethod::parse("/payments.v1.Payments/CreatePayment").unwrap())
    );
}

#[tokio::test]
async fn a_path_that_is_no_grpc_method_leaves_the_extensions_alone() {
    for path in ["/", "/health", "/payments.v1.Payments/", "/a/b/c"] {
        assert_eq!(method_seen(path).await, None, "{path}");
    }
}
