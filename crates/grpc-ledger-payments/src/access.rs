//! Who may call: the demo's bearer tokens, checked by each server's interceptor.

use grpc_tonic::AuthenticatedPrincipal;
use tonic::{Request, Status};

/// Admits a request bearing `expected` as its token, with that token as its principal.
pub(crate) fn bearer_token(
    mut request: Request<()>,
    expected: &str,
) -> Result<Request<()>, Status> {
    let token = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    match token {
        Some(token) if token == expected => {
            request
                .extensions_mut()
                .insert(AuthenticatedPrincipal(token.into_bytes()));
            Ok(request)
        }
        _ => Err(Status::unauthenticated("unknown caller")),
    }
}
