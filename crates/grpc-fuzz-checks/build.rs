//! Compiles the request shape the fingerprint target reads (the canonical-fingerprint tests' own
//! `orders.proto`: maps, nested and repeated messages, oneof, optional, enums, `Any`) into a
//! descriptor set, with protox (no protoc needed).

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = "../grpc-core-api/tests/proto";
    println!("cargo:rerun-if-changed={dir}/orders.proto");
    let descriptors = protox::compile(["orders.proto"], [dir])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("orders.pb"), descriptors.encode_to_vec())?;
    Ok(())
}
