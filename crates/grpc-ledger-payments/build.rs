//! Compiles the demo's .proto with protox (no protoc needed) and generates the tonic code; also
//! writes the descriptor set, which the demo validates its service config against.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/payments.proto");
    let descriptors = protox::compile(["payments.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("payments.pb"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
