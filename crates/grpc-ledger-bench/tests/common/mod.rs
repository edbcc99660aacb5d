//! What the bench's test processes share.

/// The PostgreSQL of `cargo xtask test`: a test without it fails, never passes by skipping.
pub(crate) fn database_url() -> String {
    std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()).unwrap_or_else(|| {
        panic!("DATABASE_URL is not set: run `cargo xtask test`, or `cargo xtask pg start` and export DATABASE_URL=$(cargo xtask pg url)")
    })
}
