//! The gRPC method of a request, read once from its path on the server.

use std::task::{Context, Poll};

use grpc_core_api::GrpcMethod;

/// A server-side layer that reads each request's gRPC method from its HTTP/2 path
/// (`/package.Service/Method`) once, checks it, and puts the [`GrpcMethod`] in the request's
/// extensions, where [`KeyedMutationGuard::run_request`](crate::KeyedMutationGuard::run_request)
/// finds it: handlers then no longer name and parse their own method.
///
/// ```no_run
/// # async fn doc() -> Result<(), Box<dyn std::error::Error>> {
/// tonic::transport::Server::builder().layer(grpc_tonic::MethodFromPathLayer);
/// # Ok(()) }
/// ```
///
/// A path that is not a gRPC method (`GrpcMethod::parse` refuses it) leaves the extensions alone;
/// tonic's router answers such a request UNIMPLEMENTED before any handler runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct MethodFromPathLayer;

impl<S> tower_layer::Layer<S> for MethodFromPathLayer {
    type Service = MethodFromPath<S>;

    fn layer(&self, inner: S) -> MethodFromPath<S> {
        MethodFromPath { inner }
    }
}

/// The service [`MethodFromPathLayer`] wraps around another.
#[derive(Debug, Clone)]
pub struct MethodFromPath<S> {
    inner: S,
}

impl<S, Body> tower_service::Service<http::Request<Body>> for MethodFromPath<S>
where
    S: tower_service::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> S::Future {
        if let Ok(method) = GrpcMethod::parse(request.uri().path()) {
            request.extensions_mut().insert(method);
        }
        self.inner.call(request)
    }
}
