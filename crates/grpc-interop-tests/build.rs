//! Compiles the probe service's .proto with protox (no protoc) and generates its tonic code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/probe.proto");
    let descriptors = protox::compile(["probe.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
